"""Defaults: upstream's scheme defaults and platform defaults, and what each mode reads.

* :func:`set_defaults` — upstream's ``SetDefaults_KubeProxyConfiguration`` (a zero value
  means unset), which the decoder applies; :func:`default_config` is what an empty file
  decodes to.
* :func:`complete` — upstream's ``platformApplyDefaults`` (mode, ``nodePortAddresses:
  [primary]`` in nftables mode, ``detectLocalMode: ClusterCIDR``), run after flags are
  applied.
* :func:`sync_section` / :func:`masquerade_section` — which v1alpha1 section a mode reads
  its sync periods and masqueradeAll from (upstream's v1alpha1 conversion);
  :func:`mode_settings` — those values resolved (:class:`ModeSettings`).

Pure: no I/O, no module-level mutable state.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass

from kubeproxy.config.duration import Duration
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.types import (
    DEFAULT_MODE,
    KUBE_PROXY_OOM_SCORE_ADJ,
    NODE_PORT_ADDRESSES_PRIMARY,
    PROXY_HEALTHZ_PORT,
    PROXY_STATUS_PORT,
    FormatOptions,
    KubeProxyConfiguration,
    LoggingConfiguration,
    OutputRoutingOptions,
)


def _append_port_if_needed(address: str, port: int) -> str:
    """``proxyutil.AppendPortIfNeeded``: a bare IP gets the default port."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _default_logging(logging: LoggingConfiguration) -> LoggingConfiguration:
    """``logsapi.SetRecommendedLoggingConfiguration``."""

    def routing(o: OutputRoutingOptions) -> OutputRoutingOptions:
        return o if o.info_buffer_size else dataclasses.replace(o, info_buffer_size="0")

    return dataclasses.replace(
        logging,
        format=logging.format or "text",
        flush_frequency=logging.flush_frequency or Duration.of_seconds(5),
        options=FormatOptions(
            text=routing(logging.options.text), json=routing(logging.options.json)
        ),
    )


def set_defaults(cfg: KubeProxyConfiguration) -> KubeProxyConfiguration:
    """Upstream's ``SetDefaults_KubeProxyConfiguration`` (a zero value means unset)."""
    bind = cfg.bind_address or "0.0.0.0"
    v4 = _is_ipv4(bind)
    healthz_host, metrics_host = ("0.0.0.0", "127.0.0.1") if v4 else ("[::]", "[::1]")
    ipt, nft, ct, cc = cfg.iptables, cfg.nftables, cfg.conntrack, cfg.client_connection
    thirty, one = Duration.of_seconds(30), Duration.of_seconds(1)
    return dataclasses.replace(
        cfg,
        bind_address=bind,
        healthz_bind_address=(
            _append_port_if_needed(cfg.healthz_bind_address, PROXY_HEALTHZ_PORT)
            if cfg.healthz_bind_address
            else f"{healthz_host}:{PROXY_HEALTHZ_PORT}"
        ),
        metrics_bind_address=(
            _append_port_if_needed(cfg.metrics_bind_address, PROXY_STATUS_PORT)
            if cfg.metrics_bind_address
            else f"{metrics_host}:{PROXY_STATUS_PORT}"
        ),
        oom_score_adj=KUBE_PROXY_OOM_SCORE_ADJ if cfg.oom_score_adj is None else cfg.oom_score_adj,
        iptables=dataclasses.replace(
            ipt,
            sync_period=ipt.sync_period or thirty,
            min_sync_period=ipt.min_sync_period or one,
            localhost_node_ports=(
                True if ipt.localhost_node_ports is None else ipt.localhost_node_ports
            ),
            masquerade_bit=14 if ipt.masquerade_bit is None else ipt.masquerade_bit,
        ),
        ipvs=dataclasses.replace(cfg.ipvs, sync_period=cfg.ipvs.sync_period or thirty),
        nftables=dataclasses.replace(
            nft,
            sync_period=nft.sync_period or thirty,
            min_sync_period=nft.min_sync_period or one,
            masquerade_bit=14 if nft.masquerade_bit is None else nft.masquerade_bit,
        ),
        conntrack=dataclasses.replace(
            ct,
            max_per_core=32 * 1024 if ct.max_per_core is None else ct.max_per_core,
            min=128 * 1024 if ct.min is None else ct.min,
            # 1 day (a fifth of the kernel's default).
            tcp_established_timeout=(
                Duration.of_seconds(24 * 3600)
                if ct.tcp_established_timeout is None
                else ct.tcp_established_timeout
            ),
            # Longer than typical server timeouts (kubernetes/kubernetes#32551): an expired
            # CLOSE_WAIT entry lets later FINs escape SNAT.
            tcp_close_wait_timeout=(
                Duration.of_seconds(3600)
                if ct.tcp_close_wait_timeout is None
                else ct.tcp_close_wait_timeout
            ),
        ),
        config_sync_period=cfg.config_sync_period or Duration.of_seconds(15 * 60),
        client_connection=dataclasses.replace(
            cc,
            content_type=cc.content_type or "application/vnd.kubernetes.protobuf",
            qps=cc.qps or 5.0,
            burst=cc.burst or 10,
        ),
        feature_gates=dict(cfg.feature_gates),
        logging=_default_logging(cfg.logging),
    )


