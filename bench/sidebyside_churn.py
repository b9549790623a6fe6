"""Upstream kube-proxy against kubeproxy under churn at upstream's scale-test rate
(issue 25 part 2): does each keep up, and how long does programming take?

    python -m bench.sidebyside_churn [--services 1000] [--endpoints 100] [--churn 0.1]
                                     [--tick 5] [--ticks 12] [--modes nftables]
                                     [--config defaults] [--runs 3] [--probed 4]
                                     [--seed 0] [--out FILE] [--logs DIR]
    python -m bench.sidebyside_churn --table FILE      # the table of an earlier --out

(root; the upstream binaries: ``KUBEPROXY_UPSTREAM_BIN`` or scripts/build-upstream.)

The lab, the objects and the way each proxy is started are :mod:`bench.sidebyside`'s:
the real-Kubernetes lab, upstream kube-proxy on node-a and kubeproxy on node-b (never at
once, each from a node reset to no rules, both from the same ``KubeProxyConfiguration``
file), ``--services`` Services with ``--endpoints`` made-up endpoints each in slices the
bench writes, and ``--probed`` Services whose slices the real EndpointSlice controller
writes from the lab's echo-server Pods on node-c. After a proxy's cold start, every
``--tick`` seconds for ``--ticks`` ticks:

* **the churn**: ``--churn`` of all endpoints get new addresses, as upstream's scale
  test does (10 % every 5 s at 1,000 x 100): half the endpoints of as many Services as
  that takes, chosen at random (the same choices for both proxies of a run), each slice
  rewritten with ``endpoints.kubernetes.io/last-change-trigger-time`` set to the moment
  of its write (4 writers at once);
* **the clock**: meanwhile, each probed Service's selector moves to the other pool of
  Pods (the controller rewrites its slice, and stamps the trigger time itself), and
  :func:`bench.sidebyside.probe` times from that request to the first connect from the
  proxy's node answered by the new pool: change to packet under the churn, from a
  thread outside the proxy.

Per proxy run (:class:`ChurnRun`):

* the clock's latencies (p50 / p99 / max over every tick and probed Service), and the
  ticks in which some change was still not on the data path when the next tick came
  (**kept up**: none);
* **programming latency** from each proxy's own
  ``kubeproxy_network_programming_duration_seconds`` (the same metric and buckets in
  both: what upstream's scale test reads), its p50 / p99 interpolated within buckets as
  PromQL's ``histogram_quantile`` (:func:`bench.soak.histogram_quantile`; the finest
  buckets are 0-0.25-0.5-1 s, so below a second this is coarse), over the churn and one
  more tick to settle;
* the syncs in that window (count and mean of the full and partial sync histograms),
  the process tree's CPU seconds per tick, and the tree's peak RSS over the whole run.

Runs alternate which proxy goes first. Results: Markdown on stdout (per proxy, and the
kubeproxy/upstream ratios with their spread over the runs), every run as JSON in ``--out``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.cluster import pod_ip
from bench.sidebyside import (
    BACKEND_NODE,
    CHANGE_DEADLINE,
    NAMESPACE,
    PROXY_NODE,
    TARGET_PORT,
    Ratio,
    cluster_ip,
    common_arguments,
    cpu_seconds,
    from_pool,
    metrics_text,
    ms,
    populated_lab,
    probe,
    render,
    report,
    running,
    scrape,
    spread,
    sync_delta,
)
from bench.soak import PROGRAMMING, TRIGGER_TIME, histogram, histogram_quantile, percentiles
from kubeproxy.lab.kube.api import Api
from kubeproxy.lab.kube.cluster import KubeLab
from kubeproxy.lab.kube.differential.proxies import OURS, UPSTREAM
from kubeproxy.lab.objects import Ep, endpoint_slice

WRITERS = 4


class Fleet:
    """The bench-written slices and which address each endpoint has now: endpoint ``j``
    of Service ``i`` toggles between two made-up addresses, one half of a Service's
    endpoints (even or odd ``j``, in turn) at each churn."""

    def __init__(self, services: int, endpoints: int, probed_names: Sequence[str]) -> None:
        self.endpoints = endpoints
        self.services = services
        probed = set(probed_names)
        # populate() names Service i "s{i:05d}"; the probed ones have the controller's slices.
        self.churnable = [i for i in range(services) if f"s{i:05d}" not in probed]
        self.churns = [0] * services
        self.moved = [[False] * endpoints for _ in range(services)]

    def per_tick(self, churn: float) -> int:
        """How many Services a tick rewrites: half the endpoints of each."""
        wanted = churn * len(self.churnable) * self.endpoints
        return min(len(self.churnable), max(1, round(wanted / max(1, self.endpoints // 2))))

    def churn(self, i: int) -> dict[str, Any]:
        """Move half of Service ``i``'s endpoints; the merge patch of its slice (without
        the trigger time: :func:`write_slice` stamps it as the request goes out)."""
        parity = self.churns[i] % 2
        self.churns[i] += 1
        for j in range(parity, self.endpoints, 2):
            self.moved[i][j] = not self.moved[i][j]
        total = self.services * self.endpoints
        eps = [
            Ep(pod_ip(i * self.endpoints + j + (total if self.moved[i][j] else 0)),
               node=BACKEND_NODE)
            for j in range(self.endpoints)
        ]  # fmt: skip
        body = endpoint_slice(
            f"s{i:05d}", eps, ({"name": "http", "port": TARGET_PORT},), namespace=NAMESPACE
        )
        return {"endpoints": body["endpoints"]}


def write_slice(api: Api, i: int, patch: dict[str, Any]) -> None:
    """Send Service ``i``'s slice patch, stamped with the moment it goes out: a writer
    that waited its turn must not count its wait against the proxy."""
    trigger = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    stamped = {"metadata": {"annotations": {TRIGGER_TIME: trigger}}, **patch}
    api.patch("EndpointSlice", f"s{i:05d}-ipv4", stamped, NAMESPACE)


@dataclass
class ChurnRun:
    impl: str
    mode: str
    config: str
    run: int
    cold_seconds: float = 0.0
    # change -> packet of the probed Services' selector moves, every tick
    changes: list[float] = field(default_factory=list)
    late_ticks: int = 0  # ticks whose changes were not all on the data path by the next
    ticks: int = 0
    slices_per_tick: int = 0
    write_seconds: list[float] = field(default_factory=list)  # the bench's writes per tick
    programming_p50: float = math.nan
    programming_p99: float = math.nan
    programming_count: float = 0.0
    # (count, mean seconds) of each kind of sync, from the churn's start to one tick after it
    syncs: dict[str, tuple[float, float]] = field(default_factory=dict)
    cpu_per_tick: float = 0.0
    tree_peak_mb: float = 0.0


def _buckets_delta(
    before: list[tuple[float, float]], after: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    earlier = dict(before)
    return [(le, count - earlier.get(le, 0.0)) for le, count in after]


def measure(
    lab: KubeLab,
    fleet: Fleet,
    impl: str,
    mode: str,
    *,
    config: str,
    run: int,
    pools: dict[str, str],
    churn: float,
    tick: float,
    ticks: int,
    seed: int,
) -> ChurnRun:
    """One proxy from a clean node: cold start, then ``ticks`` ticks of churn."""
    node = PROXY_NODE[impl]
    api = lab.api()
    result = ChurnRun(impl, mode, config, run, ticks=ticks)
    ips = {name: cluster_ip(api, name) for name in pools}
    rng = random.Random(seed * 1000 + run)  # both proxies of a run get the same churn
    result.slices_per_tick = fleet.per_tick(churn)
    with running(lab, impl, mode, config, f"churn-{run}") as proxy:
        result.cold_seconds = proxy.cold_start({ips[n]: from_pool(p) for n, p in pools.items()})
        time.sleep(tick)  # the cold start's syncs end; the churn meets an idle proxy
        text = metrics_text(lab, node)
        syncs_before, programmed_before = scrape(lab, impl), histogram(text, PROGRAMMING)
        cpu_before = cpu_seconds(proxy.proc.pid)
        began = time.perf_counter()
        with ThreadPoolExecutor(WRITERS) as writers:
            driver = Driver(api, writers, proxy.executor, fleet, rng, ips, pools)
            for k in range(ticks):
                time.sleep(max(0.0, began + k * tick - time.perf_counter()))
                driver.tick(result, tick)
        time.sleep(max(0.0, began + (ticks + 1) * tick - time.perf_counter()))
        result.cpu_per_tick = (cpu_seconds(proxy.proc.pid) - cpu_before) / ticks
        result.syncs = sync_delta(syncs_before, scrape(lab, impl))
        programmed = _buckets_delta(
            programmed_before, histogram(metrics_text(lab, node), PROGRAMMING)
        )
        result.programming_count = programmed[-1][1] if programmed else 0.0
        result.programming_p50 = histogram_quantile(0.5, programmed)
        result.programming_p99 = histogram_quantile(0.99, programmed)
    result.tree_peak_mb = proxy.rss.peak_kb / 1024
    return result


@dataclass
class Driver:
    """What a tick needs: the API, the churn's writers, the probe's thread (in the
    proxy's node namespace), the fleet and the probed Services' ClusterIPs and pools."""

    api: Api
    writers: ThreadPoolExecutor
    executor: Any
    fleet: Fleet
    rng: random.Random
    ips: dict[str, str]
    pools: dict[str, str]

    def tick(self, result: ChurnRun, period: float) -> None:
        """The churn's slice writes in the background, the probed Services moved to
        their other pool meanwhile, each move timed to its first packet."""
        t0 = time.perf_counter()
        chosen = self.rng.sample(self.fleet.churnable, result.slices_per_tick)
        writes = [
            self.writers.submit(write_slice, self.api, i, self.fleet.churn(i)) for i in chosen
        ]
        offsets: dict[str, float] = {}
        for name, pool in list(self.pools.items()):
            self.pools[name] = "b" if pool == "a" else "a"
            offsets[self.ips[name]] = time.perf_counter() - t0
            selector = {"spec": {"selector": {"pool": self.pools[name]}}}
            self.api.patch("Service", name, selector, NAMESPACE)
        wanted = {self.ips[n]: from_pool(p) for n, p in self.pools.items()}
        found: dict[str, float] = self.executor.submit(probe, wanted, t0).result(
            CHANGE_DEADLINE + 30
        )
        for ip, at in found.items():
            result.changes.append(at - offsets[ip])
        if max(found.values(), default=0.0) > period:
            result.late_ticks += 1
        for write in writes:
            write.result()
        result.write_seconds.append(time.perf_counter() - t0)


# ----------------------------------------------------------------------------- report


def _fmt_s(v: float) -> str:
    return f"{v:.2f}"


def table(results: Sequence[ChurnRun]) -> str:
    """Per mode, config and proxy: medians over the runs (range in brackets), the
    clock's percentiles over all of them, and the kubeproxy/upstream ratios."""
    header = (
        "cold start s", "change -> packet ms p50 / p99 / max", "ticks late",
        "programming s p50 / p99 [count]", "partial syncs [count], mean ms", "full syncs",
        "CPU s per tick", "peak RSS tree MB", "bench writes s per tick",
    )  # fmt: skip

    def cells(runs: Sequence[ChurnRun]) -> list[str]:
        changes = percentiles([c for r in runs for c in r.changes])
        partial = [r.syncs["partial"] for r in runs]
        return [
            spread([r.cold_seconds for r in runs], _fmt_s),
            f"{ms(changes['p50'])} / {ms(changes['p99'])} / {ms(changes['max'])}",
            "/".join(f"{r.late_ticks} of {r.ticks}" for r in runs),
            f"{spread([r.programming_p50 for r in runs], _fmt_s)} / "
            f"{spread([r.programming_p99 for r in runs], _fmt_s)} "
            f"[{'/'.join(f'{r.programming_count:.0f}' for r in runs)}]",
            f"[{'/'.join(f'{c:.0f}' for c, _ in partial)}] {spread([m for _, m in partial], ms)}",
            "/".join(f"{r.syncs['full'][0]:.0f}" for r in runs),
            spread([r.cpu_per_tick for r in runs], _fmt_s),
            spread([r.tree_peak_mb for r in runs], lambda v: f"{v:.0f}"),
            spread([statistics.median(r.write_seconds) for r in runs], _fmt_s),
        ]

    def change(q: str) -> Callable[[ChurnRun], float]:
        return lambda r: percentiles(r.changes)[q]

    def ratios(ratio: Ratio[ChurnRun]) -> list[str]:
        return [
            ratio(lambda r: r.cold_seconds),
            f"{ratio(change('p50'))} / {ratio(change('p99'))} / {ratio(change('max'))}",
            "",
            f"{ratio(lambda r: r.programming_p50)} / {ratio(lambda r: r.programming_p99)}",
            ratio(lambda r: r.syncs["partial"][1]),
            "",
            ratio(lambda r: r.cpu_per_tick),
            ratio(lambda r: r.tree_peak_mb),
            "",
        ]

    return render(header, results, cells, ratios)


# ------------------------------------------------------------------------------- main


@dataclass(frozen=True)
class Spec:
    services: int
    endpoints: int
    churn: float
    tick: float
    ticks: int
    modes: tuple[str, ...]
    config: str
    runs: int
    probed: int
    seed: int = 0


def run_bench(spec: Spec, workdir: Path, prefix: str | None = None) -> list[ChurnRun]:
    """Build the lab, populate it, run every proxy run; the lab is gone afterwards."""
    results: list[ChurnRun] = []
    with populated_lab(
        workdir, prefix or f"kpsc{os.getpid() % 10000}", spec.services, spec.endpoints,
        spec.probed,
    ) as (lab, probed):  # fmt: skip
        fleet = Fleet(spec.services, spec.endpoints, probed)
        pools = dict.fromkeys(probed, "a")
        for run in range(spec.runs):
            for mode in spec.modes:
                order = (UPSTREAM, OURS) if run % 2 == 0 else (OURS, UPSTREAM)
                for impl in order:
                    r = measure(
                        lab, fleet, impl, mode, config=spec.config, run=run, pools=pools,
                        churn=spec.churn, tick=spec.tick, ticks=spec.ticks, seed=spec.seed,
                    )  # fmt: skip
                    results.append(r)
                    c = percentiles(r.changes)
                    print(
                        f"run {run} {mode} {impl}: cold {r.cold_seconds:.2f}s, change p50 "
                        f"{ms(c['p50'])} p99 {ms(c['p99'])} ms, {r.late_ticks} late ticks, "
                        f"programming p50 {r.programming_p50:.2f} p99 "
                        f"{r.programming_p99:.2f} s, cpu/tick {r.cpu_per_tick:.2f}s, peak "
                        f"{r.tree_peak_mb:.0f} MB, writes/tick "
                        f"{statistics.median(r.write_seconds):.2f}s, load "
                        f"{os.getloadavg()[0]:.1f}",
                        file=sys.stderr,
                        flush=True,
                    )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sidebyside_churn", description=__doc__.splitlines()[0]
    )
    common_arguments(parser, endpoints=100, modes="nftables", probed=4)
    parser.add_argument("--churn", type=float, default=0.1, help="share of endpoints per tick")
    parser.add_argument("--tick", type=float, default=5.0, help="seconds")
    parser.add_argument("--ticks", type=int, default=12)
    parser.add_argument("--config", default="defaults", choices=("defaults", "1ms"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    spec = Spec(
        args.services, args.endpoints, args.churn, args.tick, args.ticks,
        tuple(args.modes.split(",")), args.config, args.runs, args.probed, args.seed,
    )  # fmt: skip
    report(args, ChurnRun, lambda workdir: run_bench(spec, workdir), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
