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
lists its options and prints itself.

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

import ipaddress
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import ClassVar

from kubeproxy.dataplane.errors import DataplaneInputError
from kubeproxy.dataplane.nfacct import NAME_MAX as NFACCT_NAME_MAX
from kubeproxy.model.types import PLAIN_IPV4, IPFamily


class RuleError(DataplaneInputError):
    """iptables refuses the rule while reading its line (a parameter problem)."""

    tool = "iptables"


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


# ---------------------------------------------------------------------- value parsers

PORT_PROTOCOLS = frozenset({"tcp", "udp", "sctp", "dccp"})
_PROTOCOLS = {"all": 0, "icmp": 1, "tcp": 6, "udp": 17, "ipv6-icmp": 58, "sctp": 132}
_PROTOCOL_NAMES = {n: name for name, n in _PROTOCOLS.items()}
_ALIASES = {"icmpv6": "ipv6-icmp"}
IFNAMSIZ = 16
COMMENT_MAX = 255  # XT_MAX_COMMENT_LEN - 1
RECENT_NAME_MAX = 199  # XT_RECENT_NAME_LEN - 1
_RECENT_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")
_U32 = 0xFFFFFFFF
_DIGITS = re.compile(r"[0-9]+")


def _is_number(text: str) -> bool:
    # str.isdigit() would also take other scripts' digits ("²"), which iptables does not.
    return _DIGITS.fullmatch(text) is not None


def _family_version(family: IPFamily) -> int:
    return 6 if family is IPFamily.IPv6 else 4


def parse_network(text: str, family: IPFamily) -> str:
    """``-s``/``-d``: an address or ``address/length``, printed with its length and the
    host bits cleared (``10.1.2.3/24`` is ``10.1.2.0/24``)."""
    if family is IPFamily.IPv4 and PLAIN_IPV4.fullmatch(text):
        return f"{text}/32"  # the common case, without ipaddress' cost
    addr, sep, length = text.partition("/")
    if sep and not _is_number(length):
        raise RuleError(f"invalid mask `{length}' specified (only prefix lengths are modelled)")
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        raise RuleError(f"host/network `{addr}' not found (names are not modelled)") from None
    if ip.version != _family_version(family):
        raise RuleError(f"host/network `{addr}' not found")
    bits = 32 if ip.version == 4 else 128
    prefix = int(length) if sep else bits
    if prefix > bits:
        raise RuleError(f"invalid mask `{length}' specified")
    net = ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
    return f"{net.network_address}/{prefix}"


def parse_address(text: str, family: IPFamily) -> str:
    if family is IPFamily.IPv4 and PLAIN_IPV4.fullmatch(text):
        return text  # the common case, without ipaddress' cost
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise RuleError(f'Bad IP address "{text}"') from None
    if ip.version != _family_version(family):
        raise RuleError(f'Bad IP address "{text}"')
    return str(ip)


def parse_port(text: str) -> int:
    if not _is_number(text) or int(text) > 65535:
        raise RuleError(f"Port `{text}' not valid (service names are not modelled)")
    return int(text)


def parse_port_range(text: str, sep: str = ":") -> tuple[int, int]:
    """``80``, ``80:90``, ``:90`` (from 0), ``80:`` (to 65535); ``-`` for NAT targets."""
    low, has_sep, high = text.partition(sep)
    if not has_sep:
        port = parse_port(text)
        return port, port
    first = parse_port(low) if low else 0
    last = parse_port(high) if high else 65535
    if first > last:
        raise RuleError("invalid portrange (min > max)")
    return first, last


def port_range_text(first: int, last: int, sep: str = ":") -> str:
    return str(first) if first == last else f"{first}{sep}{last}"


def parse_u32(text: str) -> int:
    """An unsigned 32-bit value as strtoul(..., 0) reads it: hex, octal or decimal."""
    try:
        if text.lower().startswith("0x"):
            value = int(text[2:], 16)
        elif text.startswith("0") and len(text) > 1:
            value = int(text[1:], 8)
        else:
            value = int(text, 10)
    except ValueError:
        raise RuleError(f"bad integer value {text!r}") from None
    if value < 0 or value > _U32:
        raise RuleError(f"bad integer value {text!r}, or out of range")
    return value


