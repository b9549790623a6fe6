"""The iptables rule language kube-proxy writes: a rule's arguments parsed as iptables
1.8.9 parses them, refused where it refuses them, and printed as ``iptables-save``
prints them.

:func:`parse_rule` takes the arguments after ``-A CHAIN`` (a tuple, as
:class:`~kubeproxy.dataplane.iptables.restore.Restore` holds them) and returns a
:class:`ParsedRule`: its canonical text (what ``iptables-save`` prints after ``-A
CHAIN``), the user chain it jumps to, and what only the kernel checks, when the table is
committed: the table a target belongs to, the builtin chains it may run from, and
protocol requirements of matches. It raises :class:`RuleError` for what iptables itself
refuses while reading the line. The strict fake
(:mod:`kubeproxy.dataplane.iptables.fake`) is built on it, and ``-C``/``-D`` there
compare canonical texts, as iptables compares rules after parsing them
(``--or-mark 0x4000`` is ``--set-xmark 0x4000/0x4000``).

The flavours differ in one place here (``nft=True``): iptables-nft writes tcp/udp ports
as its own expressions and reads them back as one match per protocol, so it prints
``-m tcp --sport 5 --dport 80`` for two tcp matches, and no kernel match checks their
protocol; it also refuses ``! -s 0.0.0.0/0``.

Map: header options (``-s -d -i -o -p``) -> matches (``-m NAME`` and their options,
each option owned by the most recently loaded extension that knows it; an option of the
``-p`` protocol's match loads that match where it appears, as iptables does) -> target
(``-j``/``-g``). One small class per extension (``_Tcp``, ``_Recent``, ``_Dnat``...)
lists its options and prints itself. This module parses a rule's words (the header
options, then the extensions they load) and prints the result; the pieces are modules
of their own: :mod:`.rule_values` (option values, and :class:`RuleError`, re-exported
here), :mod:`.rule_matches` (the matches), :mod:`.rule_targets` (the targets).

The language is deliberately the subset kube-proxy uses: matches ``comment``,
``conntrack --ctstate``, ``mark``, ``addrtype``, ``nfacct --nfacct-name``,
``tcp``/``udp``/``sctp`` ports, ``multiport``, ``statistic``, ``recent``; targets
``ACCEPT``, ``DROP``, ``RETURN``, user chains, ``DNAT``, ``MASQUERADE``, ``MARK``,
``REJECT``. Anything else is refused as "not
modelled", so a backend cannot write a rule the fake cannot vouch for. Where iptables
accepts more forms than kube-proxy needs, this is stricter (the fake's docstring lists
each case): host names, address lists (``-d a,b`` becomes two rules), dotted masks,
service names for ports, abbreviated option names (getopt accepts ``--dpo``), and
comments over 255 characters (iptables silently truncates them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from kubeproxy.dataplane.iptables.rule_matches import (
    _PROTOCOL_MATCHES,
    MATCHES,
    _Context,
    _Extension,
    _Ports,
)
from kubeproxy.dataplane.iptables.rule_targets import (
    TARGETS,
    _Target,
)
from kubeproxy.dataplane.iptables.rule_values import (
    RuleError,
    parse_interface,
    parse_network,
    parse_protocol,
)
from kubeproxy.model.types import IPFamily


@dataclass(frozen=True)
class ParsedRule:
    """One rule as iptables holds it."""

    # The canonical form: what ``iptables-save`` prints after ``-A CHAIN``.
    text: str
    # The chain this rule jumps (``-j``) or goes (``-g``) to, if it is not a target
    # extension or a verdict.
    jump: str | None = None
    # The target extension or verdict (``DNAT``, ``ACCEPT``...), if any.
    target: str | None = None
    # Checked by the kernel when the table is committed: the only table the target may
    # be used in, the builtin chains it may run from (if it is reachable), and problems
    # found whatever the chain.
    table: str | None = None
    hooks: frozenset[str] | None = None
    kernel_errors: tuple[str, ...] = ()
    in_iface: bool = False
    out_iface: bool = False
    # The nfacct counter the rule feeds (the kernel refuses a counter that does not exist).
    nfacct: str | None = None


_HEADER = {
    "-s": "s",
    "--source": "s",
    "--src": "s",
    "-d": "d",
    "--destination": "d",
    "--dst": "d",
    "-i": "i",
    "--in-interface": "i",
    "-o": "o",
    "--out-interface": "o",
    "-p": "p",
    "--protocol": "p",
}


def parse_rule(
    args: Sequence[str], family: IPFamily, *, nft: bool = False, random_fully: bool = True
) -> ParsedRule:
    """Parse one rule's arguments as the legacy or (``nft=True``) the nft flavour does;
    :class:`RuleError` if iptables would refuse the line."""
    return _parse(tuple(args), family, nft, random_fully)


def canonical_text(
    args: Sequence[str], family: IPFamily, *, nft: bool = False, random_fully: bool = True
) -> str:
    """What ``iptables-save`` prints for the rule (after ``-A CHAIN``); RuleError if
    iptables refuses it. Not cached: a full sync's comparison with the kernel parses each
    of (up to) hundreds of thousands of distinct rules once, which would only push the
    fake's rules out of :func:`parse_rule`'s cache and hold on to memory."""
    return _parse.__wrapped__(tuple(args), family, nft, random_fully).text


@lru_cache(maxsize=1 << 17)
def _parse(args: tuple[str, ...], family: IPFamily, nft: bool, random_fully: bool) -> ParsedRule:
    ctx = _Context(family, nft=nft, random_fully=random_fully)
    header: dict[str, tuple[bool, str]] = {}
    matches: list[_Extension] = []
    owners: list[_Extension] = []  # matches and target, in load order
    target: _Target | None = None
    jump: tuple[str, str] | None = None  # ("-j" or "-g", chain)
    negated = False
    i = 0

    def next_value(option: str) -> str:
        nonlocal i
        i += 1
        if i >= len(args):
            raise RuleError(f"option {option!r} requires an argument")
        return args[i]

    while i < len(args):
        token = args[i]
        if token == "!":
            if negated:
                raise RuleError("multiple `!' flags not allowed")
            negated = True
            i += 1
            continue
        if token in _HEADER:
            key = _HEADER[token]
            if key in header:
                raise RuleError(f"multiple -{key} flags not allowed")
            raw = next_value(token)
            if key in "sd":
                value = parse_network(raw, family)
            elif key in "io":
                value = parse_interface(raw)
            else:
                value = parse_protocol(raw)
                if value == "all" and negated:
                    raise RuleError("! -p all is not modelled")
                ctx.protocol, ctx.protocol_negated = value, negated
            header[key] = (negated, value)
        elif token in ("-m", "--match"):
            if negated:
                raise RuleError("unexpected ! flag before --match")
            name = next_value(token)
            if name not in MATCHES:
                raise RuleError(f"Couldn't load match `{name}' (not modelled)")
            ext = MATCHES[name](ctx)
            matches.append(ext)
            owners.append(ext)
        elif token in ("-j", "--jump", "-g", "--goto"):
            if negated:
                raise RuleError(f"cannot have ! before {token}")
            if target is not None or jump is not None:
                raise RuleError("multiple -j flags not allowed")
            name = next_value(token)
            goto = token in ("-g", "--goto")
            if name in TARGETS and not goto:
                target = TARGETS[name](ctx)
                owners.append(target)
            else:
                jump = ("-g" if goto else "-j", name)
        elif token.startswith("-"):
            owner = next((o for o in reversed(owners) if token in o.options), None)
            protocol = ctx.protocol  # negated or not: the kernel checks that later
            if (
                owner is None
                and protocol in _PROTOCOL_MATCHES
                and token in _PROTOCOL_MATCHES[protocol].options
            ):
                # iptables loads the -p protocol's match for its options, here.
                owner = _PROTOCOL_MATCHES[protocol](ctx)
                matches.append(owner)
                owners.append(owner)
            if owner is None:
                raise RuleError(f'unknown option "{token}"')
            taken = next_value(token) if owner.options[token][1] else None
            if taken is not None and token in owner.pairs:
                # --match-set NAME FLAGS: the one option with two values.
                taken = f"{taken} {next_value(token)}"
            owner.take(token, taken, negated)
        else:
            raise RuleError(f"Bad argument `{token}'")
        negated = False
        i += 1
    if negated:
        raise RuleError("trailing `!'")

    parts: list[str] = []
    for key in ("s", "d", "i", "o", "p"):
        if key not in header or header[key][1] == "all":
            continue
        neg, value = header[key]
        if key in "sd" and value.endswith("/0"):
            if not neg:
                continue  # any address: not printed
            if nft:
                ctx.kernel_errors.append(f"! -{key} {value} matches nothing (nft refuses it)")
        parts.append(f"{'! ' if neg else ''}-{key} {value}")
    kept: list[_Extension] = []
    native: dict[str, _Ports] = {}
    for m in matches:
        if isinstance(m, _Ports) and m.native:
            first = native.setdefault(m.name, m)
            if first is not m:
                first.merge(m)
                continue
        kept.append(m)
    parts.extend(f"-m {m.name}{m.finish()}" for m in kept)
    if target is not None:
        parts.append(f"-j {target.name}{target.finish()}")
    elif jump is not None:
        parts.append(f"{jump[0]} {jump[1]}")
    return ParsedRule(
        text=" ".join(parts),
        jump=jump[1] if jump is not None else None,
        target=target.name if target is not None else None,
        table=target.table if target is not None else None,
        hooks=target.hooks if target is not None else None,
        kernel_errors=tuple(ctx.kernel_errors),
        in_iface="i" in header,
        out_iface="o" in header,
        nfacct=ctx.nfacct,
    )


__all__ = ["ParsedRule", "RuleError", "canonical_text", "parse_rule"]
