"""Upstream kube-proxy against kubeproxy, side by side, in one run (issue 25 part 2).

    python -m bench.sidebyside [--services 1000] [--endpoints 10] [--modes nftables,iptables]
                               [--configs defaults,1ms] [--runs 3] [--rounds 5]
                               [--probed 20] [--out FILE] [--logs DIR] [--guest]
    python -m bench.sidebyside --table FILE      # the table of an earlier --out

(root; the upstream binaries: ``KUBEPROXY_UPSTREAM_BIN`` or scripts/build-upstream.)

Map of the module:

* the cluster is the real-Kubernetes lab (:mod:`kubeproxy.lab.kube`: etcd,
  kube-apiserver and kube-controller-manager v1.37, three nodes on a bridge), built
  here and torn down (every namespace deleted by name) at the end;
* :func:`populate` writes ``--services`` Services through the API server. ``--probed``
  of them, spread over the names, select 10 real Pods (``pool: a``, lab Pods on node-c
  running the lab's echo server) and the real EndpointSlice controller publishes their
  slices; the others have no selector and an EndpointSlice the bench writes with
  ``--endpoints`` made-up Pod addresses (never probed), as any selector-less Service;
* :func:`measure` runs one proxy, upstream's on node-a or kubeproxy on node-b (each in
  its own node's network namespace, so neither ever meets the other's tables), the two
  never at once, from a node :meth:`~kubeproxy.lab.kube.differential.proxies.Node.reset`
  to no rules; both get the same ``--config`` file (:func:`config_file`: upstream's
  ``KubeProxyConfiguration``, which kubeproxy reads too), with each one's defaults or
  with ``minSyncPeriod: 1ms`` for iptables and nftables. iptables mode uses the host's
  ``iptables`` (the nft flavour here); the mode ``iptables-legacy`` is iptables mode
  with the legacy flavour in both (:func:`command`);
* :func:`probe` is the clock: real TCP connects to ClusterIP:80 from a thread in the
  proxy's node namespace, one started every :data:`PACE` whatever the earlier ones are
  doing (non-blocking, each given up after :data:`PROBE_TIMEOUT`), so a dropped SYN
  never hides the moment the path changed. A change's time is the start of the first
  probe that took the new path (an answer from the expected Pod pool; for a delete, no
  answer, held for :data:`DELETE_CONFIRM` so a probe lost on a busy machine does not
  end it early), measured from just before the API request;
* what is measured per proxy run (:class:`ProxyRun`):

  - **cold start**: process spawn to every probed Service answering (a sample: only the
    ``--probed`` Services have backends; they are probed in turn, so the resolution is
    ``--probed`` x :data:`PACE`);
  - **add** (a Service with a selector created; the controller then writes its
    EndpointSlice, as in a real cluster), **change** (its selector moved from pool a to
    pool b: the controller rewrites the slice with 10 other endpoints), **delete** (the
    Service deleted; the garbage collector takes its slice): ``--rounds`` of each, the
    changes :data:`GAP` apart so each meets an idle proxy; and how long each of those API
    requests took to return (the lab's client opens a TLS connection per request: a
    floor under every change's time, the same for both);
  - sync durations from each proxy's own ``/metrics``
    (``kubeproxy_sync_full_proxy_rules_duration_seconds`` and ``..._partial_...``, the
    same names in both): count and sum up to the end of the cold start (shown as the
    full syncs' total: upstream runs one proxier per IP family, each observing its own
    syncs, one after the other), and during the rounds (shown as the partial syncs' mean);
  - CPU seconds of the process tree (user + system of the proxy and its live children,
    plus what its reaped children used), at the end of the cold start and at the end;
    the peak of the tree's summed RSS (:class:`bench.e2e.TreeRss`) and the proxy's VmHWM.

``--guest`` runs all of it inside the user-mode-Linux guest (:mod:`bench.guest`: the
host kernel has no IPVS), for ``--modes ipvs``. There every sync of upstream is a full
one and it has only the histogram of all syncs, so in ipvs mode the sync columns read
that histogram in both (:func:`sync_kinds`).

Runs alternate which proxy goes first. Results: Markdown on stdout (per proxy, and
kubeproxy/upstream ratios with their spread over the runs), every run as JSON in ``--out``.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import errno
import itertools
import json
import math
import os
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml

from bench import guest
from bench.cluster import pod_ip
from bench.e2e import TreeRss, process_tree, status_kb
from kubeproxy.lab import uml
from kubeproxy.lab.cluster import stop_process
from kubeproxy.lab.kube.api import Api, Obj
from kubeproxy.lab.kube.binaries import find
from kubeproxy.lab.kube.cluster import CLUSTER_CIDRS, KubeLab, wait_for
from kubeproxy.lab.kube.differential.proxies import OURS, PROXIES, UPSTREAM, Node
from kubeproxy.lab.netns import ns_exec
from kubeproxy.lab.objects import Ep, endpoint_slice, service

ROOT = Path(__file__).resolve().parents[1]
NODES = (("node-a", "zone-a"), ("node-b", "zone-b"), ("node-c", "zone-a"))
# Each proxy on a node of its own; the backends on a third, so both reach them alike.
PROXY_NODE = {UPSTREAM: "node-a", OURS: "node-b"}
BACKEND_NODE = "node-c"
NAMESPACE = "bench"
POOL_SIZE = 10
PORT, TARGET_PORT = 80, 8080
CONFIGS = ("defaults", "1ms")
MANAGED_BY = "bench.sidebyside.kubeproxy"
METRICS = "http://127.0.0.1:10249/metrics"
SYNC_METRICS = {
    "full": "kubeproxy_sync_full_proxy_rules_duration_seconds",
    "partial": "kubeproxy_sync_partial_proxy_rules_duration_seconds",
    # Every sync: upstream's ipvs mode has no full/partial split (every sync is full).
    "all": "kubeproxy_sync_proxy_rules_duration_seconds",
}
# A probe starts this often: the resolution of a change's time (and, over the --probed
# Services in turn, of the cold start). 500 connects a second from Python cost a share of
# one core, the same for both proxies.
PACE = 0.002
# A probe without an answer this long is "no answer" (a dropped SYN: a Service not yet
# programmed, or gone; an answer takes about a millisecond here).
PROBE_TIMEOUT = 0.2
# A delete ends with "no answer", which a probe lost on a busy machine also gives: the
# delete's first unanswered probe counts only once every probe this long after it went
# unanswered too.
DELETE_CONFIRM = 0.1
# Changes this far apart: each meets an idle proxy, past the default minSyncPeriod (1 s).
GAP = 1.5
CHANGE_DEADLINE = 60.0
COLD_DEADLINE = 600.0


# ---------------------------------------------------------------------------- probes


@dataclass
class _Target:
    """What the probes of one ClusterIP found so far."""

    wanted: Callable[[str | None], bool]
    hits: list[float] = field(default_factory=list)  # starts of probes with a wanted answer
    last_other: float = -1.0  # the latest start of a probe that did not get one


def probe(
    targets: Mapping[str, Callable[[str | None], bool]],
    started: float,
    *,
    confirm: float = 0.0,
    deadline: float = CHANGE_DEADLINE,
) -> dict[str, float]:
    """Probe each ClusterIP in ``targets`` (in turn, one connect every :data:`PACE`)
    until ``targets[ip](answer)`` holds (``answer``: the echo server's line, or None for
    no answer); per IP, the start of the first such probe after the last one that did
    not, in seconds since ``started``, once every probe started within ``confirm`` after
    it agreed. Meant to run on a thread inside the node's namespace."""
    state = {ip: _Target(wanted) for ip, wanted in targets.items()}
    done: dict[str, float] = {}
    sel = selectors.DefaultSelector()
    pending: dict[socket.socket, tuple[str, float]] = {}
    turn = itertools.cycle(list(targets))
    next_start = time.perf_counter()

    def finish(sock: socket.socket, answer: str | None) -> None:
        ip, t0 = pending.pop(sock)
        sel.unregister(sock)
        sock.close()
        target = state[ip]
        if target.wanted(answer):
            target.hits.append(t0)
        else:
            target.last_other = max(target.last_other, t0)

    try:
        while len(done) < len(targets):
            now = time.perf_counter()
            if now - started > deadline:
                missing = sorted(set(targets) - set(done))
                raise TimeoutError(f"{missing}: no awaited answer after {deadline:.0f}s")
            for ip, target in state.items():
                first = min((t for t in target.hits if t > target.last_other), default=None)
                # Settled once every probe started up to ``confirm`` after it has ended.
                if (
                    ip not in done
                    and first is not None
                    and now >= first + confirm + (PROBE_TIMEOUT if confirm else 0.0)
                ):
                    done[ip] = first - started
            if now >= next_start:
                ip = next(i for i in turn if i not in done) if len(done) < len(targets) else ""
                if ip:
                    sock, failed = _connect(ip)
                    pending[sock] = (ip, now)
                    sel.register(sock, selectors.EVENT_WRITE)
                    if failed:
                        finish(sock, None)
                next_start = max(next_start + PACE, now)
            for sock, (_, t0) in list(pending.items()):
                if now - t0 > PROBE_TIMEOUT:
                    finish(sock, None)
            wait = max(0.0, min(next_start - time.perf_counter(), PACE))
            for key, events in sel.select(wait):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                if events & selectors.EVENT_WRITE:
                    if ready.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        finish(ready, None)  # refused (REJECT, or a host unreachable)
                    else:
                        sel.modify(ready, selectors.EVENT_READ)
                else:
                    try:
                        answer = ready.recv(128).decode().strip() or None
                    except OSError:
                        answer = None
                    finish(ready, answer)
    finally:
        for sock in list(pending):
            sel.unregister(sock)
            sock.close()
        sel.close()
    return done


