"""Every metric kubeproxy exposes, in one place, with upstream kube-proxy's names.

:class:`Metrics` owns a private ``CollectorRegistry`` (one per instance: no global
registry, so tests and several proxies in one process do not collide) and the metrics of
``pkg/proxy/metrics/metrics.go``, all ``kubeproxy_`` prefixed:

=========================================================  =========  ======================
name                                                       type       set by
=========================================================  =========  ======================
sync_proxy_rules_duration_seconds                          histogram  observe_sync, sync_failed
sync_full_proxy_rules_duration_seconds                     histogram  (full syncs)
sync_partial_proxy_rules_duration_seconds                  histogram  (partial syncs)
sync_proxy_rules_last_timestamp_seconds                    gauge      observe_sync
sync_proxy_rules_last_queued_timestamp_seconds             gauge      queued
network_programming_duration_seconds                       histogram  observe_sync
sync_proxy_rules_endpoint_changes_pending / _total         gauge/ctr  pending / changes_seen
sync_proxy_rules_service_changes_pending / _total          gauge/ctr  pending / changes_seen
sync_proxy_rules_no_local_endpoints_total{traffic_policy}  gauge      observe_sync
sync_proxy_rules_nftables_sync_failures_total              counter    sync_failed
sync_proxy_rules_nftables_cleanup_failures_total           counter    cleanup_failed
conntrack_reconciler_sync_duration_seconds                 histogram  conntrack_cleaned
conntrack_reconciler_deleted_entries_total                 counter    conntrack_cleaned
proxy_healthz_total{code} / proxy_livez_total{code}        counter    count_healthz/_livez
=========================================================  =========  ======================

Each of them but the four ``*_changes_*`` and the two probe counters also carries
upstream's ``ip_family`` label (1.33+), whose metaproxier runs one proxier per family,
each labelling what it does. kubeproxy programs every family it serves
(``families``, detected from the node as upstream does) in one sync, so a sync's
duration, timestamp and failure are recorded under each of them; a network-programming
sample goes under its EndpointSlice's address family, and the no-local-endpoints counts
and iptables rule counts under the family they were counted in. Labelled series appear
on first use, as upstream's vectors (the failure counters start at 0 per family, so an
alert has a series). Summed over ``ip_family``, a dual-stack node's sync counts are twice
its syncs; upstream's are the syncs of its two proxiers.

``nftables_cleanup_failures_total`` counts what upstream's does: failures of the
transaction that deletes stale nftables chains. kubeproxy deletes stale chains inside the
sync's own transaction (in reference order), so there is no separate cleanup to fail and
it stays 0, registered for dashboards built for kube-proxy; a failed *conntrack* cleanup
is not one of them: each one is logged on its own line by
:func:`kubeproxy.dataplane.conntrack.apply` and counted in our
``kubeproxy_conntrack_cleanup_failures_total{ip_family}``. Upstream has no such counter
because its reconciler rescans the whole table on every sync; kubeproxy deletes by
filter, keeps a failed filter and retries it (see :mod:`kubeproxy.app`), and the counter
shows a node whose conntrack deletions keep failing.

The ``conntrack_reconciler_*`` pair is upstream's (1.33+) for clearing stale conntrack
entries. Upstream's reconciler scans the table on every sync; kubeproxy deletes by filter
after a sync that made UDP entries stale, so a histogram sample is one such cleanup (per
family) and syncs with nothing stale add none.

component-base's two metadata gauges, as every Kubernetes component exposes them:
``kubernetes_build_info{major,minor,git_version,git_commit,git_tree_state,build_date,
go_version,compiler,platform}`` 1 (:func:`build_info`: kubeproxy's version; the runtime in
``go_version`` and ``compiler`` is Python's, e.g. ``python3.11.2`` / ``cpython``; the git
fields and build date are those of an unstamped upstream build, as kubeproxy is not
stamped), and ``kubernetes_feature_enabled{name,stage}`` 0 or 1 for every feature gate
kubeproxy knows (``stage`` as upstream: ``ALPHA``, ``BETA``, empty for GA), from the
effective configuration.

Process metrics, as upstream's Go registry has (``process_*``: CPU seconds, resident and
virtual memory, start time, open and max fds), from prometheus_client's ProcessCollector;
the Go runtime collectors' analogue is ``python_info`` and ``python_gc_*``.

In iptables mode also upstream's ``sync_proxy_rules_iptables_total{table,ip_family}``,
``..._iptables_last{table,ip_family}`` (rules written by the last sync),
``..._iptables_partial_restore_failures_total{ip_family}``, and the two read from nfacct counters
when a scrape comes (:attr:`Metrics.counter_reader`, set to the backend's ``counters``):
``kubeproxy_iptables_localhost_nodeports_accepted_packets_total`` and
``kubeproxy_iptables_ct_state_invalid_dropped_packets_total``, absent (as upstream's) when
the node has no nfacct support.

In ebpf mode (ours, read from the backend at scrape time in the same way): the socket
teardown after syncs, ``kubeproxy_ebpf_sockets_destroyed_total``,
``kubeproxy_ebpf_socket_teardown_failures_total`` (failed walks, each logged) and
``kubeproxy_ebpf_socket_teardown_dropped_total`` (removed endpoints whose sockets were
never looked at: see :mod:`kubeproxy.backends.ebpf.teardown`).

The sync-failure counter is named per mode, as upstream (``..._nftables_sync_failures_total``
in nftables mode, ``..._iptables_restore_failures_total`` in iptables and ipvs modes;
ours in ebpf and kernelspace modes, ``..._ebpf_sync_failures_total`` and
``..._kernelspace_sync_failures_total``: upstream's kernelspace mode registers no
mode-specific metric); the cleanup-failure counter exists in nftables mode only.

Ours (upstream's nftables mode has no count of what it programmed):
``kubeproxy_sync_proxy_rules_nftables_elements`` and ``..._nftables_chains`` (gauges,
after the last successful sync), and ``kubeproxy_sync_proxy_rules_isolated_service_ports``
(gauge): Service ports left out because the kernel refused their rules (each is logged
with its name; see the nftables proxier).

Durations are observed for failed syncs too, as upstream does. Histogram buckets are
upstream's, including the leading 0 bucket its MergeBuckets helper adds to
network_programming_duration_seconds.

:class:`MetricsServer` serves what upstream's serveMetrics serves on metricsBindAddress:
``/metrics`` (Prometheus text format), ``/healthz`` ("ok"), ``/proxyMode`` and ``/configz``
(the effective configuration as JSON, under ``kubeproxy.config.k8s.io``; kubeproxy shows
the v1alpha1 form, upstream its internal one, which has almost the same fields). With
``enableProfiling`` also ``/debug/pprof/`` (:mod:`kubeproxy.profiling`: thread and task
stacks, a CPU profile as collapsed stacks, tracemalloc's heap) and ``/debug/flags/v``
(``PUT`` a number to change the log verbosity, as upstream); without it they are 404.
Not served: ``/metrics/slis`` and the alpha ``/flagz`` and ``/statusz`` pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import platform
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kubeproxy import __version__, logs, profiling
from kubeproxy.backends.base import SyncResult
from kubeproxy.config.modes import ProxyMode
from kubeproxy.health.listener import BindAddress, HttpListener, json_response

DEFAULT_METRICS_BIND_ADDRESS = "127.0.0.1:10249"

# ExponentialBuckets(0.001, 2, 15): 1ms .. 16.384s.
SYNC_DURATION_BUCKETS = tuple(0.001 * 2**i for i in range(15))
# 0, 0.25s, 0.5s, 1..59s, 60..115s by 5s, 2..5min by 30s.
NETWORK_PROGRAMMING_BUCKETS = (
    0.0,
    0.25,
    0.5,
    *(float(s) for s in range(1, 60)),
    *(float(s) for s in range(60, 120, 5)),
    *(float(s) for s in range(120, 301, 30)),
)


# Upstream's per-family proxiers label most of their metrics with the family they serve.
FAMILY = ("ip_family",)

# client-go's rest_client_request_duration_seconds buckets.
REST_CLIENT_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)


# Sync failures, named per proxy mode as upstream (only the active mode's is registered).
SYNC_FAILURES = {
    "nftables": ("sync_proxy_rules_nftables_sync_failures_total", "nftables sync failures"),
    "iptables": ("sync_proxy_rules_iptables_restore_failures_total", "iptables restore failures"),
    "ipvs": ("sync_proxy_rules_iptables_restore_failures_total", "iptables restore failures"),
}


# Go's GOARCH for the machine names Linux reports (upstream's platform label is GOOS/GOARCH).
_GOARCH = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "armv7l": "arm",
    "i686": "386",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}

BUILD_INFO_LABELS = (
    "major",
    "minor",
    "git_version",
    "git_commit",
    "git_tree_state",
    "build_date",
    "go_version",
    "compiler",
    "platform",
)


def build_info(version: str = __version__) -> dict[str, str]:
    """The labels of ``kubernetes_build_info``, as component-base's version.Get() fills
    them, for this kubeproxy and this Python."""
    major, minor = [*version.split("."), "", ""][:2]
    machine = platform.machine().lower()
    return {
        "major": major,
        "minor": minor,
        "git_version": f"v{version}",
        # Not stamped at build time: what an unstamped upstream build reports.
        "git_commit": "",
        "git_tree_state": "",
        "build_date": "1970-01-01T00:00:00Z",
        "go_version": f"python{platform.python_version()}",
        "compiler": platform.python_implementation().lower(),
        "platform": f"{platform.system().lower()}/{_GOARCH.get(machine, machine)}",
    }


class Metrics:
    """The metrics of one proxy in ``mode`` (the mode decides a few names, as upstream)."""

    def __init__(
        self,
        mode: str = "nftables",
        *,
        features: Iterable[tuple[str, str, bool]] = (),
        families: Iterable[str] = ("IPv4",),
    ) -> None:
        """``features``: (name, stage, enabled) of every known feature gate
        (:func:`kubeproxy.config.features.feature_states`); ``families``: the IP families
        this proxy serves ("IPv4", "IPv6"), the values of the ``ip_family`` label."""
        self.mode = mode
        self.families = tuple(str(f) for f in families)
        self.registry = CollectorRegistry(auto_describe=True)
        # Upstream's registry carries the process and Go runtime collectors; these are
        # the Python equivalents, on this instance's registry (no global one).
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        # component-base's legacy registry: every component's build and feature gates.
        info = build_info()
        Gauge(
            "kubernetes_build_info",
            "A metric with a constant '1' value labeled by major, minor, git version, git "
            "commit, git tree state, build date, Go version, and compiler from which "
            "Kubernetes was built, and platform on which it is running.",
            BUILD_INFO_LABELS,
            registry=self.registry,
        ).labels(*(info[label] for label in BUILD_INFO_LABELS)).set(1)
        self.features = Gauge(
            "kubernetes_feature_enabled",
            "This metric records the data about the stage and enablement of a k8s feature.",
            ("name", "stage"),
            registry=self.registry,
        )
        for name, stage, enabled in features:
            self.features.labels(name, stage).set(1 if enabled else 0)

        def histogram(
            name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = FAMILY
        ) -> Histogram:
            return Histogram(
                f"kubeproxy_{name}", doc, labels, buckets=buckets, registry=self.registry
            )

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(f"kubeproxy_{name}", doc, labels, registry=self.registry)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"kubeproxy_{name}", doc, labels, registry=self.registry)

        self.sync_duration = histogram(
            "sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            SYNC_DURATION_BUCKETS,
        )
        self.sync_full_duration = histogram(
            "sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            SYNC_DURATION_BUCKETS,
        )
        self.sync_partial_duration = histogram(
            "sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            SYNC_DURATION_BUCKETS,
        )
        self.last_sync = gauge(
            "sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            FAMILY,
        )
        self.last_queued = gauge(
            "sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            FAMILY,
        )
        self.network_programming = histogram(
            "network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            NETWORK_PROGRAMMING_BUCKETS,
        )
        self.endpoint_changes_pending = gauge(
            "sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes"
        )
        self.endpoint_changes = counter(
            "sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes"
        )
        self.service_changes_pending = gauge(
            "sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes"
        )
        self.service_changes = counter(
            "sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes"
        )
        self.no_local_endpoints = gauge(
            "sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            ("traffic_policy", "ip_family"),
        )
        failures, what = SYNC_FAILURES.get(
            mode, (f"sync_proxy_rules_{mode}_sync_failures_total", f"{mode} sync failures")
        )
        self.sync_failures = counter(failures, f"Cumulative proxy {what}", FAMILY)
        self.cleanup_failures = (
            counter(
                "sync_proxy_rules_nftables_cleanup_failures_total",
                "Cumulative proxy nftables cleanup failures",
                FAMILY,
            )
            if mode == ProxyMode.NFTABLES
            else None
        )
        # Failure counters start at 0 for each family, so a rate or an alert has a series.
        for family in self.families:
            self.sync_failures.labels(family)
            if self.cleanup_failures is not None:
                self.cleanup_failures.labels(family)
        self.isolated = gauge(
            "sync_proxy_rules_isolated_service_ports",
            "Service ports left out of the rules because the kernel refused them",
        )
        self.conntrack_duration = histogram(
            "conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            SYNC_DURATION_BUCKETS,
        )
        self.conntrack_deleted = counter(
            "conntrack_reconciler_deleted_entries_total",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            FAMILY,
        )
        self.conntrack_failures = counter(
            "conntrack_cleanup_failures_total",
            "Stale conntrack deletions that failed (each is retried)",
            FAMILY,
        )
        self.healthz = counter(
            "proxy_healthz_total", "Cumulative proxy healthz HTTP status", ("code",)
        )
        self.livez = counter("proxy_livez_total", "Cumulative proxy livez HTTP status", ("code",))
        # iptables mode (upstream's names): rules per table, written by the last sync, and
        # partial restores refused (each followed by a full one).
        self.iptables_rules: Gauge | None = None
        self.iptables_rules_last: Gauge | None = None
        self.iptables_partial_failures: Counter | None = None
        if mode == ProxyMode.IPTABLES:
            self.iptables_rules = gauge(
                "sync_proxy_rules_iptables_total",
                "Total number of iptables rules owned by kube-proxy",
                ("table", "ip_family"),
            )
            self.iptables_rules_last = gauge(
                "sync_proxy_rules_iptables_last",
                "Number of iptables rules written by kube-proxy in last sync",
                ("table", "ip_family"),
            )
            self.iptables_partial_failures = counter(
                "sync_proxy_rules_iptables_partial_restore_failures_total",
                "Cumulative proxy iptables partial restore failures",
                FAMILY,
            )
            for family in self.families:
                self.iptables_partial_failures.labels(family)
        # client-go's REST client metrics (k8s.io/client-go/tools/metrics, as registered by
        # component-base), for requests to the API server.
        self.api_requests = Counter(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            ("code", "host", "method"),
            registry=self.registry,
        )
        self.api_request_duration = Histogram(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host.",
            ("host", "verb"),
            buckets=REST_CLIENT_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Goroutines())
        # Kernel counters, read at scrape time (iptables mode's nfacct objects).
        self.counter_reader: Callable[[], Mapping[str, int]] = dict
        if mode in (ProxyMode.IPTABLES, ProxyMode.EBPF):
            self.registry.register(_KernelCounters(self))
        # What the nftables backend programmed (ours; other modes count their own way).
        self.nftables_elements: Gauge | None = None
        self.nftables_chains: Gauge | None = None
        if mode == ProxyMode.NFTABLES:
            self.nftables_elements = gauge(
                "sync_proxy_rules_nftables_elements",
                "Number of nftables set and map elements programmed by kube-proxy",
            )
            self.nftables_chains = gauge(
                "sync_proxy_rules_nftables_chains",
                "Number of nftables chains programmed by kube-proxy",
            )

    # ------------------------------------------------------------ sync phases

    def queued(self, now: float) -> None:
        """A sync was requested (wall-clock ``now``)."""
        for family in self.families:
            self.last_queued.labels(family).set(now)

    def changes_seen(self, services: int = 0, endpoints: int = 0) -> None:
        """Count Service / EndpointSlice events handed to the change trackers."""
        self.service_changes.inc(services)
        self.endpoint_changes.inc(endpoints)

    def pending(self, services: int, endpoints: int) -> None:
        """Objects with changes waiting for a sync (0, 0 once a sync has collected them)."""
        self.service_changes_pending.set(services)
        self.endpoint_changes_pending.set(endpoints)

    def idle_sync(self, now: float) -> None:
        """A periodic run found no change and the rules intact (the canary check)."""
        for family in self.families:
            self.last_sync.labels(family).set(now)

    def observe_sync(
        self,
        result: SyncResult,
        seconds: float,
        *,
        full: bool,
        trigger_times: Iterable[tuple[str, float]],
        now: float,
    ) -> None:
        """A sync succeeded after ``seconds``, at wall-clock ``now``.

        ``trigger_times``: the EndpointSlices' last-change-trigger-time values (epoch
        seconds) that this sync programmed, each with its slice's address family; each
        one is one network-programming sample.
        """
        self._observe_duration(seconds, full=full)
        for family in self.families:
            self.last_sync.labels(family).set(now)
            internal, external = result.no_local.get(family, (0, 0))
            self.no_local_endpoints.labels("internal", family).set(internal)
            self.no_local_endpoints.labels("external", family).set(external)
        for family, trigger_time in trigger_times:
            self.network_programming.labels(family).observe(now - trigger_time)
        if self.nftables_elements is not None and self.nftables_chains is not None:
            self.nftables_elements.set(result.elements)
            self.nftables_chains.set(result.chains)
        self.isolated.set(len(result.isolated))
        if self.iptables_rules is not None and self.iptables_rules_last is not None:
            for (family, table), count in result.table_rules.items():
                self.iptables_rules.labels(table, family).set(count)
            for (family, table), count in result.table_rules_written.items():
                self.iptables_rules_last.labels(table, family).set(count)
        if self.iptables_partial_failures is not None:
            for family, times in result.partial_failures.items():
                self.iptables_partial_failures.labels(family).inc(times)

    def sync_failed(self, seconds: float, *, full: bool) -> None:
        """The kernel refused the transaction (or rendering failed) after ``seconds``."""
        self._observe_duration(seconds, full=full)
        for family in self.families:
            self.sync_failures.labels(family).inc()

    def cleanup_failed(self) -> None:
        """The transaction deleting stale nftables chains failed (not conntrack)."""
        assert self.cleanup_failures is not None, "nftables mode only"
        for family in self.families:
            self.cleanup_failures.labels(family).inc()

    def conntrack_cleaned(self, family: str, seconds: float, deleted: int, failed: int = 0) -> None:
        """Stale conntrack entries of ``family`` ("IPv4"/"IPv6") were cleared; ``failed``
        deletions were refused (they are retried)."""
        self.conntrack_duration.labels(family).observe(seconds)
        self.conntrack_deleted.labels(family).inc(deleted)
        self.conntrack_failures.labels(family).inc(failed)

    def _observe_duration(self, seconds: float, *, full: bool) -> None:
        kind = self.sync_full_duration if full else self.sync_partial_duration
        for family in self.families:
            self.sync_duration.labels(family).observe(seconds)
            kind.labels(family).observe(seconds)

    # ---------------------------------------------------------- API requests

    def api_request(self, method: str, host: str, code: str, seconds: float) -> None:
        """One request to the API server answered with ``code`` ("<error>": no answer)
        after ``seconds`` (until the response headers, as client-go measures)."""
        self.api_requests.labels(code, host, method).inc()
        self.api_request_duration.labels(host, method).observe(seconds)

    # ----------------------------------------------------------------- probes

    def count_healthz(self, code: int) -> None:
        self.healthz.labels(str(code)).inc()

    def count_livez(self, code: int) -> None:
        self.livez.labels(str(code)).inc()

    # ------------------------------------------------------------- exposition

    def exposition(self) -> bytes:
        """The Prometheus text format, as ``/metrics`` serves it."""
        return generate_latest(_WithoutCreated(self.registry))


# The backend's counter -> (metric, help): upstream's nfacct ones (pkg/proxy/metrics),
# then ebpf mode's socket teardown (ours).
KERNEL_COUNTERS = {
    "localhost_nps_accepted_pkts": (
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
        "Number of localhost nodeport accepted packets",
    ),
    "ct_state_invalid_dropped_pkts": (
        "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
        "packets dropped by iptables to work around conntrack problems",
    ),
    "ebpf_sockets_destroyed": (
        "kubeproxy_ebpf_sockets_destroyed_total",
        "Connected UDP sockets destroyed because their endpoint was removed (ebpf mode)",
    ),
    "ebpf_socket_teardown_failures": (
        "kubeproxy_ebpf_socket_teardown_failures_total",
        "Socket teardowns after a sync that failed (each is logged; ebpf mode)",
    ),
    "ebpf_socket_teardown_dropped": (
        "kubeproxy_ebpf_socket_teardown_dropped_total",
        "Removed endpoints whose sockets were not torn down: too many waiting, or at stop",
    ),
}


class _KernelCounters(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterator[Metric]:
        return iter(())  # which exist is known only when the backend has started

    def collect(self) -> Iterator[Metric]:
        values = self._metrics.counter_reader()
        for counter, (name, doc) in KERNEL_COUNTERS.items():
            if counter in values:
                yield CounterMetricFamily(name, doc, value=values[counter])


class _Goroutines(Collector):
    """``go_goroutines``, which kube-proxy dashboards chart: here the closest analogue,
    threads plus asyncio tasks (the help text says so)."""

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("go_goroutines", "")

    def collect(self) -> Iterator[Metric]:
        tasks = 0
        with contextlib.suppress(RuntimeError):  # scraped outside the event loop
            tasks = len(asyncio.all_tasks())
        yield GaugeMetricFamily(
            "go_goroutines",
            "Number of goroutines that currently exist (kubeproxy: threads plus asyncio tasks)",
            value=threading.active_count() + tasks,
        )


class _WithoutCreated(Collector):
    """The registry minus the OpenMetrics ``*_created`` series.

    Upstream's Go client does not expose them in the text format, and switching them
    off in prometheus_client is a process-wide setting.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            created = metric.name + "_created"
            kept.samples = [s for s in metric.samples if s.name != created]
            yield kept


