"""``explain`` and ``list`` in kernelspace mode: a packet meets the HNS load balancer
the backend's translation makes for its frontend (or none), on the fixture's Overlay
network (``--hns-state``); its kernel objects are the load balancers ``render`` prints;
``--live`` reads HNS back (on the strict fake here) and is refused off Windows.
Nothing here runs on Windows."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kubeproxy import cli
from kubeproxy.backends.kernelspace import inspect as ks_inspect
from kubeproxy.backends.kernelspace.inspect import HnsNode, KernelspaceInspector
from kubeproxy.backends.kernelspace.proxier import KernelspaceBackend
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig, WinkernelSettings
from kubeproxy.dataplane.hns import LoadBalancer, PortMapping
from kubeproxy.dataplane.hns.fake import FakeHns, load_state
from kubeproxy.explain.command import list_live
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import Endpoint, IPFamily, ServicePort
from tests.unit.conftest import port_name

DATA = Path(__file__).parent / "data" / "kernelspace"
STATE = str(DATA / "hns-state.json")
FLAGS = [
    "--proxy-mode", "kernelspace", "--hostname-override", "win-a", "--hns-state", STATE,
    "--source-vip", "10.244.1.2",
]  # fmt: skip

# Besides the fixture's: an external IP, a Service without endpoints, and an
# externalTrafficPolicy Local Service whose only endpoint is on another node.
EXTRA = """\
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: default}
spec:
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  externalIPs: [7.7.7.7]
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ext-1
  namespace: default
  labels: {kubernetes.io/service-name: ext}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.2.8], nodeName: win-b}
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  clusterIP: 10.96.0.30
  clusterIPs: [10.96.0.30]
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: far, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.40
  clusterIPs: [10.96.0.40]
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30040}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: far-1
  namespace: default
  labels: {kubernetes.io/service-name: far}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.2.9], nodeName: win-b}