def _connect(ip: str) -> tuple[socket.socket, bool]:
    """A non-blocking connect to ``ip``:80; whether it already failed."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Reset on close: no TIME_WAIT, so thousands of probes never run out of ports.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.setblocking(False)
    return sock, sock.connect_ex((ip, PORT)) not in (0, errno.EINPROGRESS)


def from_pool(pool: str) -> Callable[[str | None], bool]:
    """An answer from a Pod of ``pool`` (the echo server's line: ``<pod> <client>``)."""
    return lambda answer: answer is not None and answer.startswith(f"{pool}-")


def no_answer(answer: str | None) -> bool:
    return answer is None


# --------------------------------------------------------------------------- cluster


def populate(lab: KubeLab, services: int, endpoints: int, probed: int) -> list[str]:
    """The Pods of pools a and b on the backend node, and ``services`` Services; the
    names of the ``probed`` ones with pool a as their backends (spread over the names:
    a new table's Services may appear piece by piece in name order)."""
    api = lab.api()
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    # The ServiceAccount admission plugin refuses Pods until the namespace has its account.
    wait_for(lambda: api.get("ServiceAccount", "default", NAMESPACE), what="the bench's namespace")
    for pool in ("a", "b"):
        for k in range(POOL_SIZE):
            lab.add_pod(
                f"{pool}-{k}", BACKEND_NODE, namespace=NAMESPACE, labels={"pool": pool},
                ports=(TARGET_PORT,), dual_stack=False,
            )  # fmt: skip
    step = max(1, services // max(1, probed))
    chosen = set(list(range(0, services, step))[:probed]) if probed else set()
    names: list[str] = []
    objects: list[Obj] = []
    for i in range(services):
        name = f"s{i:05d}"
        if i in chosen:
            names.append(name)
            objects.append(round_service(name, "a"))
            continue
        objects.append(fake_service(name))
        slice_ = endpoint_slice(
            name,
            [Ep(pod_ip(i * endpoints + j), node=BACKEND_NODE) for j in range(endpoints)],
            ({"name": "http", "port": TARGET_PORT},),
            namespace=NAMESPACE,
        )
        slice_["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] = MANAGED_BY
        objects.append(slice_)
    # Several requests at once (each one waits for the API server; the control plane's
    # executor has 4 threads).
    with ThreadPoolExecutor(4) as writers:
        list(writers.map(api.create, objects))

    def published() -> bool:
        slices = api.list_of(
            "EndpointSlice", NAMESPACE,
            labelSelector="endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io",
        )  # fmt: skip
        full = [s for s in slices if len(s.get("endpoints") or []) == POOL_SIZE]
        return len(full) >= len(names)

    wait_for(published, timeout=120, what="the controller's EndpointSlices")
    return names


def round_service(name: str, pool: str) -> Obj:
    """A Service selecting the Pods of ``pool``."""
    return service(
        name, (), [{"name": "http", "port": PORT, "targetPort": TARGET_PORT}],
        namespace=NAMESPACE, selector={"pool": pool},
    )  # fmt: skip


def fake_service(name: str) -> Obj:
    return service(name, (), [{"name": "http", "port": PORT}], namespace=NAMESPACE)


def cluster_ip(api: Api, name: str) -> str:
    return str(api.get("Service", name, NAMESPACE)["spec"]["clusterIP"])


# ---------------------------------------------------------------------------- proxies


# The bench's name of iptables mode with the legacy flavour in both proxies: upstream's
# ``iptables`` is whatever is first on its PATH, kubeproxy is told.
IPTABLES_LEGACY = "iptables-legacy"


def proxy_mode(mode: str) -> str:
    """The proxy mode behind one of the bench's ``--modes``."""
    return "iptables" if mode == IPTABLES_LEGACY else mode


def config_file(lab: KubeLab, node: str, mode: str, config: str) -> Path:
    """Upstream's ``KubeProxyConfiguration`` for ``node``, with each proxy's defaults
    (``config`` "defaults") or ``minSyncPeriod: 1ms``; kubeproxy reads the same file.
    With ``--config``, both ignore most flags: the file carries everything."""
    doc: dict[str, Any] = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(lab.node_kubeconfig(node))},
        "hostnameOverride": node,
        "mode": proxy_mode(mode),
        "clusterCIDR": ",".join(CLUSTER_CIDRS),
        # nf_conntrack_max is the initial namespace's (see differential.proxies).
        "conntrack": {"maxPerCore": 0},
    }
    if config == "1ms":
        doc["iptables"] = {"minSyncPeriod": "1ms"}
        doc["nftables"] = {"minSyncPeriod": "1ms"}
        doc["ipvs"] = {"minSyncPeriod": "1ms"}
    path = lab.workdir / f"sidebyside-{node}-{mode}-{config}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def command(lab: KubeLab, impl: str, mode: str, config: str) -> list[str]:
    node = PROXY_NODE[impl]
    argv = [
        *PROXIES[impl].command(lab, node, proxy_mode(mode)),
        "--config",
        str(config_file(lab, node, mode, config)),
    ]
    if mode != IPTABLES_LEGACY:
        return argv
    # Flags win over kubeproxy's --config; upstream has no such flag (the image's
    # iptables-wrapper picks the flavour behind plain ``iptables``), so its PATH does.
    path = f"{uml.legacy_iptables_dir()}{os.pathsep}{os.environ.get('PATH', '')}"
    extra = ["--iptables-backend", "legacy"] if impl == OURS else []
    return ["env", f"PATH={path}", *argv, *extra]


def check_flavour(lab: KubeLab, impl: str, mode: str) -> None:
    """In iptables mode, that ``impl`` programmed the flavour ``mode`` means: the one
    holding a ``KUBE-SERVICES`` chain in its node's IPv4 nat table."""
    if proxy_mode(mode) != "iptables":
        return
    netns = lab.nodes[PROXY_NODE[impl]].netns
    held = []
    if ns_exec(netns, "nft", "list", "chain", "ip", "nat", "KUBE-SERVICES", check=False):
        held.append("nft")
    if ns_exec(netns, "iptables-legacy", "-t", "nat", "-S", "KUBE-SERVICES", check=False):
        held.append("legacy")
    want = ["legacy"] if mode == IPTABLES_LEGACY else ["nft"]
    if held != want:
        raise RuntimeError(f"{impl} in {mode}: KUBE-SERVICES in {held}, not {want}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid``'s tree: each live process's own and its reaped
    children's (``cutime``/``cstime``: the ``nft``/``iptables-restore`` runs)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in process_tree(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / ticks


def metrics_text(lab: KubeLab, node: str) -> str:
    """The proxy's own /metrics, from inside ``node``'s namespace."""

    def get() -> str:
        with urllib.request.urlopen(METRICS, timeout=10) as response:
            return str(response.read().decode())

    text: str = lab.executor(lab.nodes[node].netns).call(get)
    return text


def scrape(lab: KubeLab, impl: str) -> dict[str, tuple[float, float]]:
    """(count, sum) of each sync histogram in :data:`SYNC_METRICS`, from ``impl``'s own
    /metrics. Both label them ``ip_family``: upstream's two per-family proxiers sync
    apart (their series are added up), kubeproxy's one sync programs every family and
    is recorded under each (one family's series is taken: the one with most syncs)."""
    text = metrics_text(lab, PROXY_NODE[impl])
    out: dict[str, tuple[float, float]] = {}
    for kind, name in SYNC_METRICS.items():
        per_family: dict[str, list[float]] = {}
        for line in text.splitlines():
            metric, _, value = line.rpartition(" ")
            base, _, labels = metric.partition("{")
            if base in (f"{name}_count", f"{name}_sum"):
                pair = per_family.setdefault(labels, [0.0, 0.0])
                pair[base.endswith("_sum")] = float(value)
        if impl == UPSTREAM:
            out[kind] = (
                sum(c for c, _ in per_family.values()),
                sum(t for _, t in per_family.values()),
            )
        else:
            count, total = max(per_family.values(), default=[0.0, 0.0])
            out[kind] = (count, total)
    return out


@dataclass
class ProxyRun:
    impl: str
    mode: str
    config: str
    run: int
    cold_seconds: float = 0.0
    add: list[float] = field(default_factory=list)
    change: list[float] = field(default_factory=list)
    delete: list[float] = field(default_factory=list)
    # How long each of those API requests took to return: part of every figure, both proxies'.
    writes: list[float] = field(default_factory=list)
    # (count, mean seconds) of each kind of sync, up to the cold start's end / in the rounds
    syncs_cold: dict[str, tuple[float, float]] = field(default_factory=dict)
    syncs_rounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    cpu_cold: float = 0.0
    cpu_total: float = 0.0
    tree_peak_mb: float = 0.0
    hwm_mb: float = 0.0


def sync_delta(
    before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]
) -> dict[str, tuple[float, float]]:
    out = {}
    for kind, (count, total) in after.items():
        c0, s0 = before.get(kind, (0.0, 0.0))
        n = count - c0
        out[kind] = (n, (total - s0) / n if n else 0.0)
    return out


@dataclass
class Running:
    """A proxy started by :func:`running`."""

    proc: subprocess.Popen[str]
    started: float  # perf_counter() just before the spawn
    executor: Any  # a thread in the proxy's node namespace
    rss: TreeRss
    check: Callable[[], None]  # raises if the rules are not where the mode says

    def cold_start(self, ips: Mapping[str, Callable[[str | None], bool]]) -> float:
        """Seconds from the spawn until every one of ``ips`` answered as wanted (then
        the rules' place is checked)."""
        cold: dict[str, float] = self.executor.submit(
            probe, ips, self.started, deadline=COLD_DEADLINE
        ).result(COLD_DEADLINE + 30)
        self.check()
        return max(cold.values())


@contextlib.contextmanager
def running(lab: KubeLab, impl: str, mode: str, config: str, tag: str) -> Iterator[Running]:
    """``impl`` in ``mode`` on its node, reset to no rules first; stopped on the way out,
    its log's tail on stderr if anything failed (or it exited on its own)."""
    node = PROXY_NODE[impl]
    Node(lab, node).reset()
    log = lab.workdir / f"sidebyside-{impl}-{mode}-{config}-{tag}.log"
    argv = command(lab, impl, mode, config)
    started = time.perf_counter()
    proc = lab.spawn(argv, log)
    rss = TreeRss(proc.pid)
    try:
        yield Running(
            proc, started, lab.executor(lab.nodes[node].netns), rss,
            lambda: check_flavour(lab, impl, mode),
        )  # fmt: skip
        if proc.poll() is not None:
            raise RuntimeError(f"{impl} exited: {log.read_text(errors='replace')[-3000:]}")
    except BaseException:
        sys.stderr.write(log.read_text(errors="replace")[-3000:] if log.exists() else "")
        raise
    finally:
        rss.close()
        stop_process(proc)


def measure(
    lab: KubeLab, impl: str, mode: str, *, config: str, run: int, probed: Sequence[str], rounds: int
) -> ProxyRun:
    """One proxy from a clean node: cold start, ``rounds`` of add/change/delete, metrics."""
    api = lab.api()
    result = ProxyRun(impl, mode, config, run)
    ips = {cluster_ip(api, name): from_pool("a") for name in probed}
    with running(lab, impl, mode, config, str(run)) as proxy:
        result.cold_seconds = proxy.cold_start(ips)
        result.cpu_cold = cpu_seconds(proxy.proc.pid)
        # Let the cold start's syncs end before reading their metrics: the rules can
        # answer before the sync that wrote them is recorded (its after-apply work, which
        # takes seconds in the guest).
        cold_kind = sync_kinds(mode)[0]
        wait_for(
            lambda: scrape(lab, impl)[cold_kind][0] >= 1,
            timeout=CHANGE_DEADLINE,
            what=f"{impl}'s first sync in its metrics",
        )
        time.sleep(GAP)
        after_cold = scrape(lab, impl)
        result.syncs_cold = sync_delta({}, after_cold)
        for r in range(rounds):
            short = "".join(word[0] for word in mode.split("-"))
            name = f"r{run}-{impl[0]}-{short}-{config}-{r}"
            _round(lab, api, proxy.executor, name, result)
        result.syncs_rounds = sync_delta(after_cold, scrape(lab, impl))
        result.cpu_total = cpu_seconds(proxy.proc.pid)
        result.hwm_mb = status_kb(proxy.proc.pid, "VmHWM:") / 1024
    result.tree_peak_mb = proxy.rss.peak_kb / 1024
    return result


def _round(lab: KubeLab, api: Api, executor: Any, name: str, result: ProxyRun) -> None:
    """Add Service ``name`` (pool a), move it to pool b, delete it; each timed."""
    t0 = time.perf_counter()
    ip = str(api.create(round_service(name, "a"))["spec"]["clusterIP"])
    result.writes.append(time.perf_counter() - t0)
    result.add.append(_wait(executor, {ip: from_pool("a")}, t0)[ip])
    time.sleep(GAP)
    t0 = time.perf_counter()
    api.patch("Service", name, {"spec": {"selector": {"pool": "b"}}}, NAMESPACE)
    result.writes.append(time.perf_counter() - t0)
    result.change.append(_wait(executor, {ip: from_pool("b")}, t0)[ip])
    time.sleep(GAP)
    t0 = time.perf_counter()
    api.delete("Service", name, NAMESPACE)
    result.writes.append(time.perf_counter() - t0)
    result.delete.append(_wait(executor, {ip: no_answer}, t0, DELETE_CONFIRM)[ip])
    time.sleep(GAP)


def _wait(
    executor: Any,
    targets: Mapping[str, Callable[[str | None], bool]],
    t0: float,
    confirm: float = 0.0,
) -> dict[str, float]:
    future = executor.submit(probe, targets, t0, confirm=confirm)
    result: dict[str, float] = future.result(CHANGE_DEADLINE + 30)
    return result


# ----------------------------------------------------------------------------- report


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}" if seconds < 10 else f"{seconds * 1000:.0f}"


def spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def sync_kinds(mode: str) -> tuple[str, str]:
    """The sync histograms read at cold start and in the rounds: full and partial, or in
    ipvs mode (upstream's syncs there are all full, and it has only the histogram of
    all syncs) every sync in both."""
    return ("all", "all") if mode == "ipvs" else ("full", "partial")


def _syncs(runs: Sequence[ProxyRun], phase: str, *, total: bool) -> str:
    """Each run's mean (or ``total``) sync seconds from /metrics, [the counts]."""
    kind = sync_kinds(runs[0].mode)[phase == "syncs_rounds"]
    pairs = [getattr(r, phase)[kind] for r in runs]
    counts = "/".join(f"{c:.0f}" for c, _ in pairs)
    return f"{spread([c * m if total else m for c, m in pairs], ms)} [{counts}]"


def _cold_syncs(r: ProxyRun) -> float:
    """Seconds of full syncs until the cold start's end: upstream's two per-family
    proxiers sync one after the other (the IPv6 one, with no Service here, briefly), so
    their total, not their mean, is its cold full sync."""
    count, mean = r.syncs_cold[sync_kinds(r.mode)[0]]
    return count * mean


def _round_syncs(r: ProxyRun) -> float:
    """The mean seconds of a sync in the rounds (partial, or in ipvs mode any)."""
    return r.syncs_rounds[sync_kinds(r.mode)[1]][1]


