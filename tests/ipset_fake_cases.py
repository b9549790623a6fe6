"""``ipset restore -exist`` inputs and what ipset 7.17 with the guest's kernel (Linux 6.1)
does with them: the cases :class:`~kubeproxy.dataplane.ipset.fake.FakeIpset` is checked
against, without root (tests/unit/test_fake_parity.py) and in the user-mode-linux guest
against :class:`~kubeproxy.dataplane.ipset.IpsetCommand` in a fresh namespace
(tests/ipvs/test_fakes_vs_kernel.py). See tests/parity.py.

A refusal is described as ``line N: message`` (``line None`` where ipset names no
line). The state compared after each step is every set with its type, family and
members; after a refused restore only the sets and their types, since ipset may not
have applied the adds before the refused line (it sends them in batches): a case
with such a restore ends there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kubeproxy.dataplane.ipset import Ipset, IpsetError, IpsetScript, SetSpec
from tests.parity import Call, Case, Op, Step, Table


@dataclass
class IpsetSystem:
    ipset: Ipset
    # Make an iptables rule use the set (the real one: iptables-legacy -m set; the fake:
    # its in_use names).
    reference: Callable[[str], None]


def _describe(err: Exception) -> str:
    assert isinstance(err, IpsetError)
    return f"line {err.line}: {err}"


def _state(system: IpsetSystem, refused: bool) -> object:
    sets = system.ipset.sets()
    if refused:
        return {name: (s.type, s.v6) for name, s in sets.items()}
    return {name: (s.type, s.v6, sorted(s.members)) for name, s in sets.items()}


TABLE = Table[IpsetSystem]((IpsetError,), _describe, _state)


# ------------------------------------------------------------------------ operations


def restore(*lines: str) -> Call[IpsetSystem]:
    text = "restore -exist:\n" + "\n".join(lines)
    return Call(text, lambda s: s.ipset.restore(IpsetScript(list(lines))))


def reference(name: str) -> Call[IpsetSystem]:
    return Call(f"an iptables rule uses {name}", lambda s: s.reference(name))


VERSION = Call[IpsetSystem]("version", lambda s: s.ipset.version())


# -------------------------------------------------------------------------- builders


def create(name: str, set_type: str, v6: bool = False) -> str:
    """A create line as the backends write it (kube-proxy's options)."""
    script = IpsetScript()
    script.create(SetSpec(name, set_type, v6))
    return script.lines[0]


def ok(*lines: str) -> Step[IpsetSystem]:
    return Step(restore(*lines))


def refused(error: str, *lines: str) -> Step[IpsetSystem]:
    return Step(restore(*lines), error=error)


def step(op: Op[IpsetSystem], result: object = None) -> Step[IpsetSystem]:
    return Step(op, result=result)


def case(name: str, *steps: Step[IpsetSystem]) -> Case[IpsetSystem]:
    return Case(name, steps)


HASH = "family inet hashsize 1024 maxelem 65536 comment"
NO_SUCH_SET = "The set with the given name does not exist"
SAME_NAME = "Set cannot be created: set with the same name already exists"


# ----------------------------------------------------------------------------- cases

CASES: list[Case[IpsetSystem]] = [
    case("The version", step(VERSION, "7.17")),
    case(
        "A set is created, filled, emptied and destroyed; -exist forgives repeats",
        ok(create("A", "hash:ip,port"), "add A 10.0.0.1,tcp:80", "add A 10.0.0.1,tcp:80"),
        ok("del A 10.0.0.2,tcp:80", 'add A 10.0.0.9,tcp:80 comment "hello"'),
        ok("flush A"),
        ok("destroy A"),
        ok("destroy A"),  # a set that does not exist: fine under -exist
    ),
    case(
        "Every type kube-proxy uses, in both families, members as ipset save prints them",
        ok(
            create("IP4", "hash:ip"),
            create("IP6", "hash:ip", v6=True),
            create("PORT6", "hash:ip,port", v6=True),
            create("IPPORTIP", "hash:ip,port,ip"),
            create("IPPORTNET", "hash:ip,port,net"),
            create("PORTS", "bitmap:port"),
            "add IP4 10.0.0.1",
            "add IP4 10.0.0.2/32",
            "add IP6 fd00::1/128",
            "add IP6 fd00:0::2",
            "add PORT6 fd00::1,udp:53",
            "add IPPORTIP 10.0.0.1,tcp:80,10.0.0.2",
            "add IPPORTNET 10.0.0.1,tcp:80,10.1.0.0/16",
            "add IPPORTNET 10.0.0.1,tcp:80,10.2.0.1/24",
            "add IPPORTNET 10.0.0.1,sctp:80,10.3.0.1/32",
            "add PORTS 80",
            "add PORTS tcp:81",
            "add PORTS udp:82",
            "add PORTS 0",
            "add PORTS 65535",
        ),
    ),
    case(
        "A port without a protocol is tcp; udplite is a protocol too",
        ok(create("A", "hash:ip,port"), "add A 10.0.0.2,80", "add A 10.0.0.3,udplite:80"),
    ),
    case(
        "Creating a set again: the same type, family and hash size may differ, not the rest",
        ok(create("A", "hash:ip,port")),
        ok(create("A", "hash:ip,port")),
        ok("create A hash:ip,port family inet6 hashsize 1024 maxelem 65536 comment"),  # kept
        ok("create A hash:ip,port family inet hashsize 2048 maxelem 65536 comment"),
        refused(f"^line 1: .*{SAME_NAME}", create("A", "hash:ip")),
        refused(f"^line 1: .*{SAME_NAME}", "create A hash:ip,port family inet maxelem 100 comment"),
        refused(f"^line 1: .*{SAME_NAME}", "create A hash:ip,port family inet maxelem 65536"),
        ok("create B hash:ip"),
        refused(f"^line 1: .*{SAME_NAME}", create("B", "hash:ip")),  # now with comments
    ),
    case(
        "Names up to 31 characters; types ipset knows",
        ok(create("A" * 31, "hash:ip")),
        refused(
            r"^line 1: .*setname 'A{32}' is longer than 31 characters",
            f"create {'A' * 32} hash:ip {HASH}",
        ),
        refused("^line 1: .*typename 'hash:foo' is unknown", f"create B hash:foo {HASH}"),
    ),
    case(
        "Members that do not fit the set",
        ok(
            create("A", "hash:ip,port"),
            create("B", "hash:ip,port,ip"),
            create("C", "hash:ip,port,net"),
            create("D", "hash:ip", v6=True),
        ),
        refused(
            "^line 1: .*cannot parse fd00::1: resolving to IPv4 address failed",
            "add A fd00::1,tcp:80",
        ),
        refused(
            "^line 1: .*cannot parse 10.0.0.1: resolving to IPv6 address failed", "add D 10.0.0.1"
        ),
        refused("^line 1: .*cannot parse 'any' as a protocol", "add A 10.0.0.5,any:0"),
        refused(
            "^line 1: .*plain IP address must be supplied: 10.0.0.0/31",
            "add B 10.0.0.1,udp:53,10.0.0.0/31",
        ),
        refused(
            "^line 1: .*The value of the CIDR parameter of the IP address is invalid",
            "add C 10.0.0.1,tcp:80,0.0.0.0/0",
        ),
    ),
    case(
        "A port out of range: refused, and ipset names no line",
        ok(create("A", "hash:ip,port"), create("P", "bitmap:port")),
        refused("^line None: .*'70000' is out of range 0-65535", "add A 10.0.0.6,tcp:70000"),
        refused("^line None: .*'65536' is out of range 0-65535", "add P 65536"),
    ),
    case(
        "A set that does not exist, named at the refused line (creates before it stay)",
        refused(f"^line 1: .*{NO_SUCH_SET}", "add Z 10.0.0.1"),
        refused(f"^line 1: .*{NO_SUCH_SET}", "del Z 10.0.0.1"),
        refused(f"^line 1: .*{NO_SUCH_SET}", "flush Z"),
        refused(
            f"^line 3: .*{NO_SUCH_SET}",
            create("C", "hash:ip"),
            create("D", "hash:ip"),
            "add Z 1.2.3.4",
        ),
    ),
    case(
        "Adds before a refused line may be lost: the sets are unknown after a refusal",
        refused(
            f"^line 4: .*{NO_SUCH_SET}",
            create("C", "hash:ip"),
            "add C 10.0.0.1",
            "add C 10.0.0.2",
            "add Z 1.2.3.4",
            "add C 10.0.0.3",
        ),
    ),
    case(
        "A set an iptables rule uses cannot be destroyed",
        ok(create("A", "hash:ip")),
        step(reference("A")),
        refused(
            "^line 1: .*Set cannot be destroyed: it is in use by a kernel component", "destroy A"
        ),
        ok("flush A"),
    ),
]

# Deliberately stricter than ipset (kube-proxy writes single members, canonically):
# (what, the set's type, the add line, what ipset does with it instead).
STRICTER = [
    ("A network where a set wants addresses", "hash:ip", "10.0.3.0/30", "adds each address"),
    ("A network in a hash:ip,port address", "hash:ip,port", "10.0.1.0/30,tcp:80", "adds each"),
    ("A port range", "hash:ip,port", "10.0.2.1,tcp:80-82", "adds each port"),
    ("A port range in a port bitmap", "bitmap:port", "90-92", "adds each port"),
    ("An ICMP type as the port", "hash:ip,port", "10.0.0.4,icmp:ping", "stores icmp:echo-request"),
    ("An address with leading zeros", "hash:ip,port", "010.0.0.7,tcp:80", "reads 8.0.0.7 (octal)"),
]
CASES += [
    case(
        what,
        ok(create("A", set_type)),
        Step(restore(f"add A {member}"), error="^line 1: ", kernel_accepts=f"ipset {instead}"),
    )
    for what, set_type, member, instead in STRICTER
]
