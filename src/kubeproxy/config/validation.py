"""Validation of a complete configuration (upstream's ``pkg/proxy/apis/config/validation``).

:func:`validate` returns every error at once in upstream's order and wording, each
prefixed with its v1alpha1 field path (``nftables.minSyncPeriod: Invalid value: -1s: must
be greater than or equal to 0``); :func:`validation_errors` the same as
:class:`FieldError` values (apimachinery's ``field.Error``). :func:`is_ip` and
:func:`host_port_errors` are shared with the flag parsers (:mod:`.flags`).

Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubeproxy.config.defaults import sync_section
from kubeproxy.config.duration import Duration, go_quote
from kubeproxy.config.features import effective_feature_gates
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.types import (
    DEFAULT_MODE,
    INT32,
    LINUX_PROXY_MODES,
    LOCAL_MODES,
    LOG_FORMATS,
    NODE_PORT_ADDRESS_KEYWORDS,
    OUR_PROXY_MODES,
    WINDOWS_PROXY_MODES,
    KubeProxyConfiguration,
    KubeProxyConntrackConfiguration,
    KubeProxyIPTablesConfiguration,
    KubeProxyIPVSConfiguration,
    KubeProxyNFTablesConfiguration,
    LoggingConfiguration,
)
from kubeproxy.dataplane.ipvs import SCHEDULERS as IPVS_SCHEDULERS


@dataclass(frozen=True)
class FieldError:
    """apimachinery's ``field.Error``; ``str()`` prints it as Go does."""

    path: str
    kind: str  # "Invalid value", "Unsupported value", "Required value", "Forbidden"
    value: Any
    detail: str

    def __str__(self) -> str:
        body = self.kind
        if self.kind not in ("Required value", "Forbidden"):
            body += f": {_go_value(self.value)}"
        return f"{self.path}: {body}: {self.detail}" if self.detail else f"{self.path}: {body}"


def _go_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return go_quote(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[]string{" + ", ".join(go_quote(str(v)) for v in value) + "}"
    return str(value)


def _invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, "Invalid value", value, detail)


def validate(cfg: KubeProxyConfiguration) -> list[str]:
    """Every validation error, in upstream's order and wording (``pkg/proxy/apis/config/
    validation``), with v1alpha1 field paths."""
    return [str(e) for e in validation_errors(cfg)]


def validation_errors(cfg: KubeProxyConfiguration) -> list[FieldError]:
    errs: list[FieldError] = []
    section = sync_section(cfg.mode)
    errs += _masquerade_bit(cfg.iptables.masquerade_bit, "iptables.masqueradeBit")
    if cfg.mode == ProxyMode.IPVS:
        errs += _ipvs(cfg.ipvs)
    elif cfg.mode in (ProxyMode.NFTABLES, ProxyMode.EBPF):
        errs += _masquerade_bit(cfg.nftables.masquerade_bit, "nftables.masqueradeBit")
    elif cfg.mode == ProxyMode.KERNELSPACE:
        errs += _winkernel(cfg)
    errs += _conntrack(cfg.conntrack)
    if cfg.oom_score_adj is not None and not -1000 <= cfg.oom_score_adj <= 1000:
        errs.append(
            _invalid("oomScoreAdj", cfg.oom_score_adj, "must be within the range [-1000, 1000]")
        )
    if cfg.mode and cfg.mode not in (*LINUX_PROXY_MODES, *OUR_PROXY_MODES, *WINDOWS_PROXY_MODES):
        errs.append(
            _invalid(
                "mode",
                cfg.mode,
                f"must be {', '.join(LINUX_PROXY_MODES)} or blank (blank means the "
                f"best-available proxy [currently {DEFAULT_MODE}])",
            )
        )
    if cfg.client_connection.burst < 0:
        errs.append(
            _invalid(
                "clientConnection.burst",
                cfg.client_connection.burst,
                "must be greater than or equal to 0",
            )
        )
    if cfg.config_sync_period.nanoseconds <= 0:
        errs.append(_invalid("configSyncPeriod", cfg.config_sync_period, "must be greater than 0"))
    errs += _sync_periods(getattr(cfg, section), section)
    if not is_ip(cfg.bind_address):
        errs.append(
            _invalid(
                "bindAddress",
                cfg.bind_address,
                "not a valid textual representation of an IP address",
            )
        )
    if cfg.healthz_bind_address:
        errs += host_port_errors(cfg.healthz_bind_address, "healthzBindAddress")
    errs += host_port_errors(cfg.metrics_bind_address, "metricsBindAddress")
    if not _valid_port_range(cfg.port_range):
        errs.append(
            _invalid("portRange", cfg.port_range, "must be a valid port range (e.g. 300-2000)")
        )
    errs += _node_port_addresses(cfg.node_port_addresses or ())
    if cfg.show_hidden_metrics_for_version and not re.fullmatch(
        r"\d+\.\d+", cfg.show_hidden_metrics_for_version
    ):
        errs.append(
            _invalid(
                "showHiddenMetricsForVersion",
                cfg.show_hidden_metrics_for_version,
                "must be omitted or have the form '<major>.<minor>' of the previous minor version",
            )
        )
    errs += _detect_local(cfg)
    errs += _logging(cfg.logging, effective_feature_gates(cfg))
    return errs


