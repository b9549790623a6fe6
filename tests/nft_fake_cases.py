"""Transactions and what nftables does with them: the cases both the fake's unit tests
and its kernel comparison run.

A :class:`Case` is a sequence of steps, each a transaction applied to an empty ruleset
in order. A step is accepted or refused (``error``: a piece of the fake's message);
``kernel_accepts`` marks the few places where the fake is deliberately stricter than
the kernel (see :mod:`kubeproxy.dataplane.nftables.fake`): the kernel test checks that
the kernel does accept them, so the note stays true. Such a step ends its case, since
the two states differ afterwards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hypothesis import strategies as st

from kubeproxy.dataplane.nftables.fake import FakeNftables
from kubeproxy.dataplane.nftables.transaction import (
    AddChain,
    AddElements,
    AddSet,
    AddTable,
    BaseChain,
    Chain,
    DefineTable,
    DeleteChain,
    DeleteElements,
    DeleteSet,
    DeleteTable,
    Element,
    FlushChain,
    FlushSet,
    FlushTable,
    Operation,
    Set,
    Table,
    TableRef,
    Transaction,
)

T = TableRef("ip", "t")
T6 = TableRef("ip6", "t6")

ENOENT = "No such file or directory"
EEXIST = "File exists"
EBUSY = "Device or resource busy"
EOPNOTSUPP = "Operation not supported"

ADDR_PORT_MAP = "ipv4_addr . inet_proto . inet_service : verdict"
FIREWALL = "ipv4_addr . inet_proto . inet_service . ipv4_addr"
# The backends map of the nftables backend: nft 1.0.6 cannot read its type back.
BACKENDS = "typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport"
DNAT = "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @backends"


@dataclass(frozen=True)
class Step:
    tx: Transaction
    error: str | None = None  # None: accepted
    kernel_accepts: str | None = None  # why the fake refuses what the kernel accepts
    kernel_error: str | None = None  # the kernel's wording, where it differs from error


@dataclass(frozen=True)
class Case:
    name: str
    steps: tuple[Step, ...]

    def __str__(self) -> str:
        """A test id: the name in lower case, with dashes."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")


# ------------------------------------------------------------------------- builders


def _tx(items: tuple[Operation, ...]) -> Transaction:
    tx = Transaction()
    tx.ops.extend(items)
    return tx


def ok(*items: Operation) -> Step:
    return Step(_tx(items))


def refused(error: str, *items: Operation) -> Step:
    return Step(_tx(items), error)


def refused_as(error: str, kernel_error: str, *items: Operation) -> Step:
    return Step(_tx(items), error, kernel_error=kernel_error)


def stricter(reason: str, error: str, *items: Operation) -> Step:
    return Step(_tx(items), error, reason)


def case(name: str, *steps: Step) -> Case:
    return Case(name, steps)


def base(hook: str = "input", priority: str = "0", type: str = "filter") -> BaseChain:
    return BaseChain(type, hook, priority)


def chain(name: str, *rules: str, base: BaseChain | None = None, t: TableRef = T) -> AddChain:
    return AddChain(t, name, rules, base)


def add_set(
    name: str,
    type: str,
    *flags: str,
    timeout: int | None = None,
    comment: str | None = None,
    t: TableRef = T,
) -> AddSet:
    keyword = "map" if " : " in type else "set"
    return AddSet(t, Set(name, type, flags, comment=comment, keyword=keyword, timeout=timeout))


def _element(item: str) -> tuple[str, str | None]:
    key, sep, value = item.partition(" : ")
    return (key, value) if sep else (key, None)


def elems(name: str, *items: str, t: TableRef = T) -> AddElements:
    """Elements as nft writes them: ``key`` or ``key : value``."""
    return AddElements(t, name, tuple(_element(i) for i in items))


def delete_elems(name: str, *keys: str, t: TableRef = T) -> DeleteElements:
    return DeleteElements(t, name, keys)


def define(*parts: Chain | Set, t: TableRef = T, comment: str | None = None) -> DefineTable:
    return DefineTable(
        Table(
            t.family,
            t.name,
            comment,
            [p for p in parts if isinstance(p, Chain)],
            [p for p in parts if isinstance(p, Set)],
        )
    )


def dset(name: str, type: str, *items: str, flags: tuple[str, ...] = ()) -> Set:
    """A set or map for a declarative table, with elements."""
    keyword = "map" if " : " in type else "set"
    return Set(name, type, flags, [_element(i) for i in items], keyword=keyword)


# A small table most cases start from: a verdict map pointing at chain "x", a set used by
# chain "c", a base chain using both.
SETUP = ok(
    define(
        dset("s", "ipv4_addr", "1.1.1.1"),
        dset("m", ADDR_PORT_MAP, "10.96.0.1 . tcp . 80 : goto x"),
        Chain("x", ["counter"]),
        Chain("c", ["ip saddr @s drop", "counter"]),
        Chain("in", ["ip daddr . meta l4proto . th dport vmap @m"], base("input", "-110")),
    )
)

# ---------------------------------------------------------------------------- cases

