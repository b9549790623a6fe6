"""kubeproxy.dataplane.conntrack: which stale entries a sync must clear, and clearing them.

The sync results come from the real change trackers (through ProxyState), so the tests
check the whole path from Service/EndpointSlice events to conntrack filters.
"""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from kubeproxy.dataplane.conntrack import (
    LIST_ABOVE,
    ConntrackCommand,
    ConntrackError,
    Entry,
    FakeConntrack,
    Filter,
    apply,
    parse_listing,
    reconcile,
    stale_conntrack_filters,
)
from kubeproxy.model.state import Changes, ProxyState, Snapshot
from kubeproxy.model.types import (
    EndpointSlice,
    IPFamily,
    L4Protocol,
    Service,
    ServicePort,
    SliceEndpoint,
)
from tests.unit.conftest import endpoint_slice, service, service_port, slice_endpoint

UDP, TCP = L4Protocol.UDP, L4Protocol.TCP
V4, V6 = IPFamily.IPv4, IPFamily.IPv6


def dns_port(**kwargs: object) -> ServicePort:
    spec: dict[str, object] = {"number": 53, "cluster_ips": ("10.96.0.10",)}
    spec.update(kwargs)
    return service_port("dns", "dns", UDP, **spec)  # type: ignore[arg-type]


def dns_slice(
    *endpoints: SliceEndpoint, family: IPFamily = V4, protocol: L4Protocol = UDP
) -> EndpointSlice:
    return endpoint_slice(
        f"dns-{family.value.lower()}",
        "dns",
        ports=(("dns", protocol, 5353),),
        endpoints=endpoints,
        family=family,
    )


class Cluster:
    """A ProxyState fed with events; ``sync()`` returns what a sync would see."""

    def __init__(self) -> None:
        self.state = ProxyState("node-a")
        self.services: dict[str, Service] = {}

    def put_service(self, svc: Service) -> None:
        self.state.on_service(self.services.get(svc.name), svc)
        self.services[svc.name] = svc

    def delete_service(self, name: str) -> None:
        self.state.on_service(self.services.pop(name), None)

    def put_slice(self, eps: EndpointSlice) -> None:
        self.state.on_endpoint_slice(eps)

    def sync(self) -> tuple[Snapshot, Changes]:
        return self.state.collect()

    def filters(self, family: IPFamily = V4) -> list[Filter]:
        snapshot, changes = self.sync()
        return stale_conntrack_filters(
            snapshot.services, snapshot.endpoints, changes.services, changes.endpoints, family
        )


def synced(svc: Service, *slices: EndpointSlice) -> Cluster:
    cluster = Cluster()
    cluster.put_service(svc)
    for eps in slices:
        cluster.put_slice(eps)
    cluster.sync()
    return cluster


# ------------------------------------------------------------------------- filters


def test_filter_arguments_for_the_conntrack_tool() -> None:
    assert Filter.for_ip("10.96.0.10", UDP).args() == [
        "-D",
        "-f",
        "ipv4",
        "-p",
        "udp",
        "--orig-dst",
        "10.96.0.10",
    ]
    assert Filter.for_port(30053, V6, L4Protocol.SCTP).args() == [
        "-D",
        "-f",
        "ipv6",
        "-p",
        "sctp",
        "--orig-port-dst",
        "30053",
    ]
    assert Filter.for_nat("fd00::10", "fd00:1::5", UDP, 53).args()[-6:] == [
        "--orig-dst",
        "fd00::10",
        "--orig-port-dst",
        "53",
        "--reply-src",
        "fd00:1::5",
    ]
    assert Filter.for_port_nat(30053, "10.1.0.5", UDP).family is V4


def test_filters_refuse_what_would_delete_too_much_or_the_wrong_family() -> None:
    with pytest.raises(ValueError, match="needs an address or a port"):
        Filter(V4, UDP)
    with pytest.raises(ValueError, match="not an IPv4 address"):
        Filter(V4, UDP, orig_dst="fd00::1")
    with pytest.raises(ValueError, match="not an IPv6 address"):
        Filter.for_nat("fd00::1", "10.0.0.1", UDP)
    with pytest.raises(ValueError, match="invalid port"):
        Filter.for_port(0, V4, UDP)


# ------------------------------------------------------------------- what to clear


def test_a_deleted_udp_service_or_port_is_left_to_its_timeouts() -> None:
    """As upstream's reconciler, which looks only at the ServicePorts that exist."""
    cluster = synced(
        service("dns", dns_port(cluster_ips=("10.96.0.10", "fd00:96::10"))),
        dns_slice(slice_endpoint("10.1.0.5")),
    )
    cluster.delete_service("dns")
    assert cluster.filters(V4) == []
    cluster = synced(service("dns", dns_port()), dns_slice(slice_endpoint("10.1.0.5")))
    cluster.delete_service("dns")
    cluster.put_slice(dns_slice())
    assert cluster.filters() == []


