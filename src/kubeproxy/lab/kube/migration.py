"""Upstream kube-proxy on a lab node, and what a node's kernel holds for each proxy.

The migration docs/replacing-kube-proxy.md describes swaps upstream's kube-proxy and
kubeproxy on a node, both ways. :class:`Upstream` runs the real one (the binary
``scripts/build-upstream`` builds) in a node's network namespace with the identity
kubeadm gives it: the ServiceAccount ``kube-system/kube-proxy`` bound to the bootstrap
ClusterRole ``system:node-proxier`` (the API server creates that role; the binding is
kubeadm's ``kubeadm:node-proxier``, made here with the real kubectl).

What upstream kube-proxy needs to start inside a network namespace, found by running it
here (v1.37.2): nothing beyond its ordinary flags. ``--conntrack-max-per-core=0`` keeps
it away from ``nf_conntrack_max``, which is global and read-only outside the initial
namespace (upstream only raises it, so on a host whose limit is already high enough it
would not write it anyway); the conntrack TCP timeouts and ``route_localnet`` are
per-namespace and it sets them as on a node. It cannot lower its OOM score without
``CAP_SYS_RESOURCE`` and says so (``Failed to apply OOMScore``), as kubeproxy does. Its
health (``0.0.0.0:10256``) and metrics (``127.0.0.1:10249``) ports are kubeproxy's too,
which is right: the two never run on a node at once. Its ``iptables`` is the host's
(Debian's alternatives: iptables-nft), as a plain binary has no image wrapper choosing.

What a node holds, compared:

* :func:`node_rules`: every proxy mode's rules in a namespace, in a form ``==`` compares
  (:mod:`kubeproxy.lab.rulestate`: the ``kube-proxy`` nftables tables, both iptables
  flavours and families);
* :func:`kubeproxy_reference`: what kubeproxy in a mode writes for the API server's
  current objects on a node that had nothing (``run --once`` in an empty namespace,
  reading the same objects from a directory); kubeproxy has taken a node over when the
  node holds exactly that;
* :func:`differences_besides_leftovers`: upstream has taken a node over when it holds
  what upstream wrote on the clean node, plus at most objects nothing reaches (upstream
  deletes only what it knows by name; see docs/replacing-kube-proxy.md).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubeproxy.lab.cluster import lab_env, stop_process
from kubeproxy.lab.kube.cluster import CLUSTER_CIDRS, KubeLab
from kubeproxy.lab.kube.controlplane import kubeconfig
from kubeproxy.lab.rulestate import fresh_sync, iptables_state, nft_state

ACCOUNT = ("kube-system", "kube-proxy")
# kubeadm's binding of upstream's bootstrap role, with kubeadm's name.
BINDING = "kubeadm:node-proxier"
# Upstream's flags for a node of the lab, beside --proxy-mode.
UPSTREAM_FLAGS = ("--conntrack-max-per-core=0", "--v=2")
NFT_TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"))
# kubelet's chain (the localhost NodePort guard): both proxies' iptables modes write it,
# and neither deletes it, as upstream; so it is not a proxy's rule here.
KUBELET_CHAIN = "KUBE-FIREWALL"
BUILTIN_CHAINS = frozenset({"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"})


def node_rules(netns: str) -> dict[str, Any]:
    """Every proxy mode's rules in ``netns``, comparable with ``==`` (counters and
    handles left out). Keys: ``nft <kind> <family> <table> <name>`` (see
    :func:`~kubeproxy.lab.rulestate.nft_state`) and ``iptables-<flavour> <family>
    <table>[ <chain>]`` (its chains' declarations, or a chain's rules); of iptables, only
    the lines about proxy chains (``KUBE-``), kubelet's aside."""
    out: dict[str, Any] = {f"nft {k}": v for k, v in nft_state(netns, NFT_TABLES).items()}
    for flavor in ("nft", "legacy"):
        for key, lines in iptables_state(netns, flavor).items():
            if key.endswith(f" {KUBELET_CHAIN}"):
                continue
            kept = [line for line in lines if "KUBE-" in line and KUBELET_CHAIN not in line]
            if kept:
                out[f"iptables-{flavor} {key}"] = kept
    return out


