"""Dispatch trees: upstream's long per-Service chains as a prefix tree of short ones.

Upstream's iptables mode puts one rule per Service destination into ``KUBE-SERVICES``;
the kernel walks it linearly for every new connection (first-packet latency grows with
the number of Services) and every sync rewrites it whole (partial syncs grow with the
cluster). Here the same rules live in the leaves of a tree keyed by destination: an
address (``-d``) or a protocol and port (``-p tcp --dport``). A leaf holds at most
:data:`LEAF_SIZE` distinct keys; an inner node has up to 16 children, one per group of
keys that agree on the next 4 bits after their common prefix, each matched by its
prefix (``-d 10.96.48.0/20 -j KUBE-SVC-DS-...``). A packet walks a few short chains instead
of one long one; a change rewrites only the chains on its key's path.

The tree is a pure function of its set of entries (no history): a node's chain is named
after its prefix, a node covering at most :data:`LEAF_SIZE` keys is a leaf, an inner
node splits at the first 4-bit boundary where its keys differ, and each child's prefix
is the longest boundary-aligned prefix its keys share (so a run of single-child levels
never exists, which keeps IPv6 trees shallow). :meth:`DispatchTree.update` therefore
ends exactly where :meth:`DispatchTree.build` would, which the tests check.

Rules for one key keep their order (by owner ServicePort name, then their order within
the owner): when two ServicePorts claim one destination, the first by name wins, as in
nftables mode.
"""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kubeproxy.backends.iptables.names import dispatch_chain
from kubeproxy.model.types import ServicePortName

LEAF_SIZE = 16
# Levels of dispatch chains below a tree's root at most: iptables-nft refuses more than 15
# jumps below a built-in chain, and a path is also KUBE-SERVICES, KUBE-FW-, KUBE-EXT-,
# KUBE-SVC- and KUBE-SEP-; deliberately crafted external IPs could otherwise force a
# deep IPv6 tree. A node this deep is a leaf, however many keys it holds.
MAX_DEPTH = 6
PROTOCOLS = ("tcp", "udp", "sctp")

Args = tuple[str, ...]
Prefix = tuple[int, int]  # (key with the bits below the prefix cleared, prefix length)
EntryId = tuple[ServicePortName, int]  # owner, and the rule's position within the owner


@dataclass(frozen=True, slots=True)
class KeySpace:
    """What a tree's keys are and how a prefix of them is matched.

    ``boundaries``: the prefix lengths a node may have (ascending, 0 and ``width``
    included); the first split of a port tree is on the 2 protocol bits.
    """

    kind: str  # "ip4", "ip6", "port"
    width: int
    boundaries: tuple[int, ...]

    def match(self, prefix: Prefix) -> Args:
        value, length = prefix
        if self.kind == "port":
            proto = PROTOCOLS[(value >> 16) - 1]
            if length <= 2:
                return ("-p", proto)
            low = value & 0xFFFF
            high = low + (1 << (self.width - length)) - 1
            ports = str(low) if low == high else f"{low}:{high}"
            return ("-p", proto, "-m", proto, "--dport", ports)
        network: ipaddress.IPv4Network | ipaddress.IPv6Network
        if self.kind == "ip4":
            network = ipaddress.IPv4Network((value, length))
        else:
            network = ipaddress.IPv6Network((value, length))
        return ("-d", str(network))

    def describe(self, prefix: Prefix) -> str:
        return " ".join(a for a in self.match(prefix) if not a.startswith("-"))


IP4 = KeySpace("ip4", 32, tuple(range(0, 33, 4)))
IP6 = KeySpace("ip6", 128, tuple(range(0, 129, 4)))
PORTS = KeySpace("port", 18, (0, 2, 6, 10, 14, 18))


def ip_key(ip: str) -> int:
    return int(ipaddress.ip_address(ip))


def port_key(protocol: str, port: int) -> int:
    return (PROTOCOLS.index(protocol) + 1) << 16 | port


@dataclass(frozen=True, slots=True)
class Node:
    chain: str
    rules: tuple[Args, ...]
    children: tuple[Prefix, ...] = ()


@dataclass
class TreeChange:
    """What one update changes: node chains to (re)write, chains to delete."""

    write: dict[str, tuple[Args, ...]] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)


ROOT: Prefix = (0, 0)


