"""A two-node "cluster" built from network namespaces, for the demo and real-kernel tests.

::

    client (192.168.60.2)            an outside client: NodePort / external traffic
       |
    node-a (192.168.60.1 | 192.168.50.1)   kubeproxy runs here; Pods 10.244.1.0/24
       |
    node-b (192.168.50.2)            a "remote" node without a proxy; Pods 10.244.2.0/24

Pods are namespaces wired to their node with a point-to-point veth (the Pod has a /32,
its default route points at the node's gateway address), so every Pod packet is routed
by its node — the way most CNI plugins do it, and what kube-proxy's rules assume. Each
Pod runs an :class:`~kubeproxy.lab.echo.EchoServer` answering with its own name.
IPv6 mirrors IPv4 (``fd00:50::/64``, ``fd00:10:244:1::/64``...).

Everything is named ``<prefix>-<role>`` and deleted by name in :meth:`Lab.close`, which
also runs when the ``with`` block fails.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from kubeproxy.lab.echo import EchoServer
from kubeproxy.lab.netns import (
    NetnsExecutor,
    add_netns,
    addr,
    delete_netns,
    ns_exec,
    route,
    sysctls,
    veth,
)

NODE = "node-a"
REMOTE_NODE = "node-b"
NODE_IP, NODE_IP6 = "192.168.50.1", "fd00:50::1"
REMOTE_NODE_IP, REMOTE_NODE_IP6 = "192.168.50.2", "fd00:50::2"
CLIENT_GW, CLIENT_GW6 = "192.168.60.1", "fd00:60::1"
CLIENT_IP, CLIENT_IP6 = "192.168.60.2", "fd00:60::2"
CLUSTER_CIDRS = ("10.244.0.0/16", "fd00:10:244::/56")
POD_GATEWAYS = {
    NODE: ("10.244.1.1", "fd00:10:244:1::1"),
    REMOTE_NODE: ("10.244.2.1", "fd00:10:244:2::1"),
}
POD_CIDRS = {
    NODE: ("10.244.1.0/24", "fd00:10:244:1::/64"),
    REMOTE_NODE: ("10.244.2.0/24", "fd00:10:244:2::/64"),
}


@dataclass
class Pod:
    name: str
    node: str
    ips: tuple[str, ...]
    netns: str
    server: EchoServer


# How kubeproxy runs in the lab: the nftables mode, or iptables mode on either iptables.
MODE_FLAGS = {
    "nftables": ("--proxy-mode", "nftables"),
    "iptables-nft": ("--proxy-mode", "iptables", "--iptables-backend", "nft"),
    "iptables-legacy": ("--proxy-mode", "iptables", "--iptables-backend", "legacy"),
    # ebpf mode also needs its cgroup and pin flags (kubeproxy.lab.sockclient.BpfLab).
    "ebpf": ("--proxy-mode", "ebpf"),
}


@dataclass
class Lab:
    prefix: str
    mode: str = "nftables"
    pods: dict[str, Pod] = field(default_factory=dict)
    _namespaces: list[str] = field(default_factory=list)
    _executors: dict[str, NetnsExecutor] = field(default_factory=dict)
    _procs: list[subprocess.Popen[str]] = field(default_factory=list)
    _veth_ids: itertools.count[int] = field(default_factory=itertools.count)
    # node-a's manifest parse cache: the lab's own, not the machine's default
    # (/var/cache/kubeproxy/manifests would keep a file per test directory for good).
    cache_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kplab-cache-")))

    # ------------------------------------------------------------ namespaces

    @property
    def node_ns(self) -> str:
        return f"{self.prefix}-node"

    @property
    def remote_ns(self) -> str:
        return f"{self.prefix}-remote"

    @property
    def client_ns(self) -> str:
        return f"{self.prefix}-client"

    def node_netns(self, node: str) -> str:
        return self.node_ns if node == NODE else self.remote_ns

    def _add(self, name: str) -> str:
        self._namespaces.append(name)
        add_netns(name)
        return name

    def build(self) -> Lab:
        node, remote, client = (
            self._add(n) for n in (self.node_ns, self.remote_ns, self.client_ns)
        )
        for ns in (node, remote):
            # The kernel rate-limits ICMP errors per destination (about 1/s after a burst
            # of 6), so a test that opens many connections to a Service with no endpoints
            # would see timeouts instead of "connection refused". Real nodes have the same
            # limit with upstream kube-proxy; the lab turns it off to stay deterministic.
            sysctls(
                ns,
                {
                    "net.ipv4.ip_forward": "1",
                    "net.ipv6.conf.all.forwarding": "1",
                    "net.ipv4.icmp_ratelimit": "0",
                    "net.ipv6.icmp.ratelimit": "0",
                },
            )
        # node <-> remote node: the "underlay".
        veth(node, "eth0", remote, "eth0")
        addr(node, "eth0", f"{NODE_IP}/24")
        addr(node, "eth0", f"{NODE_IP6}/64")
        addr(remote, "eth0", f"{REMOTE_NODE_IP}/24")
        addr(remote, "eth0", f"{REMOTE_NODE_IP6}/64")
        for v4, v6 in (POD_CIDRS[REMOTE_NODE],):
            route(node, v4, "via", REMOTE_NODE_IP)
            route(node, v6, "via", REMOTE_NODE_IP6)
        route(remote, "default", "via", NODE_IP)
        route(remote, "default", "via", NODE_IP6)
        # Like a real node, node-a has a default route, so traffic to a Service IP
        # that no rule DNATs is forwarded (and meets the REJECT/DROP filter rules).
        route(node, "default", "via", REMOTE_NODE_IP)
        route(node, "default", "via", REMOTE_NODE_IP6)
        # node <-> outside client.
        veth(node, "ext0", client, "eth0")
        addr(node, "ext0", f"{CLIENT_GW}/24")
        addr(node, "ext0", f"{CLIENT_GW6}/64")
        addr(client, "eth0", f"{CLIENT_IP}/24")
        addr(client, "eth0", f"{CLIENT_IP6}/64")
        route(client, "default", "via", CLIENT_GW)
        route(client, "default", "via", CLIENT_GW6)
        return self

    def add_pod(
        self, name: str, node: str, ips: Sequence[str], ports: tuple[int, ...] = (8080,)
    ) -> Pod:
        """A Pod on ``node`` with the given addresses (one per family) running an echo server."""
        ns = self._add(f"{self.prefix}-pod-{len(self.pods)}")
        host_ns = self.node_netns(node)
        host_dev = f"vp{next(self._veth_ids)}"
        veth(host_ns, host_dev, ns, "eth0")
        gw4, gw6 = POD_GATEWAYS[node]
        for ip in ips:
            gw = gw6 if ":" in ip else gw4
            bits = "128" if ":" in ip else "32"
            addr(host_ns, host_dev, f"{gw}/{bits}", peer=f"{ip}/{bits}")
            addr(ns, "eth0", f"{ip}/{bits}", peer=f"{gw}/{bits}")
            route(ns, "default", "via", gw)
        server = EchoServer(name, ports)
        server.start_in(ns)
        pod = Pod(name, node, tuple(ips), ns, server)
        self.pods[name] = pod
        return pod

    def executor(self, ns: str) -> NetnsExecutor:
        if ns not in self._executors:
            self._executors[ns] = NetnsExecutor(ns)
        return self._executors[ns]

    def in_pod(self, pod: str) -> NetnsExecutor:
        return self.executor(self.pods[pod].netns)

    # -------------------------------------------------------------- kubeproxy

    def kubeproxy_command(self, *args: str, prefix: tuple[str, ...] = ()) -> list[str]:
        """``kubeproxy ARGS`` in the node namespace (``prefix`` runs before Python)."""
        return [
            "ip",
            "netns",
            "exec",
            self.node_ns,
            *prefix,
            sys.executable,
            "-m",
            "kubeproxy",
            *args,
        ]

    def proxy_flags(self, manifests: Path, mode: str | None = None) -> tuple[str, ...]:
        """The flags node-a's proxy runs with (``run``, ``explain`` and ``list`` take them),
        in the lab's mode or ``mode`` (a :data:`MODE_FLAGS` key)."""
        return (
            "--manifests",
            str(manifests),
            "--hostname-override",
            NODE,
            "--cluster-cidr",
            ",".join(CLUSTER_CIDRS),
            "--manifests-cache-dir",
            str(self.cache_dir),
            *MODE_FLAGS[mode or self.mode],
        )

    def kubeproxy_args(
        self, manifests: Path, *extra: str, prefix: tuple[str, ...] = ()
    ) -> list[str]:
        """``kubeproxy run`` for node-a of the lab, reading ``manifests``."""
        return self.kubeproxy_command("run", *self.proxy_flags(manifests), *extra, prefix=prefix)

    def explain(self, manifests: Path, *args: str) -> dict[str, Any]:
        """``kubeproxy explain --live -o json`` in node-a's namespace, with the flags of
        :meth:`kubeproxy_args` (``args``: the extra flags of the sync, then the packet's)."""
        return self.live_json("explain", manifests, *args)[1]

    def list_live(self, manifests: Path, *args: str) -> tuple[int, dict[str, Any]]:
        """``kubeproxy list --live -o json``, as :meth:`explain`: its exit status and output."""
        return self.live_json("list", manifests, *args)

    def live_json(self, which: str, manifests: Path, *args: str) -> tuple[int, dict[str, Any]]:
        """``kubeproxy WHICH --live -o json`` with node-a's flags: exit status, output."""
        command = self.kubeproxy_command(
            which, *self.proxy_flags(manifests), *args, "--live", "-o", "json"
        )
        result = self.run(command)
        # Exit status 1 reports drift (in the output); anything else is a failure.
        if result.returncode not in (0, 1):
            raise RuntimeError(f"kubeproxy {which} failed: {result.stderr}")
        data: dict[str, Any] = json.loads(result.stdout)
        return result.returncode, data

    def sync_once(self, manifests: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        """Run ``kubeproxy run --once`` for node-a in the node namespace."""
        return self.run(self.kubeproxy_args(manifests, "--once", *extra))

    def run(self, command: list[str]) -> subprocess.CompletedProcess[str]:
        """Run ``command`` (e.g. :meth:`kubeproxy_command`) to completion, output captured."""
        return subprocess.run(command, capture_output=True, text=True, check=False, env=lab_env())

    def start(self, manifests: Path, *extra: str, log: Path | None = None) -> subprocess.Popen[str]:
        """Start ``kubeproxy run`` for node-a in the node namespace (stopped in :meth:`close`)."""
        return self.spawn(self.kubeproxy_args(manifests, *extra), log=log)

    def spawn(self, command: list[str], *, log: Path | None = None) -> subprocess.Popen[str]:
        """Start ``command`` (e.g. :meth:`kubeproxy_command`); stopped in :meth:`close`."""
        proc = spawn(command, log)
        self._procs.append(proc)
        return proc

    def rules_present(self) -> bool:
        """Whether kubeproxy's rules are in node-a's kernel (in the lab's mode)."""
        if self.mode in ("nftables", "ebpf"):
            return "kube-proxy" in ns_exec(self.node_ns, "nft", "list", "tables", check=False)
        save = "iptables-legacy-save" if self.mode == "iptables-legacy" else "iptables-nft-save"
        return ":KUBE-SERVICES" in ns_exec(self.node_ns, save, "-t", "nat", check=False)

    def wait_for_table(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.rules_present():
                return
            time.sleep(0.05)
        raise TimeoutError("kubeproxy did not program its rules")

    # --------------------------------------------------------------- cleanup

    def close(self) -> None:
        for proc in self._procs:
            stop_process(proc)
        for pod in self.pods.values():
            pod.server.stop()
        for ex in self._executors.values():
            ex.shutdown()
        for ns in reversed(self._namespaces):
            delete_netns(ns)
        self._namespaces.clear()
        shutil.rmtree(self.cache_dir, ignore_errors=True)

    def __enter__(self) -> Lab:
        try:
            return self.build()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def spawn(command: list[str], log: Path | None, mode: str = "w") -> subprocess.Popen[str]:
    """Start ``command`` in a session of its own (so :func:`stop_process` takes its
    children along), its output to ``log`` (opened with ``mode``; None: discarded)."""
    with open(log if log is not None else os.devnull, mode) as out:
        # The child gets its own copy of the descriptor; ours can close right away.
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=lab_env(),
            start_new_session=True,
        )


def stop_process(proc: subprocess.Popen[str]) -> None:
    """SIGTERM a process started in its own session (and its children), then SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def lab_env() -> dict[str, str]:
    """The environment of a lab process: kubeproxy imported from this source tree."""
    env = dict(os.environ)
    # kubeproxy must import from the same source tree as the caller.
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
