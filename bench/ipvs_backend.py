"""``python -m bench.ipvs_backend``: ipvs mode's own syncs, inside the user-mode-linux guest.

Started on the host, it re-runs itself inside the guest (:mod:`kubeproxy.lab.uml`), so
every figure is "inside the UML guest" (1 CPU, HZ=100, process starts ~25x slower than on
the host). For each size (ClusterIP Services x 10 endpoints, TCP) in a fresh network
namespace: the cold full sync of :class:`~kubeproxy.backends.ipvs.proxier.IpvsBackend`
(netlink per virtual/real server, one ``ipset restore``, one ``iptables-legacy-restore``),
a full sync over the programmed state (reads the kernel back, writes nothing), and a
partial sync of one Service whose endpoints all changed. Compare with
``bench.ipvs_floor`` (the raw IPVS programming floor). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from kubeproxy.backends.ipvs.proxier import IpvsBackend, cleanup, sysctls
from kubeproxy.config import ProxyConfig
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
    mode="ipvs",
    families=(IPFamily.IPv4,),
    cluster_cidrs=("10.244.0.0/16",),
    nodeport_addresses=NodePortAddresses((), primary=False),
)


def snapshot(services: int, shift: int = 0, changed: int = -1) -> Snapshot:
    ports, eps = {}, {}
    for i in range(services):
        name = ServicePortName(NamespacedName("default", f"s{i}"), "p", L4Protocol.TCP)
        ports[name] = ServicePort(name=name, cluster_ips=(f"10.96.{i >> 8}.{i & 255}",), port=80)
        base = 1 + (shift if i == changed else 0)
        eps[name] = tuple(
            Endpoint(f"10.{244 + (j % 4)}.{i >> 8}.{(i + base + j) & 255}", 8080, "node-b")
            for j in range(ENDPOINTS)
        )
    return Snapshot(ports, eps, NodeState("node-a", None, {IPFamily.IPv4: "192.168.50.1"}))


def measure(size: int, proc: Path) -> tuple[float, float, float]:
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
        started = time.perf_counter()
        backend.sync(snap, None)
        cold = time.perf_counter() - started
        started = time.perf_counter()
        backend.sync(snap, None)
        again = time.perf_counter() - started
        changed = snapshot(size, shift=100, changed=size // 2)
        name = next(n for i, n in enumerate(changed.services) if i == size // 2)
        started = time.perf_counter()
        backend.sync(changed, {name})
        partial = time.perf_counter() - started
        assert not backend.errors, backend.errors[:3]
        cleanup(ipvs, links, IpsetCommand(ns), [runner])
    finally:
        ipvs.close()
        links.close()
        delete_netns(ns)
    return cold, again, partial


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1000", help="Services, comma-separated")
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
        print("| Services x 10 endpoints | cold full sync | full sync, no change | "
              "one Service's endpoints changed (partial) |")  # fmt: skip
        print("| --- | --- | --- | --- |")
        for size in (int(s) for s in args.sizes.split(",")):
            cold, again, partial = measure(size, proc)
            print(f"| {size:,} | {cold:.2f} s | {again:.2f} s | {partial * 1000:.0f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