def _masquerade_bit(bit: int | None, path: str) -> list[FieldError]:
    if bit is not None and not 0 <= bit <= 31:
        return [_invalid(path, bit, "must be within the range [0, 31]")]
    return []


def _non_negative(path: str, value: Duration | int | None) -> list[FieldError]:
    if value is None:
        return []
    number = value.nanoseconds if isinstance(value, Duration) else value
    if number < 0:
        return [_invalid(path, value, "must be greater than or equal to 0")]
    return []


def _winkernel(cfg: KubeProxyConfiguration) -> list[FieldError]:
    """kernelspace mode's section: DSR needs the WinDSR gate, as upstream; a source VIP
    must be an address (upstream's proxier fails at start on one that is not)."""
    errs = []
    win = cfg.winkernel
    if win.enable_dsr and not effective_feature_gates(cfg).get("WinDSR", False):
        errs.append(_invalid("winkernel.enableDSR", True, "WinDSR feature gate must be enabled"))
    if win.source_vip and not is_ip(win.source_vip):
        errs.append(
            _invalid(
                "winkernel.sourceVip",
                win.source_vip,
                "not a valid textual representation of an IP address",
            )
        )
    return errs


def _ipvs(ipvs: KubeProxyIPVSConfiguration) -> list[FieldError]:
    errs = []
    errs += _non_negative("ipvs.tcpTimeout", ipvs.tcp_timeout)
    errs += _non_negative("ipvs.tcpFinTimeout", ipvs.tcp_fin_timeout)
    errs += _non_negative("ipvs.udpTimeout", ipvs.udp_timeout)
    for i, cidr in enumerate(ipvs.exclude_cidrs or ()):
        if not _is_cidr(cidr):
            errs.append(_invalid(f"ipvs.excludeCIDRs[{i}]", cidr, "must be a valid CIDR"))
    # Upstream checks the scheduler by creating a virtual server with it at start; the
    # kernel has these (mh since Linux 4.18).
    if ipvs.scheduler and ipvs.scheduler not in IPVS_SCHEDULERS:
        errs.append(
            _invalid(
                "ipvs.scheduler",
                ipvs.scheduler,
                f"must be one of {', '.join(IPVS_SCHEDULERS)}, blank means rr",
            )
        )
    return errs


def _conntrack(ct: KubeProxyConntrackConfiguration) -> list[FieldError]:
    return [
        *_non_negative("conntrack.maxPerCore", ct.max_per_core),
        *_non_negative("conntrack.min", ct.min),
        *_non_negative("conntrack.tcpEstablishedTimeout", ct.tcp_established_timeout),
        *_non_negative("conntrack.tcpCloseWaitTimeout", ct.tcp_close_wait_timeout),
        *_non_negative("conntrack.udpTimeout", ct.udp_timeout),
        *_non_negative("conntrack.udpStreamTimeout", ct.udp_stream_timeout),
    ]


def _sync_periods(
    section: KubeProxyIPTablesConfiguration
    | KubeProxyIPVSConfiguration
    | KubeProxyNFTablesConfiguration,
    name: str,
) -> list[FieldError]:
    errs = []
    if section.sync_period.nanoseconds <= 0:
        errs.append(_invalid(f"{name}.syncPeriod", section.sync_period, "must be greater than 0"))
    errs += _non_negative(f"{name}.minSyncPeriod", section.min_sync_period)
    if section.min_sync_period > section.sync_period:
        errs.append(
            _invalid(
                f"{name}.syncPeriod",
                section.min_sync_period,
                f"must be greater than or equal to {name}.minSyncPeriod",
            )
        )
    return errs


def host_port_errors(text: str, path: str) -> list[FieldError]:
    match = re.fullmatch(r"\[([^\]]*)\]:([^:]*)|([^:\[\]]*):([^:]*)", text)
    if match is None:
        return [_invalid(path, text, "must be IP:port")]
    host = match.group(1) if match.group(1) is not None else match.group(3)
    port = match.group(2) if match.group(2) is not None else match.group(4)
    errs = []
    if not is_ip(host):
        errs.append(_invalid(path, host, "must be a valid IP"))
    if not (re.fullmatch(r"[+-]?\d+", port) and 1 <= int(port) <= 65535):
        errs.append(_invalid(path, port, "must be a valid port"))
    return errs


def _node_port_addresses(values: Sequence[str]) -> list[FieldError]:
    # v1.37: keywords and CIDRs mix freely; a keyword may appear once.
    errs = []
    seen: set[str] = set()
    for i, value in enumerate(values):
        if value in NODE_PORT_ADDRESS_KEYWORDS:
            if value in seen:
                errs.append(FieldError(f"nodePortAddresses[{i}]", "Duplicate value", value, ""))
            seen.add(value)
        elif not _is_cidr(value):
            errs.append(
                _invalid(
                    f"nodePortAddresses[{i}]",
                    value,
                    "must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'",
                )
            )
    return errs


