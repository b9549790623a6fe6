"""A bounded-frequency runner: when to sync (upstream's ``BoundedFrequencyRunner``).

Semantics, checked against upstream's ``pkg/proxy/runner/bounded_frequency_runner.go``
(the current rewrite) and the older ``pkg/util/async`` version:

* :meth:`BoundedFrequencyRunner.run` asks for a run. Requests coalesce: any number of
  them while a run is pending, or while one is in progress, give exactly one (further)
  run.
* ``min_interval`` separates the *end* of a run from the start of the next, as upstream
  guarantees ("at least minInterval between the completion of one execution and the
  start of the next"); nothing runs sooner, periodic runs and retries included. (The
  older upstream runner's token bucket counted from a run's start for immediate runs
  but deferred the rest to end + minInterval; measuring from the end everywhere keeps a
  sync that takes longer than ``min_interval`` from running back to back.)
* The function runs at least every ``max_interval`` with no requests (periodic resync,
  which repairs rules someone else changed), counted from the end of the previous run,
  or from the start of :meth:`loop` before the first.
* A failed run (the function returns False or raises) is retried after a delay that
  starts at ``retry_initial`` and doubles per consecutive failure, capped at
  ``max_interval``; a successful run cancels it. Upstream retries at a fixed interval
  (its ``retryInterval``, which kube-proxy sets to syncPeriod); ``retry_initial ==
  max_interval`` gives that. :meth:`retry_after` is upstream's ``RetryAfter``: run again
  no later than the given delay (the sooner of several requests wins).

The clock is injected: :class:`SystemClock` in production, :class:`ManualClock` (time
moves only when told) in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

log = logging.getLogger(__name__)


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock for tests: ``now()`` changes only through :meth:`advance`."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        entry = (self._now + seconds, asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        try:
            await entry[1]
        finally:
            self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has come."""
        self._now += seconds
        for deadline, future in self._sleepers:
            if deadline <= self._now and not future.done():
                future.set_result(None)

    @property
    def sleepers(self) -> int:
        return len(self._sleepers)


class BoundedFrequencyRunner:
    def __init__(
        self,
        fn: Callable[[], Awaitable[bool]],
        min_interval: float,
        max_interval: float,
        clock: Clock | None = None,
        retry_initial: float = 1.0,
    ) -> None:
        if max_interval < min_interval:
            raise ValueError(
                f"max_interval ({max_interval}) must be >= min_interval ({min_interval})"
            )
        self._fn = fn
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.clock = clock or SystemClock()
        self._retry_initial = retry_initial
        self._requested = False
        self._retry_at: float | None = None
        self._failures = 0
        # End of the previous run; before the first run, the start of loop().
        self._last_end: float | None = None
        self._ran = False
        self._wake = asyncio.Event()
        self.runs = 0

    def run(self) -> None:
        """Ask for a run as soon as ``min_interval`` allows."""
        self._requested = True
        self._wake.set()

    def retry_after(self, seconds: float) -> None:
        """Make sure the function runs again no later than ``seconds`` from now."""
        at = self.clock.now() + max(0.0, seconds)
        if self._retry_at is None or at < self._retry_at:
            self._retry_at = at
        self._wake.set()

    def next_run(self) -> float:
        """When the next run is due (clock time), given what is pending now."""
        base = self._last_end if self._last_end is not None else self.clock.now()
        due = base + self.max_interval
        if self._requested:
            due = -float("inf")
        if self._retry_at is not None:
            due = min(due, self._retry_at)
        if self._ran:
            due = max(due, base + self.min_interval)
        return due

    async def loop(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set (a run in progress is finished first)."""
        if self._last_end is None:
            self._last_end = self.clock.now()
        while not stop.is_set():
            now = self.clock.now()
            due = self.next_run()
            if due > now:
                self._wake.clear()
                await self._wait(stop, due - now)
                continue
            await self._run_once()

    async def _wait(self, stop: asyncio.Event, seconds: float) -> None:
        waiters = {
            asyncio.ensure_future(self._wake.wait()),
            asyncio.ensure_future(stop.wait()),
            asyncio.ensure_future(self.clock.sleep(seconds)),
        }
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            for waiter in waiters:
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter

    async def _run_once(self) -> None:
        # Requests and retries made from here on (also from inside fn) ask for another run.
        self._requested = False
        self._retry_at = None
        self.runs += 1
        try:
            ok = await self._fn()
        except Exception:
            log.exception("Sync failed")
            ok = False
        self._ran = True
        self._last_end = self.clock.now()
        if ok:
            self._failures = 0
            return
        delay = min(self._retry_initial * (2**self._failures), self.max_interval)
        self._failures += 1
        retry_at = self._last_end + delay
        if self._retry_at is None or retry_at < self._retry_at:
            self._retry_at = retry_at
        log.info("Sync failed; retrying in %.1fs", delay)
