"""``explain``'s kernel objects (from the backends' renderers) and ``--live``'s comparison.

The comparison is fed kernel listings as text here; tests/kernel/test_explain_agrees.py
runs it against real kernels.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kubeproxy.backends import inspection
from kubeproxy.backends.inspection import KernelObject
from kubeproxy.backends.iptables import inspect as ipt_inspect
from kubeproxy.backends.iptables.names import ServicePortChains
from kubeproxy.backends.ipvs import inspect as ipvs_inspect
from kubeproxy.backends.nftables import inspect as nft_inspect
from kubeproxy.backends.registry import inspector
from kubeproxy.dataplane.process import ToolError
from kubeproxy.explain.packet import explain, explain_frontend
from kubeproxy.model.fate import Explanation, Origin, Outcome, Packet
from kubeproxy.model.plan import FamilyPlan, FrontendKind, plan_service_port
from kubeproxy.model.types import Endpoint, ServicePort, TrafficPolicy
from tests.unit.conftest import endpoint, service_port
from tests.unit.test_explain import CLIENT, NODE_IP, POD, family


def kernel_objects(
    result: Explanation, fam: FamilyPlan, scheduler: str = "rr"
) -> tuple[KernelObject, ...]:
    return inspector(result.mode).kernel_objects(result, fam, scheduler)


EPS = (endpoint("10.244.1.10", node="node-a"), endpoint("10.244.2.10", node="node-b"))


def run(
    svc: ServicePort, packet: Packet, mode: str, eps: tuple[Endpoint, ...] = EPS
) -> tuple[Explanation, FamilyPlan]:
    fam = family()
    plan = plan_service_port(svc, eps, fam)
    assert plan is not None
    return explain(packet, fam, [plan], {svc.name: eps}, mode=mode), fam


def test_nftables_cluster_ip_objects() -> None:
    result, fam = run(service_port(), Packet(POD, "10.96.0.10", 80), "nftables")
    assert [str(o) for o in kernel_objects(result, fam)] == [
        "ip kube-proxy: cluster-ip-2-dests element { 10.96.0.10 . tcp . 80 }",
        "ip kube-proxy: chain cluster-ip-2",
        "ip kube-proxy: cluster-ip-2-backends element "
        "{ 10.96.0.10 . tcp . 80 . 0 : 10.244.1.10 . 8080 }",
        "ip kube-proxy: cluster-ip-2-backends element "
        "{ 10.96.0.10 . tcp . 80 . 1 : 10.244.2.10 . 8080 }",
    ]


def test_nftables_rejects_name_the_reject_chain() -> None:
    result, fam = run(service_port(), Packet(POD, "10.96.0.10", 80), "nftables", eps=())
    assert result.verdict is Outcome.REJECT
    assert [str(o) for o in kernel_objects(result, fam)] == [
        "ip kube-proxy: no-endpoint-services element { 10.96.0.10 . tcp . 80 : goto reject-chain }",
        "ip kube-proxy: chain reject-chain",
    ]


def test_iptables_objects_are_upstreams_chains() -> None:
    svc = service_port(node_port=30080)
    result, fam = run(svc, Packet(CLIENT, NODE_IP, 30080), "iptables")
    names = ServicePortChains(svc.name)
    chains = [o.name for o in kernel_objects(result, fam) if o.kind == "chain"]
    assert chains == [
        names.ext,
        names.svc,
        names.sep("10.244.1.10:8080"),
        names.sep("10.244.2.10:8080"),
    ]
    assert chains[1].startswith("KUBE-SVC-") and chains[2].startswith("KUBE-SEP-")
    rules = [o for o in kernel_objects(result, fam) if o.kind == "rule"]
    assert [(r.table, r.name) for r in rules] == [("nat", "KUBE-NODEPORTS")]


def test_parse_elements_of_an_nft_listing() -> None:
    # nft's own layout: tabs, then spaces to align continued elements.
    text = (
        "table ip kube-proxy {\n\tmap ip-backends {\n"
        "\t\ttypeof ip daddr . meta l4proto . th dport . numgen random mod 1 : "
        "ip daddr . th dport\n"
        "\t\telements = { 10.96.0.10 . tcp . 80 . 0 : 10.244.1.10 . 8080,\n"
        "\t\t\t     10.96.0.10 . tcp . 80 . 1 : 10.244.2.10 . 8080 }\n\t}\n}\n"
    )
    assert nft_inspect.parse_elements(text) == {
        "10.96.0.10 . tcp . 80 . 0": "10.244.1.10 . 8080",
        "10.96.0.10 . tcp . 80 . 1": "10.244.2.10 . 8080",
    }
    assert nft_inspect.parse_elements("table ip kube-proxy {\n set cluster-ips {\n }\n}") == {}


def test_parse_elements_leaves_the_comment_out_of_the_key() -> None:
    text = (
        "table ip kube-proxy {\n\tmap service-ips {\n"
        "\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n"
        '\t\telements = { 10.96.0.10 . tcp . 80 comment "demo/web:http" : goto cluster-ip-2,\n'
        '\t\t\t     10.96.0.11 . udp . 53 comment "kube-system/kube-dns:dns" : drop }\n\t}\n}\n'
    )
    assert nft_inspect.parse_elements(text) == {
        "10.96.0.10 . tcp . 80": "goto cluster-ip-2",
        "10.96.0.11 . udp . 53": "drop",
    }


def kernel_elements(*endpoints: str) -> dict[str, dict[str, str | None]]:
    """The kernel's elements for the ClusterIP 10.96.0.10:80 with ``endpoints`` at
    indexes 0, 1..."""
    backends: dict[str, str | None] = {
        f"10.96.0.10 . tcp . 80 . {i}": f"{ep} . 8080" for i, ep in enumerate(endpoints)
    }
    return {
        "cluster-ip-2-dests": {"10.96.0.10 . tcp . 80": None},
        "cluster-ip-2-backends": backends,
    }


def test_nft_drift_finds_missing_and_extra_endpoints() -> None:
    result, fam = run(service_port(), Packet(POD, "10.96.0.10", 80), "nftables")
    objects = kernel_objects(result, fam)
    elements = kernel_elements("10.244.1.10", "10.244.2.10")
    assert nft_inspect.nft_drift(result, fam, objects, {"cluster-ip-2"}, elements) == []
    elements["cluster-ip-2-backends"]["10.96.0.10 . tcp . 80 . 1"] = "10.244.2.99 . 8080"
    elements["cluster-ip-2-backends"]["10.96.0.10 . tcp . 80 . 5"] = "10.244.2.98 . 8080"
    del elements["cluster-ip-2-dests"]["10.96.0.10 . tcp . 80"]
    drift = nft_inspect.nft_drift(result, fam, objects, set(), elements)
    assert drift == [
        "missing ip kube-proxy: cluster-ip-2-dests element { 10.96.0.10 . tcp . 80 }",
        "missing ip kube-proxy: chain cluster-ip-2",
        "missing endpoint 10.244.2.10:8080 in cluster-ip-2-backends",
        "extra endpoint 10.244.2.98:8080 in cluster-ip-2-backends (index 5)",
        "extra endpoint 10.244.2.99:8080 in cluster-ip-2-backends (index 1)",
    ]


def test_nft_drift_ignores_which_index_holds_which_endpoint() -> None:
    # A partial sync keeps endpoints where they were: the kernel's order may differ from
    # a fresh rendering's, which is no drift.
    result, fam = run(service_port(), Packet(POD, "10.96.0.10", 80), "nftables")
    objects = kernel_objects(result, fam)
    elements = kernel_elements("10.244.2.10", "10.244.1.10")
    assert nft_inspect.nft_drift(result, fam, objects, {"cluster-ip-2"}, elements) == []
    # The same endpoint twice, once out of range, is reported at the index numgen skips.
    elements["cluster-ip-2-backends"]["10.96.0.10 . tcp . 80 . 2"] = "10.244.1.10 . 8080"
    assert nft_inspect.nft_drift(result, fam, objects, {"cluster-ip-2"}, elements) == [
        "extra endpoint 10.244.1.10:8080 in cluster-ip-2-backends (index 2)"
    ]


def test_iptables_drift_compares_endpoints() -> None:
    svc = service_port()
    result, fam = run(svc, Packet(POD, "10.96.0.10", 80), "iptables")
    names = ServicePortChains(svc.name)
    sep1, sep2 = names.sep("10.244.1.10:8080"), names.sep("10.244.2.10:8080")
    stale = names.sep("10.244.2.77:8080")
    save = f"""*nat
