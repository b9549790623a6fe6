"""``kubeproxy list``, ``explain`` and ``render`` against the live API server, and the
check of docs/replacing-kube-proxy.md's step 2 done as the guide says.

What the commands print is checked against the real objects: the ClusterIP and NodePort
the API server allocated, the endpoints the EndpointSlice controller published; and the
node's own kubeproxy must have programmed exactly what ``list`` computes (``--live``).

The preflight (deploy/preflight/kubeproxy-preflight.yaml) is applied as the guide says,
with kubeadm's ``kube-proxy`` ConfigMap in the cluster; no kubelet runs here, so its
container is played by :func:`~tests.realk8s.opslab.in_pod`: the node's network
namespace (hostNetwork), the ConfigMap's keys and a token bound to the Pod where the
kubelet mounts them, the root filesystem read-only and no capability, as the manifest
asks. The commands the guide gives an operator run there unchanged.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from kubeproxy.lab.kube.cluster import CLUSTER_CIDRS, DEPLOY, ROOT, KubeLab, wait_for
from kubeproxy.lab.netns import ns_exec
from tests.realk8s.conftest import answers
from tests.realk8s.opslab import SERVICE_ACCOUNT_DIR, in_pod, kubeproxy, service_account_token

KUBEADM_CONFIGMAP = ROOT / "tests" / "unit" / "data" / "kubeadm-kube-proxy-configmap.yaml"
PREFLIGHT = ROOT / "deploy" / "preflight" / "kubeproxy-preflight.yaml"


def web_service(kube: KubeLab, namespace: str, *nodes: str) -> tuple[dict[str, Any], set[str]]:
    """Pods app=web on ``nodes`` and a NodePort Service ``web`` (80 -> 8080) made with
    kubectl; the Service as the API server completed it, and the ``address:port`` of
    every ready endpoint once the EndpointSlice controller has published them all."""
    for i, node in enumerate(nodes):
        kube.add_pod(f"{namespace}-web-{i}", node, namespace=namespace, labels={"app": "web"})
    out = kube.kubectl(
        "-n", namespace, "create", "service", "nodeport", "web", "--tcp=80:8080", "-o", "json"
    )
    service: dict[str, Any] = json.loads(out.stdout)

    def published() -> set[str]:
        slices = kube.api().list_of(
            "EndpointSlice", namespace, labelSelector="kubernetes.io/service-name=web"
        )
        return {
            f"{address}:{port['port']}"
            for s in slices
            for e in s["endpoints"] or ()
            if e["conditions"].get("ready")
            for address in e["addresses"]
            for port in s["ports"]
        }

    def all_published() -> set[str] | None:
        found = published()
        return found if len(found) == len(nodes) else None

    endpoints: set[str] = wait_for(all_published, what="the controller's EndpointSlice")
    return service, endpoints


def test_list_explain_and_render_read_the_live_cluster(kube: KubeLab, namespace: str) -> None:
    service, endpoints = web_service(kube, namespace, "node-a", "node-b")
    cluster_ip = service["spec"]["clusterIP"]
    node_port = service["spec"]["ports"][0]["nodePort"]
    node = kube.nodes["node-a"]
    # The flags of the node's own kubeproxy (tests/realk8s/conftest.py), its credentials.
    flags = (
        "--kubeconfig", str(kube.node_kubeconfig("node-a")), "--hostname-override", "node-a",
        "--cluster-cidr", ",".join(CLUSTER_CIDRS), "--proxy-mode", "nftables",
        "--request-timeout", "60s",
    )  # fmt: skip

    listed = kubeproxy(node.netns, "list", "-o", "json", "-n", namespace, *flags)
    assert listed.returncode == 0, listed.stderr
    frontends = {
        (f["frontend"], f["type"]): {e["address"] for e in f["endpointList"]}
        for f in json.loads(listed.stdout)
    }
    assert frontends == {
        (f"{cluster_ip}:80", "ClusterIP"): endpoints,
        (f"*:{node_port}", "NodePort"): endpoints,
    }

    pod_ip = kube.pods[f"{namespace}-web-0"].ips[0]
    explained = kubeproxy(
        node.netns, "explain", "-o", "json", *flags,
        "--src", pod_ip, "--dst", cluster_ip, "--port", "80",
    )  # fmt: skip
    assert explained.returncode == 0, explained.stderr
    verdict = json.loads(explained.stdout)
    assert verdict["verdict"] == "DNAT"
    assert set(verdict["endpoints"]) == endpoints

    rendered = kubeproxy(node.netns, "render", *flags)
    assert rendered.returncode == 0, rendered.stderr
    for address in (cluster_ip, *(e.rsplit(":", 1)[0] for e in endpoints)):
        assert address in rendered.stdout
    ns_exec(node.netns, "nft", "-c", "-f", "-", input=rendered.stdout)

    # The node's kubeproxy programmed what list computes from the same objects.
    answers(kube, node.netns, cluster_ip, 80)
    live = kubeproxy(node.netns, "list", "--live", "-n", namespace, *flags)
    assert live.returncode == 0, live.stdout + live.stderr


def kubeadm_configmap(kube: KubeLab) -> dict[str, Any]:
    """kubeadm's kube-proxy ConfigMap (tests/unit/data), for this cluster: its API
    server's address and Pod CIDRs, everything else as `kubeadm init` writes it."""
    configmap: dict[str, Any] = yaml.safe_load(KUBEADM_CONFIGMAP.read_text())
    data = configmap["data"]
    data["config.conf"] = data["config.conf"].replace(
        "clusterCIDR: 10.244.0.0/16", f"clusterCIDR: {','.join(CLUSTER_CIDRS)}"
    )
    data["kubeconfig.conf"] = data["kubeconfig.conf"].replace(
        "https://192.0.2.10:6443", kube.cp.server
    )
    return configmap


