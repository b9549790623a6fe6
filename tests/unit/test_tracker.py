"""kubeproxy.model.tracker (and model.events.dispatch): pending changes -> synced maps.

What matters to a backend is that ``apply`` reports exactly the ServicePortNames that
changed (so partial syncs are correct) and nothing when nothing changed (so no-op events
cost no sync).
"""

from __future__ import annotations

import pytest

from kubeproxy.model.events import Event, dispatch
from kubeproxy.model.state import ProxyState
from kubeproxy.model.tracker import (
    EndpointsChangeTracker,
    EndpointsMap,
    ServiceChangeTracker,
    ServicePortMap,
    endpoints_for_slices,
)
from kubeproxy.model.types import (
    LABEL_ZONE,
    Endpoint,
    EndpointSlice,
    IPFamily,
    L4Protocol,
    NamespacedName,
    Node,
    NodeAddress,
    Service,
    SliceEndpoint,
)
from tests.unit.conftest import (
    endpoint_slice,
    port_name,
    service,
    service_port,
    slice_endpoint,
)

TCP, UDP, SCTP = L4Protocol.TCP, L4Protocol.UDP, L4Protocol.SCTP
WEB = NamespacedName("default", "web")

# ================================================================================ Services


def _synced(*services: Service) -> tuple[ServiceChangeTracker, ServicePortMap]:
    """A tracker and a map that already hold ``services`` (the initial sync is done)."""
    tracker, ports = ServiceChangeTracker(), ServicePortMap()
    for svc in services:
        tracker.update(None, svc)
    ports.apply(tracker)
    return tracker, ports


def test_service_add() -> None:
    tracker, ports = ServiceChangeTracker(), ServicePortMap()
    svc = service("web", service_port(port="http"), service_port(port="dns", protocol=UDP))
    assert tracker.update(None, svc) is True
    assert tracker.pending() == 1
    result = ports.apply(tracker)
    assert result.changed == {port_name(port="http"), port_name(port="dns", protocol=UDP)}
    assert dict(ports) == {p.name: p for p in svc.ports}
    assert tracker.pending() == 0


def test_service_update_reports_only_changed_ports() -> None:
    http, https = service_port(port="http"), service_port(port="https", number=443)
    old = service("web", http, https)
    tracker, ports = _synced(old)
    new = service("web", http, service_port(port="https", number=8443))
    tracker.update(old, new)
    result = ports.apply(tracker)
    # http did not change: a partial sync must not touch it
    assert result.changed == {port_name(port="https")}
    assert ports[port_name(port="https")].port == 8443


def test_service_update_adds_and_removes_ports() -> None:
    old = service("web", service_port(port="http"), service_port(port="dns", protocol=UDP))
    tracker, ports = _synced(old)
    new = service("web", service_port(port="http"), service_port(port="metrics", number=9090))
    tracker.update(old, new)
    result = ports.apply(tracker)
    assert result.changed == {port_name(port="dns", protocol=UDP), port_name(port="metrics")}
    assert set(ports) == {port_name(port="http"), port_name(port="metrics")}


def test_service_delete() -> None:
    dual = ("10.96.0.10", "fd00::10")
    old = service(
        "web",
        service_port(port="http", cluster_ips=dual),
        service_port(port="dns", protocol=UDP, cluster_ips=dual),
        service_port(port="sctp", protocol=SCTP, cluster_ips=dual),
    )
    other = service("db", service_port("db", port="pg", number=5432))
    tracker, ports = _synced(old, other)
    assert tracker.update(old, None) is True
    result = ports.apply(tracker)
    assert result.changed == {p.name for p in old.ports}
    assert set(ports) == {port_name("db", port="pg")}


def test_service_protocol_change_is_delete_plus_add() -> None:
    # ServicePortName includes the protocol: TCP->UDP is a different ServicePort.
    old = service("web", service_port(port="p", protocol=TCP))
    tracker, ports = _synced(old)
    new = service("web", service_port(port="p", protocol=UDP))
    tracker.update(old, new)
    result = ports.apply(tracker)
    assert result.changed == {port_name(port="p", protocol=TCP), port_name(port="p", protocol=UDP)}
    assert set(ports) == {port_name(port="p", protocol=UDP)}