def test_a_removed_endpoint_clears_flows_natted_to_it_on_every_service_address() -> None:
    port = dns_port(
        node_port=30053,
        external_ips=("192.0.2.10", "2001:db8::10"),
        load_balancer_ips=("198.51.100.7",),
    )
    cluster = synced(
        service("dns", port), dns_slice(slice_endpoint("10.1.0.5"), slice_endpoint("10.1.0.6"))
    )
    cluster.put_slice(dns_slice(slice_endpoint("10.1.0.6")))
    gone = {"endpoint_port": 5353}
    assert cluster.filters() == [
        Filter.for_port_nat(30053, "10.1.0.5", UDP, **gone),  # type: ignore[arg-type]
        Filter.for_nat("10.96.0.10", "10.1.0.5", UDP, 53, **gone),  # type: ignore[arg-type]
        Filter.for_nat("192.0.2.10", "10.1.0.5", UDP, 53, **gone),  # type: ignore[arg-type]
        Filter.for_nat("198.51.100.7", "10.1.0.5", UDP, 53, **gone),  # type: ignore[arg-type]
    ]


def test_the_last_endpoint_gone_leaves_nodeport_flows_alone() -> None:
    """Upstream matches NodePort flows by port only (they could be anybody's): with no
    serving endpoint left it does not touch them."""
    cluster = synced(
        service("dns", dns_port(node_port=30053)), dns_slice(slice_endpoint("10.1.0.5"))
    )
    cluster.put_slice(dns_slice())
    assert cluster.filters() == [
        Filter.for_nat("10.96.0.10", "10.1.0.5", UDP, 53, endpoint_port=5353)
    ]


def test_an_endpoint_that_stops_serving_is_cleared_but_a_draining_one_is_not() -> None:
    cluster = synced(
        service("dns", dns_port()),
        dns_slice(slice_endpoint("10.1.0.5"), slice_endpoint("10.1.0.6")),
    )
    cluster.put_slice(
        dns_slice(
            slice_endpoint("10.1.0.5", ready=False, serving=False),
            slice_endpoint("10.1.0.6", ready=False, serving=True, terminating=True),
        )
    )
    # 10.1.0.6 still serves (terminating): its flows are left alone.
    assert cluster.filters() == [
        Filter.for_nat("10.96.0.10", "10.1.0.5", UDP, 53, endpoint_port=5353)
    ]


def test_an_endpoints_new_port_keeps_the_flows_to_it() -> None:
    cluster = synced(service("dns", dns_port()), dns_slice(slice_endpoint("10.1.0.5")))
    moved = endpoint_slice(
        "dns-ipv4",
        "dns",
        ports=(("dns", UDP, 5354),),
        endpoints=(slice_endpoint("10.1.0.5"),),
    )
    cluster.put_slice(moved)
    assert cluster.filters() == [
        Filter.for_nat("10.96.0.10", "10.1.0.5", UDP, 53, endpoint_port=5353)
    ]


def test_first_serving_endpoint_clears_flows_cached_while_there_was_none() -> None:
    port = dns_port(node_port=30053, external_ips=("192.0.2.10",))
    cluster = synced(service("dns", port), dns_slice())
    cluster.put_slice(dns_slice(slice_endpoint("10.1.0.5")))
    # Flows not NATed: the Service IP itself answered them.
    assert cluster.filters() == [
        Filter.for_nat("10.96.0.10", "10.96.0.10", UDP, 53),
        Filter.for_nat("192.0.2.10", "192.0.2.10", UDP, 53),
        Filter.for_port(30053, V4, UDP),
    ]
    # Another endpoint joining later is not "newly active": nothing to clear.
    cluster.put_slice(dns_slice(slice_endpoint("10.1.0.5"), slice_endpoint("10.1.0.6")))
    assert cluster.filters() == []


def test_a_service_change_clears_flows_not_natted_to_its_addresses() -> None:
    """A new external IP: flows to it cached before it was one were not NATed."""
    cluster = synced(service("dns", dns_port()), dns_slice(slice_endpoint("10.1.0.5")))
    cluster.put_service(service("dns", dns_port(external_ips=("192.0.2.10",))))
    assert cluster.filters() == [
        Filter.for_nat("10.96.0.10", "10.96.0.10", UDP, 53),
        Filter.for_nat("192.0.2.10", "192.0.2.10", UDP, 53),
    ]


