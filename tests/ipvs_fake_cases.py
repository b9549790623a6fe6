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
from tests.parity import Call, Case, Step, Table

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

IpvsOp = Call[IpvsSystem]


def add_service(vs: VirtualServer) -> IpvsOp:
    return Call(f"add service {vs}", lambda s: s.ipvs.add_service(vs))


def set_service(vs: VirtualServer) -> IpvsOp:
    return Call(f"change service {vs}", lambda s: s.ipvs.set_service(vs))


def delete_service(key: ServiceKey) -> IpvsOp:
    return Call(f"delete service {key}", lambda s: s.ipvs.delete_service(key))


def add_dest(key: ServiceKey, dest: Destination) -> IpvsOp:
    text = f"add destination {dest} weight {dest.weight} to {key}"
    return Call(text, lambda s: s.ipvs.add_destination(key, dest))


def set_dest(key: ServiceKey, dest: Destination) -> IpvsOp:
    text = f"change destination {dest} weight {dest.weight} of {key}"
    return Call(text, lambda s: s.ipvs.set_destination(key, dest))


def delete_dest(key: ServiceKey, address: str, port: int) -> IpvsOp:
    text = f"delete destination {address}:{port} of {key}"
    return Call(text, lambda s: s.ipvs.delete_destination(key, address, port))


def destinations(key: ServiceKey) -> IpvsOp:
    def run(s: IpvsSystem) -> object:
        return sorted((d.address, d.port, d.weight) for d in s.ipvs.destinations(key))

    return Call(f"list the destinations of {key}", run)


def batch(*changes: Change) -> IpvsOp:
    text = "batch: " + "; ".join(map(str, changes))
    return Call(text, lambda s: [_name(o) for o in s.ipvs.apply(changes)])


def set_timeouts(tcp: int, tcp_fin: int, udp: int) -> IpvsOp:
    text = f"set timeouts tcp {tcp} tcpfin {tcp_fin} udp {udp}"
    return Call(text, lambda s: s.ipvs.set_timeouts(tcp, tcp_fin, udp))


def ensure_dummy() -> IpvsOp:
    return Call(f"ensure dummy {LINK}", lambda s: s.links.ensure_dummy(LINK))


def add_addresses(*addresses: str) -> IpvsOp:
    text = f"add {', '.join(addresses)} to {LINK}"
    return Call(text, lambda s: [_name(o) for o in s.links.add_addresses(LINK, addresses)])


def delete_addresses(*addresses: str) -> IpvsOp:
    text = f"delete {', '.join(addresses)} from {LINK}"
    return Call(text, lambda s: [_name(o) for o in s.links.delete_addresses(LINK, addresses)])


def delete_link() -> IpvsOp:
    return Call(f"delete link {LINK}", lambda s: s.links.delete_link(LINK))


# -------------------------------------------------------------------------- builders


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


def names(*items: str | None) -> Sequence[str | None]:
    return list(items)


# ----------------------------------------------------------------------------- cases

