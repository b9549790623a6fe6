"""Topology Aware Routing (``service.kubernetes.io/topology-mode: Auto``): the "Auto" hints.

After upstream's ``staging/src/k8s.io/endpointslice/topologycache`` (``topologycache.go``,
``utils.go``, ``sliceinfo.go``, ``event.go``). Map of this module:

* :meth:`TopologyCache.set_nodes` — each zone's share of allocatable CPU. Only Ready Nodes
  without a ``node-role.kubernetes.io/control-plane`` or ``.../master`` label count. One
  counted Node without a ``topology.kubernetes.io/zone`` label or with zero allocatable
  CPU makes the information insufficient (no hints anywhere), and so do fewer than two
  zones.
* :meth:`TopologyCache.add_hints` — hints for one Service and address type:

  1. *Allocations*: for ``N`` ready endpoints and a zone with CPU ratio ``r``, desired
     ``r*N`` endpoints, minimum ``ceil(r*N / (1 + 0.2))`` (the **overload threshold**: no
     zone's endpoints should take more than 20 % over their fair share), maximum
     ``minimum + N - sum(minimums)``. No hints, with a ``TopologyAwareHintsDisabled``
     event, when the node information is insufficient, when there are fewer endpoints
     than zones ("Insufficient number of endpoints"), or when the minimums add up to more
     than ``N`` ("Unable to allocate minimum required endpoints...").
  2. Unchanged slices whose hints are still valid (every ready endpoint hinted, only for
     zones that still get endpoints, and within each zone's maximum) keep them and count
     towards the zones; the others are rewritten.
  3. Every ready endpoint of the slices being written is hinted for its own zone; an
     endpoint without a zone disables hints for the Service ("One or more endpoints do
     not have a zone specified").
  4. *Redistribution*: zones with more hints than desired give endpoints (re-hinted for
     the receiving zone) to zones with fewer, one at a time, largest surplus to largest
     deficit, while both have at least half an endpoint to give/take and one of them a
     whole one.
  5. The first time a Service gets hints, a ``TopologyAwareHintsEnabled`` event.

* :func:`remove_hints_from_slices` — upstream ``RemoveHintsFromSlices``: hints off every
  slice being written, and unchanged slices that carry hints are rewritten without them.
* :meth:`TopologyCache.get_overloaded_services` — Services whose current hints now leave a
  zone below its minimum (the controller resyncs them when Nodes change).

Events are dicts ``{"type", "reason", "message"}`` with upstream's reasons and messages
(the message ends with ``, addressType: IPv4``). Upstream iterates Go maps where the order
matters (which receiving zone gets an endpoint first, ties between zones); here zones go
in name order, so results are deterministic. Ties can change how many endpoints each
zone ends with (seen against the real controller, which picks differently from run to
run): :func:`giving_and_receiving_zones` takes a ``tie_break``, so a caller can list
every result upstream may give. One deliberate difference: upstream means to
clear the hints of not-ready endpoints in the slices it writes but clears a loop copy
(a no-op), so stale hints can survive there; here they are cleared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from kubeproxy.controlplane._slices import Obj, copy_slice, endpoint_ready, with_hints, zone_hint

OVERLOAD_THRESHOLD = 0.2
LABEL_ZONE = "topology.kubernetes.io/zone"
_EXCLUDED_NODE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")

# Event messages, word for word upstream's (event.go).
NO_ZONE_SPECIFIED = "One or more endpoints do not have a zone specified"
NO_ALLOCATED_HINTS_FOR_ZONES = "No hints allocated for zones"
TOPOLOGY_AWARE_HINTS_ENABLED = "Topology Aware Hints has been enabled"
TOPOLOGY_AWARE_HINTS_DISABLED = "Topology Aware Hints has been disabled"
INSUFFICIENT_NODE_INFO = (
    "Insufficient Node information: allocatable CPU or zone not specified on one or more nodes"
)
NODES_READY_IN_ONE_ZONE_ONLY = "Nodes only ready in one zone"
INSUFFICIENT_NUMBER_OF_ENDPOINTS = "Insufficient number of endpoints"
MIN_ALLOCATION_EXCEEDS_OVERLOAD_THRESHOLD = (
    "Unable to allocate minimum required endpoints to each zone without exceeding "
    "overload threshold"
)
REASON_DISABLED = "TopologyAwareHintsDisabled"
REASON_ENABLED = "TopologyAwareHintsEnabled"


def event(event_type: str, reason: str, message: str) -> dict[str, str]:
    return {"type": event_type, "reason": reason, "message": message}


def format_with_address_type(message: str, address_type: str) -> str:
    return f"{message}, addressType: {address_type}"


# --------------------------------------------------------------------------- quantities

_DECIMAL_SUFFIXES = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
}  # fmt: skip
_BINARY_SUFFIXES = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes resource quantity (``"4"``, ``"3500m"``, ``"1.5"``, ``"2Ki"``, ``"1e3"``)."""
    text = str(value).strip()
    try:
        for suffix, power in _BINARY_SUFFIXES.items():
            if text.endswith(suffix):
                return Decimal(text[: -len(suffix)]) * Decimal(1024**power)
        if text and text[-1] in _DECIMAL_SUFFIXES and not text[-1].isdigit():
            return Decimal(text[:-1]) * _DECIMAL_SUFFIXES[text[-1]]
        return Decimal(text)  # plain number, or with an e/E exponent
    except InvalidOperation:
        raise ValueError(f"invalid quantity {value!r}") from None


