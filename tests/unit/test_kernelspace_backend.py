"""kernelspace mode on the strict HNS fake: which load balancers a sync creates, with
which flags and endpoints, mirroring upstream's pkg/proxy/winkernel/proxier_test.go
cases (named in each test), plus partial syncs, shared remote endpoints and failures.
Nothing here runs on Windows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kubeproxy.backends.base import BackendError
from kubeproxy.backends.kernelspace.endpoints import conjure_mac
from kubeproxy.backends.kernelspace.proxier import MAX_STALE_DELETES, KernelspaceBackend, cleanup
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig, WinkernelSettings
from kubeproxy.dataplane.hns import (
    Distribution,
    Endpoint,
    HnsError,
    HnsErrorKind,
    LoadBalancer,
    LoadBalancerFlags,
    Network,
    NetworkType,
    PortMappingFlags,
    RemoteSubnet,
    SupportedFeatures,
)
from kubeproxy.dataplane.hns.fake import FakeHns
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import Endpoint as PlanEndpoint
from kubeproxy.model.types import (
    IPFamily,
    L4Protocol,
    ServicePort,
    ServicePortName,
    TrafficPolicy,
)
from tests.unit.conftest import port_name

NODE_IP = "192.168.0.11"
SOURCE_VIP = "10.244.0.2"
NODE = NodeState("win-a", None, {IPFamily.IPv4: NODE_IP, IPFamily.IPv6: "fd00:1::11"})
SUBNETS = (
    RemoteSubnet("10.244.2.0/24", "192.168.0.12"),
    RemoteSubnet("10.244.3.0/24", "192.168.0.13"),
)
OVERLAY = Network("vxlan0", "net-1", NetworkType.OVERLAY, NODE_IP, SUBNETS)
L2BRIDGE = Network("cbr0", "net-2", NetworkType.L2BRIDGE, NODE_IP)
ALL = SupportedFeatures(dsr=True, modify_load_balancer=True, ipv6_dual_stack=True)
WEB = port_name("web")
DB = port_name("db")
CLUSTER_IP = "10.96.0.10"
LOCAL_POD = "10.244.1.5"  # a Pod of this node: the CNI made its HNS endpoint
REMOTE_POD = "10.244.2.7"  # in win-b's remote subnet
REMOTE_POD2 = "10.244.3.9"  # in win-c's


def config(**win: Any) -> ProxyConfig:
    settings = WinkernelSettings(network_name="vxlan0", source_vip=SOURCE_VIP)
    return ProxyConfig(
        hostname="win-a",
        mode=ProxyMode.KERNELSPACE,
        families=(IPFamily.IPv4,),
        nodeport_addresses=NodePortAddresses((), primary=False),
        winkernel=replace(settings, **win),
    )


def svc(name: ServicePortName = WEB, **kw: Any) -> ServicePort:
    fields: dict[str, Any] = {"name": name, "cluster_ips": (CLUSTER_IP,), "port": 80}
    fields.update(kw)
    return ServicePort(**fields)


def ep(ip: str, node: str = "win-b", port: int = 8080, **kw: Any) -> PlanEndpoint:
    return PlanEndpoint(ip, port, node, **kw)


def snap(*ports: tuple[ServicePort, tuple[PlanEndpoint, ...]]) -> Snapshot:
    return Snapshot({p.name: p for p, _ in ports}, {p.name: e for p, e in ports}, NODE)


class World:
    """A backend started on a FakeHns holding this node's Pod endpoint."""

    def __init__(
        self,
        network: Network = OVERLAY,
        features: SupportedFeatures = ALL,
        pods: tuple[Endpoint, ...] = (),
        host_mac: str = "",
        **win: Any,
    ) -> None:
        if network is L2BRIDGE:
            win.setdefault("network_name", "cbr0")
        local = Endpoint((LOCAL_POD,), "00-15-5d-00-00-05", id="pod-local")
        self.hns = FakeHns(network, endpoints=[local, *pods], features=features, seed=1)
        self.backend = KernelspaceBackend(
            config(**win), open_hns=lambda: self.hns, host_mac=host_mac
        )
        self.backend.start()

    def sync(self, snapshot: Snapshot, changed: set[ServicePortName] | None = None) -> Any:
        return self.backend.sync(snapshot, changed)

    def lbs(self) -> list[LoadBalancer]:
        return sorted(
            self.hns.list_load_balancers(), key=lambda lb: (lb.vip, one(lb).external_port)
        )

    def lb(self, vip: str, port: int = 80) -> LoadBalancer:
        found = [
            lb for lb in self.lbs() if lb.vip == vip and lb.port_mappings[0].external_port == port
        ]
        assert len(found) == 1, self.lbs()
        return found[0]

    def ips(self, lb: LoadBalancer) -> list[str]:
        by_id = {e.id: e for e in self.hns.list_endpoints()}
        return sorted(by_id[i].ip_address for i in lb.endpoint_ids)

    def remotes(self) -> dict[str, Endpoint]:
        """The remote endpoints of Pods (not those of ClusterIPs)."""
        return {
            e.ip_address: e
            for e in self.hns.list_endpoints()
            if e.is_remote and not e.ip_address.startswith("10.96.")
        }

    def vip_endpoints(self) -> dict[str, Endpoint]:
        """The remote endpoints of ClusterIPs (Overlay)."""
        return {
            e.ip_address: e
            for e in self.hns.list_endpoints()
            if e.is_remote and e.ip_address.startswith("10.96.")
        }

    def writes(self) -> list[str]:
        kinds = ("create_", "modify_", "delete_")
        return [f"{c.operation} {c.detail}" for c in self.hns.log if c.operation.startswith(kinds)]

    def reset_log(self) -> None:
        self.hns.log.clear()


