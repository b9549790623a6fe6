"""One sync benchmark run, inside a fresh network namespace (started by ``python -m bench``).

``python -m bench.sync_worker MODE N E FLOOR_NS`` builds N Services x E endpoints, feeds
them through the real pipeline (parse → change trackers → the MODE backend
(:mod:`bench.modes`), as ``kubeproxy run`` builds it: libnftables in-process, or
``iptables-<flavour>-restore``) and prints one JSON object:

* ``cold``: the first full sync (render and kernel-apply seconds, total; ``cpu``: user +
  system CPU seconds of this process and of the tools it ran, which a loaded machine
  moves less than the wall clock), with the cyclic GC paused as ``kubeproxy run`` pauses
  it (``KUBEPROXY_BENCH_GC=on`` keeps it running, as the benchmark did before issue 10
  part 6);
* ``floor`` (``floor_cpu``: its CPU seconds): the kernel tool alone (``nft -f``,
  ``iptables-<flavour>-restore --noflush``) loading the same input into FLOOR_NS, an
  empty namespace;
* ``partial_endpoint`` / ``partial_add_service``: median and p90 end-to-end seconds of a
  partial sync after one endpoint change / one new Service (collect + render + apply),
  and how many rules each one's restore wrote (iptables mode);
* ``partial_floor``: the kernel tool alone re-applying the last one-endpoint partial
  sync's input into the loaded table (median of 5, iptables mode; None in nftables mode):
  the floor a partial sync is compared with;
* ``restart``: what a proxy restart costs: a second backend instance's first (full)
  sync over the table the first one programmed (after the partial syncs, so of the same
  Services), split like ``cold``, with the rules its restores wrote (iptables mode);
* ``rss_mb``: the process's peak resident memory (before the restart);
  ``tool_peak_mb``: the kernel tool's, on the floor run (:mod:`bench.peak`);
  ``children_maxrss_mb``: ``RUSAGE_CHILDREN`` as is.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench import peak
from bench.cluster import cluster, service_objects
from bench.modes import Mode
from kubeproxy.model.parse import parse_endpoint_slice, parse_service
from kubeproxy.model.state import ProxyState
from kubeproxy.model.types import EndpointSlice, Service

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


def cpu_seconds() -> float:
    """User + system CPU of this process and its reaped children so far."""
    return sum(
        u.ru_utime + u.ru_stime
        for u in (resource.getrusage(resource.RUSAGE_SELF),
                  resource.getrusage(resource.RUSAGE_CHILDREN))
    )  # fmt: skip


def partial_floor(mode: Mode, text: str) -> float | None:
    """The median seconds of the kernel tool re-applying ``text`` (a partial sync's
    input: it flushes and refills the same chains) into this namespace's table."""
    if mode.flavor is None or not text or text.startswith("#"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        argv, stdin = mode.floor_command(f"# iptables-restore\n{text}", Path(tmp) / "input")
        return statistics.median(peak.measure(argv, stdin).seconds for _ in range(5))


def main(mode: Mode, services: int, endpoints: int, floor_ns: str) -> dict[str, Any]:
    config = mode.config("node-a", ("10.128.0.0/9",))
    backend = mode.backend(config)
    backend.start()
    state = ProxyState("node-a")

    started = time.perf_counter()
    feed(state, cluster(services, endpoints))
    parse_seconds = time.perf_counter() - started
    gc.collect()

    # As ``kubeproxy run`` (app.App.run): the cyclic GC is paused for the first sync,
    # then the loaded state is frozen out of later collections. (Until issue 10 part 6
    # the benchmark kept it running: ~0.6 s of CPU more at 10,000 Services.)
    gc_default = os.environ.get("KUBEPROXY_BENCH_GC") == "on"
    if not gc_default:
        gc.disable()
    started, cpu = time.perf_counter(), cpu_seconds()
    snapshot, _ = state.collect()
    result = backend.sync(snapshot, None)
    cold = time.perf_counter() - started
    cold_cpu = cpu_seconds() - cpu
    if not gc_default:
        gc.collect()
        gc.freeze()
        gc.enable()
    out: dict[str, Any] = {
        "mode": mode.name,
        "services": services,
        "endpoints": endpoints,
        "parse_seconds": parse_seconds,
        "cold": {
            "total": cold,
            "render": cold - result.apply_seconds,
            "apply": result.apply_seconds,
            "cpu": cold_cpu,
            "elements": result.elements,
            "table_rules": result.table_rules,
        },
    }

    last_input = ""

    def partials(objects_for: Callable[[int], list[dict[str, Any]]]) -> dict[str, Any]:
        """Median and p90 of partial syncs (the objects are parsed before the clock), the
        median kernel time among them, and the rules each restore wrote (iptables mode;
        0 in nftables mode)."""
        timings, kernel, written = [], [], []
        nonlocal last_input
        for r in range(REPEATS):
            models = parse_all(objects_for(r))
            started = time.perf_counter()
            apply(state, models)
            snap, changes = state.collect()
            res = backend.sync(snap, changes.service_ports)
            timings.append(time.perf_counter() - started)
            assert not res.full
            kernel.append(res.apply_seconds)
            written.append(sum(res.table_rules_written.values()))
            last_input = getattr(backend, "last_restore", "")
        return {
            "median": statistics.median(timings),
            "p90": percentile(timings, 0.9),
            "apply_median": statistics.median(kernel),
            "rules_written": {"min": min(written), "median": statistics.median(written),
                              "max": max(written)},
        }  # fmt: skip

    # One endpoint change: a Service gains an endpoint, then (the next run) loses it again
    # (every run changes something: no sync of an unchanged Service is timed).
    out["partial_endpoint"] = partials(
        lambda r: service_objects(((r // 2) * 7919) % services, endpoints + (r % 2 == 0))[1:]
    )
    out["partial_floor"] = partial_floor(mode, last_input)
    # One new Service with its endpoints.
    out["partial_add_service"] = partials(
        lambda r: service_objects(
            services + r, endpoints, first_endpoint=(services + r) * endpoints
        )
    )

    # The proxy's own peak so far, and its children's as getrusage reports it (which is
    # at least the proxy's own size when it spawned them: see bench.peak).
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["children_maxrss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

    # A restart: a new backend (the old one's memory is not freed first, so this comes
    # after the peak RSS was read) does its first sync over what the first one wrote.
    snapshot = state.collect()[0]
    restarted = mode.backend(config)
    restarted.start()
    started = time.perf_counter()
    result = restarted.sync(snapshot, None)
    restart = time.perf_counter() - started
    out["restart"] = {
        "total": restart,
        "render": restart - result.apply_seconds,
        "apply": result.apply_seconds,
        "rules_written": sum(result.table_rules_written.values()),
    }
    del restarted, result
    gc.collect()

    # The kernel tool alone: the same full input, loaded into an empty namespace (rendered
    # after the peak RSS was read: it is not part of what the proxy holds), timed and
    # its peak RSS measured from a small process.
    script = backend.render(snapshot)
    with tempfile.TemporaryDirectory() as tmp:
        argv, stdin = mode.floor_command(script, Path(tmp) / "input")
        floor = peak.measure(argv, stdin, netns=floor_ns)
    out["floor"] = floor.seconds
    out["floor_cpu"] = floor.cpu_seconds
    out["tool_peak_mb"] = floor.peak_mb
    out["peak_floor_mb"] = floor.floor_mb
    out["script_mb"] = len(script) / 1e6
    return out


if __name__ == "__main__":
    mode_name, size, per_service, floor_namespace = sys.argv[1:]
    print(json.dumps(main(Mode(mode_name), int(size), int(per_service), floor_namespace)))
