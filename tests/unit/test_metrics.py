"""kubeproxy.metrics: upstream's metric names, types and buckets, and the /metrics server."""

from __future__ import annotations

import asyncio

import pytest

from kubeproxy import __version__
from kubeproxy.backends.base import SyncResult
from kubeproxy.config.defaults import default_config
from kubeproxy.config.features import FEATURE_GATE_STAGES, KNOWN_FEATURE_GATES, feature_states
from kubeproxy.config.flags import apply_flags
from kubeproxy.health import HealthServer, ProxyHealth
from kubeproxy.metrics import (
    NETWORK_PROGRAMMING_BUCKETS,
    SYNC_DURATION_BUCKETS,
    Metrics,
    MetricsServer,
    build_info,
)
from tests.unit.test_health import T0, FakeClock, fetch, started

# Every metric /metrics must expose, with its Prometheus type.
EXPECTED = {
    "kubeproxy_sync_proxy_rules_duration_seconds": "histogram",
    "kubeproxy_sync_full_proxy_rules_duration_seconds": "histogram",
    "kubeproxy_sync_partial_proxy_rules_duration_seconds": "histogram",
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds": "gauge",
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": "gauge",
    "kubeproxy_network_programming_duration_seconds": "histogram",
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending": "gauge",
    "kubeproxy_sync_proxy_rules_endpoint_changes_total": "counter",
    "kubeproxy_sync_proxy_rules_service_changes_pending": "gauge",
    "kubeproxy_sync_proxy_rules_service_changes_total": "counter",
    "kubeproxy_sync_proxy_rules_no_local_endpoints_total": "gauge",
    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total": "counter",
    "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total": "counter",
    "kubeproxy_conntrack_reconciler_sync_duration_seconds": "histogram",
    "kubeproxy_conntrack_reconciler_deleted_entries_total": "counter",
    "kubeproxy_conntrack_cleanup_failures_total": "counter",
    "kubeproxy_proxy_healthz_total": "counter",
    "kubeproxy_proxy_livez_total": "counter",
    "kubeproxy_sync_proxy_rules_nftables_elements": "gauge",
    "kubeproxy_sync_proxy_rules_nftables_chains": "gauge",
    "kubeproxy_sync_proxy_rules_isolated_service_ports": "gauge",
    # Upstream's registry has the process collector (and Go's runtime ones; Python's here).
    "process_cpu_seconds_total": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_virtual_memory_bytes": "gauge",
    "process_start_time_seconds": "gauge",
    "process_open_fds": "gauge",
    "process_max_fds": "gauge",
    "python_info": "gauge",
    "python_gc_objects_collected_total": "counter",
    "python_gc_objects_uncollectable_total": "counter",
    "python_gc_collections_total": "counter",
    # client-go's, for requests to the API server; go_goroutines' analogue.
    "rest_client_requests_total": "counter",
    "rest_client_request_duration_seconds": "histogram",
    "go_goroutines": "gauge",
    # component-base's, as every Kubernetes component has them.
    "kubernetes_build_info": "gauge",
    "kubernetes_feature_enabled": "gauge",
}

RESULT = SyncResult(full=True, elements=7, chains=3, no_local={"IPv4": (1, 2)})
V4 = {"ip_family": "IPv4"}


def test_mode_specific_names_follow_upstream() -> None:
    iptables = Metrics("iptables")
    names = {m.name for m in iptables.registry.collect()}
    assert "kubeproxy_sync_proxy_rules_iptables_restore_failures" in names
    assert not any("nftables" in n for n in names)
    assert "kubeproxy_sync_proxy_rules_nftables_sync_failures" in {
        m.name for m in Metrics("nftables").registry.collect()
    }


def test_each_instance_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.cleanup_failed()
    value = "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"
    assert first.registry.get_sample_value(value, V4) == 1
    assert second.registry.get_sample_value(value, V4) == 0


def test_process_metrics_are_on_each_instances_registry() -> None:
    first, second = Metrics(), Metrics()
    for metrics in (first, second):
        value = metrics.registry.get_sample_value
        assert (value("process_resident_memory_bytes") or 0) > 0
        assert (value("process_open_fds") or 0) > 0
        assert (value("process_start_time_seconds") or 0) > T0
        assert value("process_cpu_seconds_total") is not None


