"""The per-node service plan: what every data plane programs, and what ``explain`` prints.

Pure functions of their inputs (configuration, this node's state, the ServiceCIDR objects,
one ServicePort and its endpoints); no clock, no I/O, no global feature gates. Two levels:

* :class:`FamilyPlan` (:func:`plan_family`) — everything node-level about one IP family:
  who this node is (name, zone, primary IP), which addresses accept NodePorts, how traffic
  from a local Pod is recognised (``--detect-local-mode``), masquerading settings and the
  service IP ranges. CIDR lists are merged here (``ipaddress.collapse_addresses``), so no
  backend ever receives overlapping ranges (an interval set would refuse them).
* :class:`ServicePortPlan` (:func:`plan_service_port`) — one ServicePort in one family:
  its frontends (ClusterIP, external IPs, load-balancer IPs with their per-family
  ``loadBalancerSourceRanges``, the NodePort), the endpoint selection
  (:func:`~kubeproxy.model.topology.categorize_endpoints`), and for internal and external
  traffic a :class:`Route`: the endpoints, DNAT or why DROP/REJECT, and the masquerade
  decision; plus the endpoints that can hairpin.

A backend only translates plans into its data plane (nftables maps, iptables chains, IPVS
virtual servers, BPF maps); :func:`describe` turns one into plain data for
``render --format json`` and ``explain``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kubeproxy.model.nodeports import FamilyNodePorts, NodePortAddresses
from kubeproxy.model.topology import (
    EndpointSelection,
    FeatureFlags,
    NodeTopology,
    categorize_endpoints,
)
from kubeproxy.model.types import (
    Endpoint,
    IPFamily,
    ServicePort,
    ServicePortName,
    TrafficPolicy,
    family_of,
)

DEFAULT_MASQUERADE_MARK = 0x4000


def merge_cidrs(cidrs: Iterable[str]) -> tuple[str, ...]:
    """Sorted, non-overlapping CIDRs covering exactly the given ones (one family)."""
    nets = [ipaddress.ip_network(c, strict=False) for c in cidrs]
    if not nets:
        return ()
    return tuple(str(n) for n in ipaddress.collapse_addresses(nets))  # type: ignore[type-var]


def _of_family(cidrs: Iterable[str], family: IPFamily) -> list[str]:
    return [c for c in cidrs if family_of(c) is family]


# ------------------------------------------------------------------ local traffic


class LocalMode(StrEnum):
    """``--detect-local-mode``: how traffic from this cluster's Pods is recognised."""

    CLUSTER_CIDR = "ClusterCIDR"
    NODE_CIDR = "NodeCIDR"
    BRIDGE_INTERFACE = "BridgeInterface"
    INTERFACE_NAME_PREFIX = "InterfaceNamePrefix"


@dataclass(frozen=True, slots=True)
class DetectLocal:
    """The configured mode and its parameter (as ``detectLocalMode`` / ``detectLocal``)."""

    mode: LocalMode = LocalMode.CLUSTER_CIDR
    bridge_interface: str = ""
    interface_name_prefix: str = ""


@dataclass(frozen=True, slots=True)
class LocalTraffic:
    """How one family's rules tell "from a local Pod" (upstream's LocalTrafficDetector).

    Either the source address is in ``cidrs`` (ClusterCIDR: every Pod of the cluster;
    NodeCIDR: this node's Pods), or the packet came in on ``interface`` (BridgeInterface),
    or on an interface whose name starts with ``interface`` (InterfaceNamePrefix,
    ``prefix=True``). With none of these (no CIDR known for the family), the detector is
    not implemented: ClusterIP traffic is not masqueraded for being off-cluster, and
    ``externalTrafficPolicy: Local`` Services do not short-circuit Pods.
    """

    mode: LocalMode = LocalMode.CLUSTER_CIDR
    cidrs: tuple[str, ...] = ()
    interface: str | None = None
    prefix: bool = False

    @property
    def implemented(self) -> bool:
        return bool(self.cidrs) or self.interface is not None

    def describe(self) -> str:
        if self.cidrs:
            return f"source in {', '.join(self.cidrs)} ({self.mode.value})"
        if self.interface is not None:
            what = "an interface named" if not self.prefix else "an interface whose name starts"
            with_ = "" if not self.prefix else " with"
            return f"arriving on {what}{with_} {self.interface!r} ({self.mode.value})"
        return f"not detectable ({self.mode.value} with nothing configured for this family)"


