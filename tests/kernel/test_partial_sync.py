"""Partial syncs: small transactions that end exactly where a full sync would.

The central check is a Hypothesis state machine: random Service/endpoint changes are
applied with partial syncs to one network namespace, while a fresh backend does a full
sync of the same snapshot into a second, empty namespace; after every step both kernels
must hold the same tables (compared from nft's JSON listing, element order ignored).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from kubeproxy.backends.nftables.proxier import NftablesBackend, cleanup
from kubeproxy.config import ProxyConfig
from kubeproxy.dataplane.nftables.runner import NftCommand
from kubeproxy.lab.cluster import Lab
from kubeproxy.lab.echo import tcp_ask
from kubeproxy.lab.netns import add_netns, delete_netns, list_netns, ns_exec
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import (
    Endpoint,
    IPFamily,
    L4Protocol,
    NamespacedName,
    ServicePort,
    ServicePortName,
    TrafficPolicy,
)
from tests.kernel.conftest import ip

CONFIG = ProxyConfig(
    hostname="node-a",
    families=(IPFamily.IPv4, IPFamily.IPv6),
    cluster_cidrs=("10.244.0.0/16", "fd00:10:244::/56"),
    service_cidrs=("10.96.0.0/16",),
)
NODE = NodeState("node-a", "zone-a", {IPFamily.IPv4: "192.168.50.1", IPFamily.IPv6: "fd00:50::1"})


def normalized(ns: str) -> dict[str, Any]:
    """Everything in the namespace's ruleset, independent of element and handle order."""
    data = json.loads(ns_exec(ns, "nft", "-j", "list", "ruleset"))["nftables"]
    out: dict[str, Any] = {}
    for item in data:
        for kind, raw in item.items():
            if kind == "metainfo":
                continue
            obj = {k: v for k, v in raw.items() if k != "handle"}
            if kind == "rule":
                key = f"rules {obj['family']} {obj['chain']}"
                out.setdefault(key, []).append(json.dumps(obj["expr"], sort_keys=True))
            else:
                if "elem" in obj:
                    obj["elem"] = sorted(json.dumps(e, sort_keys=True) for e in obj["elem"])
                out[f"{kind} {obj.get('family')} {obj.get('name')}"] = obj
    return out


def port_name(i: int, proto: L4Protocol = L4Protocol.TCP) -> ServicePortName:
    return ServicePortName(NamespacedName("default", f"s{i}"), "p", proto)


services = st.builds(
    lambda vip, port, np, etp, itp, aff, ext, lb, ranges, v6: {
        "cluster_ips": (f"10.96.0.{vip}", f"fd00:10:96::{vip}") if v6 else (f"10.96.0.{vip}",),
        "port": port,
        "node_port": np,
        "external_traffic_policy": etp,
        "internal_traffic_policy": itp,
        "affinity_timeout": aff,
        "external_ips": ext,
        "load_balancer_ips": lb,
        "load_balancer_source_ranges": ranges,
    },
    st.integers(1, 4),
    st.sampled_from([80, 443]),
    st.sampled_from([0, 30001, 30002]),
    st.sampled_from(list(TrafficPolicy)),
    st.sampled_from(list(TrafficPolicy)),
    st.sampled_from([None, None, 60, 120]),
    st.sampled_from([(), ("203.0.113.1",)]),
    st.sampled_from([(), ("198.51.100.1",)]),
    st.sampled_from([(), ("10.0.0.0/8", "10.1.0.0/16"), ("192.168.50.0/24",)]),
    st.booleans(),
)
endpoint = st.builds(
    lambda i, node, ready, term, port: Endpoint(
        ip=f"10.244.{1 if node == 'node-a' else 2}.{i}",
        port=port,
        node_name=node,
        ready=ready,
        serving=True,
        terminating=term,
    ),
    st.integers(1, 6),
    st.sampled_from(["node-a", "node-b"]),
    st.booleans(),
    st.booleans(),
    st.sampled_from([8080, 9090]),
)