def default_config() -> KubeProxyConfiguration:
    """What an empty v1alpha1 file decodes to (before :func:`complete`)."""
    return set_defaults(KubeProxyConfiguration())


def sync_section(mode: str) -> str:
    """The v1alpha1 section whose sync periods a mode uses (upstream's conversion: ipvs
    and nftables their own, anything else, blank included, iptables)."""
    if mode == ProxyMode.EBPF:
        return "nftables"
    return mode if mode in (ProxyMode.IPVS, ProxyMode.NFTABLES) else "iptables"


def masquerade_section(mode: str) -> str:
    """The section whose masqueradeAll a mode uses (ipvs shares iptables')."""
    return "nftables" if mode in (ProxyMode.NFTABLES, ProxyMode.EBPF) else "iptables"


def complete(
    cfg: KubeProxyConfiguration, *, blank_mode: str | None = None
) -> KubeProxyConfiguration:
    """Upstream's ``platformApplyDefaults`` (Linux), run after flags are applied.

    A blank mode becomes :data:`DEFAULT_MODE` (or ``blank_mode``: ``explain --live``
    uses the mode running on the node). Upstream reads the mode-independent values
    (syncPeriod, minSyncPeriod, masqueradeAll) of a blank-mode file from the iptables
    section, so they move with the mode to the section it resolves to.
    """
    if not cfg.mode:
        source = cfg.iptables
        cfg = dataclasses.replace(cfg, mode=blank_mode or DEFAULT_MODE)
        cfg = _with_mode_values(
            cfg, source.sync_period, source.min_sync_period, source.masquerade_all
        )
    if cfg.mode in (ProxyMode.NFTABLES, ProxyMode.EBPF) and not cfg.node_port_addresses:
        cfg = dataclasses.replace(cfg, node_port_addresses=(NODE_PORT_ADDRESSES_PRIMARY,))
    if not cfg.detect_local_mode:
        cfg = dataclasses.replace(cfg, detect_local_mode="ClusterCIDR")
    return cfg


def _with_mode_values(
    cfg: KubeProxyConfiguration, sync: Duration, min_sync: Duration, masquerade_all: bool
) -> KubeProxyConfiguration:
    section = sync_section(cfg.mode)
    cfg = dataclasses.replace(
        cfg,
        **{
            section: dataclasses.replace(
                getattr(cfg, section), sync_period=sync, min_sync_period=min_sync
            )
        },
    )
    masq = masquerade_section(cfg.mode)
    return dataclasses.replace(
        cfg, **{masq: dataclasses.replace(getattr(cfg, masq), masquerade_all=masquerade_all)}
    )


@dataclass(frozen=True)
class ModeSettings:
    """The values a proxier of ``mode`` uses, resolved from the mode's section."""

    mode: str
    sync_period: Duration
    min_sync_period: Duration
    masquerade_all: bool
    masquerade_bit: int


def mode_settings(cfg: KubeProxyConfiguration) -> ModeSettings:
    """Per-mode values as upstream's v1alpha1 conversion and proxiers read them."""
    mode = cfg.mode or DEFAULT_MODE
    section = getattr(cfg, sync_section(cfg.mode))
    masquerade_all = getattr(cfg, masquerade_section(cfg.mode)).masquerade_all
    # The nftables proxier reads nftables.masqueradeBit; the others iptables'.
    bit = (
        cfg.nftables.masquerade_bit
        if mode in (ProxyMode.NFTABLES, ProxyMode.EBPF)
        else cfg.iptables.masquerade_bit
    )
    return ModeSettings(
        mode=mode,
        sync_period=section.sync_period,
        min_sync_period=section.min_sync_period,
        masquerade_all=masquerade_all,
        masquerade_bit=14 if bit is None else bit,
    )


def _is_ipv4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4
    except ValueError:
        return False