TABLES = [
    case(
        "add table twice is a no-op; the first comment stays",
        ok(AddTable(T, "first"), AddTable(T)),
        ok(AddTable(T, "second")),
    ),
    case(
        "comments of tables, chains and sets are set at creation only",
        ok(
            define(
                Set("s", "ipv4_addr", comment="set 1"),
                Chain("c", comment="chain 1"),
                comment="table 1",
            )
        ),
        ok(
            define(
                Set("s", "ipv4_addr", comment="set 2"),
                Chain("c", comment="chain 2"),
                comment="table 2",
            ),
            add_set("s", "ipv4_addr", comment="set 3"),
        ),
    ),
    case("delete a missing table", refused(ENOENT, DeleteTable(T))),
    case("flush a missing table", refused(ENOENT, FlushTable(T))),
    case("add a chain to a missing table", refused(ENOENT, chain("a"))),
    case("add a set to a missing table", refused(ENOENT, add_set("s", "ipv4_addr"))),
    case("add elements to a missing set", ok(AddTable(T)), refused(ENOENT, elems("s", "1.1.1.1"))),
    case(
        "flush table removes rules only; sets keep their elements",
        SETUP,
        ok(FlushTable(T)),
    ),
    case(
        "delete table removes everything",
        SETUP,
        ok(DeleteTable(T)),
        ok(AddTable(T)),
    ),
    case(
        "delete a table and define it again in one batch",
        SETUP,
        ok(AddTable(T), DeleteTable(T), SETUP.tx.ops[0]),
    ),
    case(
        "declarative table on an existing one appends rules and adds what is missing",
        SETUP,
        ok(
            define(
                dset("s", "ipv4_addr", "1.1.1.2"),
                dset("new", "ipv4_addr", "2.2.2.2"),
                Chain("c", ["counter"]),
                Chain("y", ["jump x"]),
            )
        ),
    ),
    case(
        "declarative table: rules and map elements may refer to anything in the block",
        ok(
            define(
                Chain("a", ["jump b", "ip saddr @later drop"]),
                dset("m", "ipv4_addr : verdict", "1.2.3.4 : goto b"),
                Chain("b"),
                dset("later", "ipv4_addr"),
            )
        ),
    ),
    case(
        "declarative table with a different set type",
        SETUP,
        refused(EEXIST, define(dset("s", "ipv6_addr"))),
    ),
    case(
        "declarative table with a different base chain",
        SETUP,
        refused(EOPNOTSUPP, define(Chain("in", [], base("input", "0")))),
    ),
    case(
        "a failure in the last operation leaves nothing behind",
        ok(AddTable(T)),
        refused(
            ENOENT,
            *SETUP.tx.ops,
            chain("more", "counter"),
            elems("s", "9.9.9.9"),
            DeleteChain(T, "nope"),
        ),
    ),
]

CHAINS = [
    case(
        "add chain on an existing chain appends its rules",
        ok(AddTable(T), chain("a", "counter")),
        ok(chain("a", "counter", "counter"), chain("a")),
    ),
    case("jump to a missing chain", ok(AddTable(T)), refused(ENOENT, chain("a", "jump b"))),
    case(
        "jump to a chain created later in the batch",
        ok(AddTable(T)),
        refused(ENOENT, chain("a", "jump b"), chain("b")),
    ),
    case(
        "jump inside an anonymous verdict map to a missing chain",
        ok(AddTable(T), chain("b")),
        refused(ENOENT, chain("a", "numgen random mod 2 vmap { 0 : goto b, 1 : goto c }")),
    ),
    case("jump to a base chain", SETUP, refused(EOPNOTSUPP, chain("a", "jump in"))),
    case("delete a missing chain", ok(AddTable(T)), refused(ENOENT, DeleteChain(T, "a"))),
    case("flush a missing chain", ok(AddTable(T)), refused(ENOENT, FlushChain(T, "a"))),
    case(
        "delete a chain still jumped to",
        ok(AddTable(T), chain("b"), chain("a", "jump b")),
        refused(EBUSY, DeleteChain(T, "b")),
    ),
    case(
        "delete a chain still used by a verdict map element",
        SETUP,
        refused(EBUSY, DeleteChain(T, "x")),
    ),
    case(
        "delete a chain whose rule was flushed earlier in the batch",
        ok(AddTable(T), chain("b"), chain("a", "jump b")),
        ok(FlushChain(T, "a"), DeleteChain(T, "b")),
    ),
    case(
        "delete chains after flush table",
        SETUP,
        ok(FlushTable(T), FlushSet(T, "map", "m"), DeleteChain(T, "x"), DeleteChain(T, "c")),
    ),
    case(
        "delete the jumping chain, then its target",
        ok(AddTable(T), chain("b"), chain("a", "jump b")),
        ok(DeleteChain(T, "a"), DeleteChain(T, "b")),
    ),
    case(
        "a reference removed later in the batch does not help",
        ok(AddTable(T), chain("b"), chain("a", "jump b")),
        refused(EBUSY, DeleteChain(T, "b"), DeleteChain(T, "a")),
    ),
    case(
        "delete a chain after deleting the map element using it",
        SETUP,
        ok(delete_elems("m", "10.96.0.1 . tcp . 80"), DeleteChain(T, "x")),
    ),
    case(
        "delete a chain after flushing the map using it",
        SETUP,
        ok(FlushSet(T, "map", "m"), DeleteChain(T, "x")),
    ),
    case(
        "delete a chain that still has rules",
        SETUP,
        ok(DeleteChain(T, "c")),
    ),
    case(
        "delete a chain that jumps to itself",
        ok(AddTable(T), chain("a"), chain("a", "jump a")),
        refused(EBUSY, DeleteChain(T, "a")),
    ),
    case(
        "jump to a chain deleted earlier in the batch",
        ok(AddTable(T), chain("b")),
        refused(ENOENT, DeleteChain(T, "b"), chain("a", "goto b")),
    ),
    case(
        "delete a chain and re-create it in one batch",
        SETUP,
        ok(FlushSet(T, "map", "m"), DeleteChain(T, "x"), chain("x", "drop")),
    ),
    case(
        "base chains: same spec, or no spec, is fine; priority names count as numbers",
        ok(
            AddTable(T),
            chain("n", base=base("prerouting", "dstnat", "nat")),
            chain("f", base=base("output", "-110")),
        ),
        ok(
            chain("n", base=base("prerouting", "-100", "nat")),
            chain("f", base=base("output", "filter - 110")),
            chain("f", "counter"),
        ),
    ),
    case(
        "base chain with another priority",
        ok(AddTable(T), chain("f", base=base("input", "-110"))),
        refused(EOPNOTSUPP, chain("f", base=base("input", "-100"))),
    ),
    case(
        "base chain with another hook",
        ok(AddTable(T), chain("f", base=base("input", "-110"))),
        refused(EOPNOTSUPP, chain("f", base=base("output", "-110"))),
    ),
    case(
        "base chain with another type",
        ok(AddTable(T), chain("f", base=base("output", "-100"))),
        refused(EEXIST, chain("f", base=base("output", "-100", "nat"))),
    ),
    case(
        "a hook for a regular chain",
        ok(AddTable(T), chain("f")),
        refused(EOPNOTSUPP, chain("f", base=base("input", "0"))),
    ),
]

