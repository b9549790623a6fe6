"""The ``--config`` file: upstream's ``kubeproxy.config.k8s.io/v1alpha1`` KubeProxyConfiguration.

Map of the module, in the order a start-up uses it:

* :class:`Duration` — Go ``time.Duration``: parsed and printed exactly as Go does
  (``"1m30s"``, ``"24h0m0s"``, ``"500ms"``), kept as integer nanoseconds so a round trip
  is exact.
* The dataclass tree (:class:`KubeProxyConfiguration` and its sections) mirrors upstream's
  v1alpha1 types field for field. Each field carries its JSON name in its metadata; a
  dataclass built with no arguments holds Go's zero values, which is what the decoder
  starts from, as upstream's does.
* :func:`load_config` / :func:`loads` — YAML or JSON, strict like upstream's strict codec:
  unknown and duplicate fields, wrong types and a wrong apiVersion/kind are errors naming
  the field path; every problem is reported at once. Then upstream's scheme defaults
  (:func:`set_defaults`) are applied, as upstream's decoder does. :func:`decode` is the
  same but returns the errors with the configuration built from everything else, so
  ``kubeproxy.cli`` validates that too and reports decode and validation errors together
  (upstream stops at the first kind).
* :func:`default_config` — what an empty file decodes to; :func:`complete` — upstream's
  ``platformApplyDefaults`` (mode, ``nodePortAddresses: [primary]`` in nftables mode,
  ``detectLocalMode: ClusterCIDR``), run after flags are applied.
* :func:`apply_flags` with :data:`FLAGS` — upstream's command-line flags, their config
  field and their precedence over a file; :func:`add_arguments` / :func:`given_flags`
  generate and read the argparse options.
* :func:`validate` — every error at once in upstream's wording, each prefixed with its
  v1alpha1 field path (``nftables.minSyncPeriod: Invalid value: -1s: must be greater than
  or equal to 0``); :func:`feature_gate_warnings` for gates kubeproxy does not know.
* :func:`to_yaml` — ``--write-config-to``: the effective configuration, keys sorted and
  every field written, as upstream's encoder does.
* :func:`mode_settings` — the per-mode values (sync periods, masquerading) the proxy uses.

Pure: no I/O except reading the file in :func:`load_config`; no module-level mutable state.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kubeproxy.config import IPVS_SCHEDULERS
from kubeproxy.model.topology import FeatureFlags

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
LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix", "")
LOG_FORMATS = ("json", "text")
NODE_PORT_ADDRESSES_PRIMARY = "primary"

_INT32 = (-(2**31), 2**31 - 1)
_UINT32 = (0, 2**32 - 1)
_INT64_MAX = 2**63 - 1


class ConfigFileError(ValueError):
    """The file cannot be decoded; ``errors`` lists every problem, each naming its field."""

    def __init__(self, source: str, errors: Sequence[str]) -> None:
        self.source = source
        self.errors = list(errors)
        super().__init__(f"{source}: " + "; ".join(self.errors))


# --------------------------------------------------------------------------- durations

_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_COMPONENT = re.compile(r"(\d*)(?:\.(\d*))?([^\d.]*)")


@dataclass(frozen=True, order=True, slots=True)
class Duration:
    """A Go ``time.Duration`` (integer nanoseconds)."""

    nanoseconds: int = 0

    @classmethod
    def of_seconds(cls, seconds: float) -> Duration:
        return cls(round(seconds * 1_000_000_000))

    @property
    def seconds(self) -> float:
        return self.nanoseconds / 1_000_000_000

    def __bool__(self) -> bool:
        return self.nanoseconds != 0

    @classmethod
    def parse(cls, text: str) -> Duration:
        """``time.ParseDuration``: ``[-+]`` then one or more ``<number><unit>``, or ``0``."""
        rest = text
        negative = False
        if rest[:1] in ("-", "+"):
            negative = rest[0] == "-"
            rest = rest[1:]
        if rest == "0":
            return cls(0)
        if not rest:
            raise ValueError(f"time: invalid duration {_go_quote(text)}")
        total = 0
        while rest:
            match = _COMPONENT.match(rest)
            assert match is not None  # the pattern matches any string, possibly empty
            whole, frac, unit = match.group(1), match.group(2), match.group(3)
            if not whole and not frac:
                raise ValueError(f"time: invalid duration {_go_quote(text)}")
            if not unit:
                raise ValueError(f"time: missing unit in duration {_go_quote(text)}")
            if unit not in _NS:
                raise ValueError(
                    f"time: unknown unit {_go_quote(unit)} in duration {_go_quote(text)}"
                )
            scale = _NS[unit]
            total += int(whole or "0") * scale
            if frac:
                total += int(frac) * scale // 10 ** len(frac)
            if total > _INT64_MAX + (1 if negative else 0):
                raise ValueError(f"time: invalid duration {_go_quote(text)}")
            rest = rest[match.end() :]
        return cls(-total if negative else total)

    def __str__(self) -> str:
        """``Duration.String()``: ``0s``, ``1.5ms``, ``30s``, ``1m30s``, ``24h0m0s``."""
        ns = abs(self.nanoseconds)
        sign = "-" if self.nanoseconds < 0 else ""
        if ns == 0:
            return "0s"
        if ns < _NS["s"]:
            for unit, scale in (("ms", _NS["ms"]), ("\u00b5s", _NS["us"]), ("ns", 1)):
                if ns >= scale:
                    return sign + _decimal(ns, scale) + unit
        hours, rem = divmod(ns, _NS["h"])
        minutes, rem = divmod(rem, _NS["m"])
        out = _decimal(rem, _NS["s"]) + "s"
        if hours or minutes:
            out = f"{minutes}m" + out
        if hours:
            out = f"{hours}h" + out
        return sign + out


def _decimal(value: int, scale: int) -> str:
    whole, frac = divmod(value, scale)
    if not frac:
        return str(whole)
    digits = len(str(scale)) - 1
    return f"{whole}." + f"{frac:0{digits}d}".rstrip("0")


def _go_quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


# ------------------------------------------------------------------------- the types


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
    """Windows-only settings: decoded and type-checked, otherwise ignored."""

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


# -------------------------------------------------------------------------- decoding


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional_inner(tp: Any) -> Any | None:
    """``X`` for ``X | None``; None for any other annotation."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


