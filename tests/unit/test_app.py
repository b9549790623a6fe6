"""kubeproxy.app: what a sync reports (conntrack cleanup) and how the servers start.

The backend is a fake that records syncs; conntrack is the in-memory fake, so no root.
"""

from __future__ import annotations

import logging

import pytest

from kubeproxy.app import Proxy
from kubeproxy.backends import SyncResult
from kubeproxy.config import ProxyConfig
from kubeproxy.dataplane.conntrack import FakeConntrack, Filter
from kubeproxy.metrics import Metrics
from kubeproxy.model.state import ProxyState, Snapshot
from kubeproxy.model.types import IPFamily, Protocol, ServicePortName


class FakeBackend:
    name = "fake"

    def __init__(self) -> None:
        self.syncs = 0

    def sync(self, snapshot: Snapshot, changed: set[ServicePortName] | None) -> SyncResult:
        self.syncs += 1
        return SyncResult(full=changed is None)

    def render(self, snapshot: Snapshot) -> str:
        return ""

    def cleanup(self) -> list[str]:
        return []


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
    refused = Filter.for_ip("10.96.0.10", Protocol.UDP, reason="service deleted")
    ok = Filter.for_ip("fd00::10", Protocol.UDP, reason="service deleted")
    conntrack = FakeConntrack(refuse={refused})
    metrics = Metrics()
    proxy = Proxy(config(), FakeBackend(), conntrack=conntrack, metrics=metrics)
    snapshot, _ = ProxyState("node-a").collect()
    proxy._stale = [refused, ok]
    with caplog.at_level(logging.ERROR):
        proxy._program(snapshot, None)
    value = metrics.registry.get_sample_value
    assert value("kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total") == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "10.96.0.10" in errors[0], errors
    # Upstream's conntrack metrics, per family.
    duration = "kubeproxy_conntrack_reconciler_sync_duration_seconds_count"
    assert value(duration, {"ip_family": "IPv4"}) == 1
    assert value(duration, {"ip_family": "IPv6"}) == 1
    assert conntrack.cleared == [ok]
    assert proxy._stale == []
