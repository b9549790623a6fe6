"""Per-change cost of the proxy's own path: events → trackers → collect → report.

    python -m bench.app_path [--sizes 100,10000] [--rounds 300]

In-process, with a backend that programs nothing, so what is timed is ``Proxy.on_events``
and ``Proxy.sync`` (collect, the worker-thread hop, report) for one new Service with its
10-endpoint slice, then its deletion, at each size. A path that is O(change) costs the
same at every size; the kernel's share is measured by ``python -m bench`` (partial syncs).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from bench.cluster import cluster, service_objects
from kubeproxy.app import Proxy
from kubeproxy.backends.base import SyncResult
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.model.events import Event, Model
from kubeproxy.model.parse import parse_endpoint_slice, parse_service
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import ServicePortName


class NoKernel:
    """A backend that programs nothing."""

    mode = ProxyMode.NFTABLES

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def check(self) -> str | None:
        return None

    def counters(self) -> dict[str, int]:
        return {}

    def render(self, snapshot: Snapshot) -> str:
        return ""

    def sync(self, snapshot: Snapshot, changed: set[ServicePortName] | None) -> SyncResult:
        return SyncResult(full=changed is None, service_ports=len(snapshot.services))


def _model(obj: dict[str, Any]) -> Model:
    model = parse_service(obj) if obj["kind"] == "Service" else parse_endpoint_slice(obj)
    assert model is not None, obj
    return model


async def per_change(services: int, rounds: int) -> float:
    """Median seconds of one change (an add or a delete) with ``services`` installed."""
    proxy = Proxy(ProxyConfig(hostname="node-a"), NoKernel())
    proxy.on_events([Event.added(_model(obj)) for obj in cluster(services, 10)])
    await proxy.sync()
    batches = [[_model(o) for o in service_objects(services + r, 10)] for r in range(rounds)]
    seconds = []
    for batch in batches:
        for events in ([Event.added(o) for o in batch], [Event.deleted(o) for o in batch]):
            started = time.perf_counter()
            proxy.on_events(events)
            await proxy.sync()
            seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.app_path", description=__doc__)
    parser.add_argument("--sizes", default="100,10000")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    print("| Services | one change, median |")
    print("|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        median = asyncio.run(per_change(size, args.rounds))
        print(f"| {size:,} | {median * 1e3:.2f} ms |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