def test_service_noop_update_is_dropped() -> None:
    old = service("web", service_port())
    tracker, ports = _synced(old)
    # an equal object (e.g. only an annotation changed upstream of the parser)
    assert tracker.update(old, service("web", service_port())) is False
    assert tracker.pending() == 0
    assert ports.apply(tracker).changed == set()


def test_service_add_then_delete_is_dropped() -> None:
    tracker, ports = ServiceChangeTracker(), ServicePortMap()
    svc = service("web", service_port(protocol=UDP))
    tracker.update(None, svc)
    assert tracker.update(svc, None) is False
    assert tracker.pending() == 0
    result = ports.apply(tracker)
    assert result.changed == set()
    assert dict(ports) == {}


def test_service_change_and_revert_is_dropped() -> None:
    a = service("web", service_port(number=80))
    b = service("web", service_port(number=81))
    tracker, ports = _synced(a)
    assert tracker.update(a, b) is True
    assert tracker.update(b, a) is False
    assert ports.apply(tracker).changed == set()


def test_service_changes_are_folded_first_to_last() -> None:
    a = service("web", service_port(port="x", number=80))
    b = service("web", service_port(port="y", number=81))
    c = service("web", service_port(port="x", number=82))
    tracker, ports = _synced(a)
    tracker.update(a, b)
    tracker.update(b, c)
    assert tracker.pending() == 1
    result = ports.apply(tracker)
    # "y" came and went between syncs: never synced, not reported
    assert result.changed == {port_name(port="x")}
    assert ports[port_name(port="x")].port == 82


def test_service_update_return_value_counts_other_services() -> None:
    tracker = ServiceChangeTracker()
    web, db = service("web", service_port()), service("db", service_port("db"))
    tracker.update(None, web)
    tracker.update(None, db)
    # dropping web's change still leaves db's pending
    assert tracker.update(web, None) is True
    assert tracker.pending() == 1


def test_service_update_with_nothing() -> None:
    assert ServiceChangeTracker().update(None, None) is False


def test_headless_service_has_no_ports() -> None:
    tracker, ports = ServiceChangeTracker(), ServicePortMap()
    assert tracker.update(None, service("headless")) is False
    assert ports.apply(tracker).changed == set()


# =========================================================================== Endpoints merge


def _ips(eps: tuple[Endpoint, ...]) -> list[str]:
    return [str(ep) for ep in eps]


def test_multi_slice_merge() -> None:
    a = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.2"),))
    b = endpoint_slice("web-b", endpoints=(slice_endpoint("10.1.0.1"), slice_endpoint("10.1.0.3")))
    merged = endpoints_for_slices([b, a])
    assert _ips(merged[port_name()]) == ["10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080"]


def test_endpoint_port_comes_from_slice_port_with_same_name_and_protocol() -> None:
    slc = endpoint_slice(
        "web-a",
        ports=(("http", TCP, 8080), ("http", UDP, 8081), ("dns", UDP, 53), ("", SCTP, 9)),
        endpoints=(slice_endpoint("10.1.0.1"),),
    )
    merged = endpoints_for_slices([slc])
    assert {name: eps[0].port for name, eps in merged.items()} == {
        port_name(port="http", protocol=TCP): 8080,
        port_name(port="http", protocol=UDP): 8081,
        port_name(port="dns", protocol=UDP): 53,
        port_name(port="", protocol=SCTP): 9,
    }


def test_each_slice_uses_its_own_port_number() -> None:
    # During a targetPort rollout, old and new slices map the same port name differently.
    old = endpoint_slice(
        "web-a", ports=(("http", TCP, 8080),), endpoints=(slice_endpoint("10.1.0.1"),)
    )
    new = endpoint_slice(
        "web-b", ports=(("http", TCP, 9090),), endpoints=(slice_endpoint("10.1.0.2"),)
    )
    assert _ips(endpoints_for_slices([old, new])[port_name()]) == ["10.1.0.1:8080", "10.1.0.2:9090"]


