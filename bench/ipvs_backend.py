"""``python -m bench.ipvs_backend``: ipvs mode's own syncs, inside the user-mode-linux guest.

Started on the host, it re-runs itself inside the guest (:mod:`kubeproxy.lab.uml`), so
every figure is "inside the UML guest" (1 CPU, HZ=100, process starts ~25x slower than on
the host). For each size (ClusterIP Services x 10 endpoints, TCP) in a fresh network
namespace: the cold full sync of :class:`~kubeproxy.backends.ipvs.proxier.IpvsBackend`
(IPVS and the ``kube-ipvs0`` addresses over netlink, batched; one ``ipset restore``, one
``iptables-legacy-restore``), a full sync over the programmed state (reads the kernel
back, writes nothing; ``--no-resync`` leaves it out), a partial sync of one endpoint
replaced in one Service, one of a Service whose endpoints all changed, and one adding a
Service. Each figure is wall-clock, with the CPU time (user +
system of this process and its children: ipset, iptables-restore) beside it, and the
number of netlink ``send`` calls to IPVS. Compare with ``bench.ipvs_floor`` (the raw
IPVS programming floor). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kubeproxy.backends.ipvs.proxier import IpvsBackend, cleanup, sysctls
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.ipset import IpsetCommand
from kubeproxy.dataplane.iptables.runner import IptablesCommand
from kubeproxy.dataplane.ipvs.netlink import NetlinkIpvs, NetlinkLinks
from kubeproxy.lab import uml
from kubeproxy.lab.netns import add_netns, delete_netns
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import (
    Endpoint,
    IPFamily,
    L4Protocol,
    NamespacedName,
    ServicePort,
    ServicePortName,
)

ROOT = Path(__file__).resolve().parents[1]
ENDPOINTS = 10
CONFIG = ProxyConfig(
    hostname="node-a",
    mode=ProxyMode.IPVS,
    families=(IPFamily.IPv4,),
    cluster_cidrs=("10.244.0.0/16",),
    nodeport_addresses=NodePortAddresses((), primary=False),
)


def snapshot(services: int, shift: int = 0, changed: int = -1, count: int = ENDPOINTS) -> Snapshot:
    """``changed``'s first ``count`` endpoints are moved by ``shift`` addresses."""
    ports, eps = {}, {}
    for i in range(services):
        name = ServicePortName(NamespacedName("default", f"s{i}"), "p", L4Protocol.TCP)
        ports[name] = ServicePort(name=name, cluster_ips=(f"10.96.{i >> 8}.{i & 255}",), port=80)
        moved = [shift if i == changed and j < count else 0 for j in range(ENDPOINTS)]
        eps[name] = tuple(
            Endpoint(f"10.{244 + (j % 4)}.{i >> 8}.{(i + 1 + j + moved[j]) & 255}", 8080, "node-b")
            for j in range(ENDPOINTS)
        )
    return Snapshot(ports, eps, NodeState("node-a", None, {IPFamily.IPv4: "192.168.50.1"}))


@dataclass(frozen=True)
class Figure:
    wall: float
    cpu: float
    sends: int

    def cell(self) -> str:
        def seconds(v: float) -> str:
            return f"{v:.2f} s" if v >= 0.1 else f"{v * 1000:.0f} ms"

        return f"{seconds(self.wall)} (CPU {seconds(self.cpu)}, {self.sends} sends)"


def _cpu() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def timed(ipvs: NetlinkIpvs, fn: Callable[[], object]) -> Figure:
    sends, cpu, started = ipvs.batch.sends, _cpu(), time.perf_counter()
    fn()
    return Figure(time.perf_counter() - started, _cpu() - cpu, ipvs.batch.sends - sends)


def measure(size: int, proc: Path, resync: bool = True) -> list[Figure]:
    ns = f"kpbench{size}"
    add_netns(ns)
    ipvs = NetlinkIpvs(ns)
    links = NetlinkLinks(ns)
    runner = IptablesCommand(IPFamily.IPv4, "legacy", netns=ns)
    try:
        backend = IpvsBackend(
            CONFIG,
            open_ipvs=lambda: ipvs,
            links=links,
            ipset=IpsetCommand(ns),
            runners={IPFamily.IPv4: runner},
            proc=proc,
        )
        backend.start()
        snap = snapshot(size)
        figures = [timed(ipvs, lambda: backend.sync(snap, None))]
        if resync:
            figures.append(timed(ipvs, lambda: backend.sync(snap, None)))
        one = snapshot(size, shift=100, changed=size // 2, count=1)
        name = next(n for i, n in enumerate(one.services) if i == size // 2)
        figures.append(timed(ipvs, lambda: backend.sync(one, {name})))
        changed = snapshot(size, shift=100, changed=size // 2)
        figures.append(timed(ipvs, lambda: backend.sync(changed, {name})))
        more = snapshot(size + 1, shift=100, changed=size // 2)
        added = next(n for i, n in enumerate(more.services) if i == size)
        figures.append(timed(ipvs, lambda: backend.sync(more, {added})))
        assert not backend.errors, backend.errors[:3]
        cleanup(ipvs, links, IpsetCommand(ns), [runner])
    finally:
        ipvs.close()
        links.close()
        delete_netns(ns)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1000", help="Services, comma-separated")
    parser.add_argument(
        "--no-resync", action="store_true", help="leave out the full sync with no change"
    )
    args = parser.parse_args(argv)
    if not uml.in_guest():
        command = [sys.executable, "-m", "bench.ipvs_backend", *(argv or sys.argv[1:])]
        try:
            return uml.run(command, cwd=ROOT, timeout=7200)
        except uml.GuestError as err:
            print(f"bench.ipvs_backend: {err}", file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory() as tmp:
        proc = Path(tmp)
        for path, _ in sysctls(CONFIG, (6, 1)):
            (proc / "sys" / path).parent.mkdir(parents=True, exist_ok=True)
            (proc / "sys" / path).write_text("1\n")
        resync = " full sync, no change |" if not args.no_resync else ""
        print(
            f"| Services x 10 endpoints | cold full sync |{resync} one endpoint changed "
            "(partial) | one Service's endpoints changed (partial) | +1 Service (partial) |"
        )
        print("| --- " * (5 if args.no_resync else 6) + "|")
        for size in (int(s) for s in args.sizes.split(",")):
            cells = " | ".join(f.cell() for f in measure(size, proc, not args.no_resync))
            print(f"| {size:,} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
