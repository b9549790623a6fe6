"""Upstream kube-proxy's command-line flags, as one table over the configuration.

* :data:`FLAGS` (:class:`FlagSpec`) — each flag with upstream's name, the v1alpha1 field
  it sets, its value syntax (pflag's: Go bools, int32, durations, IP[:port], lists,
  ``Name=bool`` maps, klog's ``--vmodule``) and the modes it applies to.
* :func:`apply_flags` — the given flags over a configuration, with upstream's precedence
  over a ``--config`` file (``cmd/kube-proxy/app/options.go``).
* :func:`add_arguments` / :func:`given_flags` — generate and read the argparse options, so
  ``kubeproxy.cli`` and the table never disagree.

Pure: no I/O.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubeproxy.config.defaults import masquerade_section, sync_section
from kubeproxy.config.duration import Duration
from kubeproxy.config.types import DEFAULT_MODE, INT32, UINT32, KubeProxyConfiguration, VModuleItem
from kubeproxy.config.validation import host_port_errors, is_ip


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
    if not INT32[0] <= value <= INT32[1]:
        raise argparse.ArgumentTypeError(f"{text} is out of range for int32")
    return value


def _parse_uint32(text: str) -> int:
    if not text.isdigit() or not int(text) <= UINT32[1]:
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
    if is_ip(text.strip()):
        return text.strip()
    if host_port_errors(text, "-"):
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
        return self.field.replace("{mode}", sync_section(mode)).replace(
            "{masq}", masquerade_section(mode)
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
        "CIDRs and the keywords 'primary', 'localhost', 'all': the node IPs that "
        "accept NodePort traffic",
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
    # Upstream's Windows flags (cmd/kube-proxy/app/options_windows.go), kernelspace mode.
    FlagSpec(
        "network-name",
        "winkernel.networkName",
        "string",
        "kernelspace mode: the HNS network of the Pods (default: env KUBE_NETWORK)",
        modes=("kernelspace",),
    ),
    FlagSpec(
        "source-vip",
        "winkernel.sourceVip",
        "string",
        "kernelspace mode: the source VIP of load balancers on an Overlay network",
        modes=("kernelspace",),
    ),
    FlagSpec(
        "enable-dsr",
        "winkernel.enableDSR",
        "bool",
        "kernelspace mode: Direct Server Return for Service VIPs (feature gate WinDSR)",
        modes=("kernelspace",),
    ),
    FlagSpec(
        "root-hnsendpoint-name",
        "winkernel.rootHnsEndpointName",
        "string",
        "kernelspace mode: the root namespace's HNS endpoint on an L2Bridge network (cbr0)",
        modes=("kernelspace",),
    ),
    FlagSpec(
        "forward-healthcheck-vip",
        "winkernel.forwardHealthCheckVip",
        "bool",
        "kernelspace mode: forward health checks of load-balancer IPs to the root endpoint",
        modes=("kernelspace",),
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
