"""Upstream's ``kubeproxy.config.k8s.io/v1alpha1`` types (``k8s.io/kube-proxy/config/v1alpha1``).

The dataclass tree (:class:`KubeProxyConfiguration` and its sections) mirrors upstream's
v1alpha1 types field for field. Each field carries its JSON name in its metadata (and,
for ints, Go's width: ``int32``/``uint32``); a dataclass built with no arguments holds
Go's zero values, which is what the decoder (:mod:`.codec`) starts from, as upstream's
does. The constants beside them are upstream's: ports, modes, the OOM score.

Pure data: no I/O, no behaviour beyond :attr:`KubeProxyConfiguration.cluster_cidrs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.config.duration import Duration

API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"
KIND = "KubeProxyConfiguration"

PROXY_HEALTHZ_PORT = 10256
PROXY_STATUS_PORT = 10249
# qos.KubeProxyOOMScoreAdj upstream.
KUBE_PROXY_OOM_SCORE_ADJ = -999
# A blank mode is iptables on Linux, as upstream (kubeadm's ConfigMap says ``mode: ""``):
# a drop-in must program what the node had. The start recommends nftables (cli).
DEFAULT_MODE = "iptables"
LINUX_PROXY_MODES = ("iptables", "ipvs", "nftables")
# Ours (not upstream's): socket load-balancing with the nftables mode beside it, whose
# configuration section (nftables.*) it uses.
OUR_PROXY_MODES = ("ebpf",)
# Upstream's Windows mode; accepted everywhere (render, explain), run only on Windows.
WINDOWS_PROXY_MODES = ("kernelspace",)
LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix", "")
LOG_FORMATS = ("json", "text")
NODE_PORT_ADDRESSES_PRIMARY = "primary"
# v1.37's keywords, each a set of CIDRs: the node's primary IPs, loopback, everything.
NODE_PORT_ADDRESS_KEYWORDS = (NODE_PORT_ADDRESSES_PRIMARY, "localhost", "all")

# Go's int32 and uint32 ranges (a field's ``kind`` in its metadata).
INT32 = (-(2**31), 2**31 - 1)
UINT32 = (0, 2**32 - 1)


def _j(name: str, *, kind: str = "", omitempty: bool = False) -> dict[str, Any]:
    """Field metadata: the JSON name; ``kind`` narrows ints (int32/uint32)."""
    return {"json": name, "kind": kind, "omitempty": omitempty}


@dataclass(frozen=True)
class ClientConnectionConfiguration:
    """component-base ``ClientConnectionConfiguration``."""

    kubeconfig: str = field(default="", metadata=_j("kubeconfig"))
    accept_content_types: str = field(default="", metadata=_j("acceptContentTypes"))
    content_type: str = field(default="", metadata=_j("contentType"))
    qps: float = field(default=0.0, metadata=_j("qps"))
    burst: int = field(default=0, metadata=_j("burst", kind="int32"))


@dataclass(frozen=True)
class VModuleItem:
    file_pattern: str = field(default="", metadata=_j("filePattern"))
    verbosity: int = field(default=0, metadata=_j("verbosity", kind="uint32"))


@dataclass(frozen=True)
class OutputRoutingOptions:
    """Options of the text and json log formats (inlined in TextOptions/JSONOptions)."""

    split_stream: bool = field(default=False, metadata=_j("splitStream", omitempty=True))
    # A resource.Quantity ("0", "64Ki"); kept as written.
    info_buffer_size: str = field(default="", metadata=_j("infoBufferSize", kind="quantity"))


@dataclass(frozen=True)
class FormatOptions:
    text: OutputRoutingOptions = field(default_factory=OutputRoutingOptions, metadata=_j("text"))
    json: OutputRoutingOptions = field(default_factory=OutputRoutingOptions, metadata=_j("json"))


@dataclass(frozen=True)
class LoggingConfiguration:
    """component-base ``logs/api/v1.LoggingConfiguration``.

    ``flushFrequency`` may be written as a duration string or as integer nanoseconds, as
    upstream accepts; it is always written back as a string.
    """

    format: str = field(default="", metadata=_j("format", omitempty=True))
    flush_frequency: Duration = field(
        default_factory=Duration, metadata=_j("flushFrequency", kind="time_or_duration")
    )
    verbosity: int = field(default=0, metadata=_j("verbosity", kind="uint32"))
    vmodule: tuple[VModuleItem, ...] | None = field(
        default=None, metadata=_j("vmodule", omitempty=True)
    )
    options: FormatOptions = field(default_factory=FormatOptions, metadata=_j("options"))


@dataclass(frozen=True)
class KubeProxyIPTablesConfiguration:
    masquerade_bit: int | None = field(default=None, metadata=_j("masqueradeBit", kind="int32"))
    masquerade_all: bool = field(default=False, metadata=_j("masqueradeAll"))
    localhost_node_ports: bool | None = field(default=None, metadata=_j("localhostNodePorts"))
    snat_node_internal_ip: bool | None = field(default=None, metadata=_j("snatNodeInternalIP"))
    sync_period: Duration = field(default_factory=Duration, metadata=_j("syncPeriod"))
    min_sync_period: Duration = field(default_factory=Duration, metadata=_j("minSyncPeriod"))


@dataclass(frozen=True)
class KubeProxyIPVSConfiguration:
    sync_period: Duration = field(default_factory=Duration, metadata=_j("syncPeriod"))
    min_sync_period: Duration = field(default_factory=Duration, metadata=_j("minSyncPeriod"))
    scheduler: str = field(default="", metadata=_j("scheduler"))
    exclude_cidrs: tuple[str, ...] | None = field(default=None, metadata=_j("excludeCIDRs"))
    strict_arp: bool = field(default=False, metadata=_j("strictARP"))
    tcp_timeout: Duration = field(default_factory=Duration, metadata=_j("tcpTimeout"))
    tcp_fin_timeout: Duration = field(default_factory=Duration, metadata=_j("tcpFinTimeout"))
    udp_timeout: Duration = field(default_factory=Duration, metadata=_j("udpTimeout"))


@dataclass(frozen=True)
class KubeProxyNFTablesConfiguration:
    masquerade_bit: int | None = field(default=None, metadata=_j("masqueradeBit", kind="int32"))
    masquerade_all: bool = field(default=False, metadata=_j("masqueradeAll"))
    sync_period: Duration = field(default_factory=Duration, metadata=_j("syncPeriod"))
    min_sync_period: Duration = field(default_factory=Duration, metadata=_j("minSyncPeriod"))


@dataclass(frozen=True)
class KubeProxyConntrackConfiguration:
    max_per_core: int | None = field(default=None, metadata=_j("maxPerCore", kind="int32"))
    min: int | None = field(default=None, metadata=_j("min", kind="int32"))
    tcp_established_timeout: Duration | None = field(
        default=None, metadata=_j("tcpEstablishedTimeout")
    )
    tcp_close_wait_timeout: Duration | None = field(
        default=None, metadata=_j("tcpCloseWaitTimeout")
    )
    tcp_be_liberal: bool = field(default=False, metadata=_j("tcpBeLiberal"))
    udp_timeout: Duration = field(default_factory=Duration, metadata=_j("udpTimeout"))
    udp_stream_timeout: Duration = field(default_factory=Duration, metadata=_j("udpStreamTimeout"))


@dataclass(frozen=True)
class KubeProxyWinkernelConfiguration:
    """kernelspace mode (Windows, HNS): which HNS network holds the Pods (``networkName``,
    else env ``KUBE_NETWORK``), the source VIP of load balancers on an Overlay network
    (``sourceVip``), Direct Server Return (``enableDSR``, feature gate WinDSR), the root
    namespace's HNS endpoint (``rootHnsEndpointName``) and whether health checks of
    load-balancer IPs go to it (``forwardHealthCheckVip``). Other modes ignore them."""

    network_name: str = field(default="", metadata=_j("networkName"))
    source_vip: str = field(default="", metadata=_j("sourceVip"))
    enable_dsr: bool = field(default=False, metadata=_j("enableDSR"))
    root_hns_endpoint_name: str = field(default="", metadata=_j("rootHnsEndpointName"))
    forward_health_check_vip: bool = field(default=False, metadata=_j("forwardHealthCheckVip"))


@dataclass(frozen=True)
class DetectLocalConfiguration:
    bridge_interface: str = field(default="", metadata=_j("bridgeInterface"))
    interface_name_prefix: str = field(default="", metadata=_j("interfaceNamePrefix"))


@dataclass(frozen=True)
class KubeProxyConfiguration:
    """``kubeproxy.config.k8s.io/v1alpha1`` KubeProxyConfiguration (Go zero values)."""

    feature_gates: Mapping[str, bool] = field(
        default_factory=dict, metadata=_j("featureGates", omitempty=True)
    )
    client_connection: ClientConnectionConfiguration = field(
        default_factory=ClientConnectionConfiguration, metadata=_j("clientConnection")
    )
    logging: LoggingConfiguration = field(
        default_factory=LoggingConfiguration, metadata=_j("logging")
    )
    hostname_override: str = field(default="", metadata=_j("hostnameOverride"))
    bind_address: str = field(default="", metadata=_j("bindAddress"))
    healthz_bind_address: str = field(default="", metadata=_j("healthzBindAddress"))
    metrics_bind_address: str = field(default="", metadata=_j("metricsBindAddress"))
    bind_address_hard_fail: bool = field(default=False, metadata=_j("bindAddressHardFail"))
    enable_profiling: bool = field(default=False, metadata=_j("enableProfiling"))
    show_hidden_metrics_for_version: str = field(
        default="", metadata=_j("showHiddenMetricsForVersion")
    )
    mode: str = field(default="", metadata=_j("mode"))
    iptables: KubeProxyIPTablesConfiguration = field(
        default_factory=KubeProxyIPTablesConfiguration, metadata=_j("iptables")
    )
    ipvs: KubeProxyIPVSConfiguration = field(
        default_factory=KubeProxyIPVSConfiguration, metadata=_j("ipvs")
    )
    nftables: KubeProxyNFTablesConfiguration = field(
        default_factory=KubeProxyNFTablesConfiguration, metadata=_j("nftables")
    )
    winkernel: KubeProxyWinkernelConfiguration = field(
        default_factory=KubeProxyWinkernelConfiguration, metadata=_j("winkernel")
    )
    detect_local_mode: str = field(default="", metadata=_j("detectLocalMode"))
    detect_local: DetectLocalConfiguration = field(
        default_factory=DetectLocalConfiguration, metadata=_j("detectLocal")
    )
    cluster_cidr: str = field(default="", metadata=_j("clusterCIDR"))
    node_port_addresses: tuple[str, ...] | None = field(
        default=None, metadata=_j("nodePortAddresses")
    )
    oom_score_adj: int | None = field(default=None, metadata=_j("oomScoreAdj", kind="int32"))
    conntrack: KubeProxyConntrackConfiguration = field(
        default_factory=KubeProxyConntrackConfiguration, metadata=_j("conntrack")
    )
    config_sync_period: Duration = field(default_factory=Duration, metadata=_j("configSyncPeriod"))
    port_range: str = field(default="", metadata=_j("portRange"))
    windows_run_as_service: bool = field(
        default=False, metadata=_j("windowsRunAsService", omitempty=True)
    )

    @property
    def cluster_cidrs(self) -> tuple[str, ...]:
        """``clusterCIDR`` split at commas (upstream's internal ``DetectLocal.ClusterCIDRs``)."""
        return tuple(c.strip() for c in self.cluster_cidr.split(",") if c.strip())
