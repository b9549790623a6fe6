"""The EndpointSlice reconciler (kubeproxy.controlplane.endpointslice), rule by rule.

``_apply`` plays the API server: it names created slices and applies a result, so tests
can reconcile again against what the previous pass wrote, as the controller does.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeproxy.controlplane.endpointslice import (
    ReconcileResult,
    endpoint_ports,
    pod_to_endpoint,
    reconcile,
    select_pods,
    should_pod_be_in_endpoints,
)
from kubeproxy.controlplane.topologycache import TopologyCache
from tests.unit.controlplane_objects import hints_of, node, nodes_by_name, pod, service

Obj = dict[str, Any]

NODES = nodes_by_name(
    node("node-a1", "zone-a"), node("node-b1", "zone-b"), node("node-c1", "zone-c")
)


def _apply(slices: list[Obj], result: ReconcileResult, counter: list[int]) -> list[Obj]:
    """The slices after the API server carried out ``result``."""
    by_name = {s["metadata"]["name"]: s for s in slices}
    for doomed in result.to_delete:
        del by_name[doomed["metadata"]["name"]]
    for updated in result.to_update:
        assert updated["metadata"]["name"] in by_name, "update of a slice that does not exist"
        by_name[updated["metadata"]["name"]] = updated
    for created in result.to_create:
        assert "name" not in created["metadata"]
        counter[0] += 1
        named = copy.deepcopy(created)
        named["metadata"]["name"] = f"{created['metadata']['generateName']}{counter[0]}"
        by_name[named["metadata"]["name"]] = named
    return list(by_name.values())


def _addresses(slices: list[Obj]) -> list[str]:
    return sorted(a for s in slices for ep in s["endpoints"] for a in ep["addresses"])


def _pods(n: int, **kwargs: Any) -> list[Obj]:
    nodes = ["node-a1", "node-b1", "node-c1"]
    return [
        pod(f"p{i}", f"10.0.{i // 250}.{i % 250 + 1}", node=nodes[i % 3], **kwargs)
        for i in range(n)
    ]


# ------------------------------------------------------------------------- selection


def test_select_pods() -> None:
    pods = [
        pod("a", "10.0.0.1"),
        pod("b", "10.0.0.2", app="db"),
        pod("c", "10.0.0.3", namespace="other"),
    ]
    assert [p["metadata"]["name"] for p in select_pods(service(), pods) or []] == ["a"]
    assert select_pods(service(selector={}), pods) is None
    assert select_pods(service(type="ExternalName"), pods) is None


@pytest.mark.parametrize(
    ("phase", "ips", "terminating", "included"),
    [
        ("Running", ("10.0.0.1",), False, True),
        ("Pending", ("10.0.0.1",), False, True),
        ("Running", (), False, False),  # no IP yet
        ("Succeeded", ("10.0.0.1",), False, False),  # terminal
        ("Failed", ("10.0.0.1",), False, False),
        ("Running", ("10.0.0.1",), True, True),  # terminating Pods stay, not ready
    ],
)
def test_which_pods_become_endpoints(
    phase: str, ips: tuple[str, ...], terminating: bool, included: bool
) -> None:
    assert should_pod_be_in_endpoints(pod("p", ips, phase=phase, terminating=terminating)) is (
        included
    )


@pytest.mark.parametrize(
    ("ready", "terminating", "publish", "conditions"),
    [
        (True, False, False, (True, True, False)),
        (False, False, False, (False, False, False)),
        (True, True, False, (False, True, True)),  # terminating: never ready...
        (False, True, False, (False, False, True)),
        (False, False, True, (True, False, False)),  # ...unless publishNotReadyAddresses
        (True, True, True, (True, True, True)),
    ],
)
def test_endpoint_conditions(
    ready: bool, terminating: bool, publish: bool, conditions: tuple[bool, bool, bool]
) -> None:
    svc = service(publishNotReadyAddresses=publish)
    ep = pod_to_endpoint(
        pod("p", "10.0.0.1", ready=ready, terminating=terminating), NODES["node-a1"], svc, "IPv4"
    )
    assert ep["conditions"] == dict(
        zip(("ready", "serving", "terminating"), conditions, strict=True)
    )


def test_endpoint_topology_and_identity() -> None:
    ep = pod_to_endpoint(
        pod("p", "10.0.0.1", node="node-b1", hostname="h", subdomain="web"),
        NODES["node-b1"],
        service(),
        "IPv4",
    )
    assert ep == {
        "addresses": ["10.0.0.1"],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "targetRef": {"kind": "Pod", "namespace": "default", "name": "p", "uid": "uid-p"},
        "nodeName": "node-b1",
        "zone": "zone-b",
        "hostname": "h",
    }
    no_zone = pod_to_endpoint(
        pod("p", "10.0.0.1", subdomain="other", hostname="h"),
        node("node-a1", None),
        service(),
        "IPv4",
    )
    assert "zone" not in no_zone and "hostname" not in no_zone


def test_named_target_ports_resolve_per_pod() -> None:
    svc = service(
        ports=[
            {"name": "http", "port": 80, "targetPort": "web"},
            {"name": "dns", "port": 53, "targetPort": "dns", "protocol": "UDP"},
        ]
    )
    p1 = pod(
        "p1",
        "10.0.0.1",
        container_ports=[
            {"name": "web", "containerPort": 8080},
            {"name": "dns", "containerPort": 5353, "protocol": "TCP"},  # wrong protocol
        ],
    )
    p2 = pod(
        "p2",
        "10.0.0.2",
        container_ports=[{"name": "web", "containerPort": 9090}],
        initContainers=[
            {
                "name": "sidecar",
                "restartPolicy": "Always",
                "ports": [{"name": "dns", "containerPort": 53, "protocol": "UDP"}],
            }
        ],
    )
    assert endpoint_ports(svc, p1) == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    assert endpoint_ports(svc, p2) == [
        {"name": "http", "port": 9090, "protocol": "TCP"},
        {"name": "dns", "port": 53, "protocol": "UDP"},
    ]
    result = reconcile(svc, [p1, p2], [], NODES)
    assert sorted(len(s["ports"]) for s in result.to_create) == [1, 2]  # one slice per port set


# ---------------------------------------------------------------------- slice layout


@pytest.mark.parametrize(
    ("pods", "maximum", "sizes"), [(250, 100, [100, 100, 50]), (7, 3, [3, 3, 1]), (100, 100, [100])]
)
def test_slices_hold_at_most_the_maximum(pods: int, maximum: int, sizes: list[int]) -> None:
    result = reconcile(service(), _pods(pods), [], NODES, max_endpoints_per_slice=maximum)
    assert [len(s["endpoints"]) for s in result.to_create] == sizes
    assert len(_addresses(result.to_create)) == pods


def test_new_slice_metadata() -> None:
    (created,) = reconcile(service(labels={"team": "a"}), _pods(1), [], NODES).to_create
    assert created["metadata"] == {
        "generateName": "web-",
        "namespace": "default",
        "labels": {
            "team": "a",
            "kubernetes.io/service-name": "web",
            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
        },
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "name": "web",
                "uid": "svc-uid",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    assert created["addressType"] == "IPv4"
    assert created["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]


def test_dual_stack_gets_one_slice_per_address_type() -> None:
    svc = service(families=("IPv4", "IPv6"))
    pods = [pod("p", ("10.0.0.1", "fd00::1"))]
    result = reconcile(svc, pods, [], NODES)
    assert {(s["addressType"], _addresses([s])[0]) for s in result.to_create} == {
        ("IPv4", "10.0.0.1"),
        ("IPv6", "fd00::1"),
    }


def test_ipv6_pod_addresses_are_written_as_upstream_writes_them() -> None:
    """The API server keeps a Pod's IPv6 address as the kubelet spelled it; the controller
    parses and prints each address (found against the real kube-controller-manager:
    tests/realk8s/test_controlplane_parity.py)."""
    svc = service(families=("IPv6",))
    pods = [pod("a", ("10.0.0.1", "fd00:cc:0::b")), pod("b", ("10.0.0.2", "FD00::C"))]
    (created,) = reconcile(svc, pods, [], NODES).to_create
    assert _addresses([created]) == ["fd00::c", "fd00:cc::b"]


@pytest.mark.parametrize(
    ("families", "cluster_ip", "types"),
    [((), "10.96.0.1", {"IPv4"}), ((), "fd00::1", {"IPv6"}), ((), "None", {"IPv4", "IPv6"})],
)
def test_address_types_without_ip_families(
    families: tuple[str, ...], cluster_ip: str, types: set[str]
) -> None:
    result = reconcile(service(families=families, cluster_ip=cluster_ip), [], [], NODES)
    assert {s["addressType"] for s in result.to_create} == types


def test_headless_label() -> None:
    (created,) = reconcile(service(cluster_ip="None"), _pods(1), [], NODES).to_create
    assert created["metadata"]["labels"]["service.kubernetes.io/headless"] == ""


def test_pod_on_unknown_node_is_skipped_unless_publishing_not_ready() -> None:
    pods = [pod("p", "10.0.0.1", node="gone")]
    result = reconcile(service(), pods, [], NODES)
    assert _addresses(result.to_create) == []
    assert result.errors == ["skipping Pod p for Service default/web: Node gone Not Found"]
    published = reconcile(service(publishNotReadyAddresses=True), pods, [], NODES)
    assert _addresses(published.to_create) == ["10.0.0.1"]
    assert "zone" not in published.to_create[0]["endpoints"][0]


# ---------------------------------------------------------------- reuse of slices


def _steady(pods: list[Obj], maximum: int = 100, svc: Obj | None = None) -> list[Obj]:
    counter = [0]
    return _apply(
        [], reconcile(svc or service(), pods, [], NODES, max_endpoints_per_slice=maximum), counter
    )


def test_nothing_changes_nothing_written() -> None:
    slices = _steady(_pods(250))
    result = reconcile(service(), _pods(250), slices, NODES)
    assert (result.to_create, result.to_update, result.to_delete) == ([], [], [])


def test_a_removed_pod_updates_only_its_slice() -> None:
    slices = _steady(_pods(250))
    result = reconcile(service(), _pods(250)[1:], slices, NODES)
    assert result.to_create == [] and result.to_delete == []
    (updated,) = result.to_update
    assert "10.0.0.1" not in _addresses([updated]) and len(updated["endpoints"]) == 99


def test_a_changed_pod_is_updated_in_place() -> None:
    slices = _steady(_pods(3))
    pods = _pods(3)
    pods[1]["status"]["conditions"][0]["status"] = "False"
    (updated,) = reconcile(service(), pods, slices, NODES).to_update
    assert [ep["conditions"]["ready"] for ep in updated["endpoints"]] == [True, False, True]
    assert updated["metadata"]["name"] == slices[0]["metadata"]["name"]


def test_new_endpoints_fill_slices_being_updated_before_anything_else() -> None:
    slices = _steady(_pods(250))
    pods = _pods(252)
    del pods[0]  # the first slice loses one endpoint: it is written anyway
    result = reconcile(service(), pods, slices, NODES)
    assert result.to_create == [] and result.to_delete == []
    # One new endpoint refills the slice that lost one; the other goes to the unchanged
    # slice closest to full that has room: the half-empty third one.
    assert [len(s["endpoints"]) for s in result.to_update] == [100, 51]
    assert len(_addresses(_apply(slices, result, [9]))) == 251


def test_leftovers_go_to_the_unchanged_slice_closest_to_full() -> None:
    slices = _steady(_pods(250))  # 100, 100, 50
    result = reconcile(service(), _pods(260), slices, NODES)
    (updated,) = result.to_update
    assert len(updated["endpoints"]) == 60 and result.to_create == []


def test_a_full_slice_worth_of_leftovers_gets_a_new_slice() -> None:
    slices = _steady(_pods(50))
    result = reconcile(service(), _pods(160), slices, NODES)
    assert [len(s["endpoints"]) for s in result.to_create] == [100]
    assert [len(s["endpoints"]) for s in result.to_update] == [60]


def test_an_emptied_slice_is_deleted() -> None:
    slices = _steady(_pods(150))
    result = reconcile(service(), _pods(150)[100:], slices, NODES)
    assert [len(s["endpoints"]) for s in result.to_delete] == [100]
    assert result.to_update == [] and result.to_create == []


def test_no_endpoints_means_one_placeholder_slice() -> None:
    (placeholder,) = reconcile(service(), [], [], NODES).to_create
    assert placeholder["endpoints"] == [] and placeholder["ports"] == []
    slices = _apply([], reconcile(service(), [], [], NODES), [0])
    again = reconcile(service(), [], slices, NODES)
    assert (again.to_create, again.to_update, again.to_delete) == ([], [], [])


def test_a_create_takes_over_the_name_of_a_slice_to_delete() -> None:
    slices = _steady(_pods(3))
    moved = service(ports=[{"name": "http", "port": 80, "targetPort": 9090}])
    result = reconcile(moved, _pods(3), slices, NODES)
    assert result.to_create == [] and result.to_delete == []
    (updated,) = result.to_update
    assert updated["metadata"]["name"] == slices[0]["metadata"]["name"]
    assert updated["ports"][0]["port"] == 9090 and "generateName" not in updated["metadata"]


def test_slices_of_another_owner_or_address_type_are_deleted() -> None:
    slices = _steady(_pods(2))
    stranger = copy.deepcopy(slices[0])
    stranger["metadata"]["name"] = "web-old"
    stranger["metadata"]["ownerReferences"][0]["uid"] = "previous-service"
    v6 = copy.deepcopy(slices[0])
    v6["metadata"]["name"] = "web-v6"
    v6["addressType"] = "IPv6"
    result = reconcile(service(), _pods(2), [*slices, stranger, v6], NODES)
    assert sorted(s["metadata"]["name"] for s in result.to_delete) == ["web-old", "web-v6"]
    assert result.to_create == [] and result.to_update == []


def test_slices_of_other_services_or_controllers_are_ignored() -> None:
    slices = _steady(_pods(2))
    foreign = copy.deepcopy(slices[0])
    foreign["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] = "someone-else"
    foreign["metadata"]["name"] = "mirrored"
    result = reconcile(service(), _pods(2), [*slices, foreign], NODES)
    assert (result.to_create, result.to_update, result.to_delete) == ([], [], [])


def test_a_service_label_change_updates_every_slice() -> None:
    slices = _steady(_pods(150))
    result = reconcile(service(labels={"tier": "front"}), _pods(150), slices, NODES)
    assert len(result.to_update) == 2
    assert all(s["metadata"]["labels"]["tier"] == "front" for s in result.to_update)


def test_no_slices_are_created_for_a_service_being_deleted() -> None:
    svc = service()
    svc["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    assert reconcile(svc, _pods(3), [], NODES).to_create == []


@pytest.mark.parametrize(
    ("when", "stamp"),
    [
        (datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC), "2024-05-01T12:00:00Z"),
        (datetime(2024, 5, 1, 12, 0, 0, 120000, tzinfo=UTC), "2024-05-01T12:00:00.12Z"),
        (datetime(2024, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))), "2024-05-01T12:00:00Z"),
    ],
)
def test_trigger_time_annotation(when: datetime, stamp: str) -> None:
    (created,) = reconcile(service(), _pods(1), [], NODES, trigger_time=when).to_create
    annotations = created["metadata"]["annotations"]
    assert annotations == {"endpoints.kubernetes.io/last-change-trigger-time": stamp}
    slices = _apply([], reconcile(service(), _pods(1), [], NODES, trigger_time=when), [0])
    (updated,) = reconcile(service(), _pods(2), slices, NODES).to_update
    assert updated["metadata"]["annotations"] == {}


def test_inputs_are_never_mutated() -> None:
    slices = _steady(_pods(120))
    for s in slices:
        for ep in s["endpoints"]:
            ep["hints"] = {"forZones": [{"name": "zone-x"}]}
    pods = _pods(130)[5:]
    before = copy.deepcopy((slices, pods, NODES))
    cache = TopologyCache()
    cache.set_nodes(NODES.values())
    reconcile(
        service(annotations={"service.kubernetes.io/topology-mode": "Auto"}),
        pods,
        slices,
        NODES,
        topology_cache=cache,
        trigger_time=datetime(2024, 1, 1, tzinfo=UTC),
    )
    reconcile(service(traffic_distribution="PreferSameNode"), pods, slices, NODES)
    reconcile(service(), pods, slices, NODES)
    assert (slices, pods, NODES) == before


# -------------------------------------------------------------------------- hints


def test_topology_mode_auto_hints_and_events() -> None:
    cache = TopologyCache()
    cache.set_nodes(NODES.values())
    auto = service(annotations={"service.kubernetes.io/topology-mode": "Auto"})
    first = reconcile(auto, _pods(9), [], NODES, topology_cache=cache)
    assert first.events == [
        {
            "type": "Normal",
            "reason": "TopologyAwareHintsEnabled",
            "message": "Topology Aware Hints has been enabled, addressType: IPv4",
        }
    ]
    hints = hints_of(first.to_create)
    assert all(h is not None for h in hints.values())
    slices = _apply([], first, [0])
    # Dropping the annotation removes the hints, with an event.
    off = reconcile(service(), _pods(9), slices, NODES, topology_cache=cache)
    assert [e["reason"] for e in off.events] == ["TopologyAwareHintsDisabled"]
    assert off.events[0]["message"] == "Topology Aware Hints has been disabled, addressType: IPv4"
    assert all(h is None for h in hints_of(off.to_update).values())


def test_the_annotation_wins_over_traffic_distribution() -> None:
    cache = TopologyCache()  # no Nodes: Auto cannot hint
    both = service(
        annotations={"service.kubernetes.io/topology-aware-hints": "auto"},
        traffic_distribution="PreferClose",
    )
    result = reconcile(both, _pods(3), [], NODES, topology_cache=cache)
    assert all(h is None for h in hints_of(result.to_create).values())
    assert result.events[0]["reason"] == "TopologyAwareHintsDisabled"


@pytest.mark.parametrize(
    ("value", "enabled", "prefer_same", "hinted"),
    [
        ("PreferClose", True, False, True),
        ("PreferSameZone", True, True, True),
        ("PreferSameZone", True, False, False),  # the PreferSame* values need their gate
        ("PreferSameNode", True, True, True),
        ("PreferClose", False, True, False),
        ("Bogus", True, True, False),
    ],
)
def test_traffic_distribution_gates(
    value: str, enabled: bool, prefer_same: bool, hinted: bool
) -> None:
    result = reconcile(
        service(traffic_distribution=value),
        _pods(3),
        [],
        NODES,
        traffic_distribution_enabled=enabled,
        prefer_same_traffic_distribution=prefer_same,
    )
    assert all((h is not None) == hinted for h in hints_of(result.to_create).values())


def test_stale_hints_are_removed_when_nothing_asks_for_them() -> None:
    slices = _apply(
        [], reconcile(service(traffic_distribution="PreferClose"), _pods(3), [], NODES), [0]
    )
    result = reconcile(service(), _pods(3), slices, NODES)
    (updated,) = result.to_update
    assert all(h is None for h in hints_of([updated]).values())


# ----------------------------------------------------------------------- properties

_POD_STATES = st.lists(
    st.tuples(st.integers(0, 59), st.booleans(), st.booleans(), st.integers(0, 2)),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(rounds=st.lists(_POD_STATES, min_size=1, max_size=4), maximum=st.integers(1, 12))
def test_reconcile_invariants(
    rounds: list[list[tuple[int, bool, bool, int]]], maximum: int
) -> None:
    """Across successive syncs: slices within the maximum, every endpoint exactly once,
    a second sync of the same state writes nothing."""
    nodes = ["node-a1", "node-b1", "node-c1"]
    slices: list[Obj] = []
    counter = [0]
    assert rounds  # min_size=1: every example syncs at least once
    for states in rounds:
        pods = {
            i: pod(f"p{i}", f"10.1.0.{i + 1}", ready=ready, terminating=term, node=nodes[n])
            for i, ready, term, n in states
        }
        result = reconcile(
            service(), list(pods.values()), slices, NODES, max_endpoints_per_slice=maximum
        )
        slices = _apply(slices, result, counter)
        assert all(len(s["endpoints"]) <= maximum for s in slices)
        expected = sorted(f"10.1.0.{i + 1}" for i in pods)
        assert _addresses(slices) == expected  # each exactly once
        ready = {
            ep["addresses"][0] for s in slices for ep in s["endpoints"] if ep["conditions"]["ready"]
        }
        assert ready == {
            f"10.1.0.{i + 1}"
            for i, p in pods.items()
            if p["status"]["conditions"][0]["status"] == "True"
            and "deletionTimestamp" not in p["metadata"]
        }
        again = reconcile(
            service(), list(pods.values()), slices, NODES, max_endpoints_per_slice=maximum
        )
        assert (again.to_create, again.to_update, again.to_delete) == ([], [], [])