def parse_value_mask(text: str) -> tuple[int, int | None]:
    value, sep, mask = text.partition("/")
    return parse_u32(value), parse_u32(mask) if sep else None


_NO_QUOTE = re.compile(r"[A-Za-z0-9_-]+")


def save_string(text: str) -> str:
    """A string as iptables-save prints it (xtables_save_string): bare when it is only
    letters, digits, ``_`` and ``-``; otherwise in double quotes, with ``"``, ``\\``
    and ``'`` escaped by a backslash."""
    if _NO_QUOTE.fullmatch(text):
        return text
    escaped = re.sub(r"([\"\\'])", r"\\\1", text)
    return f'"{escaped}"'


def parse_protocol(text: str) -> str:
    name = _ALIASES.get(text.lower(), text.lower())
    if name in _PROTOCOLS:
        return name
    if _is_number(text) and int(text) in _PROTOCOL_NAMES:
        return _PROTOCOL_NAMES[int(text)]
    raise RuleError(f"protocol {text!r} is not modelled (known: {', '.join(_PROTOCOLS)})")


def parse_interface(text: str) -> str:
    if not text or len(text) >= IFNAMSIZ:
        raise RuleError(f"interface name `{text}' must be shorter than IFNAMSIZ ({IFNAMSIZ - 1})")
    if any(c.isspace() or c in "/\"'" for c in text):
        raise RuleError(f"interface name `{text}' is not modelled")
    return text


# ------------------------------------------------------------------------ extensions


@dataclass
class _Context:
    """What the extensions of one rule see of each other."""

    family: IPFamily
    nft: bool = False  # the nft flavour (iptables-nft)
    protocol: str | None = None  # -p (None: any)
    protocol_negated: bool = False
    random_fully: bool = True
    kernel_errors: list[str] = field(default_factory=list)
    nfacct: str | None = None

    def port_protocol(self) -> str | None:
        """The protocol a port-specific option may rely on (-p tcp, not ! -p tcp)."""
        if self.protocol is None or self.protocol_negated:
            return None
        return self.protocol


class _Extension:
    """A match or target: its options (spelling -> key, whether it takes a value, and
    whether ``!`` may precede it) and how it prints."""

    name: ClassVar[str]
    options: ClassVar[dict[str, tuple[str, bool, bool]]] = {}
    pairs: ClassVar[frozenset[str]] = frozenset()  # options taking two values

    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx
        self.values: dict[str, tuple[bool, str | None]] = {}

    def take(self, option: str, value: str | None, negated: bool) -> None:
        key, _, negatable = self.options[option]
        if negated and not negatable:
            raise RuleError(f"{self.name}: unexpected `!' before {option}")
        if key in self.values:
            raise RuleError(f'{self.name}: option "--{key}" can only be specified once')
        self.values[key] = (negated, value)

    def has(self, key: str) -> bool:
        return key in self.values

    def value(self, key: str) -> str:
        found = self.values[key][1]
        assert found is not None
        return found

    def neg(self, key: str) -> str:
        return "! " if self.values[key][0] else ""

    def exclusive(self, *keys: str) -> str | None:
        """The one of ``keys`` given (an error if several are)."""
        given = [k for k in keys if k in self.values]
        if len(given) > 1:
            raise RuleError(
                f'{self.name}: option "--{given[0]}" cannot be used together with "--{given[1]}".'
            )
        return given[0] if given else None

    def require(self, key: str) -> None:
        if key not in self.values:
            raise RuleError(f'{self.name}: option "--{key}" must be specified')

    def finish(self) -> str:
        """The text after ``-m NAME`` / ``-j NAME`` (empty or starting with a space)."""
        raise NotImplementedError


