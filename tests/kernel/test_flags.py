"""Upstream flags that change how ``kubeproxy run`` behaves as a process, for real.

Each test runs kubeproxy in one network namespace this module creates (and deletes, by
its own name): a node with its node IP 10.250.0.1 and a second local address 10.251.0.1
on one interface. HTTP requests come from threads inside that namespace.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeproxy.lab.cluster import stop_process
from kubeproxy.lab.netns import NetnsExecutor, add_netns, delete_netns, list_netns, ns_exec
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, node, service
from tests.kernel.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
NODE = "node-a"
NODE_IP, OTHER_IP = "10.250.0.1", "10.251.0.1"
HC_PORT = 32200


class Node:
    """The namespace, a thread pool inside it, and the kubeproxy processes started."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inside = NetnsExecutor(name)
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, manifests: Path, *flags: str, log: Path) -> subprocess.Popen[str]:
        command = [
            "ip", "netns", "exec", self.name, sys.executable, "-m", "kubeproxy", "run",
            "--manifests", str(manifests), "--hostname-override", NODE,
            # The parse cache beside the manifests, not in the machine's /var/cache.
            "--manifests-cache-dir", str(manifests.parent / "parse-cache"),
            "--proxy-mode", "nftables", *flags,  # a test's own --proxy-mode comes last
        ]  # fmt: skip
        with open(log, "w") as out:
            proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def get(self, url: str, timeout: float = 2.0) -> tuple[int, str]:
        """Status and body of a GET from inside the namespace; raises OSError if refused."""

        def fetch() -> tuple[int, str]:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:
                    return resp.status, resp.read().decode()
            except urllib.error.HTTPError as err:
                return err.code, err.read().decode()

        return self.inside.call(fetch)

    def refused(self, url: str) -> bool:
        try:
            self.get(url)
        except (urllib.error.URLError, ConnectionError):
            return True
        return False

    def stop_all(self) -> None:
        for proc in self.procs:
            stop_process(proc)
        self.procs.clear()