def test_only_first_address_is_used() -> None:
    slc = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.9", "10.1.0.1"),))
    assert _ips(endpoints_for_slices([slc])[port_name()]) == ["10.1.0.9:8080"]


def test_endpoint_carries_conditions_locality_and_hints() -> None:
    se = slice_endpoint(
        "10.1.0.1",
        ready=False,
        serving=True,
        terminating=True,
        node="node-a",
        zone="zone-a",
        zone_hints=("zone-a",),
        node_hints=("node-a",),
    )
    (ep,) = endpoints_for_slices([endpoint_slice("web-a", endpoints=(se,))])[port_name()]
    assert (ep.ready, ep.serving, ep.terminating) == (False, True, True)
    assert (ep.node_name, ep.zone) == ("node-a", "zone-a")
    assert (ep.zone_hints, ep.node_hints) == (frozenset({"zone-a"}), frozenset({"node-a"}))
    assert ep.family is IPFamily.IPv4


@pytest.mark.parametrize("running_first", [True, False], ids=["running-first", "running-last"])
def test_duplicate_ip_port_across_slices_prefers_the_non_terminating_copy(
    running_first: bool,
) -> None:
    """A Pod IP reused while the old Pod terminates: upstream's addEndpoints keeps the
    running Pod's copy, whichever slice comes first, even when it is not ready yet
    (the terminating one still serving): traffic waits for the new Pod, as upstream's."""
    running = slice_endpoint("10.1.0.1", ready=False, node="n1")
    old = slice_endpoint("10.1.0.1", ready=False, serving=True, terminating=True, node="n2")
    a = endpoint_slice("web-a", endpoints=(running if running_first else old,))
    b = endpoint_slice("web-b", endpoints=(old if running_first else running,))
    (ep,) = endpoints_for_slices([a, b])[port_name()]
    assert (ep.terminating, ep.node_name) == (False, "n1")


def test_duplicate_non_terminating_copies_the_later_slice_wins() -> None:
    """An endpoint moving between slices shows up in both for a moment: upstream takes
    whichever its map yields last; here the later slice by name, so every sync agrees."""
    a = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1", ready=True),))
    b = endpoint_slice("web-b", endpoints=(slice_endpoint("10.1.0.1", ready=False),))
    (ep,) = endpoints_for_slices([b, a])[port_name()]
    assert not ep.ready


def test_same_ip_different_ports_are_not_duplicates() -> None:
    a = endpoint_slice(
        "web-a", ports=(("http", TCP, 8080),), endpoints=(slice_endpoint("10.1.0.1"),)
    )
    b = endpoint_slice(
        "web-b", ports=(("http", TCP, 8081),), endpoints=(slice_endpoint("10.1.0.1"),)
    )
    assert _ips(endpoints_for_slices([a, b])[port_name()]) == ["10.1.0.1:8080", "10.1.0.1:8081"]


def test_dual_stack_slices_share_the_service_port() -> None:
    v4 = endpoint_slice("web-v4", endpoints=(slice_endpoint("10.1.0.1"),))
    v6 = endpoint_slice("web-v6", family=IPFamily.IPv6, endpoints=(slice_endpoint("fd00::1"),))
    eps = endpoints_for_slices([v4, v6])[port_name()]
    assert {ep.family for ep in eps} == {IPFamily.IPv4, IPFamily.IPv6}


# ======================================================================= Endpoints tracking


def _ep_synced(*slices: EndpointSlice) -> tuple[EndpointsChangeTracker, EndpointsMap]:
    tracker, eps = EndpointsChangeTracker(), EndpointsMap()
    for slc in slices:
        tracker.update(slc)
    eps.apply(tracker)
    return tracker, eps


def test_slice_add() -> None:
    tracker, eps = EndpointsChangeTracker(), EndpointsMap()
    slc = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1"),))
    assert tracker.update(slc) is True
    assert tracker.pending() == 1
    result = eps.apply(tracker)
    assert result.changed == {port_name()}
    assert _ips(eps[port_name()]) == ["10.1.0.1:8080"]
    assert tracker.pending() == 0


