"""Raw IPVS in a lab namespace, over netlink (pyroute2): for tests and benchmarks that run
in a real IPVS kernel (the user-mode-linux guest of :mod:`kubeproxy.lab.uml`).

* :func:`add_vip` — the ``kube-ipvs0`` dummy interface holding a virtual IP (left down,
  as upstream's ipvs mode keeps it).
* :func:`virtual_server` / :func:`nat_real_server` — pyroute2 records with the fields
  that matter spelled out: a real server is NAT (masquerading) only with
  ``fwd_method=0``; pyroute2's default is direct routing.
* :func:`table` — what the namespace's IPVS table holds, read back over netlink with each
  real server's true forwarding method (``IPVSDest.from_message`` reports its default
  instead).

Every namespace has its own IPVS table, so tests isolate by namespace. To change a
virtual server use ``service("set", ...)``: pyroute2's ``"update"`` deletes it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPVS, IPVSDest, IPVSService

from kubeproxy.lab.netns import ns_exec

KUBE_IPVS0 = "kube-ipvs0"
# IP_VS_CONN_F_MASQ / _DROUTE: the forwarding methods of a real server.
FWD_MASQ = 0
FWD_DROUTE = 3
PROTOCOLS = {"TCP": socket.IPPROTO_TCP, "UDP": socket.IPPROTO_UDP, "SCTP": socket.IPPROTO_SCTP}
_PROTOCOL_NAMES = {number: name for name, number in PROTOCOLS.items()}


@dataclass(frozen=True, order=True)
class RealServer:
    ip: str
    port: int
    weight: int
    fwd_method: int


@dataclass(frozen=True, order=True)
class VirtualServer:
    ip: str
    port: int
    protocol: str
    scheduler: str


def add_vip(ns: str, ip: str) -> None:
    """Put ``ip`` on the namespace's ``kube-ipvs0`` dummy (created once, left down)."""
    if KUBE_IPVS0 not in ns_exec(ns, "ip", "-o", "link", "show", check=False):
        ns_exec(ns, "ip", "link", "add", KUBE_IPVS0, "type", "dummy")
    bits = 128 if ":" in ip else 32
    ns_exec(ns, "ip", "addr", "add", f"{ip}/{bits}", "dev", KUBE_IPVS0)


def ipvs_in(ns: str) -> IPVS:
    """An IPVS netlink socket in network namespace ``ns`` (close it, or use ``with``)."""
    return IPVS(netns=ns)


def virtual_server(ip: str, port: int, protocol: str = "TCP", scheduler: str = "rr") -> Any:
    return IPVSService(
        addr=ip, port=port, protocol=PROTOCOLS[protocol], sched_name=scheduler, timeout=0
    )


def nat_real_server(ip: str, port: int, weight: int = 1) -> Any:
    return IPVSDest(addr=ip, port=port, weight=weight, fwd_method=FWD_MASQ)


def table(ipvs: IPVS) -> dict[VirtualServer, list[RealServer]]:
    """Every virtual server of the socket's namespace and its real servers, sorted."""
    result: dict[VirtualServer, list[RealServer]] = {}
    for message in ipvs.service("dump"):
        service = IPVSService.from_message(message)
        attrs = message.get("IPVS_CMD_ATTR_SERVICE")
        key = VirtualServer(
            ip=attrs.get("IPVS_SVC_ATTR_ADDR"),
            port=attrs.get("IPVS_SVC_ATTR_PORT"),
            protocol=_PROTOCOL_NAMES.get(attrs.get("IPVS_SVC_ATTR_PROTOCOL"), "?"),
            scheduler=attrs.get("IPVS_SVC_ATTR_SCHED_NAME"),
        )
        dests = []
        for dest_message in ipvs.dest("dump", service=service):
            dest = dest_message.get("IPVS_CMD_ATTR_DEST")
            dests.append(
                RealServer(
                    ip=dest.get("IPVS_DEST_ATTR_ADDR"),
                    port=dest.get("IPVS_DEST_ATTR_PORT"),
                    weight=dest.get("IPVS_DEST_ATTR_WEIGHT"),
                    fwd_method=dest.get("IPVS_DEST_ATTR_FWD_METHOD") & 0x7,
                )
            )
        result[key] = sorted(dests)
    return result