def local_traffic(
    detect: DetectLocal,
    family: IPFamily,
    cluster_cidrs: Sequence[str],
    node_pod_cidrs: Sequence[str],
) -> LocalTraffic:
    mode = detect.mode
    if mode is LocalMode.CLUSTER_CIDR:
        return LocalTraffic(mode, merge_cidrs(_of_family(cluster_cidrs, family)))
    if mode is LocalMode.NODE_CIDR:
        return LocalTraffic(mode, merge_cidrs(_of_family(node_pod_cidrs, family)))
    if mode is LocalMode.BRIDGE_INTERFACE:
        return LocalTraffic(mode, interface=detect.bridge_interface)
    return LocalTraffic(mode, interface=detect.interface_name_prefix, prefix=True)


# -------------------------------------------------------------------- node level


@dataclass(frozen=True, slots=True)
class FamilyPlan:
    """Everything besides Services and endpoints that shapes one family's rules."""

    family: IPFamily
    node: NodeTopology
    node_ports: FamilyNodePorts
    local: LocalTraffic = field(default_factory=LocalTraffic)
    masquerade_all: bool = False
    masquerade_mark: int = DEFAULT_MASQUERADE_MARK
    flags: FeatureFlags = field(default_factory=FeatureFlags)
    # --service-cluster-ip-range plus ServiceCIDR objects of this family, merged.
    service_cidrs: tuple[str, ...] = ()
    # This node's primary IP of this family (loadBalancerSourceRanges "allow from node").
    node_ip: str | None = None
    # NodePorts also answer on 127.0.0.1 (iptables mode's localhostNodePorts, IPv4 only,
    # and only when the NodePort addresses include loopback).
    localhost_nodeports: bool = False


def plan_family(
    family: IPFamily,
    *,
    node: NodeTopology,
    primary_ip: str | None,
    nodeport_addresses: NodePortAddresses,
    detect_local: DetectLocal = DetectLocal(),
    cluster_cidrs: Sequence[str] = (),
    node_pod_cidrs: Sequence[str] = (),
    service_cidrs: Iterable[str] = (),
    masquerade_all: bool = False,
    masquerade_mark: int = DEFAULT_MASQUERADE_MARK,
    flags: FeatureFlags | None = None,
    localhost_nodeports: bool = False,
) -> FamilyPlan:
    node_ports = nodeport_addresses.for_family(family, primary_ip)
    localhost_nodeports = nodeport_addresses.serves_localhost(family, localhost_nodeports)
    if node_ports.ranges:
        node_ports = FamilyNodePorts(node_ports.match_all, merge_cidrs(node_ports.ranges))
    return FamilyPlan(
        family=family,
        node=node,
        node_ports=node_ports,
        local=local_traffic(detect_local, family, cluster_cidrs, node_pod_cidrs),
        masquerade_all=masquerade_all,
        masquerade_mark=masquerade_mark,
        flags=flags or FeatureFlags(),
        service_cidrs=merge_cidrs(_of_family(service_cidrs, family)),
        node_ip=primary_ip,
        localhost_nodeports=localhost_nodeports,
    )


# ---------------------------------------------------------------- per ServicePort


class FrontendKind(StrEnum):
    CLUSTER_IP = "ClusterIP"
    EXTERNAL_IP = "ExternalIP"
    LOAD_BALANCER = "LoadBalancer"
    NODE_PORT = "NodePort"


@dataclass(frozen=True, slots=True)
class Frontend:
    """One destination a ServicePort captures in one family.

    ``ip`` is None for the NodePort (every NodePort address of the family); ``port`` is
    the Service port, or the node port. ``source_ranges`` (load-balancer IPs only): when
    not empty, only these sources may connect (``loadBalancerSourceRanges`` of this
    family, merged; plus the load-balancer IP itself when a range contains the node's IP,
    as upstream: ``allow_from_node``). ``declared_ranges``: those ranges as the Service
    lists them, unmerged (ipvs mode's ipset holds one member per listed range, as
    upstream's does).
    """

    kind: FrontendKind
    ip: str | None
    port: int
    source_ranges: tuple[str, ...] = ()
    allow_from_node: bool = False
    declared_ranges: tuple[str, ...] = ()

    @property
    def external(self) -> bool:
        return self.kind is not FrontendKind.CLUSTER_IP

    def __str__(self) -> str:
        if self.ip is None:
            return f"*:{self.port}"
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"


class Verdict(StrEnum):
    DNAT = "DNAT"  # to one of the route's endpoints
    DROP = "DROP"  # endpoints exist, but none this traffic may use (Local policy)
    REJECT = "REJECT"  # no usable endpoint anywhere


class Masquerade(StrEnum):
    NEVER = "never"
    ALWAYS = "always"
    # ClusterIP traffic: masquerade unless it comes from a local Pod (upstream's
    # "masquerade off-cluster traffic to a service VIP").
    UNLESS_LOCAL = "unless-from-local-pod"