def test_the_migration_guides_preflight(kube: KubeLab, namespace: str) -> None:
    service, endpoints = web_service(kube, namespace, "node-a", "node-c")
    cluster_ip = service["spec"]["clusterIP"]
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(kubeadm_configmap(kube)))
    try:
        # "kubectl apply -f deploy/base/serviceaccount.yaml -f deploy/base/rbac.yaml"
        kube.kubectl(
            "apply", "-f", str(DEPLOY / "serviceaccount.yaml"), "-f", str(DEPLOY / "rbac.yaml")
        )
        # "set nodeName ..., then: kubectl apply -f deploy/preflight/kubeproxy-preflight.yaml"
        manifest = yaml.safe_load(PREFLIGHT.read_text())
        manifest["spec"]["nodeName"] = "node-b"
        kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
        pod = kube.api().get("Pod", "kubeproxy-preflight", "kube-system")
        assert pod["spec"]["serviceAccountName"] == "kubeproxy"
        outputs = preflight_commands(kube, pod, namespace, cluster_ip)
    finally:
        kube.kubectl(
            "-n", "kube-system", "delete", "pod", "kubeproxy-preflight",
            "--grace-period=0", "--force", check=False,
        )  # fmt: skip
        kube.kubectl("-n", "kube-system", "delete", "configmap", "kube-proxy", check=False)

    version, listed, rendered, explained = outputs
    assert version.returncode == 0 and version.stdout.startswith("kubeproxy"), version
    # kubeadm's blank mode is iptables mode, as upstream's: iptables-restore input.
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout.startswith("# iptables-restore"), rendered.stdout
    assert cluster_ip in rendered.stdout
    assert all(f"--to-destination {e}" in rendered.stdout for e in endpoints)
    assert listed.returncode == 0, listed.stderr
    frontends = {
        (f["frontend"], f["type"]): {e["address"] for e in f["endpointList"]}
        for f in json.loads(listed.stdout)
    }
    node_port = service["spec"]["ports"][0]["nodePort"]
    assert frontends[(f"{cluster_ip}:80", "ClusterIP")] == endpoints
    assert frontends[(f"*:{node_port}", "NodePort")] == endpoints
    assert explained.returncode == 0, explained.stderr
    assert "Verdict:     DNAT" in explained.stdout
    assert all(e in explained.stdout for e in endpoints), explained.stdout


def preflight_commands(
    kube: KubeLab, pod: dict[str, Any], namespace: str, cluster_ip: str
) -> list[Any]:
    """``kp --version``, ``kp list``, ``kp render`` and ``kp explain`` as the guide runs
    them in the preflight Pod (``kp`` = kubectl exec ... kubeproxy), with what the kubelet
    would mount into it."""
    configmap = kube.api().get("ConfigMap", "kube-proxy", "kube-system")["data"]
    token = service_account_token(
        kube, "kubeproxy", "kube-system", "--bound-object-kind", "Pod",
        "--bound-object-name", pod["metadata"]["name"],
        "--bound-object-uid", pod["metadata"]["uid"],
    )  # fmt: skip
    mounts = {
        f"/var/lib/kube-proxy/{key}": configmap[key] for key in ("config.conf", "kubeconfig.conf")
    }
    mounts[f"{SERVICE_ACCOUNT_DIR}/token"] = token
    mounts[f"{SERVICE_ACCOUNT_DIR}/ca.crt"] = Path(kube.cp.certificates().ca.cert).read_text()
    mounts[f"{SERVICE_ACCOUNT_DIR}/namespace"] = "kube-system"
    netns = kube.nodes[pod["spec"]["nodeName"]].netns
    client = kube.pods[f"{namespace}-web-0"].ips[0]

    def kp(*args: str) -> Any:
        return in_pod(netns, mounts, [sys.executable, "-m", "kubeproxy", *args])

    config = ("--config", "/var/lib/kube-proxy/config.conf", "--hostname-override", "node-b")
    return [
        kp("--version"),
        kp("list", "-o", "json", "-n", namespace, *config),
        kp("render", *config),
        kp("explain", *config, "--src", client, "--dst", cluster_ip, "--port", "80"),
    ]