SETS = [
    case(
        "add set again with the same definition",
        ok(
            AddTable(T),
            add_set("s", "ipv4_addr", comment="first"),
            add_set("d", "ipv4_addr", "dynamic", "timeout", timeout=60),
            add_set("m", ADDR_PORT_MAP),
        ),
        ok(
            add_set("s", "typeof ip daddr", comment="second"),
            add_set("d", "ipv4_addr", "timeout", "dynamic", timeout=60),
            add_set("m", ADDR_PORT_MAP),
        ),
    ),
    case(
        "add set with another type",
        ok(AddTable(T), add_set("s", "ipv4_addr")),
        refused(EEXIST, add_set("s", "ipv6_addr")),
    ),
    case(
        "add set with other flags",
        ok(AddTable(T), add_set("s", "ipv4_addr")),
        refused(EEXIST, add_set("s", "ipv4_addr", "interval")),
    ),
    case(
        "add a map over a set",
        ok(AddTable(T), add_set("s", "ipv4_addr")),
        refused(EEXIST, add_set("s", "ipv4_addr : verdict")),
    ),
    case(
        "add a map with another data type",
        ok(AddTable(T), add_set("m", "ipv4_addr : verdict")),
        refused(EEXIST, add_set("m", "ipv4_addr : ipv4_addr")),
    ),
    case(
        "add set with another timeout",
        ok(AddTable(T), add_set("d", "ipv4_addr", "dynamic", "timeout", timeout=60)),
        stricter(
            "the kernel keeps the old timeout without a word",
            EEXIST,
            add_set("d", "ipv4_addr", "dynamic", "timeout", timeout=30),
        ),
    ),
    case("delete a set used by a rule", SETUP, refused(EBUSY, DeleteSet(T, "set", "s"))),
    case("delete a map used by a rule", SETUP, refused(EBUSY, DeleteSet(T, "map", "m"))),
    case(
        "delete sets after flush table",
        SETUP,
        ok(FlushTable(T), DeleteSet(T, "set", "s"), DeleteSet(T, "map", "m")),
    ),
    case(
        "delete map works on a set (the kernel does not tell them apart)",
        ok(AddTable(T), add_set("s", "ipv4_addr")),
        ok(DeleteSet(T, "map", "s")),
    ),
    case("flush map on a set", SETUP, refused(ENOENT, FlushSet(T, "map", "s"))),
    case("flush set on a map", SETUP, refused(ENOENT, FlushSet(T, "set", "m"))),
    case("flush a missing set", ok(AddTable(T)), refused(ENOENT, FlushSet(T, "set", "s"))),
    case("delete a missing set", ok(AddTable(T)), refused(ENOENT, DeleteSet(T, "set", "s"))),
    case(
        "a rule using a missing set",
        ok(AddTable(T), add_set("s", "ipv4_addr")),
        refused(ENOENT, define(Chain("a", ["ip saddr @nope drop"]))),
    ),
    case(
        "a rule using a set deleted earlier in the batch",
        ok(AddTable(T), add_set("s", "ipv4_addr")),
        refused(ENOENT, DeleteSet(T, "set", "s"), define(Chain("a", ["ip saddr @s drop"]))),
    ),
    case(
        "dynamic sets: flush, and delete once no rule uses them",
        ok(
            AddTable(T),
            add_set("aff", "ipv4_addr", "dynamic", "timeout", timeout=10800),
            chain("a", "update @aff { ip saddr }"),
        ),
        ok(FlushSet(T, "set", "aff")),
        refused(EBUSY, DeleteSet(T, "set", "aff")),
        ok(FlushChain(T, "a"), DeleteSet(T, "set", "aff")),
    ),
]

