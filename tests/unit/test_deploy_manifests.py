"""deploy/: every kustomization renders to valid Kubernetes, and the pieces fit together.

Layout: ``base/`` (ServiceAccount, RBAC, DaemonSet reading kubeadm's ``kube-proxy``
ConfigMap), ``overlays/kubeadm`` (the base and the image), ``overlays/gradual`` (kubeadm,
on labelled nodes only), ``overlays/kind`` (its own ConfigMap), ``monitoring/``;
``cleanup/`` holds one-shot manifests applied with ``-f``.

Two checks of the kustomize layer: :class:`Kustomization` reads the kustomization files
themselves (every file they name exists, every patch targets an object the base has,
the ConfigMap the DaemonSet mounts is the one the overlay provides) — pure Python, always
run; and the overlays are rendered by the kustomize built into ``kubectl`` (``kubectl
kustomize``), whose output is what a cluster receives. No maintained Python
implementation of kustomize exists. kubectl is found as every other tool
(tests/conftest.py ``require_tool``: missing fails a root run), in
``$KUBEPROXY_UPSTREAM_BIN`` first (where ``scripts/build-upstream`` puts a current one),
then on PATH. It must be 1.21 or newer: the overlays use inline patches (kustomize 3.2.0
and later), and kubectl up to 1.20 embeds kustomize v2.0.3 (Debian bookworm's
kubernetes-client is 1.20); kubectl 1.21 embeds kustomize v4.0.5, which renders every
kustomization here exactly as v5.5.0 (kubectl 1.32) does (compared on 2026-11-28).

Schemas come from kubernetes-validate (shipped offline, strict: unknown fields are
errors), checked against the oldest Kubernetes release these manifests target and the
newest the package knows. Beyond the schemas: the configurations decode with kubeproxy's
own ``--config`` loader (including a ConfigMap exactly as kubeadm writes it), the
kubeconfigs with lightkube, the RBAC rules are exactly what the proxy uses (proven on a
real API server by tests/realk8s/test_rbac.py), and the DaemonSet's mounts, probes,
resources, command and image agree with the rest.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from lightkube import KubeConfig

import kubeproxy
from kubeproxy.config.codec import loads
from kubeproxy.config.defaults import complete
from kubeproxy.config.types import KubeProxyConfiguration
from kubeproxy.config.validation import validate
from tests.conftest import UPSTREAM_BIN, relies_on_exception, unavailable, upstream_tool

# kustomize is kubectl's, built by scripts/build-upstream: these run after the rest.
pytestmark = pytest.mark.upstream_binaries

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBEADM_CONFIGMAP = Path(__file__).parent / "data" / "kubeadm-kube-proxy-configmap.yaml"
VERSIONS = ("1.31.0", kubernetes_validate.utils.latest_version())
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
OVERLAYS = ("kubeadm", "gradual", "kind")
KUSTOMIZATIONS = ("base", *(f"overlays/{o}" for o in (*OVERLAYS, "ebpf")), "monitoring")
# Applied with -f when needed: cleanups, and the check before removing kube-proxy.
ONE_SHOT_DIRS = ("cleanup", "preflight")
# Measured peak RSS at 10,000 Services x 10 endpoints from the API (bench/RESULTS.md,
# "End to end"): the proxy's VmHWM and the proxy with its `nft` child during a full sync.
PROXY_PEAK_MB = 252
TREE_PEAK_MB = 532


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def mebibytes(quantity: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor / 2**20
    return float(quantity) / 2**20


def megabytes(mib: float) -> float:
    return mib * 2**20 / 10**6


# ----------------------------------------------------------- the kustomization files


class Kustomization:
    """One kustomization.yaml and what it refers to, read without kustomize."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.doc: dict[str, Any] = yaml.safe_load((directory / "kustomization.yaml").read_text())

    def resources(self) -> list[Path]:
        return [(self.dir / r).resolve() for r in self.doc.get("resources", [])]

    def objects(self) -> list[dict[str, Any]]:
        """The objects of its resources, bases included (before patches)."""
        out: list[dict[str, Any]] = []
        for path in self.resources():
            if path.is_dir():
                out.extend(Kustomization(path).objects())
            else:
                out.extend(documents(path))
        return out

    def generated_configmaps(self) -> dict[str, list[Path]]:
        return {
            g["name"]: [self.dir / f for f in g.get("files", [])]
            for g in self.doc.get("configMapGenerator", [])
        }


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_file_a_kustomization_names_exists(name: str) -> None:
    k = Kustomization(DEPLOY / name)
    assert k.doc["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert k.doc["kind"] == "Kustomization"
    for path in k.resources():
        assert path.is_file() or (path / "kustomization.yaml").is_file(), path
    for files in k.generated_configmaps().values():
        for path in files:
            assert path.is_file(), path


def test_every_manifest_belongs_to_a_kustomization_or_is_a_one_shot() -> None:
    """Nothing is duplicated or left behind by the move to kustomize."""
    listed = {
        p
        for name in KUSTOMIZATIONS
        for p in Kustomization(DEPLOY / name).resources()
        if p.is_file()
    }
    manifests = {p.resolve() for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml"}
    one_shots = {p.resolve() for d in ONE_SHOT_DIRS for p in (DEPLOY / d).glob("*.yaml")}
    assert manifests - one_shots == listed
    assert not list(DEPLOY.glob("*.yaml")), "top-level manifests: use base/ and overlays/"


# The overlays that patch what they take in (kubeadm only sets the image).
PATCHING = ("gradual", "kind", "ebpf")


def test_the_overlays_are_the_kubeadm_one_and_the_patching_ones() -> None:
    assert sorted(p.name for p in (DEPLOY / "overlays").iterdir()) == sorted(("kubeadm", *PATCHING))


@pytest.mark.parametrize("overlay", PATCHING)
def test_every_patch_targets_an_object_of_the_base(overlay: str) -> None:
    k = Kustomization(DEPLOY / "overlays" / overlay)
    objects = {(o["kind"], o["metadata"]["name"]) for o in k.objects()}
    patches = k.doc["patches"]
    assert patches
    for patch in patches:
        target = patch["target"]
        assert (target["kind"], target["name"]) in objects, patch
        body = yaml.safe_load(patch["patch"])
        assert (body["kind"], body["metadata"]["name"]) == (target["kind"], target["name"])


def test_the_kubeadm_overlay_is_the_base_with_the_image() -> None:
    k = Kustomization(DEPLOY / "overlays" / "kubeadm")
    assert set(k.doc) == {"apiVersion", "kind", "resources", "images"}
    assert k.resources() == [(DEPLOY / "base").resolve()]
    assert k.doc["images"] == [
        {"name": "kubeproxy", "newName": "kubeproxy", "newTag": kubeproxy.__version__}
    ]


def test_base_reads_kubeadms_configmap_and_kind_overlay_generates_its_own() -> None:
    (daemonset,) = [o for o in Kustomization(DEPLOY / "base").objects() if o["kind"] == "DaemonSet"]
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"] == {"name": "kube-proxy"}
    assert "ConfigMap" not in {o["kind"] for o in Kustomization(DEPLOY / "base").objects()}
    kind = Kustomization(DEPLOY / "overlays" / "kind")
    generated = kind.generated_configmaps()
    assert [p.name for p in generated["kubeproxy"]] == ["config.conf", "kubeconfig.conf"]
    (patch,) = kind.doc["patches"]
    (volume,) = yaml.safe_load(patch["patch"])["spec"]["template"]["spec"]["volumes"]
    assert volume == {"name": "config", "configMap": {"name": "kubeproxy"}}


# ----------------------------------------------------------------- rendered output

# The first kubectl whose kustomize reads inline patches (see the module docstring).
KUBECTL_MIN = (1, 21)
KUBECTL_HOW = (
    "scripts/build-upstream builds a current one and prints its directory last: "
    f"set ${UPSTREAM_BIN} to it"
)


@cache
def client_version(path: str) -> tuple[int, int]:
    """kubectl's own version (major, minor)."""
    out = subprocess.run(
        [path, "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    client = json.loads(out)["clientVersion"]
    major, minor = (re.match(r"\d+", client[k]) for k in ("major", "minor"))
    assert major is not None and minor is not None, client
    return int(major.group()), int(minor.group())


def kubectl() -> str:
    """The kubectl that renders the overlays; missing or too old fails a root run."""
    path = upstream_tool("kubectl", "kustomize renders deploy/", KUBECTL_HOW)
    version = client_version(path)
    if version < KUBECTL_MIN:
        unavailable(
            f"{path} is kubectl {version[0]}.{version[1]}: its kustomize cannot read "
            f"inline patches (needs kubectl {KUBECTL_MIN[0]}.{KUBECTL_MIN[1]} or newer)",
            KUBECTL_HOW,
        )
    return path


@cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / name)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d is not None)


def one(name: str, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in rendered(name) if d["kind"] == kind]
    return doc


def pod_spec(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = one(name, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def proxy_container(name: str) -> dict[str, Any]:
    (main,) = pod_spec(name)["containers"]
    assert isinstance(main, dict)
    return main


def config_mount(name: str) -> str:
    (mount,) = [m for m in proxy_container(name)["volumeMounts"] if m["name"] == "config"]
    return str(mount["mountPath"])


def config_map_name(name: str) -> str:
    (volume,) = [v for v in pod_spec(name)["volumes"] if v["name"] == "config"]
    return str(volume["configMap"]["name"])


def builtin(doc: dict[str, Any]) -> bool:
    # The Prometheus Operator's kinds have no schema in kubernetes-validate; they are
    # checked by tests/unit/test_monitoring.py.
    return not doc["apiVersion"].startswith("monitoring.coreos.com/")


ONE_SHOTS = [
    (p.name, d)
    for directory in ONE_SHOT_DIRS
    for p in sorted((DEPLOY / directory).glob("*.yaml"))
    for d in documents(p)
]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("doc", [d for _, d in ONE_SHOTS], ids=[n for n, _ in ONE_SHOTS])
@relies_on_exception("kubernetes_validate.validate raises ValidationError on an invalid object")
def test_one_shot_manifest_is_valid_kubernetes(doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", [k for k in KUSTOMIZATIONS if k != "base"])
def test_kustomization_renders_valid_kubernetes(name: str, version: str) -> None:
    docs = rendered(name)
    assert docs
    for doc in filter(builtin, docs):
        kubernetes_validate.validate(doc, version, strict=True)
    for doc in docs:
        if doc["kind"] != "ClusterRole" and doc["kind"] != "ClusterRoleBinding":
            assert doc["metadata"]["namespace"] == "kube-system", doc["metadata"]


def test_overlays_hold_what_a_cluster_needs() -> None:
    base = ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "ServiceAccount"]
    assert sorted(d["kind"] for d in rendered("overlays/kubeadm")) == base
    assert sorted(d["kind"] for d in rendered("overlays/gradual")) == base
    assert sorted(d["kind"] for d in rendered("overlays/kind")) == sorted([*base, "ConfigMap"])
    assert (DEPLOY / "Dockerfile").is_file()


def test_kubeadm_overlay_reads_kubeadms_configmap_unchanged() -> None:
    """A kube-proxy ConfigMap exactly as kubeadm writes it works: the DaemonSet mounts
    it where kubeadm's kube-proxy DaemonSet does, reads key config.conf, and the
    kubeconfig that config names is the ConfigMap's other key."""
    kubeadm_cm = yaml.safe_load(KUBEADM_CONFIGMAP.read_text())
    for overlay in ("overlays/kubeadm", "overlays/gradual"):
        assert config_map_name(overlay) == kubeadm_cm["metadata"]["name"] == "kube-proxy"
        assert config_mount(overlay) == "/var/lib/kube-proxy"
        assert proxy_container(overlay)["command"][2:4] == [
            "--config",
            "/var/lib/kube-proxy/config.conf",
        ]
    check_configmap(kubeadm_cm, "overlays/kubeadm")


def test_kind_overlays_own_configmap_has_kubeadms_keys() -> None:
    cm = one("overlays/kind", "ConfigMap")
    assert config_map_name("overlays/kind") == cm["metadata"]["name"]
    assert cm["metadata"]["name"].startswith("kubeproxy-")  # the content hash
    cfg = check_configmap(cm, "overlays/kind")
    assert cfg.mode == "nftables"
    assert cfg.cluster_cidr == "10.244.0.0/16"


def check_configmap(cm: dict[str, Any], overlay: str) -> KubeProxyConfiguration:
    """config.conf decodes strictly and validates; its kubeconfig is the other key, in
    the mount, and authenticates with the Pod's service account."""
    data = cm["data"]
    assert set(data) == {"config.conf", "kubeconfig.conf"}
    cfg = loads(data["config.conf"], source=f"{overlay}:config.conf")
    assert validate(complete(cfg)) == []
    kubeconfig = Path(cfg.client_connection.kubeconfig)
    assert kubeconfig == Path(config_mount(overlay)) / "kubeconfig.conf"
    single = KubeConfig.from_dict(yaml.safe_load(data["kubeconfig.conf"])).get()
    assert single is not None and single.user is not None
    assert single.cluster.server.startswith("https://")
    assert single.cluster.certificate_auth == f"{SERVICE_ACCOUNT}/ca.crt"
    assert single.user.token_file == f"{SERVICE_ACCOUNT}/token"
    return complete(cfg)


def test_cluster_role_is_exactly_what_the_proxy_needs() -> None:
    name = "overlays/kubeadm"
    rules = {
        (group, resource): sorted(rule["verbs"])
        for rule in one(name, "ClusterRole")["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("", "services"): ["list", "watch"],
        ("", "nodes"): ["list", "watch"],
        ("discovery.k8s.io", "endpointslices"): ["list", "watch"],
        ("networking.k8s.io", "servicecidrs"): ["list", "watch"],
        ("events.k8s.io", "events"): ["create"],
    }
    binding = one(name, "ClusterRoleBinding")
    account = one(name, "ServiceAccount")["metadata"]
    assert binding["roleRef"]["name"] == one(name, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]


@pytest.mark.parametrize("overlay", [f"overlays/{o}" for o in OVERLAYS])
def test_daemon_set_runs_kubeproxy_like_upstream_runs_kube_proxy(overlay: str) -> None:
    spec = pod_spec(overlay)
    main = proxy_container(overlay)
    assert spec["hostNetwork"] is True
    assert spec["serviceAccountName"] == one(overlay, "ServiceAccount")["metadata"]["name"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in spec["tolerations"]
    assert main["command"] == [
        "kubeproxy",
        "run",
        "--config",
        "/var/lib/kube-proxy/config.conf",
        "--hostname-override=$(NODE_NAME)",
    ]
    assert main["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert main["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["NET_ADMIN", "NET_RAW", "SYS_RESOURCE"],
    }
    paths = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert paths["xtables-lock"] == "/run/xtables.lock"
    assert paths["lib-modules"] == "/lib/modules"
    volumes = {v["name"] for v in spec["volumes"]}
    for c in spec["initContainers"] + spec["containers"]:
        assert {m["name"] for m in c.get("volumeMounts", [])} <= volumes
        assert c["image"] == f"kubeproxy:{kubeproxy.__version__}"


def test_ebpf_overlay_gives_the_socket_hooks_what_they_need() -> None:
    """overlays/ebpf: kind's overlay in ebpf mode, with the host's BPF filesystem and
    cgroup v2 hierarchy, the host's PIDs and the capabilities docs/ebpf.md names."""
    name = "overlays/ebpf"
    spec, main = pod_spec(name), proxy_container(name)
    cm = one(name, "ConfigMap")
    assert check_configmap(cm, name).mode == "ebpf"
    assert config_map_name(name) == cm["metadata"]["name"]
    assert spec["hostPID"] is True
    assert main["command"][-2:] == [
        "--ebpf-cgroup-path=/host/sys/fs/cgroup",
        "--ebpf-pin-path=/sys/fs/bpf/kubeproxy",
    ]
    assert set(main["securityContext"]["capabilities"]["add"]) == {
        "NET_ADMIN",
        "NET_RAW",
        "SYS_RESOURCE",
        "BPF",
        "SYS_ADMIN",
        "SYS_PTRACE",
    }
    paths = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    assert (paths["bpffs"], mounts["bpffs"]) == ("/sys/fs/bpf", "/sys/fs/bpf")
    assert (paths["host-cgroup"], mounts["host-cgroup"]) == (
        "/sys/fs/cgroup",
        "/host/sys/fs/cgroup",
    )
    # Everything else is the kind overlay's.
    assert {m["name"] for m in main["volumeMounts"]} >= {"config", "xtables-lock", "tmp"}


def test_gradual_overlay_starts_on_labelled_nodes_only() -> None:
    assert pod_spec("overlays/gradual")["nodeSelector"] == {
        "kubernetes.io/os": "linux",
        "kubeproxy.example/proxy": "kubeproxy",
    }
    assert pod_spec("overlays/kubeadm")["nodeSelector"] == {"kubernetes.io/os": "linux"}


def test_probes_do_not_stall_a_rollout_on_a_draining_node() -> None:
    """/healthz fails while the Node is being deleted (for load balancers): no probe may
    use it, or the new Pod on a draining node never turns Ready and the rolling update
    (maxUnavailable 1) waits for it. Both probes read /livez on the healthz port."""
    main = proxy_container("overlays/kubeadm")
    (port,) = main["ports"]
    assert port == {"name": "healthz", "containerPort": 10256, "protocol": "TCP"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert main[probe]["httpGet"] == {"path": "/livez", "port": 10256}
    ds = one("overlays/kubeadm", "DaemonSet")["spec"]
    assert ds["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    # The port is the one the configurations bind (kubeadm's "" defaults to it).
    cfg = complete(loads(yaml.safe_load(KUBEADM_CONFIGMAP.read_text())["data"]["config.conf"]))
    assert cfg.healthz_bind_address.endswith(":10256")


def test_resources_follow_the_measured_memory() -> None:
    """Requests cover the proxy's own measured peak at 10,000 Services, the limit the
    whole tree's (proxy and its `nft` child: one cgroup) with headroom; no CPU limit."""
    resources = proxy_container("overlays/kubeadm")["resources"]
    request = megabytes(mebibytes(resources["requests"]["memory"]))
    limit = megabytes(mebibytes(resources["limits"]["memory"]))
    assert PROXY_PEAK_MB < request < TREE_PEAK_MB
    assert 1.3 * TREE_PEAK_MB < limit < 2 * TREE_PEAK_MB
    assert "cpu" not in resources["limits"]
    assert resources["requests"]["cpu"] == "100m"


def test_the_init_container_runs_init_only_with_the_proxys_config() -> None:
    (init,) = pod_spec("overlays/kubeadm")["initContainers"]
    proxy = proxy_container("overlays/kubeadm")
    assert init["securityContext"] == {"privileged": True}
    assert init["command"][:3] == ["kubeproxy", "run", "--init-only"]
    assert init["command"][3:] == proxy["command"][2:]
    assert init["volumeMounts"] == [m for m in proxy["volumeMounts"] if m["name"] == "config"]
    # The flag exists in the command line the image runs.
    from kubeproxy.cli import build_parser

    args = build_parser().parse_args([*init["command"][1:]])
    assert args.init_only


def test_monitoring_dashboard_is_a_sidecar_configmap() -> None:
    cm = one("monitoring", "ConfigMap")
    assert cm["metadata"]["labels"] == {"grafana_dashboard": "1"}
    json_text = (DEPLOY / "monitoring" / "grafana-dashboard-proxy.json").read_text()
    assert cm["data"] == {"grafana-dashboard-proxy.json": json_text}


def test_preflight_pod_sees_what_the_daemon_set_will_and_can_change_nothing() -> None:
    (pod,) = documents(DEPLOY / "preflight" / "kubeproxy-preflight.yaml")
    spec = pod["spec"]
    (main,) = spec["containers"]
    ds = pod_spec("overlays/kubeadm")
    proxy = proxy_container("overlays/kubeadm")
    assert spec["serviceAccountName"] == ds["serviceAccountName"]
    assert spec["hostNetwork"] is True
    assert spec["volumes"] == [v for v in ds["volumes"] if v["name"] == "config"]
    assert main["volumeMounts"] == [m for m in proxy["volumeMounts"] if m["name"] == "config"]
    assert main["image"] == proxy["image"]
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert main["resources"] == proxy["resources"]


@pytest.mark.parametrize(
    "command",
    [
        "render --config /var/lib/kube-proxy/config.conf --hostname-override node-1",
        "list -o wide --config /var/lib/kube-proxy/config.conf --hostname-override node-1",
        "explain --config /var/lib/kube-proxy/config.conf --hostname-override node-1"
        " --src 10.244.1.5 --dst 10.96.0.10 --port 53 --protocol UDP",
    ],
)
def test_the_preflight_commands_of_the_migration_guide_parse(command: str) -> None:
    from kubeproxy.cli import build_parser

    assert command in (ROOT / "docs" / "replacing-kube-proxy.md").read_text()
    args = build_parser().parse_args(command.split())
    assert args.config == Path("/var/lib/kube-proxy/config.conf")