def _milli_value(quantity: Decimal) -> int:
    # resource.Quantity.MilliValue rounds up.
    return math.ceil(quantity * 1000)


def _node_ready(node: Mapping[str, Any]) -> bool:
    for condition in (node.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


# -------------------------------------------------------------------------- allocations


@dataclass
class Allocation:
    """How many endpoints a zone should get for one Service."""

    minimum: int
    maximum: int
    desired: float


def _ready_count(slices: Iterable[Mapping[str, Any]]) -> int:
    return sum(1 for s in slices for ep in s.get("endpoints") or () if endpoint_ready(ep))


def remove_hints_from_slices(
    to_create: Sequence[Mapping[str, Any]],
    to_update: Sequence[Mapping[str, Any]],
    unchanged: Sequence[Mapping[str, Any]],
) -> tuple[list[Obj], list[Obj], list[Obj]]:
    """No hints anywhere: strip the slices being written; rewrite unchanged ones that have any.

    Returns new ``(to_create, to_update, unchanged)`` lists; nothing passed in is mutated.
    """
    created = [_strip_hints(s) for s in to_create]
    updated = [_strip_hints(s) for s in to_update]
    still: list[Obj] = []
    for endpoint_slice in unchanged:
        if any("hints" in ep for ep in endpoint_slice.get("endpoints") or ()):
            updated.append(_strip_hints(endpoint_slice))
        else:
            still.append(endpoint_slice)  # type: ignore[arg-type]
    return created, updated, still


def _strip_hints(endpoint_slice: Mapping[str, Any]) -> Obj:
    copied = copy_slice(endpoint_slice)
    copied["endpoints"] = [
        with_hints(ep, None) if "hints" in ep else ep for ep in copied["endpoints"]
    ]
    return copied


def _hints_by_zone(
    endpoint_slice: Mapping[str, Any],
    allocated: Mapping[str, int],
    allocations: Mapping[str, Allocation],
) -> dict[str, int] | None:
    """Upstream ``getHintsByZone``: the slice's hints per zone, or None if they must be redone."""
    counts: dict[str, int] = {}
    for endpoint in endpoint_slice.get("endpoints") or ():
        if not endpoint_ready(endpoint):
            continue
        zones = (endpoint.get("hints") or {}).get("forZones") or ()
        if not zones:
            return None
        for zone_entry in zones:
            zone = zone_entry.get("name", "")
            if zone not in allocations:
                return None
            counts[zone] = counts.get(zone, 0) + 1
    for zone, count in counts.items():
        if count + allocated.get(zone, 0) > allocations[zone].maximum:
            return None
    return counts


#: Which of several zones with the same largest amount to take (they come in name order).
TieBreak = Callable[[Sequence[str]], str]


def first_by_name(zones: Sequence[str]) -> str:
    return zones[0]


def _most(amounts: Mapping[str, float], tie_break: TieBreak) -> tuple[str, float]:
    """The zone with the largest amount; ("", 0) when none is > 0."""
    best_amount = max((a for a in amounts.values() if a > 0), default=0.0)
    if best_amount <= 0:
        return "", 0.0
    tied = sorted(zone for zone, amount in amounts.items() if amount == best_amount)
    return (tied[0] if len(tied) == 1 else tie_break(tied)), best_amount


def giving_and_receiving_zones(
    allocations: Mapping[str, Allocation],
    allocated: Mapping[str, int],
    tie_break: TieBreak = first_by_name,
) -> tuple[dict[str, int], dict[str, int]]:
    """Upstream ``getGivingAndReceivingZones``: whole endpoints each zone gives or takes.

    Upstream takes whichever of two zones with equal amounts its map iteration meets
    first, and that can change how many endpoints each zone ends with; ``tie_break``
    decides here (first by name unless told otherwise, so results are reproducible).
    """
    giving_wanted: dict[str, float] = {}
    receiving_wanted: dict[str, float] = {}
    for zone, allocation in allocations.items():
        have = float(allocated.get(zone, 0))
        if have > allocation.desired:
            giving_wanted[zone] = have - allocation.desired
        elif have < allocation.desired:
            receiving_wanted[zone] = allocation.desired - have
    giving: dict[str, int] = {}
    receiving: dict[str, int] = {}
    while True:
        giver, to_give = _most(giving_wanted, tie_break)
        receiver, to_receive = _most(receiving_wanted, tie_break)
        if (
            not giver
            or not receiver
            or (to_give < 1.0 and to_receive < 1.0)
            or to_give < 0.5
            or to_receive < 0.5
        ):
            break
        giving[giver] = giving.get(giver, 0) + 1
        giving_wanted[giver] -= 1
        receiving[receiver] = receiving.get(receiver, 0) + 1
        receiving_wanted[receiver] -= 1
    return giving, receiving


def _redistribute(
    slices: list[Obj], giving: dict[str, int], receiving: dict[str, int]
) -> dict[str, int]:
    """Upstream ``redistributeHints``: re-hint endpoints of giving zones for receiving ones."""
    changes: dict[str, int] = {}
    for endpoint_slice in slices:
        endpoints = endpoint_slice["endpoints"]
        for i, endpoint in enumerate(endpoints):
            if not endpoint_ready(endpoint):
                continue
            if not giving or not receiving:
                return changes
            zone = endpoint.get("zone") or ""
            if giving.get(zone, 0) <= 0:
                continue
            receiver = min(receiving)  # name order; upstream takes whichever the map yields
            endpoints[i] = with_hints(endpoint, zone_hint(receiver))
            for counts, name in ((giving, zone), (receiving, receiver)):
                counts[name] -= 1
                if counts[name] == 0:
                    del counts[name]
            changes[receiver] = changes.get(receiver, 0) + 1
            changes[zone] = changes.get(zone, 0) - 1
    return changes


def service_overloaded(endpoints_by_zone: Mapping[str, int], ratios: Mapping[str, float]) -> bool:
    """Upstream ``serviceOverloaded``: some zone has fewer endpoints than its minimum."""
    if not endpoints_by_zone:
        return False
    if not ratios:
        return True
    total = float(sum(endpoints_by_zone.values()))
    for zone, ratio in ratios.items():
        if zone not in endpoints_by_zone:
            return True
        if endpoints_by_zone[zone] < math.ceil(total * ratio * (1 / (1 + OVERLOAD_THRESHOLD))):
            return True
    return False


# ------------------------------------------------------------------------ TopologyCache


class TopologyCache:
    """Zone CPU ratios plus, per Service, the hints last published (upstream's name).

    One instance lives as long as the controller: it remembers which Services have hints
    (for the Enabled/Disabled events) and how many endpoints each zone got.
    """

    def __init__(self) -> None:
        self.sufficient_node_info = False
        self.cpu_by_zone: dict[str, Decimal] = {}
        self.cpu_ratios_by_zone: dict[str, float] | None = None
        self._endpoints_by_service: dict[str, dict[str, dict[str, int]]] = {}
        self._hints_populated: set[str] = set()

    # Nodes -------------------------------------------------------------------------

    def set_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """Recompute each zone's share of allocatable CPU from the Node objects."""
        cpu_by_zone: dict[str, Decimal] = {}
        sufficient = True
        total = Decimal(0)
        for node in nodes:
            labels = (node.get("metadata") or {}).get("labels") or {}
            if any(label in labels for label in _EXCLUDED_NODE_LABELS) or not _node_ready(node):
                continue
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            cpu = parse_quantity(allocatable.get("cpu", "0"))
            zone = labels.get(LABEL_ZONE, "")
            if not zone or cpu == 0:
                # One Node we cannot place makes every ratio unreliable: no hints at all.
                cpu_by_zone = {}
                sufficient = False
                break
            total += cpu
            cpu_by_zone[zone] = cpu_by_zone.get(zone, Decimal(0)) + cpu
        if total == 0 or not sufficient or len(cpu_by_zone) < 2:
            self.sufficient_node_info = False
            self.cpu_by_zone = {}
            self.cpu_ratios_by_zone = None
            return
        self.sufficient_node_info = True
        self.cpu_by_zone = cpu_by_zone
        total_milli = _milli_value(total)
        self.cpu_ratios_by_zone = {
            zone: _milli_value(cpu) / total_milli for zone, cpu in cpu_by_zone.items()
        }

    def get_allocations(
        self, num_endpoints: int
    ) -> tuple[dict[str, Allocation] | None, dict[str, str] | None]:
        """Per-zone allocations for ``num_endpoints`` ready endpoints, or the reason there are none.

        The event's message does not carry the address type yet; :meth:`add_hints` adds it.
        """
        ratios = self.cpu_ratios_by_zone
        if ratios is None:
            return None, event("Warning", REASON_DISABLED, INSUFFICIENT_NODE_INFO)
        if len(ratios) < 2:
            return None, event("Warning", REASON_DISABLED, NODES_READY_IN_ONE_ZONE_ONLY)
        counts = f"({num_endpoints} endpoints, {len(ratios)} zones)"
        if len(ratios) > num_endpoints:
            return None, event(
                "Warning", REASON_DISABLED, f"{INSUFFICIENT_NUMBER_OF_ENDPOINTS} {counts}"
            )
        allocations: dict[str, Allocation] = {}
        min_total = 0
        for zone in sorted(ratios):
            desired = ratios[zone] * num_endpoints
            minimum = math.ceil(desired * (1 / (1 + OVERLOAD_THRESHOLD)))
            allocations[zone] = Allocation(minimum, 0, max(desired, float(minimum)))
            min_total += minimum
            if min_total > num_endpoints:
                return None, event(
                    "Warning",
                    REASON_DISABLED,
                    f"{MIN_ALLOCATION_EXCEEDS_OVERLOAD_THRESHOLD} {counts}",
                )
        for allocation in allocations.values():
            allocation.maximum = allocation.minimum + num_endpoints - min_total
        return allocations, None

    # Hints ---------------------------------------------------------------------------

    def add_hints(
        self,
        service_key: str,
        address_type: str,
        slices_to_create: Sequence[Mapping[str, Any]],
        slices_to_update: Sequence[Mapping[str, Any]],
        slices_unchanged: Sequence[Mapping[str, Any]],
    ) -> tuple[list[Obj], list[Obj], list[dict[str, str]]]:
        """Zone hints for one Service's slices of one address type (upstream ``AddHints``).

        Returns the slices to create and to update (new dicts; unchanged slices whose hints
        must change are among the updates) and the events to record.
        """
        total = _ready_count([*slices_to_create, *slices_to_update, *slices_unchanged])
        allocations, problem = self.get_allocations(total)
        if allocations is None:
            assert problem is not None
            slices = (slices_to_create, slices_to_update, slices_unchanged)
            return self._disable(service_key, address_type, problem["message"], slices)

        # Valid hints of unchanged slices stand; the other unchanged slices are redone.
        allocated: dict[str, int] = {}
        to_update = [copy_slice(s) for s in slices_to_update]
        unchanged: list[Mapping[str, Any]] = []
        for endpoint_slice in slices_unchanged:
            counts = _hints_by_zone(endpoint_slice, allocated, allocations)
            if counts is None:
                to_update.append(copy_slice(endpoint_slice))
            else:
                unchanged.append(endpoint_slice)
                for zone, count in counts.items():
                    allocated[zone] = allocated.get(zone, 0) + count
        to_create = [copy_slice(s) for s in slices_to_create]
        writable = [*to_create, *to_update]

        # Step 1: every ready endpoint starts hinted for its own zone.
        for endpoint_slice in writable:
            endpoints = endpoint_slice["endpoints"]
            for i, endpoint in enumerate(endpoints):
                if not endpoint_ready(endpoint):
                    if "hints" in endpoint:
                        endpoints[i] = with_hints(endpoint, None)
                    continue
                zone = endpoint.get("zone") or ""
                if not zone:
                    slices = (to_create, to_update, unchanged)
                    return self._disable(service_key, address_type, NO_ZONE_SPECIFIED, slices)
                allocated[zone] = allocated.get(zone, 0) + 1
                endpoints[i] = with_hints(endpoint, zone_hint(zone))

        # Steps 2 and 3: move endpoints from zones over their share to zones under it.
        giving, receiving = giving_and_receiving_zones(allocations, allocated)
        for zone, change in _redistribute(writable, giving, receiving).items():
            allocated[zone] = allocated.get(zone, 0) + change

        if not allocated:
            slices = (to_create, to_update, unchanged)
            return self._disable(service_key, address_type, NO_ALLOCATED_HINTS_FOR_ZONES, slices)
        events: list[dict[str, str]] = []
        if service_key not in self._hints_populated:
            message = format_with_address_type(TOPOLOGY_AWARE_HINTS_ENABLED, address_type)
            events.append(event("Normal", REASON_ENABLED, message))
        self.set_hints(service_key, address_type, allocated)
        return to_create, to_update, events

    def _disable(
        self,
        service_key: str,
        address_type: str,
        message: str,
        slices: tuple[
            Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]
        ],
    ) -> tuple[list[Obj], list[Obj], list[dict[str, str]]]:
        """No hints for this Service: forget it, strip every slice, one Disabled event."""
        self.remove_hints(service_key, address_type)
        created, updated, _ = remove_hints_from_slices(*slices)
        disabled = event(
            "Warning", REASON_DISABLED, format_with_address_type(message, address_type)
        )
        return created, updated, [disabled]

    def set_hints(self, service_key: str, address_type: str, by_zone: Mapping[str, int]) -> None:
        self._endpoints_by_service.setdefault(service_key, {})[address_type] = dict(by_zone)
        self._hints_populated.add(service_key)

    def remove_hints(self, service_key: str, address_type: str) -> None:
        by_type = self._endpoints_by_service.get(service_key)
        if by_type is not None:
            by_type.pop(address_type, None)
            if not by_type:
                del self._endpoints_by_service[service_key]
        self._hints_populated.discard(service_key)

    def has_populated_hints(self, service_key: str) -> bool:
        return service_key in self._hints_populated

    def hints_by_zone(self, service_key: str, address_type: str) -> dict[str, int]:
        """The endpoints per zone last published for a Service (empty: no hints)."""
        return dict(self._endpoints_by_service.get(service_key, {}).get(address_type, {}))

    def get_overloaded_services(self) -> list[str]:
        """Services whose published hints leave some zone below its minimum, sorted."""
        ratios = self.cpu_ratios_by_zone or {}
        return sorted(
            key
            for key, by_type in self._endpoints_by_service.items()
            if any(service_overloaded(counts, ratios) for counts in by_type.values())
        )
