"""One ServicePort's plan as the HNS load balancers kernelspace mode wants (pure).

Upstream's winkernel proxier (``pkg/proxy/winkernel/proxier.go`` ``syncProxyRules``)
decides, per ServicePort and family, which load balancers exist and with which flags;
this module makes the same decisions from the shared plan, touching nothing. Which
endpoints each load balancer uses is the plan's (:class:`~kubeproxy.model.plan.Route`):
internal traffic for the ClusterIP, external traffic for the others; nothing here
re-decides readiness, topology, traffic policies or the serving-terminating fallback.

Per ServicePort (each only when it has endpoints, as upstream):

* the ClusterIP load balancer: DSR with ``enableDSR``;
* the NodePort load balancer, without a frontend VIP: VipExternalIP and LocalRoutedVIP;
* one per external IP: VipExternalIP;
* one per load-balancer ingress IP: VipExternalIP; with ``preserve-destination``
  PreserveDIP and UseMux (and DSR);
* with ``forwardHealthCheckVip`` and a root HNS endpoint: per ingress IP, a load
  balancer of the health-check node port to the root endpoint.

DSR on the external ones when ``enableDSR`` and ``externalTrafficPolicy: Local``
(upstream's ``localTrafficDSR``); the IPv6 flag in the IPv6 family; distribution
SourceIP for ClientIP affinity; the internal port is the first endpoint's port (HNS
takes one per load balancer, as upstream). ``preserve-destination`` keeps the NodePort
and ingress load balancers to this node's endpoints, as upstream does.

The source VIP on an Overlay network is the configured one, except when an endpoint is
outside every remote subnet (a public IP) or is a remote node's own address: then the
node IP, as upstream. A remote endpoint's provider address is that of the remote subnet
holding its IP (the node IP when none does); an L2Bridge network has no provider
addresses.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.hns.schema import (
    PROTOCOLS,
    Distribution,
    LoadBalancerFlags,
    Network,
    PortMappingFlags,
)
from kubeproxy.dataplane.hns.schema import (
    Endpoint as HnsEndpoint,
)
from kubeproxy.model.plan import FamilyPlan, FrontendKind, ServicePortPlan
from kubeproxy.model.types import Endpoint, IPFamily, family_of

# Kinds of load balancer, as logs and render name them.
HEALTH_CHECK = "HealthCheck"


@dataclass(frozen=True, slots=True)
class NodeContext:
    """What the translation needs of the node besides the plan (per family)."""

    network: Network
    node_name: str
    node_ip: str  # this node's address of the family ("" when unknown)
    source_vip: str  # the configured one, if of this family
    enable_dsr: bool = False
    # The root namespace's HNS endpoint IP, with forwardHealthCheckVip; and the port of
    # health checks when a Service has no healthCheckNodePort (the healthz port).
    health_check_ip: str | None = None
    healthz_port: int = 10256
    host_mac: str = ""  # the MAC of the node's vNIC ("" when unknown)


def node_context(
    config: ProxyConfig,
    fam: FamilyPlan,
    network: Network,
    root: HnsEndpoint | None,
    host_mac: str = "",
) -> NodeContext:
    """The node's side of ``fam``'s translation: the sync's and ``explain``'s alike.
    ``root``: the network's endpoint named ``--root-hnsendpoint-name`` (if any)."""
    win = config.winkernel
    node_ip = fam.node_ip or ""
    if not node_ip and network.management_ip and family_of(network.management_ip) is fam.family:
        node_ip = network.management_ip
    svip = win.source_vip if win.source_vip and family_of(win.source_vip) is fam.family else ""
    gateway = None
    if win.forward_health_check_vip and root is not None:
        gateway = next((ip for ip in root.ip_addresses if family_of(ip) is fam.family), None)
    return NodeContext(
        network=network,
        node_name=fam.node.name,
        node_ip=node_ip,
        source_vip=svip or node_ip,
        enable_dsr=win.enable_dsr,
        health_check_ip=gateway,
        healthz_port=_port_of(config.healthz_bind_address),
        host_mac=host_mac,
    )


