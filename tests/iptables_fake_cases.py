"""Restore inputs and single commands, and what iptables does with them: the cases both
the iptables fake's unit tests and its comparison with the real commands run.

A :class:`Case` is a sequence of steps for one IP family, starting from empty tables. A
step is an operation of the :class:`~kubeproxy.dataplane.iptables.runner.Iptables`
interface; it is accepted (with ``result``, for the operations that return a bool) or
refused (``error``: a piece of the fake's message, or alternatives separated by `` | ``
where the flavours word it apart; ``refused_by``: the flavours refusing it, where only
one does). ``kernel_accepts`` marks the places
where the fake is deliberately stricter than iptables (see
:mod:`kubeproxy.dataplane.iptables.fake`): the kernel test checks that iptables does
accept them, so the note stays true. Such a step ends its case, since the two states
differ afterwards.

Restore inputs are written as lines per table: ``:CHAIN`` declares, ``-A CHAIN args``
appends (split like a shell would), ``-X CHAIN`` deletes (declaring it too, as
:meth:`Restore.delete` does); ``-X! CHAIN`` writes a bare ``-X`` line and ``:!CHAIN`` a
chain line the builder would refuse.
"""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from kubeproxy.dataplane.iptables.restore import Restore
from kubeproxy.dataplane.iptables.runner import FLAVORS, Flavor, Iptables
from kubeproxy.model.types import IPFamily

V4 = IPFamily.IPv4
V6 = IPFamily.IPv6


# ------------------------------------------------------------------------ operations


@dataclass(frozen=True)
class RestoreOp:
    data: Restore

    def apply(self, ipt: Iptables) -> bool | None:
        ipt.restore(self.data)
        return None

    def __str__(self) -> str:
        return str(self.data)


@dataclass(frozen=True)
class EnsureRule:
    table: str
    chain: str
    args: tuple[str, ...]
    prepend: bool = True

    def apply(self, ipt: Iptables) -> bool | None:
        return ipt.ensure_rule(self.table, self.chain, self.args, prepend=self.prepend)

    def __str__(self) -> str:
        op = "-I" if self.prepend else "-A"
        return f"ensure_rule -t {self.table} {op} {self.chain} {shlex.join(self.args)}"


@dataclass(frozen=True)
class DeleteRule:
    table: str
    chain: str
    args: tuple[str, ...]

    def apply(self, ipt: Iptables) -> bool | None:
        return ipt.delete_rule(self.table, self.chain, self.args)

    def __str__(self) -> str:
        return f"delete_rule -t {self.table} {self.chain} {shlex.join(self.args)}"


@dataclass(frozen=True)
class EnsureChain:
    table: str
    chain: str

    def apply(self, ipt: Iptables) -> bool | None:
        return ipt.ensure_chain(self.table, self.chain)

    def __str__(self) -> str:
        return f"ensure_chain -t {self.table} {self.chain}"


@dataclass(frozen=True)
class ChainExists:
    table: str
    chain: str

    def apply(self, ipt: Iptables) -> bool | None:
        return ipt.chain_exists(self.table, self.chain)

    def __str__(self) -> str:
        return f"chain_exists -t {self.table} {self.chain}"


Op = RestoreOp | EnsureRule | DeleteRule | EnsureChain | ChainExists


@dataclass(frozen=True)
class Step:
    op: Op
    error: str | None = None  # None: accepted
    result: bool | None = None  # what an accepted single command returns
    kernel_accepts: str | None = None  # why the fake refuses what iptables accepts
    committed: tuple[str, ...] = ()  # tables committed before a refused one
    refused_by: tuple[Flavor, ...] = FLAVORS  # the flavours refusing it (error given)

    def refused(self, flavor: Flavor) -> bool:
        return self.error is not None and flavor in self.refused_by

    def explains(self, message: str) -> bool:
        """Whether a refusal's message is the expected one: ``error`` may list
        alternatives (``"loop | Too many links"``) where the flavours word it apart."""
        return self.error is not None and any(a in message for a in self.error.split(" | "))