def _opts(*specs: tuple[str, str, bool, bool]) -> dict[str, tuple[str, bool, bool]]:
    return {spelling: (key, takes, negatable) for spelling, key, takes, negatable in specs}


class _Comment(_Extension):
    name = "comment"
    options = _opts(("--comment", "comment", True, False))

    def finish(self) -> str:
        self.require("comment")
        text = self.value("comment")
        if len(text) > COMMENT_MAX:
            raise RuleError(
                f"comment of {len(text)} characters (iptables keeps only the first "
                f"{COMMENT_MAX}, so -C/-D would not find the rule by it)"
            )
        return f" --comment {save_string(text)}"


_CT_STATES = ("INVALID", "NEW", "RELATED", "ESTABLISHED", "UNTRACKED", "SNAT", "DNAT")


class _Conntrack(_Extension):
    name = "conntrack"
    options = _opts(("--ctstate", "ctstate", True, True))

    def finish(self) -> str:
        if not self.values:
            raise RuleError("conntrack: At least one option is required")
        states = set()
        for item in self.value("ctstate").split(","):
            if item.upper() not in _CT_STATES:
                raise RuleError(f'Bad ctstate "{item}"')
            states.add(item.upper())
        text = ",".join(s for s in _CT_STATES if s in states)
        return f" {self.neg('ctstate')}--ctstate {text}"


class _Mark(_Extension):
    name = "mark"
    options = _opts(("--mark", "mark", True, True))

    def finish(self) -> str:
        self.require("mark")
        value, mask = parse_value_mask(self.value("mark"))
        text = f"{value:#x}" if mask is None or mask == _U32 else f"{value:#x}/{mask:#x}"
        return f" {self.neg('mark')}--mark {text}"


class _Nfacct(_Extension):
    name = "nfacct"
    options = _opts(("--nfacct-name", "nfacct-name", True, False))

    def finish(self) -> str:
        self.require("nfacct-name")
        # The match keeps as many characters as a counter's name has (longer: cut).
        self.ctx.nfacct = self.value("nfacct-name")[:NFACCT_NAME_MAX]
        # Both flavours print two spaces here.
        return f" --nfacct-name  {self.ctx.nfacct}"


_ADDRTYPES = (
    "UNSPEC",
    "UNICAST",
    "LOCAL",
    "BROADCAST",
    "ANYCAST",
    "MULTICAST",
    "BLACKHOLE",
    "UNREACHABLE",
    "PROHIBIT",
    "THROW",
    "NAT",
    "XRESOLVE",
)
# The kernel's addrtype match refuses these for IPv6 (xt_addrtype.c).
_ADDRTYPES_NOT_IPV6 = frozenset({"BROADCAST", "BLACKHOLE", "PROHIBIT", "THROW", "NAT", "XRESOLVE"})


class _Addrtype(_Extension):
    name = "addrtype"
    options = _opts(("--src-type", "src-type", True, True), ("--dst-type", "dst-type", True, True))

    def _types(self, key: str) -> str:
        types = set()
        for item in self.value(key).split(","):
            if item.upper() not in _ADDRTYPES:
                raise RuleError(f"addrtype: bad type `{item}'")
            types.add(item.upper())
        bad = sorted(types & _ADDRTYPES_NOT_IPV6) if self.ctx.family is IPFamily.IPv6 else []
        if bad:
            self.ctx.kernel_errors.append(f"addrtype: IPv6 does not support {','.join(bad)}")
        return ",".join(t for t in _ADDRTYPES if t in types)

    def finish(self) -> str:
        if not self.values:
            raise RuleError("addrtype: you must specify --src-type or --dst-type")
        out = ""
        for key in ("src-type", "dst-type"):
            if self.has(key):
                out += f" {self.neg(key)}--{key} {self._types(key)}"
        return out