"""


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("manifests")
    shutil.copy(DATA / "manifests" / "cluster.yaml", path / "cluster.yaml")
    (path / "extra.yaml").write_text(EXTRA)
    return str(path)


def explain(
    capsys: pytest.CaptureFixture[str], manifests: str, dst: str, port: int, *extra: str
) -> dict[str, Any]:
    argv = ["explain", *FLAGS, "--manifests", manifests, "--src", "203.0.113.5"]
    assert cli.main([*argv, "--dst", dst, "--port", str(port), *extra, "-o", "json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def load_balancers(out: dict[str, Any]) -> list[str]:
    return [o for o in out["kernelObjects"] if o.startswith("hns: load balancer")]


def test_cluster_ip_meets_its_load_balancer(
    capsys: pytest.CaptureFixture[str], manifests: str
) -> None:
    out = explain(capsys, manifests, "10.96.0.10", 80)
    assert (out["mode"], out["verdict"]) == ("kernelspace", "DNAT")
    assert out["endpoints"] == ["10.244.1.5:8080", "10.244.2.7:8080"]
    assert (
        "HNS load balancer ClusterIP 10.96.0.10:80/TCP (Overlay network vxlan0)"
        in (out["reasons"][1])
    )
    # No DSR: source-NATed to the source VIP.
    assert out["masquerade"] is True
    assert any("source VIP 10.244.1.2" in r for r in out["reasons"])
    assert out["kernelObjects"] == [
        "hns: load balancer 10.96.0.10:80/TCP internalPort 8080 flags 0 portFlags 0 "
        "distribution 0 sourceVIP 10.244.1.2 -> 10.244.1.5,10.244.2.7",
        "hns: endpoint 10.244.1.5 (local: the CNI's)",
        "hns: endpoint 10.244.2.7 (remote, provider address 192.168.0.12)",
        "hns: endpoint 10.96.0.10 (remote, provider address 192.168.0.11: the ClusterIP's)",
    ]


def test_enable_dsr_keeps_the_client_address(
    capsys: pytest.CaptureFixture[str], manifests: str
) -> None:
    out = explain(capsys, manifests, "10.96.0.10", 80, "--enable-dsr")
    assert out["masquerade"] is False
    assert any(
        r.startswith("DSR: the endpoint answers the client directly") for r in out["reasons"]
    )
    assert " flags 1 " in load_balancers(out)[0]


def test_node_port_with_local_policy(capsys: pytest.CaptureFixture[str], manifests: str) -> None:
    out = explain(capsys, manifests, "192.168.0.11", 30080, "--enable-dsr")
    assert (out["verdict"], out["endpoints"]) == ("DNAT", ["10.244.1.5:8080"])
    assert out["frontend"]["kind"] == "NodePort"
    assert "HNS load balancer NodePort (node ports):30080/TCP" in out["reasons"][1]
    assert "externalTrafficPolicy Local: this node's endpoints only" in out["reasons"]
    # VipExternalIP | LocalRoutedVIP, DSR (ETP Local with --enable-dsr).
    assert " flags 1 portFlags 18 " in load_balancers(out)[0]
    assert out["excluded"] == [
        {"address": "10.244.2.7:8080", "why": "on win-b, not this node (Local traffic policy)"}
    ]


def test_external_ip_and_load_balancer_ip(
    capsys: pytest.CaptureFixture[str], manifests: str
) -> None:
    ext = explain(capsys, manifests, "7.7.7.7", 80)
    assert (ext["verdict"], ext["endpoints"]) == ("DNAT", ["10.244.2.8:8080"])
    assert "HNS load balancer ExternalIP 7.7.7.7:80/TCP" in ext["reasons"][1]
    assert " portFlags 16 " in load_balancers(ext)[0]
    ingress = explain(capsys, manifests, "5.6.7.8", 80)
    assert (ingress["verdict"], ingress["endpoints"]) == ("DNAT", ["10.244.1.5:8080"])
    assert "HNS load balancer LoadBalancer 5.6.7.8:80/TCP" in ingress["reasons"][1]


def test_without_endpoints_hns_does_not_touch_it(
    capsys: pytest.CaptureFixture[str], manifests: str
) -> None:
    out = explain(capsys, manifests, "10.96.0.30", 80)
    assert (out["verdict"], out["endpoints"], out["kernelObjects"]) == ("NONE", [], [])
    assert "upstream creates no HNS load balancer without endpoints" in out["reasons"][-1]
    # externalTrafficPolicy Local, no endpoint here: no NodePort load balancer either
    # (no DROP as in the Linux modes), while the ClusterIP's has the remote endpoint.
    far = explain(capsys, manifests, "192.168.0.11", 30040)
    assert (far["verdict"], far["kernelObjects"]) == ("NONE", [])
    assert "externalTrafficPolicy Local leaves it no endpoint" in far["reasons"][-1]
    assert explain(capsys, manifests, "10.96.0.40", 80)["verdict"] == "DNAT"


def test_client_ip_affinity_is_source_ip_distribution(
    capsys: pytest.CaptureFixture[str], manifests: str
) -> None:
    out = explain(capsys, manifests, "10.96.0.53", 53, "--protocol", "UDP")
    assert any("DistributionType SourceIP" in r for r in out["reasons"])
    assert not any("10800s" in r for r in out["reasons"])  # HNS takes no timeout
    assert " distribution 2 " in load_balancers(out)[0]


def test_kernel_objects_are_the_load_balancers_render_prints(
    capsys: pytest.CaptureFixture[str], manifests: str
) -> None:
    for dsr in ((), ("--enable-dsr",)):
        assert cli.main(["render", *FLAGS, "--manifests", manifests, *dsr, "-o", "json"]) == 0
        rendered = json.loads(capsys.readouterr().out)["loadBalancers"]
        assert len(rendered) == 7  # web: ClusterIP, NodePort, ingress; dns; ext: 2; far: 1
        for lb in rendered:
            vip = (lb["frontendVIPs"] or [""])[0]
            pm = lb["portMappings"][0]
            proto = {6: "TCP", 17: "UDP"}[pm["protocol"]]
            dst = vip or "192.168.0.11"
            out = explain(capsys, manifests, dst, pm["externalPort"], "--protocol", proto, *dsr)
            assert load_balancers(out) == [
                f"hns: load balancer {vip or '(node ports)'}:{pm['externalPort']}/{proto} "
                f"internalPort {pm['internalPort']} flags {lb['flags']} portFlags "
                f"{pm['flags']} distribution {pm['distributionType']} sourceVIP "
                f"{lb['sourceVIP']} -> {','.join(sorted(lb['endpointIPs']))}"
            ]


def test_list_serves_kernelspace(capsys: pytest.CaptureFixture[str], manifests: str) -> None:
    assert cli.main(["list", *FLAGS, "--manifests", manifests, "-o", "json"]) == 0
    rows = {r["frontend"]: r for r in json.loads(capsys.readouterr().out)}
    assert {"10.96.0.10:80", "5.6.7.8:80", "7.7.7.7:80", "*:30080"} <= set(rows)
    assert rows["*:30080"]["endpoints"]["used"] == 1
    # No endpoint (here): no load balancer, so no DROP / REJECT as in the Linux modes.
    assert (rows["10.96.0.30:80"]["verdict"], rows["*:30040"]["verdict"]) == ("NONE", "NONE")
    assert cli.main(["list", *FLAGS, "--manifests", manifests, "-o", "wide"]) == 0
    assert "DNAT(2)" in capsys.readouterr().out


def test_hns_state_only_in_kernelspace(capsys: pytest.CaptureFixture[str], manifests: str) -> None:
    argv = ["--manifests", manifests, "--hostname-override", "win-a", "--hns-state", STATE]
    for command in (["list"], ["explain", "--src", "1.2.3.4", "--dst", "10.96.0.10"]):
        port = ["--port", "80"] if command[0] == "explain" else []
        assert cli.main([*command, *port, *argv, "--proxy-mode", "nftables"]) == 1
        assert "--hns-state: only with --proxy-mode kernelspace" in capsys.readouterr().err


def test_explain_needs_the_network_off_windows(
    capsys: pytest.CaptureFixture[str], manifests: str
) -> None:
    argv = [*FLAGS[:4], "--manifests", manifests, "--src", "1.2.3.4", "--dst", "10.96.0.10"]
    with pytest.raises(SystemExit, match="2"):
        cli.main(["explain", *argv, "--port", "80"])
    assert "give --hns-state FILE (off Windows)" in capsys.readouterr().err


def test_overlay_needs_a_source_vip(capsys: pytest.CaptureFixture[str], manifests: str) -> None:
    """As the backend refuses to start: nothing would be programmed to explain."""
    argv = [*FLAGS[:-2], "--manifests", manifests, "--src", "1.2.3.4", "--dst", "10.96.0.10"]
    with pytest.raises(SystemExit, match="2"):
        cli.main(["explain", *argv, "--port", "80"])
    assert "an Overlay network needs --source-vip" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["list", "explain"])
def test_live_is_refused_off_windows(
    capsys: pytest.CaptureFixture[str], manifests: str, command: str
) -> None:
    packet = ["--src", "1.2.3.4", "--dst", "10.96.0.10", "--port", "80"]
    argv = [command, *FLAGS[:4], "--manifests", manifests, "--live"]
    with pytest.raises(SystemExit, match="2"):
        cli.main(argv + (packet if command == "explain" else []))
    err = capsys.readouterr().err
    assert "--live: kernelspace mode reads back Windows' HNS, and this machine" in err


# --------------------------------------------------------- --live against the fake HNS

WEB = port_name("web")
NODE = NodeState("win-a", None, {IPFamily.IPv4: "192.168.0.11"})


def _config() -> ProxyConfig:
    win = WinkernelSettings(network_name="vxlan0", source_vip="10.244.1.2")
    return ProxyConfig("win-a", ProxyMode.KERNELSPACE, families=(IPFamily.IPv4,), winkernel=win)


def _snapshot() -> Snapshot:
    svc = ServicePort(WEB, cluster_ips=("10.96.0.10",), port=80, node_port=30080)
    eps = (Endpoint("10.244.1.5", 8080, "win-a"), Endpoint("10.244.2.7", 8080, "win-b"))
    return Snapshot({WEB: svc}, {WEB: eps}, NODE)


def _synced(monkeypatch: pytest.MonkeyPatch) -> FakeHns:
    """A fake HNS a sync programmed, which list --live reads back."""
    fake = load_state(STATE, seed=0)
    config = _config()
    backend = KernelspaceBackend(config, open_hns=lambda: fake)
    backend.start()
    backend.sync(_snapshot(), None)

    def for_config(config: ProxyConfig, *, live: bool = False) -> KernelspaceInspector:
        return KernelspaceInspector(HnsNode(config, fake.network, None, fake))

    monkeypatch.setattr(ks_inspect, "for_config", for_config)
    return fake


def test_live_after_a_sync_has_no_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    _synced(monkeypatch)
    rows, kernel_only = list_live(_config(), _snapshot())
    assert [r.drift for r in rows] == [(), ()]
    assert kernel_only == []


def test_live_reports_a_missing_endpoint_and_a_stale_load_balancer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _synced(monkeypatch)
    cluster = next(lb for lb in fake.list_load_balancers() if lb.vip == "10.96.0.10")
    fake.delete_load_balancer(cluster.id)
    fake.create_load_balancer(replace(cluster, id="", endpoint_ids=cluster.endpoint_ids[:1]))
    stale = LoadBalancer((PortMapping(6, 8080, 81),), ("10.96.0.99",), cluster.endpoint_ids[:1])
    fake.create_load_balancer(stale)
    rows, kernel_only = list_live(_config(), _snapshot())
    by_frontend = {r.frontend: r.drift for r in rows}
    assert by_frontend["10.96.0.10:80"] == ("missing endpoint 10.244.2.7 in 10.96.0.10:80/TCP",)
    assert by_frontend["*:30080"] == ()
    assert len(kernel_only) == 1
    assert kernel_only[0].startswith("hns: load balancer 10.96.0.99:81/TCP")
    assert kernel_only[0].endswith("no Service has it (stale)")
