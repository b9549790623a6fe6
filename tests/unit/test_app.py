"""kubeproxy.app: what a sync reports (conntrack cleanup) and how the servers start.

The backend is a fake that records syncs; conntrack is the in-memory fake, so no root.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import weakref
from collections.abc import AsyncGenerator

import pytest

from kubeproxy.app import Proxy, ServerBindError, changed_names
from kubeproxy.backends.base import SyncResult
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.conntrack import Entry, FakeConntrack, Filter
from kubeproxy.metrics import Metrics
from kubeproxy.model.events import Event
from kubeproxy.model.state import ProxyState, Snapshot
from kubeproxy.model.types import IPFamily, L4Protocol, ServicePortName
from tests.unit.conftest import port_name, service, service_port
from tests.unit.test_health import fetch


class FakeBackend:
    mode = ProxyMode.NFTABLES

    def __init__(self) -> None:
        self.syncs = 0

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def check(self) -> str | None:
        return None

    def counters(self) -> dict[str, int]:
        return {}

    def sync(self, snapshot: Snapshot, changed: set[ServicePortName] | None) -> SyncResult:
        self.syncs += 1
        return SyncResult(full=changed is None)

    def render(self, snapshot: Snapshot) -> str:
        return ""


def config(**overrides: object) -> ProxyConfig:
    base: dict[str, object] = {
        "hostname": "node-a",
        "families": (IPFamily.IPv4, IPFamily.IPv6),
        "healthz_bind_address": "",
        "metrics_bind_address": "",
    }
    base.update(overrides)
    return ProxyConfig(**base)  # type: ignore[arg-type]


def test_a_failed_conntrack_cleanup_is_logged_not_counted_as_an_nftables_cleanup_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = Filter.for_ip("10.96.0.10", L4Protocol.UDP, reason="service deleted")
    ok = Filter.for_ip("fd00::10", L4Protocol.UDP, reason="service deleted")
    flows = [
        Entry(IPFamily.IPv4, L4Protocol.UDP, "10.244.0.1", "10.96.0.10", 1, 53, "10.244.0.5"),
        Entry(IPFamily.IPv6, L4Protocol.UDP, "fd00::1", "fd00::10", 1, 53, "fd00::5"),
    ]
    conntrack = FakeConntrack(flows, refuse={refused})
    metrics = Metrics()
    proxy = Proxy(config(), FakeBackend(), conntrack=conntrack, metrics=metrics)
    snapshot, _ = ProxyState("node-a").collect()
    proxy._stale = [refused, ok]
    with caplog.at_level(logging.ERROR):
        proxy._program(snapshot, None)
    value = metrics.registry.get_sample_value
    assert (
        value("kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", {"ip_family": "IPv4"})
        == 0
    )
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "10.96.0.10" in errors[0], errors
    # Upstream's conntrack metrics, per family.
    duration = "kubeproxy_conntrack_reconciler_sync_duration_seconds_count"
    assert value(duration, {"ip_family": "IPv4"}) == 1
    assert value(duration, {"ip_family": "IPv6"}) == 1
    assert conntrack.cleared == [ok]
    failures = "kubeproxy_conntrack_cleanup_failures_total"
    assert value(failures, {"ip_family": "IPv4"}) == 1
    assert proxy._stale == [refused]  # kept for a retry


def test_a_failed_conntrack_deletion_is_retried_until_it_succeeds() -> None:
    """Found by fault injection: a conntrack deletion that failed was forgotten, so a UDP
    flow NATed to a removed endpoint kept going there for as long as its client sent.
    The next sync retries it (a periodic one without changes too), and the runner is
    asked for that sync soon, backing off while it keeps failing."""
    refused = Filter.for_ip("10.96.0.10", L4Protocol.UDP, reason="service deleted")
    # A flow it matches (with many filters, one matching no listed entry is not run).
    flow = Entry(IPFamily.IPv4, L4Protocol.UDP, "10.0.0.5", "10.96.0.10", 5353, 53, "10.244.1.5")
    conntrack = FakeConntrack(table=[flow], refuse={refused})
    metrics = Metrics()
    proxy = Proxy(config(), FakeBackend(), conntrack=conntrack, metrics=metrics)
    retries: list[float] = []

    class Runner:
        def retry_after(self, seconds: float) -> None:
            retries.append(seconds)

    proxy.runner = Runner()  # type: ignore[assignment]

    async def scenario() -> None:
        proxy._stale = [refused]
        assert await proxy.sync()  # the rules are fine: the sync itself succeeded
        assert await proxy.sync()  # nothing changed: the canary, then the retry
        assert proxy._stale == [refused] and conntrack.cleared == []
        conntrack.refuse.clear()  # the fault clears
        assert await proxy.sync()
        assert conntrack.cleared == [refused] and proxy._stale == []
        assert await proxy.sync()  # nothing left to retry
        assert conntrack.cleared == [refused]

    asyncio.run(scenario())
    assert retries == [1.0, 2.0]
    value = metrics.registry.get_sample_value
    assert value("kubeproxy_conntrack_cleanup_failures_total", {"ip_family": "IPv4"}) == 2


def blocked_port() -> socket.socket:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    return blocker


def test_bind_address_hard_fail_makes_a_server_that_cannot_listen_fatal() -> None:
    blocker = blocked_port()
    taken = blocker.getsockname()[1]
    proxy = Proxy(
        config(
            healthz_bind_address="127.0.0.1:0",
            metrics_bind_address=f"127.0.0.1:{taken}",
            bind_address_hard_fail=True,
        ),
        FakeBackend(),
    )

    async def scenario() -> None:
        with pytest.raises(ServerBindError, match=r"^starting metrics server failed: .*in use"):
            await proxy.start_servers()
        # Nothing is left listening: the healthz server that did start was stopped.
        assert proxy.servers.listeners == []

    try:
        asyncio.run(scenario())
    finally:
        blocker.close()


def test_without_hard_fail_a_server_that_cannot_listen_is_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocker = blocked_port()
    taken = blocker.getsockname()[1]
    proxy = Proxy(
        config(healthz_bind_address=f"127.0.0.1:{taken}", metrics_bind_address="127.0.0.1:0"),
        FakeBackend(),
    )
    proxy.bind_retry_seconds = 0.05

    async def scenario() -> None:
        try:
            await proxy.start_servers()
            assert [type(s).__name__ for s in proxy.servers.listeners] == ["MetricsServer"]
            await asyncio.sleep(0.2)
            assert len(proxy.servers.listeners) == 1  # still taken
            blocker.close()
            for _ in range(100):
                if len(proxy.servers.listeners) == 2:
                    break
                await asyncio.sleep(0.02)
            assert (await fetch(taken, "/livez")).status == 200
        finally:
            await proxy.stop_servers()

    with caplog.at_level(logging.INFO):
        try:
            asyncio.run(scenario())
        finally:
            blocker.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith("healthz server failed: "), errors
    assert any(r.getMessage() == f"Listening on 127.0.0.1:{taken} now" for r in caplog.records)


def test_a_syncs_log_line_names_what_changed() -> None:
    assert changed_names(set()) == ""
    names = {port_name(f"svc-{i:02d}") for i in range(12)}
    line = changed_names(names)
    assert line.startswith("; changed: default/svc-00:http/TCP, ")
    assert line.endswith("default/svc-09:http/TCP (+2 more)")


class SilentSource:
    """A source that never delivers its initial state (an API server away from the start)."""

    async def watch(self, stop: asyncio.Event) -> AsyncGenerator[list[Event], None]:
        await stop.wait()
        return
        yield []  # an async generator


def test_the_gc_pause_of_the_start_ends_after_its_limit_without_a_first_sync(
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = Proxy(config(), FakeBackend())
    proxy.gc_pause_limit = 0.1
    seen: list[bool] = []

    async def scenario() -> None:
        stop = asyncio.Event()
        run = asyncio.create_task(proxy.run(SilentSource(), stop))
        await asyncio.sleep(0.02)
        seen.append(gc.isenabled())  # paused for the start
        await asyncio.sleep(0.3)
        seen.append(gc.isenabled())  # the limit is over: collecting again
        stop.set()
        assert await run == 0

    assert gc.isenabled()
    try:
        with caplog.at_level(logging.INFO):
            asyncio.run(scenario())
    finally:
        gc.enable()
        gc.unfreeze()
    assert seen == [False, True]
    assert proxy.syncs == 0
    assert any("No first sync after 0.1s" in r.getMessage() for r in caplog.records)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_run_collects_garbage_once_per_sync_and_gives_the_collector_back() -> None:
    # Under churn the collector's own schedule rescanned the whole cluster state every
    # few syncs (bench.churn_tick); run() turns its automatic collections off and, after
    # each sync, collects what is not frozen and freezes the survivors.
    proxy = Proxy(config(min_sync_period=0.0), FakeBackend())
    seen: dict[str, object] = {}

    class Source:
        async def watch(self, stop: asyncio.Event) -> AsyncGenerator[list[Event], None]:
            yield []  # the initial state: the first sync follows
            while proxy.syncs < 1:
                await asyncio.sleep(0.01)
            seen["automatic"] = gc.isenabled()
            seen["frozen"] = gc.get_freeze_count()
            garbage = weakref.ref(_Cycle())  # only a collection can free a cycle
            seen["before a sync"] = garbage() is not None
            before = proxy.last_outcome
            yield [Event.added(service("web", service_port()))]
            while proxy.last_outcome is before:
                await asyncio.sleep(0.01)
            seen["after a sync"] = garbage() is not None
            stop.set()

    assert gc.isenabled()
    assert asyncio.run(proxy.run(Source(), asyncio.Event())) == 0
    assert seen == {
        "automatic": False,
        "frozen": seen["frozen"],
        "before a sync": True,
        "after a sync": False,
    }
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


class FailingBackend(FakeBackend):
    """Refuses its first ``failures`` syncs (the kernel said no)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def sync(self, snapshot: Snapshot, changed: set[ServicePortName] | None) -> SyncResult:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("refused")
        return super().sync(snapshot, changed)