def test_endpoints_kept_without_a_service() -> None:
    # Slices may arrive before their Service; nothing here depends on the Service existing.
    _, eps = _ep_synced(
        endpoint_slice("orphan-a", "orphan", endpoints=(slice_endpoint("10.1.0.1"),))
    )
    assert port_name("orphan") in eps


def test_slice_delete_one_of_two() -> None:
    a = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1"),))
    b = endpoint_slice("web-b", endpoints=(slice_endpoint("10.1.0.2"),))
    tracker, eps = _ep_synced(a, b)
    tracker.update(a, deleted=True)
    result = eps.apply(tracker)
    assert result.changed == {port_name()}
    assert _ips(eps[port_name()]) == ["10.1.0.2:8080"]


def test_slice_delete_last() -> None:
    a = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1"),))
    tracker, eps = _ep_synced(a)
    tracker.update(a, deleted=True)
    result = eps.apply(tracker)
    assert result.changed == {port_name()}
    assert port_name() not in eps


def test_slice_delete_of_duplicate_falls_back_to_other_copy() -> None:
    # The running copy goes away; the terminating copy in the other slice is seen again.
    a = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1", ready=True),))
    b = endpoint_slice(
        "web-b",
        endpoints=(slice_endpoint("10.1.0.1", ready=False, serving=True, terminating=True),),
    )
    tracker, eps = _ep_synced(a, b)
    assert eps[port_name()][0].ready
    tracker.update(a, deleted=True)
    assert eps.apply(tracker).changed == {port_name()}
    (ep,) = eps[port_name()]
    assert ep.terminating


