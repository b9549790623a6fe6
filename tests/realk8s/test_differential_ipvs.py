"""Same packets as upstream in ipvs mode: the differential inside the user-mode-Linux guest.

The host kernel has no IPVS, so ``python -m bench.differential --modes ipvs`` runs in a
guest of its own (:mod:`bench.guest`): etcd, kube-apiserver and kube-controller-manager
v1.37, three node namespaces, upstream kube-proxy and then kubeproxy in ipvs mode on
node-a, every probe of the matrix, all inside it. Two fixed seeds in one batch, CI's
probe budget: together their states have every feature of the generator
(:data:`~kubeproxy.lab.kube.differential.states.FEATURES`; checked below without a
lab), and the pinned Services that have ipvs cases
(:mod:`~kubeproxy.lab.kube.differential.pinned`; the others cost a minute of upstream's
syncs on the guest's one CPU and are the host test's), which must answer as they say.
The bench runs hundreds of seeds (bench/RESULTS.md, "Same packets as upstream in ipvs
mode"). Any difference not listed in docs/differences-from-upstream.md fails.
About 3-8 minutes, most of it upstream's syncs in the guest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import guest

from kubeproxy.lab.kube.binaries import Binaries
from kubeproxy.lab.kube.differential import pinned
from kubeproxy.lab.kube.differential import states as st

pytestmark = pytest.mark.timeout(1200)

SEEDS = (593, 1550)
# As bench.differential builds them: three nodes in two zones, three pool Pods on each,
# named with the bench's prefix "df".
NODES = (("node-a", "zone-a"), ("node-b", "zone-b"), ("node-c", "zone-a"))
SLOTS = tuple(st.Slot(f"df-{name[-1]}{i}", name) for name, _ in NODES for i in range(3))


def test_the_fixed_seeds_cover_every_feature_of_the_generator() -> None:
    states = [st.generate(seed, NODES, SLOTS, "node-a", block) for block, seed in enumerate(SEEDS)]
    covered = set().union(*(st.features(s) for s in states))
    assert covered == st.FEATURES, f"not covered: {sorted(st.FEATURES - covered)}"


def test_every_probe_in_ipvs_mode_goes_where_upstream_sends_it(
    binaries: Binaries, tmp_path: Path
) -> None:
    # The bench finds the binaries itself; the fixture makes their absence a failure.
    assert binaries.kube_proxy
    out = tmp_path / "out"
    out.mkdir()
    seeds = ",".join(map(str, SEEDS))
    argv = ["--modes", "ipvs", "--budget", "ci", "--seeds", seeds, "--batch", "2", "--pinned"]
    argv += ["--out", str(out)]
    status = guest.rerun("bench.differential", argv, [out])
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [line.get("error") for line in lines] == [None], lines
    (result,) = lines
    assert result["mode"] == "ipvs" and result["seeds"] == [*SEEDS, pinned.FIRST_SEED]
    assert result["unstable"] == []
    assert result["probes"] > 100
    unknown = [d for d in result["differences"] if not d["known"]]
    assert unknown == [], json.dumps(unknown, indent=1)
    upstream, ours = result["records"]["upstream"], result["records"]["kubeproxy"]
    for case in pinned.CASES:
        if (expected := case.expected("ipvs")) is not None:
            keys = [k for k in upstream if case.selects(k)]
            assert keys, f"no probe of {case.name}"
            for key in keys:
                assert set(upstream[key]) == expected and set(ours[key]) == expected, key
    for implementation, facts in result["facts"].items():
        assert facts["both cleanups"].startswith("exit 0"), implementation
    assert status == 0
