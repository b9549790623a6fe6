"""kernelspace mode takes every endpoint policy from the plan (serving-terminating
fallback, topology), forwards health checks of load-balancer IPs (forwardHealthCheckVip),
and runs dual stack as one unit per family."""

from __future__ import annotations

from dataclasses import replace

from kubeproxy.backends.kernelspace.endpoints import interface_mac
from kubeproxy.backends.kernelspace.proxier import KernelspaceBackend
from kubeproxy.dataplane.hns import Endpoint, LoadBalancerFlags, PortMappingFlags, RemoteSubnet
from kubeproxy.model.types import IPFamily, L4Protocol
from tests.unit.conftest import port_name
from tests.unit.test_kernelspace_backend import (
    CLUSTER_IP,
    DB,
    LOCAL_POD,
    OVERLAY,
    REMOTE_POD,
    REMOTE_POD2,
    SUBNETS,
    WEB,
    World,
    config,
    ep,
    one,
    snap,
    svc,
)

ROOT = Endpoint(("10.244.1.1",), "00-15-5d-00-00-01", name="cbr0", id="root-ep")


def test_terminating_endpoints_fallback_from_the_plan() -> None:
    """Upstream TestEndpointSlice... (serving-terminating): when every endpoint is
    terminating, the serving ones are used; never the not-serving ones."""
    w = World()
    terminating = ep(REMOTE_POD, ready=False, serving=True, terminating=True)
    gone = ep(REMOTE_POD2, ready=False, serving=False, terminating=True)
    w.sync(snap((svc(), (terminating, gone))))
    assert w.ips(w.lb(CLUSTER_IP)) == [REMOTE_POD]
    w.sync(snap((svc(), (gone,))), {WEB})
    assert w.lbs() == []


def test_ready_endpoints_win_over_terminating_ones() -> None:
    w = World()
    terminating = ep(REMOTE_POD, ready=False, serving=True, terminating=True)
    w.sync(snap((svc(), (terminating, ep(REMOTE_POD2)))))
    assert w.ips(w.lb(CLUSTER_IP)) == [REMOTE_POD2]


def test_topology_hints_from_the_plan() -> None:
    """trafficDistribution PreferClose with zone hints: the plan's choice (this node's
    zone is unknown here: every endpoint, as upstream's topology falls back)."""
    w = World()
    hinted = ep(REMOTE_POD, zone_hints=frozenset({"zone-b"}))
    other = ep(REMOTE_POD2, zone_hints=frozenset({"zone-c"}))
    w.sync(snap((svc(traffic_distribution="PreferClose"), (hinted, other))))
    assert w.ips(w.lb(CLUSTER_IP)) == [REMOTE_POD, REMOTE_POD2]


def test_forward_health_check_vip() -> None:
    """Upstream's forwardHealthCheckVip: per ingress IP, a load balancer of the
    healthCheckNodePort to the root namespace's endpoint (rootHnsEndpointName)."""
    w = World(pods=(ROOT,), forward_health_check_vip=True, root_hns_endpoint_name="cbr0")
    port = svc(load_balancer_ips=("5.6.7.8",), health_check_node_port=32000)
    w.sync(snap((port, (ep(REMOTE_POD),))))
    check = w.lb("5.6.7.8", 32000)
    assert (one(check).protocol, one(check).internal_port) == (6, 32000)
    assert check.endpoint_ids == ("root-ep",)
    assert one(check).flags == PortMappingFlags.NONE
    assert check.flags == LoadBalancerFlags.NONE


def test_forward_health_check_vip_defaults_to_the_healthz_port() -> None:
    w = World(pods=(ROOT,), forward_health_check_vip=True)
    w.sync(snap((svc(load_balancer_ips=("5.6.7.8",)), (ep(REMOTE_POD),))))
    assert w.lb("5.6.7.8", 10256).endpoint_ids == ("root-ep",)