class _Run(Protocol):
    impl: str
    mode: str
    config: str
    run: int


RunT = TypeVar("RunT", bound=_Run)
# kubeproxy/upstream of one figure, per run: median (range) over the runs, as a cell
Ratio = Callable[[Callable[[RunT], float]], str]


def render(
    header: Sequence[str],
    results: Sequence[RunT],
    cells: Callable[[Sequence[RunT]], Sequence[str]],
    ratios: Callable[[Ratio[RunT]], Sequence[str]],
) -> str:
    """A Markdown table: per mode, config and proxy, ``cells`` of its runs after the
    first three columns ``header`` names, then a row of ``ratios``, each cell made with
    the ratio function it is given (each run's kubeproxy/upstream figure, paired by run)."""
    lines = [
        "| mode | config | proxy | " + " | ".join(header) + " |",
        "|---" * (3 + len(header)) + "|",
    ]
    groups: dict[tuple[str, str], dict[str, list[RunT]]] = {}
    for r in results:
        groups.setdefault((r.mode, r.config), {}).setdefault(r.impl, []).append(r)
    for (mode, config), by_impl in groups.items():
        for impl in (UPSTREAM, OURS):
            if runs := by_impl.get(impl, []):
                lines.append(f"| {mode} | {config} | {impl} | {' | '.join(cells(runs))} |")
        pairs = list(
            zip(
                sorted(by_impl.get(UPSTREAM, []), key=lambda r: r.run),
                sorted(by_impl.get(OURS, []), key=lambda r: r.run),
                strict=False,
            )
        )
        if not pairs:
            continue

        def ratio(get: Callable[[RunT], float], pairs: list[tuple[RunT, RunT]] = pairs) -> str:
            values = [get(o) / get(u) for u, o in pairs if get(u) > 0 and not math.isnan(get(o))]
            return spread(values, lambda v: f"{v:.2f}x") if values else "-"

        row = " | ".join(ratios(ratio))
        lines.append(f"| {mode} | {config} | **kubeproxy / upstream** | {row} |")
    return "\n".join(lines)


