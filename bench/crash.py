"""SIGKILL ``kubeproxy run`` at random points of its syncs (issue 12 part 3).

    python -m bench.crash [--kills 100] [--modes nftables,iptables-nft,iptables-legacy]
                          [--services 700] [--seed 0] [--out FILE]

(root.) For each mode, a lab of network namespaces (:mod:`kubeproxy.lab.cluster`: node-a
runs the proxy from a manifest directory, a client Pod on node-a, an echo Pod on node-b)
and ``--services`` Services of mixed kinds (ClusterIP, NodePort, externalTrafficPolicy
Local, ClientIP affinity, TCP and UDP ports; 3 endpoints each). A long-lived TCP
connection from the client Pod to a ClusterIP (an echo Pod behind it) exchanges a line
every 20 ms for the whole run. Each kill is one of:

* **cold**: the proxy stopped, every rule removed (a node that never had any: the
  whole nftables ruleset, or the iptables-legacy tables emptied), the objects changed,
  the proxy started: killed during its first (full) sync into an empty kernel;
* **restart**: the same over the rules of the previous run (the first sync adopts them);
* **partial**: the proxy running, the objects changed every 0.1-0.3 s: killed during the
  partial syncs that follow;

and the kill point is a **random** delay (uniform over the measured length of a start,
or over the 2 s of changes), or targeted at the data-plane tool the sync runs (``nft -f``
for a big script; ``iptables-restore``): as soon as the proxy has such a child, after a
random 0-30 ms, **proxy** SIGKILLs the proxy (the child is left to finish or die) and
**child** SIGKILLs the child (the proxy lives and retries).

After a killed proxy, the objects change again (half of the time) and the proxy is
started again. Then: its rules must converge (within 30 s of its first successful sync)
to exactly what ``kubeproxy run --once`` writes for the same objects into a fresh,
empty namespace (compared by :mod:`kubeproxy.lab.rulestate`); its log must hold no
traceback; and the long-lived connection must have carried data while the proxy was
dead and restarting, with no error. Prints one line per kill and a summary table;
exits 1 on the first failure. CI runs a few kills (tests/kernel/test_crash.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.e2e import process_tree
from bench.soak import gauge
from kubeproxy.lab.cluster import NODE, NODE_IP, NODE_IP6, REMOTE_NODE, Lab
from kubeproxy.lab.flow import LongFlow, StreamEcho
from kubeproxy.lab.objects import Ep, endpoint_slice, node, service
from kubeproxy.lab.rulestate import differences, empty_rules, fresh_sync, rules_state

ALL_MODES = ("nftables", "iptables-nft", "iptables-legacy")
KINDS = ("cold", "restart", "partial")
TARGETS = ("random", "proxy", "child")
FLOW_IP, FLOW_PORT = "10.96.100.1", 7000
FLOW_POD, CLIENT_POD = ("remote-1", "10.244.2.10"), ("client", "10.244.1.100")
GROUPS = 20  # manifest files the Services are spread over
# Partial syncs as often as a change comes (the default minimum is 1 s).
PROXY_FLAGS = ("--iptables-min-sync-period", "50ms", "--v", "2")
CONVERGE_SECONDS = 30.0
SYNC_DEADLINE = 120.0
TOOL_DEADLINE = 120.0


class CrashError(AssertionError):
    pass


# ------------------------------------------------------------------------- the objects


def _service_objects(i: int, generation: int) -> list[dict[str, Any]]:
    """Service ``i`` (its kind depends on ``i``) and its slice, endpoints of ``generation``."""
    name, ip = f"svc-{i}", f"10.97.{i // 256}.{i % 256}"
    ports: list[dict[str, Any]] = [{"name": "http", "port": 80}]
    if i % 7 == 3:
        ports.append({"name": "dns", "port": 53, "protocol": "UDP"})
    spec: dict[str, Any] = {}
    if i % 10 in (0, 2):
        spec["type"] = "NodePort"
        ports = [dict(p, nodePort=30000 + i * 2 + k) for k, p in enumerate(ports)]
        if i % 10 == 2:
            spec["externalTrafficPolicy"] = "Local"
    if i % 10 == 1:
        spec["sessionAffinity"] = "ClientIP"
    eps = [
        Ep(
            f"10.{128 + i // 256}.{i % 256}.{(generation * 3 + j) % 250 + 1}",
            node=NODE if j == 0 else REMOTE_NODE,
        )
        for j in range(3)
    ]
    slice_ports = [{"name": p["name"], "port": 8080, **_proto(p)} for p in ports]
    return [
        service(name, ip, ports, namespace="crash", **spec),
        endpoint_slice(name, eps, slice_ports, namespace="crash"),
    ]


def _proto(port: dict[str, Any]) -> dict[str, Any]:
    return {"protocol": port["protocol"]} if "protocol" in port else {}


@dataclass
class Objects:
    """The manifest directory: Services spread over GROUPS files, changed at random."""

    path: Path
    services: int
    rng: random.Random
    # Service number -> generation of its endpoints; absent: deleted.
    live: dict[int, int] = field(default_factory=dict)

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self._write("node.json", [node(NODE, [NODE_IP, NODE_IP6], zone="zone-a")])
        flow_eps = [Ep(FLOW_POD[1], node=REMOTE_NODE)]
        self._write(
            "flow.json",
            [
                service("flow", FLOW_IP, [{"name": "echo", "port": FLOW_PORT}], namespace="crash"),
                endpoint_slice(
                    "flow", flow_eps, [{"name": "echo", "port": FLOW_PORT}], namespace="crash"
                ),
            ],
        )
        self.live = dict.fromkeys(range(self.services), 0)
        for group in range(GROUPS):
            self._write_group(group)

    def _write(self, name: str, items: list[dict[str, Any]]) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        tmp.replace(self.path / name)  # atomic: the watcher never sees half a file

    def _write_group(self, group: int) -> None:
        items = [
            obj
            for i, generation in sorted(self.live.items())
            if i % GROUPS == group
            for obj in _service_objects(i, generation)
        ]
        self._write(f"group-{group}.json", items)

    def change(self) -> None:
        """About 5% of the Services get new endpoints, 1% go away, as many come back."""
        touched = set()
        for i in self.rng.sample(range(self.services), max(1, self.services // 20)):
            if i in self.live:
                self.live[i] += 1
                touched.add(i)
        # As many come back as go, so the cluster keeps its size (and nftables mode's
        # full sync keeps running the nft binary).
        gone = sorted(set(range(self.services)) - set(self.live))
        turnover = max(1, self.services // 100)
        for i in self.rng.sample(sorted(self.live), turnover):
            del self.live[i]
            touched.add(i)
        for i in self.rng.sample(gone, min(turnover, len(gone))):
            self.live[i] = 0
            touched.add(i)
        for group in {i % GROUPS for i in touched}:
            self._write_group(group)


# --------------------------------------------------------------------------- the proxy


class Proxy:
    """One ``kubeproxy run`` at a time in node-a of the lab, each start with its own log."""

    def __init__(self, lab: Lab, manifests: Path, logs: Path) -> None:
        self.lab, self.manifests, self.logs = lab, manifests, logs
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0

    @property
    def log(self) -> Path:
        return self.logs / f"run-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        self.proc = self.lab.start(self.manifests, *PROXY_FLAGS, log=self.log)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the proxy process (only: a child it runs is left alone)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def child(self) -> int | None:
        """The pid of the tool applying a sync (``nft -f``, ``*-restore``) now, if any.

        Not the probes (``iptables --version``, ``iptables-restore --version``, the
        write probe ``iptables-restore --noflush`` without ``--counters``, ``iptables-save``):
        a killed start-up probe makes the proxy exit with one clear line, by design, like
        upstream's."""
        if self.proc is None:
            return None
        for pid in process_tree(self.proc.pid)[1:]:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            tool = os.path.basename(argv[0].decode())
            if (tool == "nft" and b"-f" in argv) or (
                tool.endswith("-restore") and b"--counters" in argv
            ):
                return pid
        return None

    def last_sync(self) -> float:
        """``sync_proxy_rules_last_timestamp_seconds`` (0 before the first success)."""

        def scrape() -> float:
            with urllib.request.urlopen("http://127.0.0.1:10249/metrics", timeout=2) as resp:
                text = resp.read().decode()
            return gauge(text, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")

        try:
            return self.lab.executor(self.lab.node_ns).call(scrape)
        except OSError:
            return 0.0

    def wait_synced(self, after: float) -> None:
        """Until a sync that ended after wall time ``after`` succeeded."""
        deadline = time.monotonic() + SYNC_DEADLINE
        while self.last_sync() <= after:
            if not self.running():
                raise CrashError(f"the proxy exited ({self.log}):\n{self._tail()}")
            if time.monotonic() > deadline:
                raise CrashError(f"no successful sync in {SYNC_DEADLINE:.0f}s:\n{self._tail()}")
            time.sleep(0.05)

    def check_log(self) -> None:
        if "Traceback" in self.log.read_text():
            raise CrashError(f"a traceback in {self.log}:\n{self._tail(60)}")

    def _tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text().splitlines()[-lines:])


