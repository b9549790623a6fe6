"""How many rules the first packet of a connection meets, read from ``iptables-save``.

A small interpreter for the rules iptables mode writes (and the few matches they use):
it follows one packet through a table's built-in chain — jumps, ``RETURN``, ``MARK``,
terminal targets, a built-in chain's ``ACCEPT`` policy — and counts the rules examined in
each chain. :func:`first_packet` follows the SYN of a Pod's connection to a ClusterIP
through the hooks it crosses on the node: nat PREROUTING (to the DNAT), filter FORWARD
(after it), nat POSTROUTING. Anything it does not know (``-m recent``, interfaces...)
raises, so a count is never a guess.
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass, field, replace

from kubeproxy.backends.iptables.names import DISPATCH_PREFIX

Rules = dict[str, list[list[str]]]  # chain -> rules (arguments after "-A CHAIN")
TERMINAL = {"ACCEPT", "DROP", "REJECT", "DNAT", "MASQUERADE", "SNAT"}


class UnsupportedRuleError(ValueError):
    """A rule uses a match or target this interpreter does not model."""


@dataclass(frozen=True)
class Packet:
    src: str
    dst: str
    dport: int
    proto: str = "tcp"
    mark: int = 0
    ctstate: str = "NEW"


@dataclass
class Step:
    chain: str
    examined: int  # rules looked at in this visit
    length: int  # rules in the chain


@dataclass
class Walk:
    steps: list[Step] = field(default_factory=list)
    verdict: str = "ACCEPT"  # the built-in chain's policy when nothing decided
    packet: Packet | None = None  # as it leaves (DNAT, MARK applied)

    @property
    def examined(self) -> int:
        return sum(s.examined for s in self.steps)


def parse_save(text: str) -> Rules:
    """The rules of one table in ``iptables-save`` output."""
    rules: Rules = {}
    for line in text.splitlines():
        if line.startswith(":"):
            rules.setdefault(line[1:].split()[0], [])
        elif line.startswith("-A "):
            words = shlex.split(line)
            rules.setdefault(words[1], []).append(words[2:])
    return rules


def _in(address: str, network: str) -> bool:
    return ipaddress.ip_address(address) in ipaddress.ip_network(network, strict=False)


def _matches(args: list[str], p: Packet) -> tuple[bool, list[str]]:
    """Whether the matches of a rule hold for ``p``; the target part of ``args``."""
    i, negate = 0, False
    while i < len(args):
        word = args[i]
        if word == "!":
            negate, i = True, i + 1
            continue
        if word == "-j":
            return True, args[i + 1 :]
        value = args[i + 1] if i + 1 < len(args) else ""
        if word in ("-m", "--comment", "--mode", "--probability"):
            ok = True  # module loads, comments; a statistic match is taken as chosen
        elif word in ("-s", "-d"):
            ok = _in(p.src if word == "-s" else p.dst, value)
        elif word == "-p":
            ok = p.proto == value
        elif word == "--dport":
            low, _, high = value.partition(":")
            ok = int(low) <= p.dport <= int(high or low)
        elif word == "--ctstate":
            ok = p.ctstate in value.split(",")
        elif word in ("--dst-type", "--src-type"):
            ok = False  # a Pod's connection to a Service: neither end is a local address
        elif word == "--mark":
            want, _, mask = value.partition("/")
            ok = p.mark & int(mask or "0xffffffff", 16) == int(want, 16)
        else:
            raise UnsupportedRuleError(f"match {word} in {' '.join(args)}")
        if ok == negate:
            return False, []
        negate, i = False, i + 2
    return True, []  # no target: a rule that only counts


def _mark(mark: int, options: list[str]) -> int:
    """The MARK target as written (``--or-mark``) or saved (``--set-xmark V/M``)."""
    op, text = options[0], options[1]
    value, _, mask_text = text.partition("/")
    v = int(value, 16)
    if op == "--or-mark":
        return mark | v
    if op == "--xor-mark":
        return mark ^ v
    if op == "--set-xmark":
        m = int(mask_text or "0xffffffff", 16)
        return (mark & ~m) ^ v
    raise UnsupportedRuleError(f"MARK {op}")


def walk(rules: Rules, chain: str, packet: Packet) -> Walk:
    """Follow ``packet`` from built-in ``chain``."""
    result = Walk(packet=packet)
    verdict = _visit(rules, chain, result, depth=0)
    result.verdict = verdict or "ACCEPT"
    return result


def _visit(rules: Rules, chain: str, result: Walk, depth: int) -> str | None:
    if depth > 32:
        raise UnsupportedRuleError(f"jump loop through {chain}")
    chain_rules = rules.get(chain, [])
    step = Step(chain, 0, len(chain_rules))
    result.steps.append(step)
    for args in chain_rules:
        step.examined += 1
        assert result.packet is not None
        ok, target = _matches(args, result.packet)
        if not ok or not target:
            continue
        name, options = target[0], target[1:]
        if name == "RETURN":
            return None
        if name == "MARK":
            result.packet = replace(result.packet, mark=_mark(result.packet.mark, options))
            continue
        if name == "DNAT":
            ip, _, port = options[options.index("--to-destination") + 1].rpartition(":")
            result.packet = replace(result.packet, dst=ip, dport=int(port))
            return name
        if name in TERMINAL:
            return name
        if name not in rules:
            raise UnsupportedRuleError(f"target {name}")
        verdict = _visit(rules, name, result, depth + 1)
        if verdict is not None:
            return verdict
    return None


@dataclass(frozen=True)
class FirstPacket:
    nat_prerouting: Walk
    filter_forward: Walk
    nat_postrouting: Walk

    @property
    def examined(self) -> int:
        return sum(w.examined for w in (self.nat_prerouting, self.filter_forward,
                                        self.nat_postrouting))  # fmt: skip

    def tree(self) -> list[Step]:
        """The dispatch-tree chains the packet went through in nat PREROUTING."""
        return [s for s in self.nat_prerouting.steps if s.chain.startswith(DISPATCH_PREFIX)]


def first_packet(nat: str, filter_: str, packet: Packet) -> FirstPacket:
    """The SYN of a Pod's connection to a Service, through a node's nat and filter
    tables (``iptables-save -t nat`` / ``-t filter`` output)."""
    nat_rules, filter_rules = parse_save(nat), parse_save(filter_)
    pre = walk(nat_rules, "PREROUTING", packet)
    if pre.verdict != "DNAT":
        raise UnsupportedRuleError(f"the packet was not DNATed: {pre.verdict}")
    assert pre.packet is not None
    fwd = walk(filter_rules, "FORWARD", pre.packet)
    assert fwd.packet is not None
    post = walk(nat_rules, "POSTROUTING", fwd.packet)
    return FirstPacket(pre, fwd, post)
