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
from collections.abc import Iterable
from typing import Any

from bench.cluster import cluster, service_objects
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config import ProxyConfig
from kubeproxy.dataplane.nft import open_runner
from kubeproxy.model.parse import parse_endpoint_slice, parse_service
from kubeproxy.model.state import ProxyState
from kubeproxy.model.types import EndpointSlice, IPFamily

REPEATS = 25


def feed(state: ProxyState, objects: Iterable[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] == "Service":
            state.on_service(None, parse_service(obj))
        else:
            parsed = parse_endpoint_slice(obj)
            assert parsed is not None
            state.on_endpoint_slice(parsed)


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
    script = backend.last_transaction
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

    # Partial sync after one endpoint change: a Service gains, then loses, an endpoint.
    timings = []
    for r in range(REPEATS):
        i = (r * 7919) % services
        objs = service_objects(i, endpoints + (r % 2 == 0))
        slc = parse_endpoint_slice(objs[1])
        assert isinstance(slc, EndpointSlice)
        t = time.perf_counter()
        state.on_endpoint_slice(slc)
        snap, changes = state.collect()
        res = backend.sync(snap, changes.service_ports)
        timings.append(time.perf_counter() - t)
        assert not res.full
    out["partial_endpoint"] = {
        "median": statistics.median(timings),
        "p90": percentile(timings, 0.9),
    }

    # Partial sync after adding one Service (with its endpoints).
    timings = []
    for r in range(REPEATS):
        objs = service_objects(services + r, endpoints, first_endpoint=(services + r) * endpoints)
        t = time.perf_counter()
        feed(state, objs)
        snap, changes = state.collect()
        res = backend.sync(snap, changes.service_ports)
        timings.append(time.perf_counter() - t)
        assert not res.full
    out["partial_add_service"] = {
        "median": statistics.median(timings),
        "p90": percentile(timings, 0.9),
    }

    # The proxy's own peak so far (the nft processes of full syncs are children).
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["nft_child_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

    # The kernel alone: the same full script, nft -f into an empty table.
    backend.cleanup()
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
