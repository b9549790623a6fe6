"""Benchmark of the Kubernetes API source: decoding, initial sync and watch throughput.

    python -m bench.bench_api [--services N] [--slices-per-service N]
                              [--endpoints-per-slice N] [--flood N]

Defaults: 10,000 Services with 10 endpoints each, split over 2 EndpointSlices (20,000
slices), objects shaped as a real API server returns them (managedFields,
ownerReferences...), see ``tests.apiserver.fleet``.

Phases:

1. **decode** (in this process, no HTTP): the EndpointSlice List body is split into raw
   items, the items are decoded into the dicts the parser reads, then parsed into the
   model; ``json.loads`` of the same body is shown for reference.
2. **initial sync** — the API server stand-in and the client each run in their own
   process (so the client's peak RSS is its own): time from starting
   ``KubeSource.watch`` to its first (complete) batch, the client's RSS then and its
   peak (baseline: ~45 MB for the interpreter and imports), once
   against a server with a watch cache (the initial ``resourceVersion=0`` list comes back
   in one response per resource) and once paginated (``limit=500``, as without one).
3. **watch throughput**: the server updates ``--flood`` EndpointSlices at once, then
   streams the events; the client reports events per second from the start of the
   stream to the last event, and how many batches they were coalesced into.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import msgspec
from tests.apiserver import ApiServer, fleet, node_object

from kubeproxy.model.parse import parse_endpoint_slice
from kubeproxy.sources.kube import KubeSource
from kubeproxy.sources.kube_client import load_connection
from kubeproxy.sources.kube_decode import decode_list, gc_paused, object_decoder
from kubeproxy.sources.kube_informer import Tuning

NODE = "node-a"
T = TypeVar("T")


@dataclass(frozen=True)
class Size:
    services: int
    slices_per_service: int
    endpoints_per_slice: int

    def objects(self) -> list[dict[str, Any]]:
        return list(fleet(self.services, self.slices_per_service, self.endpoints_per_slice))


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    gc.collect()
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def memory_mb(field: str) -> float:
    """VmHWM (peak) or VmRSS (now) of this process, in MB.

    Not getrusage's ru_maxrss: on Linux a spawned child inherits its parent's peak
    through fork+exec, which would charge the decode phase to the client.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    raise LookupError(field)


# ------------------------------------------------------------------------------ decode


def bench_decode(size: Size) -> list[tuple[str, str]]:
    slices = [
        {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
        for obj in size.objects()
        if obj["kind"] == "EndpointSlice"
    ]
    body = msgspec.json.encode(
        {
            "kind": "EndpointSliceList",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"resourceVersion": "1"},
            "items": slices,
        }
    )
    del slices
    decode = object_decoder("EndpointSlice")
    page, split = timed(lambda: decode_list(body))
    items = page.items or []

    def to_dicts() -> list[dict[str, Any]]:
        with gc_paused():
            return [d.obj for raw in items if (d := decode(raw)).obj is not None]

    dicts, decoded = timed(to_dicts)

    def parse() -> int:
        with gc_paused():
            return sum(parse_endpoint_slice(d) is not None for d in dicts)

    _, parsed = timed(parse)
    _, reference = timed(lambda: json.loads(body))
    return [
        ("EndpointSliceList body", f"{len(body) / 1e6:.1f} MB, {len(items):,} items"),
        ("split into raw items (msgspec)", f"{split * 1000:.0f} ms"),
        ("items -> dicts for the parser (msgspec)", f"{decoded * 1000:.0f} ms"),
        ("decode total", f"{(split + decoded) * 1000:.0f} ms"),
        ("parse dicts -> model (kubeproxy.model.parse)", f"{parsed * 1000:.0f} ms"),
        ("json.loads of the body (reference)", f"{reference * 1000:.0f} ms"),
    ]


# ------------------------------------------------------------------------------ server