class _Decoder:
    """Turns parsed YAML/JSON into the dataclass tree, collecting every error."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def wrong_type(self, path: str, value: Any, want: str) -> None:
        self.errors.append(f"{path}: cannot unmarshal {_json_kind(value)} into {want}")

    def dataclass(self, cls: type[Any], data: Any, path: str) -> Any:
        if not isinstance(data, dict):
            self.wrong_type(path or "<root>", data, f"object {cls.__name__}")
            return cls()
        hints = _hints(cls)
        by_json = {f.metadata["json"]: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            f = by_json.get(key) if isinstance(key, str) else None
            if f is None:
                message = f'unknown field "{where}"'
                (self.errors if self.strict else self.warnings).append(message)
                continue
            values[f.name] = self.value(hints[f.name], f.metadata["kind"], value, where)
        return cls(**values)

    def value(self, tp: Any, kind: str, value: Any, path: str) -> Any:
        inner = _optional_inner(tp)
        if inner is not None:
            return None if value is None else self.value(inner, kind, value, path)
        if value is None:
            return _zero(tp)
        if tp is str:
            return self.string(kind, value, path)
        if tp is bool:
            if isinstance(value, bool):
                return value
            self.wrong_type(path, value, "bool")
            return False
        if tp is int:
            return self.integer(kind or "int", value, path)
        if tp is float:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            self.wrong_type(path, value, "float32")
            return 0.0
        if tp is Duration:
            return self.duration(kind, value, path)
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.dataclass(tp, value, path)
        origin = typing.get_origin(tp)
        if origin is tuple:
            return self.sequence(typing.get_args(tp)[0], value, path)
        if origin is Mapping:
            return self.bool_map(value, path)
        raise TypeError(f"unsupported annotation {tp!r} at {path}")  # a bug in this module

    def string(self, kind: str, value: Any, path: str) -> str:
        if isinstance(value, str):
            return value
        # resource.Quantity accepts a bare number too.
        if kind == "quantity" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        self.wrong_type(path, value, "string")
        return ""

    def integer(self, kind: str, value: Any, path: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            self.wrong_type(path, value, kind)
            return 0
        low, high = _UINT32 if kind == "uint32" else _INT32
        if not low <= value <= high:
            self.errors.append(f"{path}: cannot unmarshal number {value} into {kind}")
            return 0
        return value

    def duration(self, kind: str, value: Any, path: str) -> Duration:
        if kind == "time_or_duration" and isinstance(value, int) and not isinstance(value, bool):
            return Duration(value)
        if not isinstance(value, str):
            self.wrong_type(path, value, "duration string")
            return Duration()
        try:
            return Duration.parse(value)
        except ValueError as err:
            self.errors.append(f"{path}: {err}")
            return Duration()

    def sequence(self, item: Any, value: Any, path: str) -> tuple[Any, ...]:
        if not isinstance(value, list):
            self.wrong_type(path, value, "array")
            return ()
        return tuple(self.value(item, "", v, f"{path}[{i}]") for i, v in enumerate(value))

    def bool_map(self, value: Any, path: str) -> dict[str, bool]:
        if not isinstance(value, dict):
            self.wrong_type(path, value, "map[string]bool")
            return {}
        out: dict[str, bool] = {}
        for key, flag in value.items():
            if not isinstance(flag, bool):
                self.wrong_type(f"{path}.{key}", flag, "bool")
                continue
            out[str(key)] = flag
        return out


def _zero(tp: Any) -> Any:
    if tp is Duration:
        return Duration()
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp()
    origin = typing.get_origin(tp)
    if origin is tuple:
        return ()
    if origin is Mapping:
        return {}
    return tp()


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys, as upstream's strict decoder does."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f'duplicate field "{key}"', key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f'duplicate field "{key}"')
        out[key] = value
    return out


def _parse_document(text: str) -> Any:
    if text.lstrip().startswith("{"):
        return json.loads(text, object_pairs_hook=_no_duplicates)
    docs = [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    if len(docs) > 1:
        raise ValueError("expected one KubeProxyConfiguration document, found several")
    return docs[0] if docs else None


def decode(
    text: str,
    *,
    source: str = "<config>",
    strict: bool = True,
    warn: Callable[[str], None] | None = None,
) -> tuple[KubeProxyConfiguration, list[str]]:
    """Decode as much of a KubeProxyConfiguration document as possible.

    Returns the configuration built from every field that could be decoded (a field in
    error keeps its zero value), with upstream's defaults applied, and the decode errors
    (wrong apiVersion/kind, unknown fields, wrong types), so a caller can validate the
    rest and report everything at once. Raises ConfigFileError only when there is no
    object to decode (not YAML/JSON, duplicate keys, several documents, not a mapping).

    ``strict=False`` is upstream's fallback for v1alpha1: unknown fields are passed to
    ``warn`` instead of being errors (type errors still are).
    """
    try:
        data = _parse_document(text)
    except (yaml.YAMLError, ValueError) as err:
        raise ConfigFileError(source, [f"failed to decode: {err}"]) from None
    if not isinstance(data, dict):
        raise ConfigFileError(source, ["expected a KubeProxyConfiguration object"])
    errors = []
    api_version, kind = data.pop("apiVersion", None), data.pop("kind", None)
    if kind is None or api_version is None:
        errors.append("Object 'Kind' and 'apiVersion' must be set")
    elif kind != KIND or api_version != API_VERSION:
        errors.append(
            f'no kind "{kind}" is registered for version "{api_version}" '
            f"(expected apiVersion {API_VERSION}, kind {KIND})"
        )
    decoder = _Decoder(strict)
    cfg = decoder.dataclass(KubeProxyConfiguration, data, "")
    errors.extend(decoder.errors)
    if decoder.warnings and warn is not None:
        warn("Using lenient decoding as strict decoding failed: " + "; ".join(decoder.warnings))
    return set_defaults(cfg), errors


def loads(
    text: str,
    *,
    source: str = "<config>",
    strict: bool = True,
    warn: Callable[[str], None] | None = None,
) -> KubeProxyConfiguration:
    """Decode a KubeProxyConfiguration document and apply upstream's defaults; raises
    ConfigFileError listing every decode error (see :func:`decode`)."""
    cfg, errors = decode(text, source=source, strict=strict, warn=warn)
    if errors:
        raise ConfigFileError(source, errors)
    return cfg


def load_config(
    path: Path, *, strict: bool = True, warn: Callable[[str], None] | None = None
) -> KubeProxyConfiguration:
    """Read ``path`` (YAML or JSON); raises ConfigFileError listing every problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigFileError(str(path), [err.strerror or str(err)]) from None
    return loads(text, source=str(path), strict=strict, warn=warn)


