"""The strict nftables fake's vocabulary: what nft accepts as names, datatypes,
elements, priorities and rule references, and how it words a refusal.

Part of the fake (:mod:`kubeproxy.dataplane.nftables.fake` maps it and lists the kernel
and nft facts it models):

* **Refusals** -- ``_RefusedError`` (a ValueError, so the public parsers raise just
  that), made by ``_kernel`` (an errno text as ``nft`` prints it: :data:`ENOENT`...)
  or ``_nft`` (nft's own userspace message).
* **Datatypes** -- :func:`parse_set_type` turns a set's ``type``/``typeof`` clause into
  component datatypes (:class:`SetType`); :func:`canonical_key` / :func:`canonical_value`
  validate an element against them and give its canonical text (the form ``nft list``
  prints: ``10.0.0.0/24``, ``tcp``, ``goto x``) and, for interval sets, its
  :data:`Bounds`; :func:`split_comment` separates an element's comment.
* **Chains** -- :func:`parse_priority` reads a base chain priority (``-110``,
  ``dstnat``, ``filter + 10``); :func:`rule_references` finds the chains a rule jumps to
  and the sets it uses (rules are otherwise opaque text).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from functools import lru_cache

from kubeproxy.dataplane.nftables.transaction import (
    COMMENT_MAX,
    NAME_PATTERN,
)

FAMILIES = frozenset({"ip", "ip6", "inet", "arp", "bridge", "netdev"})
CHAIN_TYPES = frozenset({"filter", "nat", "route"})
HOOKS = frozenset({"prerouting", "input", "forward", "output", "postrouting", "ingress"})
SET_FLAGS = frozenset({"interval", "dynamic", "timeout", "constant"})

# errno texts as nft prints them after "Could not process rule: ".
ENOENT = "No such file or directory"
EEXIST = "File exists"
EBUSY = "Device or resource busy"
EOPNOTSUPP = "Operation not supported"
EINVAL = "Invalid argument"


class _RefusedError(ValueError):
    """An operation the kernel or nft would refuse; the message is nft-like.

    A ValueError, so the public parsers (:func:`canonical_key` ...) raise just that."""


def _kernel(errno_text: str, detail: str) -> _RefusedError:
    return _RefusedError(f"Error: Could not process rule: {errno_text} ({detail})")


def _nft(message: str) -> _RefusedError:
    return _RefusedError(f"Error: {message}")


# Datatypes the fake knows, with the number of bits of an integer value.
_INT_BITS = {"inet_proto": 8, "inet_service": 16, "integer": 32, "mark": 32}
_ADDR_VERSION = {"ipv4_addr": 4, "ipv6_addr": 6}
VERDICT = "verdict"

_PROTOCOLS = {
    "icmp": 1,
    "igmp": 2,
    "tcp": 6,
    "udp": 17,
    "dccp": 33,
    "gre": 47,
    "esp": 50,
    "ah": 51,
    "icmpv6": 58,
    "ipv6-icmp": 58,
    "sctp": 132,
    "udplite": 136,
}
# As nft prints them (/etc/protocols names).
_PROTOCOL_NAMES = {n: name for name, n in _PROTOCOLS.items() if name != "icmpv6"}
# What a "type" clause may name (typeof clauses may also give 32-bit "integer" keys).
_TYPE_NAMES = frozenset({"ipv4_addr", "ipv6_addr", "inet_proto", "inet_service", "mark"})

# typeof expressions -> the datatype nft derives from them.
_TYPEOF = [
    (re.compile(r"^ip (saddr|daddr)$"), "ipv4_addr"),
    (re.compile(r"^ip6 (saddr|daddr)$"), "ipv6_addr"),
    (re.compile(r"^(meta l4proto|ip protocol|ip6 nexthdr)$"), "inet_proto"),
    (re.compile(r"^(th|tcp|udp|sctp) (sport|dport)$"), "inet_service"),
    (re.compile(r"^numgen (random|inc) mod \d+( offset \d+)?$"), "integer"),
    (re.compile(r"^(meta|ct) mark$"), "mark"),
]
_CONCAT = re.compile(r"\s+\.\s+")
_IPV4 = re.compile(
    r"^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$"
)
_NAME = NAME_PATTERN
_ELEMENT_COMMENT = re.compile(r'^(.*?)\s+comment\s+"([^"]*)"$', re.DOTALL)


def split_comment(text: str) -> tuple[str, str | None]:
    """An element key as written (``KEY comment "TEXT"``) → the key and the comment."""
    m = _ELEMENT_COMMENT.match(text.strip())
    if m is None:
        return text, None
    if len(m.group(2).encode()) > COMMENT_MAX:
        raise _nft(f"comment too long, {COMMENT_MAX} characters maximum allowed")
    return m.group(1), m.group(2)


_VERDICT = re.compile(rf"^(?:(accept|drop|continue|return)|(jump|goto)\s+({_NAME}))$")


@dataclass(frozen=True, slots=True)
class SetType:
    """A set's key (and, for maps, data) as datatypes, with the clause it came from."""

    key: tuple[str, ...]
    data: tuple[str, ...] | None
    spec: str
    # A typeof map whose data mixes ip/ip6 with th: nft 1.0.6 cannot rebuild it from the
    # kernel ("conflicting protocols specified: ip vs. th").
    unreadable_typeof: bool = False

    @property
    def is_verdict_map(self) -> bool:
        return self.data == (VERDICT,)