def test_conntrack_cleanups_are_counted_per_family() -> None:
    metrics = Metrics()
    value = metrics.registry.get_sample_value
    metrics.conntrack_cleaned("IPv4", 0.003, 5)
    metrics.conntrack_cleaned("IPv6", 0.001, 0)
    deleted = "kubeproxy_conntrack_reconciler_deleted_entries_total"
    assert value(deleted, {"ip_family": "IPv4"}) == 5
    assert value(deleted, {"ip_family": "IPv6"}) == 0
    duration = "kubeproxy_conntrack_reconciler_sync_duration_seconds"
    assert value(f"{duration}_count", {"ip_family": "IPv4"}) == 1
    assert value(f"{duration}_bucket", {"ip_family": "IPv4", "le": "0.004"}) == 1


def test_buckets_are_upstreams() -> None:
    assert SYNC_DURATION_BUCKETS[0] == 0.001
    assert SYNC_DURATION_BUCKETS[-1] == pytest.approx(16.384)
    assert len(SYNC_DURATION_BUCKETS) == 15
    # MergeBuckets starts from a 0 bucket, then 0.25, 0.5, 1..59, 60..115, 120..300.
    assert NETWORK_PROGRAMMING_BUCKETS[:4] == (0.0, 0.25, 0.5, 1.0)
    assert NETWORK_PROGRAMMING_BUCKETS[-8:] == (
        115.0,
        120.0,
        150.0,
        180.0,
        210.0,
        240.0,
        270.0,
        300.0,
    )
    assert len(NETWORK_PROGRAMMING_BUCKETS) == 1 + 2 + 59 + 12 + 7
    assert list(NETWORK_PROGRAMMING_BUCKETS) == sorted(set(NETWORK_PROGRAMMING_BUCKETS))


def test_a_successful_sync_records_durations_latency_and_what_was_programmed() -> None:
    metrics = Metrics()
    value = metrics.registry.get_sample_value
    metrics.observe_sync(
        RESULT, 0.003, full=True, trigger_times=[("IPv4", T0 - 1.5), ("IPv4", T0 - 0.2)], now=T0
    )
    assert value("kubeproxy_sync_proxy_rules_duration_seconds_count", V4) == 1
    assert value("kubeproxy_sync_full_proxy_rules_duration_seconds_count", V4) == 1
    # No partial sync yet: no series (upstream's HistogramVec has no child either).
    assert value("kubeproxy_sync_partial_proxy_rules_duration_seconds_count", V4) is None
    assert value("kubeproxy_sync_proxy_rules_duration_seconds_bucket", {**V4, "le": "0.002"}) == 0
    assert value("kubeproxy_sync_proxy_rules_duration_seconds_bucket", {**V4, "le": "0.004"}) == 1
    assert value("kubeproxy_sync_proxy_rules_last_timestamp_seconds", V4) == T0
    latency = "kubeproxy_network_programming_duration_seconds"
    assert value(f"{latency}_count", V4) == 2
    assert value(f"{latency}_sum", V4) == pytest.approx(1.7)
    assert value(f"{latency}_bucket", {**V4, "le": "0.25"}) == 1
    assert value(f"{latency}_bucket", {**V4, "le": "1.0"}) == 1
    assert value(f"{latency}_bucket", {**V4, "le": "2.0"}) == 2
    no_local = "kubeproxy_sync_proxy_rules_no_local_endpoints_total"
    assert value(no_local, {**V4, "traffic_policy": "internal"}) == 1
    assert value(no_local, {**V4, "traffic_policy": "external"}) == 2
    assert value("kubeproxy_sync_proxy_rules_nftables_elements") == 7
    assert value("kubeproxy_sync_proxy_rules_nftables_chains") == 3

    metrics.observe_sync(RESULT, 0.5, full=False, trigger_times=[], now=T0 + 1)
    assert value("kubeproxy_sync_proxy_rules_duration_seconds_count", V4) == 2
    assert value("kubeproxy_sync_partial_proxy_rules_duration_seconds_count", V4) == 1
    assert value(f"{latency}_count", V4) == 2


def test_a_failed_sync_is_counted_and_timed_but_not_a_success() -> None:
    metrics = Metrics()
    value = metrics.registry.get_sample_value
    metrics.sync_failed(0.01, full=False)
    assert value("kubeproxy_sync_proxy_rules_nftables_sync_failures_total", V4) == 1
    assert value("kubeproxy_sync_partial_proxy_rules_duration_seconds_count", V4) == 1
    # Never synced: no series, as upstream's GaugeVec.
    assert value("kubeproxy_sync_proxy_rules_last_timestamp_seconds", V4) is None