# -------------------------------------------------------------------------- defaults


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


def _section(mode: str) -> str:
    """The v1alpha1 section whose sync periods a mode uses (upstream's conversion: ipvs
    and nftables their own, anything else, blank included, iptables)."""
    if mode == "ebpf":
        return "nftables"
    return mode if mode in ("ipvs", "nftables") else "iptables"


def _masquerade_section(mode: str) -> str:
    """The section whose masqueradeAll a mode uses (ipvs shares iptables')."""
    return "nftables" if mode in ("nftables", "ebpf") else "iptables"


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
    if cfg.mode in ("nftables", "ebpf") and not cfg.node_port_addresses:
        cfg = dataclasses.replace(cfg, node_port_addresses=(NODE_PORT_ADDRESSES_PRIMARY,))
    if not cfg.detect_local_mode:
        cfg = dataclasses.replace(cfg, detect_local_mode="ClusterCIDR")
    return cfg


def _with_mode_values(
    cfg: KubeProxyConfiguration, sync: Duration, min_sync: Duration, masquerade_all: bool
) -> KubeProxyConfiguration:
    section = _section(cfg.mode)
    cfg = dataclasses.replace(
        cfg,
        **{
            section: dataclasses.replace(
                getattr(cfg, section), sync_period=sync, min_sync_period=min_sync
            )
        },
    )
    masq = _masquerade_section(cfg.mode)
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
    section = getattr(cfg, _section(cfg.mode))
    masquerade_all = getattr(cfg, _masquerade_section(cfg.mode)).masquerade_all
    # The nftables proxier reads nftables.masqueradeBit; the others iptables'.
    bit = (
        cfg.nftables.masquerade_bit if mode in ("nftables", "ebpf") else cfg.iptables.masquerade_bit
    )
    return ModeSettings(
        mode=mode,
        sync_period=section.sync_period,
        min_sync_period=section.min_sync_period,
        masquerade_all=masquerade_all,
        masquerade_bit=14 if bit is None else bit,
    )


