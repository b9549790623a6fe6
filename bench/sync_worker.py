"""One sync benchmark run, inside a fresh network namespace (started by ``bench.run``).

``python -m bench.sync_worker N E`` builds N Services x E endpoints, feeds them through the
real pipeline (parse → change trackers → nftables backend with libnftables, as
``kubeproxy run`` does) and prints one JSON object:

* ``cold``: the first full sync (render and kernel-apply seconds, total);
* ``nft_alone``: ``nft -f`` loading the same script into an empty namespace;
* ``partial_endpoint`` / ``partial_add_service``: median and p90 end-to-end seconds of a
  partial sync after one endpoint change / one new Service (collect + render + apply);
* ``rss_mb``: the process's peak resident memory.
"""

from __future__ import annotations

import gc
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

from bench.cluster import cluster, service_objects
from kubeproxy.backends.nftables.proxier import NftablesBackend, cleanup
from kubeproxy.config import ProxyConfig
from kubeproxy.dataplane.nftables.runner import open_runner
from kubeproxy.model.parse import parse_endpoint_slice, parse_service
from kubeproxy.model.state import ProxyState
from kubeproxy.model.types import EndpointSlice, IPFamily, Service

REPEATS = 25


def parse_all(objects: Iterable[dict[str, Any]]) -> list[Service | EndpointSlice]:
    out: list[Service | EndpointSlice] = []
    for obj in objects:
        parsed = parse_service(obj) if obj["kind"] == "Service" else parse_endpoint_slice(obj)
        assert parsed is not None
        out.append(parsed)
    return out


def apply(state: ProxyState, models: Iterable[Service | EndpointSlice]) -> None:
    for model in models:
        if isinstance(model, Service):
            state.on_service(None, model)
        else:
            state.on_endpoint_slice(model)


def feed(state: ProxyState, objects: Iterable[dict[str, Any]]) -> None:
    apply(state, parse_all(objects))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(services: int, endpoints: int) -> dict[str, Any]:
    config = ProxyConfig(
        hostname="node-a", cluster_cidrs=("10.128.0.0/9",), families=(IPFamily.IPv4,)
    )
    backend = NftablesBackend(config, open_runner())
    state = ProxyState("node-a")

    started = time.perf_counter()
    feed(state, cluster(services, endpoints))
    parse_seconds = time.perf_counter() - started
    gc.collect()

    started = time.perf_counter()
    snapshot, _ = state.collect()
    result = backend.sync(snapshot, None)
    cold = time.perf_counter() - started
    out: dict[str, Any] = {
        "services": services,
        "endpoints": endpoints,
        "parse_seconds": parse_seconds,
        "cold": {
            "total": cold,
            "render": cold - result.apply_seconds,
            "apply": result.apply_seconds,
            "elements": result.elements,
        },
    }

    def partials(objects_for: Callable[[int], list[dict[str, Any]]]) -> dict[str, float]:
        """Median and p90 of partial syncs (the objects are parsed before the clock)."""
        timings = []
        for r in range(REPEATS):
            models = parse_all(objects_for(r))
            started = time.perf_counter()
            apply(state, models)
            snap, changes = state.collect()
            res = backend.sync(snap, changes.service_ports)
            timings.append(time.perf_counter() - started)
            assert not res.full
        return {"median": statistics.median(timings), "p90": percentile(timings, 0.9)}

    # One endpoint change: a Service gains, then loses, an endpoint.
    out["partial_endpoint"] = partials(
        lambda r: service_objects((r * 7919) % services, endpoints + (r % 2 == 0))[1:]
    )
    # One new Service with its endpoints.
    out["partial_add_service"] = partials(
        lambda r: service_objects(
            services + r, endpoints, first_endpoint=(services + r) * endpoints
        )
    )

    # The proxy's own peak so far (the nft processes of full syncs are children).
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["nft_child_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

    # The kernel alone: the same full script, nft -f into an empty table (rendered after
    # the peak RSS was read: it is not part of what the proxy holds).
    script = backend.render(state.collect()[0])
    cleanup(backend.runner)
    with tempfile.NamedTemporaryFile("w", suffix=".nft") as f:
        f.write(script)
        f.flush()
        t = time.perf_counter()
        subprocess.run(["nft", "-f", f.name], check=True)
        out["nft_alone"] = time.perf_counter() - t
    out["script_mb"] = len(script) / 1e6
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
