"""The sync orchestration on the strict nftables fake (no root): the real Proxy and
NftablesBackend, with FakeNftables standing in for the kernel.

Covers what the review found in the orchestration: health-check bookkeeping across a
failed sync, a full resync every syncPeriod, a refused partial sync, and a ServicePort
the kernel refuses.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import pytest

from kubeproxy.app import Proxy
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.nftables.fake import FakeNftables
from kubeproxy.dataplane.nftables.runner import NftError
from kubeproxy.dataplane.nftables.transaction import TableRef, Transaction
from kubeproxy.model.events import Event
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import Endpoint, IPFamily, Service, ServicePort, TrafficPolicy
from kubeproxy.runner import ManualClock
from tests.unit.conftest import endpoint_slice, service_port, slice_endpoint

CONFIG = ProxyConfig(
    hostname="node-a",
    families=(IPFamily.IPv4,),
    cluster_cidrs=("10.244.0.0/16",),
    nodeport_addresses=NodePortAddresses.parse(["127.0.0.0/8"]),
    healthz_bind_address="",
    metrics_bind_address="",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_lb(name: str, cluster_ip: str, health_port: int) -> Service:
    port = replace(
        service_port(name, cluster_ips=(cluster_ip,), node_port=30000 + health_port % 2000),
        external_traffic_policy=TrafficPolicy.LOCAL,
        health_check_node_port=health_port,
    )
    return Service("default", name, (port,))


def proxy(fake: FakeNftables, clock: ManualClock | None = None) -> Proxy:
    return Proxy(CONFIG, NftablesBackend(CONFIG, fake), clock=clock or ManualClock())


def test_health_checks_follow_changes_consumed_by_a_failed_sync() -> None:
    """A failed sync consumed the changes before the health-check bookkeeping saw them:
    a Service deleted meanwhile made every later sync raise KeyError, and one created
    meanwhile never got its listener."""
    fake = FakeNftables()
    p = proxy(fake)
    a_port, b_port = free_port(), free_port()
    a = local_lb("a", "10.96.0.1", a_port)
    b = local_lb("b", "10.96.0.2", b_port)
    local = slice_endpoint("10.244.1.5", node="node-a")

    async def scenario() -> None:
        await p.start_servers()
        try:
            p.on_events(
                [Event.added(a), Event.added(endpoint_slice("a-1", "a", endpoints=(local,)))]
            )
            assert await p.sync()
            assert p.servers.services is not None
            assert set(p.servers.services.ports.values()) == {a_port}

            fake.refuse = lambda tx: "injected: the kernel refuses everything"
            p.on_events([Event.deleted(a), Event.added(b)])
            p.on_events([Event.added(endpoint_slice("b-1", "b", endpoints=(local,)))])
            assert not await p.sync()

            fake.refuse = None
            assert await p.sync()  # a full sync: no KeyError for the deleted Service
            assert set(p.servers.services.ports.values()) == {b_port}
            assert await p.sync()
        finally:
            await p.stop_servers()

    asyncio.run(scenario())


def test_between_changes_only_the_canary_runs_and_a_full_sync_is_hourly() -> None:
    """A full resync every syncPeriod (30 s) cost ~1.6 s CPU and an nft process of
    ~285 MB at 10,000 Services; upstream does one at start, after errors and hourly."""
    fake = FakeNftables()
    clock = ManualClock()
    p = proxy(fake, clock)
    p.on_events([Event.added(Service("default", "web", (service_port(),)))])

    async def scenario() -> None:
        assert await p.sync()
        assert p.last_outcome is not None and p.last_outcome.full
        applied = fake.applied
        for _ in range(10):  # five minutes of periodic runs with nothing changed
            clock.advance(CONFIG.sync_period)
            assert await p.sync()
        assert fake.applied == applied  # nothing was written
        assert p.last_outcome is not None and not p.last_outcome.full

        clock.advance(3600)
        assert await p.sync()
        assert p.last_outcome.full and fake.applied == applied + 1

        # Someone deletes our table: the next periodic run notices and repairs it.
        gone = Transaction()
        gone.delete_table(TableRef("ip", "kube-proxy"))
        fake.apply(gone)
        clock.advance(CONFIG.sync_period)
        assert await p.sync()
        assert p.last_outcome.full
        assert p.backend.check() is None

    asyncio.run(scenario())


# ------------------------------------------------------------ the backend itself

NODE = NodeState("node-a", "zone-a", {IPFamily.IPv4: "192.168.50.1"})


def snapshot(*ports: ServicePort, endpoints: int = 2) -> Snapshot:
    services = {p.name: p for p in ports}
    eps = {
        name: tuple(Endpoint(f"10.244.1.{i + 10}", 8080, "node-a") for i in range(endpoints))
        for name in services
    }
    return Snapshot(services, eps, NODE)


def fresh_dump(snap: Snapshot) -> str:
    fake = FakeNftables()
    NftablesBackend(CONFIG, fake).sync(snap, None)
    return fake.dump()


def test_a_refused_partial_sync_becomes_a_full_sync_at_once() -> None:
    fake = FakeNftables()
    backend = NftablesBackend(CONFIG, fake)
    web = service_port("web")
    backend.sync(snapshot(web), None)
    other = service_port("other", cluster_ips=("10.96.0.11",))
    snap = snapshot(web, other)
    fake.fail_next = NftError("nft: injected failure", "")
    result = backend.sync(snap, {other.name})
    assert result.full  # the same call repaired it
    assert fake.dump() == fresh_dump(snap)


def test_a_service_port_the_kernel_refuses_is_isolated_and_retried_when_it_changes() -> None:
    fake = FakeNftables()
    fake.refuse = lambda tx: (
        "Could not process rule: File exists" if "10.96.0.66" in str(tx) else None
    )
    backend = NftablesBackend(CONFIG, fake)
    good = service_port("good", cluster_ips=("10.96.0.10",))
    bad = service_port("bad", cluster_ips=("10.96.0.66",))
    result = backend.sync(snapshot(good, bad), None)
    assert result.full
    assert result.isolated == [f"{bad.name} (IPv4): Could not process rule: File exists"]
    assert fake.dump() == fresh_dump(snapshot(good))
    # Unchanged, it stays out of partial syncs (no refusal, no full-sync fallback).
    third = service_port("third", cluster_ips=("10.96.0.12",))
    result = backend.sync(snapshot(good, bad, third), {bad.name, third.name})
    assert not result.full and len(result.isolated) == 1
    # Changed, it is retried, and programmed.
    fixed = service_port("bad", cluster_ips=("10.96.0.67",))
    result = backend.sync(snapshot(good, fixed, third), {bad.name})
    assert not result.full and result.isolated == []
    assert fake.dump() == fresh_dump(snapshot(good, fixed, third))


def test_the_skeleton_refused_fails_the_sync_and_keeps_the_rules() -> None:
    fake = FakeNftables()
    backend = NftablesBackend(CONFIG, fake)
    backend.sync(snapshot(service_port()), None)
    before = fake.dump()
    fake.refuse = lambda tx: "Operation not supported"
    with pytest.raises(NftError, match="Operation not supported"):
        backend.sync(snapshot(service_port(), service_port("x", cluster_ips=("10.96.0.9",))), None)
    assert fake.dump() == before


def test_adding_an_endpoint_to_an_affinity_service_is_one_partial_sync() -> None:
    """Found by the fake: with only remote endpoints nothing but the affinity chains
    changes, and nft 1.0.6 refused the rewritten pick chain's "@affset" of an existing
    endpoint (not declared in the script, and nothing made nft load the kernel's sets)."""
    fake = FakeNftables()
    backend = NftablesBackend(CONFIG, fake)
    sticky = replace(service_port("sticky"), affinity_timeout=60)
    first = Endpoint("10.244.2.5", 8080, "node-b")
    backend.sync(Snapshot({sticky.name: sticky}, {sticky.name: (first,)}, NODE), None)
    more = (first, Endpoint("10.244.2.6", 8080, "node-b"))
    snap = Snapshot({sticky.name: sticky}, {sticky.name: more}, NODE)
    assert not backend.sync(snap, {sticky.name}).full
    assert fake.dump() == fresh_dump(snap)


@pytest.mark.parametrize("partial", [True, False], ids=["partial", "full"])
def test_an_nft_that_never_answers_fails_the_sync_without_fallbacks(partial: bool) -> None:
    """Found by bench.faults: a hung nft, killed after its 60 s timeout, was taken for a
    refusal, so the same sync tried a full sync, then replacing the tables, then checks
    to isolate a culprit, each waiting another 60 s (up to four minutes in one sync) and
    throwing session-affinity memory away. A kill says nothing about the transaction:
    the sync fails at once, keeping the rules, and the runner retries it."""
    fake = FakeNftables()
    backend = NftablesBackend(CONFIG, fake)
    web = service_port("web")
    backend.sync(snapshot(web), None)
    before = fake.dump()
    other = service_port("other", cluster_ips=("10.96.0.11",))
    killed = "nft did not finish within 60s and was killed"
    fake.fail_next = NftError(killed, "", incomplete=True)
    with pytest.raises(NftError, match=killed):
        backend.sync(snapshot(web, other), {other.name} if partial else None)
    assert fake.dump() == before  # one attempt, which changed nothing
    assert backend.sync(snapshot(web, other), None).full
    assert fake.dump() == fresh_dump(snapshot(web, other))


def test_a_health_check_does_not_need_an_address_that_reaches_the_service() -> None:
    """Upstream opens the health check of every LoadBalancer with externalTrafficPolicy
    Local (NeedsHealthCheck), whatever reaches it: with no NodePorts
    (allocateLoadBalancerNodePorts: false) and only ipMode Proxy load-balancer IPs (not
    programmed, so no external address at all) it still answers. The differential test
    found ours refused (bench seeds 1055 and 1058)."""
    health = free_port()
    port = replace(local_lb("proxied", "10.96.0.3", health).ports[0], node_port=0)
    assert not port.externally_accessible
    svc = Service("default", "proxied", (port,))
    local = slice_endpoint("10.244.1.5", node="node-a")
    p = proxy(FakeNftables())

    async def scenario() -> None:
        await p.start_servers()
        try:
            p.on_events(
                [
                    Event.added(svc),
                    Event.added(endpoint_slice("p-1", "proxied", endpoints=(local,))),
                ]
            )
            assert await p.sync()
            assert p.servers.services is not None
            assert set(p.servers.services.ports.values()) == {health}
        finally:
            await p.stop_servers()

    asyncio.run(scenario())


def test_a_service_cidr_added_is_dropped_from_the_next_sync() -> None:
    """Kept difference new-service-cidr-dropped-at-once: upstream nftables writes its
    "drop traffic to unallocated ClusterIPs" rule on full syncs only (an hour apart), so a
    ServiceCIDR created while it runs is dropped from then on; kubeproxy's next sync
    carries it (a full one: the node-level plan changed, whatever changed with it)."""
    fake = FakeNftables()
    backend = NftablesBackend(CONFIG, fake)
    web = service_port("web")
    backend.sync(snapshot(web), None)
    assert "10.97.0.0/16" not in fake.dump()
    added = replace(snapshot(web), service_cidrs=("10.97.0.0/16",))
    result = backend.sync(added, set())
    assert result.full
    assert "10.97.0.0/16" in fake.dump()
    assert fake.dump() == fresh_dump(added)
