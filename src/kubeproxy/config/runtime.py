"""Effective proxy configuration, as the rest of the program receives it.

:class:`ProxyConfig` is immutable; ``kubeproxy.cli`` builds it from the
KubeProxyConfiguration file and flags (the rest of :mod:`kubeproxy.config`), and nothing
reads flags or the environment after start-up. Defaults match upstream kube-proxy.
:class:`IpvsSettings` is the ``ipvs:`` section as ipvs mode uses it; :class:`ConfigError`
the error every configuration problem is reported as; :func:`parse_cidrs`,
:func:`detect_families` and :func:`default_hostname` the values the file leaves to the node;
:func:`conntrack_settings` the ``conntrack:`` section as :mod:`kubeproxy.dataplane.sysctl`
takes it; :class:`WinkernelSettings` (:func:`winkernel_settings`) the ``winkernel:``
section as kernelspace mode uses it.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
from dataclasses import dataclass, field

from kubeproxy.config.duration import Duration
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.types import (
    KubeProxyConfiguration,
    KubeProxyConntrackConfiguration,
)
from kubeproxy.dataplane.sysctl import ConntrackSettings
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.plan import DetectLocal
from kubeproxy.model.planning import PlanSettings
from kubeproxy.model.topology import FeatureFlags
from kubeproxy.model.types import IPFamily, family_of


class ConfigError(ValueError):
    """Invalid configuration; the message names the flag or field."""


EBPF_FALLBACKS = ("none", "nftables")  # --ebpf-fallback (ours)


@dataclass(frozen=True)
class IpvsSettings:
    """The ``ipvs:`` section as ipvs mode uses it (durations in whole seconds, 0: leave
    the kernel's value)."""

    scheduler: str = "rr"
    exclude_cidrs: tuple[str, ...] = ()
    strict_arp: bool = False
    tcp_timeout: int = 0
    tcp_fin_timeout: int = 0
    udp_timeout: int = 0


@dataclass(frozen=True)
class WinkernelSettings:
    """The ``winkernel:`` section as kernelspace mode uses it (validated by
    kubeproxy.config.validation): the HNS network's name (the section's, else env
    ``KUBE_NETWORK``, as upstream), the source VIP, DSR, the root namespace's HNS
    endpoint (upstream's flag default ``cbr0``) and health-check forwarding."""

    network_name: str = ""
    source_vip: str = ""
    enable_dsr: bool = False
    root_hns_endpoint_name: str = "cbr0"
    forward_health_check_vip: bool = False
    # render only (ours, --hns-state): a file describing the node's HNS, rendered
    # against instead of the machine's (kubeproxy.dataplane.hns.fake.load_state).
    hns_state: str = ""


def winkernel_settings(
    cfg: KubeProxyConfiguration, hns_state: str | None = None, env: dict[str, str] | None = None
) -> WinkernelSettings:
    win = cfg.winkernel
    if hns_state and cfg.mode != ProxyMode.KERNELSPACE:
        raise ConfigError(f"--hns-state: only with --proxy-mode kernelspace (not {cfg.mode})")
    environ = os.environ if env is None else env
    return WinkernelSettings(
        network_name=win.network_name or environ.get("KUBE_NETWORK", ""),
        source_vip=win.source_vip,
        enable_dsr=win.enable_dsr,
        root_hns_endpoint_name=win.root_hns_endpoint_name or "cbr0",
        forward_health_check_vip=win.forward_health_check_vip,
        hns_state=hns_state or "",
    )


@dataclass(frozen=True)
class ProxyConfig:
    hostname: str
    mode: ProxyMode = ProxyMode.NFTABLES
    cluster_cidrs: tuple[str, ...] = ()
    # --detect-local-mode and its interface settings (ClusterCIDR uses cluster_cidrs).
    detect_local: DetectLocal = field(default_factory=DetectLocal)
    # Ranges ClusterIPs are allocated from (besides ServiceCIDR objects from the source).
    service_cidrs: tuple[str, ...] = ()
    nodeport_addresses: NodePortAddresses = field(default_factory=NodePortAddresses)
    masquerade_all: bool = False
    masquerade_bit: int = 14
    # iptables mode: NodePorts on 127.0.0.1 (iptables.localhostNodePorts), and which
    # iptables to drive ("auto": the one the node's other rules use, as upstream's image).
    localhost_nodeports: bool = True
    iptables_backend: str = "auto"
    bind_address: str | None = None
    families: tuple[IPFamily, ...] = (IPFamily.IPv4,)
    min_sync_period: float = 1.0
    sync_period: float = 30.0
    features: FeatureFlags = field(default_factory=FeatureFlags)
    ipvs: IpvsSettings = field(default_factory=IpvsSettings)
    # Empty disables the server (upstream: an empty bind address turns it off).
    healthz_bind_address: str = "0.0.0.0:10256"
    metrics_bind_address: str = "127.0.0.1:10249"
    # A server that cannot listen stops the proxy (else: logged, retried every 5 s).
    bind_address_hard_fail: bool = False
    # /debug/pprof and /debug/flags/v on the metrics server; heap tracing from start-up.
    enable_profiling: bool = False
    # ebpf mode (ours): the cgroup v2 directory the socket hooks attach to ("": the root
    # of the cgroup v2 hierarchy), where their maps and links are pinned (on a BPF
    # filesystem), and where the compiled BPF object is cached.
    ebpf_cgroup_path: str = ""
    ebpf_pin_path: str = "/sys/fs/bpf/kubeproxy"
    # What ebpf mode does when the node cannot run its hooks: "none" (refuse to start)
    # or "nftables" (run as nftables mode); ours, --ebpf-fallback.
    ebpf_fallback: str = "none"
    bpf_cache: str = "/var/cache/kubeproxy/bpf"
    winkernel: WinkernelSettings = field(default_factory=WinkernelSettings)

    def __post_init__(self) -> None:
        # A mode given as its text (an operator's value) becomes the enum, or fails here.
        object.__setattr__(self, "mode", ProxyMode(self.mode))

    @property
    def masquerade_mark(self) -> int:
        return 1 << self.masquerade_bit

    @functools.cached_property
    def planning(self) -> PlanSettings:
        """What the plan reads of this configuration (the mode's policy choices made
        here, once: localhost NodePorts are iptables mode's)."""
        return PlanSettings(
            families=self.families,
            nodeport_addresses=self.nodeport_addresses,
            detect_local=self.detect_local,
            cluster_cidrs=self.cluster_cidrs,
            service_cidrs=self.service_cidrs,
            masquerade_all=self.masquerade_all,
            masquerade_mark=self.masquerade_mark,
            features=self.features,
            localhost_nodeports=self.mode is ProxyMode.IPTABLES and self.localhost_nodeports,
            mode=self.mode,
        )

    def cluster_cidrs_of(self, family: IPFamily) -> tuple[str, ...]:
        return tuple(c for c in self.cluster_cidrs if family_of(c) is family)

    def bind_ip(self) -> dict[IPFamily, str]:
        """A specific --bind-address names the node's primary IP of its family (upstream)."""
        if self.bind_address is None:
            return {}
        ip = ipaddress.ip_address(self.bind_address)
        if ip.is_unspecified:
            return {}
        return {family_of(str(ip)): str(ip)}


def default_hostname() -> str:
    """Upstream uses the OS hostname, lower-cased, when --hostname-override is not set."""
    return socket.gethostname().strip().lower()


def detect_families(proc: str = "/proc") -> tuple[IPFamily, ...]:
    """IPv4 always; IPv6 when this kernel/namespace has IPv6 (as upstream's dual-stack check)."""
    if os.path.exists(os.path.join(proc, "net", "if_inet6")):
        return (IPFamily.IPv4, IPFamily.IPv6)
    return (IPFamily.IPv4,)


def parse_cidrs(value: str, flag: str, *, per_family: int = 1) -> tuple[str, ...]:
    cidrs = []
    for item in value.split(","):
        text = item.strip()
        if not text:
            continue
        try:
            cidrs.append(str(ipaddress.ip_network(text, strict=False)))
        except ValueError:
            raise ConfigError(f"{flag}: invalid CIDR {text!r}") from None
    for family in IPFamily:
        if sum(family_of(c) is family for c in cidrs) > per_family:
            raise ConfigError(f"{flag}: at most {per_family} {family.value} CIDR(s)")
    return tuple(cidrs)


def conntrack_settings(ct: KubeProxyConntrackConfiguration) -> ConntrackSettings:
    """The ``conntrack`` section as :mod:`kubeproxy.dataplane.sysctl` takes it."""
    return ConntrackSettings(
        max_per_core=ct.max_per_core,
        min=ct.min,
        tcp_established_timeout=_whole_seconds(ct.tcp_established_timeout),
        tcp_close_wait_timeout=_whole_seconds(ct.tcp_close_wait_timeout),
        tcp_be_liberal=ct.tcp_be_liberal,
        udp_timeout=_whole_seconds(ct.udp_timeout),
        udp_stream_timeout=_whole_seconds(ct.udp_stream_timeout),
    )


def _whole_seconds(value: Duration | None) -> int | None:
    """None for unset or not positive (leave the kernel's value); else int(d / time.Second)
    in Go: whole seconds, truncated."""
    if value is None or value.nanoseconds <= 0:
        return None
    return value.nanoseconds // 1_000_000_000
