"""The match extensions of the iptables rule language (see :mod:`.rules`): ``-m NAME``
and its options.

``_Context`` is what the extensions of one rule see of each other (family, flavour,
``-p`` protocol, kernel errors found on the way); ``_Extension`` is a match or target:
its options (spelling -> key, takes a value, may be negated), how it takes them and how
it prints itself (``finish``). One small class per match (``_Comment``, ``_Conntrack``,
``_Tcp``, ``_Multiport``, ``_Statistic``, ``_Recent``...); :data:`MATCHES` maps their
names, ``_PROTOCOL_MATCHES`` the matches iptables loads for a ``-p`` protocol's options.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import ClassVar

from kubeproxy.dataplane.iptables.rule_values import (
    _PROTOCOLS,
    _RECENT_NAME,
    COMMENT_MAX,
    RECENT_NAME_MAX,
    U32_MAX,
    RuleError,
    _is_number,
    parse_address,
    parse_network,
    parse_port_range,
    parse_protocol,
    parse_value_mask,
    port_range_text,
    probability_text,
    save_string,
)
from kubeproxy.dataplane.nfacct import NAME_MAX as NFACCT_NAME_MAX
from kubeproxy.model.types import IPFamily


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
        text = f"{value:#x}" if mask is None or mask == U32_MAX else f"{value:#x}/{mask:#x}"
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