@dataclass(frozen=True)
class Case:
    name: str
    steps: tuple[Step, ...]
    family: IPFamily = V4

    def __str__(self) -> str:
        """A test id: the name in lower case, with dashes."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")


# -------------------------------------------------------------------------- builders


def restore(**tables: Sequence[str]) -> Restore:
    """A restore input from lines per table (``nat=[":KUBE-A", "-A KUBE-A -j RETURN"]``)."""
    data = Restore()
    for table, lines in tables.items():
        data.table(table)
        for line in lines:
            if line.startswith(":!"):
                data.table(table).chains.append(line[2:])
            elif line.startswith(":"):
                data.chain(table, line[1:])
            elif line.startswith("-A "):
                chain, *args = shlex.split(line[3:])
                data.rule(table, chain, *args)
            elif line.startswith("-X! "):
                data.table(table).deletes.append(line[4:])
            elif line.startswith("-X "):
                data.delete(table, line[3:])
            else:
                raise ValueError(f"unknown line {line!r}")
    return data


def ok(**tables: Sequence[str]) -> Step:
    return Step(RestoreOp(restore(**tables)))


def refused(error: str, committed: tuple[str, ...] = (), **tables: Sequence[str]) -> Step:
    return Step(RestoreOp(restore(**tables)), error, committed=committed)


def refused_by(flavor: Flavor, error: str, **tables: Sequence[str]) -> Step:
    """Refused by one flavour only (the other accepts it)."""
    return Step(RestoreOp(restore(**tables)), error, refused_by=(flavor,))


def stricter(reason: str, error: str, **tables: Sequence[str]) -> Step:
    return Step(RestoreOp(restore(**tables)), error, kernel_accepts=reason)


def rule_ok(table: str, rule: str, chain: str = "OUTPUT") -> Step:
    """One rule in a builtin chain, accepted."""
    return ok(**{table: [f"-A {chain} {rule}"]})


def rule_refused(table: str, error: str, rule: str, chain: str = "OUTPUT") -> Step:
    return Step(RestoreOp(restore(**{table: [f"-A {chain} {rule}"]})), error)


def rule_stricter(table: str, reason: str, error: str, rule: str, chain: str = "OUTPUT") -> Step:
    return stricter(reason, error, **{table: [f"-A {chain} {rule}"]})


def single(op: Op, result: bool | None = None, error: str | None = None) -> Step:
    return Step(op, error, result)


def normalise(text: str) -> str:
    """iptables-save output without comment lines, counters zeroed."""
    lines = [
        re.sub(r"\[\d+:\d+\]$", "[0:0]", line)
        for line in text.splitlines()
        if line and not line.startswith("#")
    ]
    return "\n".join(lines) + "\n"


def case(name: str, *steps: Step, family: IPFamily = V4) -> Case:
    return Case(name, steps, family)


def args(text: str) -> tuple[str, ...]:
    return tuple(shlex.split(text))


# A small nat table most cases start from: KUBE-A -> KUBE-B from PREROUTING, and an
# unreferenced KUBE-C, each holding a rule.
SETUP = ok(
    nat=[
        ":KUBE-A",
        ":KUBE-B",
        ":KUBE-C",
        "-A KUBE-A -j KUBE-B",
        "-A KUBE-B -j RETURN",
        "-A KUBE-C -j RETURN",
        "-A PREROUTING -j KUBE-A",
    ]
)

# What upstream kube-proxy writes (abridged), before iptables normalises it.
KUBE_PROXY_V4 = {
    "filter": [
        ":KUBE-FORWARD",
        ":KUBE-SERVICES",
        ":KUBE-FIREWALL",
        ":KUBE-NODEPORTS",
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
        '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" '
        "-m mark --mark 0x4000/0x4000 -j ACCEPT",
        "-A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        '-A KUBE-SERVICES -m comment --comment "ns/svc:port has no endpoints" '
        "-m tcp -p tcp -d 10.96.0.11 --dport 80 -j REJECT",
        '-A KUBE-NODEPORTS -m comment --comment "ns/svc:health health check node port" '
        "-m tcp -p tcp --dport 30123 -j ACCEPT",
        '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" '
        "-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT "
        "-j DROP",
        "-A FORWARD -m conntrack --ctstate NEW -m comment "
        '--comment "kubernetes forwarding rules" -j KUBE-FORWARD',
        "-A INPUT -m conntrack --ctstate NEW -m comment "
        '--comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS',
        "-A OUTPUT -j KUBE-FIREWALL",
    ],
    "nat": [
        ":KUBE-SERVICES",
        ":KUBE-NODEPORTS",
        ":KUBE-POSTROUTING",
        ":KUBE-MARK-MASQ",
        ":KUBE-SVC-AAAAAAAAAAAAAAAA",
        ":KUBE-EXT-AAAAAAAAAAAAAAAA",
        ":KUBE-SEP-BBBBBBBBBBBBBBBB",
        ":KUBE-SEP-CCCCCCCCCCCCCCCC",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000",
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" '
        "-j MASQUERADE --random-fully",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
        '-A KUBE-SERVICES -m comment --comment "ns/svc:port cluster IP" -m tcp -p tcp '
        "-d 10.96.0.10 --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA",
        '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must '
        'be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS',
        "-A KUBE-NODEPORTS -m comment --comment ns/svc:port -m tcp -p tcp --dport 30080 "
        "-j KUBE-EXT-AAAAAAAAAAAAAAAA",
        '-A KUBE-EXT-AAAAAAAAAAAAAAAA -m comment --comment "masquerade traffic for ns/svc:port '
        'external destinations" -j KUBE-MARK-MASQ',
        "-A KUBE-EXT-AAAAAAAAAAAAAAAA -j KUBE-SVC-AAAAAAAAAAAAAAAA",
        '-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment "ns/svc:port cluster IP" -m tcp '
        "-p tcp -d 10.96.0.10 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ",
        '-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment "ns/svc:port -> 10.244.1.10:8080" '
        "-m recent --name KUBE-SEP-BBBBBBBBBBBBBBBB --rcheck --seconds 10800 --reap "
        "-j KUBE-SEP-BBBBBBBBBBBBBBBB",
        '-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment "ns/svc:port -> 10.244.1.10:8080" '
        "-m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-BBBBBBBBBBBBBBBB",
        '-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment "ns/svc:port -> 10.244.2.10:8080" '
        "-j KUBE-SEP-CCCCCCCCCCCCCCCC",
        "-A KUBE-SEP-BBBBBBBBBBBBBBBB -m comment --comment ns/svc:port -s 10.244.1.10 "
        "-j KUBE-MARK-MASQ",
        "-A KUBE-SEP-BBBBBBBBBBBBBBBB -m comment --comment ns/svc:port -m recent "
        "--name KUBE-SEP-BBBBBBBBBBBBBBBB --set -m tcp -p tcp "
        "-j DNAT --to-destination 10.244.1.10:8080",
        "-A KUBE-SEP-CCCCCCCCCCCCCCCC -m comment --comment ns/svc:port -s 10.244.2.10 "
        "-j KUBE-MARK-MASQ",
        "-A KUBE-SEP-CCCCCCCCCCCCCCCC -m comment --comment ns/svc:port -m tcp -p tcp "
        "-j DNAT --to-destination 10.244.2.10:8080",
        '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
    ],
}

KUBE_PROXY_V6 = {
    "filter": [
        ":KUBE-SERVICES",
        '-A KUBE-SERVICES -m comment --comment "ns/svc:port has no endpoints" '
        "-m udp -p udp -d fd00:10:96::11 --dport 53 -j REJECT",
        "-A INPUT -m conntrack --ctstate NEW -j KUBE-SERVICES",
    ],
    "nat": [
        ":KUBE-SERVICES",
        ":KUBE-SVC-AAAAAAAAAAAAAAAA",
        ":KUBE-SEP-BBBBBBBBBBBBBBBB",
        ":KUBE-MARK-MASQ",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
        "-A KUBE-SERVICES -m tcp -p tcp -d FD00:10:96:0::10 --dport 80 "
        "-j KUBE-SVC-AAAAAAAAAAAAAAAA",
        "-A KUBE-SVC-AAAAAAAAAAAAAAAA ! -s fd00:10:244::/48 -j KUBE-MARK-MASQ",
        "-A KUBE-SVC-AAAAAAAAAAAAAAAA -m recent --name KUBE-SEP-BBBBBBBBBBBBBBBB --rcheck "
        "--seconds 60 --reap -j KUBE-SEP-BBBBBBBBBBBBBBBB",
        "-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB",
        "-A KUBE-SEP-BBBBBBBBBBBBBBBB -s fd00:10:244:1::10 -j KUBE-MARK-MASQ",
        "-A KUBE-SEP-BBBBBBBBBBBBBBBB -m recent --name KUBE-SEP-BBBBBBBBBBBBBBBB --set "
        "-m tcp -p tcp -j DNAT --to-destination [fd00:10:244:1::10]:8080",
        "-A OUTPUT -j KUBE-SERVICES",
        "-A PREROUTING -j KUBE-SERVICES",
        "-A POSTROUTING -m addrtype --src-type LOCAL -j MASQUERADE",
    ],
}

# ----------------------------------------------------------------------------- cases

RESTORE = [
    case(
        "chain lines create, rules append in order",
        ok(nat=[":KUBE-A", ":KUBE-B", "-A KUBE-A -j KUBE-B", "-A KUBE-A -j RETURN"]),
    ),
    case(
        "a chain line flushes an existing chain",
        SETUP,
        ok(nat=[":KUBE-A", "-A KUBE-A -j MARK --or-mark 0x1"]),
    ),
    case(
        "rules go to an existing chain the input does not declare",
        SETUP,
        ok(nat=["-A KUBE-C -j MARK --or-mark 0x1"]),
    ),
    case(
        "-A to a chain that neither exists nor is declared",
        refused("KUBE-X does not exist", nat=["-A KUBE-X -j RETURN"]),
    ),
    case(
        "-j to a chain that does not exist",
        refused("jump to missing chain KUBE-X", nat=[":KUBE-A", "-A KUBE-A -j KUBE-X"]),
    ),
    case(
        "-j to a builtin chain",
        refused("builtin chain OUTPUT", nat=[":KUBE-A", "-A KUBE-A -j OUTPUT"]),
    ),
    case(
        "chains not named by the input are left alone",
        SETUP,
        ok(nat=[":KUBE-D", "-A KUBE-D -j RETURN"]),
    ),
    case(
        "a refused table changes nothing",
        SETUP,
        refused(
            "jump to missing chain KUBE-X",
            nat=[
                ":KUBE-A",
                ":KUBE-NEW",
                "-A KUBE-NEW -j RETURN",
                "-A KUBE-C -j RETURN",
                "-A PREROUTING -j KUBE-NEW",
                "-A KUBE-A -j KUBE-X",
            ],
        ),
    ),
    case(
        "a table refused while parsing leaves the earlier table committed",
        SETUP,
        refused(
            "jump to missing chain KUBE-X",
            ("filter",),
            filter=[":KUBE-F", "-A KUBE-F -j RETURN"],
            nat=[":KUBE-N", "-A KUBE-N -j KUBE-X"],
        ),
    ),
    case(
        "a table refused by the kernel leaves the earlier table committed",
        refused(
            "loop | Too many links",
            ("mangle", "filter"),
            mangle=[":KUBE-M", "-A KUBE-M -j RETURN"],
            filter=[":KUBE-F", "-A KUBE-F -j RETURN"],
            nat=[":KUBE-N", "-A KUBE-N -j KUBE-N", "-A OUTPUT -j KUBE-N"],
        ),
    ),
    case(
        "a jump to a missing chain, then a line iptables cannot parse",
        # legacy stops at the jump; iptables-nft resolves jumps only at COMMIT.
        refused(
            "jump to missing chain | unknown option",
            nat=[":KUBE-A", "-A KUBE-A -j KUBE-X", "-A KUBE-A -j RETURN --bogus"],
        ),
    ),
    case(
        "a rule the kernel refuses, then a refused -X",
        refused(
            "KUBE-Z does not exist",
            filter=[":KUBE-A", "-A KUBE-A -j DNAT --to-destination 10.0.0.1", "-X! KUBE-Z"],
        ),
    ),
    case(
        "a rule the kernel refuses, then a line iptables cannot parse",
        refused(
            "unknown option",
            filter=[
                ":KUBE-A",
                "-A KUBE-A -j DNAT --to-destination 10.0.0.1",
                "-A KUBE-A -j RETURN --bogus",
            ],
        ),
    ),
    case(
        "a refused first table stops the input",
        refused(
            "does not exist",
            filter=["-A KUBE-F -j RETURN"],
            nat=[":KUBE-N", "-A KUBE-N -j RETURN"],
        ),
    ),
]

DELETES = [
    case("-X of a chain still jumped to", SETUP, refused("still jumped to", nat=["-X KUBE-B"])),
    case(
        "-X of a chain jumped to from a builtin chain",
        SETUP,
        refused("still jumped to", nat=["-X KUBE-A"]),
    ),
    case(
        "-X of a chain whose referrer the input flushes",
        SETUP,
        ok(nat=[":KUBE-A", "-X KUBE-B"]),
    ),
    case(
        "-X of a chain whose only referrer the input deletes first",
        ok(nat=[":KUBE-D", ":KUBE-E", "-A KUBE-D -j KUBE-E"]),
        ok(nat=["-X KUBE-D", "-X KUBE-E"]),
    ),
    case(
        "-X of a chain a rule of the same input jumps to",
        SETUP,
        refused("still jumped to", nat=[":KUBE-D", "-A KUBE-D -j KUBE-C", "-X KUBE-C"]),
    ),
    case("-X of a builtin chain", refused("builtin", nat=["-X! OUTPUT"])),
    case(
        "-X of a chain not declared and still holding rules",
        SETUP,
        refused("not empty", nat=["-X! KUBE-C"]),
    ),
    case(
        "-X of an empty chain not declared",
        ok(nat=[":KUBE-E"]),
        ok(nat=["-X! KUBE-E"]),
    ),
    case("-X of a missing chain not declared", refused("does not exist", nat=["-X! KUBE-Z"])),
    case("a chain declared and deleted by one input", ok(nat=["-X KUBE-Z"])),
    case(
        "-X twice in one input",
        SETUP,
        refused("KUBE-C does not exist", nat=["-X KUBE-C", "-X! KUBE-C"]),
    ),
]


def _ladder(depth: int) -> list[str]:
    """``depth`` user chains, each jumping to the next, the first from OUTPUT."""
    names = [f"KUBE-L{i:02d}" for i in range(depth)]
    return [
        *(f":{n}" for n in names),
        *(f"-A {a} -j {b}" for a, b in itertools.pairwise(names)),
        f"-A OUTPUT -j {names[0]}",
    ]


GRAPH = [
    case("user chains 15 jumps below a builtin chain", ok(filter=_ladder(15))),
    case(
        "user chains 16 jumps below a builtin chain",
        # nf_tables' jump stack holds 16 levels; legacy has no such limit.
        refused_by("nft", "Too many links", filter=_ladder(16)),
    ),
    case(
        "a loop closed by the last rule",
        refused(
            "loop | Too many links",
            filter=[
                ":KUBE-A",
                ":KUBE-B",
                "-A INPUT -j KUBE-A",
                "-A KUBE-A -j KUBE-B",
                "-A KUBE-B -j KUBE-A",
                "-A INPUT -j ACCEPT",
            ],
        ),
    ),
    case(
        "a target becomes reachable through a later rule",
        refused(
            "reached from OUTPUT",
            nat=[
                ":KUBE-A",
                ":KUBE-B",
                "-A OUTPUT -j KUBE-A",
                "-A KUBE-B -j MASQUERADE",
                "-A KUBE-A -j KUBE-B",
                "-A KUBE-A -j RETURN",
            ],
        ),
    ),
    case(
        "a loop reachable from a builtin chain",
        refused(
            "loop | Too many links",
            filter=[
                ":KUBE-A",
                ":KUBE-B",
                "-A KUBE-A -j KUBE-B",
                "-A KUBE-B -j KUBE-A",
                "-A INPUT -j KUBE-A",
            ],
        ),
    ),
    case(
        "a loop no builtin chain reaches",
        ok(filter=[":KUBE-A", ":KUBE-B", "-A KUBE-A -j KUBE-B", "-A KUBE-B -j KUBE-A"]),
    ),
    case(
        "linking an unreachable loop",
        ok(filter=[":KUBE-A", "-A KUBE-A -j KUBE-A"]),
        refused("loop | Too many links", filter=["-A FORWARD -j KUBE-A"]),
    ),
    case(
        "a chain reached twice is no loop",
        ok(
            filter=[
                ":KUBE-A",
                ":KUBE-B",
                ":KUBE-C",
                "-A KUBE-A -j KUBE-C",
                "-A KUBE-B -j KUBE-C",
                "-A INPUT -j KUBE-A",
                "-A INPUT -j KUBE-B",
                "-A OUTPUT -g KUBE-A",
            ],
        ),
    ),
    case(
        "MASQUERADE in a chain linked from OUTPUT",
        ok(nat=[":KUBE-A", "-A KUBE-A -j MASQUERADE"]),
        refused("reached from OUTPUT", nat=["-A OUTPUT -j KUBE-A"]),
    ),
    case(
        "MASQUERADE in a chain linked from POSTROUTING",
        ok(nat=[":KUBE-A", "-A KUBE-A -j MASQUERADE", "-A POSTROUTING -j KUBE-A"]),
    ),
    case(
        "DNAT reached from POSTROUTING through two chains",
        refused(
            "reached from POSTROUTING",
            nat=[
                ":KUBE-A",
                ":KUBE-B",
                "-A KUBE-A -j KUBE-B",
                "-A POSTROUTING -j KUBE-A",
                "-A KUBE-B -p tcp -j DNAT --to-destination 10.0.0.1:80",
            ],
        ),
    ),
    case(
        "DNAT reached from the nat INPUT chain",
        refused("reached from INPUT", nat=["-A INPUT -j DNAT --to-destination 10.0.0.1"]),
    ),
    case(
        "DNAT from PREROUTING and OUTPUT",
        ok(
            nat=[
                ":KUBE-A",
                "-A KUBE-A -j DNAT --to-destination 10.0.0.1",
                "-A PREROUTING -j KUBE-A",
                "-A OUTPUT -j KUBE-A",
            ]
        ),
    ),
    case(
        "DNAT in the filter table, even unreachable",
        refused(
            "only valid in the nat table",
            filter=[":KUBE-A", "-A KUBE-A -j DNAT --to-destination 10.0.0.1"],
        ),
    ),
    case(
        "MASQUERADE in the filter table, even unreachable",
        refused("only valid in the nat table", filter=[":KUBE-A", "-A KUBE-A -j MASQUERADE"]),
    ),
    case(
        "REJECT in the nat table",
        refused("only valid in the filter table", nat=[":KUBE-A", "-A KUBE-A -j REJECT"]),
    ),
    case(
        "REJECT in the mangle table",
        refused("only valid in the filter table", mangle=["-A INPUT -j REJECT"]),
    ),
    case(
        "MARK in every table",
        ok(
            mangle=["-A PREROUTING -j MARK --set-mark 1"],
            filter=["-A INPUT -j MARK --set-mark 2"],
            nat=["-A OUTPUT -j MARK --set-mark 3"],
        ),
    ),
]

NAMES = [
    case("a 28-character chain name", ok(nat=[":KUBE-SVC-ABCDEFGHIJKLMNOPQRS"])),
    case(
        "a 29-character chain name",
        refused("28 chars max", nat=[":!KUBE-SVC-ABCDEFGHIJKLMNOPQRST"]),
    ),
    case("a chain named ACCEPT", refused("File exists", nat=[":ACCEPT"])),
    case("a chain named RETURN", refused("File exists", nat=[":RETURN"])),
    case(
        "a chain named like a target extension",
        stricter("iptables creates a chain DNAT, shadowing the target", "shadow", nat=[":DNAT"]),
    ),
    case(
        "a chain line for a builtin chain",
        ok(nat=["-A OUTPUT -j RETURN"]),
        stricter("iptables accepts it and flushes nothing", "builtin", nat=[":OUTPUT"]),
    ),
    case(
        "a builtin chain name in another table is a user chain",
        ok(filter=[":PREROUTING", "-A PREROUTING -j ACCEPT", "-A INPUT -j PREROUTING"]),
    ),
    case(
        "chains are listed by byte value",
        ok(
            filter=[
                ":zeta",
                ":KUBE-B",
                ":alpha",
                ":KUBE-A",
                ":_x",
                ":9z",
                ":Z",
                "-A zeta -j RETURN",
                "-A _x -j RETURN",
            ]
        ),
    ),
]

RULES = [
    case("kube-proxy's IPv4 rules", ok(**KUBE_PROXY_V4)),
    case(
        "a sync that drops an endpoint",
        ok(**KUBE_PROXY_V4),
        ok(
            nat=[
                ":KUBE-SVC-AAAAAAAAAAAAAAAA",
                "-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment ns/svc:port "
                "-j KUBE-SEP-BBBBBBBBBBBBBBBB",
                "-X KUBE-SEP-CCCCCCCCCCCCCCCC",
            ]
        ),
    ),
    case(
        "a sync deleting a chain a chain it did not rewrite still uses",
        ok(**KUBE_PROXY_V4),
        refused("still jumped to", nat=["-X KUBE-SEP-CCCCCCCCCCCCCCCC"]),
    ),
    case("kube-proxy's IPv6 rules", ok(**KUBE_PROXY_V6), family=V6),
    case(
        "header options print in a fixed order",
        rule_ok("filter", "-p sctp -o eth0 -d 10.0.0.0/8 ! -s 10.1.0.0/16 -j ACCEPT"),
        rule_ok("filter", "-i veth+ ! -p udp -j ACCEPT", chain="INPUT"),
    ),
    case(
        "the protocol match loads where its first option is",
        rule_ok("filter", "-m comment --comment x -p tcp --dport 80 -j ACCEPT"),
        rule_ok("filter", "-p tcp --sport 1:2 --dport 80 -m comment --comment y -j ACCEPT"),
        rule_ok("filter", "-p tcp -m tcp --dport 80 -m tcp --sport 5 -j ACCEPT"),
    ),
    case(
        "protocols by name, number and case",
        rule_ok("filter", "-p 6 -j ACCEPT"),
        rule_ok("filter", "-p UDP -j ACCEPT"),
        rule_ok("filter", "-p 132 -j ACCEPT"),
        rule_ok("filter", "-p all -j ACCEPT"),
        rule_ok("filter", "-p icmp -j ACCEPT"),
    ),
    case(
        "addresses print with their prefix, host bits cleared",
        rule_ok("filter", "-d 10.1.2.3 -s 10.1.2.3/24 -j ACCEPT"),
        rule_ok("filter", "-d 0.0.0.0/0 -j ACCEPT"),
    ),
    case(
        "IPv6 addresses print compressed with their prefix",
        rule_ok("filter", "-d FD00:0:0::1 -s fd00::1:2/64 -j ACCEPT"),
        family=V6,
    ),
    case(
        "ports and ranges",
        rule_ok("filter", "-p tcp --dport 80:80 -j ACCEPT"),
        rule_ok("filter", "-p tcp --dport :80 -j ACCEPT"),
        rule_ok("filter", "-p udp --sport 80: -j ACCEPT"),
        rule_ok("filter", "-p sctp ! --dport 1:1024 -j ACCEPT"),
        rule_ok("filter", "-p tcp -m multiport --dports 80,443,8000:8080 -j ACCEPT"),
        rule_ok("filter", "-p udp -m multiport ! --sports 1:2 -j ACCEPT"),
        rule_ok(
            "filter", "-p tcp -m multiport --ports 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 -j ACCEPT"
        ),
    ),
    case(
        "conntrack states and address types print in the kernel's order",
        rule_ok("filter", "-m conntrack --ctstate established,RELATED,NEW -j ACCEPT"),
        rule_ok("filter", "-m conntrack ! --ctstate DNAT,SNAT,UNTRACKED,INVALID -j ACCEPT"),
        rule_ok("filter", "-m addrtype --dst-type local,UNICAST --src-type LOCAL -j ACCEPT"),
        rule_ok("filter", "-m addrtype ! --dst-type BROADCAST -j ACCEPT"),
    ),
    case(
        "marks in every spelling",
        rule_ok("filter", "-m mark --mark 16384 -j ACCEPT"),
        rule_ok("filter", "-m mark --mark 0x4000/0xffffffff -j ACCEPT"),
        rule_ok("filter", "-m mark ! --mark 0x04000/0x4000 -j ACCEPT"),
        rule_ok("filter", "-m mark --mark 0/0xff -j ACCEPT"),
        rule_ok("filter", "-j MARK --set-mark 0x1"),
        rule_ok("filter", "-j MARK --set-mark 0x1/0xff"),
        rule_ok("filter", "-j MARK --set-xmark 0x1"),
        rule_ok("filter", "-j MARK --and-mark 0xff"),
        rule_ok("filter", "-j MARK --or-mark 0x4000"),
        rule_ok("filter", "-j MARK --xor-mark 0x4000"),
    ),
    case(
        "statistic probabilities print as the kernel keeps them",
        rule_ok("filter", "-m statistic --mode random --probability 0.1 -j ACCEPT"),
        rule_ok("filter", "-m statistic --mode random --probability 0.33333333333 -j ACCEPT"),
        rule_ok("filter", "-m statistic --mode random ! --probability 1 -j ACCEPT"),
        rule_ok("filter", "-m statistic --mode random --probability 0 -j ACCEPT"),
        rule_ok("filter", "-m statistic --mode nth --every 3 --packet 0 -j ACCEPT"),
    ),
    case(
        "recent in every mode",
        rule_ok("filter", "-m recent --set -j ACCEPT"),
        rule_ok("filter", "-m recent --name A --set --rdest -j ACCEPT"),
        rule_ok("filter", "-m recent --name A --update --seconds 5 -j ACCEPT"),
        rule_ok("filter", "-m recent --name A --remove --mask 255.255.0.0 -j ACCEPT"),
        rule_ok("filter", "-m recent ! --rcheck --name A --seconds 1 --reap -j ACCEPT"),
    ),
    case(
        "recent masks in IPv6",
        rule_ok("filter", "-m recent --name A --set -j ACCEPT"),
        rule_ok("filter", "-m recent --name A --set --mask ffff:ffff:: -j ACCEPT"),
        family=V6,
    ),
    case(
        "comments are quoted unless plain",
        rule_ok("filter", "-m comment --comment plain_-9 -j ACCEPT"),
        rule_ok("filter", "-m comment --comment ns/svc:port -j ACCEPT"),
        rule_ok("filter", '-m comment --comment "two words" -j ACCEPT'),
        rule_ok("filter", '-m comment --comment "" -j ACCEPT'),
        rule_ok("filter", "-m comment --comment a -m comment --comment b -j ACCEPT"),
        rule_ok("filter", "-m comment --comment " + "x" * 255 + " -j ACCEPT"),
    ),
    case(
        "NAT targets",
        rule_ok("nat", "-p tcp -j DNAT --to-destination 10.0.0.1:8080"),
        rule_ok("nat", "-j DNAT --to-destination 10.0.0.1"),
        rule_ok("nat", "-p udp -j DNAT --to-destination 10.0.0.1:80-90 --random --persistent"),
        rule_ok("nat", "-p sctp -j DNAT --to-destination 10.0.0.1:80-80"),
        rule_ok("nat", "-j MASQUERADE", chain="POSTROUTING"),
        rule_ok("nat", "-j MASQUERADE --random-fully --random", chain="POSTROUTING"),
        rule_ok("nat", "-p tcp -j MASQUERADE --random-fully --to-ports 5", chain="POSTROUTING"),
    ),
    case(
        "IPv6 NAT targets",
        rule_ok("nat", "-p tcp -j DNAT --to-destination [fd00::1]:8080"),
        rule_ok("nat", "-p tcp -j DNAT --to-destination [FD00:0::1]"),
        rule_ok("nat", "-j DNAT --to-destination fd00::2"),
        rule_ok("nat", "-j MASQUERADE", chain="POSTROUTING"),
        family=V6,
    ),
    case(
        "REJECT types and their aliases",
        rule_ok("filter", "-j REJECT"),
        rule_ok("filter", "-j REJECT --reject-with host-unreach"),
        rule_ok("filter", "-j REJECT --reject-with icmp-admin-prohibited"),
        rule_ok("filter", "-p tcp -j REJECT --reject-with tcp-reset"),
    ),
    case(
        "IPv6 REJECT types",
        rule_ok("filter", "-j REJECT"),
        rule_ok("filter", "-j REJECT --reject-with adm-prohibited"),
        rule_ok("filter", "-j REJECT --reject-with icmp6-addr-unreachable"),
        family=V6,
    ),
    case("a rule without a target", rule_ok("filter", "-m comment --comment counted")),
]

RULE_REFUSALS = [
    case("-m tcp without -p tcp", rule_refused("filter", "needs -p tcp", "-m tcp --dport 80")),
    case("-p udp with -m tcp", rule_refused("filter", "needs -p tcp", "-p udp -m tcp --dport 80")),
    case("! -p tcp with -m tcp", rule_refused("filter", "needs -p tcp", "! -p tcp -m tcp")),
    case("--dport without -p", rule_refused("filter", "unknown option", "--dport 80")),
    case(
        "ports with a negated protocol",
        # iptables-nft writes these ports as its own expressions: no kernel match checks
        # the protocol.
        refused_by("legacy", "needs -p tcp", filter=["-A OUTPUT ! -p tcp --dport 8"]),
    ),
    case(
        "a negated match-all address",
        refused_by("nft", "matches nothing", filter=["-A OUTPUT ! -s 0.0.0.0/0 -j ACCEPT"]),
    ),
    case(
        "a negated match-all IPv6 address",
        refused_by("nft", "matches nothing", filter=["-A OUTPUT ! -d ::/0 -j ACCEPT"]),
        family=V6,
    ),
    case("an unknown option", rule_refused("filter", "unknown option", "-j ACCEPT --foo")),
    case("an unknown match", rule_refused("filter", "Couldn't load match", "-m bogus")),
    case("a stray argument", rule_refused("filter", "Bad argument", "-j ACCEPT extra")),
    case("two targets", rule_refused("filter", "multiple -j", "-j ACCEPT -j DROP")),
    case("-s twice", rule_refused("filter", "multiple -s", "-s 1.1.1.1 -s 2.2.2.2")),
    case("a port over 65535", rule_refused("filter", "not valid", "-p tcp --dport 65536")),
    case("a reversed port range", rule_refused("filter", "min > max", "-p tcp --dport 90:80")),
    case("a mask over 32", rule_refused("filter", "invalid mask", "-d 10.0.0.0/33")),
    case("an IPv6 address in iptables", rule_refused("filter", "not found", "-d fd00::1")),
    case(
        "an IPv4 address in ip6tables",
        rule_refused("filter", "not found", "-s 10.0.0.1"),
        family=V6,
    ),
    case(
        "an IPv4 DNAT destination in ip6tables",
        rule_refused("nat", "Bad IP address", "-p tcp -j DNAT --to-destination 10.0.0.1:80"),
        family=V6,
    ),
    case(
        "an IPv6 DNAT destination in iptables",
        rule_refused("nat", "Bad IP address", "-j DNAT --to-destination fd00::1"),
    ),
    case(
        "a DNAT port without a port protocol",
        rule_refused("nat", "Need TCP, UDP", "-j DNAT --to-destination 10.0.0.1:80"),
    ),
    case("DNAT without a destination", rule_refused("nat", "must be specified", "-p tcp -j DNAT")),
    case(
        "MASQUERADE ports without a port protocol",
        rule_refused("nat", "Need TCP, UDP", "-j MASQUERADE --to-ports 5", chain="POSTROUTING"),
    ),
    case(
        "multiport without -p",
        rule_refused("filter", "multiport needs", "-m multiport --dports 80,443"),
    ),
    case(
        "multiport with icmp",
        rule_refused("filter", "only works with", "-p icmp -m multiport --dports 80"),
    ),
    case(
        "multiport with 16 ports",
        rule_refused(
            "filter",
            "too many ports",
            "-p tcp -m multiport --dports 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16",
        ),
    ),
    case(
        "multiport with a range counting twice",
        rule_refused(
            "filter",
            "too many ports",
            "-p tcp -m multiport --dports 1:2,3,4,5,6,7,8,9,10,11,12,13,14,15,16",
        ),
    ),
    case(
        "multiport --sports and --dports",
        rule_refused(
            "filter", "cannot be used together", "-p tcp -m multiport --sports 1 --dports 2"
        ),
    ),
    case(
        "statistic without a mode",
        rule_refused("filter", '"--mode" must be specified', "-m statistic --probability 0.5"),
    ),
    case(
        "statistic without a probability",
        rule_refused("filter", "--probability must be specified", "-m statistic --mode random"),
    ),
    case(
        "a probability over 1",
        rule_refused("filter", "out of range", "-m statistic --mode random --probability 1.5"),
    ),
    case(
        "nth without --packet",
        rule_refused("filter", "also requires", "-m statistic --mode nth --every 3"),
    ),
    case(
        "recent without a mode",
        rule_refused("filter", "you must specify one of", "-m recent --name A"),
    ),
    case(
        "recent with two modes",
        rule_refused("filter", "cannot be used together", "-m recent --set --rcheck"),
    ),
    case(
        "recent --reap without --seconds",
        rule_refused("filter", "also requires", "-m recent --rcheck --reap"),
    ),
    case(
        "recent --set with --seconds",
        rule_refused("filter", "--seconds needs --rcheck", "-m recent --set --seconds 5"),
    ),
    case("mark without --mark", rule_refused("filter", "must be specified", "-m mark")),
    case(
        "a mark over 32 bits",
        rule_refused("filter", "out of range", "-m mark --mark 0x100000000"),
    ),
    case("MARK without an operation", rule_refused("filter", "One of the", "-j MARK")),
    case(
        "MARK with two operations",
        rule_refused("filter", "cannot be used together", "-j MARK --or-mark 1 --xor-mark 2"),
    ),
    case("conntrack without an option", rule_refused("filter", "At least one", "-m conntrack")),
    case(
        "an unknown conntrack state",
        rule_refused("filter", "Bad ctstate", "-m conntrack --ctstate FOO"),
    ),
    case("addrtype without a type", rule_refused("filter", "you must specify", "-m addrtype")),
    case(
        "addrtype BROADCAST in IPv6",
        rule_refused("filter", "IPv6 does not support", "-m addrtype --dst-type BROADCAST"),
        family=V6,
    ),
    case(
        "an IPv6 reject type in iptables",
        rule_refused("filter", "unknown reject type", "-j REJECT --reject-with icmp6-no-route"),
    ),
    case(
        "an IPv4 reject type in ip6tables",
        rule_refused(
            "filter", "unknown reject type", "-j REJECT --reject-with icmp-net-prohibited"
        ),
        family=V6,
    ),
    case(
        "tcp-reset without -p tcp",
        rule_refused("filter", "needs -p tcp", "-j REJECT --reject-with tcp-reset"),
    ),
    case("-i in OUTPUT", rule_refused("filter", "Can't use -i with OUTPUT", "-i eth0 -j ACCEPT")),
    case(
        "-o in PREROUTING",
        rule_refused("nat", "Can't use -o with PREROUTING", "-o eth0", chain="PREROUTING"),
    ),
    case(
        "-i in a user chain reached from OUTPUT",
        ok(filter=[":KUBE-A", "-A KUBE-A -i eth0 -j ACCEPT", "-A OUTPUT -j KUBE-A"]),
    ),
    case(
        "an interface name of 16 characters",
        rule_refused("filter", "IFNAMSIZ", "-i abcdefghijklmnop", chain="INPUT"),
    ),
    case(
        "a negated target",
        rule_refused("filter", "cannot have !", "! -j ACCEPT"),
    ),
]

RULE_STRICTER = [
    case(
        "a host name",
        rule_stricter("filter", "iptables resolves it", "names are not modelled", "-d localhost"),
    ),
    case(
        "an address list",
        rule_stricter(
            "filter", "iptables makes one rule per address", "not found", "-d 10.0.0.1,10.0.0.2"
        ),
    ),
    case(
        "a dotted mask",
        rule_stricter("filter", "iptables converts it", "invalid mask", "-d 10.0.0.0/255.0.0.0"),
    ),
    case(
        "a port service name",
        rule_stricter("filter", "iptables looks it up", "service names", "-p tcp --dport http"),
    ),
    case(
        "an abbreviated option",
        rule_stricter(
            "filter", "getopt takes unambiguous prefixes", "unknown option", "-p tcp --dpo 80"
        ),
    ),
    case(
        "a comment over 255 characters",
        rule_stricter(
            "filter",
            "iptables truncates it",
            "iptables keeps only",
            "-m comment --comment " + "y" * 256,
        ),
    ),
]

COMMANDS = [
    case(
        "ensure_rule inserts once",
        SETUP,
        single(EnsureRule("nat", "KUBE-C", args("-j MARK --or-mark 0x1")), False),
        single(EnsureRule("nat", "KUBE-C", args("-j MARK --or-mark 0x1")), True),
    ),
    case(
        "ensure_rule finds a rule written in another spelling",
        ok(nat=["-A OUTPUT -j MARK --set-xmark 0x4000/0x4000"]),
        single(EnsureRule("nat", "OUTPUT", args("-j MARK --or-mark 0x4000")), True),
    ),
    case(
        "ensure_rule prepends or appends",
        SETUP,
        single(EnsureRule("nat", "KUBE-C", args("-j MARK --or-mark 0x1")), False),
        single(EnsureRule("nat", "KUBE-C", args("-j MARK --or-mark 0x2"), prepend=False), False),
    ),
    case(
        "a comment makes another rule",
        ok(filter=["-A INPUT -m comment --comment a -j ACCEPT"]),
        single(EnsureRule("filter", "INPUT", args("-m comment --comment b -j ACCEPT")), False),
        single(EnsureRule("filter", "INPUT", args("-j ACCEPT")), False),
    ),
    case(
        "ensure_rule into a missing chain",
        single(EnsureRule("nat", "KUBE-X", args("-j RETURN")), error="does not exist"),
    ),
    case(
        "ensure_rule jumping to a missing chain",
        single(EnsureRule("nat", "OUTPUT", args("-j KUBE-X")), error="Couldn't load target"),
    ),
    case(
        "ensure_rule closing a loop",
        SETUP,
        single(EnsureRule("nat", "KUBE-B", args("-j KUBE-A")), error="loop | Too many links"),
    ),
    case(
        "ensure_rule of a target in the wrong chain",
        single(EnsureRule("nat", "OUTPUT", args("-j MASQUERADE")), error="reached from OUTPUT"),
    ),
    case(
        "delete_rule",
        SETUP,
        single(DeleteRule("nat", "KUBE-A", args("-j KUBE-B")), True),
        single(DeleteRule("nat", "KUBE-A", args("-j KUBE-B")), False),
        single(DeleteRule("nat", "KUBE-X", args("-j RETURN")), False),
        single(DeleteRule("nat", "OUTPUT", args("-j KUBE-X")), False),
        single(DeleteRule("nat", "KUBE-C", args("-m comment --comment x -j RETURN")), False),
    ),
    case(
        "delete_rule deletes the first of equal rules",
        ok(filter=["-A INPUT -j ACCEPT", "-A INPUT -j DROP", "-A INPUT -j ACCEPT"]),
        single(DeleteRule("filter", "INPUT", args("-j ACCEPT")), True),
    ),
    case(
        "delete_rule of a rule iptables cannot parse",
        single(DeleteRule("filter", "INPUT", args("-j ACCEPT --foo")), error="unknown option"),
    ),
    case(
        "ensure_chain and chain_exists",
        single(ChainExists("nat", "KUBE-PROXY-CANARY"), False),
        single(EnsureChain("nat", "KUBE-PROXY-CANARY"), False),
        single(EnsureChain("nat", "KUBE-PROXY-CANARY"), True),
        single(ChainExists("nat", "KUBE-PROXY-CANARY"), True),
        single(EnsureChain("nat", "OUTPUT"), True),
        single(ChainExists("filter", "KUBE-PROXY-CANARY"), False),
        single(ChainExists("mangle", "INPUT"), True),
    ),
    case(
        "ensure_chain with a name too long",
        single(EnsureChain("nat", "KUBE-SVC-ABCDEFGHIJKLMNOPQRST"), error="28 chars max"),
    ),
]

CASES: list[Case] = [
    *RESTORE,
    *DELETES,
    *GRAPH,
    *NAMES,
    *RULES,
    *RULE_REFUSALS,
    *RULE_STRICTER,
    *COMMANDS,
]


def _unique(cases: list[Case]) -> list[Case]:
    ids = [str(c) for c in cases]
    dupes = {i for i in ids if ids.count(i) > 1}
    assert not dupes, f"duplicate case ids: {sorted(dupes)}"
    return cases


_unique(CASES)

# The tables every comparison looks at.
COMPARED_TABLES = ("filter", "nat", "mangle")

__all__ = ["CASES", "COMPARED_TABLES", "SETUP", "Case", "Step"]
