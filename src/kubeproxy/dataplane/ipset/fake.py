"""An in-memory ``ipset`` that refuses what ipset 7.17 and the kernel refuse.

:class:`FakeIpset` applies an :class:`~kubeproxy.dataplane.ipset.IpsetScript` line by
line, as ``ipset restore -exist`` reads it, and stops at the first refused line with the
line number ipset reports (the lines before it stay applied: the real command may apply
fewer, see :mod:`kubeproxy.dataplane.ipset`). tests/ipset_fake_cases.py checks each
claim against ipset and the user-mode-linux guest's kernel (Linux 6.1), with ipset's
own messages:

* Refused: a set name over 31 characters; an unknown type; creating a set that exists
  with another type, another ``maxelem``, ``timeout``, ``netmask`` or ``range``, or
  other extensions (``comment``, ``counters``, ``skbinfo``) — but not another family or
  hash size, which ``-exist`` lets pass, keeping the set as it is; adding to, deleting
  from or flushing a set that does not exist (destroying one is fine under ``-exist``);
  a member that does not fit the set's type or family (an address of the other family,
  a protocol ipset cannot parse, a network of prefix 0 in ``hash:ip,port,net``, a
  network where ``hash:ip,port,ip`` wants an address); destroying a set an iptables rule
  uses (``in_use``: names a test marks as referenced).
* A port outside 0-65535 is refused too, and ipset then names no line (its message
  has no "Error in line"): neither does the fake.
* A port without a protocol is tcp, as ipset reads it; tcp, udp, sctp and udplite are
  the protocols the fake takes.
* Deliberately stricter than ipset (refused here, where ipset expands or reinterprets
  them; kube-proxy never writes them): a network or range where a set wants addresses
  (``10.0.0.0/30`` in ``hash:ip`` adds four), port ranges (``tcp:80-82``), ICMP types as
  ports (``icmp:ping``), and addresses with leading zeros (ipset reads ``010.0.0.7`` as
  octal: ``8.0.0.7``).
"""

from __future__ import annotations

import ipaddress
import re

from kubeproxy.dataplane.ipset import (
    NAME_MAX,
    TYPES,
    IpsetError,
    IpsetScript,
    SetState,
    member,
)

_PROTO_PORT = re.compile(r"^(?:([a-z0-9-]+):)?(\d+)$")
_PROTOCOLS = ("tcp", "udp", "sctp", "udplite")
# Create options whose value must match an existing set's for "-exist" to accept
# creating it again (the kernel's same_set), with their defaults.
_SAME = {"maxelem": "65536", "timeout": "0", "netmask": "", "range": ""}
_EXTENSIONS = ("comment", "counters", "skbinfo")


class _RefusedError(ValueError):
    """A refused line; ``numbered``: ipset's message names the line."""

    def __init__(self, message: str, *, numbered: bool = True) -> None:
        super().__init__(message)
        self.numbered = numbered


def _address(text: str, v6: bool) -> str:
    address, _, prefix = text.partition("/")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise _RefusedError(
            f"Syntax error: cannot parse {text}: the fake takes addresses"
        ) from None
    if (ip.version == 6) != v6:
        family = "IPv6" if v6 else "IPv4"
        raise _RefusedError(
            f"Syntax error: cannot parse {text}: resolving to {family} address failed"
        )
    if prefix and prefix != str(ip.max_prefixlen):
        raise _RefusedError(f"Syntax error: {text}: the fake takes single addresses, not networks")
    return str(ip)


def _port(text: str, *, protocol: bool) -> str:
    found = _PROTO_PORT.match(text)
    if found is None:
        raise _RefusedError(
            f"Syntax error: cannot parse '{text}' as a port (the fake takes one port)"
        )
    proto, number = found.group(1) or "tcp", int(found.group(2))
    if proto not in _PROTOCOLS:
        raise _RefusedError(f"Syntax error: cannot parse '{proto}' as a protocol (or the fake's)")
    if not 0 <= number <= 65535:
        raise _RefusedError(f"Syntax error: '{number}' is out of range 0-65535", numbered=False)
    return f"{proto}:{number}" if protocol else str(number)


