"""The API outage scenario (issue 12 part 5), shared by the CI test and ``bench.api_outage``.

A running ``kubeproxy run --master`` (the stand-in, in node-a's namespace) programs
``services`` Services. Then the stand-in is stopped for ``seconds``; while it is away,
with ``change=True``, one Service's endpoints change, one Service is deleted and one is
created, and history is compacted, so the proxy's watches come back to a 410 Gone and
it relists. Checked all along and measured:

* the rules stay: the kernel's ruleset (counters blanked) is compared with the one from
  before the outage every ``probe_every`` seconds, and a ClusterIP keeps answering;
* ``/healthz`` stays 200 (nothing is queued while the source is silent: upstream's
  semantics) and ``sync_proxy_rules_last_timestamp_seconds`` keeps advancing (the
  periodic syncs find the rules intact);
* after the stand-in is back: the time until the kernel shows the changes (or, without
  changes, until every informer has relisted), the syncs that carried changes, and from
  ``/metrics`` the number of full syncs and of Service/EndpointSlice changes the proxy
  saw: exactly the outage's changes, never the whole cluster again.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubeproxy.lab.cluster import NODE, Lab
from kubeproxy.lab.echo import outcome, tcp_ask
from kubeproxy.lab.objects import Ep, endpoint_slice, node, service
from tests.apiserver import RequestRecord
from tests.conftest import relies_on_exception
from tests.netns_api import NetnsApi, healthz, ruleset, scrape

# Lab Pods the scenario's endpoints are (name, IPv4, node); the caller's lab has them.
LOCAL_1 = ("local-1", "10.244.1.10", NODE)
LOCAL_2 = ("local-2", "10.244.1.11", NODE)
REMOTE_1 = ("remote-1", "10.244.2.10", "node-b")

NEW_IP = "10.98.0.1"
FULL = "kubeproxy_sync_full_proxy_rules_duration_seconds_count"
PARTIAL = "kubeproxy_sync_partial_proxy_rules_duration_seconds_count"
SERVICE_CHANGES = "kubeproxy_sync_proxy_rules_service_changes_total"
ENDPOINT_CHANGES = "kubeproxy_sync_proxy_rules_endpoint_changes_total"
LAST_SYNC = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"


def cluster_ip(i: int) -> str:
    return f"10.97.{i // 250}.{i % 250 + 1}"


def objects(services: int) -> list[dict[str, object]]:
    """``svc-I`` for I < services, each with endpoints local-1 and remote-1."""
    eps = [Ep(ip, node=where) for _, ip, where in (LOCAL_1, REMOTE_1)]
    out: list[dict[str, object]] = []
    for i in range(services):
        out += [service(f"svc-{i}", cluster_ip(i)), endpoint_slice(f"svc-{i}", eps)]
    return out


@dataclass
class OutageResult:
    seconds: float
    checks: int = 0  # kernel comparisons and probes during the outage, all passed
    rules_changed: int = 0  # comparisons that found different rules (must stay 0)
    unhealthy: int = 0  # /healthz answers other than 200 during the outage
    last_sync_advanced: bool = False
    converged_after: float = 0.0  # seconds from the stand-in's return
    change_syncs: list[str] = field(default_factory=list)  # "Synced ..." lines after return
    full_syncs: float = 0.0  # full syncs during the outage and after (delta)
    service_changes: float = 0.0  # deltas of the change counters
    endpoint_changes: float = 0.0


def answer(lab: Lab, ip: str) -> str:
    return lab.in_pod("client").call(outcome, tcp_ask, ip, 80, 0.5)


@relies_on_exception("AssertionError when the predicate does not hold in time")
def wait_until(predicate: object, timeout: float) -> float:
    """Seconds until ``predicate()`` holds; AssertionError after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"not converged within {timeout:g}s")


def relists(api: NetnsApi) -> int:
    """List requests the stand-in has served (not watches)."""
    requests: list[RequestRecord] = api.call(list, api.api.requests)
    return sum(1 for r in requests if not r.watch)


def outage(
    lab: Lab,
    api: NetnsApi,
    log: Path,
    seconds: float,
    *,
    change: bool,
    probe_every: float = 1.0,
    reconnect_timeout: float = 60.0,
) -> OutageResult:
    """Stop the stand-in for ``seconds`` (see the module docstring); the caller's proxy
    runs and has programmed :func:`objects`, and ``log`` is its log."""
    result = OutageResult(seconds)
    before = ruleset(lab)
    metrics = scrape(lab)
    lines_before = log.read_text().count("\n")
    api.run(api.api.stop())
    if change:
        api.call(api.api.update, endpoint_slice("svc-1", [Ep(LOCAL_2[1], node=NODE)]))
        api.call(api.api.delete, "Service", "svc-2", "default")
        api.call(api.api.delete, "EndpointSlice", "svc-2-ipv4", "default")
        api.call(api.api.create, service("svc-new", NEW_IP))
        api.call(api.api.create, endpoint_slice("svc-new", [Ep(LOCAL_1[1], node=NODE)]))
    # Another node's heartbeat: the history moves on even when nothing the proxy
    # watches changes, so the compaction makes every watch come back to a 410.
    api.call(api.api.apply, node("node-b", ["192.168.50.2"], cpu=f"{int(time.time())}m"))
    api.call(api.api.compact)
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        result.checks += 1
        if ruleset(lab) != before:
            result.rules_changed += 1
        if answer(lab, cluster_ip(0)) not in (LOCAL_1[0], REMOTE_1[0]):
            result.rules_changed += 1
        if healthz(lab)[0] != 200:
            result.unhealthy += 1
        time.sleep(max(0.0, min(probe_every, ends - time.monotonic())))
    during = scrape(lab)
    result.last_sync_advanced = during[LAST_SYNC] > metrics[LAST_SYNC]
    lists_before = relists(api)
    back = time.monotonic()
    api.run(api.api.start())
    if change:

        def converged() -> bool:
            rules = set(re.findall(r"[0-9.]+", ruleset(lab)))
            return (
                NEW_IP in rules
                and cluster_ip(2) not in rules
                and answer(lab, cluster_ip(1)) == LOCAL_2[0]
            )
    else:
        # Every informer (Services, EndpointSlices, Nodes, ServiceCIDRs) relisted.
        def converged() -> bool:
            return relists(api) - lists_before >= 4

    wait_until(converged, reconnect_timeout)
    result.converged_after = time.monotonic() - back
    # Syncs that follow a relist come within minSyncPeriod (1 s): let them land.
    time.sleep(2.0)
    after = scrape(lab)
    lines = log.read_text().splitlines()[lines_before:]
    result.change_syncs = [line for line in lines if "Synced " in line]
    result.full_syncs = after[FULL] - metrics[FULL]
    result.service_changes = after[SERVICE_CHANGES] - metrics[SERVICE_CHANGES]
    result.endpoint_changes = after[ENDPOINT_CHANGES] - metrics[ENDPOINT_CHANGES]
    if change:
        assert answer(lab, NEW_IP) == LOCAL_1[0]
    return result