def one(lb: LoadBalancer) -> Any:
    return lb.port_mappings[0]


# ------------------------------------------------------------------ what is created


def test_create_load_balancer() -> None:
    """Upstream TestCreateLoadBalancer: a ClusterIP and a NodePort load balancer, the
    NodePort one without frontend VIP, VipExternalIP and LocalRoutedVIP."""
    w = World()
    w.sync(snap((svc(node_port=30080), (ep(LOCAL_POD, "win-a"), ep(REMOTE_POD)))))
    cluster = w.lb(CLUSTER_IP)
    assert cluster.flags == LoadBalancerFlags.NONE
    assert one(cluster).flags == PortMappingFlags.NONE
    assert (one(cluster).protocol, one(cluster).internal_port) == (6, 8080)
    assert cluster.source_vip == SOURCE_VIP
    assert w.ips(cluster) == [LOCAL_POD, REMOTE_POD]
    node_port = w.lb("", 30080)
    assert (
        one(node_port).flags == PortMappingFlags.VIP_EXTERNAL_IP | PortMappingFlags.LOCAL_ROUTED_VIP
    )
    assert node_port.frontend_vips == ()
    assert w.ips(node_port) == [LOCAL_POD, REMOTE_POD]


def test_no_endpoints_no_load_balancer() -> None:
    """Upstream: "Endpoint information not available for service, not applying any
    policy" — and ClusterIP traffic without an endpoint meets no load balancer."""
    w = World()
    w.sync(snap((svc(node_port=30080, external_ips=("1.2.3.4",)), ())))
    assert w.lbs() == []


def test_external_ips_and_ingress_each_get_one() -> None:
    """Upstream TestCreateLoadBalancer/TestEndpointSlice: one per external IP, one per
    load-balancer ingress IP, all VipExternalIP, same endpoints as the ClusterIP."""
    w = World()
    port = svc(external_ips=("1.2.3.4", "1.2.3.5"), load_balancer_ips=("5.6.7.8",))
    w.sync(snap((port, (ep(REMOTE_POD),))))
    assert {lb.vip for lb in w.lbs()} == {CLUSTER_IP, "1.2.3.4", "1.2.3.5", "5.6.7.8"}
    for vip in ("1.2.3.4", "1.2.3.5", "5.6.7.8"):
        assert one(w.lb(vip)).flags == PortMappingFlags.VIP_EXTERNAL_IP
        assert w.lb(vip).flags == LoadBalancerFlags.NONE
        assert w.ips(w.lb(vip)) == [REMOTE_POD]