@pytest.mark.parametrize("once", [True, False])
@pytest.mark.parametrize("failures", [0, 1])
def test_other_modes_are_cleaned_up_only_after_the_first_successful_sync(
    once: bool, failures: int
) -> None:
    # Upstream removes the other modes' rules at start; a refused first sync (or a
    # source that never answers) then leaves the node with no Service rules at all.
    # Here they go once ours are in (beside the later syncs: a change does not wait).
    backend = FailingBackend(failures)
    proxy = Proxy(config(min_sync_period=0.0), backend)
    cleaned_after: list[int] = []

    class Source:
        async def watch(self, stop: asyncio.Event) -> AsyncGenerator[list[Event], None]:
            yield [Event.added(service("web", service_port()))]  # the initial state
            while backend.syncs < 1:
                await asyncio.sleep(0.01)
            db = service_port("db", cluster_ips=("10.96.0.11",))
            yield [Event.added(service("db", db))]  # a change: a second sync
            while backend.syncs < 2:
                await asyncio.sleep(0.01)
            stop.set()

    try:
        code = asyncio.run(
            proxy.run(
                Source(),
                asyncio.Event(),
                once=once,
                after_first_sync=lambda: cleaned_after.append(backend.syncs),
            )
        )
    finally:
        gc.enable()
        gc.unfreeze()
    if once:
        # One sync, then the cleanup; after a refused sync, none (exit 1).
        assert (code, cleaned_after) == ((1, []) if failures else (0, [1]))
    else:
        # The runner retries the refused sync; the cleanup follows the first success,
        # once, and is done before run() returns.
        assert code == 0
        assert len(cleaned_after) == 1 and cleaned_after[0] >= 1
        assert backend.syncs == 2