def differences_besides_leftovers(
    state: dict[str, Any], reference: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """How ``state`` differs from ``reference``: (differences, leftovers).

    Leftovers are objects the reference lacks that no packet can reach: nftables chains
    that are not base chains, sets and maps, iptables chains that are not built in (the
    reference's own chains and base chains must be exactly as in it, so none of them
    jumps to a leftover). Everything else is a difference: an object of the reference
    missing or not as in it (rules compared in any order: upstream writes
    ``KUBE-SERVICES`` in its map's order, which changes from run to run), an extra base
    chain, an extra rule in a built-in chain."""
    differences, leftovers = [], []
    for key, want in reference.items():
        have = state.get(key)
        if have is None:
            differences.append(f"missing: {key}")
        elif isinstance(want, list) and _declarations(key):
            missing = set(want) - set(have)
            leftovers += [f"{key}: {line}" for line in sorted(set(have) - set(want))]
            if missing:
                differences.append(f"chains missing from {key}: {sorted(missing)}")
        elif _unordered(have) != _unordered(want):
            differences.append(f"differs: {key}")
    for key in sorted(state.keys() - reference.keys()):
        if _reachable(key, state):
            differences.append(f"extra: {key}")
        elif _declarations(key):  # a table the reference has nothing in: its chains
            leftovers += [f"{key}: {line}" for line in state[key]]
        else:
            leftovers.append(key)
    return differences, leftovers


def _declarations(key: str) -> bool:
    """An iptables table's list of chain declarations (``iptables-nft ipv4 nat``)."""
    return key.startswith("iptables-") and key.count(" ") == 2


def _unordered(value: Any) -> Any:
    return sorted(map(str, value)) if isinstance(value, list) else value


def _reachable(key: str, state: dict[str, Any]) -> bool:
    """Whether an object the reference lacks can meet a packet on its own: a base chain
    (or its rules), a built-in iptables chain's rules."""
    if key.startswith("nft "):
        _, kind, family, table, name = key.split(" ", 4)
        if kind not in ("chain", "rules"):
            return False
        return "hook" in state.get(f"nft chain {family} {table} {name}", {})
    return key.rsplit(" ", 1)[-1] in BUILTIN_CHAINS


@dataclass
class Upstream:
    """Upstream kube-proxy on a node of ``lab``: :meth:`start` in a mode, :meth:`stop`
    (SIGTERM: its rules stay, as when its Pod goes)."""

    lab: KubeLab
    node: str
    proc: subprocess.Popen[str] | None = None
    log: Path = field(init=False)
    _kubeconfig: Path | None = None

    def __post_init__(self) -> None:
        self.log = self.lab.workdir / f"kube-proxy-upstream-{self.node}.log"

    def kubeconfig(self) -> Path:
        """kubeadm's identity for kube-proxy: its ServiceAccount's token, the account
        bound to ``system:node-proxier``."""
        if self._kubeconfig is None:
            namespace, name = ACCOUNT
            if self.lab.kubectl("-n", namespace, "get", "sa", name, check=False).returncode:
                self.lab.kubectl("-n", namespace, "create", "serviceaccount", name)
                self.lab.kubectl(
                    "create", "clusterrolebinding", BINDING,
                    "--clusterrole", "system:node-proxier",
                    "--serviceaccount", f"{namespace}:{name}",
                )  # fmt: skip
            token = self.lab.kubectl(
                "-n", namespace, "create", "token", name, "--duration", "24h"
            ).stdout.strip()
            self._kubeconfig = kubeconfig(
                self.lab.workdir / "kube-proxy-upstream.kubeconfig",
                self.lab.cp.server,
                self.lab.cp.certificates().ca.cert,
                token=token,
            )
        return self._kubeconfig

    def command(self, mode: str) -> list[str]:
        return [
            "ip", "netns", "exec", self.lab.nodes[self.node].netns,
            self.lab.binaries.kube_proxy,
            "--kubeconfig", str(self.kubeconfig()),
            "--hostname-override", self.node,
            "--proxy-mode", mode,
            "--cluster-cidr", ",".join(CLUSTER_CIDRS),
            *UPSTREAM_FLAGS,
        ]  # fmt: skip

    def start(self, mode: str) -> None:
        assert self.proc is None, "already running"
        self.proc = self.lab.spawn(self.command(mode), self.log)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def kubeproxy_cleanup(lab: KubeLab, node: str) -> None:
    """``kubeproxy cleanup`` on ``node``: every proxy mode's rules go."""
    subprocess.run(
        ["ip", "netns", "exec", lab.nodes[node].netns,
         sys.executable, "-m", "kubeproxy", "cleanup"],
        check=True, capture_output=True, text=True, env=lab_env(),
    )  # fmt: skip


def kubeproxy_reference(lab: KubeLab, node: str, workdir: Path, *flags: str) -> dict[str, Any]:
    """:func:`node_rules` of kubeproxy run once with ``flags`` on a node that had no
    rules, reading the API server's current Services, EndpointSlices, ServiceCIDRs and
    the Node ``node`` (written to a directory, read as ``--manifests``)."""
    manifests = workdir / "reference"
    manifests.mkdir(parents=True, exist_ok=True)
    kinds = "services,endpointslices,servicecidrs"
    objects = lab.kubectl("get", kinds, "--all-namespaces", "-o", "yaml").stdout
    (manifests / "objects.yaml").write_text(objects)
    (manifests / "node.yaml").write_text(lab.kubectl("get", "node", node, "-o", "yaml").stdout)
    args = [
        "--manifests", str(manifests), "--hostname-override", node,
        "--cluster-cidr", ",".join(CLUSTER_CIDRS), *flags,
    ]  # fmt: skip
    return fresh_sync(f"{lab.prefix}-ref", "", args, state=node_rules)