ELEMENTS = [
    case(
        "adding an element again with the same value",
        SETUP,
        ok(elems("m", "10.96.0.1 . tcp . 80 : goto x", "10.96.0.1 . 6 . 80 : goto x")),
        ok(elems("s", "1.1.1.1", "2.2.2.2", "2.2.2.2")),
    ),
    case(
        "adding an element with another value",
        SETUP,
        refused(EEXIST, elems("m", "10.96.0.1 . tcp . 80 : drop")),
    ),
    case(
        "two values for one key in one command",
        SETUP,
        refused(EEXIST, elems("m", "10.96.0.2 . tcp . 80 : drop", "10.96.0.2 . tcp . 80 : accept")),
    ),
    case(
        "every verdict",
        SETUP,
        ok(
            elems(
                "m",
                "10.96.0.3 . udp . 53 : jump x",
                "10.96.0.3 . tcp . 1 : drop",
                "10.96.0.3 . tcp . 2 : accept",
                "10.96.0.3 . tcp . 3 : return",
                "10.96.0.3 . sctp . 4 : continue",
            )
        ),
    ),
    case(
        "element comments: adding the key again keeps the first, deleting needs no comment",
        SETUP,
        ok(elems("m", '10.96.0.9 . tcp . 80 comment "ns/a:http" : goto x')),
        ok(elems("m", '10.96.0.9 . tcp . 80 comment "ns/b:http" : goto x')),
        ok(elems("s", '3.3.3.3 comment "a\\b"', '4.4.4.4 comment "' + "x" * 128 + '"')),
        ok(delete_elems("m", "10.96.0.9 . tcp . 80")),
        ok(elems("m", '10.96.0.9 . tcp . 80 comment "ns/c:http" : drop')),
        ok(delete_elems("s", '3.3.3.3 comment "another"')),
    ),
    case(
        "an element comment over 128 bytes",
        SETUP,
        refused("comment too long", elems("s", '5.5.5.5 comment "' + "x" * 129 + '"')),
    ),
    case("deleting a missing element", SETUP, refused(ENOENT, delete_elems("s", "9.9.9.9"))),
    case(
        "deleting one element twice in one command",
        SETUP,
        refused(ENOENT, delete_elems("s", "1.1.1.1", "1.1.1.1")),
    ),
    case(
        "deleting by an equivalent spelling",
        SETUP,
        ok(delete_elems("m", "10.96.0.1 . 6 . 80")),
    ),
    case(
        "deleting and re-adding an element in one batch",
        SETUP,
        ok(delete_elems("m", "10.96.0.1 . tcp . 80"), elems("m", "10.96.0.1 . tcp . 80 : drop")),
    ),
    case("a value for a set element", SETUP, refused("not a map", elems("s", "2.2.2.2 : drop"))),
    case(
        "a map element without value",
        SETUP,
        refused("Invalid argument", elems("m", "1.2.3.4 . tcp . 80")),
    ),
    case("an IPv6 address in an IPv4 set", SETUP, refused("Address family", elems("s", "fd00::1"))),
    case(
        "a port out of range",
        SETUP,
        refused("Service out of range", elems("m", "1.2.3.4 . tcp . 70000 : drop")),
    ),
    case(
        "a protocol out of range",
        SETUP,
        refused("Protocol out of range", elems("m", "1.2.3.4 . 300 . 80 : drop")),
    ),
    case(
        "an unknown protocol", SETUP, refused("protocol", elems("m", "1.2.3.4 . foo . 80 : drop"))
    ),
    case(
        "a key with too few parts",
        SETUP,
        refused("datatype mismatch", elems("m", "1.2.3.4 . tcp : drop")),
    ),
    case(
        "a prefix without flags interval",
        SETUP,
        refused("flags interval", elems("s", "10.0.0.0/8")),
    ),
    case(
        "a full-length prefix without flags interval",
        SETUP,
        refused("flags interval", delete_elems("s", "1.1.1.1/32")),
    ),
    case(
        "a range without flags interval",
        SETUP,
        refused("flags interval", elems("s", "10.0.0.1-10.0.0.5")),
    ),
    case(
        "a verdict to a missing chain",
        SETUP,
        refused(ENOENT, elems("m", "1.2.3.4 . tcp . 80 : goto nope")),
    ),
    case(
        "a verdict to a base chain",
        SETUP,
        refused(EOPNOTSUPP, elems("m", "1.2.3.4 . tcp . 80 : jump in")),
    ),
    case(
        "typeof maps: integer and concatenated values",
        ok(AddTable(T), add_set("backends", BACKENDS)),
        ok(
            elems(
                "backends",
                "10.96.0.1 . tcp . 80 . 0 : 10.244.1.10 . 8080",
                "10.96.0.1 . tcp . 80 . 65536 : 10.244.1.11 . 8080",
            )
        ),
        refused(
            "exceeds valid range",
            elems("backends", "10.96.0.1 . tcp . 80 . 4294967296 : 10.244.1.10 . 8080"),
        ),
        refused("Address family", elems("backends", "10.96.0.1 . tcp . 80 . 1 : fd00::1 . 8080")),
    ),
    case(
        "IPv6 sets: canonical spelling",
        ok(
            AddTable(T6),
            add_set("s6", "ipv6_addr", t=T6),
            add_set("i6", "ipv6_addr", "interval", t=T6),
        ),
        ok(
            elems("s6", "FD00:0:0:0::1", "fd00::1", t=T6),
            elems("i6", "fd00:1::5/64", "fd00:2::1", t=T6),
        ),
        ok(delete_elems("s6", "fd00::1", t=T6), delete_elems("i6", "fd00:1::/64", t=T6)),
        refused("Address family", elems("s6", "10.0.0.1", t=T6)),
    ),
]