class PartialVersusFull(RuleBasedStateMachine):
    lab: Lab  # set by the test

    @initialize()
    def start(self) -> None:
        self.partial_ns = f"{self.lab.prefix}-partial"
        self.full_ns = f"{self.lab.prefix}-full"
        for ns in (self.partial_ns, self.full_ns):
            delete_netns(ns)
            add_netns(ns)
        self.backend = NftablesBackend(CONFIG, NftCommand(netns=self.partial_ns))
        self.services: dict[ServicePortName, ServicePort] = {}
        self.endpoints: dict[ServicePortName, tuple[Endpoint, ...]] = {}
        self.synced = False

    def teardown(self) -> None:
        for ns in (getattr(self, "partial_ns", None), getattr(self, "full_ns", None)):
            if ns:
                delete_netns(ns)

    def _sync(self, changed: set[ServicePortName]) -> None:
        snap = Snapshot(dict(self.services), dict(self.endpoints), NODE)
        result = self.backend.sync(snap, changed if self.synced else None)
        # A partial sync must never need the full-sync fallback.
        assert result.full is not self.synced, self.backend.last_transaction
        self.synced = True
        fresh = NftablesBackend(CONFIG, NftCommand(netns=self.full_ns))
        cleanup(fresh.runner)
        fresh.sync(snap, None)
        assert normalized(self.partial_ns) == normalized(self.full_ns)

    @rule(
        i=st.integers(0, 5), proto=st.sampled_from([L4Protocol.TCP, L4Protocol.UDP]), spec=services
    )
    def put_service(self, i: int, proto: L4Protocol, spec: dict[str, Any]) -> None:
        name = port_name(i, proto)
        self.services[name] = ServicePort(name=name, **spec)
        self._sync({name})

    @rule(
        changes=st.lists(
            st.tuples(
                st.integers(0, 5), st.sampled_from([L4Protocol.TCP, L4Protocol.UDP]), services
            ),
            min_size=2,
            max_size=4,
            unique_by=lambda c: (c[0], c[1]),
        ),
        drop=st.sets(st.integers(0, 5), max_size=2),
    )
    def change_several(
        self, changes: list[tuple[int, L4Protocol, dict[str, Any]]], drop: set[int]
    ) -> None:
        # Several ServicePorts in one partial sync: two of them may now claim (or stop
        # claiming) the same destination, a new one may win a destination from an
        # existing one.
        changed = set()
        for i, proto, spec in changes:
            name = port_name(i, proto)
            self.services[name] = ServicePort(name=name, **spec)
            changed.add(name)
        for i in drop:
            name = port_name(i)
            self.services.pop(name, None)
            self.endpoints.pop(name, None)
            changed.add(name)
        self._sync(changed)

    @rule(i=st.integers(0, 5), proto=st.sampled_from([L4Protocol.TCP, L4Protocol.UDP]))
    def delete_service(self, i: int, proto: L4Protocol) -> None:
        name = port_name(i, proto)
        self.services.pop(name, None)
        self.endpoints.pop(name, None)
        self._sync({name})

    @rule(
        i=st.integers(0, 5),
        proto=st.sampled_from([L4Protocol.TCP, L4Protocol.UDP]),
        eps=st.lists(endpoint, max_size=4, unique_by=lambda e: (e.ip, e.port)),
    )
    def set_endpoints(self, i: int, proto: L4Protocol, eps: list[Endpoint]) -> None:
        name = port_name(i, proto)
        self.endpoints[name] = tuple(eps)
        self._sync({name})

    @rule()
    def periodic_full_resync(self) -> None:
        # A full sync over a live table (flush + re-add) must land on the same state too.
        snap = Snapshot(dict(self.services), dict(self.endpoints), NODE)
        assert self.backend.sync(snap, None).full
        # The flush-and-re-add path, not the fallback that replaces the table.
        assert "delete table" not in self.backend.last_transaction
        fresh = NftablesBackend(CONFIG, NftCommand(netns=self.full_ns))
        cleanup(fresh.runner)
        fresh.sync(snap, None)
        assert normalized(self.partial_ns) == normalized(self.full_ns)

    @rule(i=st.integers(0, 5), proto=st.sampled_from([L4Protocol.TCP, L4Protocol.UDP]))
    def move_to_other_address(self, i: int, proto: L4Protocol) -> None:
        name = port_name(i, proto)
        if name in self.services:
            svc = self.services[name]
            self.services[name] = replace(svc, cluster_ips=(f"10.96.1.{i}",))
            self._sync({name})


