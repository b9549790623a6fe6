"""Starting, switching and failing to start never take a node's Services down (issue 22).

Each test has another proxy mode's rules serving real traffic through node-a (a local
Pod connecting to a ClusterIP every 10 ms, the outside client to a NodePort), then does
what an operator or a DaemonSet does: a start that must be refused, a start whose API
server is away, a switch of modes. Not one connect may fail.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kubeproxy.lab.cluster import (
    CLIENT_GW,
    CLUSTER_CIDRS,
    MODE_FLAGS,
    NODE,
    NODE_IP,
    Lab,
    stop_process,
)
from kubeproxy.lab.connects import ConnectProbe
from kubeproxy.lab.echo import tcp_ask
from kubeproxy.lab.netns import ns_exec
from kubeproxy.lab.objects import ManifestDir
from kubeproxy.lab.switch import CLUSTER_IP, NODE_PORT, proxy_command, switch_modes, write_service
from tests.kernel.conftest import PODS

PROXY_MODES = ("iptables-nft",)


def saved(lab: Lab) -> str:
    """node-a's iptables rules in both flavours (counters dropped)."""
    out = []
    for tool in ("iptables-nft-save", "iptables-legacy-save"):
        text = ns_exec(lab.node_ns, tool, check=False)
        out += [line for line in text.splitlines() if not line.startswith(("#", ":"))]
    return "\n".join(out)


@pytest.fixture
def serving(lab: Lab, manifests: ManifestDir) -> ManifestDir:
    """node-a's Service programmed by iptables mode (as upstream's would be)."""
    write_service(manifests, {"local-1": PODS["local-1"][1], "local-2": PODS["local-2"][1]})
    result = lab.run([*proxy_command(lab, manifests.path, "iptables-nft"), "--once"])
    assert result.returncode == 0, result.stderr
    return manifests


def probes(lab: Lab) -> list[ConnectProbe]:
    return [
        ConnectProbe(lab.pods["client"].netns, CLUSTER_IP, 80).start(),
        ConnectProbe(lab.client_ns, NODE_IP, NODE_PORT).start(),
    ]


def stop_all(running: list[ConnectProbe]) -> None:
    for probe in running:
        probe.stop()
    for probe in running:
        assert probe.attempts, "the probe made no connect"
        assert not probe.failures(), probe.failures()[:5]


@pytest.mark.parametrize(
    ("mode", "extra", "reason"),
    [
        # This host's kernel has no IPVS.
        ("ipvs", (), "can't use the IPVS proxier"),
        ("ebpf", ("--ebpf-cgroup-path", "/nonexistent"), "ebpf mode cannot run"),
    ],
)
def test_a_refused_start_changes_nothing(
    lab: Lab, serving: ManifestDir, mode: str, extra: tuple[str, ...], reason: str
) -> None:
    # Before: "Removed what other proxy modes left", then exit 1 with no rules at all.
    before = saved(lab)
    running = probes(lab)
    try:
        time.sleep(0.3)
        result = lab.run(
            lab.kubeproxy_command(
                "run",
                "--manifests-cache-dir",
                str(lab.cache_dir),
                "--manifests",
                str(serving.path),
                "--hostname-override",
                NODE,
                "--cluster-cidr",
                ",".join(CLUSTER_CIDRS),
                "--proxy-mode",
                mode,
                *extra,
            )
        )
        time.sleep(0.3)
    finally:
        stop_all(running)
    assert result.returncode == 1, result.stderr
    assert reason in result.stderr
    assert "Removed" not in result.stderr
    assert saved(lab) == before
    assert "kube-proxy" not in ns_exec(lab.node_ns, "nft", "list", "tables")


