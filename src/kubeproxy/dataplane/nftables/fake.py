"""A strict in-memory nftables: applies transactions all or nothing, refusing what the
kernel (6.x) with nft 1.0.6 refuses, so backends can be tested without root.

After kubernetes-sigs/knftables' fake. :class:`FakeNftables` implements
:class:`~kubeproxy.dataplane.nftables.runner.NftRunner`: ``apply`` runs a
:class:`~kubeproxy.dataplane.nftables.transaction.Transaction` against a copy-on-write
view of the state and commits only if every operation succeeds; otherwise it raises
:class:`~kubeproxy.dataplane.nftables.runner.NftError` with an nft-like message and
changes nothing.

Map of the module:

* **Datatypes** -- :func:`parse_set_type` turns a set's ``type``/``typeof`` clause into
  component datatypes (:class:`SetType`); :func:`canonical_key` / :func:`canonical_value`
  validate an element against them and give its canonical text (the form ``nft list``
  prints: ``10.0.0.0/24``, ``tcp``, ``goto x``) and, for interval sets, its bounds.
  :func:`parse_priority` reads a base chain priority (``-110``, ``dstnat``, ``filter + 10``).
* **State** -- :class:`FakeTable` / :class:`FakeChain` / :class:`FakeSet` /
  :class:`BaseSpec`, readable by tests as
  ``fake.tables[("ip", "t")].sets["s"].elements`` (canonical key -> value or None) and
  ``.chains["c"].rules``. Treat them as read-only: committed objects are shared with
  clones and never mutated in place.
* **Batches** -- :class:`_Batch` applies one transaction: every object it changes is
  cloned first (owned by the batch's token), so a refused batch is simply dropped.
  Reference counts (rules and verdict-map elements -> chains, rules -> sets) are kept per
  table so busy checks are O(1). :class:`_Churn` follows what a batch does to each set
  of intervals, for nft 1.0.6's bookkeeping of those.
* **Runner** -- :class:`FakeNftables`: ``apply``/``check``/``list_tables``/
  ``list_objects``, ``dump()`` (sorted, deterministic text), counters, ``clone()`` and
  fault injection (``fail_next``, ``refuse``).

Kernel and nft 1.0.6 facts this models (verified against kernel 6.18 in a scratch
network namespace; ``tests/kernel/test_nft_fake_vs_kernel.py`` re-checks each case):

* ``add table`` on an existing table is a no-op; a comment is only set at creation (a
  different comment later is ignored, not refused). The same holds for set and chain
  comments.
* ``flush table`` removes every rule of every chain and nothing else: chains, sets and
  set elements stay. ``delete table`` removes everything; deleting, flushing or adding to
  a missing table (or chain, set) is "No such file or directory".
* The declarative ``table f t { ... }`` form creates the table, then all its chains,
  then its sets with their elements, then appends the rules; so rules and verdict-map
  elements may refer to chains and sets declared anywhere in the block. On an existing
  table it adds what is missing, appends rules and adds elements.
* ``add chain`` on an existing chain appends its rules. Redefining a base chain with
  another type is "File exists"; with another hook or priority, or giving a regular
  chain a hook, is "Operation not supported"; ``add chain`` without a hook on a base
  chain is fine. Priorities compare by value (``dstnat`` == ``-100``).
* Jumps are checked where the rule or element is added: ``jump``/``goto`` to a chain
  missing at that point of the batch is "No such file or directory" (a chain created
  later in the same batch does not help, except inside one declarative block); to a base
  chain, "Operation not supported".
* ``delete chain`` deletes the chain's own rules with it, but is "Device or resource
  busy" while any rule (its own self-jumps included) or verdict-map element refers to it.
  References removed earlier in the same batch (``flush chain``, ``flush table``,
  ``delete chain`` of the referring chain, ``delete element``, ``flush map``,
  ``delete map``) no longer count.
* ``delete set``/``delete map`` is "Device or resource busy" while a rule refers to it
  (``@name``); the kernel does not tell sets from maps there, so ``delete map`` of a set
  works. ``flush set`` of a map (or ``flush map`` of a set) is "No such file or
  directory" (nft checks the kind).
* ``add set`` on an existing set is a no-op if key/data types and flags match (``typeof
  ip daddr`` is the same as ``type ipv4_addr``; flag order does not matter), else "File
  exists".
* Elements: adding a key that exists with the same value is accepted (also twice in one
  command); with another value, "File exists". Deleting a missing key is "No such file or
  directory", also for the second of two equal keys in one command. An element may carry
  a comment (``KEY comment "TEXT"``, at most 128 bytes, else "comment too long"); adding
  an existing key again keeps the comment it has. A value on a set
  element ("set is not a map") or a missing one on a map element ("Invalid argument") is
  refused. Prefixes and ranges need ``flags interval``; an address of the other family,
  a port over 65535, a protocol over 255 are refused by nft.
* Concatenated interval sets: the kernel refuses an element overlapping an existing one
  or one added earlier in the batch ("File exists", see below for its blind spot); an
  identical element is accepted; prefixes and ranges may be in any component.
* Interval sets without concatenation (nft 1.0.6 checks these in userspace, against the
  kernel's elements and the batch so far): any overlap is refused ("conflicting
  intervals specified" within the batch, "interval overlaps with an existing one"
  against existing elements); adjacent intervals are fine and not merged; an identical
  interval is accepted; a prefix with host bits set is masked (``10.0.0.1/24`` is
  ``10.0.0.0/24``); a delete must name an interval exactly ("element does not exist").
  Deleting an interval earlier in the batch frees its space; a batch that deletes and
  re-adds an interval once (either order) is fine. nft and the kernel lose track in
  batches that churn one span more than that, or delete elements of a set they also
  flush: see :class:`_Churn` for the rules (found by random batches against the kernel).
* nft 1.0.6 cache quirks (userspace, but they decide what our scripts may do):
  ``add chain ... { rules }`` that refer to ``@set`` only see sets declared earlier in
  the same script, unless the batch also holds an operation that makes nft load the
  kernel's sets (``table {}``, ``add``/``delete element``, ``flush``/``delete`` set,
  ``delete chain``, ``delete table``; not ``add``/``flush table``, ``add``/``flush
  chain``, ``add set``): "No such file or directory". When nft does load the kernel's
  sets, a ``typeof`` map whose data mixes ``ip``/``ip6`` with ``th`` (``ip daddr . th
  dport``) and that existed before the batch cannot be used by a new rule: "conflicting
  protocols specified: ip vs. th" (declaring it again does not help; deleting and
  re-creating it in the batch does). And when a declarative block creates a set and the
  batch flushes it later, nft drops the elements declared with it unchecked (a clash or
  a jump to a missing chain among them passes).

Where the fake is deliberately stricter than the kernel (documented, and checked as
such by the kernel tests):

* Concatenated interval sets (the kernel's pipapo backend) refuse a new element only if
  its start or its end falls inside an existing element, so a superset of an element, or
  one crossing it (``1.2.3.0/24 . 80 . 12.0.0.0/8`` against ``1.2.3.4 . 80-90 .
  12.1.0.0/16``), is accepted; and they find the element to delete by its start, so
  ``delete element ... 10.0.0.0/16`` removes ``... 10.0.0.0/8``. The fake refuses every
  overlap and deletes only exact matches: overlapping elements match unpredictably, and
  deleting what was not added is a backend bug.
* ``add set`` with another ``timeout`` is accepted by the kernel, which keeps the old
  timeout; the fake refuses it, since the new timeout would silently not apply.

Not modelled: rule syntax and typing (rules are opaque text apart from their
``jump``/``goto``/``@`` references, so a rule using a set of the wrong type passes), jump
loops (the kernel refuses only loops reachable from a base chain), object names that are
nft keywords (``delete chain ip t missing`` is a syntax error, though ``check_name``
allows it), set size limits, elements the kernel adds at runtime (dynamic sets),
service names for ports, and the rarer ways the kernel's interval tree fails a batch that
adds and deletes several overlapping intervals of one set (random batches of such churn
find about one in 2,000 refused by the kernel and accepted by the fake; the backends
refill these sets by flushing and declaring them, which agrees).
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache

from kubeproxy.dataplane.nftables.runner import NftError
from kubeproxy.dataplane.nftables.transaction import (
    COMMENT_MAX,
    NAME_PATTERN,
    AddChain,
    AddElements,
    AddSet,
    AddTable,
    BaseChain,
    DefineTable,
    DeleteChain,
    DeleteElements,
    DeleteSet,
    DeleteTable,
    FlushChain,
    FlushSet,
    FlushTable,
    Operation,
    Set,
    Table,
    TableRef,
    Transaction,
)

TableKey = tuple[str, str]  # (family, name)

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


# ------------------------------------------------------------------------- datatypes

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


# ----------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class BaseSpec:
    type: str
    hook: str
    priority: int

    def __str__(self) -> str:
        return f"type {self.type} hook {self.hook} priority {self.priority}; policy accept;"


@dataclass(eq=False, slots=True)
class FakeChain:
    name: str
    base: BaseSpec | None = None
    rules: list[str] = field(default_factory=list)
    comment: str | None = None
    owner: int = 0  # token of the batch allowed to change it

    def clone(self, owner: int, *, rules: bool = True) -> FakeChain:
        kept = list(self.rules) if rules else []
        return FakeChain(self.name, self.base, kept, self.comment, owner)


@dataclass(eq=False, slots=True)
class FakeSet:
    """A set or map. ``elements`` maps canonical keys to canonical values (None in sets)."""

    name: str
    keyword: str
    type: SetType
    flags: frozenset[str] = frozenset()
    timeout: int | None = None
    comment: str | None = None
    elements: dict[str, str | None] = field(default_factory=dict)
    owner: int = 0
    # Interval sets only: bounds per element, and the elements grouped by the bounds of
    # their first component when it is a single value (None: a prefix or range), so an
    # overlap check looks at one group plus the wide elements, not at the whole set.
    bounds: dict[str, tuple[Bounds, ...]] = field(default_factory=dict)
    # Groups are tuples, replaced rather than changed, so a clone copies only the dict.
    groups: dict[Bounds | None, tuple[str, ...]] = field(default_factory=dict)
    # Element comments, by canonical key.
    comments: dict[str, str] = field(default_factory=dict)

    @property
    def interval(self) -> bool:
        return "interval" in self.flags

    @property
    def is_map(self) -> bool:
        return self.type.data is not None

    def clone(self, owner: int, *, elements: bool = True) -> FakeSet:
        return FakeSet(
            self.name,
            self.keyword,
            self.type,
            self.flags,
            self.timeout,
            self.comment,
            dict(self.elements) if elements else {},
            owner,
            dict(self.bounds) if elements else {},
            dict(self.groups) if elements else {},
            dict(self.comments) if elements else {},
        )

    def same_definition(self, other: FakeSet) -> bool:
        return (self.is_map, self.type.key, self.type.data, self.flags, self.timeout) == (
            other.is_map,
            other.type.key,
            other.type.data,
            other.flags,
            other.timeout,
        )

    def overlapping(self, bounds: tuple[Bounds, ...]) -> str | None:
        """An element sharing at least one value with ``bounds``, if any."""
        first = bounds[0]
        candidates: Iterable[str]
        if first[0] == first[1]:
            candidates = itertools.chain(self.groups.get(first, ()), self.groups.get(None, ()))
        else:
            candidates = self.bounds
        return next((other for other in candidates if _overlap(bounds, self.bounds[other])), None)

    def insert(
        self, key: str, value: str | None, bounds: tuple[Bounds, ...], comment: str | None = None
    ) -> None:
        self.elements[key] = value
        if comment is not None:
            self.comments[key] = comment
        if self.interval:
            self.bounds[key] = bounds
            group = _group(bounds)
            self.groups[group] = (*self.groups.get(group, ()), key)

    def remove(self, key: str) -> str | None:
        value = self.elements.pop(key)
        self.comments.pop(key, None)
        if self.interval:
            group = _group(self.bounds.pop(key))
            rest = tuple(k for k in self.groups[group] if k != key)
            if rest:
                self.groups[group] = rest
            else:
                del self.groups[group]
        return value

    def header(self) -> list[str]:
        spec = self.type.spec
        lines = [spec if spec.startswith("typeof ") else f"type {spec}"]
        if self.flags:
            lines.append(f"flags {','.join(sorted(self.flags))}")
        if self.timeout is not None:
            lines.append(f"timeout {self.timeout}s")
        if self.comment:
            lines.append(f'comment "{self.comment}"')
        return lines


def _overlap(a: tuple[Bounds, ...], b: tuple[Bounds, ...]) -> bool:
    return all(lo <= o_hi and o_lo <= hi for (lo, hi), (o_lo, o_hi) in zip(a, b, strict=True))


def _group(bounds: tuple[Bounds, ...]) -> Bounds | None:
    return bounds[0] if bounds[0][0] == bounds[0][1] else None


@dataclass(eq=False, slots=True)
class FakeTable:
    family: str
    name: str
    comment: str | None = None
    chains: dict[str, FakeChain] = field(default_factory=dict)
    sets: dict[str, FakeSet] = field(default_factory=dict)
    # References held by rules and verdict-map elements (chains) and by rules (sets).
    chain_refs: Counter[str] = field(default_factory=Counter)
    set_refs: Counter[str] = field(default_factory=Counter)
    owner: int = 0

    def clone(self, owner: int) -> FakeTable:
        return FakeTable(
            self.family,
            self.name,
            self.comment,
            dict(self.chains),
            dict(self.sets),
            Counter(self.chain_refs),
            Counter(self.set_refs),
            owner,
        )


# --------------------------------------------------------------------------- batches

# Operations that make nft 1.0.6 load the kernel's sets into its cache (see the module
# docstring); without one, rules in "add chain" see only sets the script declares.
_LOADS_SETS = (
    DefineTable,
    AddElements,
    DeleteElements,
    FlushSet,
    DeleteSet,
    DeleteChain,
    DeleteTable,
)
_tokens = itertools.count(1)


@dataclass(slots=True)
class _Churn:
    """One batch's changes to one set of intervals without concatenation.

    nft 1.0.6 keeps its own picture of these sets, and it and the kernel lose track in
    some batches that add and delete the same span several times. Found by random batches
    against the kernel (``tests/nft_fake_cases.py`` has a case of each):

    * nft counts an interval once per ``add``, so after re-adding an existing interval
      and deleting it, nft still believes in it and refuses an overlapping add
      ("interval overlaps with an existing one").
    * Deleting an interval twice (re-added in between) is refused by the kernel ("No
      such file or directory"); in a set created by the batch, adding an interval that
      overlaps one the batch added and deleted is refused too ("File exists").
    * When the batch flushes the set (anywhere in it) nft loads none of its elements: it
      deletes only what the batch added since the last flush ("element does not exist";
      the kernel still refuses overlaps), and an interval added after a flush cannot be
      deleted if the set held it before the batch, or the batch added an overlapping one
      before that flush ("No such file or directory").
    """

    before: Collection[str]  # the set's keys before the batch
    new_set: bool
    flushing: bool  # the batch flushes this set somewhere
    count: Counter[str] = field(default_factory=Counter)  # adds minus deletes, as nft counts
    ghosts: dict[str, tuple[Bounds, ...]] = field(default_factory=dict)  # deleted, believed
    added: dict[str, tuple[Bounds, ...]] = field(default_factory=dict)  # since the last flush
    deleted: set[str] = field(default_factory=set)  # since the last flush
    before_flush: dict[str, tuple[Bounds, ...]] = field(default_factory=dict)
    after_flush: dict[str, tuple[Bounds, ...]] = field(default_factory=dict)
    flushed: bool = False

    def _believed(self, key: str) -> int:
        held = not self.flushing and key in self.before
        return held + self.count[key]

    def add(self, key: str, bounds: tuple[Bounds, ...]) -> None:
        for other, b in self.ghosts.items():
            if other != key and _overlap(bounds, b):
                raise _nft(
                    f"interval overlaps with an existing one ({key} vs {other}: nft 1.0.6 "
                    "still counts an interval this batch added twice and deleted once)"
                )
        if self.new_set:
            for other in self.deleted:
                if other != key and other in self.added and _overlap(bounds, self.added[other]):
                    raise _kernel(EEXIST, f"{key} overlaps {other}, added and deleted")
        self.count[key] += 1
        self.ghosts.pop(key, None)
        self.added[key] = bounds
        if self.flushed:
            self.after_flush[key] = bounds
        elif self.flushing:
            self.before_flush[key] = bounds

    def delete(self, key: str, bounds: tuple[Bounds, ...]) -> None:
        if self.flushing and self._believed(key) <= 0:
            raise _nft(
                f"element does not exist ({key}: nft 1.0.6 loads no elements of a set the "
                "batch flushes)"
            )
        if key in self.deleted or (
            key in self.after_flush
            and (key in self.before or any(_overlap(bounds, b) for b in self.before_flush.values()))
        ):
            raise _kernel(ENOENT, f"{key}: nft 1.0.6 loses track of intervals a batch churns")
        self.count[key] -= 1
        if self._believed(key) > 0:
            self.ghosts[key] = bounds
        self.deleted.add(key)

    def flush(self) -> None:
        self.flushed = True
        self.count.clear()
        self.ghosts.clear()
        self.added.clear()
        self.deleted.clear()
        self.before_flush.update(self.after_flush)
        self.after_flush.clear()


class _Batch:
    """One transaction applied to a copy-on-write view of committed state."""

    def __init__(self, committed: dict[TableKey, FakeTable], tx: Transaction) -> None:
        self.committed = committed
        self.tables = dict(committed)
        self.token = next(_tokens)
        self.sets_loaded = any(isinstance(op, _LOADS_SETS) for op in tx.ops)
        # Sets the script has declared so far, and sets created by this batch.
        self.declared: set[tuple[TableKey, str]] = set()
        self.created: set[tuple[TableKey, str]] = set()
        self.churn: dict[tuple[TableKey, str], _Churn] = {}
        # Where each set is flushed last, and where the batch is now.
        self.last_flush = {
            ((op.table.family, op.table.name), op.name): i
            for i, op in enumerate(tx.ops)
            if isinstance(op, FlushSet)
        }
        self.flushing = self.last_flush.keys()
        self.position = 0

    # Copy-on-write access.

    def _table(self, ref: TableRef) -> FakeTable:
        key = (ref.family, ref.name)
        table = self.tables.get(key)
        if table is None:
            raise _kernel(ENOENT, f"no table {ref}")
        if table.owner != self.token:
            table = self.tables[key] = table.clone(self.token)
        return table

    def _chain(self, table: FakeTable, name: str, *, writable: bool = True) -> FakeChain:
        chain = table.chains.get(name)
        if chain is None:
            raise _kernel(ENOENT, f"no chain {name} in table {table.family} {table.name}")
        if writable and chain.owner != self.token:
            chain = table.chains[name] = chain.clone(self.token)
        return chain

    def _set(
        self, table: FakeTable, name: str, keyword: str | None = None, *, writable: bool = True
    ) -> FakeSet:
        s = table.sets.get(name)
        if s is None or (keyword is not None and s.keyword != keyword):
            raise _kernel(
                ENOENT, f"no {keyword or 'set or map'} {name} in table {table.family} {table.name}"
            )
        if writable and s.owner != self.token:
            s = table.sets[name] = s.clone(self.token)
        return s

    # Operations.

    def apply(self, op: Operation) -> None:
        match op:
            case AddTable():
                self._add_table(op.table, op.comment)
            case FlushTable():
                table = self._table(op.table)
                for chain in list(table.chains.values()):
                    if chain.rules:
                        self._flush_chain(table, chain)
            case DeleteTable():
                if self.tables.pop((op.table.family, op.table.name), None) is None:
                    raise _kernel(ENOENT, f"no table {op.table}")
            case DefineTable():
                self._define_table(op.definition)
            case AddChain():
                table = self._table(op.table)
                self._ensure_chain(table, op.name, op.base, None)
                for rule in op.rules:
                    self._add_rule(table, op.name, rule)
            case FlushChain():
                table = self._table(op.table)
                self._flush_chain(table, self._chain(table, op.name, writable=False))
            case DeleteChain():
                self._delete_chain(self._table(op.table), op.name)
            case AddSet():
                self._ensure_set(self._table(op.table), op.set)
            case FlushSet():
                table = self._table(op.table)
                s = self._set(table, op.name, op.keyword, writable=False)
                churn = self._churn(table, s)
                if churn is not None:
                    churn.flush()
                self._release_elements(table, s)
                # A new empty set rather than a copy emptied: flushing a big map is cheap.
                table.sets[op.name] = s.clone(self.token, elements=False)
            case DeleteSet():
                self._delete_set(self._table(op.table), op.name)
            case AddElements():
                table = self._table(op.table)
                s = self._set(table, op.set_name)
                for key, value in op.elements:
                    self._add_element(table, s, key, value)
            case DeleteElements():
                table = self._table(op.table)
                s = self._set(table, op.set_name)
                for key in op.keys:
                    self._delete_element(table, s, key)

    def _add_table(self, ref: TableRef, comment: str | None) -> FakeTable:
        key = (ref.family, ref.name)
        if key not in self.tables:
            if ref.family not in FAMILIES:
                raise _nft(f"unknown table family {ref.family!r}")
            self.tables[key] = FakeTable(ref.family, ref.name, comment, owner=self.token)
        return self._table(ref)

    def _define_table(self, definition: Table) -> None:
        # nft expands the block into: table, chains, sets with their elements, rules.
        table = self._add_table(definition.ref, definition.comment)
        for chain in definition.chains:
            self._ensure_chain(table, chain.name, chain.base, chain.comment)
        for s in definition.sets:
            new = s.name not in table.sets
            self._ensure_set(table, s)
            if (
                new
                and self.last_flush.get(((table.family, table.name), s.name), -1) > self.position
            ):
                # nft 1.0.6 drops the elements declared with a set it creates when the
                # batch flushes that set later on, unchecked (a clash, a missing chain).
                continue
            if s.elements:
                fake_set = self._set(table, s.name)
                for key, value in s.elements:
                    self._add_element(table, fake_set, key, value)
        for chain in definition.chains:
            for rule in chain.rules:
                self._add_rule(table, chain.name, rule)

    def _ensure_chain(
        self, table: FakeTable, name: str, base: BaseChain | None, comment: str | None
    ) -> None:
        spec = _base_spec(base) if base is not None else None
        existing = table.chains.get(name)
        if existing is None:
            table.chains[name] = FakeChain(name, spec, comment=comment, owner=self.token)
            return
        if spec is None or spec == existing.base:
            return
        if existing.base is None:
            raise _kernel(EOPNOTSUPP, f"chain {name} exists without a hook")
        if existing.base.type != spec.type:
            raise _kernel(EEXIST, f"chain {name} exists with type {existing.base.type}")
        raise _kernel(EOPNOTSUPP, f"chain {name} exists as {existing.base}")

    def _add_rule(self, table: FakeTable, chain_name: str, rule: str) -> None:
        refs = rule_references(rule)
        for target in refs.chains:
            self._check_jump(table, target)
        tkey = (table.family, table.name)
        for name in refs.sets:
            if not self.sets_loaded and (tkey, name) not in self.declared:
                raise _nft(
                    f"{ENOENT} (@{name}: nft 1.0.6 loads no sets from the kernel for this "
                    "batch, and the script has not declared it)"
                )
            s = table.sets.get(name)
            if s is None:
                raise _nft(f"{ENOENT} (no set or map {name} for @{name})")
            if self.sets_loaded and s.type.unreadable_typeof and (tkey, name) not in self.created:
                raise _nft(
                    "conflicting protocols specified: ip vs. th "
                    f"(nft 1.0.6 cannot read back the type of {s.keyword} {name})"
                )
        self._chain(table, chain_name).rules.append(rule)
        table.chain_refs.update(refs.chains)
        table.set_refs.update(refs.sets)

    def _check_jump(self, table: FakeTable, target: str) -> None:
        chain = table.chains.get(target)
        if chain is None:
            raise _kernel(ENOENT, f"jump/goto to missing chain {target}")
        if chain.base is not None:
            raise _kernel(EOPNOTSUPP, f"jump/goto to base chain {target}")

    def _release_rules(self, table: FakeTable, chain: FakeChain) -> None:
        for rule in chain.rules:
            refs = rule_references(rule)
            table.chain_refs.subtract(refs.chains)
            table.set_refs.subtract(refs.sets)

    def _flush_chain(self, table: FakeTable, chain: FakeChain) -> None:
        self._release_rules(table, chain)
        table.chains[chain.name] = chain.clone(self.token, rules=False)

    def _delete_chain(self, table: FakeTable, name: str) -> None:
        chain = self._chain(table, name, writable=False)
        # Self-jumps count: the kernel drops the chain's own rules but not their hold on it.
        if table.chain_refs[name] > 0:
            raise _kernel(
                EBUSY, f"chain {name} is still referred to {table.chain_refs[name]} times"
            )
        self._release_rules(table, chain)
        del table.chains[name]

    def _ensure_set(self, table: FakeTable, s: Set) -> None:
        tkey = (table.family, table.name)
        flags = frozenset(s.flags)
        if not flags <= SET_FLAGS:
            raise _nft(f"unknown set flags {sorted(flags - SET_FLAGS)}")
        wanted = FakeSet(
            s.name,
            s.keyword,
            parse_set_type(s.type, s.keyword),
            flags,
            s.timeout,
            s.comment,
            owner=self.token,
        )
        self.declared.add((tkey, s.name))
        existing = table.sets.get(s.name)
        if existing is None:
            table.sets[s.name] = wanted
            self.created.add((tkey, s.name))
        elif not existing.same_definition(wanted):
            raise _kernel(
                EEXIST,
                f"{existing.keyword} {s.name} exists as {'; '.join(existing.header())}",
            )

    def _churn(self, table: FakeTable, s: FakeSet) -> _Churn | None:
        """The batch's record of ``s`` if it is a set of intervals without concatenation."""
        if not s.interval or len(s.type.key) > 1:
            return None
        key = ((table.family, table.name), s.name)
        churn = self.churn.get(key)
        if churn is None:
            new = key in self.created
            old = None if new else self.committed[key[0]].sets.get(s.name)
            churn = self.churn[key] = _Churn(
                old.elements if old is not None else {}, new, key in self.flushing
            )
        return churn

    def _release_elements(self, table: FakeTable, s: FakeSet) -> None:
        if s.type.is_verdict_map:
            table.chain_refs.subtract(_jump_targets(s.elements.values()))

    def _delete_set(self, table: FakeTable, name: str) -> None:
        # The kernel does not tell sets from maps here: "delete map" removes a set too.
        s = self._set(table, name, writable=False)
        if table.set_refs[name] > 0:
            raise _kernel(EBUSY, f"{s.keyword} {name} is used by {table.set_refs[name]} rules")
        self._release_elements(table, s)
        del table.sets[name]
        self.churn.pop(((table.family, table.name), name), None)

    def _add_element(self, table: FakeTable, s: FakeSet, key: str, value: str | None) -> None:
        if value is not None and not s.is_map:
            raise _nft(f"set is not a map ({s.name}: {key} : {value})")
        if value is None and s.is_map:
            raise _kernel(EINVAL, f"map element {key} has no value")
        key, comment = split_comment(key)
        ckey, bounds = canonical_key(s.type, key, s.interval)
        target = None
        if value is not None:
            if s.type.is_verdict_map:
                value, target = _verdict(value)
                if target is not None:
                    self._check_jump(table, target)
            else:
                value = canonical_value(s.type, value)
        churn = self._churn(table, s)
        if ckey in s.elements:
            if s.elements[ckey] != value:
                raise _kernel(
                    EEXIST, f"{s.name}: {ckey} is mapped to {s.elements[ckey]}, not {value}"
                )
            if churn is not None:
                churn.add(ckey, bounds)
            return
        if s.interval:
            clash = s.overlapping(bounds)
            if clash is not None:
                raise self._overlap_error(table, s, ckey, clash)
        if churn is not None:
            churn.add(ckey, bounds)
        s.insert(ckey, value, bounds, comment)
        if target is not None:
            table.chain_refs[target] += 1

    def _overlap_error(self, table: FakeTable, s: FakeSet, key: str, clash: str) -> _RefusedError:
        if len(s.type.key) > 1:  # the kernel's pipapo check
            return _kernel(EEXIST, f"{s.name}: {key} overlaps {clash}")
        before = self.committed.get((table.family, table.name))
        old = before.sets.get(s.name) if before is not None else None
        if old is not None and clash in old.elements:
            return _nft(f"interval overlaps with an existing one ({s.name}: {key} vs {clash})")
        return _nft(f"conflicting intervals specified ({s.name}: {key} vs {clash})")

    def _delete_element(self, table: FakeTable, s: FakeSet, key: str) -> None:
        # A comment in a delete is accepted and ignored: elements are matched by key.
        ckey, bounds = canonical_key(s.type, split_comment(key)[0], s.interval)
        if ckey not in s.elements:
            if s.interval and len(s.type.key) == 1:
                raise _nft(f"element does not exist ({s.name}: {ckey})")
            raise _kernel(ENOENT, f"{s.name} has no element {ckey}")
        churn = self._churn(table, s)
        if churn is not None:
            churn.delete(ckey, bounds)
        value = s.remove(ckey)
        if s.type.is_verdict_map and value is not None:
            target = _verdict(value)[1]
            if target is not None:
                table.chain_refs[target] -= 1


def _base_spec(base: BaseChain) -> BaseSpec:
    if base.type not in CHAIN_TYPES:
        raise _nft(f"unknown chain type {base.type!r}")
    if base.hook not in HOOKS:
        raise _nft(f"unknown chain hook {base.hook!r}")
    return BaseSpec(base.type, base.hook, parse_priority(base.priority))


def _jump_targets(values: Iterable[str | None]) -> Iterator[str]:
    for value in values:
        if value is not None:
            target = _verdict(value)[1]
            if target is not None:
                yield target


# ---------------------------------------------------------------------------- runner


class FakeNftables:
    """An :class:`~kubeproxy.dataplane.nftables.runner.NftRunner` with in-memory state.

    ``fail_next``: the next non-empty ``apply`` raises it (and changes nothing).
    ``refuse``: called with every non-empty transaction given to ``apply``/``check``; a
    returned message refuses it, as the kernel would.
    """

    def __init__(self) -> None:
        self.tables: dict[TableKey, FakeTable] = {}
        self.fail_next: NftError | None = None
        self.refuse: Callable[[Transaction], str | None] | None = None
        self.applied = 0  # transactions committed
        self.refused = 0  # transactions refused by apply (injected failures included)
        self.checked = 0  # check() calls that passed
        self.last_error: NftError | None = None

    def clone(self) -> FakeNftables:
        """An independent fake with the same state (cheap: state is copy-on-write)."""
        other = FakeNftables()
        other.tables = dict(self.tables)
        return other

    # NftRunner.

    def apply(self, tx: Transaction) -> None:
        if not tx:
            return  # as the real runners: nothing is sent
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            self._refuse(err)
        self.tables = self._run(tx, counting=True)
        self.applied += 1

    def check(self, tx: Transaction) -> None:
        if tx:
            self._run(tx, counting=False)
            self.checked += 1

    def list_tables(self) -> list[tuple[str, str]]:
        return sorted(self.tables)

    def list_objects(self, family: str, table: str) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {"chain": set(), "set": set(), "map": set()}
        t = self.tables.get((family, table))
        if t is not None:
            found["chain"].update(t.chains)
            for s in t.sets.values():
                found[s.keyword].add(s.name)
        return found

    # Inspection.

    def dump(self) -> str:
        """The whole state as nft-like text: everything sorted, rules in order."""
        out: list[str] = []
        for key in sorted(self.tables):
            t = self.tables[key]
            out.append(f"table {t.family} {t.name} {{")
            if t.comment:
                out.append(f'\tcomment "{t.comment}"')
            for name in sorted(t.chains):
                c = t.chains[name]
                out.append(f"\tchain {name} {{")
                if c.comment:
                    out.append(f'\t\tcomment "{c.comment}"')
                if c.base is not None:
                    out.append(f"\t\t{c.base}")
                out.extend(f"\t\t{rule}" for rule in c.rules)
                out.append("\t}")
            for name in sorted(t.sets):
                s = t.sets[name]
                out.append(f"\t{s.keyword} {name} {{")
                out.extend(f"\t\t{line}" for line in s.header())
                if s.elements:
                    out.append("\t\telements = {")
                    for k in sorted(s.elements):
                        v = s.elements[k]
                        note = s.comments.get(k)
                        item = k if note is None else f'{k} comment "{note}"'
                        out.append(f"\t\t\t{item}" if v is None else f"\t\t\t{item} : {v}")
                    out.append("\t\t}")
                out.append("\t}")
            out.append("}")
        return "\n".join(out) + ("\n" if out else "")

    # Internals.

    def _run(self, tx: Transaction, *, counting: bool) -> dict[TableKey, FakeTable]:
        if self.refuse is not None:
            message = self.refuse(tx)
            if message is not None:
                self._refuse(NftError(message, str(tx)), counting)
        batch = _Batch(self.tables, tx)
        for batch.position, op in enumerate(tx.ops):
            try:
                batch.apply(op)
            except _RefusedError as err:
                self._refuse(NftError(f"nft: {err}\n{_describe(op)}", str(tx)), counting)
        return batch.tables

    def _refuse(self, err: NftError, counting: bool = True) -> None:
        if counting:
            self.refused += 1
        self.last_error = err
        raise err


def _describe(op: Operation) -> str:
    """The first line of the operation's script text, shortened."""
    out: list[str] = []
    op.render(out)
    line = out[0].splitlines()[0] if out else type(op).__name__
    return line if len(line) <= 200 else line[:197] + "..."


__all__ = [
    "BaseSpec",
    "FakeChain",
    "FakeNftables",
    "FakeSet",
    "FakeTable",
    "RuleRefs",
    "SetType",
    "canonical_key",
    "canonical_value",
    "parse_priority",
    "parse_set_type",
    "rule_references",
]
