"""Data-path cost of many Services: TCP connect latency to a ClusterIP.

In the namespace lab, node-a is programmed (in any of :mod:`bench.modes`) with N Services
(N-1 synthetic ones with 10 endpoints each, plus the measured one whose endpoint is a
real Pod on node-a), then a client Pod on node-a opens connections to the measured
ClusterIP and times ``connect()`` (SYN out, SYN-ACK back: every packet of the handshake
crosses the ruleset). In iptables mode, the rules the first packet meets are also counted
from the node's ``iptables-save`` (:mod:`bench.iptables_path`).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.cluster import cluster, cluster_ip
from bench.iptables_path import Packet, first_packet
from bench.modes import Mode
from bench.sync_worker import feed
from kubeproxy.dataplane.iptables.runner import IptablesCommand
from kubeproxy.lab.cluster import NODE, Lab
from kubeproxy.lab.objects import Ep, endpoint_slice, service
from kubeproxy.model.state import ProxyState
from kubeproxy.model.types import IPFamily

ROOT = Path(__file__).resolve().parents[1]
POD_IP = "10.244.1.10"
CLIENT_IP = "10.244.1.100"


def connect_times(ip: str, port: int, count: int) -> list[float]:
    out = []
    for _ in range(count):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            started = time.perf_counter()
            s.connect((ip, port))
            out.append(time.perf_counter() - started)
    return out


def probe(lab: Lab, ip: str, port: int, count: int) -> list[float]:
    """``connect_times`` in a process of its own in the client Pod's namespace.

    Not a thread of this process: the Pods' echo servers are threads here, and waiting
    for the GIL after ``connect()`` returns would be measured as network latency.
    """
    code = (
        "import json, sys; from bench.datapath import connect_times; "
        "print(json.dumps(connect_times(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))"
    )
    out = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            lab.pods["client"].netns,
            sys.executable,
            "-c",
            code,
            ip,
            str(port),
            str(count),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'src'}"),
        cwd=ROOT,
    )
    times: list[float] = json.loads(out.stdout)
    return times


def measured_ip(services: int) -> str:
    """The measured Service's ClusterIP: the next one after the N-1 synthetic ones', so it
    sits among them (in iptables mode, at the full depth of the dispatch tree)."""
    return cluster_ip(services - 1)


def program(lab: Lab, services: int, mode: Mode) -> None:
    state = ProxyState(NODE)
    objects = list(cluster(services - 1, 10))
    objects += [
        service(
            "measured", measured_ip(services), [{"name": "http", "port": 80}], namespace="bench"
        ),
        endpoint_slice("measured", [Ep(POD_IP, node=NODE)], namespace="bench"),
    ]
    feed(state, objects)
    config = mode.config(NODE, ("10.244.0.0/16",))
    snapshot, _ = state.collect()
    mode.backend(config, netns=lab.node_ns).sync(snapshot, None)


def rules_met(lab: Lab, mode: Mode, ip: str) -> dict[str, Any] | None:
    """iptables mode: the rules the first packet to the measured ClusterIP examines."""
    if mode.flavor is None:
        return None
    ipt = IptablesCommand(IPFamily.IPv4, mode.flavor, netns=lab.node_ns, timeout=600)
    path = first_packet(ipt.save("nat"), ipt.save("filter"), Packet(CLIENT_IP, ip, 80))
    return {
        "examined": path.examined,
        "nat_prerouting": path.nat_prerouting.examined,
        "filter_forward": path.filter_forward.examined,
        "nat_postrouting": path.nat_postrouting.examined,
        "tree": [(s.examined, s.length) for s in path.tree()],
    }


def run(
    sizes: list[int], mode: Mode, connections: int = 1000, rounds: int = 3, repeat: bool = True
) -> list[dict[str, Any]]:
    results = []
    with Lab(f"kpbench{os.getpid() % 100000}", mode=mode.name) as lab:
        lab.add_pod("web", NODE, [POD_IP])
        lab.add_pod("client", NODE, [CLIENT_IP])
        # The smallest size again at the end (unless ``repeat`` is off: going back from a
        # large size is a full sync of its own): the first measurement of a run also
        # pays for cold caches and CPU frequency ramp-up, the repeat shows the noise floor.
        for size in [*sizes, *sizes[: 1 if repeat else 0]]:
            program(lab, size, mode)
            ip = measured_ip(size)
            probe(lab, ip, 80, 500)  # warm up ARP and caches
            medians, p99s = [], []
            for _ in range(rounds):
                times = sorted(probe(lab, ip, 80, connections))
                medians.append(statistics.median(times))
                p99s.append(times[int(0.99 * len(times))])
            results.append(
                {
                    "services": size,
                    "connections": connections * rounds,
                    "median_us": statistics.median(medians) * 1e6,
                    "p99_us": statistics.median(p99s) * 1e6,
                    "rules_met": rules_met(lab, mode, ip),
                }
            )
    return results
