"""A multi-node Kubernetes cluster of network namespaces, with a real control plane.

::

    outside (172.31.0.100)       control plane (172.31.0.2: etcd, apiserver, KCM)
          \\                      /
           bridge br0 (in <prefix>-net; 172.31.0.0/24, fd00:31::/64)
          /          |           \\
    node-a (.11)   node-b (.12)   node-c (.13) ...   each: Pods in 10.244.N.0/24
                                                     (fd00:10:244:N::/64), kubeproxy

Nodes are Node objects (zone label, podCIDRs, InternalIP addresses, allocatable CPU, a
Ready condition) whose status the lab writes, as no kubelet runs. A Pod is a network
namespace behind its node (a veth with a /32, as most CNI plugins do) running an
:class:`~kubeproxy.lab.echo.EchoServer`, and a real Pod object bound to the node whose
status the lab sets Running and Ready with its IPs: the real EndpointSlice controller
then publishes it, with the zone from the Node and hints from its TopologyCache.

kubeproxy on a node reads the API server with a token of deploy/'s ``kubeproxy``
ServiceAccount (applied from deploy/base with the real kubectl), so what it may do is
exactly what the ClusterRole there grants. Everything is named ``<prefix>-...`` and
deleted by name in :meth:`KubeLab.close`.
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from kubeproxy.lab.cluster import spawn, stop_process
from kubeproxy.lab.echo import EchoServer
from kubeproxy.lab.kube.api import Api, ApiError, Obj
from kubeproxy.lab.kube.binaries import Binaries
from kubeproxy.lab.kube.controlplane import API_PORT, ControlPlane, kubeconfig
from kubeproxy.lab.netns import (
    NetnsExecutor,
    add_netns,
    addr,
    delete_netns,
    route,
    sh,
    sysctls,
    veth,
)

ROOT = Path(__file__).resolve().parents[4]
DEPLOY = ROOT / "deploy" / "base"
SUBNET4, SUBNET6 = "172.31.0", "fd00:31::"
CP_IP, CP_IP6 = f"{SUBNET4}.2", f"{SUBNET6}2"
OUTSIDE_IP, OUTSIDE_IP6 = f"{SUBNET4}.100", f"{SUBNET6}100"
CLUSTER_CIDRS = ("10.244.0.0/16", "fd00:10:244::/56")
SERVICE_CIDRS = ("10.96.0.0/16", "fd00:10:96::/112")


# No rate limit on the ICMP errors a namespace sends: no limit per peer, and no type in
# the rate masks, so the host-wide bucket (icmp_msgs_per_sec) is not consulted either.
NO_ICMP_RATE_LIMIT = {
    "net.ipv4.icmp_ratelimit": "0",
    "net.ipv6.icmp.ratelimit": "0",
    "net.ipv4.icmp_ratemask": "0",
    "net.ipv6.icmp.ratemask": "2",  # packet too big only (a bitmap cannot be empty here)
}


@dataclass
class KubeNode:
    name: str
    index: int
    zone: str
    netns: str

    @property
    def ip(self) -> str:
        return f"{SUBNET4}.{10 + self.index}"

    @property
    def ip6(self) -> str:
        return f"{SUBNET6}{10 + self.index:x}"

    @property
    def pod_cidrs(self) -> tuple[str, str]:
        return f"10.244.{self.index}.0/24", f"fd00:10:244:{self.index:x}::/64"

    @property
    def gateways(self) -> tuple[str, str]:
        return f"10.244.{self.index}.1", f"fd00:10:244:{self.index:x}::1"


@dataclass
class KubePod:
    name: str
    namespace: str
    node: KubeNode
    ips: tuple[str, ...]
    netns: str
    server: EchoServer


@dataclass
class KubeLab:
    prefix: str
    workdir: Path
    binaries: Binaries
    nodes: dict[str, KubeNode] = field(default_factory=dict)
    pods: dict[str, KubePod] = field(default_factory=dict)
    control_plane: ControlPlane | None = None
    _namespaces: list[str] = field(default_factory=list)
    _executors: dict[str, NetnsExecutor] = field(default_factory=dict)
    _procs: list[subprocess.Popen[str]] = field(default_factory=list)
    # The kubeproxy started on each node (start_kubeproxy), for a test that swaps it.
    proxies: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _pod_hosts: dict[str, itertools.count[int]] = field(default_factory=dict)
    _token: str | None = None

    # ------------------------------------------------------------- network

    @property
    def net_ns(self) -> str:
        return f"{self.prefix}-net"

    @property
    def cp_ns(self) -> str:
        return f"{self.prefix}-cp"

    @property
    def outside_ns(self) -> str:
        return f"{self.prefix}-out"

    def _add(self, name: str) -> str:
        self._namespaces.append(name)
        add_netns(name)
        # Every ICMP error a lab namespace sends (REJECT's unreachables, a Pod's closed
        # port) goes out: the kernel's limits (per peer, and a bucket of 50 shared by
        # all namespaces) dropped some under the probes' bursts, and a probe that was
        # refused then timed out now and then, more where it was asked more.
        sysctls(name, NO_ICMP_RATE_LIMIT)
        return name

    def _attach(self, ns: str, ip: str, ip6: str) -> None:
        """``ns``'s eth0 on the bridge with these addresses."""
        port = f"b{next(self._ids)}"
        veth(self.net_ns, port, ns, "eth0")
        sh("ip", "-n", self.net_ns, "link", "set", port, "master", "br0")
        addr(ns, "eth0", f"{ip}/24")
        addr(ns, "eth0", f"{ip6}/64")

    def build(self, nodes: Sequence[tuple[str, str]]) -> KubeLab:
        """The bridge, the control plane (started) and ``nodes`` ((name, zone)...)."""
        self._add(self.net_ns)
        sh("ip", "-n", self.net_ns, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.net_ns, "link", "set", "br0", "up")
        self._add(self.cp_ns)
        self._attach(self.cp_ns, CP_IP, CP_IP6)
        self._add(self.outside_ns)
        self._attach(self.outside_ns, OUTSIDE_IP, OUTSIDE_IP6)
        for i, (name, zone) in enumerate(nodes, start=1):
            ns = self._add(f"{self.prefix}-n{i}")
            node = KubeNode(name, i, zone, ns)
            self.nodes[name] = node
            self._attach(ns, node.ip, node.ip6)
            sysctls(
                ns,
                {
                    "net.ipv4.ip_forward": "1",
                    "net.ipv6.conf.all.forwarding": "1",
                },
            )
        for node in self.nodes.values():
            for other in self.nodes.values():
                if other is not node:
                    v4, v6 = other.pod_cidrs
                    route(node.netns, v4, "via", other.ip)
                    route(node.netns, v6, "via", other.ip6)
            # Like a real node's: a Service IP no rule DNATs is routed somewhere (the
            # outside host, which does not forward), and connect() does not fail at once.
            route(node.netns, "default", "via", OUTSIDE_IP)
            route(node.netns, "default", "via", OUTSIDE_IP6)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.control_plane = ControlPlane(
            self.cp_ns, CP_IP, self.workdir / "cp", self.binaries, SERVICE_CIDRS
        )
        self.control_plane.workdir.mkdir(parents=True, exist_ok=True)
        self.control_plane.up()
        for node in self.nodes.values():
            self._register(node)
        return self

    def executor(self, ns: str) -> NetnsExecutor:
        if ns not in self._executors:
            self._executors[ns] = NetnsExecutor(ns)
        return self._executors[ns]

    # ------------------------------------------------------------ API objects

    @property
    def cp(self) -> ControlPlane:
        assert self.control_plane is not None, "build() first"
        return self.control_plane

    def api(self) -> Api:
        return self.cp.api()

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """The real kubectl as the admin, from the control plane's namespace."""
        proc = subprocess.run(
            ["ip", "netns", "exec", self.cp_ns, self.binaries.kubectl,
             "--kubeconfig", str(self.cp.admin_kubeconfig()), *args],
            capture_output=True, text=True, input=input, check=False,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def _register(self, node: KubeNode) -> None:
        api = self.api()
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node.name,
                    "labels": {
                        "kubernetes.io/hostname": node.name,
                        "topology.kubernetes.io/zone": node.zone,
                    },
                },
                "spec": {"podCIDR": node.pod_cidrs[0], "podCIDRs": list(node.pod_cidrs)},
            }
        )
        api.patch_status("Node", node.name, node_status(node))

    def add_pod(
        self,
        name: str,
        node: str,
        *,
        namespace: str = "default",
        labels: dict[str, str] | None = None,
        ports: tuple[int, ...] = (8080,),
        ready: bool = True,
        dual_stack: bool = True,
    ) -> KubePod:
        """A Pod on ``node``: a namespace with an echo server, and its Pod object bound to
        the node, Running and (``ready``) Ready with its IPs."""
        host = self.nodes[node]
        counter = self._pod_hosts.setdefault(node, itertools.count(10))
        n = next(counter)
        ips = (f"10.244.{host.index}.{n}",) + (
            (f"fd00:10:244:{host.index:x}::{n:x}",) if dual_stack else ()
        )
        ns = self._add(f"{self.prefix}-p{len(self.pods)}")
        host_dev = f"vp{next(self._ids)}"
        veth(host.netns, host_dev, ns, "eth0")
        for ip, gw in zip(ips, host.gateways, strict=False):
            bits = "128" if ":" in ip else "32"
            addr(host.netns, host_dev, f"{gw}/{bits}", peer=f"{ip}/{bits}")
            addr(ns, "eth0", f"{ip}/{bits}", peer=f"{gw}/{bits}")
            route(ns, "default", "via", gw)
        server = EchoServer(name, ports)
        server.start_in(ns)
        pod = KubePod(name, namespace, host, ips, ns, server)
        self.pods[name] = pod
        api = self.api()
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
                "spec": {
                    "nodeName": node,
                    "containers": [
                        {
                            "name": "echo",
                            "image": "kubeproxy-lab/echo",
                            "ports": [{"containerPort": p, "name": f"p{p}"} for p in ports],
                        }
                    ],
                },
            }
        )
        self.set_pod_ready(name, ready)
        return pod

    def set_pod_ready(self, name: str, ready: bool) -> None:
        """Write the Pod's status as a kubelet would (Running, Ready or not)."""
        pod = self.pods[name]
        self.api().patch_status("Pod", name, pod_status(pod, ready), namespace=pod.namespace)

    def delete_pod(self, name: str) -> None:
        """The Pod object goes (at once: no kubelet waits out a grace period); its
        namespace stays until close(), so a test can still reach it directly."""
        pod = self.pods[name]
        self.api().request(
            "DELETE",
            f"/api/v1/namespaces/{pod.namespace}/pods/{name}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
        )

    # ---------------------------------------------------------------- kubeproxy

    def kubeproxy_token(self) -> str:
        """A token of deploy/'s ServiceAccount, bound to deploy/'s ClusterRole (both
        applied from deploy/base by the real kubectl)."""
        if self._token is None:
            for manifest in ("serviceaccount.yaml", "rbac.yaml"):
                self.kubectl("apply", "--server-side", "-f", str(DEPLOY / manifest))
            self._token = self.kubectl(
                "create", "token", "kubeproxy", "-n", "kube-system", "--duration", "24h"
            ).stdout.strip()
        return self._token

    def node_kubeconfig(self, node: str) -> Path:
        return kubeconfig(
            self.workdir / f"{node}.kubeconfig",
            self.cp.server,
            self.cp.certificates().ca.cert,
            token=self.kubeproxy_token(),
        )

    def kubeproxy_command(
        self,
        node: str,
        *args: str,
        cluster_cidr: Sequence[str] = ("--cluster-cidr", ",".join(CLUSTER_CIDRS)),
    ) -> list[str]:
        """``kubeproxy run`` on ``node`` against the API server (``args``: more flags;
        ``cluster_cidr``: those flags, or none)."""
        return [
            "ip", "netns", "exec", self.nodes[node].netns,
            sys.executable, "-m", "kubeproxy", "run",
            "--kubeconfig", str(self.node_kubeconfig(node)),
            "--hostname-override", node,
            *cluster_cidr,
            *args,
        ]  # fmt: skip

    def start_kubeproxy(self, node: str, *args: str) -> subprocess.Popen[str]:
        log = self.workdir / f"kubeproxy-{node}.log"
        self.proxies[node] = self.spawn(self.kubeproxy_command(node, *args), log)
        return self.proxies[node]

    def stop_kubeproxy(self, node: str) -> None:
        """SIGTERM the node's kubeproxy and wait for it; its rules stay, as on any stop."""
        proc = self.proxies.pop(node, None)
        if proc is not None:
            stop_process(proc)

    def spawn(self, command: list[str], log: Path) -> subprocess.Popen[str]:
        """Start ``command``, appending to ``log``; stopped in :meth:`close`."""
        proc = spawn(command, log, "a")
        self._procs.append(proc)
        return proc

    # ----------------------------------------------------------------- cleanup

    def close(self) -> None:
        for proc in self._procs:
            stop_process(proc)
        if self.control_plane is not None:
            self.control_plane.down()
        for pod in self.pods.values():
            pod.server.stop()
        for ex in self._executors.values():
            ex.shutdown()
        for ns in reversed(self._namespaces):
            delete_netns(ns)
        self._namespaces.clear()

    def __enter__(self) -> KubeLab:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def pod_status(pod: KubePod, ready: bool) -> Obj:
    """The status a kubelet writes for ``pod``'s network namespace: Running, its IPs, the
    Ready condition ``ready`` (also for another Pod object over the same namespace)."""
    status = "True" if ready else "False"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "status": {
            "phase": "Running",
            "hostIP": pod.node.ip,
            "hostIPs": [{"ip": pod.node.ip}, {"ip": pod.node.ip6}],
            "podIP": pod.ips[0],
            "podIPs": [{"ip": ip} for ip in pod.ips],
            "containerStatuses": [
                {
                    "name": "echo",
                    "ready": ready,
                    "started": True,
                    "restartCount": 0,
                    "image": "kubeproxy-lab/echo",
                    "imageID": "",
                    "state": {"running": {"startedAt": now}},
                }
            ],
            "conditions": [
                {"type": t, "status": status, "lastTransitionTime": now}
                for t in ("Ready", "ContainersReady")
            ]
            + [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("Initialized", "PodScheduled")
            ],
        }
    }


def node_status(node: KubeNode, cpu: str = "4") -> Obj:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": node.ip},
                {"type": "InternalIP", "address": node.ip6},
                {"type": "Hostname", "address": node.name},
            ],
            "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeproxyLab",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        }
    }


def wait_for(check: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``check()`` until it returns something truthy (an ApiError or OSError counts
    as "not yet"); that value, or TimeoutError."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        with contextlib.suppress(ApiError, OSError):
            last = check()
            if last:
                return last
        time.sleep(0.2)
    raise TimeoutError(f"{what} not reached in {timeout}s (last: {last!r})")


__all__ = ["API_PORT", "KubeLab", "KubeNode", "KubePod", "pod_status", "wait_for"]
