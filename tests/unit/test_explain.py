"""``explain``'s decisions, one table row per decision the rules make.

Each row: the Services and endpoints, the packet (and where it comes from), the proxy
mode and node settings; expected: the verdict, the DNAT targets, masquerading and a
phrase the reasons must contain. The agreement with what the kernel really does is
tests/kernel/test_explain_agrees.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from kubeproxy.explain.packet import explain
from kubeproxy.model.fate import NodeAddresses, Origin, Outcome, Packet
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.plan import DetectLocal, FamilyPlan, LocalMode, plan_family, plan_service_port
from kubeproxy.model.topology import NodeTopology
from kubeproxy.model.types import Endpoint, IPFamily, L4Protocol, ServicePort, TrafficPolicy
from tests.unit.conftest import endpoint, service_port

NODE_IP, CLIENT, POD, REMOTE_POD = "192.168.50.1", "192.168.60.2", "10.244.1.100", "10.244.2.50"
LOCAL = TrafficPolicy.LOCAL
L1 = endpoint("10.244.1.10", node="node-a")
L2 = endpoint("10.244.1.11", node="node-a")
R1 = endpoint("10.244.2.10", node="node-b")
R2 = endpoint("10.244.2.11", node="node-b")


def svc(**kw: Any) -> ServicePort:
    base = service_port(
        cluster_ips=kw.pop("cluster_ips", ("10.96.0.10",)),
        node_port=kw.pop("node_port", 0),
        external_ips=kw.pop("external_ips", ()),
        load_balancer_ips=kw.pop("load_balancer_ips", ()),
        itp=kw.pop("itp", TrafficPolicy.CLUSTER),
        etp=kw.pop("etp", TrafficPolicy.CLUSTER),
    )
    return replace(base, **kw)


def family(family_: IPFamily = IPFamily.IPv4, **kw: Any) -> FamilyPlan:
    args: dict[str, Any] = {
        "node": NodeTopology("node-a", "zone-a"),
        "primary_ip": NODE_IP if family_ is IPFamily.IPv4 else "fd00:50::1",
        "nodeport_addresses": NodePortAddresses.parse(["primary"]),
        "cluster_cidrs": ("10.244.0.0/16", "fd00:10:244::/56"),
    }
    args.update(kw)
    return plan_family(family_, **args)


@dataclass
class Case:
    id: str
    svc: ServicePort
    eps: tuple[Endpoint, ...]
    packet: Packet
    verdict: Outcome
    endpoints: set[str] = field(default_factory=set)
    masquerade: bool = False
    reason: str = ""
    mode: str = "nftables"
    fam: dict[str, Any] = field(default_factory=dict)
    origin: Origin | None = None
    node: NodeAddresses = field(default_factory=lambda: NodeAddresses(frozenset({NODE_IP})))


def tcp(src: str, dst: str, port: int = 80, **kw: Any) -> Packet:
    return Packet(src, dst, port, **kw)


NP = {"node_port": 30080}
CASES = [
    # ------------------------------------------------------------------ ClusterIP
    Case("clusterip-from-pod", svc(), (L1, R1), tcp(POD, "10.96.0.10"), Outcome.DNAT,
         {"10.244.1.10:8080", "10.244.2.10:8080"}, False, "not masqueraded: from a local Pod"),
    Case("clusterip-from-outside-masquerades", svc(), (R1,), tcp(CLIENT, "10.96.0.10"),
         Outcome.DNAT, {"10.244.2.10:8080"}, True, "masqueraded: not from a local Pod"),
    Case("clusterip-from-node-masquerades", svc(), (R1,), tcp(NODE_IP, "10.96.0.10"),
         Outcome.DNAT, {"10.244.2.10:8080"}, True, "from this node"),
    Case("masquerade-all", svc(), (R1,), tcp(POD, "10.96.0.10"), Outcome.DNAT,
         {"10.244.2.10:8080"}, True, "--masquerade-all", fam={"masquerade_all": True}),
    Case("not-ready-is-never-chosen", svc(), (L1, R1._replace(ready=False, serving=False)),
         tcp(POD, "10.96.0.10"), Outcome.DNAT, {"10.244.1.10:8080"}, False, ""),
    Case("only-terminating-serve", svc(),
         (L1._replace(ready=False, terminating=True), R1._replace(ready=False, serving=False,
                                                              terminating=True)),
         tcp(POD, "10.96.0.10"), Outcome.DNAT, {"10.244.1.10:8080"}, False, "graceful drain"),
    Case("no-endpoints-rejects", svc(), (), tcp(POD, "10.96.0.10"), Outcome.REJECT,
         reason="no usable endpoint anywhere"),
    Case("itp-local-local-only", svc(itp=LOCAL), (L1, R1, R2), tcp(POD, "10.96.0.10"),
         Outcome.DNAT, {"10.244.1.10:8080"}, False, "this node's endpoints only"),
    Case("itp-local-no-local-drops", svc(itp=LOCAL), (R1,), tcp(POD, "10.96.0.10"),
         Outcome.DROP, reason="none on this node"),
    Case("hairpin-masquerades", svc(), (L1,), tcp("10.244.1.10", "10.96.0.10"), Outcome.DNAT,
         {"10.244.1.10:8080"}, True, "hairpin"),
    Case("hairpin-iptables", svc(), (L1,), tcp("10.244.1.10", "10.96.0.10"), Outcome.DNAT,
         {"10.244.1.10:8080"}, True, "hairpin", mode="iptables"),
    Case("session-affinity", svc(affinity_timeout=600), (L1, R1), tcp(POD, "10.96.0.10"),
         Outcome.DNAT, {"10.244.1.10:8080", "10.244.2.10:8080"}, False, "ClientIP (600s)"),
    Case("zone-hints", svc(traffic_distribution="PreferClose"),
         (L1._replace(zone_hints=frozenset({"zone-a"})),
          R1._replace(zone_hints=frozenset({"zone-b"}))),
         tcp(POD, "10.96.0.10"), Outcome.DNAT, {"10.244.1.10:8080"}, False, "zone hint"),
    Case("hints-ignored-when-incomplete", svc(traffic_distribution="PreferClose"),
         (L1._replace(zone_hints=frozenset({"zone-a"})), R1), tcp(POD, "10.96.0.10"),
         Outcome.DNAT, {"10.244.1.10:8080", "10.244.2.10:8080"}, False,
         "not every ready endpoint has a zone hint"),
    Case("node-hints", svc(traffic_distribution="PreferSameNode"),
         (L1._replace(zone_hints=frozenset({"zone-a"}), node_hints=frozenset({"node-a"})),
          R1._replace(zone_hints=frozenset({"zone-a"}), node_hints=frozenset({"node-b"}))),
         tcp(POD, "10.96.0.10"), Outcome.DNAT, {"10.244.1.10:8080"}, False, "node hint"),
    Case("hints-for-other-zones", svc(),
         (L1._replace(zone_hints=frozenset({"zone-b"})),
          R1._replace(zone_hints=frozenset({"zone-b"}))),
         tcp(POD, "10.96.0.10"), Outcome.DNAT, {"10.244.1.10:8080", "10.244.2.10:8080"}, False,
         "no endpoint is hinted for zone zone-a"),
    Case("ipv6", svc(cluster_ips=("fd00:10:96::10",)),
         (endpoint("fd00:10:244:1::10", node="node-a"),),
         tcp("fd00:10:244:1::100", "fd00:10:96::10"),
         Outcome.DNAT, {"[fd00:10:244:1::10]:8080"}, False, "",
         fam={"family_": IPFamily.IPv6}),
    # -------------------------------------------------------------- no ServicePort
    Case("unused-port-nftables-rejects", svc(), (L1,), tcp(POD, "10.96.0.10", 81),
         Outcome.REJECT, reason="has no port 81/TCP"),
    Case("unused-port-iptables-untouched", svc(), (L1,), tcp(POD, "10.96.0.10", 81),
         Outcome.NONE, reason="iptables mode", mode="iptables"),
    Case("wrong-protocol-rejects", svc(), (L1,),
         tcp(POD, "10.96.0.10", protocol=L4Protocol.UDP), Outcome.REJECT, reason="80/TCP"),
    Case("unallocated-service-ip-drops", svc(), (L1,), tcp(POD, "10.96.9.9"), Outcome.DROP,
         reason="allocated to nothing", fam={"service_cidrs": ("10.96.0.0/16",)}),
    Case("unallocated-service-ip-iptables", svc(), (L1,), tcp(POD, "10.96.9.9"), Outcome.NONE,
         reason="leaves it alone", mode="iptables", fam={"service_cidrs": ("10.96.0.0/16",)}),
    Case("nothing-there", svc(), (L1,), tcp(POD, "8.8.8.8"), Outcome.NONE,
         reason="no Service has 8.8.8.8:80/TCP"),
    # ------------------------------------------------------------------- NodePorts
    Case("nodeport-cluster-masquerades", svc(**NP), (L1, R1), tcp(CLIENT, NODE_IP, 30080),
         Outcome.DNAT, {"10.244.1.10:8080", "10.244.2.10:8080"}, True, "Cluster policy"),
    Case("nodeport-etp-local-keeps-client", svc(etp=LOCAL, **NP), (L1, R1),
         tcp(CLIENT, NODE_IP, 30080), Outcome.DNAT, {"10.244.1.10:8080"}, False,
         "client's address is kept"),
    Case("nodeport-etp-local-no-local-drops", svc(etp=LOCAL, **NP), (R1,),
         tcp(CLIENT, NODE_IP, 30080), Outcome.DROP, reason="none on this node"),
    Case("nodeport-etp-local-pod-short-circuits", svc(etp=LOCAL, **NP), (R1,),
         tcp(POD, NODE_IP, 30080), Outcome.DNAT, {"10.244.2.10:8080"}, False, "short-circuited"),
    Case("nodeport-etp-local-node-short-circuits", svc(etp=LOCAL, **NP), (R1,),
         tcp(NODE_IP, NODE_IP, 30080), Outcome.DNAT, {"10.244.2.10:8080"}, True,
         "from this node: short-circuited"),
    Case("nodeport-etp-local-node-with-local-endpoints", svc(etp=LOCAL, **NP), (L1, R1),
         tcp(NODE_IP, NODE_IP, 30080), Outcome.DNAT, {"10.244.1.10:8080", "10.244.2.10:8080"},
         True, "from this node: short-circuited"),
    Case("nodeport-no-endpoints-rejects", svc(**NP), (), tcp(CLIENT, NODE_IP, 30080),
         Outcome.REJECT, reason="no usable endpoint"),
    Case("nodeport-not-on-other-address", svc(**NP), (L1,), tcp(CLIENT, "192.168.60.1", 30080),
         Outcome.NONE, reason="is not in --nodeport-addresses"),
    Case("nodeport-in-cidr", svc(**NP), (L1,), tcp(CLIENT, "192.168.60.1", 30080),
         Outcome.DNAT, {"10.244.1.10:8080"}, True, "is in --nodeport-addresses",
         fam={"nodeport_addresses": NodePortAddresses.parse(["192.168.60.0/24"])}),
    Case("nodeport-not-on-localhost-nftables", svc(**NP), (L1,),
         tcp("127.0.0.1", "127.0.0.1", 30080), Outcome.NONE, reason="loopback",
         fam={"nodeport_addresses": NodePortAddresses.parse([])}),
    Case("nodeport-localhost-iptables", svc(**NP), (L1,), tcp("127.0.0.1", "127.0.0.1", 30080),
         Outcome.DNAT, {"10.244.1.10:8080"}, True, "localhost NodePorts", mode="iptables",
         fam={"nodeport_addresses": NodePortAddresses.parse([]), "localhost_nodeports": True}),
    Case("nodeport-unknown-address-offline", svc(**NP), (L1,), tcp(CLIENT, "192.168.70.1", 30080),
         Outcome.NONE, reason="Node object's primary IPs",
         fam={"nodeport_addresses": NodePortAddresses.parse([])}),
    Case("health-check-node-port-iptables", svc(etp=LOCAL, health_check_node_port=32000, **NP),
         (L1,), tcp(CLIENT, NODE_IP, 32000), Outcome.ACCEPT, reason="healthCheckNodePort",
         mode="iptables"),
    # -------------------------------------------------------- external and LB IPs
    Case("external-ip", svc(external_ips=("203.0.113.10",)), (L1, R1),
         tcp(CLIENT, "203.0.113.10"), Outcome.DNAT, {"10.244.1.10:8080", "10.244.2.10:8080"},
         True, "ExternalIP"),
    Case("external-ip-no-endpoints-from-node-iptables", svc(external_ips=("203.0.113.10",)), (),
         tcp(NODE_IP, "203.0.113.10"), Outcome.NONE, reason="OUTPUT", mode="iptables"),
    Case("lb-source-range-blocks", svc(load_balancer_ips=("198.51.100.20",),
                                       load_balancer_source_ranges=("10.244.0.0/16",)),
         (L1,), tcp(CLIENT, "198.51.100.20"), Outcome.DROP, reason="do not include"),
    Case("lb-source-range-allows", svc(load_balancer_ips=("198.51.100.20",),
                                       load_balancer_source_ranges=("192.168.60.0/24",)),
         (L1,), tcp(CLIENT, "198.51.100.20"), Outcome.DNAT, {"10.244.1.10:8080"}, True,
         "is in loadBalancerSourceRanges"),
    Case("lb-source-range-no-endpoints-iptables-rejects",
         svc(load_balancer_ips=("198.51.100.20",), load_balancer_source_ranges=("10.0.0.0/8",)),
         (), tcp(CLIENT, "198.51.100.20"), Outcome.REJECT, mode="iptables"),
    Case("lb-source-range-no-endpoints-nftables-drops",
         svc(load_balancer_ips=("198.51.100.20",), load_balancer_source_ranges=("10.0.0.0/8",)),
         (), tcp(CLIENT, "198.51.100.20"), Outcome.DROP),
    # ---------------------------------------------------------- ipvs mode (upstream's)
    Case("ipvs-clusterip-from-pod", svc(), (L1, R1), tcp(POD, "10.96.0.10"), Outcome.DNAT,
         {"10.244.1.10:8080", "10.244.2.10:8080"}, False, "IPVS rr", mode="ipvs"),
    Case("ipvs-clusterip-from-outside", svc(), (R1,), tcp(CLIENT, "10.96.0.10"), Outcome.DNAT,
         {"10.244.2.10:8080"}, True, "KUBE-CLUSTER-IP", mode="ipvs"),
    Case("ipvs-no-endpoints-refuses", svc(), (), tcp(POD, "10.96.0.10"), Outcome.REJECT,
         reason="no real server", mode="ipvs"),
    Case("ipvs-itp-local-no-local-clusterip-only-refuses", svc(itp=LOCAL), (R1,),
         tcp(POD, "10.96.0.10"), Outcome.REJECT, reason="ClusterIP-only", mode="ipvs"),
    Case("ipvs-itp-local-no-local-falls-back", svc(itp=LOCAL, **NP), (R1,),
         tcp(POD, "10.96.0.10"), Outcome.DNAT, {"10.244.2.10:8080"}, False,
         "kubernetes#97081", mode="ipvs"),
    Case("ipvs-etp-local-nodeport-keeps-client", svc(etp=LOCAL, **NP), (L1, R1),
         tcp(CLIENT, NODE_IP, 30080), Outcome.DNAT, {"10.244.1.10:8080"}, False,
         "KUBE-NODE-PORT-LOCAL", mode="ipvs"),
    Case("ipvs-etp-local-no-local-nodeport-falls-back", svc(etp=LOCAL, **NP), (R1,),
         tcp(CLIENT, NODE_IP, 30080), Outcome.DNAT, {"10.244.2.10:8080"}, False,
         "kubernetes#97081", mode="ipvs"),
    Case("ipvs-nodeport-cluster-masquerades", svc(**NP), (R1,), tcp(CLIENT, NODE_IP, 30080),
         Outcome.DNAT, {"10.244.2.10:8080"}, True, "KUBE-NODE-PORT", mode="ipvs"),
    Case("ipvs-hairpin", svc(), (L1,), tcp("10.244.1.10", "10.96.0.10"), Outcome.DNAT,
         {"10.244.1.10:8080"}, True, "KUBE-LOOP-BACK", mode="ipvs"),
    Case("ipvs-no-cluster-cidr-node-masquerades", svc(), (R1,), tcp(NODE_IP, "10.96.0.10"),
         Outcome.DNAT, {"10.244.2.10:8080"}, True, "src,dst", mode="ipvs",
         fam={"cluster_cidrs": ()}),
    Case("ipvs-other-port-of-a-service-ip-rejects", svc(), (L1,), tcp(POD, "10.96.0.10", 22),
         Outcome.REJECT, reason="KUBE-IPVS-FILTER", mode="ipvs"),
    Case("ipvs-unallocated-service-range-untouched", svc(), (L1,), tcp(POD, "10.96.9.9"),
         Outcome.NONE, reason="ipvs mode (as upstream) leaves it", mode="ipvs",
         fam={"service_cidrs": ("10.96.0.0/16",)}),
    Case("ipvs-lb-source-range-drops", svc(load_balancer_ips=("198.51.100.20",),
                                            load_balancer_source_ranges=("10.0.0.0/8",)),
         (), tcp(CLIENT, "198.51.100.20"), Outcome.DROP, reason="KUBE-SOURCE-RANGES-FIREWALL",
         mode="ipvs"),
    # ---------------------------------------------------------------------- origin
    Case("origin-given", svc(), (R1,), tcp(CLIENT, "10.96.0.10"), Outcome.DNAT,
         {"10.244.2.10:8080"}, False, "origin pod (given)", origin=Origin.POD),
    Case("node-cidr-remote-pod-is-not-local", svc(), (R1,), tcp(REMOTE_POD, "10.96.0.10"),
         Outcome.DNAT, {"10.244.2.10:8080"}, True, "from outside",
         fam={"detect_local": DetectLocal(LocalMode.NODE_CIDR),
              "node_pod_cidrs": ("10.244.1.0/24",)}),
    Case("interface-prefix", svc(), (R1,), tcp(POD, "10.96.0.10", in_interface="veth12"),
         Outcome.DNAT, {"10.244.2.10:8080"}, False, "from a local Pod",
         fam={"detect_local": DetectLocal(LocalMode.INTERFACE_NAME_PREFIX,
                                          interface_name_prefix="veth")}),
    Case("interface-prefix-other-interface", svc(), (R1,),
         tcp(POD, "10.96.0.10", in_interface="eth0"),
         Outcome.DNAT, {"10.244.2.10:8080"}, True, "from outside",
         fam={"detect_local": DetectLocal(LocalMode.INTERFACE_NAME_PREFIX,
                                          interface_name_prefix="veth")}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decision(case: Case) -> None:
    fam_kw = dict(case.fam)
    fam = family(fam_kw.pop("family_", IPFamily.IPv4), **fam_kw)
    plan = plan_service_port(case.svc, case.eps, fam)
    assert plan is not None
    result = explain(
        case.packet,
        fam,
        [plan],
        {case.svc.name: case.eps},
        mode=case.mode,
        node=case.node,
        origin=case.origin,
    )
    assert result.verdict is case.verdict, result.reasons
    assert set(result.endpoints) == case.endpoints
    assert result.masquerade is case.masquerade, result.reasons
    assert any(case.reason in r for r in result.reasons), result.reasons
    if case.verdict is Outcome.DNAT:
        assert sum(c.probability for c in result.candidates) == pytest.approx(1)


def test_excluded_endpoints_say_why() -> None:
    fam = family()
    s = svc(itp=LOCAL)
    eps = (L1, L2._replace(ready=False, serving=False), R1)
    plan = plan_service_port(s, eps, fam)
    assert plan is not None
    result = explain(tcp(POD, "10.96.0.10"), fam, [plan], {s.name: eps})
    why = {str(e.endpoint): e.why for e in result.excluded}
    assert why == {
        "10.244.1.11:8080": "not ready",
        "10.244.2.10:8080": "on node-b, not this node (Local traffic policy)",
    }


def test_live_addresses_decide_nodeports() -> None:
    fam = family(nodeport_addresses=NodePortAddresses.parse([]))
    s = svc(**NP)
    plan = plan_service_port(s, (L1,), fam)
    assert plan is not None
    node = NodeAddresses(frozenset({NODE_IP, "192.168.70.1"}), complete=True)
    result = explain(tcp(CLIENT, "192.168.70.1", 30080), fam, [plan], {s.name: (L1,)}, node=node)
    assert result.verdict is Outcome.DNAT


def test_families_must_agree() -> None:
    fam = family()
    with pytest.raises(ValueError, match="IPv4"):
        explain(tcp("fd00::1", "10.96.0.10"), fam, [], {})
    with pytest.raises(ValueError, match="mode"):
        explain(tcp(POD, "10.96.0.10"), fam, [], {}, mode="userspace")
