"""Composition root: source → ProxyState (trackers) → runner → backend.

:class:`Proxy` owns the wiring and the sync decision (full or partial); the phases of a
sync are: ``collect`` (fold tracker changes into a snapshot, in the event loop thread),
then the backend's render/apply (in a worker thread so the event loop keeps serving),
then ``report`` (log the result).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from kubeproxy.backends import Backend
from kubeproxy.config import ProxyConfig
from kubeproxy.model.state import ProxyState
from kubeproxy.runner import BoundedFrequencyRunner, Clock, SystemClock
from kubeproxy.sources.events import dispatch
from kubeproxy.sources.manifests import ManifestSource

log = logging.getLogger("kubeproxy")


@dataclass
class SyncOutcome:
    ok: bool
    full: bool
    seconds: float


class Proxy:
    def __init__(
        self,
        config: ProxyConfig,
        backend: Backend,
        clock: Clock | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.backend = backend
        self.clock = clock or SystemClock()
        self.wall = wall
        self.state = ProxyState(config.hostname, config.bind_ip())
        self._needs_full = True
        self._last_full = -float("inf")
        self.syncs = 0
        self.last_outcome: SyncOutcome | None = None
        self._conflicts: set[str] = set()

    async def sync(self) -> bool:
        """One sync: collect (here), render + apply (worker thread), report."""
        snapshot, changes = self.state.collect()
        full = (
            self._needs_full
            or changes.node_changed
            or self.clock.now() - self._last_full >= self.config.sync_period
        )
        started = time.perf_counter()
        try:
            result = await asyncio.to_thread(
                self.backend.sync, snapshot, None if full else changes.service_ports
            )
        except Exception as err:
            self._needs_full = True
            seconds = time.perf_counter() - started
            self.last_outcome = SyncOutcome(False, full, seconds)
            log.error("Sync failed after %.3fs, keeping the previous rules: %s", seconds, err)
            return False
        seconds = time.perf_counter() - started
        self.syncs += 1
        if full:
            self._last_full = self.clock.now()
        self._needs_full = False
        self.last_outcome = SyncOutcome(True, full, seconds)
        for message in result.conflicts:
            log.error("%s", message)
        log.info(
            "Synced %s rules in %.3fs: %d service ports (%d re-rendered), %d elements, "
            "%d shared chains",
            "full" if full else "partial",
            seconds,
            result.service_ports,
            result.rendered,
            result.elements,
            result.chains,
        )
        return True

    async def run(self, source: ManifestSource, stop: asyncio.Event, *, once: bool = False) -> int:
        if once:
            dispatch(self.state, source.reload())
            return 0 if await self.sync() else 1

        runner = BoundedFrequencyRunner(
            self.sync, self.config.min_sync_period, self.config.sync_period, self.clock
        )
        initial = asyncio.Event()

        async def consume() -> None:
            async for batch in source.watch(stop):
                if dispatch(self.state, batch) or not initial.is_set():
                    initial.set()
                    runner.run()

        consumer = asyncio.create_task(consume())
        # Never program a partial view: wait until the source delivered its initial state.
        waiter = asyncio.create_task(initial.wait())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopper.cancel()
        if not stop.is_set():
            await runner.loop(stop)
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        log.info("Stopped; rules stay in place (run 'kubeproxy cleanup' to remove them)")
        return 0


def install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