@dataclass(frozen=True, slots=True)
class Route:
    """Where new connections to a group of frontends go.

    ``short_circuit`` (``externalTrafficPolicy: Local`` only): local Pods and the node
    itself bypass the policy and use these (the cluster-wide) endpoints, as if they had
    gone out to the load balancer and come back; the node's connections are masqueraded
    (their source is a local address). Everyone else gets ``endpoints`` or ``verdict``.

    ``fallback`` (a Local policy with no endpoint on this node only): the cluster-wide
    endpoints a mode that cannot tell the node's own Pods from other clients uses
    instead of ``verdict`` (upstream's ipvs mode, kubernetes#97081: local Pods can still
    reach the Service). The modes with a DROP/REJECT per source ignore it.
    """

    policy: TrafficPolicy
    endpoints: tuple[Endpoint, ...]
    verdict: Verdict
    masquerade: Masquerade
    short_circuit: tuple[Endpoint, ...] = ()
    fallback: tuple[Endpoint, ...] = ()

    @property
    def endpoints_or_fallback(self) -> tuple[Endpoint, ...]:
        return self.endpoints or self.fallback


@dataclass(frozen=True, slots=True)
class ServicePortPlan:
    """One ServicePort in one family, decided for this node."""

    service_port: ServicePort
    family: IPFamily
    frontends: tuple[Frontend, ...]  # the ClusterIP first
    selection: EndpointSelection
    internal: Route
    external: Route | None  # None: no external frontend in this family
    # Endpoint IPs that may connect to themselves through the Service (hairpin).
    hairpin: tuple[str, ...] = ()

    @property
    def name(self) -> ServicePortName:
        return self.service_port.name

    @property
    def cluster_ip(self) -> str:
        ip = self.frontends[0].ip
        assert ip is not None
        return ip

    @property
    def affinity_timeout(self) -> int | None:
        return self.service_port.affinity_timeout

    @property
    def external_frontends(self) -> tuple[Frontend, ...]:
        return self.frontends[1:]

    @property
    def no_local_internal(self) -> bool:
        """Endpoints exist, but none on this node for internalTrafficPolicy Local."""
        return self.internal.verdict is Verdict.DROP

    @property
    def no_local_external(self) -> bool:
        return self.external is not None and self.external.verdict is Verdict.DROP


def plan_service_port(
    svc: ServicePort, endpoints: Iterable[Endpoint], fam: FamilyPlan
) -> ServicePortPlan | None:
    """The plan of ``svc`` in ``fam.family``; None when it has no ClusterIP there."""
    cluster_ip = svc.cluster_ip(fam.family)
    if cluster_ip is None:
        return None
    svc = svc.in_family(fam.family)
    want_v6 = fam.family is IPFamily.IPv6
    family_eps = [ep for ep in endpoints if (":" in ep.ip) is want_v6]
    sel = categorize_endpoints(family_eps, svc, fam.node, fam.flags)
    unreachable = Verdict.DROP if sel.has_any else Verdict.REJECT

    internal_eps = sel.internal(svc)
    if fam.masquerade_all:
        internal_masq = Masquerade.ALWAYS
    elif fam.local.implemented:
        internal_masq = Masquerade.UNLESS_LOCAL
    else:
        internal_masq = Masquerade.NEVER
    internal = Route(
        svc.internal_traffic_policy,
        internal_eps,
        Verdict.DNAT if internal_eps else unreachable,
        internal_masq,
        fallback=_fallback(svc.internal_traffic_policy, internal_eps, sel.cluster),
    )

    frontends = [Frontend(FrontendKind.CLUSTER_IP, cluster_ip, svc.port)]
    if svc.external_ips:  # (tested first: a full sync plans every ServicePort)
        frontends.extend(
            Frontend(FrontendKind.EXTERNAL_IP, ip, svc.port)
            for ip in svc.external_ips_of(fam.family)
        )
    if svc.load_balancer_ips:
        frontends.extend(_load_balancers(svc, fam))
    if svc.node_port and fam.node_ports.enabled:
        frontends.append(Frontend(FrontendKind.NODE_PORT, None, svc.node_port))

    external: Route | None = None
    if len(frontends) > 1:
        if svc.external_policy_local:
            external = Route(
                TrafficPolicy.LOCAL,
                sel.local,
                Verdict.DNAT if sel.local else unreachable,
                Masquerade.NEVER,
                short_circuit=sel.cluster,
                fallback=_fallback(TrafficPolicy.LOCAL, sel.local, sel.cluster),
            )
        else:
            external = Route(
                TrafficPolicy.CLUSTER,
                sel.cluster,
                Verdict.DNAT if sel.cluster else unreachable,
                Masquerade.ALWAYS,
            )

    # Only endpoints on this node (or without a nodeName) can be the client.
    here = fam.node.name
    hairpin = {ep.ip for ep in sel.cluster if ep.node_name is None or ep.node_name == here}
    hairpin.update(ep.ip for ep in sel.local)
    return ServicePortPlan(
        service_port=svc,
        family=fam.family,
        frontends=tuple(frontends),
        selection=sel,
        internal=internal,
        external=external,
        hairpin=tuple(sorted(hairpin)),
    )


