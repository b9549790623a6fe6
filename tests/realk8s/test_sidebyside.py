"""``bench.sidebyside`` and ``bench.sidebyside_churn`` at a tiny scale, so the benchmarks do
not rot between their runs.

20 Services, one run, nftables mode and iptables mode on the legacy flavour with
``minSyncPeriod: 1ms`` (the churn: nftables only): upstream kube-proxy on
node-a and kubeproxy on node-b of a lab of the benchmark's own (its own prefix and
control plane, not the session's cluster, whose proxies would otherwise have to stop),
each measured from a clean node. Only the shape is checked (each proxy answered every
probed Service, every change reached the data path, the metrics and process figures were
read, the table renders), never a figure: those belong in bench/RESULTS.md. About 45 s.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.sidebyside import IPTABLES_LEGACY, Spec, run_bench, table
from bench.sidebyside_churn import Spec as ChurnSpec
from bench.sidebyside_churn import run_bench as run_churn
from bench.sidebyside_churn import table as churn_table

from kubeproxy.lab.kube.binaries import Binaries
from kubeproxy.lab.kube.differential.proxies import OURS, UPSTREAM
from kubeproxy.lab.netns import list_netns


def test_sidebyside_tiny(binaries: Binaries, tmp_path: Path) -> None:
    # The benchmark finds the binaries itself; the fixture makes their absence a failure.
    assert binaries.kube_proxy
    prefix = f"kpsbt{os.getpid() % 10000}"
    # iptables-legacy: the cold start checks that each proxy programmed that flavour.
    spec = Spec(
        services=20, endpoints=2, modes=("nftables", IPTABLES_LEGACY), configs=("1ms",),
        runs=1, rounds=1, probed=4,
    )  # fmt: skip
    results = run_bench(spec, tmp_path, prefix)
    assert not [ns for ns in list_netns() if ns.startswith(prefix)], "namespaces left behind"
    assert sorted((r.mode, r.impl) for r in results) == sorted(
        (mode, impl) for mode in spec.modes for impl in (UPSTREAM, OURS)
    )
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


def test_sidebyside_churn_tiny(binaries: Binaries, tmp_path: Path) -> None:
    """``bench.sidebyside_churn`` at a tiny scale: 20 Services x 10 endpoints, 3 ticks of
    2 s, one run. The shape only: every tick's selector moves reached the data path, the
    churn's writes were stamped and each proxy's programming-latency histogram saw them."""
    assert binaries.kube_proxy
    prefix = f"kpsct{os.getpid() % 10000}"
    spec = ChurnSpec(
        services=20, endpoints=10, churn=0.1, tick=2.0, ticks=3, modes=("nftables",),
        config="1ms", runs=1, probed=2,
    )  # fmt: skip
    results = run_churn(spec, tmp_path, prefix)
    assert not [ns for ns in list_netns() if ns.startswith(prefix)], "namespaces left behind"
    assert sorted(r.impl for r in results) == sorted((UPSTREAM, OURS))
    for r in results:
        assert r.cold_seconds > 0
        assert r.slices_per_tick == 4  # 10 % of 180 endpoints, 5 per slice written
        assert len(r.changes) == 2 * 3 and min(r.changes) > 0
        assert len(r.write_seconds) == 3
        # The bench's own slices and the controller's carry a trigger time: one sample
        # per changed slice and sync at least.
        assert r.programming_count >= 3, r
        assert r.programming_p50 >= 0 and r.programming_p99 >= r.programming_p50
        assert r.syncs["partial"][0] >= 1, r.syncs
        assert r.cpu_per_tick > 0 and r.tree_peak_mb > 0
    assert "**kubeproxy / upstream**" in churn_table(results)