@lru_cache(maxsize=256)
def parse_set_type(spec: str, keyword: str = "set") -> SetType:
    """``ipv4_addr . inet_service : verdict`` or ``typeof ip daddr : ip daddr . th dport``."""
    typeof = spec.startswith("typeof ")
    body = spec[len("typeof ") :] if typeof else spec
    key_text, sep, data_text = body.partition(" : ")
    if (keyword == "map") != bool(sep):
        raise _nft(f"{keyword} {spec!r}: a map needs 'key : data', a set only a key")

    def components(text: str, data: bool) -> tuple[str, ...]:
        out = []
        for part in _CONCAT.split(text.strip()):
            if typeof:
                found = next((dt for rx, dt in _TYPEOF if rx.match(part)), None)
                if found is None:
                    raise _nft(f"fake: typeof expression {part!r} is not modelled")
                out.append(found)
            elif part in _TYPE_NAMES or (data and part == VERDICT):
                out.append(part)
            else:
                raise _nft(f"fake: datatype {part!r} is not modelled")
        if len(out) > 1 and VERDICT in out:
            raise _nft("verdict cannot be part of a concatenation")
        return tuple(out)

    data_exprs = _CONCAT.split(data_text.strip()) if typeof and sep else []
    unreadable = any(e.startswith(("ip ", "ip6 ")) for e in data_exprs) and any(
        e.startswith("th ") for e in data_exprs
    )
    return SetType(
        components(key_text, False),
        components(data_text, True) if sep else None,
        spec,
        unreadable,
    )


Bounds = tuple[int, int]


def _address(text: str, version: int) -> tuple[str, Bounds]:
    if version == 4 and _IPV4.match(text):  # the common case, kept cheap
        a, b, c, d = (int(x) for x in text.split("."))
        value = (a << 24) | (b << 16) | (c << 8) | d
        return text, (value, value)
    try:
        if "/" in text:
            net = ipaddress.ip_network(text, strict=False)
            lo, hi = net.network_address, net.broadcast_address
        elif "-" in text:
            first, last = text.split("-", 1)
            lo, hi = ipaddress.ip_address(first.strip()), ipaddress.ip_address(last.strip())
        else:
            lo = hi = ipaddress.ip_address(text)
    except ValueError:
        raise _nft(f"Could not resolve hostname: {text}") from None
    if lo.version != version or hi.version != version:
        raise _nft(
            f"Could not resolve hostname: Address family for hostname not supported ({text})"
        )
    bounds = (int(lo), int(hi))
    if bounds[0] > bounds[1]:
        raise _nft(f"Range has zero or negative size ({text})")
    return _range_text(bounds, version), bounds


def _range_text(bounds: Bounds, version: int) -> str:
    """An address range as nft prints it: one address, a prefix, or ``first-last``."""
    lo, hi = bounds
    bits = 32 if version == 4 else 128
    make = ipaddress.IPv4Address if version == 4 else ipaddress.IPv6Address
    if lo == hi:
        return str(make(lo))
    size = hi - lo + 1
    if size & (size - 1) == 0 and lo % size == 0:
        return f"{make(lo)}/{bits - size.bit_length() + 1}"
    return f"{make(lo)}-{make(hi)}"


def _integer(dtype: str, text: str) -> tuple[str, Bounds]:
    limit = (1 << _INT_BITS[dtype]) - 1
    if dtype == "inet_proto" and text in _PROTOCOLS:  # before "-" is read as a range
        value = _PROTOCOLS[text]
        return _PROTOCOL_NAMES[value], (value, value)
    first, dash, last = text.partition("-")
    values = []
    for raw in (first, last) if dash else (first,):
        part = raw.strip()
        try:
            value = int(part, 0) if dtype in ("integer", "mark") else int(part, 10)
        except ValueError:
            what = {"inet_proto": "protocol", "inet_service": "service"}.get(dtype, "value")
            raise _nft(f"Could not resolve {what} name {part!r}") from None
        if not 0 <= value <= limit:
            if dtype == "inet_proto":
                raise _nft(f"Protocol out of range ({part})")
            if dtype == "inet_service":
                raise _nft(f"Service out of range ({part})")
            raise _nft(f"Value {value} exceeds valid range 0-{limit}")
        values.append(value)
    lo, hi = values[0], values[-1]
    if lo > hi:
        raise _nft(f"Range has zero or negative size ({text})")

    def show(v: int) -> str:
        return _PROTOCOL_NAMES.get(v, str(v)) if dtype == "inet_proto" else str(v)

    return (show(lo) if lo == hi else f"{show(lo)}-{show(hi)}"), (lo, hi)