def test_create_dsr_load_balancer() -> None:
    """Upstream TestCreateDsrLoadBalancer: with --enable-dsr and externalTrafficPolicy
    Local, the NodePort and ingress load balancers are DSR and use this node's
    endpoints only (the plan's Local route)."""
    w = World(enable_dsr=True)
    port = svc(
        node_port=30080,
        load_balancer_ips=("5.6.7.8",),
        external_traffic_policy=TrafficPolicy.LOCAL,
    )
    w.sync(snap((port, (ep(LOCAL_POD, "win-a"), ep(REMOTE_POD)))))
    for vip, port_no in (("", 30080), ("5.6.7.8", 80)):
        lb = w.lb(vip, port_no)
        assert lb.flags == LoadBalancerFlags.DSR
        assert w.ips(lb) == [LOCAL_POD]


def test_cluster_ip_lb_in_create_dsr_load_balancer() -> None:
    """Upstream TestClusterIPLBInCreateDsrLoadBalancer: with --enable-dsr the ClusterIP
    load balancer is DSR too, and keeps every endpoint (internal traffic is Cluster)."""
    w = World(enable_dsr=True)
    port = svc(node_port=30080, external_traffic_policy=TrafficPolicy.LOCAL)
    w.sync(snap((port, (ep(LOCAL_POD, "win-a"), ep(REMOTE_POD)))))
    cluster = w.lb(CLUSTER_IP)
    assert cluster.flags == LoadBalancerFlags.DSR
    assert w.ips(cluster) == [LOCAL_POD, REMOTE_POD]


def test_dsr_not_applied_to_cluster_traffic_policy() -> None:
    """Upstream TestDsrNotAppliedToClusterTrafficPolicy: --enable-dsr with
    externalTrafficPolicy Cluster leaves the external load balancers without DSR."""
    w = World(enable_dsr=True)
    port = svc(node_port=30080, load_balancer_ips=("5.6.7.8",))
    w.sync(snap((port, (ep(LOCAL_POD, "win-a"), ep(REMOTE_POD)))))
    assert w.lb("", 30080).flags == LoadBalancerFlags.NONE
    assert w.lb("5.6.7.8").flags == LoadBalancerFlags.NONE
    assert w.ips(w.lb("5.6.7.8")) == [LOCAL_POD, REMOTE_POD]


def test_local_policy_without_dsr_follows_the_plan() -> None:
    """externalTrafficPolicy Local without DSR: the plan's Local route (this node's
    endpoints), where upstream's winkernel would spread over every endpoint."""
    w = World()
    port = svc(node_port=30080, external_traffic_policy=TrafficPolicy.LOCAL)
    w.sync(snap((port, (ep(LOCAL_POD, "win-a"), ep(REMOTE_POD)))))
    assert w.lb("", 30080).flags == LoadBalancerFlags.NONE
    assert w.ips(w.lb("", 30080)) == [LOCAL_POD]


def test_internal_traffic_policy_local() -> None:
    """Upstream TestInternalTrafficPolicy... : ITP Local keeps the ClusterIP load
    balancer to this node's endpoints; none there, no load balancer."""
    w = World()
    port = svc(internal_traffic_policy=TrafficPolicy.LOCAL)
    w.sync(snap((port, (ep(LOCAL_POD, "win-a"), ep(REMOTE_POD)))))
    assert w.ips(w.lb(CLUSTER_IP)) == [LOCAL_POD]
    w.sync(snap((port, (ep(REMOTE_POD),))))
    assert w.lbs() == []


def test_preserve_destination() -> None:
    """Upstream's preserve-destination annotation: NodePort and ingress to this node's
    endpoints; the ingress one PreserveDIP, UseMux and DSR."""
    w = World()
    port = svc(node_port=30080, load_balancer_ips=("5.6.7.8",), preserve_destination=True)
    w.sync(snap((port, (ep(LOCAL_POD, "win-a"), ep(REMOTE_POD)))))
    ingress = w.lb("5.6.7.8")
    assert one(ingress).flags == (
        PortMappingFlags.VIP_EXTERNAL_IP | PortMappingFlags.PRESERVE_DIP | PortMappingFlags.USE_MUX
    )
    assert ingress.flags == LoadBalancerFlags.DSR
    assert w.ips(ingress) == [LOCAL_POD]
    assert w.ips(w.lb("", 30080)) == [LOCAL_POD]
    assert w.ips(w.lb(CLUSTER_IP)) == [LOCAL_POD, REMOTE_POD]