# -------------------------------------------------------------------------- encoding


def to_dict(cfg: KubeProxyConfiguration) -> dict[str, Any]:
    """The v1alpha1 JSON object, every field present except upstream's ``omitempty`` ones."""
    body = _encode(cfg)
    assert isinstance(body, dict)
    return dict(sorted({"apiVersion": API_VERSION, "kind": KIND, **body}.items()))


def _encode(value: Any) -> Any:
    if isinstance(value, Duration):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.metadata["omitempty"] and not item:
                continue
            out[f.metadata["json"]] = _encode(item)
        return dict(sorted(out.items()))
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return {k: value[k] for k in sorted(value)}
    if isinstance(value, float) and value.is_integer():
        return int(value)  # Go prints float32 5 as 5
    return value


class _Dumper(yaml.SafeDumper):
    """Quotes strings with double quotes, as Go's YAML encoder does, when quoting is needed."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    plain_tag = dumper.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    style = '"' if text == "" or plain_tag != "tag:yaml.org,2002:str" else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _represent_str)


def to_yaml(cfg: KubeProxyConfiguration) -> str:
    """``--write-config-to``: YAML that :func:`load_config` reads back to ``cfg``."""
    return yaml.dump(to_dict(cfg), Dumper=_Dumper, sort_keys=True, default_flow_style=False)


# ------------------------------------------------------------------------ validation


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
        return _go_quote(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[]string{" + ", ".join(_go_quote(str(v)) for v in value) + "}"
    return str(value)


def _invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, "Invalid value", value, detail)


# Gates that change kube-proxy behaviour (upstream names and defaults); any name upstream
# knows is accepted by upstream, so other names only warn (see feature_gate_warnings).
KNOWN_FEATURE_GATES: Mapping[str, bool] = {
    "AllAlpha": False,
    "AllBeta": False,
    "ContextualLogging": True,
    "KubeProxyDrainingTerminatingNodes": True,
    "LoadBalancerIPMode": True,
    "LoggingAlphaOptions": False,
    "LoggingBetaOptions": True,
    "MultiCIDRServiceAllocator": True,
    "NFTablesProxyMode": True,
    "PreferSameTrafficDistribution": True,
    "ServiceTrafficDistribution": True,
    "TopologyAwareHints": True,
}


# Each known gate's stage, as component-base's featuregate labels kubernetes_feature_enabled
# (its PreRelease: "ALPHA", "BETA", "" for GA, "DEPRECATED"), at the release whose defaults
# KNOWN_FEATURE_GATES has (1.34).
FEATURE_GATE_STAGES: Mapping[str, str] = {
    "AllAlpha": "ALPHA",
    "AllBeta": "BETA",
    "ContextualLogging": "BETA",
    "KubeProxyDrainingTerminatingNodes": "",
    "LoadBalancerIPMode": "",
    "LoggingAlphaOptions": "ALPHA",
    "LoggingBetaOptions": "BETA",
    "MultiCIDRServiceAllocator": "",
    "NFTablesProxyMode": "",
    "PreferSameTrafficDistribution": "BETA",
    "ServiceTrafficDistribution": "",
    "TopologyAwareHints": "",
}


def feature_states(cfg: KubeProxyConfiguration) -> list[tuple[str, str, bool]]:
    """(name, stage, enabled) of every gate kubeproxy knows, for kubernetes_feature_enabled."""
    gates = effective_feature_gates(cfg)
    return [(name, FEATURE_GATE_STAGES[name], gates[name]) for name in sorted(KNOWN_FEATURE_GATES)]


def effective_feature_gates(cfg: KubeProxyConfiguration) -> dict[str, bool]:
    gates = dict(KNOWN_FEATURE_GATES)
    gates.update(cfg.feature_gates)
    return gates


def feature_flags(cfg: KubeProxyConfiguration) -> FeatureFlags:
    """The gates the pure core reads, as :class:`~kubeproxy.model.topology.FeatureFlags`."""
    gates = effective_feature_gates(cfg)
    return FeatureFlags(prefer_same_traffic_distribution=gates["PreferSameTrafficDistribution"])


def feature_gate_warnings(cfg: KubeProxyConfiguration) -> list[str]:
    """Gates this kubeproxy does not know. Upstream rejects names missing from its own
    (complete) registry; kubeproxy knows only the proxy's gates, so it warns instead of
    refusing a file upstream accepts."""
    return [
        f"featureGates.{name}: unrecognized feature gate, ignored"
        for name in sorted(cfg.feature_gates)
        if name not in KNOWN_FEATURE_GATES
    ]


def validate(cfg: KubeProxyConfiguration) -> list[str]:
    """Every validation error, in upstream's order and wording (``pkg/proxy/apis/config/
    validation``), with v1alpha1 field paths."""
    return [str(e) for e in validation_errors(cfg)]


def validation_errors(cfg: KubeProxyConfiguration) -> list[FieldError]:
    errs: list[FieldError] = []
    section = _section(cfg.mode)
    errs += _masquerade_bit(cfg.iptables.masquerade_bit, "iptables.masqueradeBit")
    if cfg.mode == "ipvs":
        errs += _ipvs(cfg.ipvs)
    elif cfg.mode in ("nftables", "ebpf"):
        errs += _masquerade_bit(cfg.nftables.masquerade_bit, "nftables.masqueradeBit")
    errs += _conntrack(cfg.conntrack)
    if cfg.oom_score_adj is not None and not -1000 <= cfg.oom_score_adj <= 1000:
        errs.append(
            _invalid("oomScoreAdj", cfg.oom_score_adj, "must be within the range [-1000, 1000]")
        )
    if cfg.mode and cfg.mode not in (*LINUX_PROXY_MODES, *OUR_PROXY_MODES):
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
    if not _is_ip(cfg.bind_address):
        errs.append(
            _invalid(
                "bindAddress",
                cfg.bind_address,
                "not a valid textual representation of an IP address",
            )
        )
    if cfg.healthz_bind_address:
        errs += _host_port(cfg.healthz_bind_address, "healthzBindAddress")
    errs += _host_port(cfg.metrics_bind_address, "metricsBindAddress")
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


def _host_port(text: str, path: str) -> list[FieldError]:
    match = re.fullmatch(r"\[([^\]]*)\]:([^:]*)|([^:\[\]]*):([^:]*)", text)
    if match is None:
        return [_invalid(path, text, "must be IP:port")]
    host = match.group(1) if match.group(1) is not None else match.group(3)
    port = match.group(2) if match.group(2) is not None else match.group(4)
    errs = []
    if not _is_ip(host):
        errs.append(_invalid(path, host, "must be a valid IP"))
    if not (re.fullmatch(r"[+-]?\d+", port) and 1 <= int(port) <= 65535):
        errs.append(_invalid(path, port, "must be a valid port"))
    return errs


def _node_port_addresses(values: Sequence[str]) -> list[FieldError]:
    errs = []
    for i, value in enumerate(values):
        if value == NODE_PORT_ADDRESSES_PRIMARY:
            if i != 0 or len(values) != 1:
                errs.append(
                    _invalid(f"nodePortAddresses[{i}]", value, "can't use both 'primary' and CIDRs")
                )
            break
        if not _is_cidr(value):
            errs.append(_invalid(f"nodePortAddresses[{i}]", value, "must be a valid CIDR"))
    return errs


_DUAL_STACK_PAIR = (
    "must be a either a single CIDR or dual-stack pair of CIDRs "
    "(e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]"
)


def _detect_local(cfg: KubeProxyConfiguration) -> list[FieldError]:
    mode = cfg.detect_local_mode
    if mode not in LOCAL_MODES:
        quoted = ", ".join(_go_quote(m) for m in LOCAL_MODES)
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
    if logging.verbosity > _INT32[1]:
        errs.append(_invalid("logging.verbosity", logging.verbosity, f"Must be <= {_INT32[1]}"))
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
        if item.verbosity > _INT32[1]:
            errs.append(_invalid(path, item.verbosity, f"Must be <= {_INT32[1]}"))
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


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_ipv4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4
    except ValueError:
        return False


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


# ---------------------------------------------------------------------------- flags


def _parse_bool(text: str) -> bool:
    """``strconv.ParseBool``, as pflag uses it."""
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}")


def _parse_int32(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if not _INT32[0] <= value <= _INT32[1]:
        raise argparse.ArgumentTypeError(f"{text} is out of range for int32")
    return value


def _parse_uint32(text: str) -> int:
    if not text.isdigit() or not int(text) <= _UINT32[1]:
        raise argparse.ArgumentTypeError(f"invalid non-negative integer {text!r}")
    return int(text)


def _parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None


def _parse_duration(text: str) -> Duration:
    try:
        return Duration.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _parse_ip(text: str) -> str:
    """``utilflag.IPVar``: an IP address (canonical form)."""
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f'"{text}" is not a valid IP address') from None


def _parse_ip_port(text: str) -> str:
    """``utilflag.IPPortVar``: an IP, or IP:port; empty turns the server off, as upstream."""
    if not text.strip():
        return ""
    if _is_ip(text.strip()):
        return text.strip()
    if _host_port(text, "-"):
        raise argparse.ArgumentTypeError(f'"{text}" is not in a valid format (ip or ip:port)')
    return text


def _parse_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _parse_bool_map(text: str) -> dict[str, bool]:
    """``cliflag.MapStringBool``: ``Name=true,Other=false``."""
    out: dict[str, bool] = {}
    for item in _parse_list(text):
        name, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"missing bool value for {name}")
        out[name.strip()] = _parse_bool(value.strip())
    return out


def _parse_vmodule(text: str) -> tuple[VModuleItem, ...]:
    """klog's ``--vmodule``: ``pattern=N[,pattern=N...]``."""
    items = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        pattern, sep, number = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"invalid vmodule item {part!r} (not pattern=N)")
        verbosity = _parse_uint32(number)
        items.append(VModuleItem(file_pattern=pattern, verbosity=verbosity))
    return tuple(items)


