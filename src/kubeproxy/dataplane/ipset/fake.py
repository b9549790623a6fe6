"""An in-memory ``ipset`` that refuses what ipset 7.17 and the kernel refuse.

:class:`FakeIpset` applies an :class:`~kubeproxy.dataplane.ipset.IpsetScript` line by
line, as ``ipset restore -exist`` reads it, and stops at the first refused line with the
line number ipset reports (the lines before it stay applied: the real command may apply
fewer, see :mod:`kubeproxy.dataplane.ipset`). Refused: a set name over 31 characters,
an unknown type, creating a set that exists with another type, adding to or deleting
from a set that does not exist, a member that does not fit the set's type or family (a
port outside 0-65535, an address of the other family, a protocol other than tcp, udp or
sctp), and destroying a set that an iptables rule uses (``in_use``: names a test marks as
referenced).
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

_PROTO_PORT = re.compile(r"^(tcp|udp|sctp):(\d+)$")


def _address(text: str, v6: bool) -> str:
    ip = ipaddress.ip_address(text)
    if (ip.version == 6) != v6:
        raise ValueError(f"{text} is not of the set's family")
    return str(ip)


def _port(text: str) -> int:
    number = int(text)
    if not 0 <= number <= 65535:
        raise ValueError(f"'{text}' is out of range 0-65535")
    return number


def canonical_member(set_type: str, v6: bool, text: str) -> str:
    """``text`` as ipset save would print it; ValueError if the set refuses it."""
    parts = text.split(",")
    if set_type == "bitmap:port":
        if len(parts) != 1:
            raise ValueError(f"bad port {text!r}")
        found = _PROTO_PORT.match(parts[0])
        return str(_port(found.group(2) if found else parts[0]))
    if set_type == "hash:ip":
        if len(parts) != 1:
            raise ValueError(f"bad address {text!r}")
        return member(_address(parts[0], v6))
    want = {"hash:ip,port": 2, "hash:ip,port,ip": 3, "hash:ip,port,net": 3}[set_type]
    if len(parts) != want:
        raise ValueError(f"{text!r} does not fit {set_type}")
    found = _PROTO_PORT.match(parts[1])
    if found is None:
        raise ValueError(f"bad protocol:port {parts[1]!r}")
    out = [member(_address(parts[0], v6)), f"{found.group(1)}:{_port(found.group(2))}"]
    if set_type == "hash:ip,port,ip":
        out.append(member(_address(parts[2], v6)))
    elif set_type == "hash:ip,port,net":
        net = ipaddress.ip_network(parts[2], strict=False)
        if (net.version == 6) != v6:
            raise ValueError(f"{parts[2]} is not of the set's family")
        out.append(member(str(net)))
    return ",".join(out)


class FakeIpset:
    def __init__(self) -> None:
        self.state: dict[str, SetState] = {}
        self.in_use: set[str] = set()
        self.scripts: list[str] = []

    def version(self) -> str:
        return "7.17"

    def sets(self) -> dict[str, SetState]:
        return dict(self.state)

    def restore(self, script: IpsetScript) -> None:
        self.scripts.append(str(script))
        for number, line in enumerate(script.lines, 1):
            try:
                self._apply(line)
            except (ValueError, KeyError) as err:
                raise IpsetError(f"ipset v7.17: Error in line {number}: {err}", number) from None

    def _apply(self, line: str) -> None:
        words = line.split()
        command, name = words[0], words[1]
        if len(name) > NAME_MAX:
            raise ValueError("Syntax error: setname is longer than 31 characters")
        if command == "create":
            set_type = words[2]
            if set_type not in TYPES:
                raise ValueError(f"Unknown settype {set_type}")
            v6 = "inet6" in words[3:]
            old = self.state.get(name)
            if old is not None:
                if old.type != set_type or old.v6 != v6:
                    raise ValueError("Set cannot be created: set with the same name already exists")
                return
            self.state[name] = SetState(set_type, frozenset(), v6)
            return
        old = self.state.get(name)
        if old is None:
            raise KeyError("The set with the given name does not exist")
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
                raise ValueError("Set cannot be destroyed: it is in use by a kernel component")
            del self.state[name]
        else:
            raise ValueError(f"unknown command {command}")