def test_health_check_has_the_services_protocol_and_needs_an_endpoint() -> None:
    w = World(pods=(ROOT,), forward_health_check_vip=True)
    udp = svc(load_balancer_ips=("5.6.7.8",), name=port_name("dns", "dns", L4Protocol.UDP))
    w.sync(snap((udp, (ep(REMOTE_POD),))))
    assert one(w.lb("5.6.7.8", 10256)).protocol == 17
    gone = ep(REMOTE_POD, ready=False, serving=False, terminating=True)
    w.sync(snap((udp, (gone,))), {udp.name})
    assert w.lbs() == []


def test_no_health_check_without_the_root_endpoint_or_the_setting() -> None:
    for w in (World(forward_health_check_vip=True), World(pods=(ROOT,))):
        w.sync(snap((svc(load_balancer_ips=("5.6.7.8",)), (ep(REMOTE_POD),))))
        assert {lb.vip for lb in w.lbs()} == {CLUSTER_IP, "5.6.7.8"}
        assert len(w.lbs()) == 2


def test_dual_stack_is_one_unit_per_family() -> None:
    """Upstream runs two single-stack proxiers: each family holds its own load
    balancers; a change in one family's Service touches only that family."""
    net = replace(OVERLAY, remote_subnets=(*SUBNETS, RemoteSubnet("fd00:2::/64", "192.168.0.12")))
    w = World(network=net)
    w.backend = KernelspaceBackend(
        replace(config(), families=(IPFamily.IPv4, IPFamily.IPv6)), open_hns=lambda: w.hns
    )
    w.backend.start()
    web = svc(cluster_ips=(CLUSTER_IP, "fd00:96::10"))
    v6_only = svc(DB, cluster_ips=("fd00:96::11",))
    eps = (ep(REMOTE_POD), ep("fd00:2::7"))
    w.sync(snap((web, eps), (v6_only, (ep("fd00:2::8"),))))
    assert {lb.vip for lb in w.lbs()} == {CLUSTER_IP, "fd00:96::10", "fd00:96::11"}
    assert w.lb("fd00:96::10").flags == LoadBalancerFlags.IPV6
    w.reset_log()
    w.sync(snap((web, eps), (v6_only, (ep("fd00:2::9"),))), {DB})
    writes = w.writes()
    assert [line.split()[0] for line in writes] == [
        "create_endpoint",
        "modify_load_balancer",
        "delete_endpoint",
    ]
    assert "fd00:96::11" in writes[1] and not any("10." in line for line in writes)


def test_local_pods_endpoint_is_never_deleted() -> None:
    """The CNI's endpoint of a local Pod is used, never counted or deleted."""
    w = World()
    w.sync(snap((svc(), (ep(LOCAL_POD, "win-a"),))))
    w.sync(snap(), {WEB})
    assert LOCAL_POD in {e.ip_address for e in w.hns.list_endpoints()}
    assert all("pod-local" not in c.detail for c in w.hns.calls("delete_endpoint"))


def test_host_mac_found_from_the_node_ip() -> None:
    """Upstream's hostMac (the interface holding the node IP) on the source VIP and
    ClusterIP endpoints of an Overlay network."""
    w = World()
    asked: list[str] = []

    def find(ip: str) -> str:
        asked.append(ip)
        return "00-15-5d-aa-bb-cc" if ip == "192.168.0.11" else ""

    w.backend = KernelspaceBackend(config(), open_hns=lambda: w.hns, find_mac=find)
    w.backend.start()
    w.sync(snap((svc(), (ep(REMOTE_POD),))))
    w.sync(snap((svc(), (ep(REMOTE_POD2),))), {WEB})
    assert asked == ["192.168.0.11"]
    macs = {e.ip_address: e.mac_address for e in w.hns.list_endpoints()}
    assert macs["10.244.0.2"] == macs[CLUSTER_IP] == "00-15-5d-aa-bb-cc"


def test_interface_mac_reads_this_machines_interfaces() -> None:
    assert interface_mac("127.0.0.1") in ("", "00-00-00-00-00-00")
    assert interface_mac("203.0.113.254") == ""
