"""Churn soak (issue 12 part 4): many Services whose endpoints keep changing, for minutes.

    python -m bench.soak [--services 1000] [--endpoints 100] [--minutes 10]
                         [--tick 5] [--churn 0.1] [--turnover 5] [--seed 0] [--out FILE]
                         [--proxy-cpus 0.3] [--src DIR]

(root.) In the namespaces of :func:`bench.e2e.lab` (node and peer), ``kubeproxy run``
(nftables mode, upstream's default minimum sync period of 1 s, ``--v=2``) watches the
Kubernetes API stand-in (tests/apiserver.py in a process of its own in the node
namespace, :mod:`bench.e2e_api`): the source a real node uses, and the one upstream's
own churn test drives. The stand-in starts with ``--services`` Services of
``--endpoints`` endpoints each (one EndpointSlice per Service; every tenth Service also
has a UDP port). Every ``--tick`` seconds:

* ``--churn`` of all endpoints get new addresses: half of the endpoints of as many
  Services as that takes, chosen at random (a rolling update's worth each);
* ``--turnover`` Services (and their slices) are deleted and as many new ones created;
* the node sends one UDP datagram to the ClusterIP of every UDP Service, so conntrack
  holds entries the proxy must clear when their endpoint goes away (the peer has every
  endpoint address, nothing answers on UDP: the entries stay until cleared or expired).

Every changed or created slice carries ``endpoints.kubernetes.io/last-change-trigger-time``
(the moment the driver wrote it), so the proxy's own
``kubeproxy_network_programming_duration_seconds`` measures each change from the write
to the end of the sync that programmed it: watch delivery, waiting, and the sync. That
is whether the proxy keeps up: a backlog (a watch falling behind, syncs longer than a
tick) makes it grow without bound.

``--proxy-cpus`` caps the proxy's process tree (it and its ``conntrack`` children) at
that many CPUs with a cgroup CPU quota (v1 ``cpu`` controller or v2 ``cpu.max``). On a
shared machine the CPU the proxy gets depends on everyone else's load; a quota makes a
starved run reproducible. ``--src``: run the proxy from another checkout's ``src`` (to
measure the code before a change side by side). The CPU time the proxy's tree and the
stand-in used during the churn (user + system, waited-for children included) is
reported per tick.

The summed RSS of the proxy's process tree is sampled every ``--sample`` seconds. At the
end (after one tick without UDP traffic):

* **leaks**: the node's kube-proxy tables must become exactly those a fresh ``kubeproxy
  run --once`` writes for the final objects into an empty namespace (every chain, set,
  map, element and rule: :mod:`kubeproxy.lab.rulestate`) within SETTLE_SECONDS, and then
  no UDP conntrack entry may point at a deleted Service or an endpoint its Service no
  longer has;
* **memory**: the RSS samples, and the slope of a least-squares line through those
  after the warm-up (the first fifth of the run), in MB per minute;
* **latency**: percentiles of ``kubeproxy_sync_proxy_rules_duration_seconds`` and
  ``kubeproxy_network_programming_duration_seconds`` from /metrics (interpolated within
  buckets, as PromQL's histogram_quantile), and the exact sync times from the proxy's
  "Synced ... in" log lines, for all, full and partial syncs.

Prints a summary and exits 1 if anything leaked. CI runs a short one
(tests/kernel/test_soak.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.cluster import NODES, cluster_ip, pod_ip
from bench.e2e import NODE_IP, ROOT, Api, lab, process_tree, spawn, status_kb, stop
from kubeproxy.backends.nftables.inspect import KUBE_PROXY_TABLES
from kubeproxy.lab.netns import ns_exec
from kubeproxy.lab.objects import Ep, endpoint_slice, node, service
from kubeproxy.lab.rulestate import differences, fresh_sync, nft_state

NAMESPACE = "bench"
CLUSTER_CIDR = "10.128.0.0/9"
PROXY_FLAGS = (
    "--proxy-mode",
    "nftables",
    "--hostname-override",
    "node-a",
    "--cluster-cidr",
    CLUSTER_CIDR,
)
DNS_PORT = 53
SETTLE_SECONDS = 600.0
METRIC = "kubeproxy_sync_proxy_rules_duration_seconds"
PROGRAMMING = "kubeproxy_network_programming_duration_seconds"
TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"


class SoakError(AssertionError):
    pass


# ---------------------------------------------------------------------------- objects


@dataclass
class Fleet:
    """The Services and their endpoints, as the driver last wrote them."""

    endpoints: int
    rng: random.Random
    live: dict[int, list[str]] = field(default_factory=dict)
    next_service: int = 0
    next_endpoint: int = 0

    def _addresses(self, count: int) -> list[str]:
        first = self.next_endpoint
        self.next_endpoint += count
        return [pod_ip(k) for k in range(first, first + count)]

    def objects(self, i: int, trigger: str | None = None) -> list[dict[str, Any]]:
        """Service ``i`` and its slice (the slice first: never a Service without it);
        ``trigger``: the slice's last-change-trigger-time."""
        name = f"svc-{i}"
        ports: list[dict[str, Any]] = [{"name": "http", "port": 80}]
        slice_ports: list[dict[str, Any]] = [{"name": "http", "port": 8080}]
        if i % 10 == 0:
            ports.append({"name": "dns", "port": DNS_PORT, "protocol": "UDP"})
            slice_ports.append({"name": "dns", "port": 5353, "protocol": "UDP"})
        eps = [Ep(ip, node=NODES[k % len(NODES)]) for k, ip in enumerate(self.live[i])]
        eps_slice = endpoint_slice(name, eps, slice_ports, namespace=NAMESPACE)
        if trigger is not None:
            eps_slice["metadata"].setdefault("annotations", {})[TRIGGER_TIME] = trigger
        return [eps_slice, service(name, cluster_ip(i), ports, namespace=NAMESPACE)]

    def add(self) -> int:
        i = self.next_service
        self.next_service += 1
        self.live[i] = self._addresses(self.endpoints)
        return i

    def churn(self, fraction: float, turnover: int) -> tuple[list[dict[str, Any]], list[Any]]:
        """One tick of changes: (objects to apply, [kind, namespace, name] to delete)."""
        per_service = max(1, self.endpoints // 2)
        wanted = round(fraction * self.endpoints * len(self.live))
        picked = self.rng.sample(sorted(self.live), min(len(self.live), -(-wanted // per_service)))
        for i in picked:
            for k in self.rng.sample(range(self.endpoints), per_service):
                self.live[i][k] = self._addresses(1)[0]
        deletes: list[Any] = []
        for i in self.rng.sample(sorted(set(self.live) - set(picked)), turnover):
            del self.live[i]
            name = f"svc-{i}"
            deletes += [["Service", NAMESPACE, name], ["EndpointSlice", NAMESPACE, f"{name}-ipv4"]]
        created = [self.add() for _ in range(turnover)]
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        applies = [obj for i in [*picked, *created] for obj in self.objects(i, now)]
        return applies, deletes

    def udp_services(self) -> list[int]:
        return [i for i in self.live if i % 10 == 0]


# ----------------------------------------------------------------------------- measure


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and of its waited-for children so far (0 if gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    # utime, stime, cutime, cstime: fields 14-17 of proc(5), counted after the ")".
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class CpuQuota:
    """A cgroup of its own capping its processes (and their later children) at ``cpus``.

    cgroup v2 (``cpu.max``) where the cpu controller is enabled there, else the v1
    ``cpu`` controller (``cpu.cfs_quota_us``). Removed on :meth:`close`, once its
    processes are gone."""

    PERIOD_US = 100_000

    def __init__(self, cpus: float, tag: str) -> None:
        quota = max(1000, round(cpus * self.PERIOD_US))
        v2 = Path("/sys/fs/cgroup")
        if "cpu" in _read(v2 / "cgroup.subtree_control").split():
            self.path = v2 / f"kpsoak-{tag}"
            self.path.mkdir()
            (self.path / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
        elif (v2 / "cpu" / "cpu.cfs_quota_us").exists():
            self.path = v2 / "cpu" / f"kpsoak-{tag}"
            self.path.mkdir()
            (self.path / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            raise SoakError("--proxy-cpus needs the cgroup cpu controller (v1 or v2)")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttled_seconds(self) -> float:
        """How long the quota held the group back (cpu.stat)."""
        stat = dict(line.split() for line in _read(self.path / "cpu.stat").splitlines())
        if "throttled_usec" in stat:
            return int(stat["throttled_usec"]) / 1e6
        return int(stat.get("throttled_time", 0)) / 1e9

    def close(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:  # busy until the last process has exited
                time.sleep(0.1)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@dataclass
class RssSampler:
    """The summed RSS of a process tree every ``every`` seconds: (seconds, MB) pairs."""

    pid: int
    every: float
    samples: list[tuple[float, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            kb = sum(status_kb(p, "VmRSS:") for p in process_tree(self.pid))
            self.samples.append((time.monotonic() - self._began, kb / 1024))
            if self._stop.wait(self.every):
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def slope(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    if len(samples) < 2:
        return 0.0
    xs, ys = [s for s, _ in samples], [mb for _, mb in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def histogram(
    text: str, name: str = METRIC, combine: Callable[[list[float]], float] = sum
) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a Prometheus histogram in /metrics text, its
    label sets (``ip_family``) put together by ``combine``: ``sum`` where each family
    records samples of its own (network programming: one per slice, in the slice's
    family), ``max`` for kubeproxy's sync durations (each sync is recorded under every
    family it programs)."""
    pattern = re.compile(rf'^{name}_bucket\{{(?:[^}}]*,)?le="([^"]+)"[^}}]*\}} (\S+)$', re.M)
    buckets: dict[float, list[float]] = {}
    for le, count in pattern.findall(text):
        buckets.setdefault(float(le), []).append(float(count))
    return sorted((le, combine(counts)) for le, counts in buckets.items())


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """PromQL's histogram_quantile: linear interpolation within the bucket."""
    total = buckets[-1][1] if buckets else 0.0
    if total == 0:
        return math.nan
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower  # above the last finite bucket: its bound, as PromQL
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]

    return {"count": len(ordered), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99)} | {
        "max": ordered[-1]
    }


_SYNCED = re.compile(r"Synced (full|partial) rules in ([\d.]+)s")


def logged_syncs(log: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"all": [], "full": [], "partial": []}
    for kind, seconds in _SYNCED.findall(log):
        out[kind].append(float(seconds))
        out["all"].append(float(seconds))
    return out


def inventory(state: dict[str, Any]) -> dict[str, int]:
    """How many chains, sets, maps, rules and elements a :func:`nft_state` holds."""
    counts = dict.fromkeys(("chain", "set", "map", "rule", "element"), 0)
    for key, value in state.items():
        kind = key.split()[0]
        if kind == "rules":
            counts["rule"] += len(value)
        elif kind in counts:
            counts[kind] += 1
            counts["element"] += len(value.get("elem", ()))
    return counts


_CT_FIELD = re.compile(r"(src|dst)=(\S+)")


def stale_conntrack(listing: str, fleet: Fleet) -> list[str]:
    """UDP entries to a live Service's ClusterIP and to an endpoint it no longer has.
    (Flows to a deleted Service's ClusterIP are left to their timeouts, as upstream's
    conntrack reconciler leaves them: docs/differences-from-upstream.md,
    udp-conntrack-reconciler.)"""
    endpoints = {cluster_ip(i): set(fleet.live[i]) for i in fleet.udp_services()}
    stale = []
    for line in listing.splitlines():
        fields = _CT_FIELD.findall(line)
        if len(fields) < 4:
            continue
        cluster, endpoint = fields[1][1], fields[2][1]
        if cluster in endpoints and endpoint not in endpoints[cluster]:
            stale.append(line.strip())
    return stale


# ----------------------------------------------------------------------------- the run


def _metrics(probes: Callable[..., Any], timeout: float = 5.0) -> str:
    def scrape() -> str:
        with urllib.request.urlopen("http://127.0.0.1:10249/metrics", timeout=timeout) as resp:
            text: str = resp.read().decode()
            return text

    result: str = probes(scrape)
    return result


def gauge(text: str, name: str) -> float:
    """``name``'s value; the largest over its label sets (``ip_family``), 0 if absent."""
    values = [float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)]
    return max(values, default=0.0)


def _send_udp(ips: list[str]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for ip in ips:
            # A Service created since the last sync has no rules yet: its unallocated
            # ClusterIP is rejected (EPERM here), as upstream's nftables mode does.
            with contextlib.suppress(OSError):
                sock.sendto(b"?", (ip, DNS_PORT))


def _reference(fleet: Fleet, workdir: Path, tag: str) -> dict[str, Any]:
    """The tables a fresh full sync of the final objects writes into an empty namespace."""
    manifests = workdir / "final"
    manifests.mkdir()
    items = [node("node-a", [NODE_IP])] + [o for i in sorted(fleet.live) for o in fleet.objects(i)]
    (manifests / "all.json").write_text(json.dumps({"kind": "List", "items": items}))
    try:
        return fresh_sync(
            f"kpsoak-ref-{tag}", "nftables", [*PROXY_FLAGS, "--manifests", str(manifests)]
        )
    except RuntimeError as err:
        raise SoakError(str(err)) from None


def soak(
    services: int,
    endpoints: int,
    seconds: float,
    *,
    tick: float = 5.0,
    churn: float = 0.1,
    turnover: int = 5,
    sample: float = 2.0,
    seed: int = 0,
    say: Callable[[str], None] = print,
    keep_log: Path | None = None,
    proxy_cpus: float | None = None,
    src: Path | None = None,
) -> dict[str, Any]:
    """Run the soak; the figures (``leaks`` lists what leaked: empty if nothing).

    ``keep_log``: where to copy the proxy's log; ``proxy_cpus``: the proxy's CPU quota."""
    fleet = Fleet(endpoints, random.Random(seed))
    for _ in range(services):
        fleet.add()
    tag = str(os.getpid() % 100000)
    quota = CpuQuota(proxy_cpus, tag) if proxy_cpus else None
    with (
        contextlib.closing(quota) if quota is not None else contextlib.nullcontext(),
        lab() as the_lab,
        tempfile.TemporaryDirectory(prefix="kpsoak-") as tmp,
    ):
        workdir = Path(tmp)
        api = Api(the_lab, 0, endpoints)
        try:
            initial = [o for i in sorted(fleet.live) for o in fleet.objects(i)]
            for k in range(0, len(initial), 200):
                api.command({"apply": initial[k : k + 200]})
            log_path = workdir / "proxy.log"
            with open(log_path, "w") as log:
                proxy = spawn(
                    the_lab.node,
                    ["-m", "kubeproxy", "run", *PROXY_FLAGS, "--v=2", *api.args()],
                    pythonpath=None if src is None else f"{ROOT}:{src}",
                    stderr=log,
                )
            if quota is not None:
                quota.add(proxy.pid)
            the_lab.children.append(proxy)
            rss = RssSampler(proxy.pid, sample)
            try:
                schedule = Schedule(seconds, tick, churn, turnover)
                figures = _drive(the_lab, api, proxy, fleet, schedule, say=say)
                if quota is not None:
                    figures["throttled_seconds"] = quota.throttled_seconds()
            finally:
                rss.close()
            churned = time.monotonic()
            want = _reference(fleet, workdir, tag)
            # Converged: the node holds exactly the fresh sync's tables. Whatever still
            # differs after SETTLE_SECONDS is a leak (or a loss).
            while True:
                state = nft_state(the_lab.node, KUBE_PROXY_TABLES)
                leaks = differences(state, want, limit=20)
                if not leaks or time.monotonic() - churned > SETTLE_SECONDS:
                    break
                if proxy.poll() is not None:
                    break
                time.sleep(1.0)
            figures["settle_seconds"] = time.monotonic() - churned
            text = log_path.read_text()
            if keep_log is not None:
                keep_log.write_text(text)
            if proxy.poll() is not None:
                raise SoakError(f"the proxy exited ({proxy.returncode}):\n{text[-3000:]}")
            udp = ns_exec(the_lab.node, "conntrack", "-L", "-p", "udp", check=False)
            stale = stale_conntrack(udp, fleet)
            # A proxy still busy with a backlog answers slowly (seen at full churn here).
            metrics = _metrics(the_lab.probes.call, timeout=120)
            stop(proxy)
        finally:
            api.close()
    warm = [(s, mb) for s, mb in rss.samples if s >= seconds / 5]
    logged = logged_syncs(text)
    buckets = histogram(metrics, METRIC, max)
    programming = histogram(metrics, PROGRAMMING)
    figures |= {
        "services": services,
        "endpoints_per_service": endpoints,
        "seconds": seconds,
        "tick": tick,
        "leaks": leaks + [f"stale conntrack entry: {line}" for line in stale[:20]],
        "stale_conntrack": len(stale),
        "udp_conntrack_entries": udp.count("dport=53 "),
        "inventory": inventory(state),
        "reference_inventory": inventory(want),
        "rss_mb": {
            "first": rss.samples[0][1],
            "after_warmup": warm[0][1] if warm else math.nan,
            "last": rss.samples[-1][1],
            "max": max(mb for _, mb in rss.samples),
            "slope_mb_per_min_after_warmup": slope(warm),
            "samples": len(rss.samples),
        },
        "rss_samples": rss.samples,
        "sync_seconds_histogram": {
            q: histogram_quantile(float(q[1:]) / 100, buckets) for q in ("p50", "p90", "p99")
        }
        | {"count": buckets[-1][1] if buckets else 0},
        "sync_seconds_logged": {kind: percentiles(v) for kind, v in logged.items()},
        "network_programming_seconds": {
            q: histogram_quantile(float(q[1:]) / 100, programming) for q in ("p50", "p90", "p99")
        }
        | {"count": programming[-1][1] if programming else 0},
        "proxy_cpus": proxy_cpus,
        "sync_failures": gauge(metrics, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"),
    }
    return figures


@dataclass(frozen=True)
class Schedule:
    seconds: float
    tick: float
    churn: float
    turnover: int


def _drive(
    the_lab: Any,
    api: Api,
    proxy: subprocess.Popen[str],
    fleet: Fleet,
    schedule: Schedule,
    *,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Wait for the first sync, then churn for ``seconds``."""
    seconds, tick, turnover = schedule.seconds, schedule.tick, schedule.turnover
    call = the_lab.probes.call
    began = time.monotonic()
    while gauge(_try_metrics(call), "kubeproxy_sync_proxy_rules_last_timestamp_seconds") == 0:
        if proxy.poll() is not None or time.monotonic() - began > SETTLE_SECONDS:
            raise SoakError("the proxy did not sync the initial state")
        time.sleep(0.5)
    cold = time.monotonic() - began
    say(f"first sync after {cold:.1f}s; churning for {seconds:.0f}s")
    start = time.monotonic()
    cpu_before = cpu_seconds(proxy.pid), cpu_seconds(api.proc.pid)
    ticks = changed = created = 0
    while time.monotonic() - start < seconds:
        due = start + (ticks + 1) * tick
        applies, deletes = fleet.churn(schedule.churn, turnover)
        for k in range(0, len(applies), 100):
            api.command({"apply": applies[k : k + 100]})
        if deletes:
            api.command({"delete": deletes})
        ticks += 1
        changed += len(applies) // 2 - turnover
        created += turnover
        # No UDP in the last tick: a datagram racing the last sync is not a leak.
        if time.monotonic() + tick - start < seconds:
            call(_send_udp, [cluster_ip(i) for i in fleet.udp_services()])
        if ticks % 12 == 0:
            say(f"{time.monotonic() - start:.0f}s: {ticks} ticks")
        time.sleep(max(0.0, due - time.monotonic()))
    cpu_after = cpu_seconds(proxy.pid), cpu_seconds(api.proc.pid)
    return {
        "cpu_seconds_per_tick": {
            who: (after - before) / max(ticks, 1)
            for who, before, after in zip(("proxy", "api"), cpu_before, cpu_after, strict=True)
        },
        "cold_seconds": cold,
        "ticks": ticks,
        "services_changed": changed,
        "services_created_and_deleted": created,
    }


def _try_metrics(call: Callable[..., Any]) -> str:
    try:
        return _metrics(call)
    except OSError:
        return ""


def report(f: dict[str, Any]) -> str:
    rss, hist, logged = f["rss_mb"], f["sync_seconds_histogram"], f["sync_seconds_logged"]
    prog, cpu = f["network_programming_seconds"], f["cpu_seconds_per_tick"]
    lines = [
        f"{f['services']} Services x {f['endpoints_per_service']} endpoints, "
        f"{f['seconds']:.0f}s, a tick every {f['tick']:.0f}s: {f['ticks']} ticks, "
        f"{f['services_changed']} Service updates, {f['services_created_and_deleted']} "
        "Services created and as many deleted",
        f"first sync after {f['cold_seconds']:.1f}s; the tables matched a fresh sync "
        f"{f['settle_seconds']:.1f}s after the churn stopped (the fresh sync included); "
        f"sync failures: {f['sync_failures']:.0f}",
        f"leaks: {len(f['leaks'])} ({f['stale_conntrack']} stale conntrack entries of "
        f"{f['udp_conntrack_entries']} to a ClusterIP's UDP port)",
        *(f"  {leak}" for leak in f["leaks"]),
        f"kernel: {f['inventory']} (fresh sync: {f['reference_inventory']})",
        f"RSS of the process tree (MB): first {rss['first']:.0f}, after warm-up "
        f"{rss['after_warmup']:.0f}, last {rss['last']:.0f}, max {rss['max']:.0f}; slope "
        f"after warm-up {rss['slope_mb_per_min_after_warmup']:+.2f} MB/min "
        f"({rss['samples']} samples)",
        f"sync_proxy_rules_duration_seconds (/metrics, {hist['count']:.0f} syncs): "
        f"p50 {hist['p50']:.3f}s, p90 {hist['p90']:.3f}s, p99 {hist['p99']:.3f}s",
        f"network_programming_duration_seconds (/metrics, {prog['count']:.0f} changes): "
        f"p50 {prog['p50']:.3f}s, p90 {prog['p90']:.3f}s, p99 {prog['p99']:.3f}s",
        f"CPU per tick during the churn: proxy tree {cpu['proxy']:.3f}s, API stand-in "
        f"{cpu['api']:.3f}s"
        + (
            f" (proxy capped at {f['proxy_cpus']:g} CPUs, throttled "
            f"{f.get('throttled_seconds', 0):.0f}s)"
            if f["proxy_cpus"]
            else ""
        ),
    ]
    for kind, p in logged.items():
        if p:
            lines.append(
                f"logged {kind} syncs ({p['count']}): p50 {p['p50']:.3f}s, p90 {p['p90']:.3f}s, "
                f"p99 {p['p99']:.3f}s, max {p['max']:.3f}s"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--endpoints", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--tick", type=float, default=5.0)
    parser.add_argument("--churn", type=float, default=0.1)
    parser.add_argument("--turnover", type=int, default=5)
    parser.add_argument("--sample", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--proxy-cpus", type=float, default=None, help="cap the proxy at this many CPUs"
    )
    parser.add_argument("--src", type=Path, default=None, help="the proxy's source tree")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--log", type=Path, default=None, help="keep the proxy's log here")
    args = parser.parse_args()
    # SIGTERM unwinds like an error, so the namespaces and processes go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    load = os.getloadavg()
    figures = soak(
        args.services,
        args.endpoints,
        args.minutes * 60,
        tick=args.tick,
        churn=args.churn,
        turnover=args.turnover,
        sample=args.sample,
        seed=args.seed,
        keep_log=args.log,
        proxy_cpus=args.proxy_cpus,
        src=args.src,
    )
    figures["loadavg_before"] = load
    figures["loadavg_after"] = os.getloadavg()
    print(report(figures))
    print(f"load average before {load}, after {figures['loadavg_after']}")
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=1))
    return 1 if figures["leaks"] else 0


if __name__ == "__main__":
    sys.exit(main())
