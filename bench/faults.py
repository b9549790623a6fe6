"""A long randomized fault schedule against a running proxy (issue 12 part 2), as root.

    python -m bench.faults [--mode nftables] [--source api] [--rounds 40] [--seed 0]

Builds a lab (namespaces created and deleted here) and runs ``kubeproxy run`` for node-a
in ``--mode``, reading ``--source`` (the API stand-in in node-a's namespace, or a
manifest directory), with syncPeriod 2 s and the data-plane tools wrapped by
:class:`kubeproxy.lab.faults.FaultyTools`. Each round picks a fault at random from those
the source allows, switches it on, changes one Service's endpoint (so there is work the
fault gets in the way of), holds the fault 1-8 s (a hang: 62-70 s, past the tools' 60 s
timeout) while checking the kernel and the probes, switches it off and measures the
recovery. Faults:

* ``refuse``: the restore tool (``nft -f`` / ``iptables-restore``) fails;
* ``hang``: it hangs until killed by kubeproxy's timeout;
* ``conntrack``: ``conntrack -D`` fails (a UDP flow checks the retry);
* API source: ``api-500`` (every request; watches cut), ``api-410`` (watches expire and
  history is compacted), ``api-slow`` (every watch event 3 s late), ``api-truncate``
  (watches cut mid-line), ``api-down`` (the stand-in stopped);
* manifest source: ``dir-gone`` (the directory renamed away, and back).

Checked in each round: while a kernel fault holds, the rules are the old ones (ruleset
compared, counters blanked) and a stable Service answers; ``/healthz`` is 503 once a
queued change waited 2 x syncPeriod through a refused or hung sync, and 200 through every
fault of the source (nothing queued); after the fault clears the change is in the kernel
(the recovery time, from the switch-off), and the sync-failure counter stops. Prints the
counts per fault (injected, recovered, max and median recovery seconds, violations);
exits 1 if any property failed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.netns_api import NetnsApi, healthz, ruleset, scrape, start_kubeproxy

from kubeproxy.lab.cluster import NODE, NODE_IP, NODE_IP6, REMOTE_NODE, Lab
from kubeproxy.lab.echo import outcome, tcp_ask, udp_ask
from kubeproxy.lab.faults import FaultyTools
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, node, service

PODS = {
    "local-1": (NODE, "10.244.1.10"),
    "local-2": (NODE, "10.244.1.11"),
    "remote-1": (REMOTE_NODE, "10.244.2.10"),
    "client": (NODE, "10.244.1.100"),
}
ENDPOINTS = ("local-1", "local-2", "remote-1")
STABLE, MOVING, DNS_IP = "10.96.40.1", "10.96.40.2", "10.96.40.3"
DNS = {"name": "dns", "port": 53, "protocol": "UDP"}
DNS_TARGET = {"name": "dns", "port": 8080, "protocol": "UDP"}
SYNC_PERIOD = ("--iptables-sync-period", "2s", "--iptables-min-sync-period", "0s")
HEALTH_TIMEOUT = 4.0  # 2 x syncPeriod
LAST_SYNC = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
KERNEL = ("refuse", "hang")
# Faults that keep the change from the kernel while they hold (the others only delay it).
BLOCKING = ("refuse", "hang", "api-500", "api-down", "dir-gone")
SOURCE_FAULTS = {
    "api": ("api-500", "api-410", "api-slow", "api-truncate", "api-down"),
    "manifests": ("dir-gone",),
}


def objects(moving: str, dns: str) -> list[dict[str, object]]:
    def eps(pod: str) -> list[Ep]:
        return [Ep(PODS[pod][1], node=PODS[pod][0])]

    return [
        service("stable", STABLE),
        endpoint_slice("stable", eps("local-1")),
        service("moving", MOVING),
        endpoint_slice("moving", eps(moving)),
        service("dns", DNS_IP, [DNS]),
        endpoint_slice("dns", eps(dns), [DNS_TARGET]),
    ]


@dataclass
class Tally:
    injected: int = 0
    recovered: int = 0
    recovery: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


class Cluster:
    """Where the proxy's objects live: the stand-in or a manifest directory."""

    def __init__(self, lab: Lab, source: str, root: Path) -> None:
        self.source = source
        self.api: NetnsApi | None = None
        self.manifests = ManifestDir(root / "manifests")
        self.moving, self.dns = "local-1", "local-1"
        nodes = [node(NODE, [NODE_IP, NODE_IP6]), node(REMOTE_NODE, ["192.168.50.2"])]
        if source == "api":
            self.api = NetnsApi(lab.node_ns)
            for obj in [*nodes, *objects(self.moving, self.dns)]:
                self.api.call(self.api.api.create, obj)
        else:
            self.manifests.path.mkdir()
            self.manifests.write("nodes.yaml", *nodes)
            self.write()

    def write(self) -> None:
        if self.api is not None:
            for obj in objects(self.moving, self.dns):
                self.api.call(self.api.api.apply, obj)
        else:
            self.manifests.write("objects.yaml", *objects(self.moving, self.dns))

    def close(self) -> None:
        if self.api is not None:
            self.api.close()