_PARSERS: Mapping[str, Callable[[str], object]] = {
    "string": str,
    "bool": _parse_bool,
    "int32": _parse_int32,
    "uint32": _parse_uint32,
    "float": _parse_float,
    "duration": _parse_duration,
    "ip": _parse_ip,
    "ipport": _parse_ip_port,
    "list": _parse_list,
    "map": _parse_bool_map,
    "vmodule": _parse_vmodule,
}


@dataclass(frozen=True)
class FlagSpec:
    """One upstream kube-proxy flag.

    ``field`` is the v1alpha1 path it sets (None: not part of the configuration, e.g.
    ``--master``). ``{mode}`` in it stands for the section whose sync periods the active
    mode uses and ``{masq}`` for the one whose masqueradeAll it uses: upstream keeps these
    flags in mode-independent internal fields. ``modes`` limits the flag
    to some modes (upstream ignores ``--ipvs-sync-period`` outside ipvs mode, for example).
    ``wins_over_file`` marks the few flags upstream applies even with ``--config``.
    """

    name: str
    field: str | None
    kind: str
    help: str
    wins_over_file: bool = False
    modes: tuple[str, ...] | None = None
    except_modes: tuple[str, ...] = ()

    def parse(self, text: str) -> object:
        return _PARSERS[self.kind](text)

    def applies_to(self, mode: str) -> bool:
        if mode in self.except_modes:
            return False
        return self.modes is None or mode in self.modes

    def target(self, mode: str) -> str | None:
        if self.field is None:
            return None
        return self.field.replace("{mode}", _section(mode)).replace(
            "{masq}", _masquerade_section(mode)
        )