class MetricsServer(HttpListener):
    def __init__(
        self,
        metrics: Metrics,
        address: str = DEFAULT_METRICS_BIND_ADDRESS,
        proxy_mode: str = "nftables",
        *,
        profiling: bool = False,
        configz: Mapping[str, object] | None = None,
        set_verbosity: Callable[[int], None] = logs.set_verbosity,
    ) -> None:
        """Raises ValueError for a malformed ``address``; :meth:`start` raises OSError.

        ``profiling`` mounts ``/debug/pprof/`` and ``/debug/flags/v``; ``configz`` is the
        configuration ``/configz`` shows.
        """
        self.address = BindAddress.parse(address)

        async def serve_metrics(_: web.Request) -> web.Response:
            return web.Response(
                body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4}
            )

        async def serve_ok(_: web.Request) -> web.Response:
            return _text("ok")

        async def serve_mode(_: web.Request) -> web.Response:
            return _text(proxy_mode)

        async def serve_configz(_: web.Request) -> web.Response:
            return json_response(200, {CONFIGZ_NAME: configz or {}})

        app = web.Application()
        app.router.add_get("/metrics", serve_metrics)
        app.router.add_get("/healthz", serve_ok)
        app.router.add_get("/healthz/ping", serve_ok)
        app.router.add_get("/proxyMode", serve_mode)
        app.router.add_route("*", "/configz", serve_configz)
        if profiling:
            _add_profiling(app, set_verbosity)
        super().__init__(app, [self.address.host], self.address.port)


