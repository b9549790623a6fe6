"""trafficDistribution hints (kubeproxy.controlplane.trafficdist.reconcile_hints)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeproxy.controlplane.trafficdist import reconcile_hints
from tests.unit.controlplane_objects import endpoint, endpoint_slice, hints_of

Obj = dict[str, Any]

ZONE_A = {"forZones": [{"name": "zone-a"}]}
ZONE_A_NODE_1 = {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "node-1"}]}


@pytest.mark.parametrize(
    ("value", "ep", "hints"),
    [
        ("PreferClose", endpoint("10.0.0.1", "zone-a", node_name="node-1"), ZONE_A),
        ("PreferSameZone", endpoint("10.0.0.1", "zone-a", node_name="node-1"), ZONE_A),
        ("PreferSameNode", endpoint("10.0.0.1", "zone-a", node_name="node-1"), ZONE_A_NODE_1),
        (
            "PreferSameNode",
            endpoint("10.0.0.1", None, node_name="node-1"),
            {"forNodes": [{"name": "node-1"}]},
        ),
        ("PreferSameZone", endpoint("10.0.0.1", None, node_name="node-1"), None),
        (None, endpoint("10.0.0.1", "zone-a", hint_zones=("zone-a",)), None),
        ("SomethingNew", endpoint("10.0.0.1", "zone-a", hint_zones=("zone-a",)), None),
        # Not-ready endpoints are left as they are.
        ("PreferClose", endpoint("10.0.0.1", "zone-a", ready=False), None),
        (
            "PreferClose",
            endpoint("10.0.0.1", "zone-a", ready=False, hint_zones=("zone-b",)),
            {"forZones": [{"name": "zone-b"}]},
        ),
    ],
)
def test_hints_for_slices_being_written(value: str | None, ep: Obj, hints: Obj | None) -> None:
    to_create, to_update, unchanged = reconcile_hints(
        value, [endpoint_slice("", [ep])], [endpoint_slice("s", [ep])], []
    )
    assert hints_of(to_create) == hints_of(to_update) == {"10.0.0.1": hints}
    assert unchanged == []


@pytest.mark.parametrize(
    ("value", "ep", "moves"),
    [
        ("PreferClose", endpoint("10.0.0.1", "zone-a", hint_zones=("zone-a",)), False),
        ("PreferClose", endpoint("10.0.0.1", "zone-a"), True),  # missing hint
        ("PreferClose", endpoint("10.0.0.1", "zone-a", hint_zones=("zone-b",)), True),  # wrong
        ("PreferClose", endpoint("10.0.0.1", "zone-a", hint_zones=("zone-a", "zone-b")), True),
        ("PreferClose", endpoint("10.0.0.1", None, hint_zones=("zone-a",)), True),  # stale
        (
            "PreferClose",
            endpoint(
                "10.0.0.1", "zone-a", node_name="n", hint_zones=("zone-a",), hint_nodes=("n",)
            ),
            True,
        ),  # stale node
        (
            "PreferSameNode",
            endpoint(
                "10.0.0.1", "zone-a", node_name="n", hint_zones=("zone-a",), hint_nodes=("n",)
            ),
            False,
        ),
        (
            "PreferSameNode",
            endpoint("10.0.0.1", "zone-a", node_name="n", hint_zones=("zone-a",)),
            True,
        ),
        ("PreferClose", endpoint("10.0.0.1", "zone-a", ready=False), False),  # not ready
        (None, endpoint("10.0.0.1", "zone-a"), False),
        (None, endpoint("10.0.0.1", "zone-a", ready=False, hint_zones=("zone-a",)), True),
    ],
)
def test_which_unchanged_slices_need_an_update(value: str | None, ep: Obj, moves: bool) -> None:
    unchanged_in = [endpoint_slice("s", [ep])]
    before = copy.deepcopy(unchanged_in)
    _, to_update, unchanged = reconcile_hints(value, [], [], unchanged_in)
    assert unchanged_in == before  # never mutated
    assert [s["metadata"]["name"] for s in to_update] == (["s"] if moves else [])
    assert len(unchanged) == (0 if moves else 1)
    if not moves:
        assert unchanged[0] is unchanged_in[0]


@settings(max_examples=150, deadline=None)
@given(
    value=st.sampled_from([None, "PreferClose", "PreferSameZone", "PreferSameNode", "X"]),
    eps=st.lists(
        st.tuples(
            st.sampled_from([None, "zone-a", "zone-b"]),
            st.booleans(),
            st.sampled_from([None, "n1", "n2"]),
            st.sampled_from([None, ("zone-a",), ("zone-b",)]),
        ),
        max_size=12,
    ),
)
def test_a_second_pass_changes_nothing(
    value: str | None, eps: list[tuple[str | None, bool, str | None, tuple[str, ...] | None]]
) -> None:
    endpoints = [
        endpoint(f"10.0.0.{i}", z, ready=r, node_name=n, hint_zones=h)
        for i, (z, r, n, h) in enumerate(eps)
    ]
    slices = [endpoint_slice("s", endpoints)]
    before = copy.deepcopy(slices)
    _, to_update, unchanged = reconcile_hints(value, [], [], slices)
    assert slices == before
    settled = to_update or unchanged
    _, again, still = reconcile_hints(value, [], [], settled)
    assert again == [] and still == settled
    ready = [ep for s in settled for ep in s["endpoints"] if ep["conditions"]["ready"]]
    if value in ("PreferClose", "PreferSameZone", "PreferSameNode"):
        assert all(
            (ep.get("hints") or {}).get("forZones")
            == ([{"name": ep["zone"]}] if ep.get("zone") else None)
            for ep in ready
        )
    else:
        assert all("hints" not in ep for s in settled for ep in s["endpoints"])