class _Ports(_Extension):
    """tcp, udp and sctp: source and destination port (ranges)."""

    options = _opts(
        ("--sport", "sport", True, True),
        ("--source-port", "sport", True, True),
        ("--dport", "dport", True, True),
        ("--destination-port", "dport", True, True),
    )

    @property
    def native(self) -> bool:
        """iptables-nft writes tcp/udp ports as nftables expressions of its own (no
        kernel match, so no protocol check), when the rule's -p names the protocol,
        negated or not; otherwise, and for sctp, it uses the kernel's match."""
        return (
            self.ctx.nft
            and self.name in ("tcp", "udp")
            and bool(self.values)
            and self.ctx.protocol == self.name
        )

    def merge(self, later: _Ports) -> None:
        """iptables-nft reads all native port expressions of a rule back as one match:
        the later options win."""
        self.values.update(later.values)

    def finish(self) -> str:
        if not self.native and self.ctx.port_protocol() != self.name:
            # The kernel's tcp/udp/sctp matches check the rule's protocol.
            self.ctx.kernel_errors.append(f"the {self.name} match needs -p {self.name}")
        out = ""
        for key in ("sport", "dport"):
            if self.has(key):
                text = port_range_text(*parse_port_range(self.value(key)))
                out += f" {self.neg(key)}--{key} {text}"
        return out


class _Tcp(_Ports):
    name = "tcp"


class _Udp(_Ports):
    name = "udp"


class _Sctp(_Ports):
    name = "sctp"


_MULTIPORT_PROTOCOLS = frozenset({"tcp", "udp", "udplite", "sctp", "dccp"})
MULTIPORT_MAX = 15


class _Multiport(_Extension):
    name = "multiport"
    options = _opts(
        ("--sports", "sports", True, True),
        ("--source-ports", "sports", True, True),
        ("--dports", "dports", True, True),
        ("--destination-ports", "dports", True, True),
        ("--ports", "ports", True, True),
    )

    def finish(self) -> str:
        key = self.exclusive("sports", "dports", "ports")
        if key is None:
            raise RuleError("multiport: one of --sports, --dports or --ports is required")
        items, count = [], 0
        for item in self.value(key).split(","):
            first, last = parse_port_range(item)
            if ":" in item and first >= last:
                raise RuleError("invalid portrange specified")
            count += 1 if first == last else 2
            items.append(port_range_text(first, last))
        if count > MULTIPORT_MAX:
            raise RuleError("too many ports specified")
        protocol = self.ctx.port_protocol()
        if protocol is None:
            raise RuleError(
                "multiport needs `-p tcp', `-p udp', `-p udplite', `-p sctp' or `-p dccp'"
            )
        if protocol not in _MULTIPORT_PROTOCOLS:
            raise RuleError("multiport only works with TCP, UDP, UDPLITE, SCTP and DCCP")
        return f" {self.neg(key)}--{key} {','.join(items)}"


def probability_text(probability: float) -> str:
    """How iptables-save prints a probability: the kernel keeps it as a 31-bit fraction
    (``lround(p * 2^31)``), printed back with 11 decimals (0.1 is 0.10000000009)."""
    fixed = math.floor(probability * 0x80000000 + 0.5)
    return f"{fixed / 0x80000000:.11f}"


class _Statistic(_Extension):
    name = "statistic"
    options = _opts(
        ("--mode", "mode", True, False),
        ("--probability", "probability", True, True),
        ("--every", "every", True, True),
        ("--packet", "packet", True, False),
    )

    def finish(self) -> str:
        self.require("mode")
        mode = self.value("mode")
        if mode == "random":
            if not self.has("probability"):
                raise RuleError("--probability must be specified when using random mode")
            if self.has("every") or self.has("packet"):
                raise RuleError("--every and --packet are for nth mode")
            try:
                p = float(self.value("probability"))
            except ValueError:
                p = -1.0
            if not 0.0 <= p <= 1.0:
                raise RuleError(
                    'statistic: bad value for option "--probability", or out of range (0-1).'
                )
            return f" --mode random {self.neg('probability')}--probability {probability_text(p)}"
        if mode == "nth":
            self.require("every")
            if not self.has("packet"):
                raise RuleError('statistic: option "--every" also requires "--packet".')
            if self.has("probability"):
                raise RuleError("--probability is for random mode")
            every, packet = self.value("every"), self.value("packet")
            if not _is_number(every) or not _is_number(packet) or int(every) < 1:
                raise RuleError("statistic: bad --every or --packet value")
            if int(packet) >= int(every):
                raise RuleError("the --packet p must be 0 <= p <= n-1")
            return f" --mode nth {self.neg('every')}--every {int(every)} --packet {int(packet)}"
        raise RuleError(f"statistic: bad mode `{mode}'")


