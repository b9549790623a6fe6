"""Which partial syncs grow with cluster size, and why.

    ip netns add kp-bench && ip netns exec kp-bench python -m bench.partial_kinds 100 10000
    ip netns delete kp-bench

For each size, the median partial sync (collect + render + apply) of four changes: an
endpoint change that keeps the endpoint count (only ``ip-backends`` elements change), one
that changes it to a count another Service has (the destination moves to another shared
chain's ``-dests`` set), one that changes it to a count no Service has (the shared chain
is created, and deleted when the change is undone), and a new Service with ten
endpoints. The kernel re-validates the table's jump graph — every jump/goto element
of every verdict map — for a batch that adds a jump or goto: while each destination was a
``service-ips`` verdict element (before issue 10 part 6), the last two cost O(Services);
as elements of the shared chains' ``-dests`` sets they add no verdict. A new shared chain
cost O(endpoints) while every chain read one ``ip-backends`` map: the kernel walks every
element of a map when a new rule binds it (``nf_tables_bind_set``); each chain now has a
map of its own, new and empty when the chain is.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from bench.cluster import cluster, service_objects
from bench.sync_worker import feed
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.nftables.runner import open_runner
from kubeproxy.model.parse import parse_endpoint_slice, parse_service
from kubeproxy.model.state import ProxyState
from kubeproxy.model.types import EndpointSlice, IPFamily


def measure(services: int, repeats: int = 200) -> dict[str, tuple[float, float]]:
    state = ProxyState("node-a")
    feed(state, cluster(services, 10))
    backend = NftablesBackend(
        ProxyConfig(hostname="node-a", cluster_cidrs=("10.128.0.0/9",), families=(IPFamily.IPv4,)),
        open_runner(),
    )
    # The last Service has eleven endpoints, so the shared chain cluster-ip-11 exists
    # at every size (as a count some Service has does in a large cluster).
    anchor = services - 1
    slc = parse_endpoint_slice(service_objects(anchor, 11)[1])
    assert isinstance(slc, EndpointSlice)
    state.on_endpoint_slice(slc)
    snapshot, _ = state.collect()
    backend.sync(snapshot, None)

    def change(objects: list[dict[str, object]]) -> None:
        slc = parse_endpoint_slice(objects[1])
        assert isinstance(slc, EndpointSlice)
        state.on_endpoint_slice(slc)
        snap, changes = state.collect()
        assert not backend.sync(snap, changes.service_ports).full

    # Every timed sync is a real change, the same at every size: Service k = r // 2 is
    # changed (even r) and changed back (odd r). (Before issue 10 part 6 every other
    # sync here was a no-op, and at 100 Services most were, as r wrapped around: the
    # medians compared different mixes.)
    def same_count(r: int) -> None:  # ten endpoints: other ones, then the first ones again
        k = (r // 2) % anchor
        change(service_objects(k, 10, first_endpoint=5_000_000 + 10 * r if r % 2 == 0 else None))

    def count_change(r: int) -> None:  # eleven endpoints (a count in use), then ten again
        change(service_objects((r // 2) % anchor, 10 + (r % 2 == 0)))

    def new_count(r: int) -> None:  # twelve endpoints (no other Service's count), then ten
        change(service_objects((r // 2) % anchor, 10 + 2 * (r % 2 == 0)))

    def add_service(r: int) -> None:  # a new Service with its ten endpoints
        objects = service_objects(services + r, 10, first_endpoint=6_000_000 + 10 * r)
        state.on_service(None, parse_service(objects[0]))
        change(objects)

    def median(fn: Callable[[int], None]) -> tuple[float, float]:
        """Median wall-clock and CPU milliseconds (user + sys of this process: libnftables
        runs in it, so the kernel's work on the batch is included; CPU time does not count
        waiting for a core on a loaded machine)."""
        times, cpu = [], []
        for r in range(repeats):
            started, started_cpu = time.perf_counter(), time.process_time()
            fn(r)
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
        return statistics.median(times) * 1000, statistics.median(cpu) * 1000

    return {
        "same_count": median(same_count),
        "count_change": median(count_change),
        "new_count": median(new_count),
        "add_service": median(add_service),
    }


if __name__ == "__main__":
    for size in (int(s) for s in sys.argv[1:] or ["100", "10000"]):
        result = measure(size)
        print(
            f"{size:>6} Services, median wall / CPU ms: "
            + ", ".join(
                f"{label} {result[key][0]:.2f} / {result[key][1]:.2f}"
                for key, label in (
                    ("same_count", "same endpoint count"),
                    ("count_change", "count change"),
                    ("new_count", "new count"),
                    ("add_service", "new Service"),
                )
            )
        )
