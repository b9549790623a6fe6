"""The values of the iptables rule language (see :mod:`.rules`): addresses, ports,
numbers, protocols, interfaces and strings, read as iptables 1.8.9 reads them and
printed as ``iptables-save`` prints them; :class:`RuleError` for what it refuses.

Each ``parse_*`` takes the text of one option's value and returns its canonical form;
``port_range_text``, ``save_string`` and ``probability_text`` print. The limits
iptables enforces (:data:`IFNAMSIZ`, :data:`COMMENT_MAX`, :data:`RECENT_NAME_MAX`) are
here too.
"""

from __future__ import annotations

import ipaddress
import math
import re

from kubeproxy.dataplane.errors import DataplaneInputError
from kubeproxy.model.types import PLAIN_IPV4, IPFamily


class RuleError(DataplaneInputError):
    """iptables refuses the rule while reading its line (a parameter problem)."""

    tool = "iptables"


PORT_PROTOCOLS = frozenset({"tcp", "udp", "sctp", "dccp"})
_PROTOCOLS = {"all": 0, "icmp": 1, "tcp": 6, "udp": 17, "ipv6-icmp": 58, "sctp": 132}
_PROTOCOL_NAMES = {n: name for name, n in _PROTOCOLS.items()}
_ALIASES = {"icmpv6": "ipv6-icmp"}
IFNAMSIZ = 16
COMMENT_MAX = 255  # XT_MAX_COMMENT_LEN - 1
RECENT_NAME_MAX = 199  # XT_RECENT_NAME_LEN - 1
_RECENT_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")
U32_MAX = 0xFFFFFFFF
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
    if value < 0 or value > U32_MAX:
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


def probability_text(probability: float) -> str:
    """How iptables-save prints a probability: the kernel keeps it as a 31-bit fraction
    (``lround(p * 2^31)``), printed back with 11 decimals (0.1 is 0.10000000009)."""
    fixed = math.floor(probability * 0x80000000 + 0.5)
    return f"{fixed / 0x80000000:.11f}"


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
