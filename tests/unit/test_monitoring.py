"""deploy/monitoring: the Grafana dashboard, the PrometheusRule and the scrape objects
are well-formed, select job="kube-proxy", and query only series kubeproxy exposes — as do
kubernetes-mixin's "Kubernetes / Proxy" dashboard and KubeProxyDown alert."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from kubeproxy.backends.base import SyncResult
from kubeproxy.metrics import DEFAULT_METRICS_BIND_ADDRESS, Metrics

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy/monitoring"

# Every series kubernetes-mixin's proxy dashboard (dashboards/proxy.libsonnet) and its
# KubeProxyDown alert query, besides Prometheus' own `up`.
MIXIN_SERIES = {
    "kubeproxy_sync_proxy_rules_duration_seconds_count",
    "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
    "kubeproxy_network_programming_duration_seconds_count",
    "kubeproxy_network_programming_duration_seconds_bucket",
    "rest_client_requests_total",
    "rest_client_request_duration_seconds_bucket",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "go_goroutines",
}
# PromQL words that look like series names but are not.
PROMQL = {
    "sum", "rate", "increase", "histogram_quantile", "absent", "time", "by", "or", "and",
    "le", "instance", "verb", "host", "code", "job", "up", "humanizeDuration", "labels",
    "value",
}  # fmt: skip


def exposed(mode: str) -> set[str]:
    """Every sample name a proxy in ``mode`` exposes once it has synced and asked the API."""
    metrics = Metrics(mode)
    metrics.observe_sync(
        SyncResult(full=True), 0.01, full=True, trigger_times=[("IPv4", 0.0)], now=1.0
    )
    metrics.observe_sync(
        SyncResult(full=False), 0.01, full=False, trigger_times=[("IPv4", 0.0)], now=1.0
    )
    metrics.sync_failed(0.01, full=True)
    metrics.api_request("GET", "10.0.0.1:6443", "200", 0.01)
    text = generate_latest(metrics.registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


EXPOSED = exposed("nftables") | exposed("iptables")


def series(expr: str) -> set[str]:
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))
    return {n for n in names if n not in PROMQL and not n.isdigit()}


def dashboard_exprs() -> list[str]:
    dash = json.loads((MONITORING / "grafana-dashboard-proxy.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    return [r for group in doc["spec"]["groups"] for r in group["rules"]]


def test_the_mixins_series_are_all_exposed() -> None:
    assert MIXIN_SERIES <= EXPOSED, MIXIN_SERIES - EXPOSED


@pytest.mark.parametrize("expr", dashboard_exprs())
def test_dashboard_queries_select_kube_proxy_and_exposed_series(expr: str) -> None:
    assert 'job="kube-proxy"' in expr
    assert series(expr) <= EXPOSED, series(expr) - EXPOSED


def test_dashboard_is_a_grafana_dashboard() -> None:
    dash = json.loads((MONITORING / "grafana-dashboard-proxy.json").read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 30
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "instance"} <= names
    # The mixin's panels are all there, by query.
    queried = set().union(*(series(e) for e in dashboard_exprs()))
    assert {s.removesuffix("_bucket").removesuffix("_count") for s in MIXIN_SERIES} <= {
        s.removesuffix("_bucket").removesuffix("_count") for s in queried
    }


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_alerts_are_complete_and_query_exposed_series(rule: dict[str, Any]) -> None:
    assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}
    assert rule["labels"]["severity"] in ("critical", "warning", "info")
    assert {"summary", "description"} <= set(rule["annotations"])
    assert re.fullmatch(r"\d+[smh]", rule["for"])
    assert 'job="kube-proxy"' in rule["expr"]
    assert series(rule["expr"]) <= EXPOSED, series(rule["expr"]) - EXPOSED
    assert rule["expr"].count("(") == rule["expr"].count(")")


def test_kube_proxy_down_is_the_mixins() -> None:
    (down,) = [r for r in rules() if r["alert"] == "KubeProxyDown"]
    assert down["expr"] == 'absent(up{job="kube-proxy"} == 1)'


def test_the_scrape_objects_find_the_daemonsets_pods_as_job_kube_proxy() -> None:
    service = yaml.safe_load((MONITORING / "service.yaml").read_text())
    monitor = yaml.safe_load((MONITORING / "servicemonitor.yaml").read_text())
    daemonset = next(
        d
        for d in yaml.safe_load_all((ROOT / "deploy/base/daemonset.yaml").read_text())
        if d and d["kind"] == "DaemonSet"
    )
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "kube-proxy"
    (port,) = service["spec"]["ports"]
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [port["name"]]
    assert port["targetPort"] == int(DEFAULT_METRICS_BIND_ADDRESS.rsplit(":", 1)[1])