def _port_of(host_port: str, default: int = 10256) -> int:
    _, sep, port = host_port.rpartition(":")
    return int(port) if sep and port.isdigit() else default


@dataclass(frozen=True, slots=True)
class WantedEndpoint:
    """An endpoint a load balancer uses: this node's (the CNI made it), or a remote one
    kube-proxy creates (``provider_address`` on an Overlay network)."""

    ip: str
    local: bool
    provider_address: str = ""
    mac: str = ""  # "": made from the IP (upstream's conjureMac) on an Overlay network


@dataclass(frozen=True, slots=True)
class WantedLoadBalancer:
    kind: str
    vip: str  # "" for the NodePort load balancer
    protocol: int
    internal_port: int
    external_port: int
    endpoints: tuple[WantedEndpoint, ...]
    source_vip: str
    flags: LoadBalancerFlags = LoadBalancerFlags.NONE
    port_flags: PortMappingFlags = PortMappingFlags.NONE
    distribution: Distribution = Distribution.NONE

    @property
    def key(self) -> tuple[str, int, int]:
        """What HNS keeps unique: frontend VIP, protocol, external port."""
        return (self.vip, self.protocol, self.external_port)

    def __str__(self) -> str:
        return f"{self.kind} {self.vip or '(node ports)'}:{self.external_port}"


def provider_address(network: Network, ip: str) -> str:
    """The provider address of the remote subnet holding ``ip`` ("" if none does)."""
    addr = ipaddress.ip_address(ip)
    for subnet in network.remote_subnets:
        net = ipaddress.ip_network(subnet.destination_prefix, strict=False)
        if addr.version == net.version and addr in net:
            return subnet.provider_address
    return ""


def _wanted(ep: Endpoint, ctx: NodeContext) -> WantedEndpoint:
    if ep.is_local(ctx.node_name):
        return WantedEndpoint(ep.ip, local=True)
    if not ctx.network.is_overlay:
        return WantedEndpoint(ep.ip, local=False)
    # As upstream: outside every remote subnet is a public IP, reached through this node.
    return WantedEndpoint(ep.ip, False, provider_address(ctx.network, ep.ip) or ctx.node_ip)


def service_vip_endpoint(plan: ServicePortPlan, ctx: NodeContext) -> WantedEndpoint | None:
    """Overlay: the remote endpoint upstream makes for each ClusterIP (provider address
    the node IP, the host's MAC), so that the VIP resolves on the overlay."""
    if not ctx.network.is_overlay:
        return None
    return WantedEndpoint(plan.cluster_ip, False, ctx.node_ip, ctx.host_mac)


def source_vip(plan: ServicePortPlan, ctx: NodeContext) -> str:
    if not ctx.network.is_overlay:
        return ctx.source_vip
    routes = [plan.internal, *([plan.external] if plan.external is not None else [])]
    for route in routes:
        for ep in route.endpoints:
            if ep.is_local(ctx.node_name):
                continue
            pa = provider_address(ctx.network, ep.ip)
            if not pa or pa == ep.ip:  # a public IP, or a remote node's own address
                return ctx.node_ip
    return ctx.source_vip