CASES: list[Case[IpvsSystem]] = [
    case(
        "Services are added, changed in place and deleted",
        ok(add_service(vs())),
        refused("EEXIST", add_service(vs())),
        refused("EEXIST", add_service(vs(scheduler="wrr"))),  # the key decides
        ok(set_service(vs(scheduler="wrr"))),
        ok(set_service(vs(scheduler="sh", flags=FLAG_PERSISTENT, timeout=10800))),
        ok(set_service(vs(scheduler="mh", flags=FLAG_SCHED1 | FLAG_SCHED2))),
        ok(delete_service(V4)),
        refused("ESRCH", delete_service(V4)),
    ),
    case(
        "Every protocol and both families",
        ok(add_service(vs(key(protocol="UDP", port=53)))),
        ok(add_service(vs(key(protocol="SCTP", port=9999)))),
        ok(add_service(vs(V6))),
        ok(add_service(vs(key(port=443)))),
        ok(add_dest(V6, dest("fd00:10:244:1::10"))),
    ),
    case(
        "An unknown scheduler is ENOENT: no ip_vs_<name> module",
        refused("ENOENT", add_service(vs(scheduler="nope"))),
        ok(add_service(vs())),
        refused("ENOENT", set_service(vs(scheduler="nope"))),
    ),
    case(
        "Persistence: a zero timeout is accepted, a timeout without the flag is kept",
        ok(add_service(vs(flags=FLAG_PERSISTENT, timeout=0))),
        ok(add_service(vs(OTHER, timeout=30))),
    ),
    case(
        "A service that does not exist is ESRCH for every operation on it",
        refused("ESRCH", set_service(vs())),
        refused("ESRCH", delete_service(V4)),
        refused("ESRCH", add_dest(V4, dest())),
        refused("ESRCH", set_dest(V4, dest())),
        refused("ESRCH", delete_dest(V4, "10.244.1.10", 8080)),
        # Listing them is no error: the kernel's dump of a missing service is empty.
        ok(destinations(V4), result=[]),
    ),
    case(
        "Destinations are added, reweighted and deleted",
        ok(add_service(vs())),
        ok(add_dest(V4, dest())),
        refused("EEXIST", add_dest(V4, dest(weight=5))),
        ok(set_dest(V4, dest(weight=5))),
        ok(add_dest(V4, dest("10.244.1.11", weight=0))),  # weight 0: quiesced
        ok(destinations(V4), result=[("10.244.1.10", 8080, 5), ("10.244.1.11", 8080, 0)]),
        refused("ENOENT", set_dest(V4, dest("10.244.1.12"))),
        refused("ENOENT", delete_dest(V4, "10.244.1.12", 8080)),
        refused("ENOENT", delete_dest(V4, "10.244.1.10", 9090)),  # the port is the key too
        ok(delete_dest(V4, "10.244.1.10", 8080)),
        ok(delete_service(V4)),  # with its destinations
    ),
    case(
        "A destination of the other family is EINVAL (NAT cannot mix them)",
        ok(add_service(vs())),
        ok(add_service(vs(V6))),
        refused("EINVAL", add_dest(V4, dest("fd00:10:244:1::10"))),
        refused("EINVAL", add_dest(V6, dest("10.244.1.10"))),
        refused("EINVAL", set_dest(V4, dest("fd00:10:244:1::10"))),
        # Deleting one only looks it up.
        refused("ENOENT", delete_dest(V4, "fd00:10:244:1::10", 8080)),
    ),
    case(
        "A negative weight is ERANGE",
        ok(add_service(vs())),
        refused("ERANGE", add_dest(V4, dest(weight=-1))),
        ok(add_dest(V4, dest())),
        refused("ERANGE", set_dest(V4, dest(weight=-1))),
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
        ok(set_timeouts(900, 120, 300)),
        ok(set_timeouts(0, 0, 0)),
        refused("EINVAL", set_timeouts(-1, 0, 0)),
        refused("EINVAL", set_timeouts(2**31 - 1, 0, 0)),
    ),
    case(
        "The dummy link: created once, addresses added and deleted one outcome each",
        ok(add_addresses("10.96.0.10"), result=names("ENODEV")),
        ok(ensure_dummy(), result=False),
        ok(ensure_dummy(), result=True),
        ok(
            add_addresses("10.96.0.10", "10.96.0.10", "fd00:10:96::10"),
            result=names(None, "EEXIST", None),
        ),
        ok(
            delete_addresses("10.96.0.10", "10.96.0.99"),
            result=names(None, "EADDRNOTAVAIL"),
        ),
        ok(delete_link(), result=True),
        ok(delete_link(), result=False),
    ),
    # Deliberately stricter than the kernel: what kube-proxy never asks for is a bug here.
    case(
        "A service on port 0 (ipvsadm's all-ports persistent service)",
        stricter("kube-proxy never programs port 0", "EINVAL", add_service(vs(key(port=0)))),
    ),
    case(
        "The hashed flag in a request",
        stricter(
            "the kernel sets it itself; asking for it is a bug of ours",
            "EINVAL",
            add_service(vs(flags=FLAG_HASHED)),
        ),
    ),
    case(
        "An address not written canonically",
        stricter(
            "the kernel lists fd00::10 back: a backend comparing its wishes with the "
            "listing must write addresses as they come back",
            "EINVAL",
            add_service(vs(key("fd00:0::10"))),
        ),
    ),
    case(
        "A destination on port 0",
        ok(add_service(vs())),
        stricter(
            "port 0 is 'the service's port' to the kernel; kube-proxy always names one",
            "EINVAL",
            add_dest(V4, dest(port=0)),
        ),
    ),
]
