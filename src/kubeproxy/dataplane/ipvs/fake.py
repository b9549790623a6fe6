"""In-memory IPVS table and links that refuse what the Linux kernel (6.1) refuses.

:class:`FakeIpvs` keeps services and their destinations. The refusals, each with the
errno ``ip_vs_ctl.c`` answers (tests/ipvs_fake_cases.py checks each against the
kernel): adding a service that exists (EEXIST); an unknown scheduler (ENOENT: no
``ip_vs_<name>`` module); changing, deleting or adding a destination to a service that
does not exist (ESRCH; listing its destinations is no error, as the kernel's empty
dump); a destination of the other address family than its service (EINVAL: NAT cannot
mix them); adding a destination that exists (EEXIST); changing or deleting one that
does not (ENOENT); a negative weight (ERANGE); a negative timeout, or one beyond
INT_MAX/HZ seconds (EINVAL; the fake takes HZ=1000, the largest, so it refuses from
24.8 days where a kernel with a smaller HZ accepts up to ten times that). A persistence
flag with a zero timeout is accepted as the kernel does. Deliberately stricter than
the kernel (EINVAL where it accepts: a bug of ours if asked): port 0 (a service for
every port, or a destination on the service's port), the hashed flag (the kernel's
own), and an address not written canonically (the kernel lists it back canonical).
Connection counts are whatever a test puts in ``conns``.

:class:`FakeLinks` keeps the dummy link and its addresses: adding an address that is
there (EEXIST) or to a missing link (ENODEV), deleting one that is not (EADDRNOTAVAIL).
``calls`` records every changing operation of both, for tests that count them.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from typing import TypeVar

from kubeproxy.dataplane.ipvs import (
    FLAG_HASHED,
    PROTOCOLS,
    SCHEDULERS,
    Change,
    Destination,
    IpvsError,
    Op,
    Outcome,
    ServiceKey,
    VirtualServer,
    canonical_ip,
)

T = TypeVar("T")
# The kernel refuses a timeout beyond INT_MAX/HZ seconds; HZ=1000 is the strictest.
_INT_MAX = 2**31 - 1
_HZ = 1000


def _each(fn: Callable[[T], None], items: Sequence[T]) -> list[Outcome]:
    out: list[Outcome] = []
    for item in items:
        try:
            fn(item)
            out.append(None)
        except IpvsError as err:
            out.append(err)
    return out


class FakeIpvs:
    def __init__(self, schedulers: tuple[str, ...] = SCHEDULERS) -> None:
        self.schedulers = schedulers
        self.table: dict[ServiceKey, VirtualServer] = {}
        self.dests: dict[ServiceKey, dict[tuple[str, int], Destination]] = {}
        # Connection counts per (service, endpoint): what the kernel would report.
        self.conns: dict[tuple[ServiceKey, tuple[str, int]], tuple[int, int]] = {}
        self.timeouts = (900, 120, 300)
        self.calls: list[str] = []
        self.batches = 0

    def _one(self, change: Change) -> None:
        key, vs, dest = change.key, change.service, change.dest
        if change.op is Op.DELETE_SERVICE:
            self.delete_service(key)
        elif vs is not None:
            (self.add_service if change.op is Op.ADD_SERVICE else self.set_service)(vs)
        elif dest is None:
            raise IpvsError(f"{change}: no destination", errno.EINVAL)
        elif change.op is Op.ADD_DEST:
            self.add_destination(key, dest)
        elif change.op is Op.SET_DEST:
            self.set_destination(key, dest)
        else:
            self.delete_destination(key, dest.address, dest.port)

    def apply(self, changes: Sequence[Change]) -> list[Outcome]:
        self.batches += 1
        return _each(self._one, changes)

    def _check_key(self, key: ServiceKey) -> None:
        if key.protocol not in PROTOCOLS or not 0 < key.port < 65536:
            raise IpvsError(f"invalid service {key}", errno.EINVAL)
        if canonical_ip(key.address) != key.address:
            raise IpvsError(f"address not canonical: {key.address}", errno.EINVAL)

    def _service(self, key: ServiceKey) -> VirtualServer:
        vs = self.table.get(key)
        if vs is None:
            raise IpvsError(f"no such service {key}", errno.ESRCH)
        return vs

    def _check_vs(self, vs: VirtualServer) -> None:
        self._check_key(vs.key)
        if vs.scheduler not in self.schedulers:
            raise IpvsError(f"scheduler {vs.scheduler!r} not found", errno.ENOENT)
        if vs.flags & FLAG_HASHED:
            raise IpvsError("the hashed flag is the kernel's", errno.EINVAL)

    def services(self) -> list[VirtualServer]:
        return sorted(self.table.values(), key=lambda v: v.key)

    def destinations(self, key: ServiceKey) -> list[Destination]:
        out = []
        for ep, d in sorted(self.dests.get(key, {}).items()):
            active, inactive = self.conns.get((key, ep), (0, 0))
            out.append(Destination(d.address, d.port, d.weight, active, inactive))
        return out

    def add_service(self, vs: VirtualServer) -> None:
        self._check_vs(vs)
        if vs.key in self.table:
            raise IpvsError(f"service {vs.key} exists", errno.EEXIST)
        self.table[vs.key] = vs
        self.dests[vs.key] = {}
        self.calls.append(f"add-service {vs}")

    def set_service(self, vs: VirtualServer) -> None:
        self._check_vs(vs)
        self._service(vs.key)
        self.table[vs.key] = vs
        self.calls.append(f"set-service {vs}")

    def delete_service(self, key: ServiceKey) -> None:
        self._service(key)
        del self.table[key]
        del self.dests[key]
        self.calls.append(f"delete-service {key}")

    def _check_dest(self, key: ServiceKey, dest: Destination) -> dict[tuple[str, int], Destination]:
        self._service(key)
        if canonical_ip(dest.address) != dest.address:
            raise IpvsError(f"address not canonical: {dest.address}", errno.EINVAL)
        if (":" in dest.address) != key.v6:
            # Mixed families only with tunnelling, never with NAT.
            raise IpvsError(f"{dest} cannot serve {key}", errno.EINVAL)
        if dest.weight < 0:
            raise IpvsError(f"negative weight of {dest}", errno.ERANGE)
        if not 0 < dest.port < 65536:
            raise IpvsError(f"invalid destination {dest}", errno.EINVAL)
        return self.dests[key]

    def add_destination(self, key: ServiceKey, dest: Destination) -> None:
        dests = self._check_dest(key, dest)
        if dest.endpoint in dests:
            raise IpvsError(f"destination {dest} of {key} exists", errno.EEXIST)
        dests[dest.endpoint] = Destination(dest.address, dest.port, dest.weight)
        self.calls.append(f"add-dest {key} {dest} weight {dest.weight}")

    def set_destination(self, key: ServiceKey, dest: Destination) -> None:
        dests = self._check_dest(key, dest)
        if dest.endpoint not in dests:
            raise IpvsError(f"no destination {dest} in {key}", errno.ENOENT)
        dests[dest.endpoint] = Destination(dest.address, dest.port, dest.weight)
        self.calls.append(f"set-dest {key} {dest} weight {dest.weight}")

    def delete_destination(self, key: ServiceKey, address: str, port: int) -> None:
        self._service(key)
        if self.dests[key].pop((address, port), None) is None:
            raise IpvsError(f"no destination {address}:{port} in {key}", errno.ENOENT)
        self.conns.pop((key, (address, port)), None)
        self.calls.append(f"delete-dest {key} {address}:{port}")

    def set_timeouts(self, tcp: int, tcp_fin: int, udp: int) -> None:
        if min(tcp, tcp_fin, udp) < 0 or max(tcp, tcp_fin, udp) > _INT_MAX // _HZ:
            raise IpvsError("timeout out of range", errno.EINVAL)
        old = self.timeouts
        self.timeouts = (tcp or old[0], tcp_fin or old[1], udp or old[2])
        self.calls.append(f"timeouts {self.timeouts}")

    def close(self) -> None:
        pass


class FakeLinks:
    def __init__(self, node_addresses: set[str] | None = None) -> None:
        self.links: dict[str, set[str]] = {}
        self.node = set(node_addresses or ())
        self.calls: list[str] = []

    def ensure_dummy(self, name: str) -> bool:
        if name in self.links:
            return True
        self.links[name] = set()
        self.calls.append(f"add-link {name}")
        return False

    def exists(self, name: str) -> bool:
        return name in self.links

    def addresses(self, name: str) -> set[str]:
        return set(self.links.get(name, ()))

    def add_addresses(self, name: str, addresses: Sequence[str]) -> list[Outcome]:
        return _each(lambda a: self.add_address(name, a), addresses)

    def delete_addresses(self, name: str, addresses: Sequence[str]) -> list[Outcome]:
        return _each(lambda a: self.delete_address(name, a), addresses)

    def add_address(self, name: str, address: str) -> None:
        if name not in self.links:
            raise IpvsError(f"no link {name}", errno.ENODEV)
        if canonical_ip(address) != address:
            raise IpvsError(f"address not canonical: {address}", errno.EINVAL)
        if address in self.links[name]:
            raise IpvsError(f"{address} already on {name}", errno.EEXIST)
        self.links[name].add(address)
        self.calls.append(f"add-address {address}")

    def delete_address(self, name: str, address: str) -> None:
        if address not in self.links.get(name, ()):
            raise IpvsError(f"{address} not on {name}", errno.EADDRNOTAVAIL)
        self.links[name].discard(address)
        self.calls.append(f"delete-address {address}")

    def node_addresses(self, exclude: str) -> set[str]:
        out = set(self.node)
        for name, addrs in self.links.items():
            if name != exclude:
                out |= addrs
        return out

    def delete_link(self, name: str) -> bool:
        if self.links.pop(name, None) is None:
            return False
        self.calls.append(f"delete-link {name}")
        return True

    def close(self) -> None:
        pass
