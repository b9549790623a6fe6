"""Same packets as upstream through changes: kube-proxy v1.37 and kubeproxy on node-a,
each running while the same sequence of changes goes through the real API server,
probed after every change (:mod:`kubeproxy.lab.kube.differential.changerun`).

CI runs one fixed sequence (four changes, every probe of the matrix after each) in
nftables mode, about two minutes; ``python -m bench.differential --changes --states N``
runs many, in every mode (bench/RESULTS.md). Any difference not listed in
docs/differences-from-upstream.md fails.
"""

from __future__ import annotations

import json

import pytest

from kubeproxy.lab.kube.differential.changerun import describe, run_changes
from kubeproxy.lab.kube.differential.changes import FIRST_SEED, generate
from kubeproxy.lab.kube.differential.run import Differential, ModeResult, results_json
from tests.realk8s.conftest import DIFFERENTIAL_NODE

pytestmark = pytest.mark.timeout(1200)

# A dual-stack UDP NodePort (conntrack's cleanup at every change): an endpoint removed,
# one terminating, internalTrafficPolicy flipped, a port changed (see
# test_the_fixed_sequence_changes_what_a_node_lives_through).
SEQUENCES = (FIRST_SEED + 4870,)
STEPS = 4
MODES = ("nftables",)
KINDS = frozenset({"removed", "terminating", "itp", "port"})


@pytest.fixture(scope="module")
def results(differential: Differential) -> dict[str, ModeResult]:
    sequences = [
        generate(seed, differential.slots, DIFFERENTIAL_NODE, block, STEPS)
        for block, seed in enumerate(SEQUENCES, start=8)
    ]
    done = run_changes(differential, sequences, MODES)
    (differential.workdir / "changes.json").write_text(results_json(done))
    (differential.workdir / "sequences.txt").write_text("\n\n".join(describe(s) for s in sequences))
    return {r.mode: r for r in done}


def test_the_fixed_sequence_changes_what_a_node_lives_through(
    differential: Differential,
) -> None:
    kinds = {
        step.kind
        for seed in SEQUENCES
        for step in generate(seed, differential.slots, DIFFERENTIAL_NODE, 8, STEPS).steps
    }
    assert kinds >= KINDS, sorted(KINDS - kinds)


@pytest.mark.parametrize("mode", MODES)
def test_every_probe_after_every_change_goes_where_upstream_sends_it(
    results: dict[str, ModeResult], mode: str, differential: Differential
) -> None:
    result = results[mode]
    steps = {key.split(" after ", 1)[1] for key in result.upstream}
    assert len(steps) == STEPS + 1, sorted(steps)  # the start, then each change
    unexplained = result.unexplained()
    assert unexplained == [], (
        "\n".join(d.line() for d in unexplained) + "\n" + json.dumps(str(differential.workdir))
    )
