"""Data-path cost of many Services: TCP connect latency to a ClusterIP.

In the namespace lab, node-a is programmed with N Services (N-1 synthetic ones with 10
endpoints each, plus the measured one whose endpoint is a real Pod on node-a), then a
client Pod on node-a opens connections to the measured ClusterIP and times ``connect()``
(SYN out, SYN-ACK back: every packet of the handshake crosses the ruleset).
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from typing import Any

from bench.cluster import cluster
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config import ProxyConfig
from kubeproxy.dataplane.nft import NftCommand
from kubeproxy.lab.cluster import NODE, Lab
from kubeproxy.lab.objects import Ep, endpoint_slice, service
from kubeproxy.model.parse import parse_endpoint_slice, parse_service
from kubeproxy.model.state import ProxyState
from kubeproxy.model.types import IPFamily

MEASURED_IP = "10.95.0.1"
POD_IP = "10.244.1.10"


def connect_times(ip: str, port: int, count: int) -> list[float]:
    out = []
    for _ in range(count):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            started = time.perf_counter()
            s.connect((ip, port))
            out.append(time.perf_counter() - started)
    return out


def program(lab: Lab, services: int) -> None:
    state = ProxyState(NODE)
    objects = list(cluster(services - 1, 10))
    objects += [
        service("measured", MEASURED_IP, [{"name": "http", "port": 80}], namespace="bench"),
        endpoint_slice("measured", [Ep(POD_IP, node=NODE)], namespace="bench"),
    ]
    for obj in objects:
        if obj["kind"] == "Service":
            state.on_service(None, parse_service(obj))
        else:
            slc = parse_endpoint_slice(obj)
            assert slc is not None
            state.on_endpoint_slice(slc)
    config = ProxyConfig(hostname=NODE, cluster_cidrs=("10.244.0.0/16",), families=(IPFamily.IPv4,))
    snapshot, _ = state.collect()
    NftablesBackend(config, NftCommand(netns=lab.node_ns)).sync(snapshot, None)


def run(sizes: list[int], connections: int = 1000, rounds: int = 3) -> list[dict[str, Any]]:
    results = []
    with Lab(f"kpbench{os.getpid() % 100000}") as lab:
        lab.add_pod("web", NODE, [POD_IP])
        lab.add_pod("client", NODE, ["10.244.1.100"])
        client = lab.in_pod("client")
        for size in sizes:
            program(lab, size)
            client.call(connect_times, MEASURED_IP, 80, 50)  # warm up ARP and caches
            medians, p99s = [], []
            for _ in range(rounds):
                times = sorted(client.call(connect_times, MEASURED_IP, 80, connections))
                medians.append(statistics.median(times))
                p99s.append(times[int(0.99 * len(times))])
            results.append(
                {
                    "services": size,
                    "connections": connections * rounds,
                    "median_us": statistics.median(medians) * 1e6,
                    "p99_us": statistics.median(p99s) * 1e6,
                }
            )
    return results