def test_queued_changes_and_pending() -> None:
    metrics = Metrics()
    value = metrics.registry.get_sample_value
    metrics.queued(T0)
    metrics.changes_seen(services=2, endpoints=5)
    metrics.changes_seen(endpoints=1)
    metrics.pending(services=1, endpoints=3)
    assert value("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", V4) == T0
    assert value("kubeproxy_sync_proxy_rules_service_changes_total") == 2
    assert value("kubeproxy_sync_proxy_rules_endpoint_changes_total") == 6
    assert value("kubeproxy_sync_proxy_rules_service_changes_pending") == 1
    assert value("kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 3
    metrics.pending(0, 0)
    assert value("kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 0


def test_metrics_server_exposes_every_metric_with_its_type() -> None:
    metrics = Metrics()
    metrics.observe_sync(RESULT, 0.01, full=True, trigger_times=[("IPv4", T0 - 1)], now=T0)
    health = ProxyHealth(60.0, FakeClock())

    async def scenario() -> str:
        async with (
            started(MetricsServer(metrics, "127.0.0.1:0")) as server,
            started(HealthServer(health, "127.0.0.1:0", metrics)) as probes,
        ):
            await fetch(probes.port, "/healthz")
            await fetch(probes.port, "/livez")
            healthz = await fetch(server.port, "/healthz")
            assert (healthz.status, healthz.text) == (200, "ok")
            mode = await fetch(server.port, "/proxyMode")
            assert (mode.status, mode.text) == (200, "nftables")
            reply = await fetch(server.port, "/metrics")
            assert reply.status == 200
            assert reply.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            return reply.text

    text = asyncio.run(scenario())
    types = {
        name: kind
        for line in text.splitlines()
        if line.startswith("# TYPE ")
        for name, kind in [line.removeprefix("# TYPE ").split(" ")]
    }
    assert types == EXPECTED
    assert "_created" not in text
    assert 'kubeproxy_proxy_healthz_total{code="200"} 1.0' in text
    assert 'kubeproxy_proxy_livez_total{code="200"} 1.0' in text
    assert (
        'kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.0"} 0.0'
        in text
    )


def test_profiling_endpoints_are_404_unless_enabled() -> None:
    async def scenario() -> None:
        async with started(MetricsServer(Metrics(), "127.0.0.1:0")) as server:
            for path in ("/debug/pprof/", "/debug/pprof/goroutine", "/debug/flags/v"):
                assert (await fetch(server.port, path)).status == 404, path
            assert (await fetch(server.port, "/debug/flags/v", method="PUT")).status == 404

    asyncio.run(scenario())


def test_profiling_endpoints(caplog: pytest.LogCaptureFixture) -> None:
    levels: list[int] = []

    async def scenario() -> None:
        server = MetricsServer(
            Metrics(), "127.0.0.1:0", profiling=True, set_verbosity=levels.append
        )
        async with started(server):
            index = await fetch(server.port, "/debug/pprof/")
            assert index.status == 200 and index.headers["Content-Type"].startswith("text/html")
            for name in ("goroutine", "heap", "profile", "cmdline"):
                assert f"href='{name}'" in index.text
            assert (await fetch(server.port, "/debug/pprof")).text == index.text  # redirect
            goroutine = await fetch(server.port, "/debug/pprof/goroutine")
            assert goroutine.status == 200 and 'thread "MainThread"' in goroutine.text
            assert 'task "' in goroutine.text  # the task serving this very request
            # The event loop (MainThread here) keeps serving while the profile samples.
            profile = await fetch(server.port, "/debug/pprof/profile?seconds=1&mode=wall")
            assert profile.status == 200
            assert any(line.startswith("MainThread;") for line in profile.text.splitlines())
            # No tracemalloc in this process: say so rather than show an empty heap.
            heap = await fetch(server.port, "/debug/pprof/heap")
            assert heap.status == 500 and "not tracing" in heap.text
            assert (await fetch(server.port, "/debug/pprof/mutex")).status == 404
            cmdline = await fetch(server.port, "/debug/pprof/cmdline")
            assert "pytest" in cmdline.text or "python" in cmdline.text

            # /debug/flags/v: PUT the verbosity, as upstream's StringFlagPutHandler.
            assert "flags:" in (await fetch(server.port, "/debug/flags/")).text
            put = await fetch(server.port, "/debug/flags/v", method="PUT", body="4")
            assert (put.status, put.text) == (200, "successfully set klog.logging.verbosity to 4\n")
            bad = await fetch(server.port, "/debug/flags/v", method="PUT", body="loud")
            assert bad.status == 400 and "invalid syntax" in bad.text
            get = await fetch(server.port, "/debug/flags/v")
            assert (get.status, get.text) == (406, "unsupported http method\n")

    asyncio.run(scenario())
    assert levels == [4]


def test_configz_shows_the_configuration() -> None:
    async def scenario() -> None:
        server = MetricsServer(Metrics(), "127.0.0.1:0", configz={"mode": "nftables"})
        async with started(server):
            reply = await fetch(server.port, "/configz")
            assert reply.status == 200
            assert reply.headers["Content-Type"].startswith("application/json")
            assert reply.json() == {"kubeproxy.config.k8s.io": {"mode": "nftables"}}

    asyncio.run(scenario())


def test_build_info_has_component_bases_labels() -> None:
    metrics = Metrics()
    families = {m.name: m for m in metrics.registry.collect()}
    (sample,) = families["kubernetes_build_info"].samples
    assert families["kubernetes_build_info"].type == "gauge"
    # component-base/metrics/prometheus/version: these labels, in this order, value 1.
    assert list(sample.labels) == [
        "major", "minor", "git_version", "git_commit", "git_tree_state", "build_date",
        "go_version", "compiler", "platform",
    ]  # fmt: skip
    assert sample.value == 1
    assert sample.labels["git_version"] == f"v{__version__}"
    assert (sample.labels["major"], sample.labels["minor"]) == tuple(__version__.split(".")[:2])
    assert sample.labels["platform"].startswith("linux/")
    assert sample.labels["go_version"].startswith("python3.")
    assert build_info("1.2.3")["git_version"] == "v1.2.3"


def test_feature_enabled_for_every_known_gate() -> None:
    cfg = apply_flags(
        default_config(),
        {"feature-gates": {"PreferSameTrafficDistribution": False, "Unknown": True}},
        config_file=False,
    )
    metrics = Metrics(features=feature_states(cfg))
    value = metrics.registry.get_sample_value
    name = "kubernetes_feature_enabled"
    assert value(name, {"name": "PreferSameTrafficDistribution", "stage": "BETA"}) == 0
    assert value(name, {"name": "NFTablesProxyMode", "stage": ""}) == 1
    assert value(name, {"name": "AllAlpha", "stage": "ALPHA"}) == 0
    samples = {
        s.labels["name"] for m in metrics.registry.collect() if m.name == name for s in m.samples
    }
    # Every gate kubeproxy knows, and only those (an unknown one is ignored, with a warning).
    assert samples == set(KNOWN_FEATURE_GATES)
    assert set(FEATURE_GATE_STAGES) == set(KNOWN_FEATURE_GATES)
    text = metrics.exposition().decode()
    assert 'kubernetes_feature_enabled{name="LoadBalancerIPMode",stage=""} 1.0' in text


def test_a_dual_stack_proxy_labels_each_family_as_upstreams_two_proxiers() -> None:
    """Upstream runs one proxier per family, each labelling its metrics ``ip_family``;
    kubeproxy's one sync programs both, so each family's series records it, while a
    network-programming sample and the per-family counts go to their own family."""
    metrics = Metrics("iptables", families=("IPv4", "IPv6"))
    value = metrics.registry.get_sample_value
    v6 = {"ip_family": "IPv6"}
    result = SyncResult(
        full=False,
        no_local={"IPv4": (1, 0), "IPv6": (0, 3)},
        table_rules={("IPv4", "nat"): 40, ("IPv6", "nat"): 12},
        table_rules_written={("IPv4", "nat"): 4, ("IPv6", "nat"): 0},
        partial_failures={"IPv6": 1},
    )
    metrics.observe_sync(result, 0.02, full=False, trigger_times=[("IPv6", T0 - 0.1)], now=T0)
    for family in (V4, v6):
        assert value("kubeproxy_sync_partial_proxy_rules_duration_seconds_count", family) == 1
        assert value("kubeproxy_sync_proxy_rules_last_timestamp_seconds", family) == T0
    latency = "kubeproxy_network_programming_duration_seconds_count"
    assert (value(latency, V4), value(latency, v6)) == (None, 1)
    no_local = "kubeproxy_sync_proxy_rules_no_local_endpoints_total"
    assert value(no_local, {**V4, "traffic_policy": "internal"}) == 1
    assert value(no_local, {**v6, "traffic_policy": "external"}) == 3
    assert value("kubeproxy_sync_proxy_rules_iptables_total", {**v6, "table": "nat"}) == 12
    assert value("kubeproxy_sync_proxy_rules_iptables_last", {**V4, "table": "nat"}) == 4
    partial = "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"
    assert (value(partial, V4), value(partial, v6)) == (0, 1)
    restore = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
    assert (value(restore, V4), value(restore, v6)) == (0, 0)
