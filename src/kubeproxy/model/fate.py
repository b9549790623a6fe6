"""A packet's fate over the plan, as data: what ``explain`` answers and every proxy
mode's kernel knowledge (:mod:`kubeproxy.backends.inspection`) reads.

:class:`Packet` is a connection's first packet, :class:`NodeAddresses` what is known of
the node's own addresses, :class:`Explanation` the answer: the :class:`Outcome`, the
reasons in the order the rules decide, the ServicePort and frontend matched, and the
endpoints a new connection may reach (:class:`Candidate`) or may not (:class:`Excluded`).
Pure data; the decisions are :mod:`kubeproxy.explain.packet`'s, except the reasons every
mode gives alike for the endpoints the plan chose (:func:`selection_reasons`,
:func:`excluded_endpoints`), which are here so that a mode's own knowledge (ebpf's socket
hooks, :mod:`kubeproxy.backends.ebpf.inspect`) can give them too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from kubeproxy.model.plan import FamilyPlan, Frontend, Route, ServicePortPlan
from kubeproxy.model.topology import TopologyMode
from kubeproxy.model.types import (
    Endpoint,
    IPFamily,
    L4Protocol,
    ServicePortName,
    TrafficPolicy,
    family_of,
)


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
    # (:mod:`kubeproxy.backends.ebpf.inspect`); no packet is DNATed.
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


# ------------------------------------------- why the plan chose its endpoints


def _why_no_hints(used: tuple[Endpoint, ...], fam: FamilyPlan) -> str:
    """Which of topology's safeguards left every endpoint in (see model/topology.py)."""
    ready = [ep for ep in used if ep.ready]
    zone = fam.node.zone
    if not all(ep.zone_hints for ep in ready):
        return "not every ready endpoint has a zone hint (a change is under way)"
    if zone is None:
        return "this node has no topology.kubernetes.io/zone label"
    return f"no endpoint is hinted for zone {zone} (filtering would leave none)"


def selection_reasons(
    plan: ServicePortPlan,
    fam: FamilyPlan,
    route: Route,
    used: tuple[Endpoint, ...],
    *,
    affinity: bool = True,
) -> list[str]:
    """Why these endpoints (``affinity``: also how ``sessionAffinity`` picks, for the
    modes that keep its timeout)."""
    svc = plan.service_port
    sel = plan.selection
    out: list[str] = []
    mode = sel.topology_mode
    uses_cluster_set = route.policy is TrafficPolicy.CLUSTER or used == sel.cluster
    if uses_cluster_set and mode is TopologyMode.PREFER_SAME_ZONE:
        out.append(
            f"topology: every ready endpoint has a zone hint and some name zone "
            f"{fam.node.zone}: only those are used (hints from trafficDistribution or "
            "topology-mode Auto)"
        )
    elif uses_cluster_set and mode is TopologyMode.PREFER_SAME_NODE:
        out.append(
            f"topology: every ready endpoint has a node hint and some name {fam.node.name}: "
            "only those are used (trafficDistribution PreferSameNode)"
        )
    elif uses_cluster_set and used:
        hinted = any(ep.zone_hints or ep.node_hints for ep in used)
        if svc.traffic_distribution or hinted:
            what = (
                f"trafficDistribution {svc.traffic_distribution}"
                if svc.traffic_distribution
                else "the endpoints' hints"
            )
            out.append(f"topology: {what} not applied: {_why_no_hints(used, fam)}")
    if used and all(ep.terminating for ep in used):
        where = (
            "on this node"
            if route.policy is TrafficPolicy.LOCAL and used == sel.local
            else "anywhere"
        )
        out.append(
            f"no ready endpoint {where}: serving terminating endpoints are used (graceful drain)"
        )
    if affinity and svc.affinity_timeout is not None and used:
        out.append(
            f"sessionAffinity ClientIP ({svc.affinity_timeout}s): a client's first "
            "connection picks at random, later ones within the timeout go to the same endpoint"
        )
    return out


def excluded_endpoints(
    plan: ServicePortPlan,
    fam: FamilyPlan,
    family_eps: Sequence[Endpoint],
    used: tuple[Endpoint, ...],
    local_only: bool,
) -> tuple[Excluded, ...]:
    chosen = set(used)
    node = fam.node
    any_ready = any(ep.ready for ep in family_eps)
    out = []
    for ep in family_eps:
        if ep in chosen:
            continue
        if local_only and not ep.is_local(node.name):
            why = f"on {ep.node_name or 'no node'}, not this node (Local traffic policy)"
        elif not ep.ready and not (ep.serving and ep.terminating):
            why = "terminating and not serving" if ep.terminating else "not ready"
        elif not ep.ready:
            why = "terminating (ready endpoints exist)" if any_ready else "terminating"
        elif plan.selection.topology_mode is TopologyMode.PREFER_SAME_ZONE:
            why = f"hinted for zone(s) {', '.join(sorted(ep.zone_hints))}, not {node.zone}"
        elif plan.selection.topology_mode is TopologyMode.PREFER_SAME_NODE:
            why = f"hinted for node(s) {', '.join(sorted(ep.node_hints))}, not {node.name}"
        else:
            why = "not used by this route"
        out.append(Excluded(ep, why))
    return tuple(out)
