"""kubeproxy.controlplane.standalone: raw manifest events in, completed objects out.

Table tests for each rule of the standalone cluster: allocation and its persistence,
explicit objects respected, per-Service errors, Pod changes → only the affected slices,
zones and hints, the pass-through mode; and the state file and the source that wires
them (tmp directories only).
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeproxy import cli
from kubeproxy.controlplane.standalone import StandaloneCluster
from kubeproxy.controlplane.statefile import ABANDONED_SECONDS, STATE_FILE_NAME, StateFile
from kubeproxy.model.events import Event, EventType, RawObject
from kubeproxy.model.types import EndpointSlice, NamespacedName, Service
from kubeproxy.sources.manifests import ManifestSource
from kubeproxy.sources.standalone import StandaloneSource
from tests.unit.controlplane_objects import node, pod, service

Obj = dict[str, Any]

NODES = [node("node-a", "zone-a"), node("node-b", "zone-b")]
# One Pod makes a directory a cluster to complete (and check), see the module docstring.
BACKEND = pod("backend", "10.244.1.200", app="backend")


def raw(doc: Obj) -> RawObject:
    meta = doc["metadata"]
    namespace = "" if doc["kind"] in ("Node", "ServiceCIDR") else meta.get("namespace", "default")
    return RawObject(doc["kind"], NamespacedName(namespace, meta["name"]), doc)


def added(*docs: Obj) -> list[Event]:
    return [Event.added(raw(d)) for d in docs]


def modified(old: Obj, new: Obj) -> list[Event]:
    return [Event.modified(raw(old), raw(new))]


def deleted(doc: Obj) -> list[Event]:
    return [Event.deleted(raw(doc))]


def cluster(**kwargs: Any) -> StandaloneCluster:
    return StandaloneCluster(rng=random.Random(7), **kwargs)


def svc(name: str, *, cluster_ip: str = "", **kwargs: Any) -> Obj:
    """A Service as a user writes it: no ClusterIP, no families, no uid."""
    families = tuple(kwargs.pop("ipFamilies", ()))
    doc = service(name, cluster_ip=cluster_ip, families=families, **kwargs)
    del doc["metadata"]["uid"]
    if not cluster_ip:
        del doc["spec"]["clusterIP"]
    if not families:
        del doc["spec"]["ipFamilies"]
    return doc


def web_pods() -> list[Obj]:
    return [
        pod("web-1", "10.244.1.1", node="node-a"),
        pod("web-2", "10.244.1.2", node="node-a"),
        pod("web-3", "10.244.2.1", node="node-b"),
        pod("web-4", "10.244.2.2", node="node-b"),
    ]


def services(events: Iterable[Event]) -> dict[str, Service | None]:
    out: dict[str, Service | None] = {}
    for e in events:
        obj = e.new if e.new is not None else e.old
        if isinstance(obj, Service):
            out[obj.name] = e.new if isinstance(e.new, Service) else None
    return out


def slices(events: Iterable[Event]) -> list[tuple[EventType, EndpointSlice]]:
    return [
        (e.type, obj)
        for e in events
        if isinstance(obj := (e.new if e.new is not None else e.old), EndpointSlice)
    ]


def addresses(endpoint_slice: EndpointSlice, *, ready_only: bool = False) -> set[str]:
    return {
        ep.addresses[0]
        for ep in endpoint_slice.endpoints
        if not ready_only or ep.conditions.ready is not False
    }


def cluster_ips(events: Iterable[Event]) -> dict[str, tuple[str, ...]]:
    return {
        name: model.ports[0].cluster_ips
        for name, model in services(events).items()
        if model is not None
    }


# ------------------------------------------------------------------------- allocation


def test_services_without_cluster_ip_get_one_from_the_default_range() -> None:
    c = cluster()
    events = c.apply(added(svc("a"), svc("b"), svc("dual", ipFamilyPolicy="PreferDualStack")))
    ips = cluster_ips(events)
    assert c.active
    assert ips["a"][0].startswith("10.") and ips["a"] != ips["b"]
    assert [":" in ip for ip in ips["dual"]] == [False, True]
    for name in ("a", "b", "dual"):
        assert all(ip.startswith(("10.", "fd00:10:96::")) for ip in ips[name]), name


@pytest.mark.parametrize(
    ("flag", "cidr_objects", "expect_prefix"),
    [
        (("10.200.0.0/24",), [], "10.200.0."),
        ((), [{"name": "extra", "cidrs": ["10.123.0.0/24"]}], "10.123.0."),
        (("fd00:1::/112",), [], "fd00:1::"),
        # Found by fuzzing: whitespace the model's parser accepts crashed the allocator,
        # and so did a single-address range at the top of the address space.
        ((), [{"name": "extra", "cidrs": [" 10.123.0.0/24 "]}], "10.123.0."),
        (("10.200.0.0/24",), [{"name": "top", "cidrs": ["255.255.255.255/32"]}], "10.200.0."),
    ],
)
def test_ranges_come_from_the_flag_or_service_cidr_objects(
    flag: tuple[str, ...], cidr_objects: list[Obj], expect_prefix: str
) -> None:
    c = cluster(service_cidrs=flag)
    docs = [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": {"name": o["name"]},
            "spec": {"cidrs": o["cidrs"]},
        }
        for o in cidr_objects
    ]
    ips = cluster_ips(c.apply(added(*docs, svc("a"))))
    assert ips["a"][0].startswith(expect_prefix)


@pytest.mark.parametrize(
    ("flag", "spec", "families", "policy"),
    [
        ((), {"selector": {"app": "web"}}, ["IPv4"], "SingleStack"),
        ((), {"selector": {"app": "web"}, "ipFamilies": ["IPv6"]}, ["IPv6"], "SingleStack"),
        (
            (),
            {"selector": {"app": "web"}, "ipFamilyPolicy": "PreferDualStack"},
            ["IPv4", "IPv6"],
            "PreferDualStack",
        ),
        # Without a selector the API server defaults to both families, even where only
        # one is configured.
        ((), {"selector": {}}, ["IPv4", "IPv6"], "RequireDualStack"),
        (("10.96.0.0/16",), {"selector": {}}, ["IPv4", "IPv6"], "RequireDualStack"),
        ((), {"selector": {}, "ipFamilyPolicy": "SingleStack"}, ["IPv4"], "SingleStack"),
    ],
)
def test_a_headless_service_gets_the_families_the_api_server_gives_it(
    flag: tuple[str, ...], spec: Obj, families: list[str], policy: str
) -> None:
    """Found against the real kube-apiserver (tests/realk8s/test_controlplane_parity.py):
    a headless Service has families like any other, and its EndpointSlices follow them
    (a SingleStack one with a selector gets IPv4 slices only, not both)."""
    c = cluster(service_cidrs=flag)
    events = c.apply(
        added(svc("web", cluster_ip="None", **spec), pod("web-1", ("10.244.1.1", "fd00::1")))
    )
    (doc,) = [o for o in c.objects() if o["kind"] == "Service"]
    assert (doc["spec"]["ipFamilies"], doc["spec"]["ipFamilyPolicy"]) == (families, policy)
    assert doc["spec"]["clusterIP"] == "None"
    got = {s.address_type for _, s in slices(events)}
    assert got == (set(families) if spec["selector"] else set())


def test_a_cluster_ip_of_a_family_without_a_range_is_refused_as_the_api_server_does() -> None:
    c = cluster(service_cidrs=("10.96.0.0/16",))
    c.apply(added(svc("a"), svc("b", cluster_ip="fd00::5")))
    assert c.errors() == {
        "default/b": 'spec.clusterIPs[0]: Invalid value: ["fd00::5"]: '
        "IPv6 is not configured on this cluster"
    }


def test_allocations_survive_a_restart() -> None:
    docs = [
        svc("a"),
        svc("np", type="NodePort", ports=[{"name": "http", "port": 80}]),
        svc(
            "lb",
            type="LoadBalancer",
            externalTrafficPolicy="Local",
            ports=[{"name": "http", "port": 80}],
        ),
    ]
    first = cluster()
    before = services(first.apply(added(*docs)))
    saved = json.loads(json.dumps(first.allocations()))  # what the state file holds
    # Another seed: without the saved state, everything would come out different.
    second = StandaloneCluster(remembered=saved, rng=random.Random(99))
    after = services(second.apply(added(*reversed(docs))))
    assert after == before
    lb = after["lb"]
    assert lb is not None and lb.ports[0].health_check_node_port > 0
    assert second.allocations() == saved


def test_saved_allocations_of_vanished_services_are_forgotten() -> None:
    remembered = {"default/gone": {"clusterIPs": ["10.96.0.99"], "nodePorts": {}}}
    c = cluster(remembered=remembered)
    c.apply(added(svc("a")))
    assert set(c.allocations()) == {"default/a"}
    # ... and the address is free again.
    ips = cluster_ips(c.apply(added(svc("b", cluster_ip="10.96.0.99"))))
    assert ips["b"] == ("10.96.0.99",)


def test_an_explicit_cluster_ip_wins_over_a_remembered_one() -> None:
    remembered = {"default/old": {"clusterIPs": ["10.96.0.50"], "nodePorts": {}}}
    c = cluster(remembered=remembered)
    ips = cluster_ips(c.apply(added(svc("old"), svc("new", cluster_ip="10.96.0.50"))))
    assert ips["new"] == ("10.96.0.50",)
    assert ips["old"] != ("10.96.0.50",)


def test_a_modified_service_keeps_its_addresses_and_ports() -> None:
    c = cluster()
    doc = svc("np", type="NodePort", ports=[{"name": "http", "port": 80}])
    before = services(c.apply(added(doc)))["np"]
    changed = {**doc, "metadata": {**doc["metadata"], "labels": {"tier": "x"}}}
    changed["spec"] = {**doc["spec"], "selector": {"app": "other"}}
    after = services(c.apply(modified(doc, changed)))
    # Same proxy-visible Service: no event at all.
    assert after == {}
    assert before is not None
    assert c.allocations()["default/np"]["nodePorts"] == {"80": before.ports[0].node_port}


# ------------------------------------------------------------------ explicit objects


def test_explicit_cluster_ip_and_node_port_are_respected() -> None:
    c = cluster()
    doc = svc(
        "np",
        cluster_ip="10.96.0.10",
        type="NodePort",
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
    )
    model = services(c.apply(added(doc, pod("p", "10.244.1.1"))))["np"]
    assert model is not None
    assert model.ports[0].cluster_ips == ("10.96.0.10",)
    assert model.ports[0].node_port == 30080


def test_a_service_with_hand_written_slices_gets_no_generated_ones() -> None:
    c = cluster()
    explicit = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "web-manual",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080}],
        "endpoints": [{"addresses": ["10.244.9.9"]}],
    }
    events = c.apply(added(*NODES, svc("web"), *web_pods(), explicit))
    assert [(t, s.name) for t, s in slices(events)] == [(EventType.ADDED, "web-manual")]
    # Removing the hand-written slice hands the Service to the controller.
    events = c.apply(deleted(explicit))
    kinds = sorted((t.value, s.name == "web-manual") for t, s in slices(events))
    assert kinds == [("ADDED", False), ("DELETED", True)]


# --------------------------------------------------------------- per-Service errors


@pytest.mark.parametrize(
    ("docs", "failing", "message"),
    [
        (
            [svc("a", cluster_ip="10.96.0.10"), svc("b", cluster_ip="10.96.0.10")],
            "b",
            'Skipping Service default/b: spec.clusterIPs: Invalid value: ["10.96.0.10"]: '
            "failed to allocate IP 10.96.0.10: provided IP is already allocated "
            "(by Service default/a)",
        ),
        (
            [svc("a"), svc("b", cluster_ip="192.168.7.7")],
            "b",
            'Skipping Service default/b: spec.clusterIPs: Invalid value: ["192.168.7.7"]: '
            "failed to allocate IP 192.168.7.7: the provided network does not match the "
            "current range (ServiceCIDRs: 10.96.0.0/12)",
        ),
        (
            [svc("a"), svc("b", ipFamilies=["IPv6"])],
            "b",
            "Skipping Service default/b: spec.ipFamilies[0]: Invalid value: 'IPv6': "
            "not configured on this cluster (no ServiceCIDR of that family)",
        ),
        (
            [svc("a"), svc("b", ipFamilyPolicy="RequireDualStack")],
            "b",
            "Skipping Service default/b: spec.ipFamilyPolicy: Invalid value: "
            "RequireDualStack: this cluster is not configured for dual-stack Services",
        ),
        (
            [
                svc("a", type="NodePort", ports=[{"name": "h", "port": 80, "nodePort": 30001}]),
                svc("b", type="NodePort", ports=[{"name": "h", "port": 80, "nodePort": 30001}]),
            ],
            "b",
            "Skipping Service default/b: spec.ports[*].nodePort: failed to allocate: "
            "provided port is already allocated",
        ),
    ],
    ids=["collision", "out-of-range", "family", "dual-stack", "node-port"],
)
def test_an_allocation_error_costs_only_that_service(
    docs: list[Obj], failing: str, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    c = cluster(service_cidrs=("10.96.0.0/12",))
    with caplog.at_level(logging.ERROR):
        events = c.apply(added(*docs, BACKEND))
    got = services(events)
    assert failing not in got
    assert all(model is not None for model in got.values()) and len(got) == len(docs) - 1
    assert [r.getMessage() for r in caplog.records] == [message]
    # Logged once, not on every later batch.
    caplog.clear()
    c.apply(added(svc("unrelated")))
    assert caplog.records == []


def test_a_failed_service_appears_once_its_address_is_free() -> None:
    c = cluster()
    a, b = svc("a", cluster_ip="10.96.0.10"), svc("b", cluster_ip="10.96.0.10")
    c.apply(added(a, b, BACKEND))
    events = c.apply(deleted(a))
    got = services(events)
    assert got["a"] is None
    model = got["b"]
    assert model is not None and model.ports[0].cluster_ips == ("10.96.0.10",)


def test_an_invalid_service_is_skipped_and_releases_what_it_took(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = cluster(service_cidrs=("10.96.0.0/30",))  # two usable addresses
    bad = svc("aa-bad", ports=[{"name": "http", "port": 0}])  # allocated between a and b
    with caplog.at_level(logging.ERROR):
        events = c.apply(added(bad, svc("a"), svc("b")))
    assert set(cluster_ips(events)) == {"a", "b"}
    assert "Skipping invalid Service default/aa-bad: spec.ports[0].port" in caplog.text


def _with(doc: Obj, path: str, value: Any) -> Obj:
    """``doc`` with the field at the dotted ``path`` (list indexes as numbers) set."""
    out: Obj = json.loads(json.dumps(doc))
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    target: Any = out
    for step in parents:
        target = target[step]
    target[last] = value
    return out


BAD_POD = pod("bad", "10.244.1.9", node="node-a")


# Minimal examples of what crashed the control plane (and so the whole reload) before
# its raw inputs were checked (found by tests/unit/test_fuzz.py; one line each now).
@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (_with(BAD_POD, "spec", "x"), "spec"),
        (_with(BAD_POD, "spec.containers.0.ports", [{"name": "http"}]), "containerPort"),
        (_with(BAD_POD, "spec.containers.0.ports", ["http"]), "ports[0]"),
        (_with(BAD_POD, "spec.nodeName", ["node-a"]), "spec.nodeName"),
        (_with(BAD_POD, "spec.nodeName", "node-a\n[forged]"), "spec.nodeName"),
        (_with(BAD_POD, "status.podIPs", [{"ip": 5}]), "status.podIPs[0].ip"),
        (_with(BAD_POD, "status.podIP", "10.244.1.9%eth0"), "status.podIP"),
        (_with(BAD_POD, "status.conditions", ["Ready"]), "status.conditions[0]"),
        (_with(BAD_POD, "metadata.labels", 5), "metadata.labels"),
        (_with(svc("bad"), "spec", 5), "spec"),
        (_with(svc("bad"), "spec.ports", [{"name": "http"}]), "spec.ports[0].port"),
        (_with(svc("bad", type="NodePort"), "spec.ports.0.nodePort", "x"), "nodePort"),
        (_with(svc("bad"), "spec.selector", {"app": ["web"]}), "spec.selector[app]"),
        (_with(node("node-c", "zone-a"), "status", "x"), "status"),
        (_with(node("node-c", "zone-a"), "status.allocatable.cpu", "lots"), "cpu"),
        (_with(node("node-c", "zone-a"), "status.conditions", [5]), "status.conditions[0]"),
    ],
)
def test_an_unreadable_raw_object_is_one_line_and_absent(
    bad: Obj, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    c = cluster()
    good = [svc("web"), *web_pods(), node("node-a", "zone-a"), node("node-b", "zone-b")]
    with caplog.at_level(logging.ERROR):
        events = c.apply(added(*good, bad))
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    name = bad["metadata"]["name"]
    assert line.startswith(f"Skipping invalid {bad['kind']} ") and name in line
    assert line.isprintable()
    assert field in line
    assert services(events)["web"] is not None
    (web,) = [s for _, s in slices(events) if s.service_name == "web"]
    assert addresses(web) == {"10.244.1.1", "10.244.1.2", "10.244.2.1", "10.244.2.2"}


# ------------------------------------------------------------- Pods and EndpointSlices


def started() -> tuple[StandaloneCluster, EndpointSlice]:
    c = cluster()
    events = c.apply(
        added(*NODES, svc("web"), svc("other", selector={"app": "other"}), *web_pods())
    )
    web = [s for _, s in slices(events) if s.service_name == "web"]
    assert len(web) == 1
    return c, web[0]


def test_pods_become_one_slice_with_zones() -> None:
    _, web = started()
    assert addresses(web) == {"10.244.1.1", "10.244.1.2", "10.244.2.1", "10.244.2.2"}
    assert {ep.zone for ep in web.endpoints} == {"zone-a", "zone-b"}
    assert {p.port for p in web.ports} == {8080}


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ("add", {"10.244.1.1", "10.244.1.2", "10.244.2.1", "10.244.2.2", "10.244.1.9"}),
        ("delete", {"10.244.1.2", "10.244.2.1", "10.244.2.2"}),
        ("not-ready", {"10.244.1.2", "10.244.2.1", "10.244.2.2"}),
        ("relabel", {"10.244.1.2", "10.244.2.1", "10.244.2.2"}),
    ],
)
def test_a_pod_change_updates_only_the_slice_of_its_service(change: str, expect: set[str]) -> None:
    c, before = started()
    first = pod("web-1", "10.244.1.1", node="node-a")
    batch = {
        "add": added(pod("web-9", "10.244.1.9", node="node-a")),
        "delete": deleted(first),
        "not-ready": modified(first, pod("web-1", "10.244.1.1", node="node-a", ready=False)),
        "relabel": modified(first, pod("web-1", "10.244.1.1", node="node-a", app="x")),
    }[change]
    events = c.apply(batch)
    assert [(t, s.name) for t, s in slices(events)] == [(EventType.MODIFIED, before.name)]
    assert services(events) == {}
    assert addresses(slices(events)[0][1], ready_only=True) == expect


@pytest.mark.parametrize(
    "batch",
    [
        added(pod("x", "10.244.1.50", app="unrelated")),
        added(pod("web-1", "10.244.1.1", namespace="elsewhere")),
        modified(
            pod("web-1", "10.244.1.1", node="node-a"),
            {
                **pod("web-1", "10.244.1.1", node="node-a"),
                "metadata": {
                    **pod("web-1", "10.244.1.1", node="node-a")["metadata"],
                    "annotations": {"note": "changed"},
                },
            },
        ),
    ],
    ids=["other-labels", "other-namespace", "irrelevant-field"],
)
def test_a_pod_change_that_changes_no_endpoint_emits_nothing(batch: list[Event]) -> None:
    c, _ = started()
    assert c.apply(batch) == []


def test_deleting_a_service_deletes_its_slices_and_frees_its_address() -> None:
    c, web = started()
    doc = svc("web")
    ip = c.allocations()["default/web"]["clusterIPs"][0]
    events = c.apply(deleted(doc))
    assert services(events) == {"web": None}
    assert [(t, s.name) for t, s in slices(events)] == [(EventType.DELETED, web.name)]
    assert "default/web" not in c.allocations()
    assert cluster_ips(c.apply(added(svc("reuse", cluster_ip=ip)))) == {"reuse": (ip,)}


# ------------------------------------------------------------------- zones and hints


def zone_hints(endpoint_slice: EndpointSlice) -> dict[str, frozenset[str]]:
    return {ep.addresses[0]: ep.zone_hints for ep in endpoint_slice.endpoints}


AUTO = {"service.kubernetes.io/topology-mode": "Auto"}


@pytest.mark.parametrize(
    ("kwargs", "hinted"),
    [
        ({"annotations": AUTO}, True),
        ({"traffic_distribution": "PreferClose"}, True),
        ({}, False),
    ],
    ids=["topology-mode-auto", "traffic-distribution", "none"],
)
def test_hints_follow_the_nodes_zones(kwargs: dict[str, Any], hinted: bool) -> None:
    c = cluster()
    events = c.apply(added(*NODES, svc("web", **kwargs), *web_pods()))
    [(_, web)] = slices(events)
    expected = {
        "10.244.1.1": frozenset({"zone-a"}),
        "10.244.1.2": frozenset({"zone-a"}),
        "10.244.2.1": frozenset({"zone-b"}),
        "10.244.2.2": frozenset({"zone-b"}),
    }
    assert zone_hints(web) == (expected if hinted else dict.fromkeys(expected, frozenset()))


def test_auto_hints_go_when_a_node_loses_its_cpu_information() -> None:
    c = cluster()
    [(_, web)] = slices(c.apply(added(*NODES, svc("web", annotations=AUTO), *web_pods())))
    assert all(zone_hints(web).values())
    events = c.apply(modified(NODES[1], node("node-b", "zone-b", cpu="0")))
    [(kind, after)] = slices(events)
    assert kind is EventType.MODIFIED and not any(zone_hints(after).values())


# --------------------------------------------------------------------- pass-through


def test_without_pods_or_incomplete_services_objects_pass_through_unchecked() -> None:
    c = cluster()
    doc = service("web", cluster_ip="192.168.1.1", selector={})
    events = c.apply(added(doc, *NODES))
    assert not c.active
    assert cluster_ips(events) == {"web": ("192.168.1.1",)}
    assert c.allocations() == {}


def test_the_first_pod_turns_the_directory_into_a_cluster(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = cluster()
    c.apply(added(*NODES, svc("a", cluster_ip="10.96.0.10"), svc("out", cluster_ip="1.2.3.4")))
    with caplog.at_level(logging.ERROR):
        events = c.apply(added(pod("a-1", "10.244.1.1", node="node-a", app="a")))
    # Now checked: the out-of-range Service goes, the other gets its slice.
    assert services(events) == {"out": None}
    assert "default/out" in caplog.text
    assert [s.service_name for _, s in slices(events)] == ["a"]


# ------------------------------------------------------ state file, source, render


def test_state_file_round_trip_is_atomic_and_tolerates_garbage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = StateFile.beside(tmp_path)
    assert state.load() == {}
    entry = {"clusterIPs": ["10.96.0.1"], "nodePorts": {"80": 30001}, "healthCheckNodePort": 0}
    assert state.save({"default/a": entry})
    assert state.load() == {"default/a": entry}
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE_NAME]  # no temporary left
    state.path.write_text("{not json")
    assert state.load() == {}
    state.path.write_text(
        json.dumps(
            {
                "kind": "AllocationState",
                "services": {"default/a": entry, "default/b": {"clusterIPs": "x"}},
            }
        )
    )
    assert state.load() == {"default/a": entry}
    assert "default/b" in caplog.text


# A save killed (SIGKILL) after writing its temporary file, before the rename.
_KILLED_SAVE = """
import os, signal, sys
from pathlib import Path
from kubeproxy.controlplane.statefile import StateFile
os.replace = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
StateFile.beside(Path(sys.argv[1])).save({})
"""


def test_a_save_cut_short_by_a_crash_leaves_no_file_for_good(tmp_path: Path) -> None:
    entry = {"clusterIPs": ["10.96.0.1"], "nodePorts": {}, "healthCheckNodePort": 0}
    state = StateFile.beside(tmp_path)
    assert state.save({"default/a": entry})
    killed = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(tmp_path)], check=False)
    assert killed.returncode == -signal.SIGKILL
    leftovers = [p for p in tmp_path.iterdir() if p.name != STATE_FILE_NAME]
    assert len(leftovers) == 1  # what the crash left
    assert state.load() == {"default/a": entry}  # the old file, whole
    # A save soon after leaves it (it could be another writer's, in progress)...
    assert state.save({"default/a": entry})
    assert leftovers[0].exists()
    # ...and removes it once it is clearly abandoned.
    old = time.time() - ABANDONED_SECONDS - 1
    os.utime(leftovers[0], (old, old))
    assert state.save({"default/a": entry})
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE_NAME]


def write(directory: Path, name: str, *docs: Obj) -> None:
    (directory / name).write_text(yaml.safe_dump_all(docs))


def test_source_keeps_allocations_across_restarts_and_render_writes_nothing(
    tmp_path: Path,
) -> None:
    write(tmp_path, "cluster.yaml", *NODES, svc("web"), *web_pods())
    preview = StandaloneSource(tmp_path, persist=False)
    objects = preview.objects()
    assert not (tmp_path / STATE_FILE_NAME).exists()
    assert [o["kind"] for o in objects] == ["Service", "EndpointSlice"]

    first = cluster_ips(StandaloneSource(tmp_path).reload())
    assert (tmp_path / STATE_FILE_NAME).exists()
    again = StandaloneSource(tmp_path)
    assert cluster_ips(again.reload()) == first
    assert again.objects()[0]["spec"]["clusterIPs"] == list(first["web"])


def test_raw_manifest_source_reads_pods_and_skips_the_state_file(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", svc("web"), pod("web-1", "10.244.1.1"))
    StateFile.beside(tmp_path).save({})
    events = ManifestSource(tmp_path, raw=True).reload()
    assert sorted((e.type.value, getattr(e.new, "kind", "")) for e in events) == [
        ("ADDED", "Pod"),
        ("ADDED", "Service"),
    ]
    # The plain source is unchanged: no Pods, and this Service is invalid there.
    assert ManifestSource(tmp_path).reload() == []


def test_a_selector_with_several_labels_selects_only_pods_with_all_of_them() -> None:
    c = cluster()
    front = {"app": "web", "tier": "front"}
    both = pod("both", "10.244.1.1", node="node-a")
    both["metadata"]["labels"] = dict(front)
    only_app = pod("only-app", "10.244.1.2", node="node-a")
    events = c.apply(added(*NODES, svc("web", selector=front), both, only_app))
    [(_, web)] = slices(events)
    assert addresses(web) == {"10.244.1.1"}
    # Gaining the second label brings the Pod in.
    relabelled = pod("only-app", "10.244.1.2", node="node-a")
    relabelled["metadata"]["labels"] = dict(front)
    [(kind, after)] = slices(c.apply(modified(only_app, relabelled)))
    assert kind is EventType.MODIFIED and addresses(after) == {"10.244.1.1", "10.244.1.2"}


def test_a_pod_without_a_ready_condition_is_not_ready() -> None:
    c = cluster()
    silent = pod("web-1", "10.244.1.1", node="node-a")
    silent["status"]["conditions"] = []
    [(_, web)] = slices(c.apply(added(*NODES, svc("web"), silent)))
    [endpoint] = web.endpoints
    assert endpoint.conditions.ready is False and endpoint.conditions.serving is False


def test_render_objects_prints_the_completed_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "cluster.yaml", *NODES, svc("web"), *web_pods())
    flags = ["render", "--objects", "--manifests", str(tmp_path), "--hostname-override", "a"]
    assert cli.main(flags) == 0
    listing = yaml.safe_load(capsys.readouterr().out)
    assert listing["kind"] == "List"
    kinds = [(o["kind"], o["metadata"]["name"]) for o in listing["items"]]
    assert kinds[0] == ("Service", "web") and kinds[1][0] == "EndpointSlice"
    assert cli.main([*flags, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == listing  # same allocation: deterministic
    assert not (tmp_path / STATE_FILE_NAME).exists()
    with pytest.raises(SystemExit, match=r"^2$"):  # argparse's usage error
        cli.main([*flags, "--format", "nft"])
    assert "--objects: --format must be yaml or json" in capsys.readouterr().err
