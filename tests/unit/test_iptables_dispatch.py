"""Dispatch trees: a packet walking the tree meets exactly the rules of its key, in
order; updates end exactly where a fresh build would; chains stay short."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from kubeproxy.backends.iptables.dispatch import (
    IP4,
    IP6,
    LEAF_SIZE,
    MAX_DEPTH,
    PORTS,
    DispatchTree,
    KeySpace,
    port_key,
)
from kubeproxy.backends.iptables.names import DISPATCH_PREFIX
from kubeproxy.model.types import L4Protocol, NamespacedName, ServicePortName

Chains = dict[str, tuple[tuple[str, ...], ...]]


def owner(i: int) -> ServicePortName:
    return ServicePortName(NamespacedName("default", f"s{i:03d}"), "p", L4Protocol.TCP)


def rule(key: int, i: int) -> tuple[str, ...]:
    return ("-m", "comment", "--comment", f"key {key} owner {i}", "-j", f"KUBE-SVC-{i}")


def matches(space: KeySpace, args: tuple[str, ...], key: int) -> bool:
    """Whether a dispatch rule's match (its -d prefix, or -p/--dport) covers ``key``."""
    if space.kind == "port":
        proto = args[args.index("-p") + 1]
        if (key >> 16) != ("tcp", "udp", "sctp").index(proto) + 1:
            return False
        if "--dport" not in args:
            return True
        low, _, high = args[args.index("--dport") + 1].partition(":")
        return int(low) <= key & 0xFFFF <= int(high or low)
    network = ipaddress.ip_network(args[args.index("-d") + 1])
    return ipaddress.ip_address(key) in network


def walk(tree: DispatchTree, chains: Chains, key: int) -> list[tuple[str, ...]]:
    """The leaf rules a packet with ``key`` meets, following jumps from the root."""
    met: list[tuple[str, ...]] = []

    def visit(chain: str) -> None:
        for args in chains[chain]:
            target = args[-1]
            if target.startswith(DISPATCH_PREFIX):
                if matches(tree.space, args, key):
                    visit(target)
            else:
                met.append(args)

    visit(tree.root_chain)
    return [a for a in met if f"key {key} " in a[3]]


keys4 = st.sampled_from(
    [int(ipaddress.ip_address(f"10.96.{a}.{b}")) for a in (0, 1, 17, 200) for b in (1, 2, 77)]
    + [int(ipaddress.ip_address(ip)) for ip in ("203.0.113.1", "198.51.100.9", "10.97.0.1")]
)
ops = st.lists(st.tuples(st.booleans(), keys4, st.integers(0, 5)), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(
    ops=ops,
    leaf=st.sampled_from([1, 2, 4, LEAF_SIZE]),
    max_depth=st.sampled_from([1, 2, MAX_DEPTH]),
)
def test_updates_end_where_a_fresh_build_would_and_walks_find_their_rules(
    ops: list[tuple[bool, int, int]], leaf: int, max_depth: int
) -> None:
    tree = DispatchTree("t", IP4, leaf, max_depth)
    chains: Chains = dict(tree.build([]))
    present: dict[tuple[int, int], tuple[str, ...]] = {}

    def check() -> None:
        """The tree is where a fresh build of what is present would be, and a walk
        finds every key's rules in order."""
        fresh = DispatchTree("t", IP4, leaf, max_depth)
        assert chains == fresh.build((k, (owner(i), 0), r) for (k, i), r in present.items())
        assert tree.nodes == fresh.nodes
        for wanted in {k for k, _ in present}:
            expected = [present[(k, i)] for (k, i) in sorted(present) if k == wanted]
            assert walk(tree, chains, wanted) == expected

    check()
    for add, key, i in ops:
        eid = (owner(i), 0)
        removed = [(key, eid)] if (key, i) in present else []
        added = [(key, eid, rule(key, i))] if add else []
        if removed or added:
            present.pop((key, i), None)
            if add:
                present[(key, i)] = rule(key, i)
            change = tree.update(removed, added)
            for chain in change.delete:
                del chains[chain]
            chains.update(change.write)
        check()


def test_chains_stay_short_at_scale() -> None:
    tree = DispatchTree("t", IP4)
    entries = []
    for n in range(30000):
        ip = int(ipaddress.ip_address("10.96.0.0")) + (n * 2654435761) % (1 << 20)
        entries.append((ip, (owner(n % 1000), n), ("-j", "KUBE-SVC-X")))
    chains = tree.build(entries)
    assert max(len(rules) for rules in chains.values()) <= LEAF_SIZE

    def depth(prefix: tuple[int, int]) -> int:
        children = tree.nodes[prefix].children
        return 1 + max((depth(c) for c in children), default=0)

    # 30,000 keys in a /12: root, /16, /20, /24-ish levels, then leaves.
    assert depth((0, 0)) <= 5


def test_ipv6_service_range_is_not_a_chain_of_single_children() -> None:
    tree = DispatchTree("t", IP6, leaf_size=2)
    base = int(ipaddress.ip_address("fd00:10:96::"))
    chains = tree.build((base + i, (owner(i), 0), ("-j", "X")) for i in range(40))
    # 40 keys under a /112: the root splits at once at /124 (three groups), each group
    # into its keys; no intermediate /4../120 nodes.
    assert len(chains) == 1 + 3 + 40
    assert all(len(n.children) != 1 for n in tree.nodes.values())


def test_port_tree_splits_by_protocol_then_port_range() -> None:
    tree = DispatchTree("t", PORTS, leaf_size=1)
    entries = [
        (port_key(proto, port), (owner(port), 0), ("-j", f"{proto}{port}"))
        for proto in ("tcp", "udp")
        for port in (30001, 30002, 31000)
    ]
    chains = tree.build(entries)
    root = chains[tree.root_chain]
    assert [r[:2] for r in root] == [("-p", "tcp"), ("-p", "udp")]
    ranges = {
        args[args.index("--dport") + 1]
        for rules in chains.values()
        for args in rules
        if "--dport" in args
    }
    assert "30001" in ranges and "31000" in ranges
    for key, _, args in entries:
        assert walk_ports(tree, chains, key) == [args]


def walk_ports(tree: DispatchTree, chains: Chains, key: int) -> list[tuple[str, ...]]:
    met: list[tuple[str, ...]] = []

    def visit(chain: str) -> None:
        for args in chains[chain]:
            if args[-1].startswith(DISPATCH_PREFIX):
                if matches(tree.space, args, key):
                    visit(args[-1])
            else:
                met.append(args)

    visit(tree.root_chain)
    proto = ("tcp", "udp", "sctp")[(key >> 16) - 1]
    return [a for a in met if a[-1] == f"{proto}{key & 0xFFFF}"]


def test_crafted_addresses_cannot_make_the_tree_deeper_than_iptables_allows() -> None:
    # Addresses that differ one 4-bit level further down each (a user can choose
    # external IPs like these): every level splits off one key and goes on.
    keys = [1 << (124 - 4 * level) for level in range(31)]

    def deepest(max_depth: int) -> int:
        tree = DispatchTree("t", IP6, leaf_size=1, max_depth=max_depth)
        tree.build((k, (owner(0), i), ("-j", "X")) for i, k in enumerate(keys))
        return max(tree.depths.values())

    assert deepest(100) > MAX_DEPTH  # what the cap prevents
    assert deepest(MAX_DEPTH) == MAX_DEPTH
