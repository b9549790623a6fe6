"""The kernel's IP Virtual Server table and the ``kube-ipvs0`` dummy link, as plain data and
two small interfaces.

* Data: :class:`ServiceKey` (address, protocol, port: what the kernel keys a virtual
  server by), :class:`VirtualServer` (a key plus scheduler, flags and persistence
  timeout), :class:`Destination` (a real server: address, port, weight, and the
  connection counts the kernel reports). Every destination is a NAT ("masquerading")
  real server, as upstream kube-proxy creates them.
* :class:`Change` — one add, change ("set", never delete-and-add) or delete of a virtual
  server or destination (:class:`Op`).
* :class:`Ipvs` — the IPVS table of one network namespace: list virtual servers and
  their destinations, :meth:`Ipvs.apply` many changes at once (each gets its own
  outcome), one change at a time, and the connection timeouts (``ipvsadm --set``).
  :class:`IpvsError` carries the kernel's errno.
* :class:`Links` — the dummy interface that holds every service address (left down, as
  upstream: the addresses only need to be local for the routing decision), addresses
  added and deleted many at once, and the node's other addresses (NodePort virtual
  servers are created on each of them).

Implementations: :mod:`.netlink` (messages packed by :mod:`.wire`, many per send) and
:mod:`.fake` (in memory, refusing what the kernel refuses).
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from kubeproxy.dataplane.errors import DataplaneError

# ip_vs.h: IP_VS_SVC_F_*
FLAG_PERSISTENT = 0x0001
FLAG_HASHED = 0x0002  # set by the kernel on every listed service; never ours to set
FLAG_SCHED1 = 0x0008  # sh-fallback / mh-fallback
FLAG_SCHED2 = 0x0010  # sh-port / mh-port (upstream's FlagSourceHash)
FLAG_SCHED3 = 0x0020
FLAGS_MASK = 0xFFFF
# ip_vs.h: IP_VS_CONN_F_MASQ (the forwarding method of a NAT real server)
FWD_MASQ = 0
PROTOCOLS = ("TCP", "UDP", "SCTP")
# The kernel's IPVS schedulers (ip_vs_<name> modules; mh since Linux 4.18): the names
# ipvs.scheduler may take.
SCHEDULERS = ("rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh")


class IpvsError(DataplaneError):
    """The kernel refused an IPVS operation (``errno`` as it answered)."""

    tool = "ipvs"

    def __init__(self, message: str, code: int = errno.EINVAL) -> None:
        super().__init__(message)
        self.errno = code


@dataclass(frozen=True, slots=True, order=True)
class ServiceKey:
    address: str
    protocol: str  # TCP, UDP, SCTP
    port: int

    @property
    def v6(self) -> bool:
        return ":" in self.address

    def __str__(self) -> str:
        host = f"[{self.address}]" if self.v6 else self.address
        return f"{self.protocol}/{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class VirtualServer:
    key: ServiceKey
    scheduler: str = "rr"
    flags: int = 0  # FLAG_PERSISTENT, FLAG_SCHED*; never FLAG_HASHED
    timeout: int = 0  # persistence timeout in seconds (with FLAG_PERSISTENT)

    def __str__(self) -> str:
        extra = f" persistent {self.timeout}" if self.flags & FLAG_PERSISTENT else ""
        flags = self.flags & ~FLAG_PERSISTENT
        return f"{self.key} {self.scheduler}{extra}" + (f" flags {flags:#x}" if flags else "")


@dataclass(frozen=True, slots=True, order=True)
class Destination:
    address: str
    port: int
    weight: int = 1
    # Reported by the kernel; ignored when adding or changing a destination.
    active: int = 0
    inactive: int = 0

    @property
    def endpoint(self) -> tuple[str, int]:
        return (self.address, self.port)

    @property
    def connections(self) -> int:
        return self.active + self.inactive

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"


def canonical_ip(text: str) -> str:
    return str(ipaddress.ip_address(text))


class Op(Enum):
    ADD_SERVICE = "add service"
    SET_SERVICE = "change service"
    DELETE_SERVICE = "delete service"
    ADD_DEST = "add destination"
    SET_DEST = "change destination"
    DELETE_DEST = "delete destination"


@dataclass(frozen=True, slots=True)
class Change:
    """One IPVS change: ``service`` for adding/changing a virtual server, ``dest`` for
    every destination operation (its weight matters for add and change only)."""

    op: Op
    key: ServiceKey
    service: VirtualServer | None = None
    dest: Destination | None = None

    @classmethod
    def add_service(cls, vs: VirtualServer) -> Change:
        return cls(Op.ADD_SERVICE, vs.key, vs)

    @classmethod
    def set_service(cls, vs: VirtualServer) -> Change:
        return cls(Op.SET_SERVICE, vs.key, vs)

    @classmethod
    def delete_service(cls, key: ServiceKey) -> Change:
        return cls(Op.DELETE_SERVICE, key)

    @classmethod
    def add_dest(cls, key: ServiceKey, dest: Destination) -> Change:
        return cls(Op.ADD_DEST, key, dest=dest)

    @classmethod
    def set_dest(cls, key: ServiceKey, dest: Destination) -> Change:
        return cls(Op.SET_DEST, key, dest=dest)

    @classmethod
    def delete_dest(cls, key: ServiceKey, dest: Destination) -> Change:
        return cls(Op.DELETE_DEST, key, dest=dest)

    def __str__(self) -> str:
        if self.dest is None:
            return f"{self.op.value} {self.service or self.key}"
        weight = "" if self.op is Op.DELETE_DEST else f" weight {self.dest.weight}"
        return f"{self.op.value} {self.dest}{weight} of {self.key}"


Outcome = IpvsError | None


class Ipvs(Protocol):
    """The IPVS table of one network namespace."""

    def services(self) -> list[VirtualServer]: ...

    def destinations(self, key: ServiceKey) -> list[Destination]: ...

    def apply(self, changes: Sequence[Change]) -> list[Outcome]:
        """Every change in order, as few requests as possible; one outcome each (None:
        done). A refused change does not stop the ones after it."""

    def add_service(self, vs: VirtualServer) -> None: ...

    def set_service(self, vs: VirtualServer) -> None:
        """Change scheduler, flags or timeout of an existing service in place."""

    def delete_service(self, key: ServiceKey) -> None: ...

    def add_destination(self, key: ServiceKey, dest: Destination) -> None: ...

    def set_destination(self, key: ServiceKey, dest: Destination) -> None:
        """Change the weight of an existing destination in place."""

    def delete_destination(self, key: ServiceKey, address: str, port: int) -> None: ...

    def set_timeouts(self, tcp: int, tcp_fin: int, udp: int) -> None:
        """``ipvsadm --set``: 0 leaves that timeout as it is."""

    def close(self) -> None: ...


class Links(Protocol):
    """The dummy interface holding service addresses, and the node's own addresses."""

    def ensure_dummy(self, name: str) -> bool:
        """Create ``name`` (a dummy link, left down) unless it exists; True if it did."""

    def exists(self, name: str) -> bool: ...

    def addresses(self, name: str) -> set[str]:
        """Addresses on ``name`` (empty if it does not exist)."""

    def add_addresses(self, name: str, addresses: Sequence[str]) -> list[Outcome]:
        """Put each address (/32 or /128) on ``name``; one outcome each (None: done)."""

    def delete_addresses(self, name: str, addresses: Sequence[str]) -> list[Outcome]: ...

    def node_addresses(self, exclude: str) -> set[str]:
        """Every local address on a link other than ``exclude``."""

    def delete_link(self, name: str) -> bool:
        """Delete ``name``; False if there was none."""

    def close(self) -> None: ...
