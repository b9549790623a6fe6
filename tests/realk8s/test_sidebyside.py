"""``bench.sidebyside`` at a tiny scale, so the benchmark does not rot between its runs.

20 Services, one run, nftables mode with ``minSyncPeriod: 1ms``: upstream kube-proxy on
node-a and kubeproxy on node-b of a lab of the benchmark's own (its own prefix and
control plane, not the session's cluster, whose proxies would otherwise have to stop),
each measured from a clean node. Only the shape is checked (each proxy answered every
probed Service, every change reached the data path, the metrics and process figures were
read, the table renders), never a figure: those belong in bench/RESULTS.md. About 30 s.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.sidebyside import Spec, run_bench, table

from kubeproxy.lab.kube.binaries import Binaries
from kubeproxy.lab.kube.differential.proxies import OURS, UPSTREAM
from kubeproxy.lab.netns import list_netns


def test_sidebyside_tiny(binaries: Binaries, tmp_path: Path) -> None:
    # The benchmark finds the binaries itself; the fixture makes their absence a failure.
    assert binaries.kube_proxy
    prefix = f"kpsbt{os.getpid() % 10000}"
    spec = Spec(
        services=20, endpoints=2, modes=("nftables",), configs=("1ms",), runs=1, rounds=1,
        probed=4,
    )  # fmt: skip
    results = run_bench(spec, tmp_path, prefix)
    assert not [ns for ns in list_netns() if ns.startswith(prefix)], "namespaces left behind"
    assert sorted(r.impl for r in results) == sorted((UPSTREAM, OURS))
    for r in results:
        assert r.cold_seconds > 0
        assert len(r.add) == len(r.change) == len(r.delete) == 1
        assert min(r.add + r.change + r.delete) > 0
        # Each proxy's own /metrics: a full sync at the start, partial ones for the round.
        assert r.syncs_cold["full"][0] >= 1, r.syncs_cold
        assert r.syncs_rounds["partial"][0] >= 1, r.syncs_rounds
        assert r.cpu_total >= r.cpu_cold > 0
        assert r.tree_peak_mb > 0 and r.hwm_mb > 0
    rendered = table(results)
    assert "**kubeproxy / upstream**" in rendered