def _fallback(
    policy: TrafficPolicy, endpoints: tuple[Endpoint, ...], cluster: tuple[Endpoint, ...]
) -> tuple[Endpoint, ...]:
    return cluster if policy is TrafficPolicy.LOCAL and not endpoints else ()


def _load_balancers(svc: ServicePort, fam: FamilyPlan) -> list[Frontend]:
    ranges = svc.source_ranges_of(fam.family)
    node_in_ranges = fam.node_ip is not None and any(
        ipaddress.ip_address(fam.node_ip) in ipaddress.ip_network(r) for r in ranges
    )
    out = []
    for ip in sorted(set(svc.load_balancer_ips_of(fam.family))):
        allowed: tuple[str, ...] = ()
        if ranges:
            # As upstream: a VIP-style load balancer that is also a local address makes
            # node-to-VIP traffic loop back with the VIP as its source; let it through.
            self_ip = [f"{ip}/{32 if fam.family is IPFamily.IPv4 else 128}"]
            allowed = merge_cidrs([*ranges, *(self_ip if node_in_ranges else ())])
        out.append(
            Frontend(
                FrontendKind.LOAD_BALANCER,
                ip,
                svc.port,
                allowed,
                allow_from_node=bool(ranges) and node_in_ranges,
                declared_ranges=ranges,
            )
        )
    return out


def plan_service_ports(
    services: Mapping[ServicePortName, ServicePort],
    endpoints: Mapping[ServicePortName, Sequence[Endpoint]],
    fam: FamilyPlan,
    names: Iterable[ServicePortName] | None = None,
) -> dict[ServicePortName, ServicePortPlan | None]:
    """Plans of ``names`` (every ServicePort when None); None for those absent or not of
    this family."""
    out: dict[ServicePortName, ServicePortPlan | None] = {}
    for name in services if names is None else names:
        svc = services.get(name)
        out[name] = None if svc is None else plan_service_port(svc, endpoints.get(name, ()), fam)
    return out


# ------------------------------------------------------------------- as plain data


def describe_family(fam: FamilyPlan) -> dict[str, Any]:
    return {
        "family": fam.family.value,
        "node": fam.node.name,
        "zone": fam.node.zone,
        "nodeIP": fam.node_ip,
        "nodePortAddresses": "all" if fam.node_ports.match_all else list(fam.node_ports.ranges),
        "nodePortsEnabled": fam.node_ports.enabled,
        "localTraffic": fam.local.describe(),
        "masqueradeAll": fam.masquerade_all,
        "masqueradeMark": f"{fam.masquerade_mark:#x}",
        "localhostNodePorts": fam.localhost_nodeports,
        "serviceCIDRs": list(fam.service_cidrs),
    }


def _route(route: Route) -> dict[str, Any]:
    n = len(route.endpoints)
    out: dict[str, Any] = {
        "policy": route.policy.value,
        "verdict": route.verdict.value,
        "masquerade": route.masquerade.value,
        "endpoints": [
            {
                "address": str(ep),
                "node": ep.node_name,
                "zone": ep.zone,
                "ready": ep.ready,
                "terminating": ep.terminating,
                "probability": round(1 / n, 6),
            }
            for ep in route.endpoints
        ],
    }
    if route.short_circuit:
        out["localPodsAndNode"] = [str(ep) for ep in route.short_circuit]
    if route.fallback:
        out["fallbackWithoutDrop"] = [str(ep) for ep in route.fallback]
    return out


def describe(plan: ServicePortPlan) -> dict[str, Any]:
    """One ServicePort plan as JSON-ready data."""
    sel = plan.selection
    out: dict[str, Any] = {
        "servicePort": str(plan.name),
        "family": plan.family.value,
        "frontends": [
            {
                "kind": f.kind.value,
                "address": str(f),
                **({"sourceRanges": list(f.source_ranges)} if f.source_ranges else {}),
            }
            for f in plan.frontends
        ],
        "topology": sel.topology_mode.value or None,
        "sessionAffinityTimeout": plan.affinity_timeout,
        "internal": _route(plan.internal),
        "hairpin": list(plan.hairpin),
    }
    if plan.external is not None:
        out["external"] = _route(plan.external)
    return out
