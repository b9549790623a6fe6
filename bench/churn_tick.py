"""CPU cost of churn ticks through the proxy's whole path, phase by phase (root).

    python -m bench.churn_tick [--services 1000] [--endpoints 100] [--churn 0.1]
                               [--ticks 10] [--profile FILE]

In a network namespace of its own (created and deleted by this command), one process
plays both sides of :mod:`bench.soak`'s churn without its clocks: the objects of each
tick (:class:`bench.soak.Fleet`) are encoded as watch events, then go through the same
code as ``kubeproxy run`` with the API source: msgspec decode and parse
(:class:`~kubeproxy.sources.kube_informer.Informer`'s ``_model``), the trackers
(``Proxy.on_events``), and one sync (``Proxy.sync``: collect, nftables render and apply
with the real ``nft``, conntrack cleanup). Each phase's CPU time (user + system of this
process, and of the ``nft``/``conntrack`` children it waited for) is summed over
``--ticks`` ticks and printed per tick, with the share of the cyclic garbage collector
(handled as ``Proxy.run`` does), and the set and map elements the syncs deleted and
added (in the backends maps and elsewhere). ``--profile``: a cProfile of the ticks.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import random
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from bench.soak import CLUSTER_CIDR, Fleet
from kubeproxy.app import Proxy
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.conntrack import ConntrackCommand
from kubeproxy.dataplane.nftables.runner import open_runner
from kubeproxy.dataplane.nftables.transaction import AddElements, DeleteElements, Transaction
from kubeproxy.lab.netns import enter_netns, temporary_netns
from kubeproxy.lab.objects import node
from kubeproxy.model.events import Event, Model
from kubeproxy.model.parse import parse_endpoint_slice, parse_node, parse_service
from kubeproxy.model.types import NamespacedName
from kubeproxy.sources.kube_decode import object_decoder
from kubeproxy.sources.kube_informer import transition

_encode = msgspec.json.Encoder().encode


class Phases:
    """CPU seconds per named phase: this process's and its waited-for children's."""

    def __init__(self) -> None:
        self.own: dict[str, float] = defaultdict(float)
        self.children: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        before = os.times()
        try:
            yield
        finally:
            after = os.times()
            self.own[name] += after.user + after.system - before.user - before.system
            self.children[name] += (
                after.children_user
                + after.children_system
                - before.children_user
                - before.children_system
            )


class ElementCount:
    """Wraps the backend's runner: how many set and map elements its transactions
    deleted and added (in the backends maps, and elsewhere)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.counts: dict[str, int] = defaultdict(int)

    def apply(self, tx: Transaction) -> None:
        self.runner.apply(tx)
        for op in tx:
            if isinstance(op, AddElements | DeleteElements):
                verb = "added" if isinstance(op, AddElements) else "deleted"
                n = len(op.elements) if isinstance(op, AddElements) else len(op.keys)
                # (by name, so that the code before issue 10 part 6, whose one map was
                # "ip-backends", can be measured with this benchmark too)
                where = "backends" if op.set_name.endswith("-backends") else "other"
                self.counts[f"{where} {verb}"] += n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)