_DUAL_STACK_PAIR = (
    "must be a either a single CIDR or dual-stack pair of CIDRs "
    "(e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]"
)


def _detect_local(cfg: KubeProxyConfiguration) -> list[FieldError]:
    mode = cfg.detect_local_mode
    if mode not in LOCAL_MODES:
        quoted = ", ".join(go_quote(m) for m in LOCAL_MODES)
        return [
            FieldError("detectLocalMode", "Unsupported value", mode, f"supported values: {quoted}")
        ]
    if mode == "BridgeInterface" and not cfg.detect_local.bridge_interface:
        return [_invalid("detectLocal.bridgeInterface", "", "must not be empty")]
    if mode == "InterfaceNamePrefix" and not cfg.detect_local.interface_name_prefix:
        return [_invalid("detectLocal.interfaceNamePrefix", "", "must not be empty")]
    cidrs = cfg.cluster_cidr.split(",") if cfg.cluster_cidr else []
    # A blank mode is ClusterCIDR once complete() ran, as upstream validates after it.
    if mode not in ("ClusterCIDR", "") or not cidrs:
        return []
    if len(cidrs) > 2:
        return [_invalid("clusterCIDR", cfg.cluster_cidr, _DUAL_STACK_PAIR)]
    errs = [
        _invalid(
            "clusterCIDR",
            cfg.cluster_cidr,
            "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
        )
        for c in cidrs
        if not _is_cidr(c)
    ]
    if not errs and len(cidrs) == 2 and _cidr_version(cidrs[0]) == _cidr_version(cidrs[1]):
        errs.append(_invalid("clusterCIDR", cfg.cluster_cidr, _DUAL_STACK_PAIR))
    return errs[:1]


def _logging(logging: LoggingConfiguration, gates: Mapping[str, bool]) -> list[FieldError]:
    """``logsapi.Validate`` for the formats kube-proxy registers (text, json)."""
    errs = []
    if logging.format not in LOG_FORMATS:
        errs.append(_invalid("logging.format", logging.format, "Unsupported log format"))
    if logging.verbosity > INT32[1]:
        errs.append(_invalid("logging.verbosity", logging.verbosity, f"Must be <= {INT32[1]}"))
    items = logging.vmodule or ()
    if items and logging.format not in ("", "text"):
        errs.append(
            FieldError("logging.vmodule", "Forbidden", None, "Only supported for text log format")
        )
    for i, item in enumerate(items):
        path = f"logging.vmodule[{i}]"
        if not item.file_pattern:
            errs.append(FieldError(path, "Required value", None, "File pattern must not be empty"))
        if re.search(r"[=,]", item.file_pattern):
            errs.append(
                _invalid(
                    path, item.file_pattern, "File pattern must not contain equal sign or comma"
                )
            )
        if item.verbosity > INT32[1]:
            errs.append(_invalid(path, item.verbosity, f"Must be <= {INT32[1]}"))
    alpha = gates.get("LoggingAlphaOptions", False) or gates.get("AllAlpha", False)
    for name, options in (("text", logging.options.text), ("json", logging.options.json)):
        path = f"logging.options.{name}"
        if not _is_quantity(options.info_buffer_size):
            errs.append(
                _invalid(f"{path}.infoBufferSize", options.info_buffer_size, "not a quantity")
            )
        elif not alpha:
            if options.split_stream:
                errs.append(
                    FieldError(
                        f"{path}.splitStream",
                        "Forbidden",
                        None,
                        "Feature LoggingAlphaOptions is disabled",
                    )
                )
            if _quantity_nonzero(options.info_buffer_size):
                errs.append(
                    FieldError(
                        f"{path}.infoBufferSize",
                        "Forbidden",
                        None,
                        "Feature LoggingAlphaOptions is disabled",
                    )
                )
    return errs


_QUANTITY = re.compile(
    r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?"
)


def _is_quantity(text: str) -> bool:
    return text == "" or _QUANTITY.fullmatch(text) is not None


def _quantity_nonzero(text: str) -> bool:
    match = _QUANTITY.fullmatch(text)
    return match is not None and float(match.group(1)) != 0


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_cidr(text: str) -> bool:
    if "/" not in text or "%" in text:
        return False
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


def _cidr_version(text: str) -> int:
    return ipaddress.ip_network(text, strict=False).version


def _valid_port_range(text: str) -> bool:
    """``utilnet.ParsePortRange``: empty, ``N``, ``A-B`` or ``A+N`` within 0..65535."""
    value = text.strip()
    if not value:
        return True
    match = re.fullmatch(r"(\d+)(?:([-+])(\d+))?", value)
    if match is None:
        return False
    low = int(match.group(1))
    if match.group(2) is None:
        high = low
    elif match.group(2) == "-":
        high = int(match.group(3))
    else:
        high = low + int(match.group(3))
    return 0 <= low <= high <= 65535