FLAGS: tuple[FlagSpec, ...] = (
    # --proxy-mode first: the mode decides where the mode-dependent flags land.
    FlagSpec("proxy-mode", "mode", "string", "which proxy mode to use (nftables)"),
    FlagSpec(
        "hostname-override",
        "hostnameOverride",
        "string",
        "the name of the Node kube-proxy runs on (default: the host name)",
        wins_over_file=True,
    ),
    FlagSpec("kubeconfig", "clientConnection.kubeconfig", "string", "path to a kubeconfig file"),
    FlagSpec("master", None, "string", "the API server address (overrides the kubeconfig's)"),
    FlagSpec(
        "kube-api-content-type",
        "clientConnection.contentType",
        "string",
        "content type of requests sent to the API server",
    ),
    FlagSpec("kube-api-burst", "clientConnection.burst", "int32", "burst for API requests"),
    FlagSpec("kube-api-qps", "clientConnection.qps", "float", "QPS for API requests"),
    FlagSpec(
        "bind-address", "bindAddress", "ip", "overrides kube-proxy's idea of its node's primary IP"
    ),
    FlagSpec(
        "healthz-bind-address",
        "healthzBindAddress",
        "ipport",
        "IP[:port] of the health check server (default 0.0.0.0:10256)",
    ),
    FlagSpec(
        "metrics-bind-address",
        "metricsBindAddress",
        "ipport",
        "IP[:port] of the metrics server (default 127.0.0.1:10249)",
    ),
    FlagSpec(
        "bind-address-hard-fail",
        "bindAddressHardFail",
        "bool",
        "treat failure to bind a server port as fatal",
    ),
    FlagSpec("profiling", "enableProfiling", "bool", "serve /debug/pprof on the metrics server"),
    FlagSpec(
        "show-hidden-metrics-for-version",
        "showHiddenMetricsForVersion",
        "string",
        "previous minor version whose hidden metrics to show",
    ),
    FlagSpec(
        "cluster-cidr",
        "clusterCIDR",
        "string",
        "the Pod CIDR range(s), comma-separated, one per IP family",
    ),
    FlagSpec(
        "nodeport-addresses",
        "nodePortAddresses",
        "list",
        "CIDRs, or 'primary', whose node IPs accept NodePort traffic",
    ),
    FlagSpec(
        "masquerade-all",
        "{masq}.masqueradeAll",
        "bool",
        "SNAT all traffic sent via Service cluster IPs",
    ),
    FlagSpec(
        "iptables-masquerade-bit",
        "iptables.masqueradeBit",
        "int32",
        "fwmark bit marking packets to SNAT in iptables/ipvs mode, [0, 31]",
    ),
    FlagSpec(
        "iptables-localhost-nodeports",
        "iptables.localhostNodePorts",
        "bool",
        "allow NodePorts on localhost (iptables mode, IPv4)",
        modes=("iptables",),
    ),
    FlagSpec(
        "iptables-sync-period",
        "{mode}.syncPeriod",
        "duration",
        "how often rules are fully re-synchronized (e.g. '30s')",
        except_modes=("ipvs",),
    ),
    FlagSpec(
        "iptables-min-sync-period",
        "{mode}.minSyncPeriod",
        "duration",
        "minimum time between rule syncs (e.g. '1s'); 0 syncs on every change",
        except_modes=("ipvs",),
    ),
    FlagSpec(
        "ipvs-sync-period", "ipvs.syncPeriod", "duration", "ipvs mode sync period", modes=("ipvs",)
    ),
    FlagSpec(
        "ipvs-min-sync-period",
        "ipvs.minSyncPeriod",
        "duration",
        "ipvs mode minimum sync period",
        modes=("ipvs",),
    ),
    FlagSpec("ipvs-scheduler", "ipvs.scheduler", "string", "the ipvs scheduler"),
    FlagSpec("ipvs-exclude-cidrs", "ipvs.excludeCIDRs", "list", "CIDRs ipvs cleanup leaves alone"),
    FlagSpec("ipvs-strict-arp", "ipvs.strictARP", "bool", "set arp_ignore=1 and arp_announce=2"),
    FlagSpec("ipvs-tcp-timeout", "ipvs.tcpTimeout", "duration", "idle IPVS TCP timeout"),
    FlagSpec("ipvs-tcpfin-timeout", "ipvs.tcpFinTimeout", "duration", "IPVS TCP FIN timeout"),
    FlagSpec("ipvs-udp-timeout", "ipvs.udpTimeout", "duration", "IPVS UDP timeout"),
    FlagSpec(
        "detect-local-mode",
        "detectLocalMode",
        "string",
        "how to detect local traffic (ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix)",
    ),
    FlagSpec(
        "pod-bridge-interface",
        "detectLocal.bridgeInterface",
        "string",
        "bridge whose traffic is local (BridgeInterface mode)",
    ),
    FlagSpec(
        "pod-interface-name-prefix",
        "detectLocal.interfaceNamePrefix",
        "string",
        "interface name prefix whose traffic is local (InterfaceNamePrefix mode)",
    ),
    FlagSpec(
        "oom-score-adj", "oomScoreAdj", "int32", "oom-score-adj of the process, [-1000, 1000]"
    ),
    FlagSpec(
        "conntrack-max-per-core",
        "conntrack.maxPerCore",
        "int32",
        "NAT connections to track per CPU (0 leaves the limit and ignores conntrack-min)",
    ),
    FlagSpec(
        "conntrack-min",
        "conntrack.min",
        "int32",
        "minimum conntrack entries, regardless of conntrack-max-per-core",
    ),
    FlagSpec(
        "conntrack-tcp-timeout-established",
        "conntrack.tcpEstablishedTimeout",
        "duration",
        "idle timeout of established TCP connections (0 leaves it as is)",
    ),
    FlagSpec(
        "conntrack-tcp-timeout-close-wait",
        "conntrack.tcpCloseWaitTimeout",
        "duration",
        "NAT timeout of TCP connections in CLOSE_WAIT",
    ),
    FlagSpec(
        "conntrack-tcp-be-liberal",
        "conntrack.tcpBeLiberal",
        "bool",
        "set nf_conntrack_tcp_be_liberal to 1",
    ),
    FlagSpec(
        "conntrack-udp-timeout",
        "conntrack.udpTimeout",
        "duration",
        "idle timeout of UNREPLIED UDP connections (0 leaves it as is)",
    ),
    FlagSpec(
        "conntrack-udp-timeout-stream",
        "conntrack.udpStreamTimeout",
        "duration",
        "idle timeout of ASSURED UDP connections (0 leaves it as is)",
    ),
    FlagSpec(
        "config-sync-period",
        "configSyncPeriod",
        "duration",
        "how often configuration from the API server is refreshed",
    ),
    FlagSpec(
        "feature-gates",
        "featureGates",
        "map",
        "key=value pairs enabling or disabling features",
    ),
    FlagSpec("v", "logging.verbosity", "uint32", "log verbosity", wins_over_file=True),
    FlagSpec(
        "vmodule",
        "logging.vmodule",
        "vmodule",
        "comma-separated pattern=N settings for file-filtered logging",
        wins_over_file=True,
    ),
    FlagSpec(
        "logging-format", "logging.format", "string", "log format (text, json)", wins_over_file=True
    ),
)

