"""Is the proxy healthy? Upstream's ProxyHealthServer state, without the HTTP part.

The rule (``pkg/proxy/healthcheck/proxy_health.go``): the proxy is healthy unless an
update was queued (:meth:`ProxyHealth.queued_update`, a change is waiting for a sync)
longer than ``health_timeout`` ago — upstream passes twice syncPeriod — and no sync has
succeeded (:meth:`ProxyHealth.updated`) since. Before the first ``updated()`` queued
updates do not count: upstream is healthy while starting up, and calls ``Updated`` once
when its sync loop starts so that a proxy whose syncs never succeed does turn unhealthy.

Where upstream has a gap, ours: upstream is healthy from start until its sync loop
starts, which without an API server (or its informers' first list) may be never — a node
that never programmed a rule would look healthy forever. Here ``/healthz`` (and the
per-Service health checks) turn unhealthy once ``health_timeout`` has passed since the
start without the sync loop starting; ``/livez`` does not, since restarting the process
does not bring the API server back. When the source says why it cannot deliver (the API
server refuses, times out, answers 403: :meth:`ProxyHealth.waiting_on`), ``/healthz`` is
503 at once, with that ``reason`` in its body (a field of ours), until the first sync.

``/healthz`` also fails while the Node is going away (deletionTimestamp set, or the
cluster autoscaler's ``ToBeDeletedByClusterAutoscaler`` taint), so load balancers drain
the node; ``/livez`` ignores the Node so a liveness probe does not restart kube-proxy on
a draining node. The Node counts as eligible until :meth:`ProxyHealth.sync_node` says
otherwise.

:meth:`ProxyHealth.healthz` and :meth:`ProxyHealth.livez` return the status code and the
JSON body upstream writes (``json.Marshal`` of its ProxyHealth struct): ``lastUpdated``,
``currentTime``, ``nodeEligible`` (healthz only), ``healthy`` (the proxy alone, without the
Node) and, once a sync has succeeded, ``status`` per IP family. Times are RFC 3339 with
fractional seconds, as Go marshals a ``time.Time``.

Pure: the wall clock is injected. Not thread-safe: call it from the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from kubeproxy.model.types import IPFamily

# Go's zero time.Time, marshalled: what upstream reports before the first sync.
ZERO_TIME = "0001-01-01T00:00:00Z"


def format_time(seconds: float | None) -> str:
    """RFC 3339 in UTC with trailing zeros of the fraction dropped (Go's RFC3339Nano).

    A float of seconds since the epoch carries about a quarter of a microsecond of
    precision today, so the fraction is rounded to microseconds rather than printing
    nanoseconds that are noise.
    """
    if seconds is None:
        return ZERO_TIME
    whole, micros = divmod(round(seconds * 1_000_000), 1_000_000)
    stamp = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{micros:06d}".rstrip("0")
    return f"{stamp}.{fraction}Z" if fraction else f"{stamp}Z"


def _no_problem() -> str | None:
    return None


class ProxyHealth:
    def __init__(
        self,
        health_timeout: float,
        clock: Callable[[], float],
        families: Iterable[IPFamily] = (IPFamily.IPv4,),
    ) -> None:
        """``families``: the IP families the backend programs; one sync covers them all."""
        self.health_timeout = health_timeout
        self._clock = clock
        # Go marshals the per-family map with its keys sorted.
        self._families = tuple(sorted(set(families)))
        self._last_updated: float | None = None
        self._oldest_queued: float | None = None
        self._node_eligible = True
        self._started = clock()
        self._problem: Callable[[], str | None] = _no_problem

    def waiting_on(self, problem: Callable[[], str | None]) -> None:
        """Until the first sync: ``problem()`` says why the initial state is not there
        (None while nothing is known to be wrong)."""
        self._problem = problem

    def waiting_reason(self, now: float | None = None) -> str | None:
        """Why the proxy has not synced yet, when that makes it unhealthy."""
        if self._last_updated is not None:
            return None
        problem = self._problem()
        if problem is not None:
            return f"no complete initial state yet: {problem}"
        current = self._clock() if now is None else now
        if current - self._started >= self.health_timeout:
            waited = current - self._started
            return f"no complete initial state after {waited:.0f}s"
        return None

    def queued_update(self) -> None:
        """A change is waiting for a sync (upstream QueuedUpdate); the oldest one counts."""
        if self._oldest_queued is None:
            self._oldest_queued = self._clock()

    def updated(self) -> None:
        """A sync succeeded (upstream Updated); also call it when the sync loop starts."""
        self._oldest_queued = None
        self._last_updated = self._clock()

    def sync_node(self, deleting: bool, to_be_deleted_taint: bool) -> None:
        """This node's Node object changed: is it still eligible for load-balancer traffic?"""
        self._node_eligible = not (deleting or to_be_deleted_taint)

    @property
    def node_eligible(self) -> bool:
        return self._node_eligible

    def is_healthy(self, now: float | None = None, *, waiting_counts: bool = True) -> bool:
        """The proxy's own health, ignoring the Node (what per-Service health checks use).

        ``waiting_counts``: whether waiting longer than ``health_timeout`` for the first
        complete state (the sync loop not started) is unhealthy (not for ``/livez``)."""
        current = self._clock() if now is None else now
        if self._last_updated is None:
            return not waiting_counts or self.waiting_reason(current) is None
        if self._oldest_queued is None:
            return True
        return current - self._oldest_queued < self.health_timeout

    def healthz(self) -> tuple[int, dict[str, object]]:
        return self._report(with_node=True)

    def livez(self) -> tuple[int, dict[str, object]]:
        return self._report(with_node=False)

    def _report(self, *, with_node: bool) -> tuple[int, dict[str, object]]:
        now = self._clock()
        healthy = self.is_healthy(now, waiting_counts=with_node)
        ok = healthy and (self._node_eligible or not with_node)
        # Older releases reported when the sync loop last ran; upstream keeps that meaning
        # by answering "now" while healthy, and the real last success when not.
        body: dict[str, object] = {
            "lastUpdated": format_time(now if ok else self._last_updated),
            "currentTime": format_time(now),
        }
        if with_node:
            body["nodeEligible"] = self._node_eligible
        body["healthy"] = healthy
        if with_node and not healthy:
            reason = self.waiting_reason(now)
            if reason is not None:
                body["reason"] = reason
        if self._last_updated is not None:
            per_family = {"lastUpdated": format_time(self._last_updated), "healthy": healthy}
            body["status"] = {family.value: dict(per_family) for family in self._families}
        return (200 if ok else 503), body