def translate(plan: ServicePortPlan, ctx: NodeContext) -> list[WantedLoadBalancer]:
    """The load balancers ``plan`` wants, in a stable order."""
    svc = plan.service_port
    protocol = PROTOCOLS[svc.protocol.value]
    v6 = LoadBalancerFlags.IPV6 if plan.family is IPFamily.IPv6 else LoadBalancerFlags.NONE
    dsr = LoadBalancerFlags.DSR
    none = LoadBalancerFlags.NONE
    affinity = Distribution.SOURCE_IP if svc.affinity_timeout is not None else Distribution.NONE
    svip = source_vip(plan, ctx)
    local_dsr = ctx.enable_dsr and svc.external_policy_local
    preserve = svc.preserve_destination
    out: list[WantedLoadBalancer] = []

    def add(
        kind: str,
        vip: str,
        port: int,
        endpoints: Sequence[Endpoint],
        *,
        flags: LoadBalancerFlags,
        port_flags: PortMappingFlags,
    ) -> None:
        wanted = tuple(sorted({_wanted(ep, ctx) for ep in endpoints}, key=_by_ip))
        if not wanted:
            return  # as upstream: no load balancer without endpoints
        internal = endpoints[0].port
        out.append(
            WantedLoadBalancer(
                kind, vip, protocol, internal, port, wanted, svip, flags | v6, port_flags, affinity
            )
        )

    add(
        FrontendKind.CLUSTER_IP.value,
        plan.cluster_ip,
        svc.port,
        plan.internal.endpoints,
        flags=dsr if ctx.enable_dsr else none,
        port_flags=PortMappingFlags.NONE,
    )
    external = plan.external.endpoints if plan.external is not None else ()
    # preserve-destination: NodePort and ingress deliver to this node's endpoints only.
    kept = tuple(ep for ep in external if ep.is_local(ctx.node_name)) if preserve else external
    vip_external = PortMappingFlags.VIP_EXTERNAL_IP
    external_dsr = dsr if local_dsr else none
    for frontend in plan.external_frontends:
        ip = frontend.ip or ""
        if frontend.kind is FrontendKind.NODE_PORT:
            routed = vip_external | PortMappingFlags.LOCAL_ROUTED_VIP
            add("NodePort", "", frontend.port, kept, flags=external_dsr, port_flags=routed)
        elif frontend.kind is FrontendKind.EXTERNAL_IP:
            add(
                "ExternalIP",
                ip,
                frontend.port,
                external,
                flags=external_dsr,
                port_flags=vip_external,
            )
        else:
            flags = dsr if local_dsr or preserve else none
            port_flags = vip_external | _preserved(preserve)
            add("LoadBalancer", ip, frontend.port, kept, flags=flags, port_flags=port_flags)
            out.extend(_health_check(plan, ctx, ip, svip, preserve))
    return out


def _health_check(
    plan: ServicePortPlan, ctx: NodeContext, vip: str, svip: str, preserve: bool
) -> list[WantedLoadBalancer]:
    """Upstream's health-check load balancer of an ingress IP (forwardHealthCheckVip):
    the Service's protocol, to the root endpoint, while the Service has an endpoint to
    use (upstream: not all terminating or not serving). The IPv6 flag in the IPv6 family
    (upstream sets none; the fake, stricter, refuses an IPv6 VIP without it)."""
    gateway = ctx.health_check_ip
    if gateway is None or family_of(gateway) is not plan.family:
        return []
    if not (plan.selection.cluster or plan.selection.local):
        return []
    port = plan.service_port.health_check_node_port or ctx.healthz_port
    v6 = LoadBalancerFlags.IPV6 if plan.family is IPFamily.IPv6 else LoadBalancerFlags.NONE
    return [
        WantedLoadBalancer(
            HEALTH_CHECK,
            vip,
            PROTOCOLS[plan.service_port.protocol.value],
            port,
            port,
            (WantedEndpoint(gateway, local=True),),
            svip,
            v6,
            _preserved(preserve),
        )
    ]


def _preserved(preserve: bool) -> PortMappingFlags:
    """``preserve-destination``: deliver with the VIP as destination, through the MUX."""
    if not preserve:
        return PortMappingFlags.NONE
    return PortMappingFlags.PRESERVE_DIP | PortMappingFlags.USE_MUX


def _by_ip(ep: WantedEndpoint) -> tuple[int, int]:
    addr = ipaddress.ip_address(ep.ip)
    return (addr.version, int(addr))