def ask_udp(lab: Lab, sock: socket.socket) -> str:
    return lab.in_pod("client").call(outcome, udp_ask, DNS_IP, 53, 0.5, sock)


def answer(lab: Lab, ip: str) -> str:
    return lab.in_pod("client").call(outcome, tcp_ask, ip, 80, 0.5)


def wait(predicate: Callable[[], bool], timeout: float) -> float | None:
    """Seconds until ``predicate()`` holds (errors count as not yet); None on timeout."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if predicate():
                return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.1)
    return None


class Schedule:
    def __init__(self, lab: Lab, cluster: Cluster, tools: FaultyTools, rng: random.Random):
        self.lab, self.cluster, self.tools, self.rng = lab, cluster, tools, rng
        self.restore = restore_tools(lab.mode)
        self.failures = (
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
            if lab.mode == "nftables"
            else "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
        )
        self.tallies: dict[str, Tally] = defaultdict(Tally)
        self.sock = lab.in_pod("client").call(_bound_udp)

    def switch(self, fault: str, on: bool) -> None:
        api = self.cluster.api
        if fault in KERNEL:
            for tool in self.restore:
                self.tools.inject(tool, ("fail" if fault == "refuse" else "hang") if on else None)
        elif fault == "conntrack":
            self.tools.inject("conntrack", "fail" if on else None)
        elif fault == "dir-gone":
            away = self.cluster.manifests.path.with_name("away")
            src, dst = (
                (self.cluster.manifests.path, away) if on else (away, self.cluster.manifests.path)
            )
            shutil.move(src, dst)
        elif api is not None:
            if fault == "api-500":
                api.call(api.api.fail_with, 500 if on else None)
                if on:
                    api.call(api.api.drop_watches)
            elif fault == "api-slow":
                api.call(api.api.slow_watches, 3.0 if on else None)
            elif fault == "api-down":
                api.run(api.api.stop() if on else api.api.start())
            elif fault == "api-410" and on:
                api.call(api.api.expire_watches)
            elif fault == "api-truncate" and on:
                api.call(lambda: api.api.drop_watches(mid_line=True))

    def round(self, fault: str) -> None:
        lab, tally = self.lab, self.tallies[fault]
        tally.injected += 1
        before = ruleset(lab)
        old_dns = self.cluster.dns
        if fault == "conntrack" and wait(lambda: ask_udp(lab, self.sock) == old_dns, 10) is None:
            tally.violations.append("the UDP flow does not reach its endpoint before the fault")
        self.switch(fault, True)
        # The change the fault gets in the way of.
        if fault == "conntrack":
            self.cluster.dns = self.rng.choice([p for p in ENDPOINTS if p != self.cluster.dns])
        else:
            self.cluster.moving = self.rng.choice(
                [p for p in ENDPOINTS if p != self.cluster.moving]
            )
        if fault == "dir-gone":
            # The change is made in the directory while it is away.
            away = ManifestDir(self.cluster.manifests.path.with_name("away"))
            away.write("objects.yaml", *objects(self.cluster.moving, self.cluster.dns))
        else:
            self.cluster.write()
        if fault == "api-410":
            api = self.cluster.api
            assert api is not None
            api.call(api.api.compact)
        hold = self.rng.uniform(62.0, 70.0) if fault == "hang" else self.rng.uniform(1.0, 8.0)
        ends = time.monotonic() + hold
        codes: set[int] = set()
        while time.monotonic() < ends:
            if fault in BLOCKING and ruleset(lab) != before:
                tally.violations.append(f"rules changed during {fault}")
            if answer(lab, STABLE) != "local-1":
                tally.violations.append(f"stable Service not answering during {fault}")
            codes.add(healthz(lab)[0])
            # The flow's entry must survive (the deletion fails) and stay fresh.
            if fault == "conntrack" and ask_udp(lab, self.sock) != old_dns:
                tally.violations.append("the UDP flow moved although conntrack -D failed")
            time.sleep(0.5)
        if fault in KERNEL and hold > HEALTH_TIMEOUT + 2 and 503 not in codes:
            tally.violations.append(f"healthz never 503 through {hold:.0f} s of {fault}")
        if fault not in KERNEL and codes != {200}:
            tally.violations.append(f"healthz {sorted(codes)} during {fault}")
        self.switch(fault, False)
        cleared = time.monotonic()
        if fault == "conntrack":
            took = wait(lambda: ask_udp(lab, self.sock) == self.cluster.dns, 90)
        else:
            took = wait(lambda: answer(lab, MOVING) == self.cluster.moving, 90)
        if took is None:
            tally.violations.append(f"no recovery within 90 s after {fault}")
            return
        tally.recovered += 1
        tally.recovery.append(time.monotonic() - cleared)
        failed = scrape(lab)[self.failures]
        time.sleep(2.5)
        if scrape(lab)[self.failures] != failed:
            tally.violations.append(f"sync failures still counted after {fault} cleared")
        if healthz(lab)[0] != 200:
            tally.violations.append(f"healthz not 200 after {fault} cleared")


def _bound_udp() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", 0))
    return sock


def restore_tools(mode: str) -> tuple[str, ...]:
    if mode == "nftables":
        return ("nft",)
    flavor = mode.removeprefix("iptables-")
    return (f"iptables-{flavor}-restore", f"ip6tables-{flavor}-restore")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults")
    parser.add_argument(
        "--mode", default="nftables", choices=("nftables", "iptables-nft", "iptables-legacy")
    )
    parser.add_argument("--source", default="api", choices=("api", "manifests"))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", type=Path, help="keep kubeproxy's log here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    kinds = ("refuse", "hang", "conntrack", *SOURCE_FAULTS[args.source])
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory() as tmp,
        Lab(f"kpbf{os.getpid() % 100000}", mode=args.mode) as lab,
    ):
        for name, (where, ip) in PODS.items():
            lab.add_pod(name, where, [ip], ports=(8080,))
        root = Path(tmp)
        tools = FaultyTools(root / "faults")
        cluster = Cluster(lab, args.source, root)
        log = args.log or root / "kubeproxy.log"
        try:
            if cluster.api is not None:
                proc = start_kubeproxy(lab, cluster.api, log, *SYNC_PERIOD, prefix=tools.env())
            else:
                proc = lab.spawn(
                    lab.kubeproxy_args(cluster.manifests.path, *SYNC_PERIOD, prefix=tools.env()),
                    log=log,
                )
            if wait(lambda: scrape(lab).get(LAST_SYNC, 0) > 0, 60) is None:
                print(log.read_text()[-3000:], file=sys.stderr)
                return 1
            schedule = Schedule(lab, cluster, tools, rng)
            wait(lambda: ask_udp(lab, schedule.sock) == "local-1", 10)
            for i in range(args.rounds):
                fault = rng.choice(kinds)
                schedule.round(fault)
                print(f"round {i + 1}/{args.rounds}: {fault}", flush=True)
            alive = proc.poll() is None
        finally:
            cluster.close()
    print(
        f"\n{args.rounds} faults in {time.monotonic() - started:.0f} s "
        f"({args.mode}, {args.source} source, seed {args.seed}); proxy alive: {alive}"
    )
    print("| fault | injected | recovered | max recovery | median recovery | violations |")
    print("|---|---|---|---|---|---|")
    ok = alive
    for kind in kinds:
        t = schedule.tallies.get(kind, Tally())
        worst = f"{max(t.recovery):.1f} s" if t.recovery else "-"
        median = f"{statistics.median(t.recovery):.1f} s" if t.recovery else "-"
        print(
            f"| {kind} | {t.injected} | {t.recovered} | {worst} | {median} | {len(t.violations)} |"
        )
        for v in sorted(set(t.violations)):
            print(f"  - {v}")
        ok &= not t.violations and t.recovered == t.injected
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
