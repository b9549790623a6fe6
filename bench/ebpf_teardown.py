"""ebpf mode: what tearing down a removed endpoint's UDP sockets costs, and where.

``python -m bench.ebpf_teardown [--sockets 1000] [--processes 100] [--rounds 6]`` (root).

In the namespace lab, node-a is programmed in ebpf mode with one UDP Service (port 53)
whose only endpoint is Pod A, its hooks on a cgroup of the benchmark's own. Each round:
a client process in that cgroup (in the client Pod's namespace) connects ``--sockets``
UDP sockets to the ClusterIP, all rewritten to A; ``--processes`` idle processes sit in
the cgroup too (spread over the lab's Pod namespaces), as other Pods' processes would.
Then the endpoint changes to Pod B (a partial sync), and the teardown destroys every
socket to A (the client checks: ``SO_ERROR`` is ``ECONNABORTED`` on each).

Rounds alternate between the teardown **inline** (inside the sync, before its nftables
transaction, as before: ``InlineTeardown``) and on the **worker** thread (as now). For
each (medians over the rounds): the whole partial sync's wall-clock and CPU time (the
syncing thread's; inline, the process's, as the walk runs in a thread the sync waits
for); the teardown's wall-clock and CPU time (the process's from the sync's start until
the sockets were destroyed, minus the syncing thread's); and that whole interval's
wall-clock and process CPU. The nftables transaction runs ``nft`` in a child process,
counted in neither. Prints a Markdown table and the raw numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from bench.ebpf import CLIENT_IP, POD_IP, SPARE_IP, lab_backend
from bench.sync_worker import feed
from kubeproxy.backends.ebpf.proxier import EbpfBackend
from kubeproxy.backends.ebpf.teardown import Pair, SocketTeardown
from kubeproxy.dataplane.bpf.socklb import Frontend, Target, cleanup
from kubeproxy.lab.cluster import NODE, Lab, lab_env
from kubeproxy.lab.objects import Ep, endpoint_slice, service
from kubeproxy.lab.sockclient import BpfLab
from kubeproxy.model.state import ProxyState, Snapshot
from kubeproxy.model.types import Endpoint, ServicePortName

VIP = "10.96.53.53"
DNS = {"name": "dns", "port": 53, "protocol": "UDP"}
DNS_TARGET = {"name": "dns", "port": 8080, "protocol": "UDP"}


class InlineTeardown(SocketTeardown):
    """The teardown as it was: run by the syncing thread itself, inside the sync."""

    def __init__(self, destroy: Any) -> None:
        super().__init__(destroy)
        self.run_inline = destroy

    def submit(self, stale: Iterable[Pair], kept: Mapping[Frontend, Iterable[Target]]) -> None:
        pairs = list(stale)
        if not pairs:
            return
        started = time.perf_counter()
        self.stats.destroyed += self.run_inline(pairs)
        self.stats.last_seconds = time.perf_counter() - started
        self.stats.runs += 1


def snapshot() -> tuple[Snapshot, ServicePortName]:
    state = ProxyState(NODE)
    feed(
        state,
        [
            service("dns", VIP, [DNS], namespace="bench"),
            endpoint_slice("dns", [Ep(POD_IP, node=NODE)], [DNS_TARGET], namespace="bench"),
        ],
    )
    snap, _ = state.collect()
    return snap, next(iter(snap.services))


def sleepers(lab: Lab, bpf: BpfLab, count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` idle processes in the cgroup, round-robin over the Pods' namespaces."""
    procs = bpf.cgroup / "cgroup.procs"
    namespaces = [pod.netns for pod in lab.pods.values()]
    out = []
    for i in range(count):
        script = f"echo $$ > {procs} && exec sleep 3600"
        ns = namespaces[i % len(namespaces)]
        out.append(subprocess.Popen(["ip", "netns", "exec", ns, "sh", "-c", script]))
    return out


def one_round(
    lab: Lab,
    bpf: BpfLab,
    backend: EbpfBackend,
    snap: Snapshot,
    name: ServicePortName,
    *,
    sockets: int,
) -> dict[str, float]:
    to_a = snap.endpoints[name]
    to_b = (Endpoint(SPARE_IP, 8080, NODE),)
    backend.sync(replace(snap, endpoints={**snap.endpoints, name: to_a}), {name})
    assert backend.teardown.wait(60)
    holder = subprocess.Popen(
        bpf.command(lab.pods["client"].netns, "udp-hold", VIP, 53, sockets),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=lab_env(),
    )
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "ready"
    # CPU: this thread's, and the process's (the walk runs in threads of its own).
    started, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
    backend.sync(replace(snap, endpoints={**snap.endpoints, name: to_b}), {name})
    sync_s, sync_cpu = time.perf_counter() - started, time.thread_time() - cpu
    sync_process = time.process_time() - process
    assert backend.teardown.wait(60)
    done_s, done_process = time.perf_counter() - started, time.process_time() - process
    out, _ = holder.communicate("", timeout=60)
    held = json.loads(out)
    inline = isinstance(backend.teardown, InlineTeardown)
    return {
        "map_us": backend.map_seconds * 1e6,
        "sync_ms": sync_s * 1e3,
        # Inline, the walk's CPU is the sync's (its thread waits for the walk's thread).
        "sync_cpu_ms": (sync_process if inline else sync_cpu) * 1e3,
        "teardown_ms": backend.teardown.stats.last_seconds * 1e3,
        "teardown_cpu_ms": (done_process - sync_cpu) * 1e3,
        "until_destroyed_ms": done_s * 1e3,
        "process_cpu_ms": done_process * 1e3,
        "aborted": held["aborted"],
    }


def table(results: dict[str, list[dict[str, float]]]) -> str:
    lines = [
        "| teardown | map write | whole partial sync (wall / CPU) | teardown (wall / CPU) "
        "| sync start to sockets destroyed (wall / process CPU) | sockets destroyed |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for variant, runs in results.items():

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        lines.append(
            f"| {variant} | {med('map_us'):.0f} µs "
            f"| {med('sync_ms'):.1f} / {med('sync_cpu_ms'):.1f} ms "
            f"| {med('teardown_ms'):.1f} / {med('teardown_cpu_ms'):.1f} ms "
            f"| {med('until_destroyed_ms'):.1f} / {med('process_cpu_ms'):.1f} ms "
            f"| {min(r['aborted'] for r in runs):.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    prefix = f"kpbt{os.getpid() % 100000}"
    results: dict[str, list[dict[str, float]]] = {"inline": [], "worker": []}
    with Lab(prefix, mode="ebpf") as lab, BpfLab(f"{prefix}-cg") as bpf:
        lab.add_pod("a", NODE, [POD_IP])
        lab.add_pod("b", NODE, [SPARE_IP])
        lab.add_pod("client", NODE, [CLIENT_IP])
        idle = sleepers(lab, bpf, args.processes)
        backend = lab_backend(lab, bpf)
        worker = backend.teardown
        try:
            snap, name = snapshot()
            backend.sync(snap, None)
            for i in range(args.rounds):
                variant = "inline" if i % 2 == 0 else "worker"
                backend.teardown = (
                    InlineTeardown(backend.destroy_stale) if variant == "inline" else worker
                )
                result = one_round(lab, bpf, backend, snap, name, sockets=args.sockets)
                results[variant].append(result)
                sys.stderr.write(json.dumps({"variant": variant, **result}) + "\n")
        finally:
            backend.teardown = worker
            backend.stop()
            for proc in idle:
                proc.kill()
                proc.wait()
            cleanup(bpf.pin_path)
    print(table(results))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