class GcClock:
    """CPU time spent in the cyclic garbage collector, per generation."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.runs = [0, 0, 0]
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.seconds[info["generation"]] += time.process_time() - self._started
            self.runs[info["generation"]] += 1

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


class Decoder:
    """What an informer does with watch lines: decode, parse, diff with what it knew."""

    def __init__(self) -> None:
        self.known: dict[tuple[str, NamespacedName], Model] = {}
        self._decoders = {k: object_decoder(k) for k in ("Service", "EndpointSlice")}

    def events(self, lines: list[tuple[str, bytes]]) -> list[Event]:
        out: list[Event] = []
        for kind, raw in lines:
            decoded = self._decoders[kind](raw)
            assert decoded.obj is not None
            new = (parse_service if kind == "Service" else parse_endpoint_slice)(decoded.obj)
            key = (kind, NamespacedName(decoded.namespace, decoded.name))
            old = self.known.get(key)
            if new is None:
                self.known.pop(key, None)
            else:
                self.known[key] = new
            out.extend(transition(old, new))
        return out

    def deleted(self, kind: str, namespace: str, name: str) -> list[Event]:
        old = self.known.pop((kind, NamespacedName(namespace, name)), None)
        return [] if old is None else [Event.deleted(old)]


def _lines(objects: list[dict[str, Any]], rv: int) -> list[tuple[str, bytes]]:
    out = []
    for obj in objects:
        meta = {**obj["metadata"], "resourceVersion": str(rv)}
        out.append((obj["kind"], _encode({**obj, "metadata": meta})))
    return out


async def run(
    services: int,
    endpoints: int,
    churn: float,
    ticks: int,
    profile: str | None,
    *,
    managed: bool = True,
) -> dict[str, Any]:
    fleet = Fleet(endpoints, random.Random(0))
    for _ in range(services):
        fleet.add()
    config = ProxyConfig(
        hostname="node-a",
        cluster_cidrs=(CLUSTER_CIDR,),
        healthz_bind_address="",
        metrics_bind_address="",
    )
    counter = ElementCount(open_runner())
    proxy = Proxy(config, NftablesBackend(config, counter), conntrack=ConntrackCommand())
    proxy.backend.start()
    # The collector as Proxy.run handles it (Proxy._collect_garbage): automatic
    # collections off, one collection after each sync, survivors frozen.
    gc.disable()
    decoder = Decoder()
    initial = [o for i in sorted(fleet.live) for o in fleet.objects(i)]
    proxy.on_events([Event.added(parse_node(node("node-a", ["192.168.77.1"])))])
    proxy.on_events(decoder.events(_lines(initial, 1)))
    started = time.perf_counter()
    assert await proxy.sync()
    full = time.perf_counter() - started
    proxy._gc_managed = managed
    proxy._collect_garbage()
    if not managed:  # as before Proxy._collect_garbage: the start frozen, then automatic
        gc.collect()
        gc.freeze()
        gc.enable()
    collector = GcClock()
    counter.counts.clear()
    phases = Phases()
    profiler = cProfile.Profile() if profile else None
    changed = 0
    for tick in range(ticks):
        applies, deletes = fleet.churn(churn, 5)
        lines = _lines(applies, tick + 2)
        changed += len(applies) // 2
        if profiler is not None:
            profiler.enable()
        with phases("decode and parse"):
            events = decoder.events(lines)
            for kind, namespace, name in deletes:
                events += decoder.deleted(kind, namespace, name)
        with phases("trackers"):
            proxy.on_events(events)
        with phases("collect"):
            snapshot, changes, full_sync = proxy._collect()
        assert not full_sync
        with phases("render and apply"):
            result = proxy.backend.sync(snapshot, changes.service_ports)
        with phases("conntrack"):
            proxy._clear_conntrack()
        with phases("report"):
            await proxy._report(snapshot, changes, result, 0.0)
        with phases("collect garbage after the sync"):
            proxy._collect_garbage()
        if profiler is not None:
            profiler.disable()
    collector.close()
    gc.unfreeze()
    gc.enable()
    if profiler is not None and profile:
        profiler.dump_stats(profile)
    return {
        "full_sync_seconds": full,
        "ticks": ticks,
        "slices_per_tick": changed / ticks,
        "gc_per_tick": [s / ticks for s in collector.seconds],
        "gc_runs": collector.runs,
        "elements_per_tick": {k: v / ticks for k, v in sorted(counter.counts.items())},
    } | {
        "cpu_per_tick": {
            name: (phases.own[name] / ticks, phases.children[name] / ticks) for name in phases.own
        }
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--endpoints", type=int, default=100)
    parser.add_argument("--churn", type=float, default=0.1)
    parser.add_argument("--ticks", type=int, default=10)
    parser.add_argument("--profile", default=None)
    parser.add_argument(
        "--automatic-gc",
        action="store_true",
        help="the collector's own schedule after the start (before Proxy._collect_garbage)",
    )
    args = parser.parse_args()
    with temporary_netns(f"kpchurn-{os.getpid() % 100000}") as ns:
        enter_netns(ns)
        figures = asyncio.run(
            run(
                args.services,
                args.endpoints,
                args.churn,
                args.ticks,
                args.profile,
                managed=not args.automatic_gc,
            )
        )
    print(
        f"{args.services} Services x {args.endpoints} endpoints, churn {args.churn:g}: "
        f"{figures['slices_per_tick']:.0f} slices per tick, {figures['ticks']} ticks "
        f"(full sync {figures['full_sync_seconds']:.1f}s)"
    )
    print("| phase | CPU per tick: proxy | its children (nft, conntrack) |")
    print("|---|---|---|")
    total_own = total_children = 0.0
    for name, (own, children) in figures["cpu_per_tick"].items():
        total_own += own
        total_children += children
        print(f"| {name} | {own * 1e3:.0f} ms | {children * 1e3:.0f} ms |")
    print(f"| **all** | {total_own * 1e3:.0f} ms | {total_children * 1e3:.0f} ms |")
    gc_ms = ", ".join(
        f"gen{g} {s * 1e3:.0f} ms ({n} runs)"
        for g, (s, n) in enumerate(zip(figures["gc_per_tick"], figures["gc_runs"], strict=True))
    )
    print(f"of which the cyclic garbage collector, per tick: {gc_ms}")
    elements = ", ".join(f"{k} {v:.0f}" for k, v in figures["elements_per_tick"].items())
    print(f"elements per tick: {elements}")
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