INTERVALS = [
    case(
        "overlapping intervals in one command",
        ok(AddTable(T), add_set("i", "ipv4_addr", "interval")),
        refused("conflicting intervals", elems("i", "10.96.0.0/28", "10.96.0.0/24")),
    ),
    case(
        "overlapping intervals in two commands of one batch",
        ok(AddTable(T), add_set("i", "ipv4_addr", "interval")),
        refused("conflicting intervals", elems("i", "10.96.0.0/24"), elems("i", "10.96.0.5")),
    ),
    case(
        "intervals overlapping existing ones: subset, superset, single address",
        ok(AddTable(T), add_set("i", "ipv4_addr", "interval"), elems("i", "10.96.0.0/24")),
        refused("overlaps with an existing one", elems("i", "10.96.0.0/28")),
        refused("overlaps with an existing one", elems("i", "10.0.0.0/8")),
        refused("overlaps with an existing one", elems("i", "10.96.0.7")),
        refused("overlaps with an existing one", elems("i", "10.96.0.200-10.96.1.5")),
    ),
    case(
        "intervals: identical, adjacent, host bits, ranges",
        ok(AddTable(T), add_set("i", "ipv4_addr", "interval"), elems("i", "10.96.0.0/24")),
        ok(
            elems("i", "10.96.0.0/24", "10.96.0.1/24", "10.96.1.0/24"),
            elems("i", "10.0.0.0-10.0.0.255", "10.0.1.5-10.0.1.5", "10.0.2.1-10.0.2.2"),
        ),
    ),
    case(
        "intervals: delete needs the exact interval",
        ok(AddTable(T), add_set("i", "ipv4_addr", "interval"), elems("i", "10.96.0.0/24")),
        refused("element does not exist", delete_elems("i", "10.96.0.0/28")),
    ),
    case(
        "intervals: a deleted interval frees its space in the batch",
        ok(AddTable(T), add_set("i", "ipv4_addr", "interval"), elems("i", "10.96.0.0/24")),
        ok(delete_elems("i", "10.96.0.0/24"), elems("i", "10.96.0.0/28")),
        ok(FlushSet(T, "set", "i"), elems("i", "10.0.0.0/8"), elems("i", "10.0.0.0/8")),
    ),
    case(
        "intervals: replaced in one batch, either order",
        ok(AddTable(T), add_set("i", "ipv4_addr", "interval"), elems("i", "10.0.0.0/8")),
        ok(delete_elems("i", "10.0.0.0/8"), elems("i", "10.0.0.0/8")),
        ok(elems("i", "10.0.0.0/8"), delete_elems("i", "10.0.0.0/8")),
        ok(elems("i", "10.0.0.0/8"), elems("i", "10.0.0.0/8"), delete_elems("i", "10.0.0.0/8")),
        ok(elems("i", "10.0.0.0/8"), delete_elems("i", "10.0.0.0/8"), elems("i", "10.0.0.0/8")),
        ok(delete_elems("i", "10.0.0.0/8"), elems("i", "10.0.0.0/8"), elems("i", "10.0.0.0/8")),
        ok(
            delete_elems("i", "10.0.0.0/8"),
            elems("i", "10.1.0.0/16"),
            delete_elems("i", "10.1.0.0/16"),
        ),
    ),
    case(
        "intervals: deleted, added and deleted again in one batch",
        ok(AddTable(T), add_set("i", "ipv4_addr", "interval"), elems("i", "10.0.0.0/8")),
        refused(
            ENOENT,
            delete_elems("i", "10.0.0.0/8"),
            elems("i", "10.0.0.0/8"),
            delete_elems("i", "10.0.0.0/8"),
        ),
    ),
    case(
        "intervals: a batch that flushes the set cannot delete what was in it",
        ok(AddTable(T), add_set("i", "ipv4_addr", "interval"), elems("i", "10.0.0.0/8")),
        refused("element does not exist", delete_elems("i", "10.0.0.0/8"), FlushSet(T, "set", "i")),
        refused(
            ENOENT,
            FlushSet(T, "set", "i"),
            elems("i", "10.0.0.0/8"),
            delete_elems("i", "10.0.0.0/8"),
        ),
        ok(FlushSet(T, "set", "i"), elems("i", "10.1.0.0/16"), delete_elems("i", "10.1.0.0/16")),
        ok(elems("i", "10.0.0.0/8")),
        refused(
            ENOENT,
            elems("i", "11.1.0.0/16"),
            FlushSet(T, "set", "i"),
            elems("i", "11.0.0.0/8"),
            delete_elems("i", "11.0.0.0/8"),
        ),
        # nft leaves the overlap check to the kernel when it has not loaded the elements.
        refused_as("overlaps", EEXIST, elems("i", "10.1.0.0/16"), FlushSet(T, "set", "i")),
        ok(elems("i", "10.0.0.0/8"), delete_elems("i", "10.0.0.0/8"), FlushSet(T, "set", "i")),
        ok(elems("i", "12.0.0.0/8")),
        ok(FlushSet(T, "set", "i"), elems("i", "10.0.0.0/8"), delete_elems("i", "10.0.0.0/8")),
        ok(FlushSet(T, "set", "i"), elems("i", "10.1.0.0/16"), FlushSet(T, "set", "i")),
        ok(elems("i", "10.1.0.0/16"), delete_elems("i", "10.1.0.0/16"), FlushSet(T, "set", "i")),
        ok(
            elems("i", "10.1.0.0/16"),
            delete_elems("i", "10.1.0.0/16"),
            FlushSet(T, "set", "i"),
            elems("i", "10.1.0.0/24"),
        ),
    ),
    case(
        "a set created and flushed by one batch: elements declared with it are not checked",
        ok(AddTable(T)),
        ok(
            define(dset("m", "ipv4_addr : verdict", "1.1.1.1 : drop", "1.1.1.1 : accept")),
            define(dset("m", "ipv4_addr : verdict", "1.1.1.2 : drop")),
            elems("m", "1.1.1.1 : accept"),
            FlushSet(T, "map", "m"),
            elems("m", "1.1.1.3 : drop"),
        ),
        refused(
            ENOENT,
            define(dset("n", "ipv4_addr : verdict")),
            elems("n", "1.1.1.2 : goto nope"),
            FlushSet(T, "map", "n"),
        ),
        refused(
            ENOENT,
            define(dset("n", "ipv4_addr : verdict")),
            define(dset("n", "ipv4_addr : verdict", "1.1.1.2 : goto nope")),
            FlushSet(T, "map", "n"),
        ),
        refused(
            EEXIST,
            define(dset("n", "ipv4_addr : verdict", "1.1.1.1 : drop")),
            FlushSet(T, "map", "n"),
            elems("n", "1.1.1.1 : drop", "1.1.1.1 : accept"),
        ),
        refused(
            EEXIST,
            define(dset("m", "ipv4_addr : verdict", "1.1.1.3 : accept")),
            FlushSet(T, "map", "m"),
        ),
    ),
    case(
        "other sets: delete elements and flush in one batch",
        SETUP,
        ok(
            add_set("f", FIREWALL, "interval"),
            elems("f", "1.2.3.4 . tcp . 80 . 10.0.0.0/8"),
        ),
        ok(
            delete_elems("s", "1.1.1.1"),
            FlushSet(T, "set", "s"),
            delete_elems("f", "1.2.3.4 . tcp . 80 . 10.0.0.0/8"),
            FlushSet(T, "set", "f"),
        ),
    ),
    case(
        "intervals: re-added, deleted, and a part of it added in one batch",
        ok(AddTable(T), add_set("i", "ipv4_addr", "interval"), elems("i", "10.0.0.0/8")),
        refused(
            "interval overlaps with an existing one",
            elems("i", "10.0.0.0/8"),
            delete_elems("i", "10.0.0.0/8"),
            elems("i", "10.1.0.0/16"),
        ),
        ok(elems("i", "12.0.0.0/8"), delete_elems("i", "12.0.0.0/8"), elems("i", "12.1.0.0/16")),
        ok(elems("i", "10.0.0.0/8"), delete_elems("i", "10.0.0.0/8"), elems("i", "10.0.0.0/8")),
    ),
    case(
        "intervals: a part of an interval added and deleted, in a set of the same batch",
        refused(
            EEXIST,
            AddTable(T),
            add_set("i", "ipv4_addr", "interval"),
            elems("i", "10.0.0.0/8"),
            delete_elems("i", "10.0.0.0/8"),
            elems("i", "10.1.0.0/16"),
        ),
    ),
    case(
        "concatenated intervals overlapping in one command",
        ok(AddTable(T), add_set("f", FIREWALL, "interval")),
        refused(
            EEXIST, elems("f", "1.2.3.4 . tcp . 80 . 10.0.0.0/8", "1.2.3.4 . tcp . 80 . 10.1.2.3")
        ),
    ),
    case(
        "concatenated intervals overlapping across commands and existing elements",
        ok(
            AddTable(T),
            add_set("f", FIREWALL, "interval"),
            elems("f", "1.2.3.4 . tcp . 80 . 10.0.0.0/8"),
        ),
        refused(EEXIST, elems("f", "1.2.3.4 . tcp . 80 . 10.1.2.3")),
        refused(
            EEXIST,
            elems("f", "1.2.3.5 . tcp . 80 . 10.0.0.0/8"),
            elems("f", "1.2.3.5 . tcp . 80 . 10.0.0.1"),
        ),
        refused(EEXIST, elems("f", "1.2.3.4-1.2.3.10 . tcp . 80 . 10.1.0.0/16")),
    ),
    case(
        "concatenated intervals: identical, disjoint, and prefixes in any component",
        ok(
            AddTable(T),
            add_set("f", FIREWALL, "interval"),
            elems("f", "1.2.3.4 . tcp . 80 . 10.0.0.0/8"),
        ),
        ok(
            elems(
                "f",
                "1.2.3.4 . tcp . 80 . 10.0.0.0/8",
                "1.2.3.4 . 6 . 80 . 10.0.0.0/8",
                "1.2.3.4 . tcp . 81 . 10.1.2.3",
                "1.2.3.4 . udp . 80 . 10.1.2.3",
                "1.2.3.4 . tcp . 80 . 11.0.0.0/8",
                "1.2.4.0/24 . tcp . 80 . 12.0.0.0/8",
                "1.2.3.4 . tcp . 90-99 . 10.0.0.1-10.0.0.3",
            )
        ),
        ok(delete_elems("f", "1.2.3.4 . tcp . 81 . 10.1.2.3/32")),
    ),
    case(
        "concatenated intervals: delete then add an overlapping element in one batch",
        ok(
            AddTable(T),
            add_set("f", FIREWALL, "interval"),
            elems("f", "1.2.3.4 . tcp . 80 . 10.0.0.0/8"),
        ),
        ok(
            delete_elems("f", "1.2.3.4 . tcp . 80 . 10.0.0.0/8"),
            elems("f", "1.2.3.4 . tcp . 80 . 10.1.2.3"),
        ),
    ),
    case(
        "concatenated intervals: a superset of an existing element",
        ok(
            AddTable(T),
            add_set("f", FIREWALL, "interval"),
            elems("f", "1.2.3.4 . tcp . 80 . 10.0.0.0/8"),
        ),
        stricter(
            "the kernel checks only whether the new start or end falls inside an element",
            EEXIST,
            elems("f", "1.2.3.4 . tcp . 80 . 0.0.0.0/0"),
        ),
    ),
    case(
        "concatenated intervals: delete by another interval with the same start",
        ok(
            AddTable(T),
            add_set("f", FIREWALL, "interval"),
            elems("f", "1.2.3.4 . tcp . 80 . 10.0.0.0/8"),
        ),
        stricter(
            "the kernel finds the element to delete by its start only",
            ENOENT,
            delete_elems("f", "1.2.3.4 . tcp . 80 . 10.0.0.0/16"),
        ),
    ),
]