def table(results: Sequence[ProxyRun]) -> str:
    """Per mode, config and proxy: medians over the runs (range in brackets), and the
    kubeproxy/upstream ratio of each run's figures."""
    header = (
        "cold start s", "add ms median / max", "change ms median / max",
        "delete ms median / max", "API request ms", "full syncs ms at cold start, total [count]",
        "partial sync ms in rounds, mean [count]", "CPU s cold / total",
        "peak RSS tree MB (VmHWM)",
    )  # fmt: skip

    def cells(runs: Sequence[ProxyRun]) -> list[str]:
        lat = [
            f"{ms(statistics.median(x))} / {ms(max(x))}"
            for x in (
                [v for r in runs for v in getattr(r, kind)] for kind in ("add", "change", "delete")
            )
        ]
        return [
            spread([r.cold_seconds for r in runs], lambda v: f"{v:.2f}"),
            *lat,
            ms(statistics.median([w for r in runs for w in r.writes])),
            _syncs(runs, "syncs_cold", total=True),
            _syncs(runs, "syncs_rounds", total=False),
            f"{spread([r.cpu_cold for r in runs], lambda v: f'{v:.2f}')} / "
            f"{spread([r.cpu_total for r in runs], lambda v: f'{v:.2f}')}",
            f"{spread([r.tree_peak_mb for r in runs], lambda v: f'{v:.0f}')} "
            f"({spread([r.hwm_mb for r in runs], lambda v: f'{v:.0f}')})",
        ]

    def ratios(ratio: Ratio[ProxyRun]) -> list[str]:
        return [
            ratio(lambda r: r.cold_seconds),
            *(ratio(_median_of(kind)) for kind in ("add", "change", "delete")),
            "",
            ratio(_cold_syncs),
            ratio(_round_syncs),
            f"{ratio(lambda r: r.cpu_cold)} / {ratio(lambda r: r.cpu_total)}",
            ratio(lambda r: r.tree_peak_mb),
        ]

    return render(header, results, cells, ratios)