# ------------------------------------------------------------------------------ a kill


@dataclass
class Kill:
    mode: str
    kind: str
    target: str
    delay: float  # seconds from the start (or from the first change) to the kill
    hit_child: bool  # a data-plane tool was running when the kill came
    changed_before_restart: bool = False
    first_sync_seconds: float = 0.0  # from the kill to the first successful sync after it
    converge_seconds: float = 0.0  # from then to the rules matching (0: at once)
    outage_round_trips: int = 0  # flow round trips between the kill and the first sync after
    longest_gap: float = 0.0  # seconds without a round trip in that window


@dataclass
class Run:
    mode: str
    lab: Lab
    objects: Objects
    proxy: Proxy
    flow: LongFlow
    rng: random.Random
    start_seconds: float = 3.0  # a start's length (start to first sync), measured
    kills: list[Kill] = field(default_factory=list)
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1))

    def reference(self) -> dict[str, Any]:
        """The rules a fresh full sync of the current objects writes into an empty netns."""
        flags = self.lab.proxy_flags(self.objects.path)
        try:
            return fresh_sync(f"{self.lab.prefix}-ref", self.mode, flags)
        except RuntimeError as err:
            raise CrashError(str(err)) from None

    def converge(self, want: Future[dict[str, Any]]) -> float:
        """Seconds until node-a's rules are ``want`` (the reference), counted from when the
        reference is ready (about 0.1 s, the listing: they matched at the first check)."""
        expected = want.result(timeout=300)
        started = time.monotonic()
        while True:
            got = rules_state(self.lab.node_ns, self.mode)
            if got == expected:
                return time.monotonic() - started
            if time.monotonic() - started > CONVERGE_SECONDS:
                diff = "\n".join(differences(got, expected))
                raise CrashError(f"rules differ from a fresh sync:\n{diff}")
            time.sleep(0.2)

    def later_reference(self) -> Future[dict[str, Any]]:
        """:meth:`reference` of the objects as they are now, computed meanwhile."""
        return self._pool.submit(self.reference)

    def ensure_synced(self) -> None:
        if not self.proxy.running():
            self.proxy.start()
            self.proxy.wait_synced(0)

    def kill_at(self, target: str, window: float) -> tuple[float, bool, float]:
        """Kill per ``target`` within ``window`` seconds from now.

        Returns the delay, whether a tool was running, and the wall time after which a
        sync must succeed: the kill, or when the killed child was seen (its sync may have
        finished before the kill came).
        """
        began = time.monotonic()
        if target == "random":
            time.sleep(self.rng.uniform(0, window))
            hit = self.proxy.child() is not None
            self.proxy.kill()
            return time.monotonic() - began, hit, time.time()
        # Generous: a start takes seconds on an idle machine, far more on a busy one.
        deadline = began + TOOL_DEADLINE
        while (pid := self.proxy.child()) is None:
            if not self.proxy.running():
                raise CrashError(f"the proxy exited ({self.proxy.log})")
            if time.monotonic() > deadline:
                raise CrashError(f"no data-plane tool ran within {TOOL_DEADLINE:.0f}s")
            time.sleep(0.001)
        seen = time.time()
        time.sleep(self.rng.uniform(0, 0.03))
        if target == "proxy":
            self.proxy.kill()
            return time.monotonic() - began, True, time.time()
        with contextlib.suppress(ProcessLookupError):  # it finished meanwhile: a late kill
            os.kill(pid, signal.SIGKILL)
        return time.monotonic() - began, True, seen

    def one(self, kind: str, target: str) -> Kill:
        if kind in ("cold", "restart"):
            if self.proxy.running():
                self.proxy.kill()
            if kind == "cold":
                # A node without any rule has no established connection through a
                # Service either (removing the NAT rules stops the kernel translating
                # it, measured): a new one is opened once the proxy has converged.
                self.flow.close()
                empty_rules(self.lab.node_ns, self.mode)
            self.objects.change()
            self.proxy.start()
            delay, hit, after = self.kill_at(target, self.start_seconds)
        else:
            self.ensure_synced()
            stop = threading.Event()
            changer = threading.Thread(target=self._change_until, args=(stop,), daemon=True)
            changer.start()
            try:
                delay, hit, after = self.kill_at(target, 2.0)
            finally:
                stop.set()
                changer.join()
        killed = time.monotonic()
        kill = Kill(self.mode, kind, target, round(delay, 3), hit)
        if target != "child":
            if self.rng.random() < 0.5:
                self.objects.change()
                kill.changed_before_restart = True
            want = self.later_reference()
            self.proxy.start()
        else:
            want = self.later_reference()
        self.proxy.wait_synced(after)
        synced = time.monotonic()
        kill.first_sync_seconds = round(synced - killed, 3)
        kill.converge_seconds = round(self.converge(want), 3)
        self.proxy.check_log()
        if kind == "cold":
            self.flow = open_flow(self.lab)
            time.sleep(0.2)
        else:
            kill.outage_round_trips = self.flow.round_trips(killed, synced)
            kill.longest_gap = round(self.flow.longest_gap(killed, synced), 3)
            if kill.outage_round_trips == 0:
                raise CrashError("the long-lived connection carried no data across the kill")
        carried = self.flow.wait_round_trip(synced)
        if self.flow.error is not None:
            raise CrashError(f"the long-lived connection failed: {self.flow.error}")
        if not carried:
            raise CrashError("the long-lived connection carried no data after the restart")
        self.kills.append(kill)
        return kill

    def _change_until(self, stop: threading.Event) -> None:
        while not stop.wait(self.rng.uniform(0.1, 0.3)):
            self.objects.change()