def test_slice_noop_update_is_dropped() -> None:
    a = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1"),))
    tracker, eps = _ep_synced(a)
    assert tracker.update(endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1"),))) is False
    assert tracker.pending() == 0
    assert eps.apply(tracker).changed == set()


def test_slice_add_then_delete_is_dropped() -> None:
    tracker, eps = EndpointsChangeTracker(), EndpointsMap()
    a = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1"),), trigger_time=100.0)
    tracker.update(a)
    assert tracker.update(a, deleted=True) is False
    assert tracker.pending() == 0
    result = eps.apply(tracker)
    assert result.changed == set()
    assert result.trigger_times == {}


def test_delete_of_unknown_slice_is_dropped() -> None:
    tracker = EndpointsChangeTracker()
    assert tracker.update(endpoint_slice("web-a"), deleted=True) is False
    assert tracker.pending() == 0


def test_slice_changes_that_cancel_out_are_not_reported() -> None:
    # Endpoint moves from slice a to slice b between syncs: the merged view is unchanged.
    moved = slice_endpoint("10.1.0.1")
    a = endpoint_slice("web-a", endpoints=(moved,))
    b = endpoint_slice("web-b", endpoints=())
    tracker, eps = _ep_synced(a, b)
    tracker.update(endpoint_slice("web-a", endpoints=()))
    tracker.update(endpoint_slice("web-b", endpoints=(moved,)))
    assert tracker.pending() == 1
    result = eps.apply(tracker)
    assert result.changed == set()
    assert _ips(eps[port_name()]) == ["10.1.0.1:8080"]


@pytest.mark.parametrize(
    "new_endpoint",
    [
        slice_endpoint("10.1.0.1", zone_hints=("zone-b",)),
        slice_endpoint("10.1.0.1", node_hints=("node-a",)),
        slice_endpoint("10.1.0.1", zone_hints=()),
        slice_endpoint("10.1.0.1", zone_hints=("zone-a", "zone-b")),
        slice_endpoint("10.1.0.1", zone_hints=("zone-a",), ready=False),
        slice_endpoint(
            "10.1.0.1", zone_hints=("zone-a",), ready=False, serving=True, terminating=True
        ),
        slice_endpoint("10.1.0.1", zone_hints=("zone-a",), node="node-b"),
    ],
    ids=[
        "zone-hint-changed",
        "node-hint-added",
        "zone-hint-removed",
        "zone-hint-added",
        "became-unready",
        "became-terminating",
        "node-changed",
    ],
)
def test_non_address_changes_are_changes(new_endpoint: SliceEndpoint) -> None:
    # Hints, conditions and locality change endpoint selection even with the same IP:port.
    old = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1", zone_hints=("zone-a",)),))
    tracker, eps = _ep_synced(old)
    new = endpoint_slice("web-a", endpoints=(new_endpoint,))
    assert tracker.update(new) is True
    assert eps.apply(tracker).changed == {port_name()}
    assert eps[port_name()][0] == endpoints_for_slices([new])[port_name()][0]


def test_only_the_affected_port_names_change() -> None:
    ports = (("http", TCP, 8080), ("dns", UDP, 53))
    old = endpoint_slice("web-a", ports=ports, endpoints=(slice_endpoint("10.1.0.1"),))
    other = endpoint_slice("db-a", "db", endpoints=(slice_endpoint("10.2.0.1"),))
    tracker, eps = _ep_synced(old, other)
    # the slice drops its dns port; http keeps the same endpoints
    tracker.update(
        endpoint_slice("web-a", ports=ports[:1], endpoints=(slice_endpoint("10.1.0.1"),))
    )
    result = eps.apply(tracker)
    assert result.changed == {port_name(port="dns", protocol=UDP)}
    assert port_name(port="dns", protocol=UDP) not in eps
    assert port_name("db") in eps


def test_checkout_returns_before_and_after() -> None:
    a = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1"),))
    tracker, _ = _ep_synced(a)
    tracker.update(endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.2"),)))
    changes, _times = tracker.checkout()
    before, after = changes[WEB]
    assert _ips(before[port_name()]) == ["10.1.0.1:8080"]
    assert _ips(after[port_name()]) == ["10.1.0.2:8080"]


def test_before_is_the_previous_after_not_merged_again() -> None:
    # Merging a Service's slices again for "before" cost half of the collect phase under
    # churn (bench.soak): the last checkout's merge is kept and handed back as is, and a
    # Service whose slices are all gone leaves nothing behind.
    tracker, _ = _ep_synced(endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1"),)))
    tracker.update(endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.2"),)))
    first, _ = tracker.checkout()
    tracker.update(endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.3"),)))
    second, _ = tracker.checkout()
    assert second[WEB][0] is first[WEB][1]
    assert _ips(second[WEB][1][port_name()]) == ["10.1.0.3:8080"]
    tracker.update(endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.3"),)), deleted=True)
    third, _ = tracker.checkout()
    assert third[WEB] == (second[WEB][1], {})
    tracker.update(endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.4"),)))
    fourth, _ = tracker.checkout()
    assert fourth[WEB][0] == {}


# ---------------------------------------------------------------- UDP conntrack bookkeeping

UDP_DNS = port_name(port="dns", protocol=UDP)
DNS_PORTS = (("dns", UDP, 53),)


def _udp(*endpoints: SliceEndpoint) -> EndpointSlice:
    return endpoint_slice("web-a", ports=DNS_PORTS, endpoints=endpoints)


@pytest.mark.parametrize(
    ("old", "new", "deleted_ips", "newly_active"),
    [
        # removed endpoints keep conntrack entries steering UDP flows to them
        (
            (slice_endpoint("10.1.0.1"), slice_endpoint("10.1.0.2")),
            (slice_endpoint("10.1.0.2"),),
            {"10.1.0.1"},
            False,
        ),
        # ...and so do endpoints that stay listed but can no longer receive traffic
        (
            (slice_endpoint("10.1.0.1"),),
            (slice_endpoint("10.1.0.1", ready=False),),
            {"10.1.0.1"},
            False,
        ),
        # an endpoint that never received traffic has no entries to flush
        ((slice_endpoint("10.1.0.1", ready=False),), (), set(), False),
        # ready -> serving+terminating: still used (fallback), keep its flows
        (
            (slice_endpoint("10.1.0.1"),),
            (slice_endpoint("10.1.0.1", ready=False, serving=True, terminating=True),),
            set(),
            False,
        ),
        # 0 -> 1 usable: flush entries that black-holed traffic to the endpoint-less VIP
        ((), (slice_endpoint("10.1.0.1"),), set(), True),
        ((slice_endpoint("10.1.0.1", ready=False),), (slice_endpoint("10.1.0.1"),), set(), True),
        # terminating-but-serving endpoints already received traffic: not "newly active"
        # (flushing would cut the flows being drained)
        (
            (slice_endpoint("10.1.0.1", ready=False, serving=True, terminating=True),),
            (
                slice_endpoint("10.1.0.1", ready=False, serving=True, terminating=True),
                slice_endpoint("10.1.0.2"),
            ),
            set(),
            False,
        ),
        # nothing -> only terminating-but-serving: traffic now flows (fallback)
        (
            (),
            (slice_endpoint("10.1.0.1", ready=False, serving=True, terminating=True),),
            set(),
            True,
        ),
        # ready -> unready endpoint with a new ready one: the old one is flushed
        (
            (slice_endpoint("10.1.0.1"),),
            (slice_endpoint("10.1.0.1", ready=False), slice_endpoint("10.1.0.2")),
            {"10.1.0.1"},
            False,
        ),
    ],
    ids=[
        "removed",
        "became-unusable",
        "unusable-removed",
        "became-terminating",
        "first-endpoint",
        "became-ready",
        "terminating-to-ready",
        "first-terminating",
        "replaced",
    ],
)
def test_udp_stale_conntrack_detection(
    old: tuple[SliceEndpoint, ...],
    new: tuple[SliceEndpoint, ...],
    deleted_ips: set[str],
    newly_active: bool,
) -> None:
    tracker, eps = _ep_synced(_udp(*old)) if old else (EndpointsChangeTracker(), EndpointsMap())
    tracker.update(_udp(*new))
    result = eps.apply(tracker)
    assert {ep.ip for name, ep in result.deleted_udp_endpoints} == deleted_ips
    assert all(name == UDP_DNS for name, _ in result.deleted_udp_endpoints)
    assert (UDP_DNS in result.newly_active_udp) is newly_active


def test_udp_bookkeeping_ignores_tcp() -> None:
    tracker, eps = _ep_synced(endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1"),)))
    tracker.update(endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.2"),)))
    result = eps.apply(tracker)
    assert result.deleted_udp_endpoints == set()
    assert result.newly_active_udp == set()


def test_udp_slice_delete_reports_every_endpoint() -> None:
    slc = _udp(slice_endpoint("10.1.0.1"), slice_endpoint("10.1.0.2"))
    tracker, eps = _ep_synced(slc)
    tracker.update(slc, deleted=True)
    result = eps.apply(tracker)
    assert {(n, ep.ip) for n, ep in result.deleted_udp_endpoints} == {
        (UDP_DNS, "10.1.0.1"),
        (UDP_DNS, "10.1.0.2"),
    }


# ----------------------------------------------------------------------------- trigger times


def test_trigger_times_reported_only_for_changed_services() -> None:
    web = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1"),))
    db = endpoint_slice("db-a", "db", endpoints=(slice_endpoint("10.2.0.1"),))
    tracker, eps = _ep_synced(web, db)
    tracker.update(
        endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.2"),), trigger_time=10.0)
    )
    tracker.update(
        endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.3"),), trigger_time=11.0)
    )
    # db's slice changed only in its annotation: pending, but no endpoint changed
    tracker.update(
        endpoint_slice("db-a", "db", endpoints=(slice_endpoint("10.2.0.1"),), trigger_time=12.0)
    )
    result = eps.apply(tracker)
    assert result.changed == {port_name()}
    assert result.trigger_times == {WEB: [(IPFamily.IPv4, 10.0), (IPFamily.IPv4, 11.0)]}


def test_trigger_times_cleared_after_apply() -> None:
    tracker, eps = EndpointsChangeTracker(), EndpointsMap()
    tracker.update(
        endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1"),), trigger_time=5.0)
    )
    assert eps.apply(tracker).trigger_times == {WEB: [(IPFamily.IPv4, 5.0)]}
    tracker.update(endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.2"),)))
    assert eps.apply(tracker).trigger_times == {}


# ================================================================ dispatch (model.events)


def test_dispatch_slice_moved_to_another_service_leaves_the_old_one() -> None:
    state = ProxyState("node-a")
    old = endpoint_slice("shared", "web", endpoints=(slice_endpoint("10.1.0.1"),))
    dispatch(state, [Event.added(old)])
    state.collect()
    # The service-name label changed: same slice object, different owner.
    new = endpoint_slice("shared", "db", endpoints=(slice_endpoint("10.1.0.1"),))
    assert dispatch(state, [Event.modified(old, new)]) is True
    snapshot, changes = state.collect()
    assert port_name("web") not in snapshot.endpoints
    assert _ips(snapshot.endpoints[port_name("db")]) == ["10.1.0.1:8080"]
    assert changes.service_ports == {port_name("web"), port_name("db")}


def test_dispatch_slice_moved_before_first_sync() -> None:
    state = ProxyState("node-a")
    old = endpoint_slice("shared", "web", endpoints=(slice_endpoint("10.1.0.1"),))
    new = endpoint_slice("shared", "db", endpoints=(slice_endpoint("10.1.0.1"),))
    dispatch(state, [Event.added(old), Event.modified(old, new)])
    snapshot, _ = state.collect()
    assert set(snapshot.endpoints) == {port_name("db")}


def test_dispatch_services_and_slice_delete() -> None:
    state = ProxyState("node-a")
    svc = service("web", service_port(port="http"))
    slc = endpoint_slice("web-a", endpoints=(slice_endpoint("10.1.0.1"),))
    dispatch(state, [Event.added(svc), Event.added(slc)])
    snapshot, changes = state.collect()
    assert set(snapshot.services) == {port_name()}
    assert changes.service_ports == {port_name()}
    assert dispatch(state, [Event.deleted(svc), Event.deleted(slc)]) is True
    snapshot, changes = state.collect()
    assert (dict(snapshot.services), dict(snapshot.endpoints)) == ({}, {})
    assert state.pending is False


def _node(name: str, zone: str, ip: str) -> Node:
    return Node(name, labels=((LABEL_ZONE, zone),), addresses=(NodeAddress("InternalIP", ip),))


def test_dispatch_only_this_node_matters() -> None:
    state = ProxyState("node-a")
    dispatch(
        state,
        [
            Event.added(_node("node-a", "zone-a", "10.0.0.1")),
            Event.added(_node("node-b", "zone-b", "10.0.0.2")),
        ],
    )
    snapshot, changes = state.collect()
    assert (snapshot.node.zone, snapshot.node.primary_ips[IPFamily.IPv4]) == ("zone-a", "10.0.0.1")
    # Deleting (or changing) another node must not touch what we know about ours.
    assert dispatch(state, [Event.deleted(_node("node-b", "zone-b", "10.0.0.2"))]) is False
    snapshot, changes = state.collect()
    assert not changes.node_changed
    assert snapshot.node.zone == "zone-a"
    assert snapshot.node.primary_ips == {IPFamily.IPv4: "10.0.0.1"}


def test_dispatch_this_node_modified_and_deleted() -> None:
    state = ProxyState("node-a")
    a1, a2 = _node("node-a", "zone-a", "10.0.0.1"), _node("node-a", "zone-b", "10.0.0.1")
    dispatch(state, [Event.added(a1)])
    state.collect()
    assert dispatch(state, [Event.modified(a1, a2)]) is True
    snapshot, changes = state.collect()
    assert changes.node_changed and snapshot.node.zone == "zone-b"
    dispatch(state, [Event.deleted(a2)])
    snapshot, changes = state.collect()
    assert changes.node_changed and snapshot.node.zone is None