def test_session_affinity_client_ip() -> None:
    """Upstream: sessionAffinity ClientIP is DistributionType SourceIP on every one."""
    w = World()
    w.sync(snap((svc(node_port=30080, affinity_timeout=10800), (ep(REMOTE_POD),))))
    assert {one(lb).distribution for lb in w.lbs()} == {Distribution.SOURCE_IP}


def test_internal_port_is_the_endpoint_port() -> None:
    """Upstream: a named targetPort is resolved from the EndpointSlice's port."""
    w = World()
    w.sync(snap((svc(port=443), (ep(REMOTE_POD, port=8443),))))
    lb = w.lb(CLUSTER_IP, 443)
    assert (one(lb).internal_port, one(lb).external_port) == (8443, 443)


def test_udp_and_ipv6() -> None:
    """Upstream: protocol numbers (UDP 17) and the IPv6 flag in the IPv6 family."""
    hns_net = replace(
        OVERLAY, remote_subnets=(*SUBNETS, RemoteSubnet("fd00:2::/64", "192.168.0.12"))
    )
    w = World(network=hns_net, source_vip=SOURCE_VIP)
    w.backend = KernelspaceBackend(
        replace(config(), families=(IPFamily.IPv4, IPFamily.IPv6)), open_hns=lambda: w.hns
    )
    w.backend.start()
    dns = port_name("dns", "dns", protocol=L4Protocol.UDP)
    port = svc(dns, cluster_ips=("10.96.0.53", "fd00:96::53"), port=53)
    w.sync(snap((port, (ep(REMOTE_POD, port=53), ep("fd00:2::7", port=53)))))
    v4, v6 = w.lb("10.96.0.53", 53), w.lb("fd00:96::53", 53)
    assert one(v4).protocol == 17 and v4.flags == LoadBalancerFlags.NONE
    assert v6.flags == LoadBalancerFlags.IPV6
    assert w.ips(v6) == ["fd00:2::7"]
    # The source VIP is IPv4: the IPv6 family uses the node's IPv6 address.
    assert v6.source_vip == "fd00:1::11"


# ------------------------------------------------------------ remote endpoints


def test_remote_endpoints_with_provider_address() -> None:
    """Upstream TestCreateRemoteEndpointOverlay: a remote endpoint per non-local IP, with
    the provider address of the remote subnet holding it and a MAC made from the IP."""
    w = World()
    w.sync(snap((svc(), (ep(REMOTE_POD), ep(REMOTE_POD2)))))
    remotes = w.remotes()
    assert remotes[REMOTE_POD].provider_address == "192.168.0.12"
    assert remotes[REMOTE_POD2].provider_address == "192.168.0.13"
    assert remotes[REMOTE_POD].mac_address == conjure_mac(REMOTE_POD) == "02-11-0a-f4-02-07"


def test_public_ip_endpoint_uses_node_ip() -> None:
    """Upstream: an endpoint outside every remote subnet is "a public IP": its provider
    address and the load balancer's source VIP are the node IP."""
    w = World()
    w.sync(snap((svc(), (ep("172.16.5.5"),))))
    assert w.remotes()["172.16.5.5"].provider_address == NODE_IP
    assert w.lb(CLUSTER_IP).source_vip == NODE_IP


def test_remote_node_ip_endpoint_uses_node_ip_as_source_vip() -> None:
    """Upstream: an endpoint that is a remote node's own address (hostNetwork) makes the
    source VIP the node IP."""
    w = World(
        network=replace(OVERLAY, remote_subnets=(RemoteSubnet("192.168.0.0/24", "192.168.0.12"),))
    )
    w.sync(snap((svc(), (ep("192.168.0.12"),))))
    assert w.lb(CLUSTER_IP).source_vip == NODE_IP


def test_l2bridge_remote_endpoints_without_provider_address() -> None:
    """Upstream TestCreateRemoteEndpointL2Bridge: on L2Bridge a remote endpoint has no
    provider address, and the configured source VIP stays."""
    w = World(network=L2BRIDGE)
    w.sync(snap((svc(), (ep(REMOTE_POD),))))
    assert w.remotes()[REMOTE_POD].provider_address == ""
    assert w.lb(CLUSTER_IP).source_vip == SOURCE_VIP


