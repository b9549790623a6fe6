"""A bounded-frequency runner: when to sync (upstream's ``async.BoundedFrequencyRunner``).

* A change calls :meth:`BoundedFrequencyRunner.run`; the function then runs no sooner than
  ``min_interval`` after the previous run *started*, so a burst of changes coalesces into
  few runs.
* The function runs at least every ``max_interval`` even with no changes (periodic
  resync, which repairs rules someone else changed).
* A failed run (the function returns False or raises) is retried with exponential
  backoff, capped at ``max_interval``.

The clock is injected: :class:`SystemClock` in production, a manual clock in tests.
"""

from __future__ import annotations

import asyncio
import logging
import math
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


class BoundedFrequencyRunner:
    def __init__(
        self,
        fn: Callable[[], Awaitable[bool]],
        min_interval: float,
        max_interval: float,
        clock: Clock | None = None,
        retry_initial: float = 1.0,
    ) -> None:
        self._fn = fn
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.clock = clock or SystemClock()
        self._retry_initial = retry_initial
        self._requested = False
        self._retry_at: float | None = None
        self._failures = 0
        self._last_start = -math.inf
        self._wake = asyncio.Event()
        self.runs = 0

    def run(self) -> None:
        """Ask for a run as soon as ``min_interval`` allows."""
        self._requested = True
        self._wake.set()

    def _due(self) -> float:
        candidates = [self._last_start + self.max_interval]
        if self._requested:
            candidates.append(self._last_start + self.min_interval)
        if self._retry_at is not None:
            candidates.append(self._retry_at)
        return min(candidates)

    async def loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = self.clock.now()
            due = self._due()
            if due > now:
                self._wake.clear()
                waiters = {
                    asyncio.ensure_future(self._wake.wait()),
                    asyncio.ensure_future(stop.wait()),
                    asyncio.ensure_future(self.clock.sleep(due - now)),
                }
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters:
                        w.cancel()
                continue
            await self._run_once(now)

    async def _run_once(self, now: float) -> None:
        self._last_start = now
        self._requested = False
        self._retry_at = None
        self.runs += 1
        try:
            ok = await self._fn()
        except Exception:
            log.exception("Sync failed")
            ok = False
        if ok:
            self._failures = 0
            return
        delay = min(self._retry_initial * (2**self._failures), self.max_interval)
        self._failures += 1
        self._retry_at = self.clock.now() + delay
        log.info("Sync failed; retrying in %.1fs", delay)
