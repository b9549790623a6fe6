"""A packet's fate over the plan, as data: what ``explain`` answers and every proxy
mode's kernel knowledge (:mod:`kubeproxy.backends.inspection`) reads.

:class:`Packet` is a connection's first packet, :class:`NodeAddresses` what is known of
the node's own addresses, :class:`Explanation` the answer: the :class:`Outcome`, the
reasons in the order the rules decide, the ServicePort and frontend matched, and the
endpoints a new connection may reach (:class:`Candidate`) or may not (:class:`Excluded`).
Pure data; the decisions are :mod:`kubeproxy.explain.packet`'s.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum

from kubeproxy.model.plan import Frontend, ServicePortPlan
from kubeproxy.model.types import Endpoint, IPFamily, L4Protocol, ServicePortName, family_of


class Origin(StrEnum):
    NODE = "node"
    POD = "pod"
    OUTSIDE = "outside"


class Outcome(StrEnum):
    """What the proxy's rules do with the packet (``NONE``: they do not touch it)."""

    DNAT = "DNAT"
    DROP = "DROP"
    REJECT = "REJECT"
    ACCEPT = "ACCEPT"
    NONE = "NONE"
    # ebpf mode: a socket hook gives the connection its endpoint in connect()/sendmsg()
    # (:mod:`kubeproxy.explain.socket_hooks`); no packet is DNATed.
    SOCKET_LB = "SOCKET-LB"


@dataclass(frozen=True, slots=True)
class Packet:
    """The first packet of a connection. ``src``/``dst`` are canonical IP strings."""

    src: str
    dst: str
    port: int
    protocol: L4Protocol = L4Protocol.TCP
    in_interface: str | None = None

    @property
    def family(self) -> IPFamily:
        return family_of(self.dst)

    def __str__(self) -> str:
        dst = f"[{self.dst}]" if ":" in self.dst else self.dst
        via = f" in on {self.in_interface}" if self.in_interface else ""
        return f"{self.protocol.value} {self.src} -> {dst}:{self.port}{via}"


@dataclass(frozen=True, slots=True)
class NodeAddresses:
    """The addresses this node owns, as far as known.

    ``complete`` is True when they were read from the kernel (``--live``); otherwise only
    the Node object's primary IPs are known, and an address inside ``--nodeport-addresses``
    is assumed to be the node's.
    """

    addresses: frozenset[str] = frozenset()
    complete: bool = False

    def owns(self, ip: str) -> bool:
        return ip in self.addresses or ipaddress.ip_address(ip).is_loopback


@dataclass(frozen=True, slots=True)
class Candidate:
    """A possible DNAT target: chosen with ``probability`` by a new connection."""

    endpoint: Endpoint
    probability: float
    masquerade: bool


@dataclass(frozen=True, slots=True)
class Excluded:
    """An endpoint of the ServicePort (this family) that this packet cannot reach."""

    endpoint: Endpoint
    why: str


@dataclass(frozen=True, slots=True)
class Explanation:
    packet: Packet
    mode: str
    origin: Origin
    verdict: Outcome
    reasons: tuple[str, ...]
    plan: ServicePortPlan | None = None
    frontend: Frontend | None = None
    # "internal" (ClusterIP route), "external", or "short-circuit" (Local policy: a local
    # Pod or the node itself uses the cluster-wide endpoints).
    route: str | None = None
    candidates: tuple[Candidate, ...] = ()
    excluded: tuple[Excluded, ...] = ()
    masquerade: bool = False

    @property
    def service_port(self) -> ServicePortName | None:
        return self.plan.name if self.plan is not None else None

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(str(c.endpoint) for c in self.candidates)