_RECENT_MODES = ("set", "rcheck", "update", "remove")


class _Recent(_Extension):
    name = "recent"
    options = _opts(
        ("--set", "set", False, True),
        ("--rcheck", "rcheck", False, True),
        ("--update", "update", False, True),
        ("--remove", "remove", False, True),
        ("--seconds", "seconds", True, False),
        ("--reap", "reap", False, False),
        ("--name", "name", True, False),
        ("--mask", "mask", True, False),
        ("--rsource", "rsource", False, False),
        ("--rdest", "rdest", False, False),
    )

    def finish(self) -> str:
        mode = self.exclusive(*_RECENT_MODES)
        if mode is None:
            raise RuleError(
                "recent: you must specify one of `--set', `--rcheck' `--update' or `--remove'"
            )
        out = f" {self.neg(mode)}--{mode}"
        if self.has("seconds"):
            seconds = self.value("seconds")
            if not _is_number(seconds) or int(seconds) == 0:
                raise RuleError(f"recent: --seconds {seconds!r} is not modelled (use >= 1)")
            if mode not in ("rcheck", "update"):
                # xt_recent's checkentry: a time window only makes sense when checking.
                self.ctx.kernel_errors.append("recent: --seconds needs --rcheck or --update")
            out += f" --seconds {int(seconds)}"
        if self.has("reap"):
            if not self.has("seconds"):
                raise RuleError('recent: option "--reap" also requires "--seconds".')
            out += " --reap"
        name = self.value("name") if self.has("name") else "DEFAULT"
        if len(name) > RECENT_NAME_MAX or not _RECENT_NAME.match(name) or name in (".", ".."):
            raise RuleError(f"recent: name {name!r} is not modelled")
        out += f" --name {name}"
        if self.has("mask"):
            mask = parse_address(self.value("mask"), self.ctx.family)
        else:
            mask = "255.255.255.255" if self.ctx.family is IPFamily.IPv4 else "ffff:" * 7 + "ffff"
        if self.ctx.family is IPFamily.IPv6:
            # iptables prints an IPv6 mask uncompressed only when it is all ones.
            mask = str(ipaddress.IPv6Address(mask))
            if mask == "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff":
                mask = "ffff:" * 7 + "ffff"
        out += f" --mask {mask}"
        side = self.exclusive("rsource", "rdest") or "rsource"
        return f"{out} --{side}"


_SET_FLAGS = re.compile(r"^(src|dst)(,(src|dst)){0,5}$")


class _Set(_Extension):
    """ipvs mode's ipset matches. The kernel refuses a set that does not exist; ipsets
    are not modelled here, so that is not checked."""

    name = "set"
    options = _opts(("--match-set", "match-set", True, True))
    pairs = frozenset({"--match-set"})

    def finish(self) -> str:
        self.require("match-set")
        set_name, _, flags = self.value("match-set").partition(" ")
        if not _SET_FLAGS.match(flags) or not set_name:
            raise RuleError(f"set: bad --match-set {self.value('match-set')!r}")
        return f" {self.neg('match-set')}--match-set {set_name} {flags}"


class _Physdev(_Extension):
    name = "physdev"
    options = _opts(("--physdev-is-in", "physdev-is-in", False, True))

    def finish(self) -> str:
        self.require("physdev-is-in")
        return f" {self.neg('physdev-is-in')}--physdev-is-in"