def test_source_vip_and_cluster_ip_endpoints_on_overlay() -> None:
    """Upstream (Overlay): the source VIP endpoint is made when the network has none,
    and a remote endpoint per ClusterIP with the node IP as provider address, shared by
    the Service's ports and deleted with the last of them."""
    w = World(pods=(), host_mac="00-15-5d-aa-bb-cc")
    http, https = svc(), svc(port_name("web", "https"), port=443)
    w.sync(snap((http, (ep(REMOTE_POD),)), (https, ())))
    source = [e for e in w.hns.list_endpoints() if e.ip_address == SOURCE_VIP]
    assert len(source) == 1 and not source[0].is_remote
    assert source[0].mac_address == "00-15-5d-aa-bb-cc"
    vip = w.vip_endpoints()[CLUSTER_IP]
    assert (vip.provider_address, vip.mac_address) == (NODE_IP, "00-15-5d-aa-bb-cc")
    assert w.backend.book is not None and w.backend.book.refs(CLUSTER_IP) == 2
    w.sync(snap((https, ())), {WEB})
    assert list(w.vip_endpoints()) == [CLUSTER_IP]
    w.sync(snap(), {https.name})
    assert w.vip_endpoints() == {}


def test_l2bridge_has_no_source_vip_or_cluster_ip_endpoints() -> None:
    w = World(network=L2BRIDGE)
    w.sync(snap((svc(), (ep(LOCAL_POD, "win-a"),))))
    assert [e.ip_address for e in w.hns.list_endpoints()] == [LOCAL_POD]


def test_local_endpoint_wins() -> None:
    """Upstream: an HNS endpoint the CNI made for the IP is used, never a new remote one."""
    w = World()
    w.sync(snap((svc(), (ep(LOCAL_POD, "win-a"),))))
    assert w.remotes() == {}
    assert w.lb(CLUSTER_IP).endpoint_ids == ("pod-local",)


def test_missing_local_endpoint_is_skipped_and_retried() -> None:
    """Upstream: "Local endpoint not found: on network" skips the endpoint; the Service
    is programmed with the rest, and completed once the CNI made the endpoint."""
    w = World()
    late = "10.244.1.6"
    snapshot = snap((svc(), (ep(late, "win-a"), ep(REMOTE_POD))))
    result = w.sync(snapshot)
    assert w.ips(w.lb(CLUSTER_IP)) == [REMOTE_POD]
    assert any(late in item for item in result.isolated)
    w.hns.create_endpoint("net-1", Endpoint((late,), id="pod-late"))
    result = w.sync(snapshot, set())
    assert w.ips(w.lb(CLUSTER_IP)) == [late, REMOTE_POD]
    assert result.isolated == []


def test_shared_remote_endpoint_delete() -> None:
    """Upstream TestSharedRemoteEndpointDelete: two Services share a remote endpoint;
    deleting one keeps it (one reference left), deleting both deletes it."""
    w = World()
    web, db = svc(), svc(DB, cluster_ips=("10.96.0.11",))
    w.sync(snap((web, (ep(REMOTE_POD),)), (db, (ep(REMOTE_POD),))))
    assert list(w.remotes()) == [REMOTE_POD]
    assert w.backend.book is not None and w.backend.book.refs(REMOTE_POD) == 2
    w.sync(snap((db, (ep(REMOTE_POD),))), {WEB})
    assert list(w.remotes()) == [REMOTE_POD]
    assert w.backend.book.refs(REMOTE_POD) == 1
    w.sync(snap(), {DB})
    assert w.remotes() == {}
    assert w.lbs() == []


def test_shared_remote_endpoint_update() -> None:
    """Upstream TestSharedRemoteEndpointUpdate: a Service moving to another remote Pod
    releases the shared endpoint without deleting it while another Service uses it."""
    w = World()
    web, db = svc(), svc(DB, cluster_ips=("10.96.0.11",))
    w.sync(snap((web, (ep(REMOTE_POD),)), (db, (ep(REMOTE_POD),))))
    shared = w.remotes()[REMOTE_POD].id
    w.sync(snap((web, (ep(REMOTE_POD2),)), (db, (ep(REMOTE_POD),))), {WEB})
    assert w.remotes()[REMOTE_POD].id == shared
    assert set(w.remotes()) == {REMOTE_POD, REMOTE_POD2}
    assert w.ips(w.lb(CLUSTER_IP)) == [REMOTE_POD2]
    w.sync(snap((web, (ep(REMOTE_POD2),)), (db, (ep(REMOTE_POD2),))), {DB})
    assert set(w.remotes()) == {REMOTE_POD2}
    assert w.backend.book is not None and w.backend.book.refs(REMOTE_POD2) == 2


