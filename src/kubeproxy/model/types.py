"""Immutable internal types for the Kubernetes objects kube-proxy consumes.

These mirror the parts of v1 Service, discovery.k8s.io/v1 EndpointSlice and v1 Node that
a service proxy needs, already validated and normalised by :mod:`kubeproxy.model.parse`:

* IP addresses are canonical strings (``ipaddress`` formatting), so backends can write
  them into rule scripts without re-validating and two spellings of one address compare
  equal.
* A Service becomes one :class:`ServicePort` per ``spec.ports`` entry, keyed by
  :class:`ServicePortName` (namespace, name, port name, protocol) as upstream does.
* An EndpointSlice keeps its ports and endpoints; the endpoints change tracker turns
  slices into per-ServicePort :class:`Endpoint` lists.

Nothing here does I/O or reads global state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import NamedTuple


class L4Protocol(StrEnum):
    """A Service port's protocol (the API's ``v1.Protocol``)."""

    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"

    @property
    def nft(self) -> str:
        """The protocol's name in nft syntax (``meta l4proto tcp``)."""
        return self.value.lower()


class IPFamily(StrEnum):
    IPv4 = "IPv4"
    IPv6 = "IPv6"


def family_of(ip: str) -> IPFamily:
    """Family of a canonical IP string (IPv6 addresses always contain a colon)."""
    return IPFamily.IPv6 if ":" in ip else IPFamily.IPv4


# An IPv4 address exactly as ``ipaddress`` prints it (no leading zeros, ASCII digits;
# use with ``fullmatch``): text that matches is already canonical, which lets the common
# case skip ``ipaddress``' cost (most of parsing an EndpointSlice).
PLAIN_IPV4 = re.compile(
    r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
    r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
)


class ServiceType(StrEnum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"
    EXTERNAL_NAME = "ExternalName"


class TrafficPolicy(StrEnum):
    CLUSTER = "Cluster"
    LOCAL = "Local"


# Sentinel ``timeoutSeconds`` when spec.sessionAffinityConfig is absent (3 hours), as the API.
DEFAULT_AFFINITY_TIMEOUT_SECONDS = 10800

# Label and annotation keys with meaning to a service proxy.
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_HEADLESS = "service.kubernetes.io/headless"
LABEL_SERVICE_PROXY_NAME = "service.kubernetes.io/service-proxy-name"
LABEL_ZONE = "topology.kubernetes.io/zone"
ANNOTATION_TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"
TAINT_TO_BE_DELETED = "ToBeDeletedByClusterAutoscaler"


@dataclass(frozen=True, slots=True, order=True)
class NamespacedName:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True, order=True)
class ServicePortName:
    """Identifies one port of one Service: ``namespace/name:port`` plus the protocol.

    TCP, UDP and SCTP on the same port number are different ServicePorts; an unnamed
    port (only allowed when the Service has a single port) has ``port == ""``.
    """

    service: NamespacedName
    port: str
    protocol: L4Protocol

    def __str__(self) -> str:
        base = f"{self.service}:{self.port}" if self.port else str(self.service)
        return f"{base}/{self.protocol.value}"