# nft 1.0.6's cache: what a script can see of the kernel's sets.
NFT_CACHE = [
    case(
        "add chain rules see only the sets the script declares",
        SETUP,
        refused(ENOENT, chain("a", "ip saddr @s drop")),
    ),
    case(
        "add chain rules see the kernel's sets when the batch changes elements",
        SETUP,
        ok(chain("a", "ip saddr @s drop"), elems("s", "2.2.2.2")),
    ),
    case(
        "add chain rules see a set declared earlier in the script",
        SETUP,
        ok(add_set("s", "ipv4_addr"), chain("a", "ip saddr @s drop")),
        refused(ENOENT, chain("b", "ip saddr @s drop"), add_set("s", "ipv4_addr")),
    ),
    case(
        "operations that do not load the sets",
        SETUP,
        refused(
            ENOENT,
            AddTable(T),
            FlushTable(T),
            chain("x"),
            FlushChain(T, "x"),
            add_set("other", "ipv4_addr"),
            chain("a", "ip saddr @s drop"),
        ),
    ),
    case(
        "operations that load the sets",
        SETUP,
        ok(DeleteChain(T, "c"), chain("a", "ip saddr @s drop")),
        ok(DeleteElements(T, "s", ("1.1.1.1",)), chain("b", "ip saddr @s drop")),
        ok(FlushSet(T, "set", "s"), chain("d", "ip saddr @s drop")),
        ok(
            add_set("gone", "ipv4_addr"),
            DeleteSet(T, "set", "gone"),
            chain("e", "ip saddr @s drop"),
        ),
        ok(
            AddTable(TableRef("ip", "u")),
            DeleteTable(TableRef("ip", "u")),
            chain("f", "ip saddr @s drop"),
        ),
        ok(define(), chain("g", "ip saddr @s drop")),
    ),
    case(
        "the backends map cannot be read back from the kernel",
        ok(AddTable(T), add_set("backends", BACKENDS), add_set("s", "ipv4_addr")),
        refused(
            "conflicting protocols",
            add_set("backends", BACKENDS),
            chain("a", DNAT),
            elems("s", "1.1.1.1"),
        ),
        refused("conflicting protocols", define(dset("backends", BACKENDS), Chain("a", [DNAT]))),
    ),
    case(
        "the backends map declared again, in a batch that loads no sets",
        ok(AddTable(T), add_set("backends", BACKENDS)),
        ok(add_set("backends", BACKENDS), chain("a", DNAT)),
    ),
    case(
        "the backends map deleted and re-created in the batch",
        ok(AddTable(T), add_set("backends", BACKENDS)),
        ok(DeleteSet(T, "map", "backends"), add_set("backends", BACKENDS), chain("a", DNAT)),
        ok(
            AddTable(T),
            FlushTable(T),
            DeleteSet(T, "map", "backends"),
            define(dset("backends", BACKENDS), Chain("a", [DNAT])),
        ),
    ),
    case(
        "a typeof map with th in the key only can be read back",
        ok(
            AddTable(T),
            add_set("np", "typeof meta l4proto . th dport : ip daddr"),
            add_set("s", "ipv4_addr"),
        ),
        ok(chain("a", "dnat ip to meta l4proto . th dport map @np"), elems("s", "1.1.1.1")),
    ),
]

