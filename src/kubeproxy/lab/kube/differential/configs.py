"""The configurations the differential runs both proxies under: the flags a user sets.

A :class:`Configuration` is a set of upstream kube-proxy flags both implementations get
on top of the comparison's own (node name, kubeconfig, mode, ``--cluster-cidr``,
``--conntrack-max-per-core=0``), and whether ``--cluster-cidr`` is given at all. The
same states and probes then run under it: NodePorts asked on the node's addresses, its
Pods' gateway and 127.0.0.1 show ``--nodeport-addresses``; the source address each Pod
sees shows the masquerade and local-traffic settings; the sysctls each run set (a fact
of every run) show the conntrack settings and ``route_localnet``.

:data:`CONFIGURATIONS` names every one the bench runs (``python -m bench.differential
--configs NAME,...``); :data:`CI_CONFIGURATIONS` the few CI runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kubeproxy.lab.kube.cluster import CLUSTER_CIDRS, SUBNET4, SUBNET6


@dataclass(frozen=True)
class Configuration:
    name: str
    flags: tuple[str, ...] = ()
    # --cluster-cidr given (the default detect-local-mode, ClusterCIDR, needs it).
    cluster_cidr: bool = True
    # The modes where the configuration means something (a flag of one mode only).
    modes: tuple[str, ...] = ("nftables", "iptables", "ipvs")

    def applies_to(self, mode: str) -> bool:
        return mode in self.modes


DEFAULT = Configuration("defaults")

CONFIGURATIONS: tuple[Configuration, ...] = (
    DEFAULT,
    # NodePorts on the node network only: not on 127.0.0.1 nor the Pods' gateway
    # addresses, and never route_localnet=1 (CVE-2020-8558).
    Configuration("nodeport-addresses-node-network", ("--nodeport-addresses", f"{SUBNET4}.0/24")),
    Configuration("nodeport-addresses-primary", ("--nodeport-addresses", "primary")),
    # IPv6 only: every IPv4 local address (the family has no CIDR of its own).
    Configuration("nodeport-addresses-ipv6", ("--nodeport-addresses", f"{SUBNET6}/64")),
    Configuration("masquerade-all", ("--masquerade-all",)),
    Configuration("no-cluster-cidr", cluster_cidr=False),
    Configuration("detect-local-node-cidr", ("--detect-local-mode", "NodeCIDR")),
    # The lab's Pods hang off "vpN" links on their node.
    Configuration(
        "detect-local-interface-prefix",
        ("--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "vp"),
    ),
    Configuration(
        "localhost-nodeports-off",
        ("--iptables-localhost-nodeports=false",),
        modes=("iptables",),
    ),
    Configuration(
        "conntrack-timeouts",
        (
            "--conntrack-tcp-timeout-established=2h",
            "--conntrack-tcp-timeout-close-wait=30s",
            "--conntrack-udp-timeout=45s",
            "--conntrack-udp-timeout-stream=90s",
        ),
    ),
    # v1.37's keywords: loopback only (iptables mode serves 127.0.0.1, the others nothing),
    # everything, and the primary IPs with loopback (route_localnet=1 in iptables mode).
    Configuration("nodeport-addresses-localhost", ("--nodeport-addresses", "localhost")),
    Configuration("nodeport-addresses-all", ("--nodeport-addresses", "all")),
    Configuration(
        "nodeport-addresses-primary-and-localhost", ("--nodeport-addresses", "primary,localhost")
    ),
    Configuration(
        "nodeport-addresses-dual-stack",
        ("--nodeport-addresses", f"{SUBNET4}.0/24,{SUBNET6}/64"),
    ),
    Configuration(
        "nodeport-addresses-loopback-and-node-network",
        ("--nodeport-addresses", f"127.0.0.0/8,{SUBNET4}.0/24"),
    ),
    Configuration(
        "localhost-nodeports-off-with-loopback",
        (
            "--iptables-localhost-nodeports=false",
            "--nodeport-addresses",
            f"127.0.0.0/8,{SUBNET4}.0/24",
        ),
        modes=("iptables",),
    ),
    Configuration("masquerade-all-no-cluster-cidr", ("--masquerade-all",), cluster_cidr=False),
    Configuration(
        "masquerade-all-node-cidr", ("--masquerade-all", "--detect-local-mode", "NodeCIDR")
    ),
    # One family's Pod range only: the other family's Pods are not "local" traffic.
    Configuration(
        "cluster-cidr-ipv4-only", ("--cluster-cidr", CLUSTER_CIDRS[0]), cluster_cidr=False
    ),
    # kubenet's bridge name, which the lab's nodes do not have: no traffic is local.
    Configuration(
        "detect-local-bridge-interface",
        ("--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cbr0"),
    ),
    # A prefix no Pod link has.
    Configuration(
        "detect-local-interface-prefix-unmatched",
        ("--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "veth"),
    ),
    Configuration("conntrack-tcp-be-liberal", ("--conntrack-tcp-be-liberal",)),
    Configuration(
        "min-sync-period", ("--iptables-min-sync-period", "3s"), modes=("nftables", "iptables")
    ),
    Configuration("ipvs-min-sync-period", ("--ipvs-min-sync-period", "3s"), modes=("ipvs",)),
    Configuration(
        "masquerade-bit", ("--iptables-masquerade-bit", "10"), modes=("iptables", "ipvs")
    ),
    # Source hashing: each client address keeps one endpoint.
    Configuration("ipvs-scheduler-sh", ("--ipvs-scheduler", "sh"), modes=("ipvs",)),
    Configuration("ipvs-strict-arp", ("--ipvs-strict-arp",), modes=("ipvs",)),
    Configuration(
        "ipvs-timeouts",
        ("--ipvs-tcp-timeout", "15m", "--ipvs-tcpfin-timeout", "30s", "--ipvs-udp-timeout", "45s"),
        modes=("ipvs",),
    ),
)

# What CI runs besides the defaults: one run per mode, the settings most likely to
# change what a node does, together (nftables mode's default NodePort addresses are
# "primary" already; iptables mode's are every address, 127.0.0.1 included).
CI_CONFIGURATIONS: tuple[Configuration, ...] = (
    Configuration(
        "ci-node-network-masquerade-all-node-cidr",
        (
            "--nodeport-addresses", f"{SUBNET4}.0/24",
            "--masquerade-all",
            "--detect-local-mode", "NodeCIDR",
            "--conntrack-udp-timeout=45s",
        ),
    ),
)  # fmt: skip


def named(names: Sequence[str]) -> list[Configuration]:
    """The configurations of ``names`` (raises ValueError naming an unknown one)."""
    known = {c.name: c for c in (*CONFIGURATIONS, *CI_CONFIGURATIONS)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}; known: {sorted(known)}")
    return [known[n] for n in names]