def _median_of(kind: str) -> Callable[[ProxyRun], float]:
    return lambda r: statistics.median(getattr(r, kind))


# ------------------------------------------------------------------------------- main


@dataclass(frozen=True)
class Spec:
    services: int
    endpoints: int
    modes: tuple[str, ...]
    configs: tuple[str, ...]
    runs: int
    rounds: int
    probed: int


@contextlib.contextmanager
def populated_lab(
    workdir: Path, prefix: str, services: int, endpoints: int, probed: int
) -> Iterator[tuple[KubeLab, list[str]]]:
    r"""The lab, built and :func:`populate`\ d: the lab and the probed Services' names.
    Every namespace is gone on the way out."""
    # The proxy starts as an installed package does, from compiled bytecode (see bench.e2e).
    compileall.compile_dir(ROOT / "src", quiet=1)
    lab = KubeLab(prefix, workdir, find())
    try:
        lab.build(NODES)
        began = time.monotonic()
        names = populate(lab, services, endpoints, probed)
        print(f"populated in {time.monotonic() - began:.0f}s", file=sys.stderr, flush=True)
        yield lab, names
    finally:
        lab.close()


def run_bench(spec: Spec, workdir: Path, prefix: str | None = None) -> list[ProxyRun]:
    """Build the lab, populate it, run every proxy run; the lab is gone afterwards."""
    results: list[ProxyRun] = []
    with populated_lab(
        workdir, prefix or f"kpsb{os.getpid() % 10000}", spec.services, spec.endpoints,
        spec.probed,
    ) as (lab, probed):  # fmt: skip
        for run in range(spec.runs):
            for mode in spec.modes:
                for config in spec.configs:
                    # Alternate who goes first: a warm API server or page cache favours neither.
                    order = (UPSTREAM, OURS) if run % 2 == 0 else (OURS, UPSTREAM)
                    for impl in order:
                        r = measure(
                            lab, impl, mode, config=config, run=run, probed=probed,
                            rounds=spec.rounds,
                        )  # fmt: skip
                        results.append(r)
                        print(
                            f"run {run} {mode} {config} {impl}: cold {r.cold_seconds:.2f}s "
                            f"add {ms(statistics.median(r.add))} change "
                            f"{ms(statistics.median(r.change))} delete "
                            f"{ms(statistics.median(r.delete))} ms, cpu {r.cpu_total:.1f}s, "
                            f"peak {r.tree_peak_mb:.0f} MB, API writes "
                            f"{ms(statistics.median(r.writes))} ms, load {os.getloadavg()[0]:.1f}",
                            file=sys.stderr,
                            flush=True,
                        )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sidebyside", description=__doc__.splitlines()[0]
    )
    common_arguments(parser, endpoints=10, modes="nftables,iptables", probed=20)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--guest", action="store_true", help="inside the UML guest (ipvs)")
    args = parser.parse_args(argv)
    if args.guest and not uml.in_guest():
        if args.out is None or args.logs is None:
            parser.error("--guest needs --out and --logs (the guest writes only there)")
        args.logs.mkdir(parents=True, exist_ok=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        return guest.rerun(
            "bench.sidebyside", sys.argv[1:] if argv is None else argv,
            [args.logs, args.out.parent],
        )  # fmt: skip
    guest.inside()
    spec = Spec(
        args.services, args.endpoints, tuple(args.modes.split(",")),
        tuple(args.configs.split(",")), args.runs, args.rounds, args.probed,
    )  # fmt: skip
    report(args, ProxyRun, lambda workdir: run_bench(spec, workdir), table)
    return 0


def common_arguments(
    parser: argparse.ArgumentParser, *, endpoints: int, modes: str, probed: int
) -> None:
    """The options every side-by-side bench has."""
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--endpoints", type=int, default=endpoints)
    parser.add_argument(
        "--modes", default=modes, help="nftables, iptables (nft flavour), iptables-legacy, ipvs"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--probed", type=int, default=probed)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--logs", type=Path, default=None, help="keep the lab's logs here")
    parser.add_argument(
        "--table", type=Path, default=None, help="only print the table of an --out file"
    )


def report(
    args: argparse.Namespace,
    kind: Callable[..., RunT],
    bench: Callable[[Path], list[RunT]],
    render_table: Callable[[Sequence[RunT]], str],
) -> None:
    """What a side-by-side bench's main does with ``--table``, ``--logs`` and ``--out``:
    only the table of an earlier run, or a new run (in ``--logs`` or a scratch directory)
    with the load before and after on stderr, its table on stdout, its runs as JSON."""
    if args.table is not None:
        print(render_table([kind(**r) for r in json.loads(args.table.read_text())]))
        return
    print(f"load before: {os.getloadavg()}", file=sys.stderr, flush=True)
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
        results = bench(args.logs)
    else:
        with tempfile.TemporaryDirectory(prefix="kubeproxy-sidebyside-") as tmp:
            results = bench(Path(tmp))
    print(f"load after: {os.getloadavg()}", file=sys.stderr, flush=True)
    print(render_table(results))
    if args.out is not None:
        args.out.write_text(json.dumps([asdict(r) for r in results], indent=1))  # type: ignore[call-overload]


if __name__ == "__main__":
    sys.exit(main())
