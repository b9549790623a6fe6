"""Topology-mode Auto hints (kubeproxy.controlplane.topologycache): the docs' safeguards,
the allocation arithmetic, redistribution, the events, and the all-or-none property."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeproxy.controlplane.topologycache import (
    Allocation,
    TopologyCache,
    giving_and_receiving_zones,
    parse_quantity,
    remove_hints_from_slices,
)
from tests.unit.controlplane_objects import endpoint, endpoint_slice, hints_of, node

Obj = dict[str, Any]


def _cache(*nodes: Obj) -> TopologyCache:
    cache = TopologyCache()
    cache.set_nodes(nodes)
    return cache


THREE_ZONES = (node("a1", "zone-a"), node("b1", "zone-b"), node("c1", "zone-c"))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4", 4),
        ("3500m", Decimal("3.5")),
        ("1.5", Decimal("1.5")),
        ("2k", 2000),
        ("1Ki", 1024),
        ("1e3", 1000),
        ("250u", Decimal("0.00025")),
        ("0", 0),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


def test_parse_quantity_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="invalid quantity 'four'"):
        parse_quantity("four")


# ------------------------------------------------------------------------------ Nodes


def test_zone_ratios_come_from_allocatable_cpu() -> None:
    cache = _cache(
        node("a1", "zone-a", cpu="2"),
        node("a2", "zone-a", cpu="2000m"),
        node("b1", "zone-b", cpu="2"),
    )
    assert cache.cpu_ratios_by_zone == pytest.approx({"zone-a": 2 / 3, "zone-b": 1 / 3})


@pytest.mark.parametrize(
    ("extra", "counted"),
    [
        (node("cp", "zone-c", labels={"node-role.kubernetes.io/control-plane": ""}), False),
        (node("m", "zone-c", labels={"node-role.kubernetes.io/master": "true"}), False),
        (node("down", "zone-c", ready=False), False),
        (node("worker", "zone-c"), True),
    ],
)
def test_control_plane_and_unready_nodes_do_not_count(extra: Obj, counted: bool) -> None:
    cache = _cache(node("a1", "zone-a"), node("b1", "zone-b"), extra)
    assert ("zone-c" in (cache.cpu_ratios_by_zone or {})) is counted


@pytest.mark.parametrize(
    "bad",
    [
        node("x", None),
        node("x", ""),
        node("x", "zone-c", cpu="0"),
        {
            "metadata": {"name": "x", "labels": {"topology.kubernetes.io/zone": "zone-c"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
    ],
    ids=["no-zone", "empty-zone", "zero-cpu", "no-allocatable"],
)
def test_one_node_without_zone_or_cpu_means_insufficient_info(bad: Obj) -> None:
    cache = _cache(*THREE_ZONES, bad)
    assert cache.cpu_ratios_by_zone is None and not cache.sufficient_node_info
    to_create, _, events = cache.add_hints(
        "default/web",
        "IPv4",
        [endpoint_slice("", [endpoint(f"10.0.0.{i}", "zone-a") for i in range(9)])],
        [],
        [],
    )
    assert events == [
        {
            "type": "Warning",
            "reason": "TopologyAwareHintsDisabled",
            "message": "Insufficient Node information: allocatable CPU or zone not "
            "specified on one or more nodes, addressType: IPv4",
        }
    ]
    assert all(h is None for h in hints_of(to_create).values())


def test_nodes_in_one_zone_only_are_insufficient_too() -> None:
    cache = _cache(node("a1", "zone-a"), node("a2", "zone-a"))
    assert cache.cpu_ratios_by_zone is None


# ------------------------------------------------------------------------ allocations


@pytest.mark.parametrize(
    ("nodes", "endpoints", "expected"),
    [
        (THREE_ZONES, 9, {"zone-a": (3, 3), "zone-b": (3, 3), "zone-c": (3, 3)}),
        (THREE_ZONES, 10, {"zone-a": (3, 4), "zone-b": (3, 4), "zone-c": (3, 4)}),
        # desired 2/3*12 = 8 -> minimum ceil(8/1.2) = 7; 4 -> 4; maximum = min + 12 - 11
        (
            (node("a1", "zone-a", cpu="2"), node("b1", "zone-b", cpu="1")),
            12,
            {"zone-a": (7, 8), "zone-b": (4, 5)},
        ),
    ],
)
def test_allocations(
    nodes: tuple[Obj, ...], endpoints: int, expected: dict[str, tuple[int, int]]
) -> None:
    allocations, problem = _cache(*nodes).get_allocations(endpoints)
    assert problem is None and allocations is not None
    assert {z: (a.minimum, a.maximum) for z, a in allocations.items()} == expected


@pytest.mark.parametrize(
    ("nodes", "endpoints", "message"),
    [
        # Safeguard 1: fewer endpoints than zones.
        (THREE_ZONES, 2, "Insufficient number of endpoints (2 endpoints, 3 zones)"),
        # Safeguard 2, the docs' example: zone-a twice zone-b with 2 endpoints.
        (
            (node("a1", "zone-a", cpu="2"), node("b1", "zone-b", cpu="1")),
            2,
            "Unable to allocate minimum required endpoints to each zone without exceeding "
            "overload threshold (2 endpoints, 2 zones)",
        ),
        (THREE_ZONES, 0, "Insufficient number of endpoints (0 endpoints, 3 zones)"),
    ],
)
def test_allocation_safeguards(nodes: tuple[Obj, ...], endpoints: int, message: str) -> None:
    cache = _cache(*nodes)
    allocations, problem = cache.get_allocations(endpoints)
    assert allocations is None and problem is not None
    assert problem["message"] == message
    eps = [endpoint(f"10.0.0.{i}", "zone-a", hint_zones=("zone-a",)) for i in range(endpoints)]
    unchanged = [endpoint_slice("s1", eps)]
    _, to_update, events = cache.add_hints("default/web", "IPv4", [], [], unchanged)
    assert events[0]["message"] == f"{message}, addressType: IPv4"
    assert all(h is None for h in hints_of(to_update).values())
    assert len(to_update) == (1 if endpoints else 0)  # the hinted unchanged slice is rewritten
    assert unchanged[0]["endpoints"] == eps  # ...as a copy


# ---------------------------------------------------------------------------- hints


def _nine(per_zone: dict[str, int]) -> list[Obj]:
    eps = []
    for zone, count in per_zone.items():
        eps += [endpoint(f"10.{ord(zone[-1])}.0.{i}", zone) for i in range(count)]
    return [endpoint_slice("", eps)]


def test_same_zone_hints_when_balanced_and_enabled_event_once() -> None:
    cache = _cache(*THREE_ZONES)
    to_create, _, events = cache.add_hints(
        "default/web", "IPv4", _nine({"zone-a": 3, "zone-b": 3, "zone-c": 3}), [], []
    )
    for ep in to_create[0]["endpoints"]:
        assert ep["hints"] == {"forZones": [{"name": ep["zone"]}]}
    assert events == [
        {
            "type": "Normal",
            "reason": "TopologyAwareHintsEnabled",
            "message": "Topology Aware Hints has been enabled, addressType: IPv4",
        }
    ]
    assert cache.has_populated_hints("default/web")
    assert cache.hints_by_zone("default/web", "IPv4") == {"zone-a": 3, "zone-b": 3, "zone-c": 3}
    _, _, again = cache.add_hints(
        "default/web", "IPv4", _nine({"zone-a": 3, "zone-b": 3, "zone-c": 3}), [], []
    )
    assert again == []


def test_endpoints_move_from_over_to_under_served_zones() -> None:
    cache = _cache(*THREE_ZONES)
    to_create, _, _ = cache.add_hints(
        "default/web", "IPv4", _nine({"zone-a": 5, "zone-b": 3, "zone-c": 1}), [], []
    )
    hinted: dict[str, int] = {}
    for ep in to_create[0]["endpoints"]:
        (zone,) = ep["hints"]["forZones"]
        hinted[zone["name"]] = hinted.get(zone["name"], 0) + 1
    assert hinted == {"zone-a": 3, "zone-b": 3, "zone-c": 3}
    moved = [
        ep for ep in to_create[0]["endpoints"] if ep["hints"]["forZones"][0]["name"] != ep["zone"]
    ]
    assert {ep["zone"] for ep in moved} == {"zone-a"} and len(moved) == 2


def test_zones_that_tie_are_taken_in_name_order_unless_told_otherwise() -> None:
    """Zones a and b each have half an endpoint too many and c one too few: one of them
    gives one. Upstream takes whichever its map iteration meets first, so either can
    happen there (seen against the real controller)."""
    allocations = {z: Allocation(1, 3, 1.0 if z == "c" else 1.5) for z in ("a", "b", "c")}
    allocated = {"a": 2, "b": 2, "c": 0}
    assert giving_and_receiving_zones(allocations, allocated) == ({"a": 1}, {"c": 1})
    seen: list[list[str]] = []

    def last(zones: Sequence[str]) -> str:
        seen.append(list(zones))
        return zones[-1]

    assert giving_and_receiving_zones(allocations, allocated, last) == ({"b": 1}, {"c": 1})
    assert seen == [["a", "b"]]  # asked only when there is a tie


def test_endpoint_without_zone_disables_hints() -> None:
    cache = _cache(*THREE_ZONES)
    slices = _nine({"zone-a": 3, "zone-b": 3, "zone-c": 2})
    slices[0]["endpoints"].append(endpoint("10.9.9.9", None))
    to_create, _, events = cache.add_hints("default/web", "IPv4", slices, [], [])
    assert events == [
        {
            "type": "Warning",
            "reason": "TopologyAwareHintsDisabled",
            "message": "One or more endpoints do not have a zone specified, addressType: IPv4",
        }
    ]
    assert all(h is None for h in hints_of(to_create).values())
    assert not cache.has_populated_hints("default/web")


def test_unready_endpoints_are_neither_counted_nor_hinted() -> None:
    cache = _cache(*THREE_ZONES)
    slices = _nine({"zone-a": 1, "zone-b": 1, "zone-c": 1})
    slices[0]["endpoints"].append(
        endpoint("10.8.8.8", "zone-a", ready=False, hint_zones=("zone-a",))
    )
    to_create, _, _ = cache.add_hints("default/web", "IPv4", slices, [], [])
    hints = hints_of(to_create)
    assert hints.pop("10.8.8.8") is None
    assert all(h is not None for h in hints.values())


def test_valid_unchanged_slices_stay_unchanged() -> None:
    cache = _cache(*THREE_ZONES)
    good = endpoint_slice(
        "good", [endpoint(f"10.0.{z}.1", f"zone-{z}", hint_zones=(f"zone-{z}",)) for z in "abc"]
    )
    unhinted = endpoint_slice("unhinted", [endpoint(f"10.1.{z}.1", f"zone-{z}") for z in "abc"])
    gone = endpoint_slice(
        "gone", [endpoint(f"10.2.{z}.1", f"zone-{z}", hint_zones=("zone-x",)) for z in "abc"]
    )
    before = copy.deepcopy([good, unhinted, gone])
    _, to_update, _ = cache.add_hints("default/web", "IPv4", [], [], [good, unhinted, gone])
    assert [s["metadata"]["name"] for s in to_update] == ["unhinted", "gone"]
    assert all(
        h is not None and h["forZones"][0]["name"] != "zone-x" for h in hints_of(to_update).values()
    )
    assert [good, unhinted, gone] == before


def test_remove_hints_from_slices() -> None:
    hinted = endpoint_slice("hinted", [endpoint("10.0.0.1", "zone-a", hint_zones=("zone-a",))])
    plain = endpoint_slice("plain", [endpoint("10.0.0.2", "zone-a")])
    new = endpoint_slice("", [endpoint("10.0.0.3", "zone-a", hint_zones=("zone-a",))])
    to_create, to_update, unchanged = remove_hints_from_slices([new], [], [hinted, plain])
    assert [s["metadata"]["name"] for s in to_update] == ["hinted"]
    assert unchanged == [plain]
    assert hints_of([*to_create, *to_update]) == {"10.0.0.3": None, "10.0.0.1": None}
    assert "hints" in hinted["endpoints"][0]  # the input kept its hints


def test_remove_hints_forgets_the_service() -> None:
    cache = _cache(*THREE_ZONES)
    cache.add_hints("default/web", "IPv4", _nine({"zone-a": 3, "zone-b": 3, "zone-c": 3}), [], [])
    cache.remove_hints("default/web", "IPv4")
    assert not cache.has_populated_hints("default/web")
    assert cache.hints_by_zone("default/web", "IPv4") == {}


def test_overloaded_services_after_capacity_moves() -> None:
    cache = _cache(*THREE_ZONES)
    cache.add_hints("default/web", "IPv4", _nine({"zone-a": 3, "zone-b": 3, "zone-c": 3}), [], [])
    assert cache.get_overloaded_services() == []
    cache.set_nodes([*THREE_ZONES, node("c2", "zone-c", cpu="8")])  # zone-c now has 2/3
    assert cache.get_overloaded_services() == ["default/web"]


# ------------------------------------------------------------------------ properties


@settings(max_examples=200, deadline=None)
@given(
    cpus=st.lists(st.integers(1, 16), min_size=2, max_size=4),
    endpoints=st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=40),
    split=st.integers(1, 10),
)
def test_every_ready_endpoint_gets_a_zone_hint_or_none_does(
    cpus: list[int], endpoints: list[tuple[int, bool]], split: int
) -> None:
    zones = [f"zone-{i}" for i in range(len(cpus))]
    cache = _cache(
        *(node(f"n{i}", z, cpu=str(c)) for i, (z, c) in enumerate(zip(zones, cpus, strict=True)))
    )
    eps = [
        endpoint(f"10.0.{i // 200}.{i % 200}", zones[z % len(zones)], ready=r)
        for i, (z, r) in enumerate(endpoints)
    ]
    slices = [endpoint_slice("", eps[i : i + split]) for i in range(0, len(eps), split)]
    before = copy.deepcopy(slices)
    to_create, _, events = cache.add_hints("default/web", "IPv4", slices, [], [])
    assert slices == before
    ready = [ep for s in to_create for ep in s["endpoints"] if ep["conditions"]["ready"]]
    hinted = [ep for ep in ready if ep.get("hints")]
    assert not hinted or len(hinted) == len(ready)
    assert all(
        len(ep["hints"]["forZones"]) == 1 and ep["hints"]["forZones"][0]["name"] in zones
        for ep in hinted
    )
    assert all(
        "hints" not in ep
        for s in to_create
        for ep in s["endpoints"]
        if not ep["conditions"]["ready"]
    )
    allocations, _ = cache.get_allocations(len(ready))
    assert bool(hinted) == (allocations is not None)
    if hinted:
        assert sum(cache.hints_by_zone("default/web", "IPv4").values()) == len(ready)
    else:
        assert events and events[0]["reason"] == "TopologyAwareHintsDisabled"