FLAGS_BY_NAME: Mapping[str, FlagSpec] = {spec.name: spec for spec in FLAGS}


class FlagError(ValueError):
    """A flag value the configuration cannot take; the message names the flag."""


def apply_flags(
    cfg: KubeProxyConfiguration,
    flags: Mapping[str, object],
    *,
    config_file: bool = False,
    warn: Callable[[str], None] | None = None,
) -> KubeProxyConfiguration:
    """Apply the flags given on the command line (name without ``--`` -> value).

    Upstream precedence: without a config file every flag applies on top of the defaults;
    with ``--config`` the file replaces the flags, except ``--hostname-override`` and the
    logging flags (``--v``, ``--logging-format``), which still win. Ignored flags are
    passed to ``warn``. Values may be raw strings or already parsed by
    :meth:`FlagSpec.parse`; list values may be a sequence of raw strings (a repeated flag).
    """
    specs = []
    for name in flags:
        spec = FLAGS_BY_NAME.get(name)
        if spec is None:
            raise FlagError(f"--{name}: not a kube-proxy configuration flag")
        specs.append(spec)
    specs.sort(key=FLAGS.index)
    for spec in specs:
        if config_file and not spec.wins_over_file:
            if spec.field is not None and warn is not None:
                warn(f"--{spec.name} is ignored because a config file is given (--config)")
            continue
        if not spec.applies_to(cfg.mode):
            if warn is not None:
                warn(f"--{spec.name} is ignored in proxy mode {cfg.mode or DEFAULT_MODE!r}")
            continue
        target = spec.target(cfg.mode)
        if target is None:
            continue
        value = _flag_value(spec, flags[spec.name])
        if spec.name == "hostname-override":
            if value == "":
                continue  # upstream acts only on a non-empty flag
            value = str(value).strip().lower()
            if not value:
                raise FlagError("--hostname-override: empty hostname-override is invalid")
        if spec.name == "feature-gates":
            assert isinstance(value, dict)
            value = {**cfg.feature_gates, **value}
        cfg = _set_path(cfg, target.split("."), value)
    return cfg


