"""IP sets: an ``ipset restore`` input as plain data, the small interface backends use, and
the command that runs it.

* :class:`SetSpec` — one set: name, type (``hash:ip,port``, ``bitmap:port``...), family,
  and the creation options upstream kube-proxy uses (hashsize 1024, maxelem 65536, the
  ``comment`` extension; ``range 0-65535`` for port bitmaps).
* :class:`IpsetScript` — creates, adds, deletes, flushes and destroys, printed as the text
  ``ipset restore -exist`` reads (``-exist``: creating an identical set, adding a member
  that is there or deleting one that is not are not errors; a set of another type
  still is). One script is one ``ipset restore`` run.
* :class:`Ipset` — the interface: ``version``, ``sets`` (every set with its type and
  members, from ``ipset save``) and ``restore``. :class:`IpsetCommand` runs the ``ipset``
  binary (in another network namespace when asked); :mod:`.fake` is the strict fake.

What ipset 7.17 does with a refused restore (seen on kernel 6.18): it stops at the
refused line and reports it; creates before it are applied, but adds before it may not
be (they are sent to the kernel in batches). Callers must treat the sets as unknown
after a failure and read them again.

Members are written in the form ``ipset save`` prints them (:func:`member`), so what a
backend wants compares equal to what it lists: addresses canonical, a full-length
network as a plain address, port bitmaps as bare numbers.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from kubeproxy.dataplane.errors import DataplaneError
from kubeproxy.dataplane.process import ToolError, run_tool

TIMEOUT = 60.0
# ipset's limit (IPSET_MAXNAMELEN - 1).
NAME_MAX = 31
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,31}$")
TYPES = ("hash:ip", "hash:ip,port", "hash:ip,port,ip", "hash:ip,port,net", "bitmap:port")


class IpsetError(DataplaneError):
    """ipset refused a restore (or could not run: ``incomplete``); ``line`` is the line
    it reported."""

    tool = "ipset"

    def __init__(
        self,
        message: str,
        line: int | None = None,
        *,
        missing: bool = False,
        incomplete: bool = False,
    ) -> None:
        super().__init__(message, incomplete=incomplete)
        self.line = line
        self.missing = missing  # the ipset binary is not installed


@dataclass(frozen=True, slots=True)
class SetSpec:
    name: str
    type: str
    v6: bool = False
    comment: str = ""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"invalid ipset name {self.name!r}")
        if self.type not in TYPES:
            raise ValueError(f"unsupported ipset type {self.type!r}")

    @property
    def create_options(self) -> str:
        if self.type == "bitmap:port":
            return "range 0-65535 comment"
        family = "inet6" if self.v6 else "inet"
        return f"family {family} hashsize 1024 maxelem 65536 comment"


@dataclass(frozen=True, slots=True)
class SetState:
    """A set as ``ipset save`` lists it."""

    type: str
    members: frozenset[str] = frozenset()
    v6: bool = False


def member(*parts: str | int, protocol: str | None = None) -> str:
    """One member in ``ipset save``'s form: ``member("10.0.0.1", 80, protocol="tcp")`` is
    ``10.0.0.1,tcp:80``; further parts are an address or a network."""
    out: list[str] = []
    for part in parts:
        if isinstance(part, int):
            out.append(f"{protocol}:{part}" if protocol else str(part))
        elif "/" in part:
            net = ipaddress.ip_network(part, strict=False)
            out.append(str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net))
        else:
            out.append(str(ipaddress.ip_address(part)))
    return ",".join(out)


@dataclass
class IpsetScript:
    """One ``ipset restore -exist`` input, in the order the lines are added."""

    lines: list[str] = field(default_factory=list)

    def create(self, spec: SetSpec) -> None:
        self.lines.append(f"create {spec.name} {spec.type} {spec.create_options}")

    def add(self, name: str, members: Iterable[str]) -> None:
        self.lines.extend(f"add {name} {m}" for m in sorted(members))

    def delete(self, name: str, members: Iterable[str]) -> None:
        self.lines.extend(f"del {name} {m}" for m in sorted(members))

    def flush(self, name: str) -> None:
        self.lines.append(f"flush {name}")

    def destroy(self, name: str) -> None:
        self.lines.append(f"destroy {name}")

    def __bool__(self) -> bool:
        return bool(self.lines)

    def __len__(self) -> int:
        return len(self.lines)

    def __str__(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)


class Ipset(Protocol):
    def version(self) -> str:
        """``7.17``."""

    def sets(self) -> dict[str, SetState]:
        """Every set of this network namespace."""

    def restore(self, script: IpsetScript) -> None:
        """Run ``script``; IpsetError if a line is refused (see the module docstring for
        what is then applied)."""


def parse_save(text: str) -> dict[str, SetState]:
    types: dict[str, tuple[str, bool]] = {}
    members: dict[str, set[str]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "create":
            types[words[1]] = (words[2], "inet6" in words[3:])
            members[words[1]] = set()
        elif len(words) >= 3 and words[0] == "add" and words[1] in members:
            members[words[1]].add(words[2])
    return {name: SetState(t, frozenset(members[name]), v6) for name, (t, v6) in types.items()}


_LINE = re.compile(r"Error in line (\d+)")


class IpsetCommand:
    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns

    def _run(self, args: list[str], input: str | None = None) -> str:
        try:
            done = run_tool(
                "ipset", args, netns=self.netns, input=input, timeout=TIMEOUT, package="ipset"
            )
        except ToolError as err:
            raise IpsetError(str(err), missing="not found" in str(err), incomplete=True) from None
        if done.returncode != 0:
            message = done.stderr.strip() or f"ipset exited with status {done.returncode}"
            found = _LINE.search(message)
            raise IpsetError(message, int(found.group(1)) if found else None)
        return done.stdout or ""

    def version(self) -> str:
        text = self._run(["version"])
        found = re.search(r"v(\d+\.\d+)", text)
        if found is None:
            raise IpsetError(f"cannot read the ipset version from {text!r}")
        return found.group(1)

    def sets(self) -> dict[str, SetState]:
        return parse_save(self._run(["save"]))

    def restore(self, script: IpsetScript) -> None:
        if script:
            self._run(["restore", "-exist"], input=str(script))