:{names.svc} - [0:0]
:{sep1} - [0:0]
:{stale} - [0:0]
-A {names.svc} -m comment --comment "default/web:http -> 10.244.1.10:8080" -j {sep1}
-A {names.svc} -j {stale}
-A {sep1} -s 10.244.1.10/32 -j KUBE-MARK-MASQ
-A {sep1} -p tcp -m tcp -j DNAT --to-destination 10.244.1.10:8080
-A {stale} -p tcp -m tcp -j DNAT --to-destination 10.244.2.77:8080
COMMIT
"""
    assert ipt_inspect.iptables_drift(result, kernel_objects(result, fam), save) == [
        f"missing nat: chain {sep2}",
        f"missing endpoint 10.244.2.10:8080 in {names.svc}",
        f"extra endpoint 10.244.2.77:8080 in {names.svc}",
    ]


def test_node_addresses_from_ip_json() -> None:
    text = (
        '[{"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1"}]},'
        '{"ifname":"eth0","addr_info":[{"family":"inet6","local":"fe80::1"},'
        '{"family":"inet","local":"192.168.50.1"}]}]'
    )
    got = inspection.node_addresses(lambda binary, args: text)
    assert got == frozenset({"127.0.0.1", "fe80::1", "192.168.50.1"})


def test_affinity_chains_are_listed() -> None:
    svc = replace(service_port(), affinity_timeout=60)
    result, fam = run(svc, Packet(POD, "10.96.0.10", 80), "nftables")
    chains = [o.name for o in kernel_objects(result, fam) if o.kind == "chain"]
    assert any(c.startswith("aff-") for c in chains)
    assert any(c.startswith("affep-") for c in chains)


def test_ipvs_objects_are_the_virtual_server_its_real_servers_and_sets() -> None:
    sticky = replace(service_port(), affinity_timeout=60)
    result, fam = run(sticky, Packet(POD, "10.96.0.10", 80), "ipvs")
    assert [str(o) for o in kernel_objects(result, fam, "mh")] == [
        "ipvs: virtual server TCP/10.96.0.10:80 mh persistent 60 flags 0x10",
        "ipvs: TCP/10.96.0.10:80 -> 10.244.1.10:8080 weight 1",
        "ipvs: TCP/10.96.0.10:80 -> 10.244.2.10:8080 weight 1",
        "kube-ipvs0: address 10.96.0.10",
        "ipset: KUBE-CLUSTER-IP element { 10.96.0.10,tcp:80 }",
    ]
    node_port = service_port(node_port=30080)
    result, fam = run(node_port, Packet(CLIENT, NODE_IP, 30080), "ipvs")
    objects = [str(o) for o in kernel_objects(result, fam)]
    assert objects[0] == f"ipvs: virtual server TCP/{NODE_IP}:30080 rr"
    assert "ipset: KUBE-NODE-PORT-TCP element { 30080 }" in objects
    assert not any("kube-ipvs0" in o for o in objects)  # a node address is not bound


def test_ipvs_drift_finds_missing_changed_and_extra_real_servers() -> None:
    result, fam = run(service_port(), Packet(POD, "10.96.0.10", 80), "ipvs")
    objects = kernel_objects(result, fam)
    vs = "TCP/10.96.0.10:80"
    same = ipvs_inspect.IpvsView(
        {vs: "rr"},
        {vs: {"10.244.1.10:8080": "weight 1", "10.244.2.10:8080": "weight 1"}},
        frozenset({"10.96.0.10"}),
        {"KUBE-CLUSTER-IP": frozenset({"10.96.0.10,tcp:80"})},
    )
    assert ipvs_inspect.ipvs_drift(objects, same) == []
    drifted = replace(
        same,
        services={vs: "wlc"},
        real_servers={vs: {"10.244.1.10:8080": "weight 0", "10.244.9.9:8080": "weight 1"}},
        addresses=frozenset(),
    )
    assert ipvs_inspect.ipvs_drift(objects, drifted) == [
        f"ipvs: virtual server {vs} rr: the kernel has 'wlc'",
        f"ipvs: {vs} -> 10.244.1.10:8080 weight 1: the kernel has weight 0",
        f"missing ipvs: {vs} -> 10.244.2.10:8080 weight 1",
        "missing kube-ipvs0: address 10.96.0.10",
        f"extra real server 10.244.9.9:8080 (weight 1) of {vs}",
    ]
    assert ipvs_inspect.ipvs_drift(objects, replace(same, services={}, real_servers={})) == [
        f"missing ipvs: virtual server {vs} rr"
    ]


def test_explain_frontend_reaches_each_frontend_from_outside() -> None:
    """list --live explains every frontend without a packet: from outside, inside the
    source ranges, a NodePort on the given node address (ipvs: one per address)."""
    fam = family()
    svc = replace(
        service_port(node_port=30080, etp=TrafficPolicy.LOCAL, load_balancer_ips=("198.51.100.7",)),
        load_balancer_source_ranges=("192.0.2.0/24",),
    )
    plan = plan_service_port(svc, EPS, fam)
    assert plan is not None
    by_kind = {f.kind: f for f in plan.frontends}
    lb = explain_frontend(plan, by_kind[FrontendKind.LOAD_BALANCER], fam, {svc.name: EPS})
    assert (lb.verdict, lb.origin, lb.packet.src) == (Outcome.DNAT, Origin.OUTSIDE, "192.0.2.1")
    assert lb.endpoints == ("10.244.1.10:8080",)  # Local policy: node-a's only
    node_port = by_kind[FrontendKind.NODE_PORT]
    ipvs = explain_frontend(plan, node_port, fam, {svc.name: EPS}, mode="ipvs", node_ip=NODE_IP)
    assert str(kernel_objects(ipvs, fam)[0]) == f"ipvs: virtual server TCP/{NODE_IP}:30080 rr"
    cluster_ip = by_kind[FrontendKind.CLUSTER_IP]
    mine = explain_frontend(plan, cluster_ip, fam, {svc.name: EPS}, origin=Origin.NODE)
    assert (mine.origin, mine.verdict, len(mine.endpoints)) == (Origin.NODE, Outcome.DNAT, 2)


def test_what_only_the_kernel_holds() -> None:
    table = "ip kube-proxy"
    kernel = {
        "cluster-ips": {"10.96.0.10": None, "10.96.0.99": None},
        "cluster-ip-2-dests": {"10.96.0.10 . tcp . 80": None},
    }
    want = [("cluster-ips", "10.96.0.10"), ("cluster-ip-2-dests", "10.96.0.10 . tcp . 80")]
    assert nft_inspect.nft_kernel_only(table, kernel, want) == [
        "ip kube-proxy: cluster-ips element { 10.96.0.99 }: no Service has it (stale)"
    ]
    save = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAA - [0:0]\n:KUBE-SEP-BBB - [0:0]\nCOMMIT\n"
    assert ipt_inspect.iptables_kernel_only(save, {"KUBE-SVC-AAA"}) == [
        "nat: chain KUBE-SEP-BBB: no Service has it (stale)"
    ]
    view = ipvs_inspect.IpvsView(
        {"TCP/10.96.0.10:80": "rr", "TCP/10.96.0.99:80": "rr", "TCP/192.168.50.1:22": "rr"},
        {},
        frozenset({"10.96.0.10", "10.96.0.99"}),
        {},
    )
    ours = [KernelObject("virtual-server", "ipvs", "TCP/10.96.0.10:80", "rr")]
    # Someone else's virtual server on a node address is not ours to judge.
    assert ipvs_inspect.ipvs_kernel_only(view, ours, {"10.96.0.10"}) == [
        "ipvs: virtual server TCP/10.96.0.99:80 rr: no Service has this frontend (stale)",
        "kube-ipvs0: address 10.96.0.99: no Service has it (stale)",
    ]


def test_the_kernel_is_read_once_per_question() -> None:
    asked: list[tuple[str, ...]] = []

    def read(binary: str, args: list[str]) -> str:
        asked.append((binary, *args))
        if args[-1] == "missing":
            raise ToolError("no such set")
        return "answer"

    reader = inspection.KernelReader(read)
    for _ in range(3):
        assert reader("nft", ["list", "set", "ip", "kube-proxy", "a"]) == "answer"
        with pytest.raises(ToolError, match="no such set"):
            reader("nft", ["list", "set", "ip", "kube-proxy", "missing"])
    assert len(asked) == 2