def test_tcp_services_and_other_families_need_no_cleanup() -> None:
    tcp = service("web", service_port("web", "http", TCP, cluster_ips=("10.96.0.20",)))
    cluster = synced(
        tcp,
        endpoint_slice("web-1", "web", endpoints=(slice_endpoint("10.1.0.7"),)),
    )
    cluster.put_slice(endpoint_slice("web-1", "web", endpoints=()))
    cluster.delete_service("web")
    assert cluster.filters() == []

    dual = synced(
        service("dns", dns_port(cluster_ips=("10.96.0.10", "fd00:96::10"))),
        dns_slice(slice_endpoint("10.1.0.5")),
        dns_slice(slice_endpoint("fd00:1::5"), family=V6),
    )
    dual.put_slice(dns_slice(family=V6))
    snapshot, changes = dual.sync()
    args = (snapshot.services, snapshot.endpoints, changes.services, changes.endpoints)
    assert stale_conntrack_filters(*args, V4) == []
    assert stale_conntrack_filters(*args, V6) == [
        Filter.for_nat("fd00:96::10", "fd00:1::5", UDP, 53, endpoint_port=5353)
    ]


def test_the_start_up_reconcile_deletes_what_upstreams_reconciler_deletes() -> None:
    """The whole table at the first sync: flows to a UDP frontend not going to one of
    its serving endpoints. Flows to serving endpoints (a restart), to addresses no UDP
    Service has, and of other protocols stay."""
    port = dns_port(node_port=30053, external_ips=("192.0.2.10",))
    empty = service_port("idle", "dns", UDP, number=53, cluster_ips=("10.96.0.11",))
    cluster = synced(service("dns", port), dns_slice(slice_endpoint("10.1.0.5")))
    cluster.put_service(service("idle", empty))
    snapshot, _ = cluster.sync()
    keep = [
        entry("10.96.0.10", 53, "10.1.0.5", reply_port=5353),
        entry("192.0.2.10", 53, "10.1.0.5", reply_port=5353, sport=40001),
        entry("192.168.50.1", 30053, "10.1.0.5", reply_port=5353, sport=40002),
        entry("10.96.0.99", 53, "10.1.0.9", reply_port=53, sport=40003),  # no Service
        Entry(V4, TCP, "10.1.0.100", "10.96.0.10", 40004, 53, "10.1.0.8", 5353),
    ]
    stale = [
        entry("10.96.0.10", 53, "10.1.0.8", reply_port=5353, sport=40005),  # endpoint gone
        entry("10.96.0.10", 53, "10.1.0.5", reply_port=5354, sport=40006),  # its old port
        entry("10.96.0.10", 53, "10.96.0.10", reply_port=53, sport=40007),  # not NATed
        entry("192.168.50.1", 30053, "10.1.0.8", reply_port=5353, sport=40008),
        entry("10.96.0.11", 53, "10.1.0.8", reply_port=5353, sport=40009),  # none serve
        entry("10.96.0.10", 53, "10.1.0.8", reply_port=5353, sport=40010),  # same as the 1st
    ]
    filters = reconcile(snapshot.services, snapshot.endpoints, V4, keep + stale)
    assert filters == [Filter.for_entry(e) for e in stale[:5]]
    fake = FakeConntrack(keep + stale)
    assert apply(fake, filters).deleted == len(stale)
    assert fake.table == keep


# ------------------------------------------------------------------------ clearing


def entry(
    dst: str, dport: int, reply_src: str, sport: int = 40000, reply_port: int = 5353
) -> Entry:
    return Entry(V4, UDP, "10.1.0.100", dst, sport, dport, reply_src, reply_port)


def test_apply_clears_matching_entries_and_goes_on_after_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    to_removed = entry("10.96.0.10", 53, "10.1.0.5")
    to_live = entry("10.96.0.10", 53, "10.1.0.6", sport=40001)
    nodeport = entry("192.168.50.1", 30053, "10.1.0.5", sport=40002)
    other_port = entry("10.96.0.10", 54, "10.1.0.5", sport=40003)
    to_refused = entry("10.96.0.99", 53, "10.1.0.9", sport=40004)
    refused = Filter.for_ip("10.96.0.99", UDP, reason="test")
    fake = FakeConntrack([to_removed, to_live, nodeport, other_port, to_refused], refuse={refused})
    result = apply(
        fake,
        [
            refused,
            Filter.for_nat("10.96.0.10", "10.1.0.5", UDP, 53),
            Filter.for_port_nat(30053, "10.1.0.5", UDP),
        ],
    )
    assert result.deleted == 2
    assert [f for f, _ in result.failed] == [refused]
    assert fake.table == [to_live, other_port, to_refused]
    assert "Failed to clear stale conntrack entries (test)" in caplog.text
    assert caplog.records[0].levelno == logging.ERROR


