"""A running kubeproxy as an operator sees it: health and metrics over HTTP, coalesced
syncs, per-Service health checks, and restarts without a traffic gap.

kubeproxy runs in node-a's namespace; HTTP requests go to its servers on that namespace's
loopback (or, for the load-balancer health check, from the outside client).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from kubeproxy.lab.cluster import NODE, NODE_IP, NODE_IP6, Lab
from kubeproxy.lab.echo import outcome, tcp_ask
from kubeproxy.lab.netns import ns_exec
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, node, service
from tests.kernel.conftest import PODS, ip, wait_for


def get(url: str, timeout: float = 2.0) -> tuple[int, dict[str, str], str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


def eps(*pods: str) -> list[Ep]:
    return [Ep(ip(p), node=PODS[p][0]) for p in pods]


def test_health_and_metrics_servers(lab: Lab, manifests: ManifestDir, tmp_path: Path) -> None:
    manifests.write("svc.yaml", service("web", "10.96.30.1"), endpoint_slice("web", eps("local-1")))
    proc = lab.start(manifests.path, log=tmp_path / "log")
    node_ns = lab.executor(lab.node_ns)
    try:
        wait_for(lambda: node_ns.call(get, "http://127.0.0.1:10256/healthz")[0] == 200)
        code, headers, body = node_ns.call(get, "http://127.0.0.1:10256/healthz")
        assert headers["Content-Type"].startswith("application/json")
        doc = json.loads(body)
        assert doc["nodeEligible"] is True and "lastUpdated" in doc and "currentTime" in doc
        assert node_ns.call(get, "http://127.0.0.1:10256/livez")[0] == 200

        # The Node is being deleted: not eligible for load-balancer traffic any more,
        # but alive (/livez stays 200, so a liveness probe does not restart it).
        deleting = node(NODE, [NODE_IP, NODE_IP6], zone="zone-a")
        deleting["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"
        manifests.write("node.yaml", deleting)
        wait_for(lambda: node_ns.call(get, "http://127.0.0.1:10256/healthz")[0] == 503)
        assert (
            json.loads(node_ns.call(get, "http://127.0.0.1:10256/healthz")[2])["nodeEligible"]
            is False
        )
        assert node_ns.call(get, "http://127.0.0.1:10256/livez")[0] == 200

        code, _, text = node_ns.call(get, "http://127.0.0.1:10249/metrics")
        assert code == 200
        for name in (
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            "kubeproxy_sync_proxy_rules_service_changes_total",
            'kubeproxy_proxy_healthz_total{code="200"}',
            'kubeproxy_proxy_healthz_total{code="503"}',
            'kubeproxy_proxy_livez_total{code="200"}',
            # component-base's, from the proxy's own configuration.
            'kubernetes_build_info{build_date="',
            'kubernetes_feature_enabled{name="NFTablesProxyMode",stage=""} 1.0',
        ):
            assert name in text, name
        # The metrics port is loopback-only by default, as upstream.
        assert lab.executor(lab.client_ns).call(lambda: _refused(f"http://{NODE_IP}:10249/metrics"))
    finally:
        proc.terminate()
        proc.wait(10)


def _refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except (urllib.error.URLError, ConnectionError):
        return True
    return False


def test_service_health_check_node_port(lab: Lab, manifests: ManifestDir) -> None:
    def write(*pods: str) -> None:
        manifests.write(
            "svc.yaml",
            service(
                "lb",
                "10.96.30.2",
                [{"name": "http", "port": 80, "nodePort": 31000}],
                type="LoadBalancer",
                externalTrafficPolicy="Local",
                healthCheckNodePort=32100,
                status={"loadBalancer": {"ingress": [{"ip": "198.51.100.30"}]}},
            ),
            endpoint_slice("lb", eps(*pods)),
        )

    write("local-1", "local-2", "remote-1")
    proc = lab.start(manifests.path)
    outside = lab.executor(lab.client_ns)
    url = f"http://{NODE_IP}:32100/healthz"
    try:
        # The cloud load balancer's probe, from outside: two local endpoints.
        wait_for(lambda: outside.call(get, url)[0] == 200)
        _, headers, body = outside.call(get, url)
        assert headers["X-Load-Balancing-Endpoint-Weight"] == "2"
        assert json.loads(body)["localEndpoints"] == 2
        assert json.loads(body)["service"] == {"namespace": "default", "name": "lb"}
        # No local endpoint left: 503, so the load balancer stops sending here.
        write("remote-1")
        wait_for(lambda: outside.call(get, url)[0] == 503)
        assert outside.call(get, url)[1]["X-Load-Balancing-Endpoint-Weight"] == "0"
        # The Service goes away: so does its health-check server.
        manifests.remove("svc.yaml")
        wait_for(lambda: outside.call(_refused, url))
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_burst_of_changes_coalesces_into_a_few_syncs(
    lab: Lab, manifests: ManifestDir, tmp_path: Path
) -> None:
    # Scaling a 100-endpoint Deployment to zero, one endpoint at a time, as fast as the
    # API server would report it: with minSyncPeriod 1s this must be a handful of syncs.
    def endpoints(count: int) -> list[Ep]:
        return [Ep(f"10.244.2.{100 + i}", node="node-b") for i in range(count)]

    manifests.write("svc.yaml", service("big", "10.96.30.3"), endpoint_slice("big", endpoints(100)))
    log = tmp_path / "log"
    proc = lab.start(manifests.path, "--v=2", log=log)
    try:
        wait_for(lambda: "Synced full" in log.read_text())
        time.sleep(1.2)
        before = log.read_text().count("Synced ")
        started = time.monotonic()
        for remaining in range(99, -1, -1):
            manifests.write(
                "svc.yaml",
                service("big", "10.96.30.3"),
                endpoint_slice("big", endpoints(remaining)),
            )
            time.sleep(0.02)
        elapsed = time.monotonic() - started
        # Converged: no endpoints left means REJECT.
        wait_for(lambda: lab.in_pod("client").call(_outcome, "10.96.30.3") == "refused")
        time.sleep(1.5)
        syncs = log.read_text().count("Synced ") - before
        assert 1 <= syncs <= elapsed / 1.0 + 3, (syncs, elapsed)
        assert syncs < 10
    finally:
        proc.terminate()
        proc.wait(10)


def _outcome(addr: str) -> str:
    return outcome(tcp_ask, addr, 80, 0.5)


def test_restart_adopts_the_rules_without_a_traffic_gap(
    lab: Lab, manifests: ManifestDir, tmp_path: Path
) -> None:
    manifests.write(
        "svc.yaml", service("web", "10.96.30.4"), endpoint_slice("web", eps("local-1", "remote-1"))
    )
    logs = {name: tmp_path / f"{name}.log" for name in ("first", "second")}
    first = lab.start(manifests.path, "-v", "4", log=logs["first"])
    client = lab.in_pod("client")
    wait_for(lambda: client.call(_outcome, "10.96.30.4") in ("local-1", "remote-1"))

    # Each failed ask with when it was (seconds since the traffic began), and the
    # moments around it: a failure seen once under a full suite's load (issue 42) must
    # say where it fell next time.
    failures: list[tuple[float, str]] = []
    moments: dict[str, float] = {}
    done = threading.Event()
    began = time.monotonic()

    def traffic() -> None:
        while not done.is_set():
            result = _outcome("10.96.30.4")
            if result not in ("local-1", "remote-1"):
                failures.append((round(time.monotonic() - began, 3), result))
            time.sleep(0.01)

    running = client.submit(traffic)
    try:
        time.sleep(0.3)
        moments["terminate"] = time.monotonic() - began
        first.terminate()  # SIGTERM: the rules stay
        first.wait(10)
        moments["first gone"] = time.monotonic() - began
        time.sleep(0.5)
        moments["second started"] = time.monotonic() - began
        second = lab.start(manifests.path, "-v", "4", log=logs["second"])
        wait_for(lambda: "Synced full" in logs["second"].read_text())
        moments["second synced"] = time.monotonic() - began
        time.sleep(0.5)
    finally:
        done.set()
        running.result(timeout=10)
    second.terminate()
    second.wait(10)
    tails = {name: log.read_text().splitlines()[-30:] for name, log in logs.items()}
    assert failures == [], (failures, moments, tails)


def test_write_config_to_and_config_file(lab: Lab, manifests: ManifestDir, tmp_path: Path) -> None:
    written = tmp_path / "effective.yaml"
    result = lab.sync_once(manifests.path, "--write-config-to", str(written))
    assert result.returncode == 0, result.stderr
    text = written.read_text()
    assert "kind: KubeProxyConfiguration" in text and "minSyncPeriod: 1s" in text
    # As upstream: an unknown field falls back to lenient decoding with a warning naming
    # it; invalid values are errors, every one reported with its path (no usage banner,
    # exit 1), and nothing is touched.
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
        "kind: KubeProxyConfiguration\nmode: nftables\nnftables:\n  minSyncPeriod: -1s\n"
        "  bogus: 1\n"
    )
    result = lab.sync_once(manifests.path, "--config", str(bad))
    assert result.returncode == 1 and "usage:" not in result.stderr, result.stderr
    assert 'Using lenient decoding as strict decoding failed: unknown field "nftables.bogus"' in (
        result.stderr
    ), result.stderr
    assert "nftables.minSyncPeriod: Invalid value" in result.stderr, result.stderr
    # Every validation error at once, with its field path.
    bad.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
        "kind: KubeProxyConfiguration\nmode: nftables\nnftables:\n  minSyncPeriod: -1s\n"
        "  syncPeriod: -2s\nclusterCIDR: not-a-cidr\n"
    )
    result = lab.sync_once(manifests.path, "--config", str(bad))
    assert result.returncode == 1
    for path in ("nftables.minSyncPeriod", "nftables.syncPeriod", "clusterCIDR"):
        assert path in result.stderr, (path, result.stderr)
    # The example configuration works.
    example = Path(__file__).resolve().parents[2] / "examples" / "kubeproxy-config.yaml"
    result = lab.sync_once(manifests.path, "--config", str(example))
    assert result.returncode == 0, result.stderr


def test_the_example_config_runs_on_its_own(lab: Lab, tmp_path: Path) -> None:
    # `kubeproxy run --config examples/kubeproxy-config.yaml` needs nothing else: its
    # KubeproxyOptions document points at the example manifests. (A copy: kubeproxy
    # writes the ClusterIPs it allocates to a state file beside the manifests.)
    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "examples", tmp_path / "examples")
    example = tmp_path / "examples" / "kubeproxy-config.yaml"
    result = lab.run(lab.kubeproxy_command("run", "--config", str(example), "--once"))
    assert result.returncode == 0, result.stderr
    listing = ns_exec(lab.node_ns, "nft", "list", "table", "ip", "kube-proxy")
    assert "10.96.0.10 . tcp . 80" in listing  # demo/web from examples/web.yaml
    assert "10.96.0.0/16" in listing  # serviceClusterIPRanges
