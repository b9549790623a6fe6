"""What must change in the kernel: desired state against observed state (pure).

:class:`Observed` is the kernel as last read or written: virtual servers with their
destinations, the addresses on ``kube-ipvs0`` and the members of the family's sets.
:func:`diff` returns a :class:`Changes` holding only the differences — everywhere (a
full sync), or only among the virtual servers, addresses and set members a partial sync
touched (:class:`~.render.Touched`), so that its cost follows the change:

* virtual servers to add, to change in place (scheduler, flags, timeout) and to delete —
  of this family, and never one whose address is in ``--ipvs-exclude-cidrs`` (upstream:
  those belong to someone else);
* destinations to add, to re-weight (a terminating one that is wanted again comes back
  to weight 1) and to remove — removal goes through graceful termination, which decides
  between deleting now and weight 0 (:mod:`.graceful`);
* addresses to bind and unbind, set members to add and delete, sets to create.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

from kubeproxy.backends.ipvs.render import DesiredState, Touched
from kubeproxy.dataplane.ipset import SetSpec
from kubeproxy.dataplane.ipvs import Destination, ServiceKey, VirtualServer

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass
class Observed:
    services: dict[ServiceKey, VirtualServer] = field(default_factory=dict)
    dests: dict[ServiceKey, dict[tuple[str, int], Destination]] = field(default_factory=dict)
    bound: set[str] = field(default_factory=set)
    # set name -> members; a set missing here does not exist
    members: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class Changes:
    add_services: list[VirtualServer] = field(default_factory=list)
    set_services: list[VirtualServer] = field(default_factory=list)
    delete_services: list[ServiceKey] = field(default_factory=list)
    add_dests: list[tuple[ServiceKey, Destination]] = field(default_factory=list)
    set_dests: list[tuple[ServiceKey, Destination]] = field(default_factory=list)
    remove_dests: list[tuple[ServiceKey, Destination]] = field(default_factory=list)
    bind: list[str] = field(default_factory=list)
    unbind: list[str] = field(default_factory=list)
    create_sets: list[SetSpec] = field(default_factory=list)
    set_adds: dict[str, list[str]] = field(default_factory=dict)
    set_dels: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ipvs_operations(self) -> int:
        return (
            len(self.add_services)
            + len(self.set_services)
            + len(self.delete_services)
            + len(self.add_dests)
            + len(self.set_dests)
            + len(self.remove_dests)
        )

    @property
    def set_operations(self) -> int:
        return sum(map(len, self.set_adds.values())) + sum(map(len, self.set_dels.values()))

    def __bool__(self) -> bool:
        return bool(
            self.ipvs_operations
            or self.bind
            or self.unbind
            or self.create_sets
            or self.set_operations
        )


def excluded(address: str, exclude: Iterable[Network]) -> bool:
    ip = ipaddress.ip_address(address)
    return any(ip in net for net in exclude if net.version == ip.version)


def diff(
    desired: DesiredState,
    observed: Observed,
    *,
    v6: bool,
    specs: Iterable[SetSpec],
    exclude: Iterable[Network] = (),
    scope: Touched | None = None,
) -> Changes:
    """Everything that differs, or (``scope``) only among what a partial sync touched:
    its virtual servers, addresses and set members."""
    out = Changes()
    nets = list(exclude)
    keys = sorted(desired.services) if scope is None else sorted(scope.keys)
    for key in keys:
        vs = desired.services.get(key)
        if vs is None:
            continue
        old = observed.services.get(key)
        if old is None:
            out.add_services.append(vs)
        elif old != vs:
            out.set_services.append(vs)
        have = observed.dests.get(key, {}) if old is not None else {}
        want = desired.dests.get(key, {})
        for (ip, port), weight in sorted(want.items()):
            dest = have.get((ip, port))
            if dest is None:
                out.add_dests.append((key, Destination(ip, port, weight)))
            elif dest.weight != weight:
                out.set_dests.append((key, Destination(ip, port, weight)))
        for endpoint, dest in sorted(have.items()):
            if endpoint not in want:
                out.remove_dests.append((key, dest))
    stale = sorted(observed.services) if scope is None else keys
    for key in stale:
        if key in desired.services or key not in observed.services:
            continue
        if key.v6 != v6 or excluded(key.address, nets):
            continue
        out.delete_services.append(key)
    if scope is None:
        out.bind = sorted(desired.bind - observed.bound)
        out.unbind = sorted(observed.bound - desired.bind)
    else:
        bind, bound = desired.bind, observed.bound
        out.bind = sorted(a for a in scope.addresses if a in bind and a not in bound)
        out.unbind = sorted(a for a in scope.addresses if a in bound and a not in bind)
    for spec in specs:
        have_members = observed.members.get(spec.name)
        if have_members is None:
            out.create_sets.append(spec)
            have_members = set()
        want_members = desired.members.get(spec.name, set())
        if scope is None:
            adds = sorted(want_members - have_members)
            dels = sorted(have_members - want_members)
        else:
            touched = scope.members.get(spec.name, set())
            adds = sorted(m for m in touched if m in want_members and m not in have_members)
            dels = sorted(m for m in touched if m in have_members and m not in want_members)
        if adds:
            out.set_adds[spec.name] = adds
        if dels:
            out.set_dels[spec.name] = dels
    return out