class _IpvsMatch(_Extension):
    """``-m ipvs`` (needs the kernel's IPVS; printed as iptables-legacy-save prints it)."""

    name = "ipvs"
    options = _opts(
        ("--vaddr", "vaddr", True, True),
        ("--vproto", "vproto", True, True),
        ("--vport", "vport", True, True),
    )

    def finish(self) -> str:
        out = ""
        if self.has("vaddr"):
            out += (
                f" {self.neg('vaddr')}--vaddr {parse_network(self.value('vaddr'), self.ctx.family)}"
            )
        if self.has("vproto"):
            proto = _PROTOCOLS[parse_protocol(self.value("vproto"))]
            out += f" {self.neg('vproto')}--vproto {proto}"
        if self.has("vport"):
            out += f" {self.neg('vport')}--vport {int(self.value('vport'))}"
        if not out:
            raise RuleError("ipvs: at least one option is required")
        return out


MATCHES: dict[str, type[_Extension]] = {
    cls.name: cls
    for cls in (
        _Comment,
        _Conntrack,
        _Mark,
        _Addrtype,
        _Tcp,
        _Udp,
        _Sctp,
        _Multiport,
        _Statistic,
        _Recent,
        _Nfacct,
        _Set,
        _Physdev,
        _IpvsMatch,
    )
}
_PROTOCOL_MATCHES = {"tcp": _Tcp, "udp": _Udp, "sctp": _Sctp}


class _Target(_Extension):
    # The only table the target may be used in, and the builtin chains it may run from
    # (None: any); checked by the kernel.
    table: ClassVar[str | None] = None
    hooks: ClassVar[frozenset[str] | None] = None


class _Verdict(_Target):
    def finish(self) -> str:
        return ""


class _Accept(_Verdict):
    name = "ACCEPT"


class _Drop(_Verdict):
    name = "DROP"


class _Return(_Verdict):
    name = "RETURN"


def _needs_port_protocol(ctx: _Context) -> None:
    if ctx.port_protocol() not in PORT_PROTOCOLS:
        raise RuleError("Need TCP, UDP, SCTP or DCCP with port specification")


class _Dnat(_Target):
    name = "DNAT"
    options = _opts(
        ("--to-destination", "to-destination", True, False),
        ("--random", "random", False, False),
        ("--persistent", "persistent", False, False),
    )
    table = "nat"
    hooks = frozenset({"PREROUTING", "OUTPUT"})

    def _destination(self, text: str) -> str:
        if self.ctx.family is IPFamily.IPv6:
            m = re.match(r"^\[([^\]]+)\](?::(.+))?$", text)
            addr, ports = (m.group(1), m.group(2)) if m else (text, None)
        else:
            addr, sep, rest = text.partition(":")
            ports = rest if sep else None
        if "-" in addr:
            raise RuleError("DNAT: address ranges are not modelled")
        addr = parse_address(addr, self.ctx.family)
        if ports is None:
            return addr
        _needs_port_protocol(self.ctx)
        first, last = parse_port_range(ports, "-")
        port_text = port_range_text(first, last, "-")
        return (
            f"[{addr}]:{port_text}" if self.ctx.family is IPFamily.IPv6 else f"{addr}:{port_text}"
        )

    def finish(self) -> str:
        self.require("to-destination")
        out = f" --to-destination {self._destination(self.value('to-destination'))}"
        for flag in ("random", "persistent"):
            if self.has(flag):
                out += f" --{flag}"
        return out


class _Masquerade(_Target):
    name = "MASQUERADE"
    options = _opts(
        ("--to-ports", "to-ports", True, False),
        ("--random", "random", False, False),
        ("--random-fully", "random-fully", False, False),
    )
    table = "nat"
    hooks = frozenset({"POSTROUTING"})

    def finish(self) -> str:
        out = ""
        if self.has("to-ports"):
            _needs_port_protocol(self.ctx)
            first, last = parse_port_range(self.value("to-ports"), "-")
            out += f" --to-ports {port_range_text(first, last, '-')}"
        if self.has("random"):
            out += " --random"
        if self.has("random-fully"):
            if not self.ctx.random_fully:
                raise RuleError('unknown option "--random-fully"')
            out += " --random-fully"
        return out


