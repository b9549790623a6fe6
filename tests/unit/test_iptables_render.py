"""iptables mode's rules, as data: upstream's rules for each Service feature."""

from __future__ import annotations

from dataclasses import replace

from kubeproxy.backends.iptables.names import KUBE_FIREWALL, KUBE_FORWARD, ServicePortChains
from kubeproxy.backends.iptables.render import (
    CT_STATE_INVALID_DROPPED,
    FILTER_NODEPORTS,
    FILTER_SERVICES,
    LOCALHOST_NODEPORTS_ACCEPTED,
    NAT_NODEPORTS,
    NAT_SERVICES,
    NFACCT_COUNTERS,
    PortRules,
    Settings,
    fixed_chains,
    render_service_port,
)
from kubeproxy.model.nodeports import FamilyNodePorts
from kubeproxy.model.plan import FamilyPlan, LocalTraffic, plan_service_port
from kubeproxy.model.topology import NodeTopology
from kubeproxy.model.types import Endpoint, IPFamily, ServicePort, TrafficPolicy
from tests.unit.conftest import port_name, service_port

FAM = FamilyPlan(
    family=IPFamily.IPv4,
    node=NodeTopology("node-a"),
    node_ports=FamilyNodePorts(match_all=True, ranges=()),
    local=LocalTraffic(cidrs=("10.244.0.0/16",)),
    localhost_nodeports=True,
)
ROOTS = {t: f"ROOT-{t}" for t in (
    "nat-services", "nat-nodeports", "filter-services", "filter-external-ips",
    "filter-external-ports", "filter-firewall", "filter-nodeports",
)}  # fmt: skip


def render(svc: ServicePort, eps: list[Endpoint], fam: FamilyPlan = FAM) -> PortRules:
    plan = plan_service_port(svc, eps, fam)
    assert plan is not None
    return render_service_port(plan, fam, Settings())


def chains(rules: PortRules) -> dict[str, tuple[tuple[str, ...], ...]]:
    return dict(rules.chains)


def ep(ip: str, node: str = "node-a") -> Endpoint:
    return Endpoint(ip, 8080, node)


def test_cluster_ip_capture_masquerade_and_probabilities() -> None:
    names = ServicePortChains(port_name())
    rules = render(
        service_port(), [ep("10.244.1.2"), ep("10.244.2.2", "node-b"), ep("10.244.2.3", "node-b")]
    )
    (capture,) = [e for e in rules.entries if e.tree == NAT_SERVICES.id]
    assert capture.args == (
        "-m", "comment", "--comment", "default/web:http cluster IP",
        "-m", "tcp", "-p", "tcp", "-d", "10.96.0.10", "--dport", "80", "-j", names.svc,
    )  # fmt: skip
    svc = chains(rules)[names.svc]
    # Off-cluster traffic to the ClusterIP is masqueraded (upstream's IfNotLocal).
    assert svc[0][-6:] == ("--dport", "80", "!", "-s", "10.244.0.0/16", "-j", "KUBE-MARK-MASQ")[-6:]
    assert "!" in svc[0] and "KUBE-MARK-MASQ" in svc[0]
    probabilities = [r[r.index("--probability") + 1] for r in svc[1:] if "--probability" in r]
    assert probabilities == ["0.3333333333", "0.5000000000"]
    assert "--probability" not in svc[-1]
    sep = chains(rules)[names.sep("10.244.1.2:8080")]
    assert sep[0][-4:] == ("-s", "10.244.1.2", "-j", "KUBE-MARK-MASQ")
    assert sep[1][-4:] == ("-j", "DNAT", "--to-destination", "10.244.1.2:8080")


def test_session_affinity_uses_recent() -> None:
    names = ServicePortChains(port_name())
    rules = render(replace(service_port(), affinity_timeout=600), [ep("10.244.1.2")])
    sep = names.sep("10.244.1.2:8080")
    svc = chains(rules)[names.svc]
    assert (
        "-m",
        "recent",
        "--name",
        sep,
        "--rcheck",
        "--seconds",
        "600",
        "--reap",
        "-j",
        sep,
    ) == svc[1][-10:]
    assert ("-m", "recent", "--name", sep, "--set") == chains(rules)[sep][1][4:9]


def test_no_endpoints_reject_and_local_policy_drop_in_filter() -> None:
    none = render(service_port(node_port=30080), [])
    assert not none.chains  # nothing in nat
    targets = {e.tree: e.args[-1] for e in none.entries}
    assert targets[FILTER_SERVICES.id] == "REJECT"
    assert "filter-external-ports" in targets
    remote = render(
        replace(service_port(), internal_traffic_policy=TrafficPolicy.LOCAL),
        [ep("10.244.2.2", "node-b")],
    )
    (drop,) = [e for e in remote.entries if e.tree == FILTER_SERVICES.id]
    assert drop.args[3] == "default/web:http has no local endpoints" and drop.args[-1] == "DROP"