def canonical_member(set_type: str, v6: bool, text: str) -> str:
    """``text`` as ipset save would print it; ValueError if the set refuses it."""
    parts = text.split(",")
    if set_type == "bitmap:port":
        if len(parts) != 1:
            raise _RefusedError(f"Syntax error: bad port {text!r}")
        return _port(parts[0], protocol=False)
    if set_type == "hash:ip":
        if len(parts) != 1:
            raise _RefusedError(f"Syntax error: bad address {text!r}")
        return _address(parts[0], v6)
    want = {"hash:ip,port": 2, "hash:ip,port,ip": 3, "hash:ip,port,net": 3}[set_type]
    if len(parts) != want:
        raise _RefusedError(f"Syntax error: {text!r} does not fit {set_type}")
    out = [_address(parts[0], v6), _port(parts[1], protocol=True)]
    if set_type == "hash:ip,port,ip":
        if "/" in parts[2]:
            raise _RefusedError(f"Syntax error: plain IP address must be supplied: {parts[2]}")
        out.append(_address(parts[2], v6))
    elif set_type == "hash:ip,port,net":
        net = ipaddress.ip_network(parts[2], strict=False)
        if (net.version == 6) != v6:
            family = "IPv6" if v6 else "IPv4"
            raise _RefusedError(
                f"Syntax error: cannot parse {parts[2]}: resolving to {family} address failed"
            )
        if net.prefixlen == 0:
            raise _RefusedError("The value of the CIDR parameter of the IP address is invalid")
        out.append(member(str(net)))
    return ",".join(out)


def _identity(words: list[str]) -> tuple[tuple[str, str], ...]:
    """What of a create line must match an existing set's (see _SAME)."""
    values = dict(_SAME)
    flags = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in _EXTENSIONS:
            flags.append(word)
        elif word in _SAME and i + 1 < len(words):
            values[word] = words[i + 1]
            i += 1
        elif word in ("family", "hashsize", "bucketsize", "initval") and i + 1 < len(words):
            i += 1  # -exist does not compare these
        i += 1
    return (*sorted(values.items()), *(("extension", f) for f in sorted(flags)))


class FakeIpset:
    def __init__(self) -> None:
        self.state: dict[str, SetState] = {}
        self.in_use: set[str] = set()
        self.scripts: list[str] = []
        self._identity: dict[str, tuple[tuple[str, str], ...]] = {}

    def version(self) -> str:
        return "7.17"

    def sets(self) -> dict[str, SetState]:
        return dict(self.state)

    def restore(self, script: IpsetScript) -> None:
        self.scripts.append(str(script))
        for number, line in enumerate(script.lines, 1):
            try:
                self._apply(line)
            except ValueError as err:
                if not getattr(err, "numbered", True):
                    raise IpsetError(f"ipset v7.17: {err}") from None
                raise IpsetError(f"ipset v7.17: Error in line {number}: {err}", number) from None

    def _apply(self, line: str) -> None:
        words = line.split()
        command, name = words[0], words[1]
        if len(name) > NAME_MAX:
            raise _RefusedError(
                f"Syntax error: setname '{name}' is longer than {NAME_MAX} characters"
            )
        if command == "create":
            self._create(name, words[2], words[3:])
            return
        if command == "destroy" and name not in self.state:
            return  # -exist
        old = self.state.get(name)
        if old is None:
            raise _RefusedError("The set with the given name does not exist")
        if command in ("add", "del"):
            value = canonical_member(old.type, old.v6, words[2])
            members = set(old.members)
            if command == "add":
                members.add(value)
            else:
                members.discard(value)
            self.state[name] = SetState(old.type, frozenset(members), old.v6)
        elif command == "flush":
            self.state[name] = SetState(old.type, frozenset(), old.v6)
        elif command == "destroy":
            if name in self.in_use:
                raise _RefusedError("Set cannot be destroyed: it is in use by a kernel component")
            del self.state[name]
            del self._identity[name]
        else:
            raise _RefusedError(f"Syntax error: unknown command {command}")

    def _create(self, name: str, set_type: str, options: list[str]) -> None:
        if set_type not in TYPES:
            raise _RefusedError(f"Syntax error: typename '{set_type}' is unknown")
        identity = (("type", set_type), *_identity(options))
        old = self._identity.get(name)
        if old is not None:
            if old != identity:
                raise _RefusedError("Set cannot be created: set with the same name already exists")
            return  # -exist: the set stays as it is (its family too)
        self.state[name] = SetState(set_type, frozenset(), "inet6" in options)
        self._identity[name] = identity
