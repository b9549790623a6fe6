"""Composition root: source → ProxyState (trackers) → runner → backend, plus the servers.

:class:`Proxy` owns the wiring and the sync decision (full or partial). A sync is:

1. **collect** — fold tracker changes into a snapshot (event-loop thread: the trackers are
   only touched there), note stale UDP conntrack entries and which ServicePorts need a
   health-check server (from the model, whatever the kernel later says), and decide:
   a *full* sync at start, after a failure, when node-level settings change, and at
   least every ``full_sync_period`` (an hour, as upstream); a *partial* sync of what
   changed otherwise; and when nothing changed (the periodic run every syncPeriod), only
   the backend's cheap canary check, which forces a full sync if our rules were
   removed behind our back (upstream's canary idea);
2. **program** — the backend renders and applies (worker thread, so health and metrics
   keep answering during a long sync), then stale conntrack entries are cleared;
3. **report** — health, metrics, per-Service health-check servers, logs.

Side effects (kernel, conntrack, clock, HTTP servers) come in through the constructor;
``kubeproxy.cli`` builds the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from kubeproxy.backends.base import SYNC_LOG_WORDS, Backend, SyncResult
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.conntrack import (
    Conntrack,
    ConntrackError,
    Filter,
    apply,
    reconcile,
    stale_conntrack_filters,
)
from kubeproxy.health import HealthServer, ProxyHealth, ServiceHealthServers
from kubeproxy.health.services import (
    health_check_families,
    health_check_node_ports,
    local_ready_endpoints,
)
from kubeproxy.logs import V2
from kubeproxy.metrics import Metrics, MetricsServer
from kubeproxy.model.events import Event, dispatch
from kubeproxy.model.state import Changes, ProxyState, Snapshot
from kubeproxy.model.types import (
    EndpointSlice,
    L4Protocol,
    Service,
    ServicePortName,
    TrafficPolicy,
)
from kubeproxy.runner import BoundedFrequencyRunner, Clock, SystemClock
from kubeproxy.sources import Source, initial_state, source_problem

log = logging.getLogger("kubeproxy")

# Upstream's FullSyncPeriod (iptables and nftables proxiers): between full syncs, only
# what changed is written.
FULL_SYNC_PERIOD = 3600.0

# The cyclic GC is paused for the start (see Proxy.run) at most this long: a source that
# cannot deliver its initial state (an API server away from the start) must not leave a
# long-running process without cycle collection.
GC_PAUSE_LIMIT = 60.0

# First retry of failed conntrack deletions (doubling per failure, up to syncPeriod), as
# the runner retries a failed sync.
CONNTRACK_RETRY = 1.0

# Upstream retries a server that cannot listen every 5 s (wait.Until) unless
# bindAddressHardFail makes the failure fatal.
BIND_RETRY_SECONDS = 5.0


# While the initial state does not come (an API server away at the start), a line says
# why at least this often, as the issue of a node without Service routing deserves.
WAITING_LOG_SECONDS = 30.0


class ServerBindError(RuntimeError):
    """The healthz or metrics server cannot listen and bindAddressHardFail is set."""


@dataclass
class SyncOutcome:
    ok: bool
    full: bool
    seconds: float


@dataclass
class Servers:
    """The HTTP servers of a running proxy (none for ``run --once``)."""

    health: HealthServer | None = None
    metrics: MetricsServer | None = None
    services: ServiceHealthServers | None = None
    listeners: list[HealthServer | MetricsServer] = field(default_factory=list)
    # Servers that could not listen yet, retrying in the background.
    retries: list[asyncio.Task[None]] = field(default_factory=list)


# At most this many changed ServicePorts are named in a sync's log line.
NAMED_CHANGES = 10


def changed_names(names: Collection[ServicePortName]) -> str:
    """``"; changed: ns/a:http/TCP, ns/b:dns/UDP (+3 more)"`` for a sync's log line ("" if none)."""
    if not names:
        return ""
    shown = sorted(str(n) for n in names)
    more = f" (+{len(shown) - NAMED_CHANGES} more)" if len(shown) > NAMED_CHANGES else ""
    return f"; changed: {', '.join(shown[:NAMED_CHANGES])}{more}"