@dataclass(frozen=True, slots=True)
class ServicePort:
    """Everything the proxy needs about one Service port (upstream's BaseServicePortInfo).

    ``cluster_ips`` holds one address per IP family the Service has. Ingress IPs with
    ``ipMode: Proxy`` are already left out of ``load_balancer_ips``.
    """

    name: ServicePortName
    cluster_ips: tuple[str, ...]
    port: int
    node_port: int = 0
    external_ips: tuple[str, ...] = ()
    load_balancer_ips: tuple[str, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()
    # None: no session affinity; otherwise ClientIP affinity with this timeout.
    affinity_timeout: int | None = None
    external_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    internal_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    health_check_node_port: int = 0
    traffic_distribution: str | None = None
    # The Service's ``preserve-destination: "true"`` annotation (kernelspace mode:
    # NodePort and load-balancer IPs keep the VIP as destination, local endpoints only).
    preserve_destination: bool = False

    @property
    def protocol(self) -> L4Protocol:
        return self.name.protocol

    def cluster_ip(self, family: IPFamily) -> str | None:
        for ip in self.cluster_ips:
            if family_of(ip) is family:
                return ip
        return None

    def external_ips_of(self, family: IPFamily) -> tuple[str, ...]:
        return tuple(ip for ip in self.external_ips if family_of(ip) is family)

    def load_balancer_ips_of(self, family: IPFamily) -> tuple[str, ...]:
        return tuple(ip for ip in self.load_balancer_ips if family_of(ip) is family)

    def source_ranges_of(self, family: IPFamily) -> tuple[str, ...]:
        """``loadBalancerSourceRanges`` of ``family``, as upstream's ServicePort has them:
        none when one of them is a /0, which allows everything (and which ipvs mode's
        ``hash:ip,port,net`` set cannot even hold)."""
        ranges = tuple(c for c in self.load_balancer_source_ranges if family_of(c) is family)
        if any(c.endswith("/0") for c in ranges):
            return ()
        return ranges

    def in_family(self, family: IPFamily) -> ServicePort:
        """This ServicePort as ``family``'s proxier sees it: external and load-balancer
        IPs of the other family left out.

        Upstream builds one ServicePort per family from the IPs of that family, so its
        ``ExternallyAccessible()`` (and what follows from it: whether the cluster
        endpoints are used, whether eTP Local applies) is per family. A dual-stack
        Service with ``internalTrafficPolicy: Local`` and an IPv6-only external IP is
        not externally accessible in IPv4.
        """
        if not self.external_ips and not self.load_balancer_ips:
            return self  # the common case, on the hot path of a full sync
        external_ips = self.external_ips_of(family)
        load_balancer_ips = self.load_balancer_ips_of(family)
        if external_ips == self.external_ips and load_balancer_ips == self.load_balancer_ips:
            return self
        return replace(self, external_ips=external_ips, load_balancer_ips=load_balancer_ips)

    @property
    def externally_accessible(self) -> bool:
        """Reachable from outside the cluster: a NodePort, external IPs or LB ingress IPs
        (of any family: :meth:`in_family` first for one family's answer)."""
        return bool(self.node_port or self.external_ips or self.load_balancer_ips)

    @property
    def external_policy_local(self) -> bool:
        """externalTrafficPolicy Local only matters when the Service is externally reachable."""
        return self.externally_accessible and (self.external_traffic_policy is TrafficPolicy.LOCAL)

    @property
    def internal_policy_local(self) -> bool:
        return self.internal_traffic_policy is TrafficPolicy.LOCAL

    @property
    def uses_cluster_endpoints(self) -> bool:
        # Externally reachable Services need the cluster set even with eTP Local: traffic
        # from pods and from the node itself to an external address is short-circuited
        # to it (as if it had left the cluster and come back through a load balancer).
        return not self.internal_policy_local or self.externally_accessible

    @property
    def uses_local_endpoints(self) -> bool:
        return self.internal_policy_local or self.external_policy_local


@dataclass(frozen=True, slots=True)
class Service:
    """A parsed Service: its identity and its ports (empty when headless/ExternalName)."""

    namespace: str
    name: str
    ports: tuple[ServicePort, ...]

    @property
    def key(self) -> NamespacedName:
        return NamespacedName(self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class EndpointConditions:
    # The API's conventions: nil ready/serving mean true, nil terminating means false.
    ready: bool = True
    serving: bool = True
    terminating: bool = False


class SliceEndpoint(NamedTuple):
    """One ``endpoints[]`` entry of an EndpointSlice (all its addresses are one endpoint).

    A NamedTuple, as :class:`Endpoint`: a cold start parses one per endpoint of the
    cluster (100,000 at 10,000 Services x 10), and a frozen dataclass's ``__init__``
    costs three times as much (1.8 against 0.65 us).
    """

    addresses: tuple[str, ...]
    conditions: EndpointConditions = EndpointConditions()
    node_name: str | None = None
    zone: str | None = None
    zone_hints: frozenset[str] = frozenset()
    node_hints: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class SlicePort:
    name: str
    protocol: L4Protocol
    port: int


@dataclass(frozen=True, slots=True)
class EndpointSlice:
    namespace: str
    name: str
    service_name: str
    address_type: IPFamily
    ports: tuple[SlicePort, ...]
    endpoints: tuple[SliceEndpoint, ...]
    # endpoints.kubernetes.io/last-change-trigger-time, as seconds since the epoch.
    trigger_time: float | None = None
    # What the parser left out of the slice (a port, an endpoint), each with why: the
    # source logs them; the rest of the slice serves.
    skipped: tuple[str, ...] = ()

    @property
    def key(self) -> NamespacedName:
        return NamespacedName(self.namespace, self.name)

    @property
    def service(self) -> NamespacedName:
        return NamespacedName(self.namespace, self.service_name)


class Endpoint(NamedTuple):
    """One backend of one ServicePort, after the slice's port has been resolved.

    A NamedTuple rather than a frozen dataclass: a full resync builds one per endpoint of
    the cluster, and a frozen dataclass's ``__init__`` costs several times as much.
    """

    ip: str
    port: int
    node_name: str | None = None
    zone: str | None = None
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    zone_hints: frozenset[str] = frozenset()
    node_hints: frozenset[str] = frozenset()

    @property
    def family(self) -> IPFamily:
        return family_of(self.ip)

    def is_local(self, node_name: str) -> bool:
        return self.node_name is not None and self.node_name == node_name

    def __str__(self) -> str:
        if ":" in self.ip:
            return f"[{self.ip}]:{self.port}"
        return f"{self.ip}:{self.port}"


@dataclass(frozen=True, slots=True)
class ServiceCIDR:
    """networking.k8s.io/v1 ServiceCIDR: ranges the cluster allocates ClusterIPs from."""

    name: str
    cidrs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeAddress:
    type: str
    address: str


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    labels: tuple[tuple[str, str], ...] = ()
    addresses: tuple[NodeAddress, ...] = ()
    deleting: bool = False
    to_be_deleted_taint: bool = False
    # spec.podCIDRs: this node's Pod ranges (detect-local-mode NodeCIDR).
    pod_cidrs: tuple[str, ...] = ()

    @property
    def zone(self) -> str | None:
        return dict(self.labels).get(LABEL_ZONE)

    def primary_ips(self) -> dict[IPFamily, str]:
        """The node's primary IP per family: first InternalIP, else first ExternalIP.

        This is how upstream picks node IPs from the Node object
        (``GetNodeHostIPs``).
        """
        result: dict[IPFamily, str] = {}
        for kind in ("InternalIP", "ExternalIP"):
            for addr in self.addresses:
                if addr.type == kind:
                    result.setdefault(family_of(addr.address), addr.address)
        return result