class _MarkTarget(_Target):
    name = "MARK"
    options = _opts(
        ("--set-xmark", "set-xmark", True, False),
        ("--set-mark", "set-mark", True, False),
        ("--and-mark", "and-mark", True, False),
        ("--or-mark", "or-mark", True, False),
        ("--xor-mark", "xor-mark", True, False),
    )

    def finish(self) -> str:
        key = self.exclusive("set-xmark", "set-mark", "and-mark", "or-mark", "xor-mark")
        if key is None:
            raise RuleError(
                "MARK: One of the --set-xmark, --{and,or,xor,set}-mark options is required"
            )
        value, mask = parse_value_mask(self.value(key))
        if key in ("and-mark", "or-mark", "xor-mark") and mask is not None:
            raise RuleError(f"MARK: --{key} takes no mask")
        # libxt_MARK turns every form into --set-xmark value/mask.
        if key == "set-xmark":
            mark, xmask = value, _U32 if mask is None else mask
        elif key == "set-mark":
            mark, xmask = value, value | (_U32 if mask is None else mask)
        elif key == "and-mark":
            mark, xmask = 0, ~value & _U32
        elif key == "or-mark":
            mark, xmask = value, value
        else:
            mark, xmask = value, 0
        return f" --set-xmark {mark:#x}/{xmask:#x}"


_REJECT_TYPES = {
    IPFamily.IPv4: {
        "icmp-net-unreachable": "net-unreach",
        "icmp-host-unreachable": "host-unreach",
        "icmp-port-unreachable": "port-unreach",
        "icmp-proto-unreachable": "proto-unreach",
        "icmp-net-prohibited": "net-prohib",
        "icmp-host-prohibited": "host-prohib",
        "icmp-admin-prohibited": "admin-prohib",
        "tcp-reset": "tcp-rst",
    },
    IPFamily.IPv6: {
        "icmp6-no-route": "no-route",
        "icmp6-adm-prohibited": "adm-prohibited",
        "icmp6-addr-unreachable": "addr-unreach",
        "icmp6-port-unreachable": "port-unreach",
        "icmp6-policy-fail": "policy-fail",
        "icmp6-reject-route": "reject-route",
        "tcp-reset": "tcp-rst",
    },
}


class _Reject(_Target):
    name = "REJECT"
    options = _opts(("--reject-with", "reject-with", True, False))
    table = "filter"
    hooks = frozenset({"INPUT", "FORWARD", "OUTPUT"})

    def finish(self) -> str:
        types = _REJECT_TYPES[self.ctx.family]
        if self.has("reject-with"):
            given = self.value("reject-with")
            found = next((t for t, alias in types.items() if given in (t, alias)), None)
            if found is None:
                raise RuleError(f'unknown reject type "{given}"')
        else:
            found = next(t for t in types if t.endswith("port-unreachable"))
        if found == "tcp-reset" and self.ctx.port_protocol() != "tcp":
            self.ctx.kernel_errors.append("REJECT --reject-with tcp-reset needs -p tcp")
        return f" --reject-with {found}"


TARGETS: dict[str, type[_Target]] = {
    cls.name: cls for cls in (_Accept, _Drop, _Return, _Dnat, _Masquerade, _MarkTarget, _Reject)
}
# Names a chain may not take: the standard targets (iptables refuses them, "File
# exists") and the extensions modelled here (iptables allows a chain named DNAT, which
# then shadows the target; refused, so a rule's meaning never depends on the state).
RESERVED_CHAIN_NAMES = frozenset({"ACCEPT", "DROP", "QUEUE", "RETURN"} | set(TARGETS))


# ---------------------------------------------------------------------------- parser

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