def serve(size: Size, watch_cache: bool, conn: Connection) -> None:
    """Child process: the stand-in, populated, obeying commands from the parent."""

    async def main() -> None:
        async with ApiServer(watch_cache=watch_cache) as api:
            api.create(node_object(NODE, "192.168.0.1"))
            slices = []
            for obj in size.objects():
                api.create(obj)
                if obj["kind"] == "EndpointSlice":
                    slices.append(obj)
            conn.send(api.url)
            loop = asyncio.get_running_loop()
            while (command := await loop.run_in_executor(None, conn.recv)) != "stop":
                _, count = command
                for i in range(count):  # flip readiness: every update is a real change
                    obj = slices[i % len(slices)]
                    endpoint = obj["endpoints"][0]
                    ready = not endpoint["conditions"]["ready"]
                    endpoint["conditions"] = {**endpoint["conditions"], "ready": ready}
                    api.update(obj)
                # Nothing was written while this loop held the event loop: the lines are
                # all queued, and streaming them starts now (monotonic: one clock for all
                # processes on Linux).
                conn.send(time.monotonic())

    asyncio.run(main())


# ------------------------------------------------------------------------------ client


def client(url: str, flood: int, conn: Connection) -> None:
    """Child process: initial sync, then count the flood; reports numbers to the parent."""

    async def main() -> dict[str, float]:
        connection = load_connection(None, url, qps=-1)
        source = KubeSource(connection, NODE, tuning=Tuning())
        stop = asyncio.Event()
        stream = source.watch(stop)
        started = time.perf_counter()
        first = await anext(stream)
        synced = time.perf_counter() - started
        peak_synced, rss_synced = memory_mb("VmHWM"), memory_mb("VmRSS")
        conn.send("synced")
        received = batches = 0
        last_event = 0.0
        while received < flood:
            received += len(await anext(stream))
            batches += 1
            last_event = time.monotonic()
        stop.set()
        await stream.aclose()
        streaming_started = conn.recv()
        return {
            "events": float(len(first)),
            "sync": synced,
            "peak": peak_synced,
            "rss": rss_synced,
            "throughput": received / (last_event - streaming_started),
            "batches": float(batches),
            "peak_end": memory_mb("VmHWM"),
        }

    conn.send(asyncio.run(main()))


def bench_sync(size: Size, flood: int, watch_cache: bool) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    server_end, server_child = context.Pipe()
    client_end, client_child = context.Pipe()
    server = context.Process(target=serve, args=(size, watch_cache, server_child))
    server.start()
    try:
        url = server_end.recv()
        proxy = context.Process(target=client, args=(url, flood, client_child))
        proxy.start()
        assert client_end.recv() == "synced"
        server_end.send(("flood", flood))
        client_end.send(server_end.recv())
        result: dict[str, float] = client_end.recv()
        proxy.join()
        return result
    finally:
        server_end.send("stop")
        server.join(timeout=30)


# --------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--slices-per-service", type=int, default=2)
    parser.add_argument("--endpoints-per-slice", type=int, default=5)
    parser.add_argument("--flood", type=int, default=20_000)
    args = parser.parse_args()
    size = Size(args.services, args.slices_per_service, args.endpoints_per_slice)
    slices = size.services * size.slices_per_service
    print(
        f"kubeproxy API source: {size.services:,} Services, {slices:,} EndpointSlices "
        f"({size.endpoints_per_slice} endpoints each), flood of {args.flood:,} updates\n"
    )
    rows = bench_decode(size)
    for label, watch_cache in (("watch cache", True), ("paginated", False)):
        r = bench_sync(size, args.flood, watch_cache)
        rows += [
            (
                f"initial sync, {label}: first batch",
                f"{r['sync']:.2f} s ({r['events']:,.0f} events), "
                f"RSS {r['rss']:.0f} MB (peak {r['peak']:.0f} MB)",
            ),
            (
                f"watch flood, {label}",
                f"{r['throughput']:,.0f} events/s in {r['batches']:.0f} batches, "
                f"peak RSS {r['peak_end']:.0f} MB",
            ),
        ]
    width = max(len(label) for label, _ in rows)
    print(f"{'phase':<{width}}  result")
    print(f"{'-' * width}  {'-' * 40}")
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


if __name__ == "__main__":
    main()