@lru_cache(maxsize=1 << 16)
def _component(dtype: str, text: str) -> tuple[str, Bounds]:
    """One element component: its canonical text and its bounds (equal for a point)."""
    version = _ADDR_VERSION.get(dtype)
    if version is not None:
        return _address(text, version)
    return _integer(dtype, text)


def _concatenation(
    types: tuple[str, ...], text: str, interval: bool
) -> tuple[str, tuple[Bounds, ...]]:
    # Hot path (a full sync parses every element): the backends write keys with single
    # spaces around the dots, so a plain split usually does.
    if "\t" in text or "  " in text or text != text.strip():
        parts = _CONCAT.split(text.strip())
    else:
        parts = text.split(" . ")
    if len(parts) != len(types):
        raise _nft(
            f"datatype mismatch, expected concatenation of ({', '.join(types)}), "
            f"expression is {text!r}"
        )
    if not interval and ("/" in text or "-" in text):
        # Refused by the syntax even when it spans one value (1.1.1.1/32, 80-80).
        for part in parts:
            kind = "prefix" if "/" in part else "range" if "-" in part else None
            if kind and part not in _PROTOCOLS:  # ipv6-icmp is a name, not a range
                raise _nft(
                    "You must add 'flags interval' to your set declaration if you want "
                    f"to add {kind} elements ({text})"
                )
    if len(parts) == 1:
        canon, bounds = _component(types[0], parts[0])
        return canon, (bounds,)
    comps = list(map(_component, types, parts))
    return " . ".join([c for c, _ in comps]), tuple([b for _, b in comps])


def canonical_key(stype: SetType, text: str, interval: bool) -> tuple[str, tuple[Bounds, ...]]:
    """An element key as nft prints it, with its bounds (ValueError if nft would refuse it)."""
    return _concatenation(stype.key, text, interval)


@lru_cache(maxsize=4096)
def _verdict(text: str) -> tuple[str, str | None]:
    """A verdict's canonical text and the chain it jumps to (if any)."""
    m = _VERDICT.match(text.strip())
    if m is None:
        raise _nft(f"syntax error: {text!r} is not a verdict")
    if m.group(1):
        return m.group(1), None
    return f"{m.group(2)} {m.group(3)}", m.group(3)


def canonical_value(stype: SetType, text: str) -> str:
    """A map element's value as nft prints it."""
    assert stype.data is not None
    if stype.is_verdict_map:
        return _verdict(text)[0]
    return _concatenation(stype.data, text, False)[0]


_PRIORITY_NAMES = {
    "raw": -300,
    "mangle": -150,
    "dstnat": -100,
    "filter": 0,
    "security": 50,
    "srcnat": 100,
}
_PRIORITY = re.compile(r"^(?:([a-z]+)\s*(?:([+-])\s*(\d+))?|(-?\d+))$")


def parse_priority(text: str) -> int:
    """``-110``, ``dstnat``, ``filter + 10`` -> the number (ip/ip6/inet families)."""
    m = _PRIORITY.match(text.strip())
    if m is None or (m.group(1) is not None and m.group(1) not in _PRIORITY_NAMES):
        raise _nft(f"unknown chain priority {text!r}")
    if m.group(4) is not None:
        return int(m.group(4))
    offset = int(m.group(3) or 0)
    return _PRIORITY_NAMES[m.group(1)] + (-offset if m.group(2) == "-" else offset)


@dataclass(frozen=True, slots=True)
class RuleRefs:
    chains: tuple[str, ...]  # one entry per jump/goto (counts matter)
    sets: tuple[str, ...]  # one entry per @name


_QUOTED = re.compile(r'"[^"]*"')
_RULE_REF = re.compile(rf"(?<![\w.-])(?:jump|goto)\s+({_NAME})|@({_NAME})")


@lru_cache(maxsize=8192)
def rule_references(rule: str) -> RuleRefs:
    """The chains a rule jumps to and the sets it uses, as the kernel counts them."""
    # Quoted strings (comments) are data, not references.
    found = _RULE_REF.findall(_QUOTED.sub('""', rule))
    return RuleRefs(tuple(c for c, _ in found if c), tuple(s for _, s in found if s))