CASES: list[Case] = [*TABLES, *CHAINS, *SETS, *ELEMENTS, *INTERVALS, *NFT_CACHE]


# ------------------------------------------------------------------- random batches

# A small world for random transactions: few names, so operations keep meeting each
# other (a jump to a chain another operation deletes, an interval inside another...).
RANDOM_CHAINS = ("a", "b", "c")
RANDOM_SETS = {
    "s": Set("s", "ipv4_addr"),
    "i": Set("i", "ipv4_addr", ("interval",)),
    "m": Set.map("m", ADDR_PORT_MAP),
    "d": Set("d", "ipv4_addr", ("dynamic", "timeout"), timeout=60),
    "backends": Set.map("backends", BACKENDS),
    "np": Set.map("np", "typeof meta l4proto . th dport : ip daddr"),
}
RANDOM_RULES = (
    "counter",
    "jump a",
    "goto b",
    "jump c",
    "jump in",
    "ip saddr @s drop",
    "ip daddr @i accept",
    "ip daddr . meta l4proto . th dport vmap @m",
    "update @d { ip saddr }",
    DNAT,
    "dnat ip to meta l4proto . th dport map @np",
)
RANDOM_KEYS = {
    "s": ("1.1.1.1", "1.1.1.2", "1.1.1.3"),
    "d": ("1.1.1.1", "1.1.1.2"),
    "i": (
        "10.0.0.0/8",
        "10.1.0.0/16",
        "10.1.0.0/24",
        "10.1.2.3",
        "10.2.0.0/16",
        "10.0.0.0-10.0.255.255",
        "11.0.0.0/8",
    ),
    "m": ("1.2.3.4 . tcp . 80", "1.2.3.4 . udp . 80", "1.2.3.5 . 6 . 80"),
    "backends": ("1.2.3.4 . tcp . 80 . 0", "1.2.3.4 . tcp . 80 . 1"),
    "np": ("tcp . 30000", "udp . 30000"),
}
RANDOM_VALUES = {
    "m": ("drop", "accept", "goto a", "jump b", "goto c", "jump in"),
    "backends": ("10.0.0.1 . 80", "10.0.0.2 . 81"),
    "np": ("10.0.0.1", "10.0.0.2"),
}


def random_setup() -> Transaction:
    tx = Transaction()
    tx.add_table(T)
    tx.add_chain(T, "in", ["counter"], base("input", "0"))
    for name in RANDOM_CHAINS:
        tx.add_chain(T, name)
    for s in RANDOM_SETS.values():
        tx.add_set(T, s)
    return tx


def _random_element(name: str) -> st.SearchStrategy[tuple[str, str | None]]:
    values = RANDOM_VALUES.get(name)
    return st.tuples(
        st.sampled_from(RANDOM_KEYS[name]),
        st.sampled_from(values) if values else st.none(),
    )


