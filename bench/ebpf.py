"""ebpf mode: connect latency direct vs socket hook vs nftables DNAT, and update latency.

``python -m bench.ebpf [--sizes 100,10000] [--connections 1000] [--rounds 5] [--no-freeze]``
(root).

In the namespace lab, node-a is programmed in ebpf mode (its nftables tables and the BPF
service map, from the same snapshot) with N Services (N-1 synthetic ones with 10
endpoints each, plus the measured one whose endpoint is a Pod on node-a), the hooks
attached to a cgroup of the benchmark's own. From the client Pod, TCP ``connect()``
times (SYN out, SYN-ACK back) to:

* **direct** — the Pod's own address, from a process outside the cgroup (no hook runs);
* **direct, hooked** — the same, from a process in the cgroup (the hook runs, finds no
  Service, leaves the socket alone: the hook's cost for non-Service traffic);
* **ebpf** — the ClusterIP from a process in the cgroup (rewritten in ``connect()``);
* **ebpf, affinity** — the same for a second Service, with ClientIP session affinity
  (one more map lookup and an affinity refresh per ``connect()``);
* **nftables** — the ClusterIP from a process outside the cgroup: DNAT by the same
  kubeproxy's nftables rules, i.e. nftables mode's data path.

Then the time to take one endpoint change: the BPF map write alone (one slot); change
to effect, from the start of the ebpf backend's partial sync until the map holds the
change (planning included), wall-clock and this thread's CPU time, and how many of
those syncs had a cyclic garbage collection run inside them; and the whole partial sync
(its nftables transaction included). As ``kubeproxy run`` does, the state loaded by the
full sync is frozen out of later collections (``gc.collect(); gc.freeze()``) unless
``--no-freeze``. Last, conntrack entries with the ClusterIP as destination after 1,000
hooked connections.
Prints a Markdown table and the raw numbers as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

from bench.cluster import cluster, cluster_ip
from bench.datapath import probe
from bench.sync_worker import feed
from kubeproxy.backends.ebpf.proxier import EbpfBackend, socket_lb_opener
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.bpf.socklb import Backends, Frontend, Target, cleanup
from kubeproxy.dataplane.nftables.runner import NftCommand
from kubeproxy.lab.cluster import NODE, Lab
from kubeproxy.lab.netns import ns_exec
from kubeproxy.lab.objects import Ep, endpoint_slice, service
from kubeproxy.lab.sockclient import BpfLab
from kubeproxy.model.state import ProxyState, Snapshot
from kubeproxy.model.types import Endpoint, IPFamily, L4Protocol, ServicePortName

POD_IP = "10.244.1.10"
SPARE_IP = "10.244.1.11"
CLIENT_IP = "10.244.1.100"


def stats(times_s: list[float]) -> tuple[float, float]:
    ordered = sorted(times_s)
    return statistics.median(ordered) * 1e6, ordered[int(0.99 * len(ordered))] * 1e6


def measure(rounds: int, paths: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each path once per round, interleaved, so a noisy moment of a shared machine
    falls on every path alike; the median over rounds of each round's median and p99."""
    medians: dict[str, list[float]] = {name: [] for name in paths}
    p99s: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            median, p99 = stats(fn())
            medians[name].append(median)
            p99s[name].append(p99)
    return {
        name: {
            "median_us": statistics.median(medians[name]),
            "p99_us": statistics.median(p99s[name]),
        }
        for name in paths
    }


def snapshot_of(services: int) -> tuple[Snapshot, ServicePortName]:
    """N-1 synthetic Services, the measured one, and the measured one with affinity."""
    state = ProxyState(NODE)
    vip = cluster_ip(services - 1)
    http = [{"name": "http", "port": 80}]
    objects = [
        *cluster(services - 1, 10),
        service("measured", vip, http, namespace="bench"),
        endpoint_slice("measured", [Ep(POD_IP, node=NODE)], namespace="bench"),
        service(
            "affinity", cluster_ip(services), http, namespace="bench", sessionAffinity="ClientIP"
        ),
        endpoint_slice("affinity", [Ep(POD_IP, node=NODE)], namespace="bench"),
    ]
    feed(state, objects)
    snapshot, _ = state.collect()
    name = next(n for n in snapshot.services if n.service.name == "measured")
    return snapshot, name


def lab_backend(lab: Lab, bpf: BpfLab) -> EbpfBackend:
    """An ebpf backend for node-a of ``lab``, its hooks on ``bpf``'s cgroup (started)."""
    config = ProxyConfig(
        hostname=NODE,
        mode=ProxyMode.EBPF,
        cluster_cidrs=("10.128.0.0/9", "10.244.0.0/16"),
        families=(IPFamily.IPv4,),
        ebpf_cgroup_path=str(bpf.cgroup),
        ebpf_pin_path=str(bpf.pin_path),
    )
    backend = EbpfBackend(
        config,
        NftablesBackend(config, NftCommand(netns=lab.node_ns)),
        socket_lb_opener(config),
    )
    backend.start()
    return backend