def test_no_cleanup_and_no_rules_claim_when_the_source_never_delivers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An API server away at the start: nothing is programmed and nothing removed, a line
    # says why every waiting_log_seconds, /healthz says why, and the exit does not claim
    # that rules stay in place.
    proxy = Proxy(config(), FakeBackend())
    proxy.waiting_log_seconds = 0.01
    cleaned: list[bool] = []

    class Source:
        def problem(self) -> str:
            return "https://10.0.0.1:6443: cannot list services: connection refused"

        async def watch(self, stop: asyncio.Event) -> AsyncGenerator[list[Event], None]:
            await asyncio.sleep(0.05)  # several waiting lines' worth
            code, body = proxy.health.healthz()
            assert code == 503 and "connection refused" in str(body["reason"])
            stop.set()
            return
            yield []  # an async generator that never yields

    with caplog.at_level(logging.INFO):
        try:
            code = asyncio.run(
                proxy.run(Source(), asyncio.Event(), after_first_sync=lambda: cleaned.append(True))
            )
        finally:
            gc.enable()
            gc.unfreeze()
    assert code == 0 and not cleaned and proxy.syncs == 0
    messages = [r.getMessage() for r in caplog.records]
    waiting = [m for m in messages if m.startswith("No complete initial state")]
    assert len(waiting) >= 2, messages
    assert "cannot list services: connection refused" in waiting[0]
    assert "/healthz answers 503" in waiting[0]
    assert not any("rules stay in place (run" in m for m in messages)
    assert any("programmed no rules" in m for m in messages)
