"""The README's main command: run kubeproxy on a namespace "node" against ``examples/``.

1. Build the lab (:mod:`kubeproxy.lab.cluster`): node-a (runs kubeproxy; zone-a), node-b
   (zone-b), an outside client, and one Pod namespace per Pod — those the EndpointSlices
   point at (``targetRef.name``, ``nodeName``, addresses) and those written as Pods
   (``metadata.name``, ``spec.nodeName``, ``status.podIPs``, container ports) — each
   answering with its own name.
2. Copy the manifests to a temporary directory (kubeproxy keeps the ClusterIPs it
   allocates in a state file beside them) and start ``kubeproxy run --manifests`` on it
   in node-a's namespace.
3. For every Service port — reading the ClusterIPs kubeproxy allocated, as
   ``render --objects`` does — connect to each ClusterIP from a client Pod on node-a, and
   to the NodePort from the outside client; print which Pods answered and which source
   address they saw. With ``topology-mode: Auto`` only the client's zone answers.
4. Stop kubeproxy, remove its rules, delete every namespace.

Needs root (namespaces, nftables); changes nothing outside the namespaces it creates.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kubeproxy.controlplane.endpointslice import hints_enabled
from kubeproxy.lab.cluster import CLIENT_IP, NODE, NODE_IP, Lab
from kubeproxy.lab.echo import Reply, tcp_ask, udp_ask
from kubeproxy.lab.netns import ns_exec
from kubeproxy.model.types import L4Protocol, Service, ServicePort
from kubeproxy.sources.standalone import StandaloneSource

CLIENT_POD = "client"
CLIENT_POD_IPS = ("10.244.1.100", "fd00:10:244:1::100")


@dataclass
class PodPlan:
    node: str
    ips: set[str] = field(default_factory=set)
    ports: set[int] = field(default_factory=set)


def plan_pods(directory: Path) -> dict[str, PodPlan]:
    """The example's Pods (written as Pods, or named by EndpointSlices): node, IPs, ports."""
    pods: dict[str, PodPlan] = {}
    for path in sorted(directory.rglob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "Pod":
                _plan_pod(pods, doc)
            if not isinstance(doc, dict) or doc.get("kind") != "EndpointSlice":
                continue
            ports = {p["port"] for p in doc.get("ports") or [] if p.get("port")}
            for ep in doc.get("endpoints") or []:
                name = (ep.get("targetRef") or {}).get("name")
                if not name or not ep.get("nodeName"):
                    continue
                plan = pods.setdefault(name, PodPlan(ep["nodeName"]))
                plan.ips.add(ep["addresses"][0])
                plan.ports |= ports
    return pods


def _plan_pod(pods: dict[str, PodPlan], doc: dict[str, Any]) -> None:
    spec, status = doc.get("spec") or {}, doc.get("status") or {}
    ips = [entry["ip"] for entry in status.get("podIPs") or ()] or [status.get("podIP")]
    plan = pods.setdefault(doc["metadata"]["name"], PodPlan(spec["nodeName"]))
    plan.ips |= {ip for ip in ips if ip}
    plan.ports |= {
        port["containerPort"]
        for container in spec.get("containers") or ()
        for port in container.get("ports") or ()
    }


def _describe(replies: list[Reply | str]) -> str:
    pods = Counter(r.pod if isinstance(r, Reply) else r for r in replies)
    sources = sorted({r.client_ip for r in replies if isinstance(r, Reply)})
    answered = ", ".join(f"{pod} x{n}" for pod, n in sorted(pods.items()))
    seen = f"  (backends saw source {', '.join(sources)})" if sources else ""
    return answered + seen


def _ask_many(ask: Callable[..., Reply], ip: str, port: int, count: int) -> list[Reply | str]:
    out: list[Reply | str] = []
    for _ in range(count):
        try:
            out.append(ask(ip, port))
        except ConnectionRefusedError:
            out.append("connection refused")
        except (TimeoutError, OSError):
            out.append("no answer")
    return out


def _targets(svc: ServicePort) -> list[tuple[str, str, str, int]]:
    """(label, who asks, address, port) for each way to reach one ServicePort."""
    out = []
    for ip in svc.cluster_ips:
        shown = f"[{ip}]" if ":" in ip else ip
        out.append((f"ClusterIP {shown}:{svc.port}", "pod", ip, svc.port))
    if svc.node_port:
        out.append((f"NodePort {NODE_IP}:{svc.node_port}", "client", NODE_IP, svc.node_port))
    return out


def _policy(svc: ServicePort, who: str, hinted: set[str]) -> str:
    """The setting that decides this line, as the manifest spells it."""
    if who == "pod" and svc.internal_policy_local:
        return "internalTrafficPolicy: Local"
    if who == "client" and svc.external_policy_local:
        return "externalTrafficPolicy: Local"
    if who == "pod" and svc.name.service.name in hinted:
        return "topology-mode: Auto; the client is in zone-a"
    return ""


@dataclass
class ExampleCluster:
    """The example's Service ports as kubeproxy completes them, and which have hints."""

    services: list[ServicePort]
    hinted: set[str]


def load_cluster(directory: Path) -> ExampleCluster:
    """What ``render --objects`` shows: ClusterIPs from the state file kubeproxy wrote."""
    source = StandaloneSource(directory, persist=False)
    ports = [
        port
        for event in source.reload()
        if isinstance(event.new, Service)
        for port in event.new.ports
    ]
    hinted = {
        doc["metadata"]["name"]
        for doc in source.cluster.objects()
        if doc.get("kind") == "Service"
        and hints_enabled((doc.get("metadata") or {}).get("annotations") or {})
    }
    return ExampleCluster(sorted(ports, key=lambda p: str(p.name)), hinted)


def run_demo(directory: Path, requests: int, out: Any = sys.stdout) -> int:
    pods = plan_pods(directory)
    prefix = f"kpdemo{os.getpid() % 100000}"
    print(
        f"Building the lab: node {NODE} (runs kubeproxy), node-b, an outside client, "
        f"{len(pods) + 1} Pods",
        file=out,
    )
    with Lab(prefix) as lab, tempfile.TemporaryDirectory() as tmp:
        for name, plan in sorted(pods.items()):
            lab.add_pod(name, plan.node, sorted(plan.ips), tuple(sorted(plan.ports)))
        lab.add_pod(CLIENT_POD, NODE, CLIENT_POD_IPS)
        log = Path(tmp) / "kubeproxy.log"
        # A copy: the state file of the ClusterIPs kubeproxy allocates goes beside it.
        manifests = Path(tmp) / "manifests"
        shutil.copytree(directory, manifests, ignore=shutil.ignore_patterns(".*"))
        started = time.monotonic()
        proc = lab.start(manifests, log=log)
        try:
            lab.wait_for_table()
        except TimeoutError:
            print(log.read_text(), file=out)
            raise
        # The sync's log line, without the list of what changed (everything, here).
        synced = log.read_text().strip().splitlines()[-1].split("] ", 1)[-1]
        print(
            f"kubeproxy programmed node-a in {time.monotonic() - started:.2f}s "
            f"(log: {synced.split('; changed: ')[0]})\n",
            file=out,
        )
        cluster = load_cluster(manifests)
        print(
            f"Each line: {requests} connections; who answered.  Pod client = "
            f"{CLIENT_POD_IPS[0]} on {NODE} (zone-a); outside client = {CLIENT_IP}.\n",
            file=out,
        )
        for svc in cluster.services:
            ask = udp_ask if svc.protocol is L4Protocol.UDP else tcp_ask
            for label, who, ip, port in _targets(svc):
                runner = lab.in_pod(CLIENT_POD) if who == "pod" else lab.executor(lab.client_ns)
                replies = runner.call(_ask_many, ask, ip, port, requests)
                policy = _policy(svc, who, cluster.hinted)
                print(
                    f"{svc.name!s:36} {label:30} from {who:6}: {_describe(replies)}"
                    + (f"  [{policy}]" if policy else ""),
                    file=out,
                )
        proc.terminate()
        proc.wait(10)
        ns_exec(lab.node_ns, sys.executable, "-m", "kubeproxy", "cleanup", check=False)
        print("\nStopped kubeproxy, removed its rules and every namespace.", file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kubeproxy.lab.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("examples", type=Path, nargs="?", default=Path("examples"))
    parser.add_argument("--requests", type=int, default=12)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the demo needs root: it creates network namespaces and nftables rules")
    return run_demo(args.examples, args.requests)


if __name__ == "__main__":
    sys.exit(main())
