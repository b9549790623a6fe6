"""ebpf mode's change-to-effect without the kernel: CPU time of the map phase.

``python -m bench.ebpf_sync [--services 10000] [--syncs 400] [--runs 4]`` (no root).

The ebpf backend over a strict fake map and fake nftables, with ``bench.ebpf``'s
snapshot (N-1 Services x 10 endpoints plus the measured one); after the full sync the
state is frozen as ``kubeproxy run`` does. Then one-endpoint partial syncs of the
measured Service, each's map phase timed in this thread's CPU time (what
``bench.ebpf`` reports as change to effect, minus the waiting for a CPU). Runs
alternate between the family plans planned on every sync (``uncached``: the cache of
``kubeproxy.model.planning`` cleared before each, as before it remembered them) and
remembered (``cached``), so a noisy moment of a shared machine falls on both.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Iterable
from dataclasses import replace

from bench.ebpf import SPARE_IP, snapshot_of
from kubeproxy.backends.ebpf.proxier import EbpfBackend
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.bpf.socklb import FakeMap, Frontend, ServiceTable, Target
from kubeproxy.dataplane.nftables.fake import FakeNftables
from kubeproxy.lab.cluster import NODE
from kubeproxy.model import planning
from kubeproxy.model.types import Endpoint, IPFamily


class FakeLB:
    """The hooks, without a kernel: the table over fake maps."""

    def __init__(self) -> None:
        self.services = ServiceTable(FakeMap(12, 8), FakeMap(24, 20))

    def attach(self) -> None:
        pass

    def destroy_stale(self, stale: Iterable[tuple[Frontend, Target]]) -> int:
        return 0

    def check(self) -> str | None:
        return None

    def close(self) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--syncs", type=int, default=400)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args(argv)
    config = ProxyConfig(
        hostname=NODE,
        mode=ProxyMode.EBPF,
        cluster_cidrs=("10.128.0.0/9", "10.244.0.0/16"),
        families=(IPFamily.IPv4,),
        healthz_bind_address="",
        metrics_bind_address="",
    )
    backend = EbpfBackend(config, NftablesBackend(config, FakeNftables()), FakeLB)
    backend.start()
    snapshot, name = snapshot_of(args.services)
    backend.sync(snapshot, None)
    gc.collect()
    gc.freeze()
    spare = Endpoint(SPARE_IP, 8080, NODE)
    print("| run | family plans | median | p99 |\n|---|---|---:|---:|")
    for run in range(args.runs):
        label = "uncached" if run % 2 == 0 else "cached"
        times = []
        for i in range(args.syncs):
            eps = dict(snapshot.endpoints)
            if i % 2 == 0:
                eps[name] = (*eps[name], spare)
            if label == "uncached":  # forgotten: planned again, as before the cache
                planning._plan_family.cache_clear()
            backend.sync(replace(snapshot, endpoints=eps), {name})
            times.append(backend.map_cpu_seconds)
        times.sort()
        median, p99 = times[len(times) // 2], times[int(0.99 * len(times))]
        print(f"| {run + 1} | {label} | {median * 1e6:.0f} µs | {p99 * 1e6:.0f} µs |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