def run_size(
    lab: Lab, bpf: BpfLab, services: int, connections: int, rounds: int, *, freeze: bool
) -> dict[str, Any]:
    backend = lab_backend(lab, bpf)
    try:
        snapshot, name = snapshot_of(services)
        started = time.perf_counter()
        backend.sync(snapshot, None)
        full_s = time.perf_counter() - started
        if freeze:  # as kubeproxy.app after its first sync
            gc.collect()
            gc.freeze()
        vip = cluster_ip(services - 1)
        netns = lab.pods["client"].netns

        def hooked(host: str, port: int) -> list[float]:
            ns = bpf.client(netns, "latency", host, port, connections)["ns"]
            return [t / 1e9 for t in ns]

        probe(lab, POD_IP, 8080, 300)  # ARP and caches
        hooked(vip, 80)
        result: dict[str, Any] = {
            "services": services,
            "connections": connections * rounds,
            "full_sync_s": full_s,
            **measure(
                rounds,
                {
                    "direct": lambda: probe(lab, POD_IP, 8080, connections),
                    "direct_hooked": lambda: hooked(POD_IP, 8080),
                    "ebpf": lambda: hooked(vip, 80),
                    "ebpf_affinity": lambda: hooked(cluster_ip(services), 80),
                    "nftables": lambda: probe(lab, vip, 80, connections),
                },
            ),
        }
        ns_exec(lab.node_ns, "conntrack", "-F", check=False)
        bpf.client(netns, "latency", vip, 80, 1000)
        out = ns_exec(lab.node_ns, "conntrack", "-L", "-d", vip, check=False)
        result["conntrack_to_vip_per_1000"] = sum(
            line.startswith("tcp") for line in out.splitlines()
        )
        result.update(update_latency(backend, snapshot, name))
        return result
    finally:
        backend.stop()
        gc.unfreeze()


def update_latency(
    backend: EbpfBackend, snapshot: Snapshot, name: ServicePortName, times: int = 50
) -> dict[str, Any]:
    """One endpoint of the measured Service added and removed, ``times`` times each way."""
    lb = backend.socket_lb
    frontend = Frontend(snapshot.services[name].cluster_ips[0], 80, L4Protocol.TCP)
    one = Backends((Target(POD_IP, 8080),))
    two = Backends((Target(POD_IP, 8080), Target(SPARE_IP, 8080)))
    writes = []
    for i in range(times * 2):
        want, have = (two, one) if i % 2 == 0 else (one, two)
        started = time.perf_counter()
        lb.services.write(frontend, want, have)
        writes.append(time.perf_counter() - started)
    spare = Endpoint(SPARE_IP, 8080, NODE)
    syncs, effects, cpu = [], [], []
    collections = [0]

    def count(phase: str, info: dict[str, int]) -> None:
        collections[0] += phase == "start"

    with_gc = 0
    gc.callbacks.append(count)
    try:
        for i in range(times * 2):
            eps = dict(snapshot.endpoints)
            if i % 2 == 0:
                eps[name] = (*eps[name], spare)
            before = collections[0]
            started = time.perf_counter()
            backend.sync(replace(snapshot, endpoints=eps), {name})
            syncs.append(time.perf_counter() - started)
            effects.append(backend.map_seconds)
            cpu.append(backend.map_cpu_seconds)
            with_gc += collections[0] > before
    finally:
        gc.callbacks.remove(count)
    out: dict[str, Any] = {"syncs_with_gc": with_gc, "syncs": times * 2}
    for key, values in (
        ("map_write", writes),
        ("to_effect", effects),
        ("to_effect_cpu", cpu),
        ("partial_sync", syncs),
    ):
        median, p99 = stats(values)
        out[key] = {"median_us": median, "p99_us": p99}
    return out


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| Services | direct | direct, hooked | ebpf ClusterIP | ebpf, affinity "
        "| nftables ClusterIP | ebpf vs direct | map write | change to effect "
        "| its CPU time | syncs with a GC pass | whole partial sync "
        "| conntrack to VIP /1000 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:

        def cell(d: dict[str, float]) -> str:
            return f"{d['median_us']:.1f} / {d['p99_us']:.1f} µs"

        ratio = r["ebpf"]["median_us"] / r["direct"]["median_us"]
        lines.append(
            f"| {r['services']:,} | {cell(r['direct'])} | {cell(r['direct_hooked'])} "
            f"| {cell(r['ebpf'])} | {cell(r['ebpf_affinity'])} | {cell(r['nftables'])} "
            f"| {ratio:.2f}x | {cell(r['map_write'])} | {cell(r['to_effect'])} "
            f"| {cell(r['to_effect_cpu'])} | {r['syncs_with_gc']}/{r['syncs']} "
            f"| {cell(r['partial_sync'])} | {r['conntrack_to_vip_per_1000']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,10000")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="leave the loaded state to the cyclic GC (kubeproxy run freezes it)",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results = []
    prefix = f"kpbe{os.getpid() % 100000}"
    with Lab(prefix, mode="ebpf") as lab, BpfLab(f"{prefix}-cg") as bpf:
        lab.add_pod("web", NODE, [POD_IP])
        lab.add_pod("spare", NODE, [SPARE_IP])
        lab.add_pod("client", NODE, [CLIENT_IP])
        for size in sizes:
            result = run_size(
                lab, bpf, size, args.connections, args.rounds, freeze=not args.no_freeze
            )
            results.append(result)
            sys.stderr.write(json.dumps(results[-1]) + "\n")
        cleanup(bpf.pin_path)
    print(table(results))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