def plan(mode: str, kills: int, rng: random.Random) -> list[tuple[str, str]]:
    """``kills`` (kind, target) pairs covering every combination the mode has.

    nftables mode applies small transactions in-process (libnftables): its partial syncs
    have no child to aim at.
    """
    combos = [
        (kind, target)
        for kind in KINDS
        for target in TARGETS
        if not (mode == "nftables" and kind == "partial" and target != "random")
    ]
    chosen = combos[:kills] if kills <= len(combos) else combos
    chosen += [rng.choice(combos) for _ in range(kills - len(chosen))]
    rng.shuffle(chosen)
    return chosen


def open_flow(lab: Lab) -> LongFlow:
    """The long-lived connection from the client Pod through the flow Service."""
    return LongFlow(lab.pods[CLIENT_POD[0]].netns, FLOW_IP, FLOW_PORT)


@contextmanager
def running(mode: str, services: int, seed: int, workdir: Path) -> Iterator[Run]:
    """A lab in ``mode`` with the objects written, the flow up and the proxy synced."""
    rng = random.Random(f"{seed}-{mode}")
    prefix = f"kpcrash{os.getpid() % 100000}{mode[-3:]}"
    with Lab(prefix, mode=mode) as lab:
        for name, where, ip in (
            (FLOW_POD[0], REMOTE_NODE, FLOW_POD[1]),
            (CLIENT_POD[0], NODE, CLIENT_POD[1]),
        ):
            lab.add_pod(name, where, [ip])
        echo = StreamEcho(lab.pods[FLOW_POD[0]].netns, FLOW_PORT)
        objects = Objects(workdir / f"manifests-{mode}", services, rng)
        objects.create()
        logs = workdir / f"logs-{mode}"
        logs.mkdir()
        proxy = Proxy(lab, objects.path, logs)
        began = time.monotonic()
        proxy.start()
        proxy.wait_synced(0)
        run = Run(mode, lab, objects, proxy, open_flow(lab), rng)
        run.start_seconds = time.monotonic() - began
        try:
            run.converge(run.later_reference())
            yield run
        finally:
            run.flow.close()
            run._pool.shutdown()
            echo.stop()


