"""Least privilege: in every mode kubeproxy programs the node as uid 0 with only the
capabilities that mode needs, all of which the DaemonSet grants (deploy/base/daemonset.yaml);
without CAP_NET_ADMIN it programs nothing."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kubeproxy.lab.cluster import NODE, Lab
from kubeproxy.lab.echo import tally, tcp_ask
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, service
from tests.kernel.conftest import ALL_MODES, ip

PROXY_MODES = ALL_MODES
ROOT = Path(__file__).resolve().parents[2]


def daemonset_capabilities() -> list[str]:
    """The capabilities the DaemonSet's proxy container adds (after dropping ALL)."""
    docs = yaml.safe_load_all((ROOT / "deploy/base/daemonset.yaml").read_text())
    (daemonset,) = [d for d in docs if d and d.get("kind") == "DaemonSet"]
    (proxy,) = [
        c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "kubeproxy"
    ]
    caps = proxy["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"]
    return [str(c).lower() for c in caps["add"]]


CAP_BITS = {"net_admin": 12, "net_raw": 13, "sys_resource": 24}
# What each mode needs (measured: iptables-legacy without CAP_NET_RAW cannot open its raw
# socket, "can't initialize iptables table: Permission denied"); CAP_SYS_RESOURCE only
# lowers the OOM score, without it that step warns.
NEEDED = {
    "nftables": ["net_admin", "sys_resource"],
    "iptables-nft": ["net_admin", "sys_resource"],
    "iptables-legacy": ["net_admin", "net_raw", "sys_resource"],
}


def capability_mask(status: str, field: str) -> int:
    m = re.search(rf"^{field}:\s+([0-9a-f]+)$", status, re.M)
    assert m is not None, status
    return int(m.group(1), 16)


def own_bounding_set() -> int:
    return capability_mask(Path("/proc/self/status").read_text(), "CapBnd")


def with_only(caps: list[str]) -> tuple[str, ...]:
    """Run as uid 0 with only ``caps``: uid 0 gains every capability of the bounding set
    at exec, as in a container that drops ALL and adds ``caps``."""
    keep = "".join(f",+{c}" for c in caps)
    return ("setpriv", f"--bounding-set=-all{keep}", "--inh-caps=-all")


def test_the_daemonsets_capabilities_are_enough(lab: Lab, manifests: ManifestDir) -> None:
    caps = NEEDED[lab.mode]
    assert set(caps) <= set(daemonset_capabilities())
    manifests.write(
        "svc.yaml",
        service("web", "10.96.9.1", [{"name": "http", "port": 80, "nodePort": 30990}],
                type="NodePort"),
        endpoint_slice("web", [Ep(ip("local-1"), node=NODE), Ep(ip("remote-1"), node="node-b")]),
    )  # fmt: skip
    done = lab.run(lab.kubeproxy_args(manifests.path, "--once", prefix=with_only(caps)))
    assert done.returncode == 0, done.stderr
    # It ran with those and nothing else (this sandbox's own bounding set may lack some:
    # CAP_SYS_RESOURCE is missing here, so the OOM score adjustment only warns).
    status = lab.run(["ip", "netns", "exec", lab.node_ns, *with_only(caps), "grep", "CapEff",
                      "/proc/self/status"]).stdout  # fmt: skip
    wanted = sum(1 << CAP_BITS[c] for c in caps)
    assert capability_mask(status, "CapEff") == wanted & own_bounding_set()
    counts = lab.in_pod("client").call(tally, tcp_ask, "10.96.9.1", 80, count=10)
    assert set(counts) == {"local-1", "remote-1"}, counts


def test_without_net_admin_nothing_is_programmed(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        service("web", "10.96.9.2"),
        endpoint_slice("web", [Ep(ip("local-1"), node=NODE)]),
    )
    done = lab.run(
        lab.kubeproxy_args(manifests.path, "--once", prefix=with_only(["net_raw", "sys_resource"]))
    )
    assert done.returncode != 0
    assert lab.in_pod("client").call(tally, tcp_ask, "10.96.9.2", 80, 0.5, count=2) != {
        "local-1": 2
    }
