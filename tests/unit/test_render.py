"""The nftables renderer as data: which elements and chains each ServicePort produces."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from kubeproxy.backends.nftables.index import TableIndex, full_table, owner_comment
from kubeproxy.backends.nftables.proxier import table_ref
from kubeproxy.backends.nftables.render import PortRules, render_service_port
from kubeproxy.backends.nftables.table import (
    CLUSTER_IPS,
    HAIRPIN,
    LOCAL_OFFSET,
    NO_ENDPOINT_NODEPORTS,
    NO_ENDPOINT_SERVICES,
    NODEPORT_IPS,
    VERDICT_DROP,
    VERDICT_REJECT,
    LBChain,
)
from kubeproxy.dataplane.nftables.transaction import (
    COMMENT_MAX,
    ScriptError,
    Transaction,
    check_name,
    element_comment,
)
from kubeproxy.model.nodeports import FamilyNodePorts, NodePortAddresses
from kubeproxy.model.plan import FamilyPlan, LocalTraffic, plan_service_port
from kubeproxy.model.topology import NodeTopology
from kubeproxy.model.types import (
    Endpoint,
    IPFamily,
    L4Protocol,
    NamespacedName,
    ServicePort,
    ServicePortName,
    TrafficPolicy,
)

NODE = "node-a"
V4 = FamilyPlan(
    family=IPFamily.IPv4,
    node=NodeTopology(NODE, "zone-a"),
    node_ports=FamilyNodePorts(match_all=False, ranges=("192.168.50.1/32",)),
    local=LocalTraffic(cidrs=("10.244.0.0/16",)),
)
V6 = FamilyPlan(
    family=IPFamily.IPv6,
    node=NodeTopology(NODE, "zone-a"),
    node_ports=FamilyNodePorts(match_all=False, ranges=("fd00:50::1/128",)),
    local=LocalTraffic(cidrs=("fd00:10:244::/56",)),
)


def render(port: ServicePort, endpoints: list[Endpoint], fam: FamilyPlan) -> PortRules:
    plan = plan_service_port(port, endpoints, fam)
    return render_service_port(plan, fam) if plan is not None else PortRules()


def spn(
    name: str = "web", port: str = "http", proto: L4Protocol = L4Protocol.TCP
) -> ServicePortName:
    return ServicePortName(NamespacedName("default", name), port, proto)


def svc(
    name: str = "web", cluster_ips: tuple[str, ...] = ("10.96.0.1",), **kw: object
) -> ServicePort:
    return ServicePort(name=spn(name), cluster_ips=cluster_ips, port=80, **kw)  # type: ignore[arg-type]


def ep(ip: str, node: str | None = NODE, *, ready: bool = True) -> Endpoint:
    return Endpoint(ip=ip, port=8080, node_name=node, ready=ready)


def elements(rules: PortRules) -> dict[tuple[str, str], str | None]:
    return {(m, k): v for d in rules.destinations for m, k, v in d.elements}


def test_cluster_ip_goes_to_a_shared_chain_by_endpoint_count() -> None:
    rules = render(
        svc(), [ep("10.244.1.2"), ep("10.244.2.2", "node-b"), ep("10.244.2.3", "node-b")], V4
    )
    got = elements(rules)
    assert got[("cluster-ip-3-dests", "10.96.0.1 . tcp . 80")] is None
    assert [got[("cluster-ip-3-backends", f"10.96.0.1 . tcp . 80 . {i}")] for i in range(3)] == [
        "10.244.1.2 . 8080",
        "10.244.2.2 . 8080",
        "10.244.2.3 . 8080",
    ]
    assert {d.chain for d in rules.destinations} == {LBChain("cluster-ip", 3)}
    # Only this node's endpoints can hairpin; the ClusterIP is in the cluster-ips set.
    assert set(rules.shared) == {
        (HAIRPIN, "10.244.1.2 . 10.244.1.2", None),
        (CLUSTER_IPS, "10.96.0.1", None),
    }


def test_no_endpoints_rejects_and_local_policy_elsewhere_drops() -> None:
    none = elements(render(svc(node_port=30080), [], V4))
    assert none == {
        (NO_ENDPOINT_SERVICES, "10.96.0.1 . tcp . 80"): VERDICT_REJECT,
        (NO_ENDPOINT_NODEPORTS, "tcp . 30080"): VERDICT_REJECT,
    }
    remote_only = render(
        svc(internal_traffic_policy=TrafficPolicy.LOCAL), [ep("10.244.2.2", "node-b")], V4
    )
    assert elements(remote_only) == {(NO_ENDPOINT_SERVICES, "10.96.0.1 . tcp . 80"): VERDICT_DROP}
    assert remote_only.no_local_internal


def test_external_policy_local_keeps_both_sets_under_one_key() -> None:
    rules = render(
        svc(
            node_port=30080,
            external_traffic_policy=TrafficPolicy.LOCAL,
            external_ips=("203.0.113.7",),
        ),
        [ep("10.244.1.2"), ep("10.244.2.2", "node-b")],
        V4,
    )
    got = elements(rules)
    assert got[("local-np-2-1-dests", "tcp . 30080")] is None
    # Each shared chain has its own backends map.
    np_backends = "local-np-2-1-backends"
    assert got[(np_backends, "tcp . 30080 . 0")] == "10.244.1.2 . 8080"
    assert got[(np_backends, "tcp . 30080 . 1")] == "10.244.2.2 . 8080"
    assert got[(np_backends, f"tcp . 30080 . {LOCAL_OFFSET}")] == "10.244.1.2 . 8080"
    assert got[("local-ip-2-1-backends", "203.0.113.7 . tcp . 80 . 0")] == "10.244.1.2 . 8080"
    assert got[("local-ip-2-1-dests", "203.0.113.7 . tcp . 80")] is None
    # The ClusterIP is internal traffic: Cluster policy.
    assert got[("cluster-ip-2-dests", "10.96.0.1 . tcp . 80")] is None


def test_external_policy_local_without_local_endpoints_drops_the_rest() -> None:
    got = elements(
        render(
            svc(node_port=30080, external_traffic_policy=TrafficPolicy.LOCAL),
            [ep("10.244.2.2", "node-b")],
            V4,
        )
    )
    # Pods and the node are short-circuited by local-np-1-0; everything else is dropped.
    assert got[("local-np-1-0-dests", "tcp . 30080")] is None
    assert got[(NO_ENDPOINT_NODEPORTS, "tcp . 30080")] == VERDICT_DROP


def test_external_policy_cluster_uses_external_chains() -> None:
    got = elements(
        render(
            svc(node_port=30080, load_balancer_ips=("198.51.100.1",)),
            [ep("10.244.1.2"), ep("10.244.2.2", "node-b")],
            V4,
        )
    )
    assert got[("external-np-2-dests", "tcp . 30080")] is None
    assert got[("external-ip-2-dests", "198.51.100.1 . tcp . 80")] is None


def test_families_are_rendered_separately() -> None:
    port = svc(cluster_ips=("10.96.0.1", "fd00:10:96::1"), node_port=30080)
    endpoints = [ep("10.244.1.2"), ep("fd00:10:244:1::2")]
    v4 = elements(render(port, endpoints, V4))
    v6 = elements(render(port, endpoints, V6))
    assert ("cluster-ip-1-backends", "10.96.0.1 . tcp . 80 . 0") in v4
    assert (
        v6[("cluster-ip-1-backends", "fd00:10:96::1 . tcp . 80 . 0")] == "fd00:10:244:1::2 . 8080"
    )
    assert v6[("external-np-1-backends", "tcp . 30080 . 0")] == "fd00:10:244:1::2 . 8080"
    assert not any("10.244" in (v or "") for v in v6.values())
    # A single-stack Service has nothing in the other family's table.
    assert render(svc(), endpoints, V6) == PortRules()


def backends(rules: PortRules, name: str) -> dict[str, str | None]:
    return {k: v for (m, k), v in elements(rules).items() if m == name}


def test_endpoints_keep_their_index_across_a_partial_sync() -> None:
    port = svc(node_port=30080, external_traffic_policy=TrafficPolicy.LOCAL)
    first = [ep("10.244.1.2"), ep("10.244.1.3"), ep("10.244.2.4", "node-b"), ep("10.244.2.5")]
    before = render(port, first, V4)
    # 10.244.1.3 leaves, 10.244.1.1 comes (it sorts first: indexing in address order
    # would shift every endpoint); 10.244.1.1 takes the leaver's index.
    now = [ep("10.244.1.1"), ep("10.244.1.2"), ep("10.244.2.4", "node-b"), ep("10.244.2.5")]
    plan = plan_service_port(port, now, V4)
    assert plan is not None
    after = render_service_port(plan, V4, before)
    old, new = backends(before, "cluster-ip-4-backends"), backends(after, "cluster-ip-4-backends")
    assert {k: v for k, v in new.items() if old[k] != v} == {
        "10.96.0.1 . tcp . 80 . 1": "10.244.1.1 . 8080"
    }
    # The node-local group of a Local-policy chain (at LOCAL_OFFSET and up) too.
    old, new = backends(before, "local-np-4-3-backends"), backends(after, "local-np-4-3-backends")
    assert {k: v for k, v in new.items() if old[k] != v} == {
        "tcp . 30080 . 1": "10.244.1.1 . 8080",
        f"tcp . 30080 . {LOCAL_OFFSET + 1}": "10.244.1.1 . 8080",
    }
    # Nothing changed, nothing moves: the rules equal the programmed ones.
    assert render_service_port(plan, V4, after) == after
    # Without the programmed rules (a full sync), endpoints are indexed in plan order.
    assert render_service_port(plan, V4) == render(port, now, V4)


def test_a_shrinking_service_keeps_the_endpoints_that_stay_in_range() -> None:
    first = [ep(f"10.244.1.{i}") for i in range(1, 5)]
    before = render(svc(), first, V4)
    # 10.244.1.2 leaves: a new count, a new chain and map, so every element is new;
    # then one more leaves and one comes at the same count.
    three = render(svc(), [first[0], first[2], first[3]], V4)
    plan = plan_service_port(svc(), [first[0], first[3], ep("10.244.1.9")], V4)
    assert plan is not None
    again = render_service_port(plan, V4, three)
    old, new = backends(three, "cluster-ip-3-backends"), backends(again, "cluster-ip-3-backends")
    assert {k: v for k, v in new.items() if old[k] != v} == {
        "10.96.0.1 . tcp . 80 . 1": "10.244.1.9 . 8080"
    }
    assert "cluster-ip-3-backends" not in {m for (m, _) in elements(before)}


def test_one_replaced_endpoint_is_one_element_deleted_and_one_added() -> None:
    endpoints = [ep(f"10.244.1.{i}") for i in range(10, 20)]
    before = render(svc(), endpoints, V4)
    index = TableIndex.build(V4, {spn(): before})
    plan = plan_service_port(svc(), [ep("10.244.1.1"), *endpoints[1:]], V4)
    assert plan is not None
    tx = Transaction()
    index.change({spn(): render_service_port(plan, V4, before)}).emit(tx, table_ref(IPFamily.IPv4))
    text = str(tx)
    assert text.count("10.96.0.1 . tcp . 80 . ") == 2, text
    assert (
        "delete element ip kube-proxy cluster-ip-10-backends { 10.96.0.1 . tcp . 80 . 0 }" in text
    )


def test_conflicting_destinations_first_owner_wins() -> None:
    a = render(svc("a"), [ep("10.244.1.2")], V4)
    b = render(svc("b"), [ep("10.244.1.3")], V4)
    index = TableIndex.build(V4, {spn("b"): b, spn("a"): a})
    backends = index.contents().elements["cluster-ip-1-backends"]
    assert backends["10.96.0.1 . tcp . 80 . 0"] == "10.244.1.2 . 8080"
    assert [(c.owner, c.loser) for c in index.conflicts()] == [(spn("a"), spn("b"))]


def test_hairpin_pairs_are_shared_between_services() -> None:
    a = render(svc("a"), [ep("10.244.1.2")], V4)
    b = render(svc("b", ("10.96.0.2",)), [ep("10.244.1.2"), ep("10.244.1.3", None)], V4)
    merged = TableIndex.build(V4, {spn("a"): a, spn("b"): b}).contents()
    assert set(merged.elements[HAIRPIN]) == {"10.244.1.2 . 10.244.1.2", "10.244.1.3 . 10.244.1.3"}


@pytest.mark.parametrize(
    ("cfg_changes", "expected_first_rule"),
    [
        ({}, "ip saddr != 10.244.0.0/16 meta mark set meta mark | 0x00004000"),
        ({"masquerade_all": True}, "meta mark set meta mark | 0x00004000"),
        ({"local": LocalTraffic()}, "dnat ip to ip daddr"),
        (
            {"masquerade_mark": 1 << 5},
            "ip saddr != 10.244.0.0/16 meta mark set meta mark | 0x00000020",
        ),
    ],
)
def test_cluster_ip_chain_masquerade_rule(
    cfg_changes: dict[str, object], expected_first_rule: str
) -> None:
    import dataclasses

    cfg = dataclasses.replace(V4, **cfg_changes)  # type: ignore[arg-type]
    assert LBChain("cluster-ip", 2).rules(cfg)[0].startswith(expected_first_rule)


def test_local_chain_rules() -> None:
    rules = LBChain("local-np", 3, 1).rules(V4)
    assert rules == [
        "ip saddr 10.244.0.0/16 dnat ip to meta l4proto . th dport . numgen random mod 3 "
        "map @local-np-3-1-backends",
        "fib saddr type local meta mark set meta mark | 0x00004000",
        "fib saddr type local dnat ip to meta l4proto . th dport . numgen random mod 3 "
        "map @local-np-3-1-backends",
        f"dnat ip to meta l4proto . th dport . numgen random mod 1 offset {LOCAL_OFFSET} "
        "map @local-np-3-1-backends",
    ]
    # Without local endpoints only the short-circuits remain; the rest falls to the drop.
    assert not any("offset" in r for r in LBChain("local-np", 3, 0).rules(V4))


def test_nodeport_match_all_has_no_address_set() -> None:
    every = FamilyNodePorts(match_all=True, ranges=())
    import dataclasses

    fam = dataclasses.replace(V4, node_ports=every)
    table = full_table(fam, TableIndex.build(fam, {}).contents())
    assert NODEPORT_IPS not in {s.name for s in table.sets}
    services = next(c for c in table.chains if c.name == "services")
    assert services.rules[1] == "fib daddr type local ip daddr != 127.0.0.0/8 goto nodeports"


def test_nodeport_addresses_flag() -> None:
    flag = NodePortAddresses.parse(["10.0.0.0/8, 192.168.0.0/16", "fd00::/8"])
    assert flag.for_family(IPFamily.IPv4, "10.1.2.3").ranges == ("10.0.0.0/8", "192.168.0.0/16")
    assert flag.for_family(IPFamily.IPv6, None).ranges == ("fd00::/8",)
    assert NodePortAddresses.parse(["0.0.0.0/0"]).for_family(IPFamily.IPv4, None).match_all
    # As upstream: a family the list does not mention accepts NodePorts everywhere.
    assert NodePortAddresses.parse(["0.0.0.0/0"]).for_family(IPFamily.IPv6, "fd00::1").match_all
    primary = NodePortAddresses.parse(["primary"])
    assert primary.for_family(IPFamily.IPv4, "10.1.2.3").ranges == ("10.1.2.3/32",)
    assert primary.for_family(IPFamily.IPv6, None).match_all
    # v1.37: the keywords mix with CIDRs.
    mixed = NodePortAddresses.parse(["primary,10.0.0.0/8"])
    assert mixed.for_family(IPFamily.IPv4, "172.16.0.1").ranges == ("172.16.0.1/32", "10.0.0.0/8")


def test_table_text_is_declarative_and_ordered() -> None:
    rules = {spn(): render(svc(), [ep("10.244.1.2")], V4)}
    tx = Transaction()
    tx.define_table(full_table(V4, TableIndex.build(V4, rules).contents()))
    text = str(tx)
    # Maps are declared before the chains whose rules and elements refer to them.
    assert text.index("map service-ips") < text.index("chain services")
    assert text.index("set cluster-ip-1-dests") < text.index("chain services")
    assert '10.96.0.1 . tcp . 80 comment "default/web:http"\n' in text
    assert "chain cluster-ip-1 {" in text
    # One dispatch rule per shared chain in use, none per Service.
    assert "ip daddr . meta l4proto . th dport @cluster-ip-1-dests goto cluster-ip-1" in text


@pytest.mark.parametrize(
    "name", ["", "a b", "x;flush ruleset", "a\nb", "a" * 256, "-x", "/x", "ä", 'a"b', "a{b"]
)
def test_hostile_object_names_are_refused(name: str) -> None:
    with pytest.raises(ScriptError, match="invalid nftables object name"):
        check_name(name)


@pytest.mark.parametrize(
    "name",
    [
        # What upstream kube-proxy's nftables mode (v1.37) names its per-Service chains
        # and affinity sets: a table taken over from it holds these, and they are
        # deleted by name.
        "service-2QRHZV4L-default/kubernetes/tcp/https",
        "endpoint-CYD6F4ZM-m/web/tcp/http__10.244.1.10/8080",
        "affinity-CYD6F4ZM-m/web/tcp/http__10.244.1.10/8080",
        "a" * 255,  # the kernel's limit
    ],
)
def test_names_nft_accepts_are_accepted(name: str) -> None:
    assert check_name(name) == name


# ------------------------------------------------------------ element comments (issue 13)

SAFE_COMMENT = re.compile(r"^[A-Za-z0-9._/:-]{0,128}$")


@pytest.mark.parametrize(
    "text",
    [
        'ns/a"b:c',
        "ns/a\\b:c",
        "ns/a\nb:c",
        'ns/x" : goto evil; flush ruleset; "',
        "ns/a,b}{:c",
        "ns/ä:ü",
        "n" * 63 + "/" + "s" * 63 + ":" + "p" * 15,
        "x" * 1000,
    ],
)
def test_element_comments_cannot_break_the_script(text: str) -> None:
    comment = element_comment(text)
    assert SAFE_COMMENT.match(comment), comment
    if len(text.encode()) > COMMENT_MAX:
        assert len(comment) == COMMENT_MAX and comment.endswith("...")


def test_valid_names_are_kept_verbatim_in_comments() -> None:
    assert element_comment("kube-system/kube-dns:dns-tcp") == "kube-system/kube-dns:dns-tcp"
    assert owner_comment(spn("web", "")) == "default/web"
    assert owner_comment(spn("web", "http", L4Protocol.UDP)) == "default/web:http"


def test_only_the_element_naming_a_destination_carries_a_comment() -> None:
    port = replace(svc(), node_port=30080)
    rules = {spn(): render(port, [ep("10.244.1.2"), ep("10.244.1.3")], V4)}
    contents = TableIndex.build(V4, rules).contents()
    assert contents.comments == {
        ("cluster-ip-2-dests", "10.96.0.1 . tcp . 80"): "default/web:http",
        ("external-np-2-dests", "tcp . 30080"): "default/web:http",
    }
    empty = {spn(): render(port, [], V4)}
    assert set(TableIndex.build(V4, empty).contents().comments) == {
        (NO_ENDPOINT_SERVICES, "10.96.0.1 . tcp . 80"),
        (NO_ENDPOINT_NODEPORTS, "tcp . 30080"),
    }


def test_a_destination_changing_owner_is_added_again_with_the_new_comment() -> None:
    a = render(svc("a"), [ep("10.244.1.2")], V4)
    b = render(svc("b"), [ep("10.244.1.2")], V4)
    index = TableIndex.build(V4, {spn("a"): a, spn("b"): b})
    change = index.change({spn("a"): None})
    tx = Transaction()
    change.emit(tx, full_table(V4, index.contents()).ref)
    script = str(tx)
    # Same value, new owner: deleted, then added with b's name (adding the existing key
    # again would keep a's comment in the kernel).
    assert "delete element ip kube-proxy cluster-ip-1-dests { 10.96.0.1 . tcp . 80 }" in script
    assert '{ 10.96.0.1 . tcp . 80 comment "default/b:http" }' in script
    assert "default/a" not in script
    # An unchanged owner writes nothing.
    same = index.change({spn("a"): a})
    tx = Transaction()
    same.emit(tx, full_table(V4, index.contents()).ref)
    assert str(tx) == ""