def _flag_value(spec: FlagSpec, raw: object) -> object:
    try:
        if spec.kind in ("list", "map") and isinstance(raw, list | tuple):
            parts = [spec.parse(r) if isinstance(r, str) else r for r in raw]
            if spec.kind == "list":
                return tuple(item for part in parts for item in _as_tuple(part))
            merged: dict[str, bool] = {}
            for part in parts:
                assert isinstance(part, dict)
                merged.update(part)
            return merged
        return spec.parse(raw) if isinstance(raw, str) else raw
    except argparse.ArgumentTypeError as err:
        raise FlagError(f"--{spec.name}: {err}") from None


def _as_tuple(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    assert isinstance(value, tuple)
    return value


def _set_path(obj: Any, path: list[str], value: object) -> Any:
    by_json = {f.metadata["json"]: f for f in dataclasses.fields(obj)}
    f = by_json[path[0]]
    if len(path) > 1:
        value = _set_path(getattr(obj, f.name), path[1:], value)
    return dataclasses.replace(obj, **{f.name: value})


def add_arguments(parser: argparse.ArgumentParser, *, skip: Sequence[str] = ()) -> None:
    """Add every flag of :data:`FLAGS` (except ``skip``) with upstream's name.

    Defaults are suppressed so :func:`given_flags` sees exactly what was typed.
    """
    for spec in FLAGS:
        if spec.name in skip:
            continue
        name = f"--{spec.name}"
        options: dict[str, Any] = {
            "default": argparse.SUPPRESS,
            "help": spec.help,
            "metavar": spec.kind,
        }
        if spec.kind == "bool":
            options.update(nargs="?", const=True, type=spec.parse)
        elif spec.kind in ("list", "map"):
            options.update(action="append", type=spec.parse)
        else:
            options.update(type=spec.parse)
        # klog's -v shorthand.
        names = (name, "-v") if spec.name == "v" else (name,)
        parser.add_argument(*names, dest=_dest(spec), **options)


def given_flags(args: argparse.Namespace, *, skip: Sequence[str] = ()) -> dict[str, object]:
    """The flags of :data:`FLAGS` present in ``args`` (parsed by :func:`add_arguments`)."""
    out: dict[str, object] = {}
    for spec in FLAGS:
        if spec.name not in skip and hasattr(args, _dest(spec)):
            out[spec.name] = getattr(args, _dest(spec))
    return out


def _dest(spec: FlagSpec) -> str:
    return "kp_" + spec.name.replace("-", "_")