def test_partial_syncs_match_a_full_sync(lab: Lab) -> None:
    PartialVersusFull.lab = lab
    machine = settings(
        max_examples=25,
        stateful_step_count=12,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )(PartialVersusFull)
    machine.TestCase().runTest()
    assert not [
        ns
        for ns in list_netns()
        if ns.startswith(f"{lab.prefix}-") and ns.endswith(("-partial", "-full"))
    ]


# ------------------------------------------------------------------- one change


def snapshot(n: int, extra_endpoint: bool = False) -> Snapshot:
    svcs = {}
    eps = {}
    for i in range(n):
        name = port_name(i)
        svcs[name] = ServicePort(
            name=name, cluster_ips=(f"10.96.{i // 250}.{i % 250 + 1}",), port=80
        )
        eps[name] = tuple(Endpoint(f"10.244.2.{j + 10}", 8080, "node-b") for j in range(3))
    if extra_endpoint:
        first = port_name(0)
        eps[first] = (*eps[first], Endpoint("10.244.2.99", 8080, "node-b"))
    return Snapshot(svcs, eps, NODE)


@pytest.fixture
def scratch(lab: Lab) -> Any:
    ns = f"{lab.prefix}-scratch"
    delete_netns(ns)
    add_netns(ns)
    yield ns
    delete_netns(ns)


def test_a_change_touches_only_the_changed_service(scratch: str) -> None:
    backend = NftablesBackend(CONFIG, NftCommand(netns=scratch))
    assert backend.sync(snapshot(50), None).full
    result = backend.sync(snapshot(50, extra_endpoint=True), {port_name(0)})
    assert not result.full
    tx = backend.last_transaction
    # Only s0's ClusterIP appears; the count change moves it to another shared chain.
    assert "10.96.0.1 . tcp . 80" in tx
    assert "10.96.0.2 " not in tx and "10.96.0.3 " not in tx
    assert "flush table" not in tx and "list" not in tx
    assert "add chain ip kube-proxy cluster-ip-4" in tx
    assert tx.count("\n") <= 8, tx
    # A second identical sync has nothing to do.
    assert backend.sync(snapshot(50, extra_endpoint=True), {port_name(0)}).operations == 0


def test_two_changed_service_ports_claiming_one_destination(scratch: str) -> None:
    """One partial sync changes the owner of a shared external IP:port and adds a new
    ServicePort that takes the destination over (smaller name): the review found stale
    backends, or a KeyError for the new one."""
    ext = ("203.0.113.9",)
    a = ServicePort(name=port_name(1), cluster_ips=("10.96.0.11",), port=80, external_ips=ext)
    first = Snapshot({a.name: a}, {a.name: (Endpoint(ip("local-1"), 8080, "node-a"),)}, NODE)
    backend = NftablesBackend(CONFIG, NftCommand(netns=scratch))
    backend.sync(first, None)
    new = ServicePort(name=port_name(0), cluster_ips=("10.96.0.10",), port=80, external_ips=ext)
    second = Snapshot(
        {a.name: a, new.name: new},
        {
            a.name: (Endpoint(ip("local-2"), 8080, "node-a"),),
            new.name: (Endpoint(ip("remote-1"), 9090, "node-b"),),
        },
        NODE,
    )
    assert not backend.sync(second, {a.name, new.name}).full
    fresh_ns = f"{scratch}-fresh"
    add_netns(fresh_ns)
    try:
        NftablesBackend(CONFIG, NftCommand(netns=fresh_ns)).sync(second, None)
        assert normalized(scratch) == normalized(fresh_ns)
    finally:
        delete_netns(fresh_ns)
    listing = ns_exec(scratch, "nft", "list", "map", "ip", "kube-proxy", "ip-backends")
    assert "203.0.113.9 . tcp . 80 . 0 : 10.244.2.10 . 9090" in listing


