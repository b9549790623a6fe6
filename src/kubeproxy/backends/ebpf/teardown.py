"""Socket teardown after a sync, on a thread of its own (ebpf mode).

Why a thread: destroying the connected UDP sockets of a removed endpoint
(:meth:`~kubeproxy.dataplane.bpf.socklb.SockLB.destroy_stale`) walks every process of
the hooked cgroup tree, enters each network namespace and dumps its UDP sockets. That
costs milliseconds to seconds, growing with processes and sockets (bench/RESULTS.md,
``bench.ebpf_teardown``), while the map write it follows takes microseconds. In the
sync thread it would hold back the nftables transaction and the next sync; here the
sync hands the removed (frontend, endpoint) pairs over and goes on.

* **Order**: the sync writes the map first, then :meth:`SocketTeardown.submit`: a socket
  destroyed after that reconnects to a live endpoint, never to the removed one.
* **Bounded**: one worker; pairs waiting are merged into one batch (a burst of syncs
  costs one walk), at most :data:`MAX_PENDING` of them (more are dropped, counted and
  logged: nftables mode's conntrack cleanup has no such bound, but it does not walk
  processes either).
* **An endpoint back** before its teardown ran (a flapping Pod) is taken out of the
  batch: the sync passes what each rewritten frontend now holds (and ``destroy_stale``
  skips a target the map holds again when the walk starts).
* **Errors** never fail a sync: logged, counted (``failures``), as a failed conntrack
  deletion in nftables mode; the counts are metrics (:meth:`EbpfBackend.counters`).
* :meth:`SocketTeardown.close` waits (bounded) for the batch in hand, so ``run --once``
  still tears down what its sync removed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kubeproxy.dataplane.bpf.socklb import Frontend, Target

log = logging.getLogger(__name__)

MAX_PENDING = 65536
CLOSE_TIMEOUT = 10.0

Pair = tuple[Frontend, Target]


@dataclass(slots=True)
class TeardownStats:
    """What the worker did so far (read by the metrics at scrape time)."""

    destroyed: int = 0  # sockets destroyed
    failures: int = 0  # walks that raised (each logged)
    dropped: int = 0  # pairs never looked at (over MAX_PENDING, or at close)
    runs: int = 0
    last_seconds: float = 0.0  # wall-clock of the last walk


class SocketTeardown:
    """Runs ``destroy`` (pairs -> sockets destroyed) on a worker thread, started at the
    first :meth:`submit`."""

    def __init__(
        self, destroy: Callable[[list[Pair]], int], *, max_pending: int = MAX_PENDING
    ) -> None:
        self._destroy = destroy
        self._max_pending = max_pending
        self._pending: dict[Pair, None] = {}  # insertion-ordered set
        self._busy = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self.stats = TeardownStats()

    def submit(self, stale: Iterable[Pair], kept: Mapping[Frontend, Iterable[Target]]) -> None:
        """Queue ``stale`` for teardown; first drop waiting pairs whose target is again
        in ``kept`` (what the sync just wrote for each frontend)."""
        with self._cond:
            if self._closing:
                self.stats.dropped += sum(1 for _ in stale)
                return
            for frontend, targets in kept.items():
                for target in targets:
                    self._pending.pop((frontend, target), None)
            over = 0
            for pair in stale:
                if len(self._pending) >= self._max_pending and pair not in self._pending:
                    over += 1
                    continue
                self._pending[pair] = None
            if over:
                self.stats.dropped += over
                log.warning(
                    "ebpf mode: %d removed endpoints' sockets left alone: %d teardowns "
                    "already waiting",
                    over,
                    self._max_pending,
                )
            if not self._pending:
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="ebpf-socket-teardown", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def wait(self, timeout: float | None = None) -> bool:
        """Until nothing waits or runs; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Let the worker finish what waits (up to ``timeout``), then stop it."""
        done = self.wait(timeout)
        with self._cond:
            self._closing = True
            if not done:
                self.stats.dropped += len(self._pending)
                log.warning(
                    "ebpf mode: stopping with %d removed endpoints' sockets not torn down",
                    len(self._pending),
                )
            self._pending.clear()
            self._cond.notify_all()
        # A walk still running after the timeout is left to finish on its own (daemon).

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending) or self._closing)
                if self._closing:
                    return
                batch = list(self._pending)
                self._pending.clear()
                self._busy = True
            started = time.perf_counter()
            destroyed, failed = 0, False
            try:
                destroyed = self._destroy(batch)
            except Exception as err:  # never fatal: as a failed conntrack deletion
                failed = True
                log.warning(
                    "ebpf mode: destroying sockets to %d removed endpoints failed: %s",
                    len(batch),
                    err,
                )
            seconds = time.perf_counter() - started
            if destroyed:
                log.info(
                    "ebpf mode: destroyed %d UDP sockets to removed endpoints in %.3f s",
                    destroyed,
                    seconds,
                )
            with self._cond:
                stats = self.stats
                stats.runs += 1
                stats.destroyed += destroyed
                stats.failures += failed
                stats.last_seconds = seconds
                self._busy = False
                self._cond.notify_all()