def test_endpoint_churn_keeps_counts_exact() -> None:
    """Endpoint churn over several Services: after every sync each remote endpoint's
    count is the number of load balancers using it, and none is left unused."""
    w = World()
    names = [port_name(f"s{i}") for i in range(4)]
    pods = [REMOTE_POD, REMOTE_POD2, "10.244.2.8", "10.244.3.10"]
    for step in range(6):
        ports = []
        for i, name in enumerate(names):
            chosen = tuple(ep(pods[(i + step + k) % 4]) for k in range(1 + (i + step) % 3))
            ports.append((svc(name, cluster_ips=(f"10.96.1.{i}",)), chosen))
        w.sync(snap(*ports), None if step == 0 else set(names))
        uses: dict[str, int] = {}
        for lb in w.lbs():
            for ip in w.ips(lb):
                uses[ip] = uses.get(ip, 0) + 1
        assert set(w.remotes()) == set(uses)
        assert w.backend.book is not None
        assert {ip: w.backend.book.refs(ip) for ip in uses} == uses


# ------------------------------------------------------------ updates and partial syncs


def test_noop_endpoint_slice() -> None:
    """Upstream TestNoopEndpointSlice: a sync with nothing changed touches nothing."""
    w = World()
    snapshot = snap((svc(node_port=30080), (ep(REMOTE_POD),)))
    w.sync(snapshot)
    w.reset_log()
    w.sync(snapshot, set())
    w.sync(snapshot, {WEB})
    w.sync(snapshot)  # a full sync of an unchanged plan: nothing written either
    assert w.writes() == []


def test_partial_sync_touches_only_changed_service_ports() -> None:
    """Only the changed ServicePort's load balancers are written."""
    w = World()
    ports: list[tuple[ServicePort, tuple[PlanEndpoint, ...]]] = [
        (svc(port_name(f"s{i}"), cluster_ips=(f"10.96.1.{i}",)), (ep(REMOTE_POD),))
        for i in range(5)
    ]
    w.sync(snap(*ports))
    w.reset_log()
    ports[2] = (ports[2][0], (ep(REMOTE_POD), ep(REMOTE_POD2)))
    w.sync(snap(*ports), {ports[2][0].name})
    writes = w.writes()
    assert writes == [
        "create_endpoint remote 10.244.3.9",
        f"modify_load_balancer {w.lb('10.96.1.2').id} 10.96.1.2 TCP/80->8080",
    ]


def test_update_without_modify_deletes_and_creates() -> None:
    """Upstream: without ModifyLoadbalancer support an update is delete and create."""
    w = World(features=SupportedFeatures(dsr=True))
    w.sync(snap((svc(), (ep(REMOTE_POD),))))
    first = w.lb(CLUSTER_IP).id
    w.reset_log()
    w.sync(snap((svc(), (ep(REMOTE_POD), ep(REMOTE_POD2)))), {WEB})
    ops = [c.operation for c in w.hns.log if c.operation.endswith("load_balancer")]
    assert ops == ["delete_load_balancer", "create_load_balancer"]
    assert w.lb(CLUSTER_IP).id != first
    assert w.ips(w.lb(CLUSTER_IP)) == [REMOTE_POD, REMOTE_POD2]
    assert list(w.remotes()) == [REMOTE_POD, REMOTE_POD2]


def test_update_in_place_keeps_the_id() -> None:
    w = World()
    w.sync(snap((svc(), (ep(REMOTE_POD),))))
    first = w.lb(CLUSTER_IP).id
    w.sync(snap((svc(), (ep(REMOTE_POD2),))), {WEB})
    assert w.lb(CLUSTER_IP).id == first
    assert list(w.remotes()) == [REMOTE_POD2]


def test_removed_frontend_is_deleted() -> None:
    w = World()
    w.sync(snap((svc(external_ips=("1.2.3.4",)), (ep(REMOTE_POD),))))
    w.sync(snap((svc(), (ep(REMOTE_POD),))), {WEB})
    assert [lb.vip for lb in w.lbs()] == [CLUSTER_IP]