def healthz(lab: Lab, port: int) -> tuple[int, dict[str, object]]:
    def get() -> tuple[int, dict[str, object]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    return lab.executor(lab.node_ns).call(get)


def test_an_unreachable_api_server_at_start_keeps_the_running_rules(
    lab: Lab, serving: ManifestDir, tmp_path: Path
) -> None:
    # kubeadm's kubeconfig pointing at a dead server, switching from iptables mode: the
    # old rules keep serving, /healthz says why it is not ready, and the exit does not
    # claim rules it never programmed.
    before = saved(lab)
    log = tmp_path / "proxy.log"
    port = 10356
    running = probes(lab)
    try:
        proc = lab.spawn(
            lab.kubeproxy_command(
                "run",
                "--master",
                "http://127.0.0.1:1",
                "--hostname-override",
                NODE,
                "--healthz-bind-address",
                f"127.0.0.1:{port}",
                "--metrics-bind-address",
                "127.0.0.1:10359",
                *MODE_FLAGS["nftables"],
            ),
            log=log,
        )
        deadline = time.monotonic() + 30
        code, body = 0, dict[str, object]()
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                code, body = healthz(lab, port)
            if code == 503 and "reason" in body:
                break
            time.sleep(0.2)
        assert code == 503, body
        assert "127.0.0.1:1" in str(body["reason"]), body
        assert proc.poll() is None
        stop_process(proc)
    finally:
        stop_all(running)
    text = log.read_text()
    assert "Cannot list" in text or "cannot list" in text, text
    assert "programmed no rules" in text, text
    assert "rules stay in place (run" not in text
    assert "Removed" not in text
    assert saved(lab) == before
    assert "kube-proxy" not in ns_exec(lab.node_ns, "nft", "list", "tables")


@pytest.mark.parametrize("flavor", ["nft", "legacy"])
def test_a_mode_switch_under_traffic_loses_no_connect(
    lab: Lab, manifests: ManifestDir, tmp_path: Path, flavor: str
) -> None:
    # iptables -> nftables -> iptables (bench.mode_switch runs it 20 times). The other
    # mode's rules go only after the new mode's first sync: no gap.
    write_service(manifests, {"local-1": PODS["local-1"][1], "local-2": PODS["local-2"][1]})
    iptables = f"iptables-{flavor}"
    try:
        result = switch_modes(
            lab,
            manifests,
            [iptables, "nftables", iptables],
            pod_client=lab.pods["client"].netns,
            workdir=tmp_path,
        )
    finally:
        lab.run(lab.kubeproxy_command("cleanup"))
    assert len(result.attempts) > 100
    assert not result.failures(), result.failures()[:5]
    # Every mode served: the Pods answered throughout.
    assert {a.outcome for a in result.attempts} == {"local-1", "local-2"}


def test_a_blank_mode_is_iptables_with_node_ports_on_every_local_address(
    lab: Lab, manifests: ManifestDir
) -> None:
    # kubeadm's ConfigMap says mode: "". Resolved to nftables, NodePorts answered on the
    # Node's primary IP only: not on 127.0.0.1, not on the node's other addresses.
    write_service(manifests, {"local-1": PODS["local-1"][1]})
    try:
        result = lab.run(
            lab.kubeproxy_command(
                "run",
                "--once",
                "--manifests-cache-dir",
                str(lab.cache_dir),
                "--manifests",
                str(manifests.path),
                "--hostname-override",
                NODE,
                "--cluster-cidr",
                ",".join(CLUSTER_CIDRS),
            )
        )
        assert result.returncode == 0, result.stderr
        assert "Using the iptables proxy mode: the mode is blank" in result.stderr
        assert "KUBE-SERVICES" in ns_exec(lab.node_ns, "iptables-nft-save", "-t", "nat")
        assert "kube-proxy" not in ns_exec(lab.node_ns, "nft", "list", "tables")
        node = lab.executor(lab.node_ns)
        assert node.call(tcp_ask, "127.0.0.1", NODE_PORT).pod == "local-1"
        # The outside client's gateway is node-a's other address (not the Node's IP).
        outside = lab.executor(lab.client_ns)
        assert outside.call(tcp_ask, CLIENT_GW, NODE_PORT).pod == "local-1"
        assert outside.call(tcp_ask, NODE_IP, NODE_PORT).pod == "local-1"
    finally:
        lab.run(lab.kubeproxy_command("cleanup"))
