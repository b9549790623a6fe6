"""IPVS operations and what the kernel (Linux 6.1, the user-mode-linux guest's) does with
them: the cases :class:`~kubeproxy.dataplane.ipvs.fake.FakeIpvs` and ``FakeLinks`` are
checked against, without root (tests/unit/test_fake_parity.py) and in the guest
against :class:`~kubeproxy.dataplane.ipvs.netlink.NetlinkIpvs` and ``NetlinkLinks`` in
a fresh namespace (tests/ipvs/test_fakes_vs_kernel.py). See tests/parity.py.

A refusal is described by its errno's name (``EEXIST``); a batch (``apply``, the
address operations) returns one name or None per item. The state compared after each
step: every virtual server, the destinations of each, and the dummy link's addresses.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass

from kubeproxy.dataplane.ipvs import (
    FLAG_HASHED,
    FLAG_PERSISTENT,
    FLAG_SCHED1,
    FLAG_SCHED2,
    Change,
    Destination,
    Ipvs,
    IpvsError,
    Links,
    Outcome,
    ServiceKey,
    VirtualServer,
)
from tests.parity import Case, Op, Step, Table

LINK = "kube-ipvs0"


@dataclass
class IpvsSystem:
    ipvs: Ipvs
    links: Links


def _name(outcome: Outcome) -> str | None:
    return None if outcome is None else errno.errorcode[outcome.errno]


def _describe(err: Exception) -> str:
    assert isinstance(err, IpvsError)
    return errno.errorcode.get(err.errno, str(err.errno))


def _state(system: IpvsSystem, refused: bool) -> object:
    # In key order: the kernel lists in its hash order.
    services = sorted(system.ipvs.services(), key=lambda vs: vs.key)
    return (
        services,
        {vs.key: sorted(system.ipvs.destinations(vs.key)) for vs in services},
        system.links.exists(LINK),
        system.links.addresses(LINK),
    )


TABLE = Table[IpvsSystem]((IpvsError,), _describe, _state)


# ------------------------------------------------------------------------ operations


@dataclass(frozen=True)
class AddService:
    vs: VirtualServer

    def apply(self, s: IpvsSystem) -> object:
        s.ipvs.add_service(self.vs)
        return None

    def __str__(self) -> str:
        return f"add service {self.vs}"


@dataclass(frozen=True)
class SetService:
    vs: VirtualServer

    def apply(self, s: IpvsSystem) -> object:
        s.ipvs.set_service(self.vs)
        return None

    def __str__(self) -> str:
        return f"change service {self.vs}"


@dataclass(frozen=True)
class DeleteService:
    key: ServiceKey

    def apply(self, s: IpvsSystem) -> object:
        s.ipvs.delete_service(self.key)
        return None

    def __str__(self) -> str:
        return f"delete service {self.key}"


@dataclass(frozen=True)
class AddDest:
    key: ServiceKey
    dest: Destination

    def apply(self, s: IpvsSystem) -> object:
        s.ipvs.add_destination(self.key, self.dest)
        return None

    def __str__(self) -> str:
        return f"add destination {self.dest} weight {self.dest.weight} to {self.key}"


@dataclass(frozen=True)
class SetDest:
    key: ServiceKey
    dest: Destination

    def apply(self, s: IpvsSystem) -> object:
        s.ipvs.set_destination(self.key, self.dest)
        return None

    def __str__(self) -> str:
        return f"change destination {self.dest} weight {self.dest.weight} of {self.key}"


@dataclass(frozen=True)
class DeleteDest:
    key: ServiceKey
    address: str
    port: int

    def apply(self, s: IpvsSystem) -> object:
        s.ipvs.delete_destination(self.key, self.address, self.port)
        return None

    def __str__(self) -> str:
        return f"delete destination {self.address}:{self.port} of {self.key}"


@dataclass(frozen=True)
class Destinations:
    key: ServiceKey

    def apply(self, s: IpvsSystem) -> object:
        return sorted((d.address, d.port, d.weight) for d in s.ipvs.destinations(self.key))

    def __str__(self) -> str:
        return f"list the destinations of {self.key}"


@dataclass(frozen=True)
class Apply:
    changes: tuple[Change, ...]

    def apply(self, s: IpvsSystem) -> object:
        return [_name(o) for o in s.ipvs.apply(self.changes)]

    def __str__(self) -> str:
        return "batch: " + "; ".join(map(str, self.changes))


@dataclass(frozen=True)
class SetTimeouts:
    tcp: int
    tcp_fin: int
    udp: int

    def apply(self, s: IpvsSystem) -> object:
        s.ipvs.set_timeouts(self.tcp, self.tcp_fin, self.udp)
        return None

    def __str__(self) -> str:
        return f"set timeouts tcp {self.tcp} tcpfin {self.tcp_fin} udp {self.udp}"


@dataclass(frozen=True)
class EnsureDummy:
    def apply(self, s: IpvsSystem) -> object:
        return s.links.ensure_dummy(LINK)

    def __str__(self) -> str:
        return f"ensure dummy {LINK}"


@dataclass(frozen=True)
class AddAddresses:
    addresses: tuple[str, ...]

    def apply(self, s: IpvsSystem) -> object:
        return [_name(o) for o in s.links.add_addresses(LINK, self.addresses)]

    def __str__(self) -> str:
        return f"add {', '.join(self.addresses)} to {LINK}"


@dataclass(frozen=True)
class DeleteAddresses:
    addresses: tuple[str, ...]

    def apply(self, s: IpvsSystem) -> object:
        return [_name(o) for o in s.links.delete_addresses(LINK, self.addresses)]

    def __str__(self) -> str:
        return f"delete {', '.join(self.addresses)} from {LINK}"


@dataclass(frozen=True)
class DeleteLink:
    def apply(self, s: IpvsSystem) -> object:
        return s.links.delete_link(LINK)

    def __str__(self) -> str:
        return f"delete link {LINK}"


# -------------------------------------------------------------------------- builders

IpvsOp = Op[IpvsSystem]


def ok(op: IpvsOp, result: object = None) -> Step[IpvsSystem]:
    return Step(op, result=result)


def refused(code: str, op: IpvsOp) -> Step[IpvsSystem]:
    return Step(op, error=f"^{code}$")


def stricter(reason: str, code: str, op: IpvsOp) -> Step[IpvsSystem]:
    return Step(op, error=f"^{code}$", kernel_accepts=reason)


def case(name: str, *steps: Step[IpvsSystem]) -> Case[IpvsSystem]:
    return Case(name, steps)


def key(address: str = "10.96.0.10", protocol: str = "TCP", port: int = 80) -> ServiceKey:
    return ServiceKey(address, protocol, port)


def vs(k: ServiceKey | None = None, scheduler: str = "rr", **kw: int) -> VirtualServer:
    return VirtualServer(k or key(), scheduler, **kw)


def dest(address: str = "10.244.1.10", port: int = 8080, weight: int = 1) -> Destination:
    return Destination(address, port, weight)


V4, V6 = key(), key("fd00:10:96::10")
OTHER = key("10.96.0.99")


def batch(*changes: Change) -> Apply:
    return Apply(tuple(changes))


def addresses(*items: str) -> tuple[str, ...]:
    return tuple(items)


def names(*items: str | None) -> Sequence[str | None]:
    return list(items)


# ----------------------------------------------------------------------------- cases

CASES: list[Case[IpvsSystem]] = [
    case(
        "Services are added, changed in place and deleted",
        ok(AddService(vs())),
        refused("EEXIST", AddService(vs())),
        refused("EEXIST", AddService(vs(scheduler="wrr"))),  # the key decides
        ok(SetService(vs(scheduler="wrr"))),
        ok(SetService(vs(scheduler="sh", flags=FLAG_PERSISTENT, timeout=10800))),
        ok(SetService(vs(scheduler="mh", flags=FLAG_SCHED1 | FLAG_SCHED2))),
        ok(DeleteService(V4)),
        refused("ESRCH", DeleteService(V4)),
    ),
    case(
        "Every protocol and both families",
        ok(AddService(vs(key(protocol="UDP", port=53)))),
        ok(AddService(vs(key(protocol="SCTP", port=9999)))),
        ok(AddService(vs(V6))),
        ok(AddService(vs(key(port=443)))),
        ok(AddDest(V6, dest("fd00:10:244:1::10"))),
    ),
    case(
        "An unknown scheduler is ENOENT: no ip_vs_<name> module",
        refused("ENOENT", AddService(vs(scheduler="nope"))),
        ok(AddService(vs())),
        refused("ENOENT", SetService(vs(scheduler="nope"))),
    ),
    case(
        "Persistence: a zero timeout is accepted, a timeout without the flag is kept",
        ok(AddService(vs(flags=FLAG_PERSISTENT, timeout=0))),
        ok(AddService(vs(OTHER, timeout=30))),
    ),
    case(
        "A service that does not exist is ESRCH for every operation on it",
        refused("ESRCH", SetService(vs())),
        refused("ESRCH", DeleteService(V4)),
        refused("ESRCH", AddDest(V4, dest())),
        refused("ESRCH", SetDest(V4, dest())),
        refused("ESRCH", DeleteDest(V4, "10.244.1.10", 8080)),
        # Listing them is no error: the kernel's dump of a missing service is empty.
        ok(Destinations(V4), result=[]),
    ),
    case(
        "Destinations are added, reweighted and deleted",
        ok(AddService(vs())),
        ok(AddDest(V4, dest())),
        refused("EEXIST", AddDest(V4, dest(weight=5))),
        ok(SetDest(V4, dest(weight=5))),
        ok(AddDest(V4, dest("10.244.1.11", weight=0))),  # weight 0: quiesced
        ok(Destinations(V4), result=[("10.244.1.10", 8080, 5), ("10.244.1.11", 8080, 0)]),
        refused("ENOENT", SetDest(V4, dest("10.244.1.12"))),
        refused("ENOENT", DeleteDest(V4, "10.244.1.12", 8080)),
        refused("ENOENT", DeleteDest(V4, "10.244.1.10", 9090)),  # the port is the key too
        ok(DeleteDest(V4, "10.244.1.10", 8080)),
        ok(DeleteService(V4)),  # with its destinations
    ),
    case(
        "A destination of the other family is EINVAL (NAT cannot mix them)",
        ok(AddService(vs())),
        ok(AddService(vs(V6))),
        refused("EINVAL", AddDest(V4, dest("fd00:10:244:1::10"))),
        refused("EINVAL", AddDest(V6, dest("10.244.1.10"))),
        refused("EINVAL", SetDest(V4, dest("fd00:10:244:1::10"))),
        # Deleting one only looks it up.
        refused("ENOENT", DeleteDest(V4, "fd00:10:244:1::10", 8080)),
    ),
    case(
        "A negative weight is ERANGE",
        ok(AddService(vs())),
        refused("ERANGE", AddDest(V4, dest(weight=-1))),
        ok(AddDest(V4, dest())),
        refused("ERANGE", SetDest(V4, dest(weight=-1))),
    ),
    case(
        "A batch goes on after a refused change, one outcome each",
        ok(
            batch(
                Change.add_service(vs()),
                Change.add_service(vs()),
                Change.add_dest(V4, dest()),
                Change.add_dest(OTHER, dest()),
                Change.set_dest(V4, dest(weight=3)),
                Change.delete_dest(V4, dest("10.244.1.99")),
            ),
            result=names(None, "EEXIST", None, "ESRCH", None, "ENOENT"),
        ),
        ok(batch(), result=names()),
    ),
    case(
        "Timeouts: 0 keeps a value; negative or beyond INT_MAX/HZ is EINVAL",
        ok(SetTimeouts(900, 120, 300)),
        ok(SetTimeouts(0, 0, 0)),
        refused("EINVAL", SetTimeouts(-1, 0, 0)),
        refused("EINVAL", SetTimeouts(2**31 - 1, 0, 0)),
    ),
    case(
        "The dummy link: created once, addresses added and deleted one outcome each",
        ok(AddAddresses(addresses("10.96.0.10")), result=names("ENODEV")),
        ok(EnsureDummy(), result=False),
        ok(EnsureDummy(), result=True),
        ok(
            AddAddresses(addresses("10.96.0.10", "10.96.0.10", "fd00:10:96::10")),
            result=names(None, "EEXIST", None),
        ),
        ok(
            DeleteAddresses(addresses("10.96.0.10", "10.96.0.99")),
            result=names(None, "EADDRNOTAVAIL"),
        ),
        ok(DeleteLink(), result=True),
        ok(DeleteLink(), result=False),
    ),
    # Deliberately stricter than the kernel: what kube-proxy never asks for is a bug here.
    case(
        "A service on port 0 (ipvsadm's all-ports persistent service)",
        stricter("kube-proxy never programs port 0", "EINVAL", AddService(vs(key(port=0)))),
    ),
    case(
        "The hashed flag in a request",
        stricter(
            "the kernel sets it itself; asking for it is a bug of ours",
            "EINVAL",
            AddService(vs(flags=FLAG_HASHED)),
        ),
    ),
    case(
        "An address not written canonically",
        stricter(
            "the kernel lists fd00::10 back: a backend comparing its wishes with the "
            "listing must write addresses as they come back",
            "EINVAL",
            AddService(vs(key("fd00:0::10"))),
        ),
    ),
    case(
        "A destination on port 0",
        ok(AddService(vs())),
        stricter(
            "port 0 is 'the service's port' to the kernel; kube-proxy always names one",
            "EINVAL",
            AddDest(V4, dest(port=0)),
        ),
    ),
]