def test_frontend_moves_between_service_ports_in_one_sync() -> None:
    """A ClusterIP one ServicePort leaves and another takes in the same sync: the old
    load balancer goes first (HNS refuses a second one with the same frontend)."""
    w = World()
    w.sync(snap((svc(), (ep(REMOTE_POD),))))
    result = w.sync(snap((svc(DB), (ep(REMOTE_POD2),))), {WEB, DB})
    assert result.isolated == []
    assert w.ips(w.lb(CLUSTER_IP)) == [REMOTE_POD2]
    assert list(w.remotes()) == [REMOTE_POD2]


def test_restart_adopts_existing_load_balancers() -> None:
    """A new process (upstream: queriedLoadBalancers) reuses what HNS holds."""
    w = World()
    snapshot = snap((svc(), (ep(LOCAL_POD, "win-a"),)))
    w.sync(snapshot)
    first = w.lb(CLUSTER_IP).id
    again = KernelspaceBackend(config(), open_hns=lambda: w.hns)
    again.start()
    w.reset_log()
    again.sync(snapshot, None)
    assert w.lb(CLUSTER_IP).id == first
    assert [c.operation for c in w.hns.log if c.operation.endswith("load_balancer")] == [
        "modify_load_balancer"
    ]


# ------------------------------------------------------------ failures


def test_failed_create_leaves_the_rest_and_is_retried() -> None:
    """One refused load balancer: the other ServicePorts are programmed, the refused one
    is reported and programmed at the next (partial) sync."""
    w = World()
    ports = [
        (svc(port_name(f"s{i}"), cluster_ips=(f"10.96.1.{i}",)), (ep(REMOTE_POD),))
        for i in range(3)
    ]
    w.hns.fail_next("create_load_balancer")
    result = w.sync(snap(*ports))
    assert len(result.isolated) == 1 and "default/s0" in result.isolated[0]
    assert [lb.vip for lb in w.lbs()] == ["10.96.1.1", "10.96.1.2"]
    result = w.sync(snap(*ports), set())
    assert result.isolated == []
    assert [lb.vip for lb in w.lbs()] == ["10.96.1.0", "10.96.1.1", "10.96.1.2"]
    assert w.backend.book is not None and w.backend.book.refs(REMOTE_POD) == 3


def test_failed_remote_endpoint_create_is_retried() -> None:
    """Upstream: "Remote endpoint creation failed" skips the endpoint; here the
    ServicePort is reported and completed at the next sync (the ClusterIP's endpoint,
    made first, fails too)."""
    w = World()
    w.sync(snap())  # the source VIP endpoint exists
    w.hns.fail_next("create_endpoint", 2)
    snapshot = snap((svc(), (ep(REMOTE_POD), ep(REMOTE_POD2))))
    result = w.sync(snapshot, {WEB})
    assert result.isolated
    assert len(w.ips(w.lb(CLUSTER_IP))) == 1
    assert w.vip_endpoints() == {}
    result = w.sync(snapshot, set())
    assert result.isolated == []
    assert w.ips(w.lb(CLUSTER_IP)) == [REMOTE_POD, REMOTE_POD2]
    assert list(w.vip_endpoints()) == [CLUSTER_IP]


def test_failed_delete_is_retried_bounded() -> None:
    """A delete HNS refuses is retried at the next syncs, at most MAX_STALE_DELETES a
    sync; its remote endpoint stays until the load balancer is gone."""
    w = World()
    n = MAX_STALE_DELETES + 5
    ports = [
        (svc(port_name(f"s{i}"), cluster_ips=(f"10.96.2.{i}",)), (ep(REMOTE_POD),))
        for i in range(n)
    ]
    w.sync(snap(*ports))
    w.hns.fail_next("delete_load_balancer", n)
    w.sync(snap(), {p.name for p, _ in ports})
    assert len(w.lbs()) == n
    assert list(w.remotes()) == [REMOTE_POD]
    w.reset_log()
    w.sync(snap(), set())
    assert len(w.hns.calls("delete_load_balancer")) == MAX_STALE_DELETES
    assert len(w.lbs()) == 5
    w.sync(snap(), set())
    assert w.lbs() == []
    assert w.remotes() == {}


