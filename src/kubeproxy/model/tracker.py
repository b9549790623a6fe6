"""Change trackers: accumulate Service and EndpointSlice events between syncs.

The shape follows upstream's ``servicechangetracker.go`` / ``endpointschangetracker.go``:

* A tracker records, per object, the state before the first unsynced change and the state
  after the latest one. A change that returns an object to its synced state is dropped
  (so an add followed by a delete, or an update that changes nothing a proxy uses, costs
  no sync).
* ``ServicePortMap.apply`` / ``EndpointsMap.apply`` fold the pending changes into the
  synced view and return exactly which :class:`ServicePortName` values changed, which is
  what lets a backend sync only those.

Pure: no clock, no I/O. Trigger times for the network-programming metric are carried from
the EndpointSlice annotation, not read from a clock here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kubeproxy.model.types import (
    Endpoint,
    EndpointSlice,
    IPFamily,
    L4Protocol,
    NamespacedName,
    Service,
    ServicePort,
    ServicePortName,
)

PortMap = Mapping[ServicePortName, ServicePort]


def _ports_of(service: Service | None) -> dict[ServicePortName, ServicePort]:
    if service is None:
        return {}
    return {port.name: port for port in service.ports}


class ServiceChangeTracker:
    """Pending Service changes, keyed by namespace/name."""

    def __init__(self) -> None:
        self._items: dict[
            NamespacedName,
            tuple[dict[ServicePortName, ServicePort], dict[ServicePortName, ServicePort]],
        ] = {}

    def update(self, previous: Service | None, current: Service | None) -> bool:
        """Record one event (add: previous None; delete: current None).

        Returns True while there are changes waiting for a sync.
        """
        ref = current if current is not None else previous
        if ref is None:
            return bool(self._items)
        key = ref.key
        if key in self._items:
            before, _ = self._items[key]
        else:
            before = _ports_of(previous)
        after = _ports_of(current)
        if before == after:
            self._items.pop(key, None)
        else:
            self._items[key] = (before, after)
        return bool(self._items)

    def pending(self) -> int:
        return len(self._items)

    def checkout(
        self,
    ) -> dict[
        NamespacedName,
        tuple[dict[ServicePortName, ServicePort], dict[ServicePortName, ServicePort]],
    ]:
        items, self._items = self._items, {}
        return items


@dataclass
class ServiceUpdate:
    """What ``ServicePortMap.apply`` changed."""

    changed: set[ServicePortName] = field(default_factory=set)


class ServicePortMap(dict[ServicePortName, ServicePort]):
    """The synced view of every ServicePort."""

    def apply(self, tracker: ServiceChangeTracker) -> ServiceUpdate:
        result = ServiceUpdate()
        for before, after in tracker.checkout().values():
            for name in before.keys() - after.keys():
                del self[name]
                result.changed.add(name)
            for name, port in after.items():
                if self.get(name) != port:
                    self[name] = port
                    result.changed.add(name)
        return result


def endpoints_for_slices(
    slices: Iterable[EndpointSlice],
) -> dict[ServicePortName, tuple[Endpoint, ...]]:
    """Merge a Service's EndpointSlices into per-ServicePort endpoint lists.

    An endpoint's port comes from the slice port with the same name and protocol. Only an
    endpoint's first address is used, as upstream. When the same IP:port appears more
    than once (an endpoint moving between slices, or a Pod IP reused while the old Pod
    terminates), a later copy replaces an earlier one unless it is terminating: the
    non-terminating copy wins, as upstream's ``addEndpoints``. Slices are read in name
    order (upstream's order between two non-terminating copies is its map's: undefined).
    """
    merged: dict[ServicePortName, dict[tuple[str, int], Endpoint]] = {}
    for eps in sorted(slices, key=lambda s: s.name):
        service = eps.service
        for sp in eps.ports:
            name = ServicePortName(service, sp.name, sp.protocol)
            bucket = merged.setdefault(name, {})
            port = sp.port
            for se in eps.endpoints:
                cond = se.conditions
                # Positional: this runs once per endpoint of the cluster on a full resync.
                ep = Endpoint(
                    se.addresses[0],
                    port,
                    se.node_name,
                    se.zone,
                    cond.ready,
                    cond.serving,
                    cond.terminating,
                    se.zone_hints,
                    se.node_hints,
                )
                key = (ep.ip, port)
                if not cond.terminating or key not in bucket:
                    bucket[key] = ep
    # Sorted by address and port (cheap tuple keys): a stable order keeps each endpoint
    # at the same index across syncs, so a change moves as few map elements as possible.
    return {name: tuple(bucket[k] for k in sorted(bucket)) for name, bucket in merged.items()}


class EndpointsChangeTracker:
    """Pending EndpointSlice changes, grouped by the Service they belong to."""

    def __init__(self) -> None:
        # Slices as of the last checkout, per Service.
        self._applied: dict[NamespacedName, dict[str, EndpointSlice]] = {}
        # What those slices merge into (the "after" of the last checkout): the "before"
        # of the next change to the Service, kept rather than merged again, which cost
        # half of every sync's collect phase under churn (measured, bench.soak).
        self._merged: dict[NamespacedName, dict[ServicePortName, tuple[Endpoint, ...]]] = {}
        # Slices changed since: name -> slice, or None when deleted.
        self._pending: dict[NamespacedName, dict[str, EndpointSlice | None]] = {}
        # Per Service: (the slice's address family, its last-change-trigger-time).
        self._trigger_times: dict[NamespacedName, list[tuple[IPFamily, float]]] = {}

    def update(self, endpoint_slice: EndpointSlice, *, deleted: bool = False) -> bool:
        """Record an added/updated (or deleted) slice; True while changes are pending."""
        service = endpoint_slice.service
        applied = self._applied.get(service, {}).get(endpoint_slice.name)
        new = None if deleted else endpoint_slice
        pending = self._pending.setdefault(service, {})
        if applied == new:
            pending.pop(endpoint_slice.name, None)
            if not pending:
                del self._pending[service]
        else:
            pending[endpoint_slice.name] = new
            if new is not None and new.trigger_time is not None:
                stamp = (new.address_type, new.trigger_time)
                self._trigger_times.setdefault(service, []).append(stamp)
        return bool(self._pending)

    def pending(self) -> int:
        return len(self._pending)

    def checkout(
        self,
    ) -> tuple[
        dict[
            NamespacedName,
            tuple[
                dict[ServicePortName, tuple[Endpoint, ...]],
                dict[ServicePortName, tuple[Endpoint, ...]],
            ],
        ],
        dict[NamespacedName, list[tuple[IPFamily, float]]],
    ]:
        """Per changed Service: (endpoints before, endpoints after); and trigger times."""
        changes = {}
        for service, slices in self._pending.items():
            applied = self._applied.get(service, {})
            before = self._merged.get(service, {})
            now = dict(applied)
            for name, slc in slices.items():
                if slc is None:
                    now.pop(name, None)
                else:
                    now[name] = slc
            after = endpoints_for_slices(now.values())
            if now:
                self._applied[service] = now
                self._merged[service] = after
            else:
                self._applied.pop(service, None)
                self._merged.pop(service, None)
            if before != after:
                changes[service] = (before, after)
        self._pending = {}
        times, self._trigger_times = self._trigger_times, {}
        return changes, {svc: t for svc, t in times.items() if svc in changes}


@dataclass
class EndpointsUpdate:
    """What ``EndpointsMap.apply`` changed."""

    changed: set[ServicePortName] = field(default_factory=set)
    # UDP endpoints that were serving and no longer are (by address and port), whether
    # removed or just not serving: their conntrack entries must be flushed.
    deleted_udp_endpoints: set[tuple[ServicePortName, Endpoint]] = field(default_factory=set)
    # UDP ServicePorts that went from no serving endpoint to at least one.
    newly_active_udp: set[ServicePortName] = field(default_factory=set)
    # endpoints.kubernetes.io/last-change-trigger-time values of the changes, each with
    # its slice's address family.
    trigger_times: dict[NamespacedName, list[tuple[IPFamily, float]]] = field(default_factory=dict)


class EndpointsMap(dict[ServicePortName, tuple[Endpoint, ...]]):
    """The synced view of every ServicePort's endpoints (present even without a Service)."""

    def apply(self, tracker: EndpointsChangeTracker) -> EndpointsUpdate:
        changes, times = tracker.checkout()
        result = EndpointsUpdate(trigger_times=times)
        for before, after in changes.values():
            for name in before.keys() | after.keys():
                old = before.get(name, ())
                new = after.get(name, ())
                if old == new and self.get(name, ()) == new:
                    continue
                result.changed.add(name)
                if new:
                    self[name] = new
                else:
                    self.pop(name, None)
                if name.protocol is L4Protocol.UDP:
                    _note_udp_changes(result, name, old, new)
        return result


def _note_udp_changes(
    result: EndpointsUpdate,
    name: ServicePortName,
    old: tuple[Endpoint, ...],
    new: tuple[Endpoint, ...],
) -> None:
    # As upstream's conntrack reconciler: judged on the endpoint's serving condition, not
    # on presence or readiness: an endpoint that stays in the slice but stops serving
    # still has conntrack entries steering UDP flows to it, and one that still serves
    # (terminating, say) keeps its flows whatever the traffic policies now choose.
    new_keys = {(ep.ip, ep.port) for ep in new if ep.serving}
    for ep in old:
        if ep.serving and (ep.ip, ep.port) not in new_keys:
            result.deleted_udp_endpoints.add((name, ep))
    if not any(ep.serving for ep in old) and any(ep.serving for ep in new):
        result.newly_active_udp.add(name)