class Proxy:
    def __init__(
        self,
        config: ProxyConfig,
        backend: Backend,
        *,
        clock: Clock | None = None,
        wall: Callable[[], float] = time.time,
        conntrack: Conntrack | None = None,
        metrics: Metrics | None = None,
        full_sync_period: float = FULL_SYNC_PERIOD,
        configz: Mapping[str, object] | None = None,
    ) -> None:
        """``configz``: the configuration the metrics server's ``/configz`` shows."""
        self.config = config
        self.full_sync_period = full_sync_period
        self.configz = configz
        self.backend = backend
        self.clock = clock or SystemClock()
        self.wall = wall
        self.conntrack = conntrack
        self.metrics = metrics or Metrics(config.mode, families=config.families)
        self.metrics.counter_reader = backend.counters
        self.health = ProxyHealth(2 * config.sync_period, wall, families=config.families)
        self.state = ProxyState(config.hostname, config.bind_ip())
        self.servers = Servers()
        self.bind_retry_seconds = BIND_RETRY_SECONDS
        self.waiting_log_seconds = WAITING_LOG_SECONDS
        self._needs_full = True
        self._last_full = -float("inf")
        self._stale: list[Filter] = []
        # Until the first reconcile of the whole table has run (at the first sync): what
        # went stale while no proxy ran is in no change.
        self._reconcile = True
        self._conntrack_retries = 0
        self.runner: BoundedFrequencyRunner | None = None
        self._conflicts: set[str] = set()
        self._health_checked: set[ServicePortName] = set()
        self._started = wall()
        self.syncs = 0
        # While run() collects garbage itself (see _collect_garbage): the cyclic GC's
        # automatic collections are off, and when the whole heap was last collected.
        self._gc_managed = False
        self._gc_whole_at = -float("inf")
        self.gc_pause_limit = GC_PAUSE_LIMIT
        self.last_outcome: SyncOutcome | None = None
        self.last_result: SyncResult | None = None

    # ------------------------------------------------------------------ events

    def on_events(self, events: list[Event]) -> bool:
        """Feed a source batch into the trackers; True if a sync is now wanted."""
        pending = dispatch(self.state, events)
        self.metrics.changes_seen(
            services=sum(isinstance(e.new or e.old, Service) for e in events),
            endpoints=sum(isinstance(e.new or e.old, EndpointSlice) for e in events),
        )
        self.metrics.pending(
            self.state.service_changes.pending(), self.state.endpoint_changes.pending()
        )
        node = self.state.node_state()
        self.health.sync_node(deleting=node.deleting, to_be_deleted_taint=False)
        if pending:
            self.health.queued_update()
            self.metrics.queued(self.wall())
        return pending

    # -------------------------------------------------------------------- sync

    def _collect(self) -> tuple[Snapshot, Changes, bool]:
        snapshot, changes = self.state.collect()
        self.metrics.pending(0, 0)
        full = (
            self._needs_full
            or changes.node_changed
            or self.clock.now() - self._last_full >= self.full_sync_period
        )
        if not self._reconcile:
            for family in self.config.families:
                self._stale.extend(
                    stale_conntrack_filters(
                        snapshot.services,
                        snapshot.endpoints,
                        changes.services,
                        changes.endpoints,
                        family,
                    )
                )
        # Kept from the changes (so a sync does not scan every Service), and here rather
        # than after a successful sync: the changes are consumed now, whatever the kernel
        # says later.
        # Upstream (NeedsHealthCheck) asks for a LoadBalancer with externalTrafficPolicy
        # Local, not for an address that reaches it: one with ipMode Proxy IPs and no
        # NodePorts still has its health check (the differential test found it).
        for name in changes.service_ports:
            svc = snapshot.services.get(name)
            if (
                svc is not None
                and svc.health_check_node_port
                and svc.external_traffic_policy is TrafficPolicy.LOCAL
            ):
                self._health_checked.add(name)
            else:
                self._health_checked.discard(name)
        return snapshot, changes, full

    def _program(self, snapshot: Snapshot, changed: set[ServicePortName] | None) -> SyncResult:
        result = self.backend.sync(snapshot, changed)
        if self._reconcile:
            self._reconcile_conntrack(snapshot)
        self._clear_conntrack()
        return result

    def _reconcile_conntrack(self, snapshot: Snapshot) -> None:
        """At the first sync, upstream's reconcile over the whole table: flows to a UDP
        Service's frontend and not to one of its serving endpoints (flows to endpoints
        that still serve are kept: a restart breaks none of them). A table that cannot
        be listed is tried again at the next sync."""
        if self.conntrack is None:
            self._reconcile = False
            return
        for family in self.config.families:
            try:
                entries = self.conntrack.entries(family, L4Protocol.UDP)
            except ConntrackError as err:
                log.warning("Cannot list conntrack entries to reconcile (%s)", err)
                return
            self._stale.extend(reconcile(snapshot.services, snapshot.endpoints, family, entries))
        self._reconcile = False

    def _clear_conntrack(self) -> None:
        """Delete the stale conntrack entries; keep the filters that failed for a retry.

        After the new rules are in: a flow that re-creates its entry now gets them. A
        failed deletion is logged by apply(); it is not an nftables cleanup failure, so
        it does not count in that metric (as upstream). Upstream's reconciler rescans the
        table on every sync, so a failure there heals by itself; deleting by filter, we
        must keep the filter, or a UDP flow to a removed endpoint lives as long as its
        client keeps sending.
        """
        if not self._stale or self.conntrack is None:
            self._stale = []
            return
        failed: list[Filter] = []
        for family in self.config.families:
            stale = [f for f in self._stale if f.family is family]
            if stale:
                started = time.perf_counter()
                cleaned = apply(self.conntrack, stale)
                failed += [flt for flt, _ in cleaned.failed]
                self.metrics.conntrack_cleaned(
                    family.value,
                    time.perf_counter() - started,
                    cleaned.deleted,
                    len(cleaned.failed),
                )
        self._stale = failed

    async def sync(self) -> bool:
        """One sync: collect (here), program (worker thread), report (here)."""
        try:
            return await self._sync()
        finally:
            self._collect_garbage()

    async def _sync(self) -> bool:
        snapshot, changes, full = self._collect()
        started = time.perf_counter()
        if not full and not changes.service_ports:
            problem = await asyncio.to_thread(self.backend.check)
            if problem is None:
                if self._stale:  # conntrack deletions that failed before
                    await asyncio.to_thread(self._clear_conntrack)
                    self._retry_conntrack()
                self._idle(time.perf_counter() - started)
                return True
            log.warning("Rules changed behind kubeproxy's back (%s): full resync", problem)
            full = True
        try:
            result = await asyncio.to_thread(
                self._program, snapshot, None if full else changes.service_ports
            )
        except Exception as err:
            self._needs_full = True
            seconds = time.perf_counter() - started
            self.last_outcome = SyncOutcome(False, full, seconds)
            self.metrics.sync_failed(seconds, full=full)
            log.error("Sync failed after %.3fs, keeping the previous rules: %s", seconds, err)
            return False
        seconds = time.perf_counter() - started
        self._retry_conntrack()
        await self._report(snapshot, changes, result, seconds)
        return True

    def _retry_conntrack(self) -> None:
        """Failed conntrack deletions: run again soon, backing off like a failed sync."""
        if not self._stale:
            self._conntrack_retries = 0
            return
        delay = min(CONNTRACK_RETRY * 2**self._conntrack_retries, self.config.sync_period)
        self._conntrack_retries += 1
        log.info("Retrying %d failed conntrack deletions in %.1fs", len(self._stale), delay)
        if self.runner is not None:
            self.runner.retry_after(delay)

    def _idle(self, seconds: float) -> None:
        """A periodic run found nothing to do and the rules intact: that is progress."""
        self.last_outcome = SyncOutcome(True, False, seconds)
        self.health.updated()
        self.metrics.idle_sync(self.wall())

    async def _report(
        self, snapshot: Snapshot, changes: Changes, result: SyncResult, seconds: float
    ) -> None:
        self.syncs += 1
        if result.full:
            self._last_full = self.clock.now()
        self._needs_full = False
        self.last_outcome = SyncOutcome(True, result.full, seconds)
        self.last_result = result
        self.health.updated()
        # Trigger times from before this process started measure the API server's
        # history, not our programming latency (upstream drops them too).
        triggers = [
            (family, t)
            for times in changes.endpoints.trigger_times.values()
            for family, t in times
            if t >= self._started
        ]
        self.metrics.observe_sync(
            result, seconds, full=result.full, trigger_times=triggers, now=self.wall()
        )
        if self.servers.services is not None:
            checked = self._health_checked
            services = {n: snapshot.services[n] for n in checked}
            failures = await self.servers.services.sync(
                health_check_node_ports(services),
                local_ready_endpoints(
                    {n: snapshot.endpoints.get(n, ()) for n in checked}, snapshot.node.name
                ),
                snapshot.node.primary_ips,
                health_check_families(services),
            )
            for failure in failures:
                log.error("%s", failure.message)
        # A conflict is reported when it appears, not again on every sync.
        for message in sorted(set(result.conflicts) - self._conflicts):
            log.error("%s", message)
        self._conflicts = set(result.conflicts)
        level = logging.INFO if self.syncs == 1 else V2
        if not log.isEnabledFor(level):
            return  # naming the changes sorts them: not for a line nobody sees
        elements, chains, operations = SYNC_LOG_WORDS.get(
            self.backend.mode, SYNC_LOG_WORDS[ProxyMode.NFTABLES]
        )
        log.log(
            level,
            "Synced %s rules in %.3fs: %d service ports (%d renders), %d %s, %d %s, %d %s%s",
            "full" if result.full else "partial",
            seconds,
            result.service_ports,
            result.rendered,
            result.elements,
            elements,
            result.chains,
            chains,
            result.operations,
            operations,
            changed_names(changes.service_ports),
        )

    # --------------------------------------------------------------------- run

    async def start_servers(self) -> None:
        """Health (/healthz, /livez), metrics and per-Service health checks.

        A server that cannot listen is retried every 5 s; with bindAddressHardFail,
        ServerBindError instead (nothing is left listening).
        """
        cfg = self.config
        if cfg.healthz_bind_address:
            self.servers.health = HealthServer(self.health, cfg.healthz_bind_address, self.metrics)
        if cfg.metrics_bind_address:
            self.servers.metrics = MetricsServer(
                self.metrics,
                cfg.metrics_bind_address,
                cfg.mode,
                profiling=cfg.enable_profiling,
                configz=self.configz,
            )
        # Upstream's wording for each server's failure.
        servers = (
            ("healthz server failed", self.servers.health),
            ("starting metrics server failed", self.servers.metrics),
        )
        for failed, server in servers:
            if server is None:
                continue
            try:
                await server.start()
            except OSError as err:
                if cfg.bind_address_hard_fail:
                    await self.stop_servers()
                    raise ServerBindError(f"{failed}: {err}") from err
                # As upstream without bindAddressHardFail: report, keep proxying, retry.
                log.error("%s: %s (retrying every %gs)", failed, err, self.bind_retry_seconds)
                self.servers.retries.append(asyncio.create_task(self._retry_bind(server)))
                continue
            self.servers.listeners.append(server)
        self.servers.services = ServiceHealthServers(
            self.health.is_healthy,
            cfg.hostname,
            node_ports=cfg.nodeport_addresses,
            families=cfg.families,
        )

    async def _retry_bind(self, server: HealthServer | MetricsServer) -> None:
        while True:
            await asyncio.sleep(self.bind_retry_seconds)
            try:
                await server.start()
            except OSError as err:
                log.log(V2, "Still cannot listen on %s: %s", server.address, err)
                continue
            self.servers.listeners.append(server)
            log.info("Listening on %s now", server.address)
            return

    async def stop_servers(self) -> None:
        for task in self.servers.retries:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.servers.services is not None:
            await self.servers.services.close()
        for server in self.servers.listeners:
            await server.stop()
        self.servers = Servers()

    async def run(
        self,
        source: Source,
        stop: asyncio.Event,
        *,
        once: bool = False,
        after_first_sync: Callable[[], object] | None = None,
    ) -> int:
        """Program the rules until ``stop``. ``after_first_sync`` (the removal of what
        other proxy modes left) runs in a thread once the first sync has succeeded, never
        before: until our rules are in, the other mode's keep the node's Services working
        (a start that is refused, or whose source never answers, changes nothing)."""
        # Raises BackendError (a missing tool, no IPVS...) before anything is touched.
        self.backend.start()
        # Garbage is collected once per sync instead of by the collector's own schedule
        # (see _collect_garbage), unless the collector was off to begin with. If the
        # first sync does not come within gc_pause_limit seconds (an API server away
        # from the start), the collector's own schedule runs until it does.
        self._gc_managed = gc.isenabled()
        gc.disable()
        limit = asyncio.get_running_loop().call_later(self.gc_pause_limit, self._gc_pause_over)
        try:
            return await self._run(source, stop, once=once, after_first_sync=after_first_sync)
        finally:
            limit.cancel()
            if self._gc_managed:
                self._gc_managed = False
                gc.unfreeze()
                gc.enable()
            self.backend.stop()

    def _gc_pause_over(self) -> None:
        if self._gc_managed and self.syncs == 0 and not gc.isenabled():
            log.info(
                "No first sync after %gs: resuming the cyclic garbage collector",
                self.gc_pause_limit,
            )
            gc.enable()

    def _collect_garbage(self) -> None:
        """After each sync: collect what is not frozen, then freeze what survived.

        The cyclic GC's own schedule scans its oldest generation whole whenever it has
        grown by a quarter. While the initial state is loaded and first programmed, that
        rescans the growing cluster state over and over (about 0.5 s of CPU at 10,000
        Services); under churn, which keeps replacing that state with new objects, it
        rescanned all of them every few syncs (a 10% churn tick at 1,000 x 100 Services
        spent 250 ms of its 550 ms of CPU in such full collections: bench.churn_tick).
        Instead, its automatic collections stay off while the proxy runs, and after each
        sync (at least every syncPeriod) one collection scans only what is not frozen,
        i.e. what the sync and the events before it left, and freezes the survivors:
        O(change). Frozen objects are still freed when their last reference goes; only
        a reference cycle among them that becomes garbage has to wait for the next
        collection of the whole heap, the first sync's and then one per
        full_sync_period (an hour).
        """
        if not self._gc_managed:
            return
        gc.disable()  # in case the start's pause ran out (_gc_pause_over)
        if self.clock.now() - self._gc_whole_at >= self.full_sync_period:
            gc.unfreeze()
            self._gc_whole_at = self.clock.now()
        gc.collect()
        gc.freeze()

    async def _run(
        self,
        source: Source,
        stop: asyncio.Event,
        *,
        once: bool,
        after_first_sync: Callable[[], object] | None,
    ) -> int:
        if once:
            self.on_events(await initial_state(source))
            ok = await self.sync()
            if ok and after_first_sync is not None:
                await asyncio.to_thread(after_first_sync)
            return 0 if ok else 1

        self.health.waiting_on(lambda: source_problem(source))
        await self.start_servers()
        cleanup: asyncio.Future[object] | None = None

        async def sync() -> bool:
            # The cleanup runs beside the syncs that follow (it takes a second or more
            # of iptables processes on a busy node, which a change must not wait for).
            # It removes nothing the running mode owns (the caller's keep), and the
            # kernel serialises the tools (the xtables lock, nf_tables generations).
            nonlocal cleanup
            ok = await self.sync()
            if ok and cleanup is None and after_first_sync is not None:
                cleanup = asyncio.ensure_future(asyncio.to_thread(after_first_sync))
            return ok

        runner = self.runner = BoundedFrequencyRunner(
            sync, self.config.min_sync_period, self.config.sync_period, self.clock
        )
        initial = asyncio.Event()

        async def consume() -> None:
            async for batch in source.watch(stop):
                wanted = self.on_events(batch)
                del batch  # not held while waiting for the next (or during the first sync)
                if wanted or not initial.is_set():
                    initial.set()
                    runner.run()

        consumer = asyncio.create_task(consume())
        try:
            # Never program a partial view: wait for the source's complete initial state.
            await self._await_initial_state(source, initial, stop, consumer)
            if consumer.done() and consumer.exception() is not None:
                raise consumer.exception()  # type: ignore[misc]
            if not stop.is_set():
                # As upstream's sync loop: count progress from here, so a proxy whose
                # syncs never succeed does become unhealthy.
                self.health.updated()
                self.metrics.queued(self.wall())
                await runner.loop(stop)
        finally:
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
            if cleanup is not None:
                await cleanup  # not left half done (it logs its own failures)
            await self.stop_servers()
        if self.syncs:
            log.info("Stopped; rules stay in place (run 'kubeproxy cleanup' to remove them)")
        else:
            log.info(
                "Stopped before a first successful sync: kubeproxy programmed no rules; "
                "what was programmed before it started is untouched"
            )
        return 0

    async def _await_initial_state(
        self,
        source: Source,
        initial: asyncio.Event,
        stop: asyncio.Event,
        consumer: asyncio.Task[None],
    ) -> None:
        """Until the source's first batch (or ``stop``): every ``waiting_log_seconds``,
        one line saying why nothing is programmed yet (the source's problem, if known)."""
        waiter = asyncio.create_task(initial.wait())
        stopper = asyncio.create_task(stop.wait())
        started = self.clock.now()
        try:
            while True:
                done, _ = await asyncio.wait(
                    {waiter, stopper, consumer},
                    timeout=self.waiting_log_seconds,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if done:
                    return
                problem = source_problem(source)
                unhealthy = self.health.waiting_reason() is not None
                log.warning(
                    "No complete initial state after %.0fs%s; nothing programmed yet "
                    "(rules programmed before this start stay in place)%s",
                    self.clock.now() - started,
                    f": {problem}" if problem else " (still listing)",
                    "; /healthz answers 503" if unhealthy else "",
                )
        finally:
            waiter.cancel()
            stopper.cancel()


def install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