def crash(
    plans: Mapping[str, Sequence[tuple[str, str]]],
    services: int,
    seed: int = 0,
    say: Callable[[str], None] = print,
) -> list[Kill]:
    """The kills of ``plans`` (mode -> (kind, target) pairs); CrashError on the first failure."""
    done: list[Kill] = []
    with tempfile.TemporaryDirectory(prefix="kpcrash-") as tmp:
        for mode, kills in plans.items():
            with running(mode, services, seed, Path(tmp)) as run:
                say(f"{mode}: a start takes {run.start_seconds:.2f}s")
                for kind, target in kills:
                    try:
                        kill = run.one(kind, target)
                    except CrashError as err:
                        raise CrashError(f"{mode} {kind} {target}: {err}") from None
                    say(
                        f"{mode} {kind:7} {target:6} after {kill.delay:6.3f}s"
                        f"{' (tool running)' if kill.hit_child else '':15} synced after "
                        f"{kill.first_sync_seconds:5.2f}s, matched "
                        f"{kill.converge_seconds:4.2f}s later; {kill.outage_round_trips} "
                        f"round trips meanwhile, longest gap {kill.longest_gap * 1000:.0f} ms"
                    )
                done.extend(run.kills)
    return done


def summary(kills: list[Kill]) -> str:
    rows = [
        "| mode | kind | target | kills | a tool was running | changed before restart | "
        "kill to first sync (max) | then to a match (max) | round trips during outage (min) "
        "| longest gap |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str, str], list[Kill]] = {}
    for k in kills:
        groups.setdefault((k.mode, k.kind, k.target), []).append(k)
    for (mode, kind, target), ks in sorted(groups.items()):
        rows.append(
            f"| {mode} | {kind} | {target} | {len(ks)} | {sum(k.hit_child for k in ks)} | "
            f"{sum(k.changed_before_restart for k in ks)} | "
            f"{max(k.first_sync_seconds for k in ks):.2f} s | "
            f"{max(k.converge_seconds for k in ks):.2f} s | "
            f"{min(k.outage_round_trips for k in ks)} | "
            f"{max(k.longest_gap for k in ks) * 1000:.0f} ms |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--modes", default=",".join(ALL_MODES))
    parser.add_argument("--services", type=int, default=700)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the kills as JSON")
    args = parser.parse_args()
    modes = args.modes.split(",")
    rng = random.Random(args.seed)
    plans = {
        mode: plan(mode, args.kills // len(modes) + (n < args.kills % len(modes)), rng)
        for n, mode in enumerate(modes)
    }
    # SIGTERM unwinds like an error, so the lab's namespaces and processes go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    began = time.monotonic()
    try:
        kills = crash(plans, args.services, args.seed)
    except CrashError as err:
        print(f"FAILED: {err}", file=sys.stderr)
        return 1
    print(f"\n{len(kills)} kills survived in {time.monotonic() - began:.0f}s\n")
    print(summary(kills))
    if args.out is not None:
        args.out.write_text(json.dumps([asdict(k) for k in kills], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