@pytest.fixture(scope="module")
def node_ns() -> Iterator[Node]:
    name = f"kpf{os.getpid() % 100000}-node"
    add_netns(name)
    ns = Node(name)
    try:
        # A veth pair with both ends here: an interface that is up, without other hosts.
        ns_exec(name, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
        for dev in ("eth0", "eth1"):
            ns_exec(name, "ip", "link", "set", dev, "up")
        ns_exec(name, "ip", "addr", "add", f"{NODE_IP}/24", "dev", "eth0")
        ns_exec(name, "ip", "addr", "add", f"{OTHER_IP}/24", "dev", "eth0")
        yield ns
    finally:
        ns.stop_all()
        ns.inside.shutdown()
        delete_netns(name)
    assert name not in list_netns()


@pytest.fixture
def running(node_ns: Node) -> Iterator[Node]:
    """The namespace; kubeproxy processes a test starts are stopped after it."""
    try:
        yield node_ns
    finally:
        node_ns.stop_all()


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    mdir = ManifestDir(tmp_path / "manifests")
    mdir.path.mkdir()
    mdir.write("node.yaml", node(NODE, [NODE_IP]))
    mdir.write(
        "lb.yaml",
        service(
            "lb",
            "10.96.40.1",
            [{"name": "http", "port": 80, "nodePort": 31200}],
            type="LoadBalancer",
            externalTrafficPolicy="Local",
            healthCheckNodePort=HC_PORT,
        ),
        endpoint_slice("lb", [Ep("10.244.1.10", node=NODE)]),
    )
    return mdir.path


def healthz_up(ns: Node) -> bool:
    return ns.get("http://127.0.0.1:10256/healthz")[0] == 200


@pytest.mark.parametrize(
    "case",
    [
        # (flags, answers on, refused on)
        ((), NODE_IP, OTHER_IP),  # nftables' default: primary (the Node's InternalIP)
        (("--nodeport-addresses", "10.251.0.0/16"), OTHER_IP, NODE_IP),
    ],
)
def test_health_check_node_port_listens_on_the_selected_node_ips(
    running: Node, manifests: Path, tmp_path: Path, case: tuple[tuple[str, ...], str, str]
) -> None:
    flags, answers, refuses = case
    running.start(manifests, *flags, log=tmp_path / "log")
    wait_for(lambda: running.get(f"http://{answers}:{HC_PORT}/")[0] == 200)
    _, body = running.get(f"http://{answers}:{HC_PORT}/")
    assert json.loads(body)["localEndpoints"] == 1
    assert running.refused(f"http://{refuses}:{HC_PORT}/")


def test_oom_score_adj_is_applied_at_start(running: Node, manifests: Path, tmp_path: Path) -> None:
    # Raising the score needs no privilege: the value must be there.
    raised = running.start(manifests, "--oom-score-adj", "500", log=tmp_path / "raised")
    wait_for(lambda: healthz_up(running))
    # `ip netns exec` execs Python in place: the pid is kubeproxy's.
    assert Path(f"/proc/{raised.pid}/oom_score_adj").read_text().strip() == "500"
    running.stop_all()
    # The default, -999, needs CAP_SYS_RESOURCE (a sandbox may not have it): either it
    # is applied, or the proxy says it is not and runs anyway, as upstream.
    log = tmp_path / "default"
    default = running.start(manifests, log=log)
    wait_for(lambda: healthz_up(running))
    score = Path(f"/proc/{default.pid}/oom_score_adj").read_text().strip()
    assert score == "-999" or (
        "Failed to apply OOMScore: cannot write -999" in log.read_text() and score == "0"
    ), (score, log.read_text())


def test_bind_address_hard_fail(running: Node, manifests: Path, tmp_path: Path) -> None:
    def occupy() -> socket.socket:
        sock = socket.socket()
        try:
            # Past a TIME_WAIT of an earlier test's proxy; a listener is still exclusive.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 10256))
            sock.listen()
        except OSError:
            sock.close()
            raise
        return sock

    blocker = running.inside.call(occupy)
    try:
        log = tmp_path / "hard"
        proc = running.start(manifests, "--bind-address-hard-fail", log=log)
        assert proc.wait(30) == 1
        assert "Error running ProxyServer: healthz server failed: " in log.read_text()
        # Without it: the proxy keeps running and serves once the port is free.
        soft = running.start(manifests, log=tmp_path / "soft")
        wait_for(lambda: running.get("http://127.0.0.1:10249/healthz")[0] == 200)
        assert soft.poll() is None
        assert "healthz server failed: " in (tmp_path / "soft").read_text()
        blocker.close()
        wait_for(lambda: running.get("http://127.0.0.1:10256/livez")[0] == 200, timeout=15)
    finally:
        blocker.close()


def test_profiling_and_json_logs(running: Node, manifests: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    running.start(manifests, "--profiling", "--logging-format", "json", log=log)
    base = "http://127.0.0.1:10249"
    wait_for(lambda: running.get(f"{base}/healthz")[0] == 200)
    status, text = running.get(f"{base}/debug/pprof/goroutine")
    assert status == 200 and 'thread "MainThread"' in text and 'task "' in text
    status, text = running.get(f"{base}/debug/pprof/heap")
    assert status == 200 and text.startswith("# tracemalloc: ")
    # A second of samples, then the answer: on a loaded machine (the start's cleanup of
    # other modes' rules runs meanwhile) that can take more than the default 2 s.
    status, text = running.get(f"{base}/debug/pprof/profile?seconds=1&mode=wall", timeout=20)
    assert status == 200 and any(line.startswith("MainThread;") for line in text.splitlines())
    status, text = running.get(f"{base}/configz")
    assert json.loads(text)["kubeproxy.config.k8s.io"]["enableProfiling"] is True
    assert "process_resident_memory_bytes" in running.get(f"{base}/metrics")[1]
    time.sleep(0.2)
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert entries and all({"ts", "caller", "msg"} <= set(e) for e in entries), entries
    assert any(e["msg"].startswith("Starting kubeproxy") and e["v"] == 0 for e in entries)
