"""kubeproxy's /metrics against upstream kube-proxy's, from the real binaries.

An operator's dashboards and alerts are written against upstream's series: every one
upstream exposes under a name kubeproxy claims (``kubeproxy_*``, client-go's REST
client pair, the process and build metrics) must be in kubeproxy's /metrics with the
same type and the same label names. The oracle is upstream's own /metrics, in nftables
and iptables modes, each proxy started on a node of a lab of its own
(:func:`bench.sidebyside.populated_lab`), left to sync, then made to program a change
(a new Service with Pods: a partial sync and a network-programming sample), so the
series that appear on first use are there too.

Series kubeproxy has and upstream has not are its own (documented in
:mod:`kubeproxy.metrics`); they are not checked here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from bench.sidebyside import (
    NAMESPACE,
    PROXY_NODE,
    cluster_ip,
    from_pool,
    metrics_text,
    populated_lab,
    probe,
    round_service,
    running,
)
from prometheus_client.parser import text_string_to_metric_families

from kubeproxy.lab.kube.binaries import Binaries
from kubeproxy.lab.kube.cluster import KubeLab
from kubeproxy.lab.kube.differential.proxies import OURS, UPSTREAM
from kubeproxy.lab.netns import list_netns

MODES = ("nftables", "iptables")
# Names kubeproxy takes over from upstream besides its kubeproxy_* ones.
CLAIMED = {
    "rest_client_requests",
    "rest_client_request_duration_seconds",
    "process_cpu_seconds",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_start_time_seconds",
    "process_open_fds",
    "process_max_fds",
    "go_goroutines",
    "kubernetes_build_info",
    "kubernetes_feature_enabled",
}

PROGRAMMING = "kubeproxy_network_programming_duration_seconds"
Shape = dict[str, tuple[str, frozenset[str]]]


def shape(text: str) -> Shape:
    """Per metric family: its type and the label names of its samples."""
    out: Shape = {}
    for family in text_string_to_metric_families(text):
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le", "quantile"}
        out[family.name] = (family.type, frozenset(labels))
    return out


def claimed(name: str) -> bool:
    return name.startswith("kubeproxy_") or name in CLAIMED


def scrape_after_a_change(lab: KubeLab, impl: str, mode: str, probed: list[str]) -> Shape:
    """``impl`` in ``mode``: synced, then a new Service programmed; its /metrics' shape.

    The new Service comes a second after the start: the controller stamps its slice with
    the Service's creation time (whole seconds), and both proxies count only trigger
    times after their own start."""
    api = lab.api()
    name = f"parity-{impl}-{mode}"
    with running(lab, impl, mode, "defaults", "parity") as proxy:
        proxy.cold_start({cluster_ip(api, probed[0]): from_pool("a")})
        time.sleep(1.5)
        t0 = time.perf_counter()
        ip = str(api.create(round_service(name, "b"))["spec"]["clusterIP"])
        proxy.executor.submit(probe, {ip: from_pool("b")}, t0).result(90)
        # The sample is recorded once the sync's work after the commit is done too.
        deadline = time.monotonic() + 10
        while True:
            text = metrics_text(lab, PROXY_NODE[impl])
            if f"\n{PROGRAMMING}_count" in text or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    api.delete("Service", name, NAMESPACE)
    return shape(text)


@pytest.fixture(scope="module")
def shapes(binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Shape]:
    """(mode, impl) -> the shape of its /metrics."""
    assert binaries.kube_proxy
    prefix = f"kpmp{os.getpid() % 10000}"
    workdir = Path(tmp_path_factory.mktemp("metrics-parity"))
    out: dict[str, Shape] = {}
    with populated_lab(workdir, prefix, services=6, endpoints=2, probed=2) as (lab, probed):
        for mode in MODES:
            for impl in (UPSTREAM, OURS):
                out[f"{mode}/{impl}"] = scrape_after_a_change(lab, impl, mode, probed)
    assert not [ns for ns in list_netns() if ns.startswith(prefix)], "namespaces left behind"
    return out


@pytest.mark.parametrize("mode", MODES)
def test_every_series_upstream_exposes_is_ours_with_its_type_and_labels(
    shapes: dict[str, Shape], mode: str
) -> None:
    upstream, ours = shapes[f"{mode}/{UPSTREAM}"], shapes[f"{mode}/{OURS}"]
    theirs = {name: s for name, s in upstream.items() if claimed(name)}
    # The oracle has what a change makes appear, or the check would prove little.
    assert PROGRAMMING in theirs, sorted(theirs)
    assert "kubeproxy_sync_partial_proxy_rules_duration_seconds" in theirs, sorted(theirs)
    missing = sorted(set(theirs) - set(ours))
    different = {
        name: {"upstream": theirs[name], "kubeproxy": ours[name]}
        for name in sorted(set(theirs) & set(ours))
        if theirs[name] != ours[name]
    }
    assert (missing, different) == ([], {})