def test_failed_delete_frees_its_frontend_for_a_successor() -> None:
    w = World()
    w.sync(snap((svc(), (ep(REMOTE_POD),))))
    w.hns.fail_next("delete_load_balancer")
    w.sync(snap(), {WEB})
    other = svc(DB, cluster_ips=(CLUSTER_IP,))
    result = w.sync(snap((other, (ep(REMOTE_POD2),))), {DB})
    assert result.isolated == []
    assert w.ips(w.lb(CLUSTER_IP)) == [REMOTE_POD2]


def test_source_vip_endpoint_failure_fails_the_sync() -> None:
    """Upstream: "Source Vip endpoint creation failed" syncs nothing; the retry makes it."""
    w = World()
    w.hns.fail_next("create_endpoint")
    with pytest.raises(HnsError, match="injected failure"):
        w.sync(snap((svc(), (ep(LOCAL_POD, "win-a"),))))
    assert w.lbs() == []
    result = w.sync(snap((svc(), (ep(LOCAL_POD, "win-a"),))), set())
    assert result.full
    assert [lb.vip for lb in w.lbs()] == [CLUSTER_IP]


def test_a_stale_load_balancer_is_not_adopted() -> None:
    """After a failed sync the next is full and adopts what HNS holds, but not a load
    balancer whose delete HNS refused: that one is deleted, and its successor created."""
    w = World(features=SupportedFeatures())
    w.sync(snap((svc(), (ep(REMOTE_POD),))))
    stale = w.lb(CLUSTER_IP).id
    w.hns.fail_next("delete_load_balancer")
    w.sync(snap(), {WEB})
    w.backend._invalidate()  # as after a failed sync: the next is full
    w.hns.fail_next("delete_load_balancer")  # the bounded retry in the next sync's start
    result = w.sync(snap((svc(DB), (ep(REMOTE_POD2),))), set())
    assert result.full and result.isolated == []
    assert w.lb(CLUSTER_IP).id != stale
    assert w.ips(w.lb(CLUSTER_IP)) == [REMOTE_POD2]


def test_hns_gone_fails_the_sync_and_the_next_is_full() -> None:
    w = World()
    snapshot = snap((svc(), (ep(REMOTE_POD),)))
    w.sync(snapshot)
    w.hns.fail_next(
        "get_network_by_name",
        error=HnsError("HNS stopped", kind=HnsErrorKind.FAILED, incomplete=True),
    )
    with pytest.raises(HnsError, match="HNS stopped"):
        w.sync(snapshot, {WEB})
    result = w.sync(snapshot, set())
    assert result.full


# ------------------------------------------------------------ start


@pytest.mark.parametrize(
    ("network", "features", "win", "message"),
    [
        (OVERLAY, ALL, {"source_vip": ""}, "needs --source-vip"),
        (OVERLAY, SupportedFeatures(), {"enable_dsr": True}, "does not support DSR"),
        (OVERLAY, ALL, {"network_name": ""}, "no HNS network named"),
        (OVERLAY, ALL, {"network_name": "other"}, "HNS network 'other'"),
    ],
)
def test_start_refuses(
    network: Network, features: SupportedFeatures, win: dict[str, Any], message: str
) -> None:
    hns = FakeHns(network, features=features)
    backend = KernelspaceBackend(config(**win), open_hns=lambda: hns)
    with pytest.raises(BackendError, match=message):
        backend.start()


def test_cleanup_deletes_every_load_balancer() -> None:
    """Upstream's CleanupLeftovers: every HNS load balancer; a refused delete is raised
    after the others are done."""
    w = World()
    w.sync(
        snap(
            (svc(node_port=30080), (ep(REMOTE_POD),)),
            (svc(DB, cluster_ips=("10.96.0.11",)), (ep(REMOTE_POD),)),
        )
    )
    w.hns.fail_next("delete_load_balancer")
    with pytest.raises(BackendError, match="injected failure"):
        cleanup(w.hns)
    assert len(w.lbs()) == 1
    removed = cleanup(w.hns)
    assert len(removed) == 1 and removed[0].startswith("hns load-balancer ")
    assert w.lbs() == []


def test_off_windows_start_says_windows() -> None:
    from kubeproxy.backends.registry import create_backend

    backend = create_backend(config())
    with pytest.raises(BackendError, match="needs Windows"):
        backend.start()