class DispatchTree:
    """One tree (e.g. the ClusterIPs of the nat table's KUBE-SERVICES, per family)."""

    def __init__(
        self,
        tree_id: str,
        space: KeySpace,
        leaf_size: int = LEAF_SIZE,
        max_depth: int = MAX_DEPTH,
    ) -> None:
        self.tree_id = tree_id
        self.space = space
        self.leaf_size = leaf_size
        self.max_depth = max_depth
        self.keys: list[int] = []  # distinct keys, sorted
        self.entries: dict[int, dict[EntryId, Args]] = {}
        self.nodes: dict[Prefix, Node] = {}  # as programmed
        self.depths: dict[Prefix, int] = {}  # levels below the root, as programmed
        self.rule_count = 0  # rules in all node chains (kept up to date)

    @property
    def root_chain(self) -> str:
        return self.chain(ROOT)

    def chain(self, prefix: Prefix) -> str:
        return dispatch_chain(self.tree_id, f"{prefix[0]:x}/{prefix[1]}")

    # ---------------------------------------------------------------- entries

    def _add(self, key: int, eid: EntryId, args: Args) -> None:
        bucket = self.entries.get(key)
        if bucket is None:
            bucket = self.entries[key] = {}
            bisect.insort(self.keys, key)
        bucket[eid] = args

    def _remove(self, key: int, eid: EntryId) -> None:
        bucket = self.entries[key]
        del bucket[eid]
        if not bucket:
            del self.entries[key]
            del self.keys[bisect.bisect_left(self.keys, key)]

    # ------------------------------------------------------------------ shape

    def _range(self, prefix: Prefix) -> tuple[int, int]:
        value, length = prefix
        end = value + (1 << (self.space.width - length))
        return bisect.bisect_left(self.keys, value), bisect.bisect_left(self.keys, end)

    def _prefix_of(self, first: int, last: int, at_least: int) -> Prefix:
        """The longest boundary-aligned prefix two keys (and all between) share."""
        width = self.space.width
        common = width - (first ^ last).bit_length()
        length = max(b for b in self.space.boundaries if b <= common)
        length = max(length, at_least)
        shift = width - length
        return ((first >> shift) << shift if shift < width else 0, length)

    def _node(self, prefix: Prefix, depth: int) -> Node:
        if not self.keys:
            return Node(self.chain(prefix), ())
        lo, hi = self._range(prefix)
        keys = self.keys
        if hi - lo <= self.leaf_size or keys[lo] == keys[hi - 1] or depth >= self.max_depth:
            rules: list[Args] = []
            for key in keys[lo:hi]:
                bucket = self.entries[key]
                rules.extend(bucket[eid] for eid in sorted(bucket))
            return Node(self.chain(prefix), tuple(rules))
        width = self.space.width
        common = width - (keys[lo] ^ keys[hi - 1]).bit_length()
        split = min(b for b in self.space.boundaries if b > common)
        shift = width - split
        children: list[Prefix] = []
        i = lo
        while i < hi:
            group = keys[i] >> shift
            j = bisect.bisect_left(keys, (group + 1) << shift, i, hi)
            children.append(self._prefix_of(keys[i], keys[j - 1], split))
            i = j
        rules = [(*self.space.match(c), "-j", self.chain(c)) for c in children]
        return Node(self.chain(prefix), tuple(rules), tuple(children))

    def _covers(self, prefix: Prefix, keys: list[int]) -> bool:
        value, length = prefix
        end = value + (1 << (self.space.width - length))
        i = bisect.bisect_left(keys, value)
        return i < len(keys) and keys[i] < end

    # ------------------------------------------------------------------ build

    def build(self, entries: Iterable[tuple[int, EntryId, Args]]) -> dict[str, tuple[Args, ...]]:
        """Start over from ``entries``; every node chain with its rules."""
        self.keys = []
        self.entries = {}
        for key, eid, args in entries:
            bucket = self.entries.setdefault(key, {})
            bucket[eid] = args
        self.keys = sorted(self.entries)
        self.nodes = {}
        self.depths = {}
        stack = [(ROOT, 0)]
        while stack:
            prefix, depth = stack.pop()
            node = self._node(prefix, depth)
            self.nodes[prefix] = node
            self.depths[prefix] = depth
            stack.extend((c, depth + 1) for c in node.children)
        self.rule_count = sum(len(n.rules) for n in self.nodes.values())
        return {n.chain: n.rules for n in self.nodes.values()}

    def update(
        self,
        removed: Iterable[tuple[int, EntryId]],
        added: Iterable[tuple[int, EntryId, Args]],
    ) -> TreeChange:
        """Apply entry changes; the chains that must be written or deleted.

        Only nodes whose prefix covers a changed key can change; below them, a child
        covering no changed key is the same subtree as before (its content depends only
        on the keys under it). Old nodes no longer reachable are deleted, except those
        that moved under a new parent.
        """
        changed: set[int] = set()
        for key, eid in removed:
            self._remove(key, eid)
            changed.add(key)
        for key, eid, args in added:
            self._add(key, eid, args)
            changed.add(key)
        change = TreeChange()
        if not changed:
            return change
        changed_keys = sorted(changed)
        new: dict[Prefix, Node] = {}
        new_depths: dict[Prefix, int] = {}
        kept: set[Prefix] = set()  # existing subtrees reused as they are
        stack = [(ROOT, 0)]
        while stack:
            prefix, depth = stack.pop()
            node = self._node(prefix, depth)
            new[prefix] = node
            new_depths[prefix] = depth
            for child in node.children:
                if child in new:
                    continue
                # A subtree depends only on its keys and its depth (MAX_DEPTH).
                if (
                    child in self.nodes
                    and self.depths.get(child) == depth + 1
                    and not self._covers(child, changed_keys)
                ):
                    kept.add(child)
                else:
                    stack.append((child, depth + 1))
        gone: list[Prefix] = []
        seen: set[Prefix] = set()
        for prefix in new:
            old = self.nodes.get(prefix)
            for child in old.children if old is not None else ():
                self._collect_gone(child, new, kept, gone, seen)
        for prefix, node in new.items():
            old_node = self.nodes.get(prefix)
            if old_node != node:
                change.write[node.chain] = node.rules
                self.rule_count += len(node.rules) - (len(old_node.rules) if old_node else 0)
            self.nodes[prefix] = node
            self.depths[prefix] = new_depths[prefix]
        for prefix in gone:
            self.depths.pop(prefix, None)
            old_node = self.nodes.pop(prefix)
            self.rule_count -= len(old_node.rules)
            change.delete.append(old_node.chain)
        return change

    def _collect_gone(
        self,
        prefix: Prefix,
        new: Mapping[Prefix, Node],
        kept: set[Prefix],
        gone: list[Prefix],
        seen: set[Prefix],
    ) -> None:
        stack = [prefix]
        while stack:
            p = stack.pop()
            if p in new or p in kept or p in seen:
                continue
            seen.add(p)
            gone.append(p)
            old = self.nodes.get(p)
            if old is not None:
                stack.extend(old.children)
