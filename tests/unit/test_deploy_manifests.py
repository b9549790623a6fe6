"""deploy/: every manifest is valid Kubernetes, and the pieces fit together.

Schemas come from kubernetes-validate (shipped offline, strict: unknown fields are
errors), checked against the oldest Kubernetes release these manifests target and the
newest the package knows. Beyond the schemas: the embedded KubeProxyConfiguration decodes
with kubeproxy's own ``--config`` loader, the kubeconfig with lightkube, the RBAC rules
are exactly upstream's node-proxier needs, and the DaemonSet's mounts, probes, command
and image agree with the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from lightkube import KubeConfig

import kubeproxy
from kubeproxy import configfile

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
VERSIONS = ("1.31.0", kubernetes_validate.utils.latest_version())
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


MANIFESTS = sorted(DEPLOY.rglob("*.yaml"))
ALL = [(path, doc) for path in MANIFESTS for doc in documents(path)]


def find(kind: str) -> dict[str, Any]:
    (doc,) = [doc for path, doc in ALL if doc["kind"] == kind and path.parent == DEPLOY]
    return doc


def test_deploy_holds_what_a_cluster_needs() -> None:
    kinds = sorted(doc["kind"] for path, doc in ALL if path.parent == DEPLOY)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "ServiceAccount",
    ]
    assert (DEPLOY / "Dockerfile").is_file()


# Kubernetes' own kinds; the Prometheus Operator's (deploy/monitoring) have no schema in
# kubernetes-validate and are checked by tests/unit/test_monitoring.py.
BUILTIN = [(p, d) for p, d in ALL if not d["apiVersion"].startswith("monitoring.coreos.com/")]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "doc", [doc for _, doc in BUILTIN], ids=[f"{p.name}:{d['kind']}" for p, d in BUILTIN]
)
def test_manifest_is_valid_kubernetes(doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_embedded_kube_proxy_configuration_decodes_and_validates() -> None:
    data = find("ConfigMap")["data"]
    cfg = configfile.loads(data["config.yaml"], source="deploy/configmap.yaml")
    assert cfg.mode == "nftables"
    assert configfile.validate(configfile.complete(cfg)) == []
    mount = volume_mount("config")["mountPath"]
    kubeconfig_path = Path(cfg.client_connection.kubeconfig)
    assert kubeconfig_path.parent == Path(mount)
    assert kubeconfig_path.name in data


def test_embedded_kubeconfig_uses_the_service_account() -> None:
    text = find("ConfigMap")["data"]["kubeconfig.conf"]
    single = KubeConfig.from_dict(yaml.safe_load(text)).get()
    assert single is not None and single.user is not None
    assert single.cluster.server.startswith("https://")
    assert single.cluster.certificate_auth == f"{SERVICE_ACCOUNT}/ca.crt"
    assert single.user.token_file == f"{SERVICE_ACCOUNT}/token"


def test_cluster_role_is_exactly_what_the_proxy_needs() -> None:
    rules = {
        (group, resource): sorted(rule["verbs"])
        for rule in find("ClusterRole")["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("", "services"): ["list", "watch"],
        ("", "nodes"): ["get", "list", "watch"],
        ("discovery.k8s.io", "endpointslices"): ["list", "watch"],
        ("networking.k8s.io", "servicecidrs"): ["list", "watch"],
        ("", "events"): ["create", "patch", "update"],
        ("events.k8s.io", "events"): ["create", "patch", "update"],
    }
    binding = find("ClusterRoleBinding")
    account = find("ServiceAccount")["metadata"]
    assert binding["roleRef"]["name"] == find("ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = find("DaemonSet")["spec"]["template"]["spec"]
    return spec


def container() -> dict[str, Any]:
    (main,) = pod_spec()["containers"]
    assert isinstance(main, dict)
    return main


def volume_mount(name: str) -> dict[str, Any]:
    (mount,) = [m for m in container()["volumeMounts"] if m["name"] == name]
    assert isinstance(mount, dict)
    return mount


def test_daemon_set_runs_kubeproxy_like_upstream_runs_kube_proxy() -> None:
    spec = pod_spec()
    main = container()
    assert spec["hostNetwork"] is True
    assert spec["serviceAccountName"] == find("ServiceAccount")["metadata"]["name"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in spec["tolerations"]
    assert main["command"] == [
        "kubeproxy",
        "run",
        "--config",
        "/var/lib/kubeproxy/config.yaml",
        "--hostname-override=$(NODE_NAME)",
    ]
    assert main["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert main["livenessProbe"]["httpGet"] == {"path": "/livez", "port": 10256}
    assert main["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 10256}
    assert main["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["NET_ADMIN", "NET_RAW", "SYS_RESOURCE"],
    }
    paths = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert paths["xtables-lock"] == "/run/xtables.lock"
    assert paths["lib-modules"] == "/lib/modules"
    config = find("ConfigMap")["metadata"]["name"]
    assert {"name": "config", "configMap": {"name": config}} in spec["volumes"]


def test_every_mount_has_a_volume_and_every_image_is_this_version() -> None:
    for path, doc in ALL:
        if doc["kind"] != "DaemonSet":
            continue
        spec = doc["spec"]["template"]["spec"]
        volumes = {v["name"] for v in spec.get("volumes", [])}
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert {m["name"] for m in c.get("volumeMounts", [])} <= volumes, path
            if c["image"].startswith("kubeproxy:"):
                assert c["image"] == f"kubeproxy:{kubeproxy.__version__}", path


def test_the_init_container_runs_init_only_with_the_proxys_config() -> None:
    (init,) = pod_spec()["initContainers"]
    (proxy,) = pod_spec()["containers"]
    assert init["securityContext"] == {"privileged": True}
    assert init["command"][:3] == ["kubeproxy", "run", "--init-only"]
    assert init["command"][3:] == proxy["command"][2:]
    assert init["volumeMounts"] == [m for m in proxy["volumeMounts"] if m["name"] == "config"]
    # The flag exists in the command line the image runs.
    from kubeproxy.cli import build_parser

    args = build_parser().parse_args([*init["command"][1:]])
    assert args.init_only