def test_removing_an_affinity_service_is_one_partial_sync(scratch: str) -> None:
    """The chains of a ClientIP-affinity ServicePort reference each other; deleting them
    in the wrong order was refused ("Device or resource busy") and only the full-sync
    retry a second later removed them."""
    sticky = ServicePort(
        name=port_name(0), cluster_ips=("10.96.0.20",), port=80, affinity_timeout=60
    )
    eps = (Endpoint(ip("local-1"), 8080, "node-a"), Endpoint(ip("remote-1"), 8080, "node-b"))
    backend = NftablesBackend(CONFIG, NftCommand(netns=scratch))
    backend.sync(Snapshot({sticky.name: sticky}, {sticky.name: eps}, NODE), None)
    assert "aff-" in ns_exec(scratch, "nft", "list", "chains")
    result = backend.sync(Snapshot({}, {}, NODE), {sticky.name})
    assert not result.full
    listing = ns_exec(scratch, "nft", "list", "table", "ip", "kube-proxy")
    assert "chain aff" not in listing and "set affset-" not in listing


def test_full_sync_restores_what_someone_deleted(scratch: str) -> None:
    backend = NftablesBackend(CONFIG, NftCommand(netns=scratch))
    backend.sync(snapshot(10), None)
    before = normalized(scratch)
    ns_exec(scratch, "nft", "flush", "map", "ip", "kube-proxy", "service-ips")
    ns_exec(scratch, "nft", "delete", "chain", "ip", "kube-proxy", "cluster-ip-3")
    ns_exec(scratch, "nft", "flush", "chain", "ip", "kube-proxy", "masquerading")
    ns_exec(scratch, "nft", "delete", "set", "ip", "kube-proxy", "hairpin")
    ns_exec(scratch, "nft", "add", "rule", "ip", "kube-proxy", "services", "drop")
    ns_exec(scratch, "nft", "add", "chain", "ip", "kube-proxy", "intruder")
    assert normalized(scratch) != before
    backend.sync(snapshot(10), None)
    assert "delete table" not in backend.last_transaction
    assert normalized(scratch) == before


def test_full_sync_keeps_session_affinity_memory(lab: Lab, scratch: str) -> None:
    # Through the real data path: a client sticks to one endpoint, and a full sync (as
    # the periodic one) does not make it forget.
    name = port_name(0)
    svc = ServicePort(name=name, cluster_ips=("10.96.5.1",), port=80, affinity_timeout=60)
    eps = tuple(
        Endpoint(ip(p), 8080, node)
        for p, node in (("local-1", "node-a"), ("local-2", "node-a"), ("remote-1", "node-b"))
    )
    snap = Snapshot({name: svc}, {name: eps}, NODE)
    node_backend = NftablesBackend(CONFIG, NftCommand(netns=lab.node_ns))
    node_backend.sync(snap, None)
    first = lab.in_pod("client").call(tcp_ask, "10.96.5.1", 80).pod
    for _ in range(3):
        node_backend.sync(snap, None)
        assert "delete table" not in node_backend.last_transaction
        seen = {lab.in_pod("client").call(tcp_ask, "10.96.5.1", 80).pod for _ in range(10)}
        assert seen == {first}