def test_external_local_policy_short_circuits_pods_and_the_node() -> None:
    names = ServicePortChains(port_name())
    svc = replace(service_port(node_port=30080), external_traffic_policy=TrafficPolicy.LOCAL)
    rules = render(svc, [ep("10.244.1.2"), ep("10.244.2.2", "node-b")])
    ext = chains(rules)[names.ext]
    assert ext[0][-5:] == ("-s", "10.244.0.0/16", "-j", names.svc)[-5:] or names.svc in ext[0]
    assert ext[1][-6:] == ("-m", "addrtype", "--src-type", "LOCAL", "-j", "KUBE-MARK-MASQ")
    assert ("-m", "addrtype", "--src-type", "LOCAL", "-j", names.svc) == ext[2][-6:]
    assert ext[3] == ("-j", names.svl)
    (np,) = [e for e in rules.entries if e.tree == NAT_NODEPORTS.id]
    assert np.args[-2:] == ("-j", names.ext)


def test_health_check_node_port_is_accepted_in_filter() -> None:
    svc = replace(
        service_port(node_port=30080),
        external_traffic_policy=TrafficPolicy.LOCAL,
        health_check_node_port=32000,
    )
    (hc,) = [e for e in render(svc, [ep("10.244.1.2")]).entries if e.tree == FILTER_NODEPORTS.id]
    assert hc.args[-7:] == ("-m", "tcp", "-p", "tcp", "--dport", "32000", "-j", "ACCEPT")[-7:]


def test_fixed_chains_follow_mark_bit_liberal_conntrack_and_localhost() -> None:
    fixed = fixed_chains(
        replace(FAM, masquerade_mark=1 << 5), Settings(), ROOTS, tcp_be_liberal=False
    )
    assert ("-j", "MARK", "--or-mark", "0x000020") in fixed.nat["KUBE-MARK-MASQ"]
    assert fixed.filter[KUBE_FORWARD][0] == (
        "-m",
        "conntrack",
        "--ctstate",
        "INVALID",
        "-j",
        "DROP",
    )
    assert KUBE_FIREWALL in fixed.filter
    liberal = fixed_chains(
        replace(FAM, localhost_nodeports=False), Settings(), ROOTS, tcp_be_liberal=True
    )
    assert all("INVALID" not in r for r in liberal.filter[KUBE_FORWARD])
    assert KUBE_FIREWALL not in liberal.filter
    # Without localhost NodePorts, the NodePort jump excludes loopback.
    assert liberal.nat["KUBE-SERVICES"][-1][-5:-2] == ("!", "-d", "127.0.0.0/8")
    v6 = fixed_chains(replace(FAM, family=IPFamily.IPv6), Settings(), ROOTS, tcp_be_liberal=False)
    assert v6.nat["KUBE-SERVICES"][-1][-5:-2] == ("!", "-d", "::1/128")


def test_nfacct_counters_are_fed_only_when_they_exist() -> None:
    counted = Settings(accounting=frozenset(NFACCT_COUNTERS))
    svc = service_port("np", node_port=30080)
    plan = plan_service_port(svc, [ep("10.244.1.2")], FAM)
    assert plan is not None
    nodeports = [e.args for e in render_service_port(plan, FAM, counted).entries
                 if e.tree == NAT_NODEPORTS.id]  # fmt: skip
    # Upstream's pair: 127.0.0.0/8 first (counted), then every address, same target.
    assert len(nodeports) == 2
    assert nodeports[0][:2] == ("-d", "127.0.0.0/8")
    assert nodeports[0][-4:-2] == ("--nfacct-name", LOCALHOST_NODEPORTS_ACCEPTED)
    assert nodeports[0][-1] == nodeports[1][-1]
    # Not without the counter, not without localhost NodePorts, never for IPv6.
    assert len([e for e in render(svc, [ep("10.244.1.2")]).entries
                if e.tree == NAT_NODEPORTS.id]) == 1  # fmt: skip
    off = replace(FAM, localhost_nodeports=False)
    plan = plan_service_port(svc, [ep("10.244.1.2")], off)
    assert plan is not None
    assert len([e for e in render_service_port(plan, off, counted).entries
                if e.tree == NAT_NODEPORTS.id]) == 1  # fmt: skip
    fixed = fixed_chains(FAM, counted, ROOTS, tcp_be_liberal=False)
    assert fixed.filter[KUBE_FORWARD][0] == (
        "-m", "conntrack", "--ctstate", "INVALID",
        "-m", "nfacct", "--nfacct-name", CT_STATE_INVALID_DROPPED, "-j", "DROP",
    )  # fmt: skip