def _random_elements(name: str) -> st.SearchStrategy[AddElements]:
    items = st.lists(_random_element(name), min_size=1, max_size=3).map(tuple)
    return items.map(lambda es: AddElements(T, name, es))


def _random_deletes(name: str) -> st.SearchStrategy[DeleteElements]:
    keys = st.lists(st.sampled_from(RANDOM_KEYS[name]), min_size=1, max_size=2).map(tuple)
    return keys.map(lambda ks: DeleteElements(T, name, ks))


_chain_names = st.sampled_from(RANDOM_CHAINS)
_set_names = st.sampled_from(sorted(RANDOM_SETS))
_rules = st.lists(st.sampled_from(RANDOM_RULES), max_size=2).map(tuple)


@st.composite
def _random_definition(draw: st.DrawFn) -> DefineTable:
    parts: list[Chain | Set] = [
        Chain(name, list(draw(_rules)))
        for name in draw(st.lists(_chain_names, max_size=3, unique=True))
    ]
    for name in draw(st.lists(_set_names, max_size=2, unique=True)):
        s = RANDOM_SETS[name]
        elements = draw(st.lists(_random_element(name), max_size=2))
        parts.append(Set(s.name, s.type, s.flags, elements, keyword=s.keyword, timeout=s.timeout))
    return define(*parts)


random_operations: st.SearchStrategy[Operation] = st.one_of(
    st.builds(AddTable, st.just(T)),
    st.builds(FlushTable, st.just(T)),
    st.builds(AddChain, st.just(T), _chain_names, _rules),
    st.builds(FlushChain, st.just(T), _chain_names),
    st.builds(DeleteChain, st.just(T), _chain_names),
    _set_names.map(lambda n: AddSet(T, RANDOM_SETS[n])),
    _set_names.map(lambda n: FlushSet(T, RANDOM_SETS[n].keyword, n)),
    _set_names.map(lambda n: DeleteSet(T, RANDOM_SETS[n].keyword, n)),
    _set_names.flatmap(_random_elements),
    _set_names.flatmap(_random_elements),
    _set_names.flatmap(_random_deletes),
    _random_definition(),
)


def _batch(ops: list[Operation]) -> Transaction:
    return _tx(tuple(ops))


random_batches = st.lists(
    st.lists(random_operations, min_size=1, max_size=5).map(_batch), min_size=1, max_size=8
)


# ----------------------------------------------- big inputs (a unit test and a bench)


def big_table(services: int) -> Table:
    """Roughly what a full sync of ``services`` Services with 3 ports and 4 endpoints is."""
    ips: list[Element] = []
    backends: list[Element] = []
    allow: list[Element] = []
    for i in range(services):
        ip = f"10.96.{i // 256}.{i % 256}"
        allow.append((f"{ip} . tcp . 80 . 192.168.{i % 256}.0/24", None))
        allow.append((f"{ip} . tcp . 80 . 172.16.0.0/12", None))
        for port in (80, 443, 8080):
            ips.append((f"{ip} . tcp . {port}", f"goto cluster-ip-{i % 4 + 1}"))
            for e in range(4):
                n = i * 4 + e
                endpoint = f"10.244.{n // 256 % 256}.{n % 256} . 8080"
                backends.append((f"{ip} . tcp . {port} . {e}", endpoint))
    dnat = "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod {} map @ip-backends"
    return Table(
        "ip",
        "kube-proxy",
        chains=[
            *(Chain(f"cluster-ip-{k}", [dnat.format(k)]) for k in range(1, 5)),
            Chain("services", ["ip daddr . meta l4proto . th dport vmap @service-ips"]),
            Chain("nat-prerouting", ["jump services"], BaseChain("nat", "prerouting", "-100")),
        ],
        sets=[
            Set("service-ips", ADDR_PORT_MAP, elements=ips, keyword="map"),
            Set("ip-backends", BACKENDS, elements=backends, keyword="map"),
            Set("firewall-allow", FIREWALL, ("interval",), allow),
        ],
    )


def big_syncs(services: int) -> tuple[Table, list[Transaction]]:
    """A full sync of :func:`big_table`, another over the flushed table (as a resync
    does), then a partial sync."""
    table = big_table(services)
    first = Transaction()
    first.add_table(table.ref)
    first.define_table(table)
    again = Transaction()
    again.add_table(table.ref)
    again.flush_table(table.ref)
    again.flush_set(table.ref, "map", "service-ips")
    again.flush_set(table.ref, "set", "firewall-allow")
    again.delete_set(table.ref, "map", "ip-backends")
    again.define_table(table)
    partial = Transaction()
    partial.delete_elements(table.ref, "service-ips", ["10.96.0.1 . tcp . 80"])
    partial.add_elements(table.ref, "service-ips", [("10.96.0.1 . tcp . 80", "goto cluster-ip-3")])
    partial.add_elements(table.ref, "firewall-allow", [("10.96.0.1 . tcp . 80 . 10.0.0.0/8", None)])
    return table, [first, again, partial]


def firewall_of(elements: int) -> tuple[FakeNftables, list[Transaction]]:
    """An interval set of ``elements`` single-address first components, and 200 adds of
    one element each to groups it holds."""
    items = [f"10.96.{i // 256}.{i % 256} . tcp . 80 . 10.0.0.0/8" for i in range(elements)]
    fake = FakeNftables()
    fake.apply(ok(define(dset("f", FIREWALL, *items, flags=("interval",)))).tx)
    adds = []
    for i in range(200):
        tx = Transaction()
        tx.add_elements(T, "f", [(f"10.96.{i // 256}.{i % 256} . tcp . 80 . 11.0.0.0/8", None)])
        adds.append(tx)
    return fake, adds