def test_apply_lists_once_and_runs_only_the_filters_that_match_an_entry() -> None:
    # The churn soak's case: thousands of removed UDP endpoints in one sync, one flow.
    flow = entry("10.96.0.10", 53, "10.1.0.5")
    filters = [
        Filter.for_nat("10.96.0.10", f"10.1.{k // 250}.{k % 250}", UDP, 53) for k in range(2000)
    ]
    filters += [Filter.for_port_nat(30053, "10.1.0.5", UDP), Filter.for_ip("fd00::10", UDP)]
    v6 = Entry(V6, UDP, "fd00::1", "fd00::10", 40000, 53, "fd00::5")
    fake = FakeConntrack([flow, v6])
    result = apply(fake, filters)
    assert fake.cleared == [filters[5], filters[-1]]  # 10.1.0.5, fd00::10
    assert result.deleted == 2 and fake.table == []
    assert fake.listed == 1  # IPv4's 2,001 filters; IPv6's one runs without a listing


def test_apply_runs_every_filter_when_the_table_cannot_be_listed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    filters = [Filter.for_ip(f"10.96.0.{k}", UDP) for k in range(10, 10 + LIST_ABOVE + 1)]
    fake = FakeConntrack([entry("10.96.0.10", 53, "10.1.0.5")], refuse_listing=True)
    assert apply(fake, filters).deleted == 1
    assert fake.cleared == filters
    assert "Cannot list conntrack entries" in caplog.text


def test_apply_runs_a_few_filters_without_listing_the_table() -> None:
    # A busy node's table is large (DNS): a few deletions cost less than a listing.
    filters = [Filter.for_ip("10.96.0.10", UDP), Filter.for_ip("10.96.0.11", UDP)]
    fake = FakeConntrack([entry("10.96.0.10", 53, "10.1.0.5")])
    assert apply(fake, filters).deleted == 1
    assert fake.cleared == filters and fake.listed == 0


def test_the_listing_is_parsed_per_family() -> None:
    v4 = (
        "udp      17 29 src=10.1.0.100 dst=10.96.0.10 sport=40000 dport=53 [UNREPLIED] "
        "src=10.1.0.5 dst=10.1.0.100 sport=5353 dport=40000 mark=0 use=1\n"
        "conntrack v1.4.7 (conntrack-tools): 1 flow entries have been shown.\n"
    )
    assert parse_listing(v4, V4, UDP) == [entry("10.96.0.10", 53, "10.1.0.5")]
    v6 = (
        "udp      17 29 src=fd00::1 dst=fd00::10 sport=1 dport=53 src=fd00::5 dst=fd00::1 "
        "sport=5353 dport=1 [ASSURED] mark=0 use=1\n"
    )
    assert parse_listing(v6, V6, UDP) == [
        Entry(V6, UDP, "fd00::1", "fd00::10", 1, 53, "fd00::5", 5353)
    ]


def fake_tool(tmp_path: Path, output: str, status: int) -> str:
    """A stand-in ``conntrack`` executable printing ``output`` and exiting ``status``."""
    tool = tmp_path / "conntrack"
    tool.write_text(
        f"#!/bin/sh\necho \"$*\" > {tmp_path}/args\necho '{output}' >&2\nexit {status}\n"
    )
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return str(tool)


def test_the_command_reads_the_tools_counts_and_errors(tmp_path: Path) -> None:
    flt = Filter.for_nat("10.96.0.10", "10.1.0.5", UDP, 53)
    deleted = fake_tool(
        tmp_path, "conntrack v1.4.7 (conntrack-tools): 3 flow entries have been deleted.", 0
    )
    assert ConntrackCommand(deleted).clear(flt) == 3
    assert (tmp_path / "args").read_text().split() == flt.args()
    # Nothing matched: the tool exits 1, which is not an error.
    none = fake_tool(
        tmp_path, "conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.", 1
    )
    assert ConntrackCommand(none).clear(flt) == 0
    broken = fake_tool(tmp_path, "conntrack v1.4.7 (conntrack-tools): Operation not permitted", 1)
    with pytest.raises(ConntrackError, match="Operation not permitted"):
        ConntrackCommand(broken).clear(flt)
    with pytest.raises(ConntrackError, match="not found"):
        ConntrackCommand(str(tmp_path / "missing")).clear(flt)
    hung = tmp_path / "hung"
    hung.write_text("#!/bin/sh\nexec sleep 30\n")
    hung.chmod(0o755)
    with pytest.raises(ConntrackError, match=r"did not finish within 0\.5s and was killed"):
        ConntrackCommand(str(hung), timeout=0.5).clear(flt)