# configz.New(kubeproxyconfig.GroupName): the key /configz shows the configuration under.
CONFIGZ_NAME = "kubeproxy.config.k8s.io"

_PROFILES = {
    "cmdline": "The command line invocation of the current program (NUL-separated)",
    "goroutine": "Stack traces of all threads and asyncio tasks",
    "heap": "The lines holding the most live memory (tracemalloc)",
    "profile": "CPU profile as collapsed stacks; seconds=N (default 30), mode=wall for "
    "every sample of every thread",
}


def _text(body: str, status: int = 200) -> web.Response:
    response = web.Response(text=body, status=status)
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def _add_profiling(app: web.Application, set_verbosity: Callable[[int], None]) -> None:
    """Upstream's ``routes.Profiling`` and ``routes.DebugFlags`` (``v``), in Python terms."""
    profiler = profiling.CpuProfiler()

    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPMovedPermanently("/debug/pprof/")

    async def index(_: web.Request) -> web.Response:
        rows = "".join(
            f"<tr><td><a href='{name}'>{name}</a></td><td>{html.escape(what)}</td></tr>\n"
            for name, what in _PROFILES.items()
        )
        body = (
            "<html><head><title>/debug/pprof/</title></head><body>\n/debug/pprof/<br>\n"
            f"<p>Profiles:</p>\n<table>\n{rows}</table>\n</body></html>\n"
        )
        return web.Response(text=body, content_type="text/html")

    async def profile(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name == "goroutine":
            return _text(profiling.goroutines())
        if name == "heap":
            top = _positive(request.query.get("top"), profiling.HEAP_TOP)
            text = await asyncio.to_thread(profiling.heap, top)
            if text is None:
                return _text("tracemalloc is not tracing\n", 500)
            return _text(text)
        if name == "profile":
            seconds = _positive(request.query.get("seconds"), profiling.DEFAULT_PROFILE_SECONDS)
            try:
                stacks = await profiler.profile(seconds, wall=request.query.get("mode") == "wall")
            except profiling.ProfilerBusyError as err:
                return _text(f"Could not enable CPU profiling: {err}\n", 500)
            return _text(stacks)
        if name == "cmdline":
            return _text(profiling.cmdline())
        return _text("Unknown profile\n", 404)

    async def flags_index(_: web.Request) -> web.Response:
        body = (
            "<html><head><title>/debug/flags/</title></head><body>\n/debug/flags/<br>\n"
            "<br>\nflags:<br>\n<table>\n<tr>v<br>\n</table>\n<br>\n"
            "full flags configurable<br>\n</body></html>\n"
        )
        return web.Response(text=body, content_type="text/html")

    async def put_verbosity(request: web.Request) -> web.Response:
        # routes.StringFlagPutHandler(logs.GlogSetter): PUT the level as the body.
        if request.method != "PUT":
            return _text("unsupported http method\n", 406)
        value = await request.text()
        if not re.fullmatch(r"[+-]?[0-9]+", value) or not -(2**31) <= int(value) < 2**31:
            return _text(
                f"failed set klog.logging.verbosity {value}: strconv.ParseInt: "
                f"parsing {json.dumps(value)}: invalid syntax\n",
                400,
            )
        set_verbosity(int(value))
        return _text(f"successfully set klog.logging.verbosity to {value}\n")

    app.router.add_route("*", "/debug/pprof", redirect)
    app.router.add_route("*", "/debug/pprof/", index)
    app.router.add_route("*", "/debug/pprof/{name}", profile)
    app.router.add_route("*", "/debug/flags", flags_index)
    app.router.add_route("*", "/debug/flags/", flags_index)
    app.router.add_route("*", "/debug/flags/v", put_verbosity)


def _positive(text: str | None, default: int) -> int:
    """Go's handlers: a missing, malformed or non-positive number means the default."""
    try:
        value = int(text or "")
    except ValueError:
        return default
    return value if value > 0 else default
