"""The service plan: node-level decisions per family, and each ServicePort's routes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kubeproxy.backends.nftables.table import Vocabulary, local_match
from kubeproxy.dataplane.nftables.transaction import ScriptError
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.plan import (
    DetectLocal,
    FamilyPlan,
    FrontendKind,
    LocalMode,
    LocalTraffic,
    Masquerade,
    Verdict,
    describe,
    merge_cidrs,
    plan_family,
    plan_service_port,
)
from kubeproxy.model.topology import NodeTopology
from kubeproxy.model.types import IPFamily, ServicePort, TrafficPolicy
from tests.unit.conftest import endpoint, service_port

NODE = NodeTopology("node-a", "zone-a")
V4, V6 = IPFamily.IPv4, IPFamily.IPv6


def family(fam: IPFamily = V4, **kw: object) -> FamilyPlan:
    args: dict[str, object] = {
        "node": NODE,
        "primary_ip": "192.168.50.1" if fam is V4 else "fd00:50::1",
        "nodeport_addresses": NodePortAddresses.parse([]),
        "cluster_cidrs": ("10.244.0.0/16", "fd00:10:244::/56"),
    }
    args.update(kw)
    return plan_family(fam, **args)  # type: ignore[arg-type]


def lb(**kw: object) -> ServicePort:
    return replace(
        service_port(cluster_ips=("10.96.0.10", "fd00:10:96::10"), node_port=30080),
        load_balancer_ips=("198.51.100.1", "2001:db8::1"),
        **kw,  # type: ignore[arg-type]
    )


# ----------------------------------------------------------------- family plans


def test_overlapping_cidrs_are_merged_before_any_backend_sees_them() -> None:
    fam = family(
        service_cidrs=("10.96.0.0/24", "10.96.0.0/28", "fd00:10:96::/112", "10.97.0.0/16"),
        nodeport_addresses=NodePortAddresses.parse(["192.168.50.0/24,192.168.50.1/32"]),
    )
    assert fam.service_cidrs == ("10.96.0.0/24", "10.97.0.0/16")
    assert fam.node_ports.ranges == ("192.168.50.0/24",)
    assert family(V6, service_cidrs=("fd00:10:96::/112",)).service_cidrs == ("fd00:10:96::/112",)
    assert merge_cidrs(["10.0.0.0/25", "10.0.0.128/25"]) == ("10.0.0.0/24",)


@pytest.mark.parametrize(
    ("detect", "pod_cidrs", "fam", "expected"),
    [
        (DetectLocal(), (), V4, LocalTraffic(LocalMode.CLUSTER_CIDR, ("10.244.0.0/16",))),
        (DetectLocal(), (), V6, LocalTraffic(LocalMode.CLUSTER_CIDR, ("fd00:10:244::/56",))),
        (
            DetectLocal(LocalMode.NODE_CIDR),
            ("10.244.1.0/24", "fd00:10:244:1::/64"),
            V4,
            LocalTraffic(LocalMode.NODE_CIDR, ("10.244.1.0/24",)),
        ),
        # No podCIDR of the family on the Node: not detectable (upstream's no-op detector).
        (
            DetectLocal(LocalMode.NODE_CIDR),
            ("10.244.1.0/24",),
            V6,
            LocalTraffic(LocalMode.NODE_CIDR),
        ),
        (
            DetectLocal(LocalMode.BRIDGE_INTERFACE, bridge_interface="cbr0"),
            (),
            V6,
            LocalTraffic(LocalMode.BRIDGE_INTERFACE, interface="cbr0"),
        ),
        (
            DetectLocal(LocalMode.INTERFACE_NAME_PREFIX, interface_name_prefix="veth"),
            (),
            V4,
            LocalTraffic(LocalMode.INTERFACE_NAME_PREFIX, interface="veth", prefix=True),
        ),
    ],
)
def test_detect_local_modes(
    detect: DetectLocal, pod_cidrs: tuple[str, ...], fam: IPFamily, expected: LocalTraffic
) -> None:
    assert family(fam, detect_local=detect, node_pod_cidrs=pod_cidrs).local == expected


def test_local_traffic_as_nft_matches() -> None:
    v4, v6 = Vocabulary.of(V4), Vocabulary.of(V6)
    assert local_match(LocalTraffic(cidrs=("10.0.0.0/8",)), v4) == "ip saddr 10.0.0.0/8"
    assert (
        local_match(LocalTraffic(cidrs=("fd00::/8", "fc00::/8")), v6, negate=True)
        == "ip6 saddr != { fd00::/8, fc00::/8 }"
    )
    assert local_match(LocalTraffic(interface="cbr0"), v4) == 'iifname "cbr0"'
    assert local_match(LocalTraffic(interface="veth", prefix=True), v6, negate=True) == (
        'iifname != "veth*"'
    )
    assert local_match(LocalTraffic(), v4) == ""
    with pytest.raises(ScriptError, match="invalid interface name"):
        local_match(LocalTraffic(interface='x" accept; #'), v4)


# ------------------------------------------------------------------ routes


def test_cluster_ip_route_and_masquerade_decision() -> None:
    svc = service_port()
    eps = [endpoint("10.244.1.2", node="node-a"), endpoint("10.244.2.2", node="node-b")]
    plan = plan_service_port(svc, eps, family())
    assert plan is not None
    assert plan.internal.verdict is Verdict.DNAT
    assert plan.internal.masquerade is Masquerade.UNLESS_LOCAL
    assert plan.external is None and len(plan.frontends) == 1
    assert plan.hairpin == ("10.244.1.2",)
    all_masq = plan_service_port(svc, eps, family(masquerade_all=True))
    assert all_masq is not None and all_masq.internal.masquerade is Masquerade.ALWAYS
    undetectable = plan_service_port(svc, eps, family(cluster_cidrs=()))
    assert undetectable is not None and undetectable.internal.masquerade is Masquerade.NEVER


def test_no_endpoints_reject_and_local_policy_elsewhere_drops() -> None:
    plan = plan_service_port(service_port(node_port=30080), [], family())
    assert plan is not None and plan.internal.verdict is Verdict.REJECT
    assert plan.external is not None and plan.external.verdict is Verdict.REJECT
    remote = [endpoint("10.244.2.2", node="node-b")]
    local_only = plan_service_port(
        service_port(itp=TrafficPolicy.LOCAL, etp=TrafficPolicy.LOCAL, node_port=30080),
        remote,
        family(),
    )
    assert local_only is not None
    assert local_only.internal.verdict is Verdict.DROP and local_only.no_local_internal
    ext = local_only.external
    assert ext is not None and ext.verdict is Verdict.DROP
    # Pods and the node still reach the cluster endpoints.
    assert ext.short_circuit == tuple(remote)
    assert local_only.no_local_external


def test_source_ranges_are_per_family() -> None:
    plan4 = plan_service_port(lb(load_balancer_source_ranges=("172.16.0.0/12",)), [], family())
    plan6 = plan_service_port(lb(load_balancer_source_ranges=("172.16.0.0/12",)), [], family(V6))
    assert plan4 is not None and plan6 is not None
    fw4 = [f for f in plan4.frontends if f.kind is FrontendKind.LOAD_BALANCER]
    fw6 = [f for f in plan6.frontends if f.kind is FrontendKind.LOAD_BALANCER]
    assert [f.source_ranges for f in fw4] == [("172.16.0.0/12",)]
    # No IPv6 range: the IPv6 load-balancer IP is not firewalled at all.
    assert [f.source_ranges for f in fw6] == [()]


def test_a_zero_source_range_allows_everyone_in_its_family() -> None:
    # As upstream's ServicePort (pkg/proxy/serviceport.go): a /0 among a family's ranges
    # means no firewall for that family, not a firewall that lists 0.0.0.0/0.
    ranges = ("10.0.0.0/8", "0.0.0.0/0", "fd00::/8")
    plan4 = plan_service_port(lb(load_balancer_source_ranges=ranges), [], family())
    plan6 = plan_service_port(lb(load_balancer_source_ranges=ranges), [], family(V6))
    assert plan4 is not None and plan6 is not None
    fw4 = [f.source_ranges for f in plan4.frontends if f.kind is FrontendKind.LOAD_BALANCER]
    fw6 = [f.source_ranges for f in plan6.frontends if f.kind is FrontendKind.LOAD_BALANCER]
    assert fw4 == [()]
    assert len(fw6) == 1 and "fd00::/8" in fw6[0]  # the other family keeps its ranges


def test_node_in_a_range_allows_the_lb_ip_itself_without_overlap() -> None:
    ranges = ("198.51.100.0/24", "192.168.0.0/16")
    plan = plan_service_port(lb(load_balancer_source_ranges=ranges), [], family())
    assert plan is not None
    (frontend,) = (f for f in plan.frontends if f.kind is FrontendKind.LOAD_BALANCER)
    # The LB IP (198.51.100.1/32) is inside the first range: merged, not added twice.
    assert frontend.source_ranges == ("192.168.0.0/16", "198.51.100.0/24")
    outside = plan_service_port(
        lb(load_balancer_source_ranges=("10.0.0.0/8", "192.168.0.0/16")), [], family()
    )
    assert outside is not None
    (frontend,) = (f for f in outside.frontends if f.kind is FrontendKind.LOAD_BALANCER)
    assert frontend.source_ranges == ("10.0.0.0/8", "192.168.0.0/16", "198.51.100.1/32")


def test_external_ips_of_the_other_family_do_not_make_a_service_external() -> None:
    # Differential seed 1095 (ipvs): iTP Local, RequireDualStack, an IPv6-only external
    # IP, the endpoint on this node not ready and a ready one elsewhere. Upstream's IPv4
    # ServicePort is not externally accessible, so it has no cluster endpoints and its
    # ipvs fallback has nothing to fall back to: the IPv4 ClusterIP drops.
    svc = service_port(
        cluster_ips=("10.96.0.10", "fd00:10:96::10"),
        external_ips=("2001:db8::7",),
        itp=TrafficPolicy.LOCAL,
    )
    assert svc.in_family(V6) is svc
    assert svc.in_family(V4).external_ips == () and not svc.in_family(V4).externally_accessible
    eps4 = [
        endpoint("10.244.1.2", node="node-a", ready=False),
        endpoint("10.244.2.2", node="node-b"),
    ]
    plan4 = plan_service_port(svc, eps4, family())
    assert plan4 is not None and plan4.external is None
    assert plan4.selection.cluster == ()
    assert plan4.internal.verdict is Verdict.DROP and plan4.internal.fallback == ()
    eps6 = [
        endpoint("fd00:10:244:1::2", node="node-a", ready=False),
        endpoint("fd00:10:244:2::2", node="node-b"),
    ]
    plan6 = plan_service_port(svc, eps6, family(V6))
    assert plan6 is not None and plan6.external is not None
    # In IPv6 the external IP needs the cluster set, so the fallback has it (kubernetes#97081).
    assert plan6.internal.fallback == (eps6[1],)


def test_single_stack_service_has_no_plan_in_the_other_family() -> None:
    assert plan_service_port(service_port(), [], family(V6)) is None


def test_describe_is_plain_data() -> None:
    eps = [endpoint("10.244.1.2", node="node-a"), endpoint("10.244.2.2", node="node-b")]
    plan = plan_service_port(lb(), eps, family())
    assert plan is not None
    data = describe(plan)
    assert data["servicePort"] == "default/web:http/TCP"
    assert [f["address"] for f in data["frontends"]] == [
        "10.96.0.10:80",
        "198.51.100.1:80",
        "*:30080",
    ]
    assert data["internal"]["verdict"] == "DNAT"
    assert [e["probability"] for e in data["external"]["endpoints"]] == [0.5, 0.5]
    assert data["external"]["masquerade"] == "always"
