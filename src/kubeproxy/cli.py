"""Command line: ``kubeproxy run | render | explain | list | cleanup``, flags as upstream's.

Argument parsing and configuration only: upstream's flags come from
:data:`kubeproxy.config.flags.FLAGS` (so ``--config`` files and flags share one table and
one precedence rule: with ``--config`` the file wins, except ``--hostname-override`` and
``--v``, exactly as upstream); the result is validated (every error at once, with its field
path) before anything touches the kernel, then turned into a
:class:`~kubeproxy.config.runtime.ProxyConfig`. The work happens in :mod:`kubeproxy.app`.

Objects come from ``--manifests DIR`` (a directory of YAML) or, without it, from the
Kubernetes API (``--kubeconfig`` / ``--master`` / in-cluster service account).
``render``, ``explain`` and ``list`` take the same flags as ``run`` and read the same
source, so they describe what ``run`` programs (:mod:`kubeproxy.explain`).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from kubeproxy import __version__, logs
from kubeproxy.app import Proxy, ServerBindError, install_signal_handlers
from kubeproxy.backends.base import BackendError, owned_by
from kubeproxy.backends.kernelspace.render import add_hns_state_flag, add_render_flags
from kubeproxy.backends.registry import (
    BACKENDS,
    COMPOSES,
    cleanup_all,
    cleanups,
    create_backend,
    removal_summary,
)
from kubeproxy.config.codec import ConfigFileError, decode, to_dict, to_yaml
from kubeproxy.config.defaults import complete, default_config, mode_settings
from kubeproxy.config.duration import Duration
from kubeproxy.config.features import feature_flags, feature_gate_warnings, feature_states
from kubeproxy.config.flags import FlagError, add_arguments, apply_flags, given_flags
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.options import IPTABLES_BACKENDS, OptionsError, split_config
from kubeproxy.config.runtime import (
    EBPF_FALLBACKS,
    ConfigError,
    IpvsSettings,
    ProxyConfig,
    conntrack_settings,
    default_hostname,
    detect_families,
    parse_cidrs,
    winkernel_settings,
)
from kubeproxy.config.types import KubeProxyConfiguration, KubeProxyIPVSConfiguration
from kubeproxy.config.validation import validate
from kubeproxy.dataplane.conntrack import ConntrackCommand
from kubeproxy.dataplane.iptables.cleanup import KeepMap
from kubeproxy.dataplane.sysctl import HOST_PROC, HOST_SYS, apply_conntrack_sysctls
from kubeproxy.explain.cli import add_explain_parser, add_list_parser, run_explain, run_list
from kubeproxy.logs import bounded
from kubeproxy.metrics import Metrics
from kubeproxy.model.events import dispatch
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.plan import DetectLocal, LocalMode
from kubeproxy.model.planning import describe_node
from kubeproxy.model.state import ProxyState, Snapshot
from kubeproxy.oom import apply_oom_score_adj
from kubeproxy.profiling import start_heap_tracing
from kubeproxy.sources import Source, initial_state
from kubeproxy.sources.oneshot import DEFAULT_TIMEOUT, Bounded, SourceError
from kubeproxy.sources.parsecache import DEFAULT_DIR as DEFAULT_CACHE_DIR
from kubeproxy.sources.standalone import StandaloneSource

log = logging.getLogger("kubeproxy")

# Flags of ours (not upstream's), handled here rather than through the config file.
_OURS = (
    "manifests",
    "once",
    "service-cluster-ip-range",
    "iptables-backend",
    "config",
    "write-config-to",
    "cleanup",
    "ebpf-cgroup-path",
    "ebpf-pin-path",
    "ebpf-fallback",
)


def _add_proxy_flags(p: argparse.ArgumentParser) -> None:
    add_arguments(p)
    p.add_argument(
        "--config",
        type=Path,
        help="a KubeProxyConfiguration file "
        "(kubeproxy.config.k8s.io/v1alpha1); it wins over flags, as upstream",
    )
    p.add_argument(
        "--manifests",
        type=Path,
        help="read Services, EndpointSlices, Nodes, ServiceCIDRs and Pods from this "
        "directory of YAML/JSON instead of the Kubernetes API; with Pods or Services "
        "without a clusterIP, kubeproxy allocates ClusterIPs and NodePorts and computes "
        "EndpointSlices (kept in DIR/.kubeproxy-state.json)",
    )
    p.add_argument(
        "--manifests-cache-dir",
        # A string: Path("") would be ".", and "" means no cache.
        default=str(DEFAULT_CACHE_DIR),
        help="run --manifests: keep each file's parsed objects here, so a restart "
        "parses only the files that changed (default %(default)s; '' to keep none; "
        "not used when it cannot be written)",
    )
    p.add_argument(
        "--service-cluster-ip-range",
        action="append",
        default=[],
        help="ClusterIP range(s), one per IP family (repeat or comma-separate): "
        "unallocated addresses in them are dropped, unused ports of "
        "allocated ClusterIPs rejected (ServiceCIDR objects add to these)",
    )
    p.add_argument(
        "--iptables-backend",
        choices=IPTABLES_BACKENDS,
        help="iptables and ipvs modes: which iptables to drive; auto (default) uses the one "
        "the node's other rules use, as the upstream image's iptables-wrapper",
    )
    p.add_argument(
        "--ebpf-cgroup-path",
        help="ebpf mode (ours): the cgroup v2 directory whose processes' sockets are "
        "load-balanced (default: the root of the cgroup v2 hierarchy, every process)",
    )
    p.add_argument(
        "--ebpf-fallback",
        choices=EBPF_FALLBACKS,
        help="ebpf mode (ours): what to do when the node cannot run the socket hooks "
        "(kernel, cgroup v2, BPF filesystem, clang/libbpf): none (default) exits with the "
        "reason; nftables logs it and runs as --proxy-mode nftables",
    )
    _add_pin_path(p)


def _add_pin_path(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ebpf-pin-path",
        help="ebpf mode (ours): where its BPF maps and links are pinned, on a BPF "
        "filesystem (default /sys/fs/bpf/kubeproxy)",
    )


def request_timeout(text: str) -> float:
    """kubectl's ``--request-timeout``: seconds, or a duration (``1s``, ``2m``, ``3h``);
    ``0`` is no limit."""
    try:
        seconds = float(text) if re.fullmatch(r"-?\d+", text) else Duration.parse(text).seconds
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return seconds


def _add_request_timeout(p: argparse.ArgumentParser, *, run: bool = False) -> None:
    scope = "with --once: " if run else ""
    p.add_argument(
        "--request-timeout",
        type=request_timeout,
        metavar="DURATION",
        help=f"{scope}how long to wait for the API server's complete state before giving up "
        "with exit status 1 (as kubectl's: 30s, 2m...; a bare number is seconds; 0 waits "
        f"forever; default {DEFAULT_TIMEOUT:g}s). A 401 or 403 gives up at once"
        + (
            "; without --once, run retries the API server until it answers, as kube-proxy"
            if run
            else ""
        ),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubeproxy", description="A Python reimplementation of Kubernetes kube-proxy."
    )
    version = f"kubeproxy v{__version__}"
    parser.add_argument("--version", action="version", version=version)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the proxy until SIGTERM")
    _add_proxy_flags(run)
    run.add_argument("--version", action="version", version=version)
    run.add_argument("--once", action="store_true", help="sync once and exit")
    _add_request_timeout(run, run=True)
    run.add_argument(
        "--init-only",
        action="store_true",
        help="apply the node settings that need full root (conntrack sysctls; "
        "route_localnet in iptables mode) and exit; then run with CAP_NET_ADMIN only",
    )
    run.add_argument(
        "--cleanup",
        action="store_true",
        help="remove everything kubeproxy created and exit (as kube-proxy)",
    )
    run.add_argument(
        "--write-config-to",
        type=Path,
        help="write the effective configuration (defaults filled in) and exit",
    )

    render = sub.add_parser(
        "render", help="print what 'run' would apply (the nft script); touches nothing"
    )
    _add_proxy_flags(render)
    _add_request_timeout(render)
    add_render_flags(render)
    render.add_argument(
        "--format",
        choices=("nft", "json", "yaml"),
        help="nft: the script a full sync applies (default); json: the service plan "
        "every proxy mode programs (frontends, endpoints, verdicts, masquerading); "
        "with --objects: yaml (default) or json",
    )
    render.add_argument(
        "--objects",
        action="store_true",
        help="print the Services and EndpointSlices as the proxy sees them (ClusterIPs, "
        "NodePorts and EndpointSlices computed for a --manifests directory) as a List",
    )

    for add in (add_explain_parser, add_list_parser):
        command = add(sub)
        _add_proxy_flags(command)
        _add_request_timeout(command)
        add_hns_state_flag(command)

    cleanup = sub.add_parser(
        "cleanup", help="remove everything kubeproxy created, and nothing else"
    )
    cleanup.add_argument("--v", type=int, default=0, metavar="N", help="log verbosity")
    _add_pin_path(cleanup)
    return parser


def load_configuration(
    args: argparse.Namespace,
    *,
    blank_mode: Callable[[KubeProxyConfiguration], str] | None = None,
) -> KubeProxyConfiguration:
    """File (if any) + flags + upstream defaults, validated; ConfigError lists every problem.

    ``blank_mode``: when neither the file nor the flags choose a proxy mode, the mode to
    use instead of the default (``--live``: the one running on the node)."""
    # Decode errors are kept and reported with the validation errors of everything that
    # could be decoded, so one run shows every problem of the file.
    errors: list[str] = []
    try:
        if args.config:
            text, options = split_config(_read(args.config), str(args.config))
            # Upstream decodes v1alpha1 strictly, then leniently with a log line naming
            # the unknown fields (real clusters carry stale ones, e.g. udpIdleTimeout).
            cfg, errors = decode(text, source=str(args.config), strict=False, warn=log.warning)
            # kubeproxy's own settings from the file; flags win.
            if args.manifests is None:
                args.manifests = options.manifests
            if not args.service_cluster_ip_range:
                args.service_cluster_ip_range = list(options.service_cluster_ip_ranges)
            if args.iptables_backend is None:
                args.iptables_backend = options.iptables_backend
        else:
            cfg = default_config()
        cfg = apply_flags(
            cfg, given_flags(args), config_file=args.config is not None, warn=log.warning
        )
        was_blank = not cfg.mode
        mode = blank_mode(cfg) if blank_mode is not None and was_blank else None
        cfg = complete(cfg, blank_mode=mode)
    except (ConfigFileError, FlagError, OptionsError) as err:
        raise ConfigError(str(err)) from None
    errors += validate(cfg)
    mode = cfg.mode
    if mode not in BACKENDS:
        errors.append(
            f"mode: Unsupported value: {mode!r}: supported values: "
            f"{', '.join(repr(str(b)) for b in BACKENDS)}"
        )
    if errors:
        where = f" in {args.config}" if args.config else ""
        raise ConfigError(f"invalid configuration{where}:\n  " + "\n  ".join(errors))
    for warning in feature_gate_warnings(cfg):
        log.warning("%s", warning)
    if was_blank and args.command == "run":
        log.info(
            "Using the %s proxy mode: the mode is blank, which means %s, as upstream; "
            "nftables mode is faster at scale (kernel 5.13 or later: --proxy-mode nftables)",
            cfg.mode,
            cfg.mode,
        )
    return cfg


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"--config: {path}: {err.strerror or err}") from None


def proxy_config(cfg: KubeProxyConfiguration, args: argparse.Namespace) -> ProxyConfig:
    ms = mode_settings(cfg)
    if getattr(args, "iptables_backend", None) and ms.mode not in (
        ProxyMode.IPTABLES,
        ProxyMode.IPVS,
    ):
        log.warning("--iptables-backend is ignored in proxy mode %r", ms.mode)
    for flag in ("ebpf_cgroup_path", "ebpf_fallback"):
        if getattr(args, flag, None) and ms.mode != ProxyMode.EBPF:
            log.warning("--%s is ignored in proxy mode %r", flag.replace("_", "-"), ms.mode)
    try:
        nodeports = NodePortAddresses.parse(list(cfg.node_port_addresses or ()))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return ProxyConfig(
        hostname=cfg.hostname_override.strip().lower() or default_hostname(),
        mode=ProxyMode(ms.mode),
        cluster_cidrs=parse_cidrs(cfg.cluster_cidr, "clusterCIDR"),
        detect_local=detect_local(cfg),
        service_cidrs=parse_cidrs(
            ",".join(args.service_cluster_ip_range), "--service-cluster-ip-range"
        ),
        nodeport_addresses=nodeports,
        masquerade_all=ms.masquerade_all,
        masquerade_bit=ms.masquerade_bit,
        localhost_nodeports=bool(cfg.iptables.localhost_node_ports),
        iptables_backend=getattr(args, "iptables_backend", None) or "auto",
        bind_address=cfg.bind_address or None,
        families=detect_families(),
        min_sync_period=ms.min_sync_period.seconds,
        sync_period=ms.sync_period.seconds,
        features=feature_flags(cfg),
        healthz_bind_address=cfg.healthz_bind_address,
        metrics_bind_address=cfg.metrics_bind_address,
        bind_address_hard_fail=cfg.bind_address_hard_fail,
        enable_profiling=cfg.enable_profiling,
        # Read (and validated) in ipvs mode only, as upstream's: any other mode ignores it.
        ipvs=ipvs_settings(cfg.ipvs) if ms.mode == ProxyMode.IPVS else IpvsSettings(),
        ebpf_cgroup_path=getattr(args, "ebpf_cgroup_path", None) or "",
        ebpf_pin_path=getattr(args, "ebpf_pin_path", None) or ProxyConfig.ebpf_pin_path,
        ebpf_fallback=getattr(args, "ebpf_fallback", None) or ProxyConfig.ebpf_fallback,
        winkernel=winkernel_settings(cfg, getattr(args, "hns_state", None)),
    )


def ipvs_settings(ipvs: KubeProxyIPVSConfiguration) -> IpvsSettings:
    """The ``ipvs:`` section (validated by kubeproxy.config.validation)."""
    return IpvsSettings(
        scheduler=ipvs.scheduler or "rr",
        exclude_cidrs=tuple(
            str(ipaddress.ip_network(c.strip(), strict=False)) for c in ipvs.exclude_cidrs or ()
        ),
        strict_arp=ipvs.strict_arp,
        tcp_timeout=int(ipvs.tcp_timeout.seconds),
        tcp_fin_timeout=int(ipvs.tcp_fin_timeout.seconds),
        udp_timeout=int(ipvs.udp_timeout.seconds),
    )


def detect_local(cfg: KubeProxyConfiguration) -> DetectLocal:
    """``detectLocalMode`` and ``detectLocal`` (validated by kubeproxy.config.validation; blank is
    ClusterCIDR once complete() ran)."""
    mode = LocalMode(cfg.detect_local_mode or LocalMode.CLUSTER_CIDR.value)
    settings = DetectLocal(
        mode=mode,
        bridge_interface=cfg.detect_local.bridge_interface,
        interface_name_prefix=cfg.detect_local.interface_name_prefix,
    )
    name, field = {
        LocalMode.BRIDGE_INTERFACE: (settings.bridge_interface, "bridgeInterface"),
        LocalMode.INTERFACE_NAME_PREFIX: (settings.interface_name_prefix, "interfaceNamePrefix"),
    }.get(mode, ("", ""))
    # The name goes into rules (iifname "..."): only what an interface name can hold.
    if field and not re.fullmatch(r"[A-Za-z0-9_.+@-]{1,15}", name):
        raise ConfigError(
            f"detectLocal.{field}: Invalid value: {name!r}: must be an interface name "
            "(at most 15 letters, digits or _.+@-)"
        )
    return settings


def make_source(
    cfg: KubeProxyConfiguration,
    config: ProxyConfig,
    args: argparse.Namespace,
    *,
    observe: Callable[[str, str, str, float], None] | None = None,
) -> Source:
    """``observe``: told about each request to the API server (for its metrics).

    One-shot commands (``render``, ``explain``, ``list``, ``run --once``) read the API
    through :class:`~kubeproxy.sources.oneshot.Bounded`: they give up after
    ``--request-timeout`` (or at once when denied) instead of retrying forever as ``run``
    does. ``run --once`` is bounded too: a script or an init container waits for it."""
    one_shot = args.command != "run" or getattr(args, "once", False)
    timeout = getattr(args, "request_timeout", None)
    if timeout is not None and not one_shot:
        raise ConfigError(
            "--request-timeout: only one-shot commands give up (render, explain, list, "
            "run --once); run retries the API server until it answers, as kube-proxy"
        )
    if args.manifests is not None:
        if timeout is not None:
            raise ConfigError(
                "--request-timeout: bounds waiting for the API server, not --manifests"
            )
        if not args.manifests.is_dir():
            raise ConfigError(f"--manifests: {args.manifests} is not a directory")
        return StandaloneSource(
            args.manifests,
            service_cidrs=config.service_cidrs,
            # render touches nothing, the state file included.
            persist=args.command == "run",
            # One-shot commands read every file once anyway, and write nothing.
            cache_dir=Path(args.manifests_cache_dir)
            if args.command == "run" and args.manifests_cache_dir
            else None,
        )
    from kubeproxy.sources.kube import KubeSource

    cc = cfg.client_connection
    source = KubeSource.from_flags(
        kubeconfig=cc.kubeconfig or None,
        master=getattr(args, "kp_master", None),
        node_name=config.hostname,
        proxy_name=None,
        qps=cc.qps,
        burst=cc.burst,
        content_type=cc.content_type,
        observe=observe,
        announce=not one_shot,
    )
    if not one_shot:
        return source
    return Bounded(source, (timeout if timeout is not None else DEFAULT_TIMEOUT) or None)


def _init_only(cfg: KubeProxyConfiguration, config: ProxyConfig) -> int:
    """upstream's --init-only: what needs more than CAP_NET_ADMIN, then exit."""
    apply_conntrack_sysctls(
        conntrack_settings(cfg.conntrack), proc_root=HOST_PROC, sys_root=HOST_SYS
    )
    init: Callable[[ProxyConfig, Path], None] | None = None
    if config.mode == ProxyMode.IPTABLES:
        from kubeproxy.backends.iptables.proxier import init_node as init_iptables

        init = init_iptables
    elif config.mode == ProxyMode.IPVS:
        from kubeproxy.backends.ipvs.proxier import init_node as init_ipvs

        init = init_ipvs
    if init is not None:
        try:
            init(config, HOST_PROC)
        except BackendError as err:
            log.error("%s", err)
            return 1
    log.info("System initialized and --init-only specified")
    return 0


def _cleanup(ebpf_pin_path: str | None) -> int:
    try:
        removed = cleanup_all(cleanups(ebpf_pin_path=ebpf_pin_path))
    except BackendError as err:
        log.error("%s", bounded(str(err)))
        return 1
    log.info("Removed %s", removal_summary(removed) if removed else "nothing (no kubeproxy rules)")
    return 0


def _render_objects(source: Source, fmt: str) -> int:
    if not isinstance(source, StandaloneSource):
        raise ConfigError("--objects: needs --manifests")
    listing = {"apiVersion": "v1", "kind": "List", "items": source.objects()}
    if fmt == "json":
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(listing, sort_keys=False))
    return 0


async def _snapshot(
    config: ProxyConfig, source: Source, *, guessed: bool, live: bool = False
) -> Snapshot:
    """The source's state as a sync sees it; warnings (stderr) when the node is not
    known for sure (``guessed``: its name is this machine's hostname)."""
    from kubeproxy.explain.command import node_warnings

    state = ProxyState(config.hostname, config.bind_ip())
    dispatch(state, await initial_state(source))
    snapshot, _ = state.collect()
    for warning in node_warnings(snapshot.node, state.node is not None, guessed=guessed, live=live):
        log.warning("%s", warning)
    return snapshot


async def _render(config: ProxyConfig, source: Source, fmt: str, *, guessed: bool) -> int:
    snapshot = await _snapshot(config, source, guessed=guessed)
    if fmt == "json" and config.mode != ProxyMode.KERNELSPACE:  # its render is JSON
        sys.stdout.write(json.dumps(describe_node(config.planning, snapshot), indent=2) + "\n")
    else:
        backend = create_backend(config)
        try:
            sys.stdout.write(backend.render(snapshot))
        finally:
            backend.stop()  # ipvs mode's netlink sockets
    return 0


def cleanup_other_modes(
    mode: ProxyMode, *, ebpf_pin_path: str | None = None, keep: KeepMap | None = None
) -> None:
    """As upstream's platformCleanup: when a node switches proxy modes, the rules the
    other modes left behind would still catch traffic, so they go (not those of a mode
    this one runs inside itself, nor ``keep``: this mode's chains under names the other
    mode shares). Upstream does it at start; the proxy calls this after its own first
    successful sync, so a switch never leaves the node without Service rules."""
    running = {mode, *COMPOSES.get(mode, ())}
    others = {
        m: fn
        for m, fn in cleanups(ebpf_pin_path=ebpf_pin_path, keep=keep).items()
        if m not in running
    }
    try:
        removed = cleanup_all(others)
    except BackendError as err:
        log.error("Cleaning up other proxy modes' rules failed: %s", bounded(str(err)))
        return
    if removed:
        log.info("Removed what other proxy modes left: %s", removal_summary(removed))


async def _run(
    cfg: KubeProxyConfiguration,
    config: ProxyConfig,
    source: Source,
    once: bool,
    metrics: Metrics,
) -> int:
    stop = asyncio.Event()
    if not once:
        install_signal_handlers(stop)
    # As upstream's Run: first thing, and a failure (not permitted) does not stop us.
    if cfg.oom_score_adj is not None:
        apply_oom_score_adj(cfg.oom_score_adj)
    # Each setting that cannot be applied (e.g. read-only in a network namespace) is
    # logged by apply_conntrack_sysctls; none of them stops the proxy, as upstream.
    apply_conntrack_sysctls(
        conntrack_settings(cfg.conntrack), proc_root=HOST_PROC, sys_root=HOST_SYS
    )
    return await _start(cfg, config, source, once, metrics, stop=stop)


async def _start(
    cfg: KubeProxyConfiguration,
    config: ProxyConfig,
    source: Source,
    once: bool,
    metrics: Metrics,
    *,
    stop: asyncio.Event,
) -> int:
    if config.enable_profiling and not once:
        # From the start, so /debug/pprof/heap sees every allocation still alive.
        start_heap_tracing()
    configz = {k: v for k, v in to_dict(cfg).items() if k not in ("apiVersion", "kind")}
    backend = create_backend(config)
    proxy = Proxy(
        config,
        backend,
        conntrack=ConntrackCommand() if config.mode != ProxyMode.KERNELSPACE else None,
        metrics=metrics,
        configz=configz,
    )
    log.info(
        "Starting kubeproxy: mode=%s node=%s families=%s source=%s",
        config.mode,
        config.hostname,
        ",".join(f.value for f in config.families),
        type(source).__name__,
    )
    try:
        return await proxy.run(
            source,
            stop,
            once=once,
            after_first_sync=lambda: cleanup_other_modes(
                config.mode, ebpf_pin_path=config.ebpf_pin_path, keep=owned_by(backend)
            ),
        )
    except BackendError as err:
        log.error("%s", err)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    verbosity = getattr(args, "kp_v", None)
    # Until the configuration is loaded: the flags' format, so a JSON log stays JSON.
    fmt = getattr(args, "kp_logging_format", None)
    logs.setup(
        int(verbosity) if verbosity is not None else getattr(args, "v", 0) or 0,
        fmt=fmt if fmt in logs.FORMATS else "text",
    )
    if args.command == "cleanup" or getattr(args, "cleanup", False):
        return _cleanup(getattr(args, "ebpf_pin_path", None))
    live = args.command in ("explain", "list") and args.live
    try:
        cfg = load_configuration(args, blank_mode=_running_mode(args) if live else None)
        logs.setup(
            cfg.logging.verbosity,
            fmt=cfg.logging.format,
            vmodule=[(i.file_pattern, i.verbosity) for i in cfg.logging.vmodule or ()],
        )
        if getattr(args, "write_config_to", None) is not None:
            args.write_config_to.write_text(to_yaml(cfg))
            log.info("Wrote the effective configuration to %s", args.write_config_to)
            return 0
        config = proxy_config(cfg, args)
        metrics = Metrics(config.mode, features=feature_states(cfg), families=config.families)
        source = make_source(cfg, config, args, observe=metrics.api_request)
    except ConfigError as err:
        # As upstream: the error (every problem at once), no usage banner, exit 1.
        sys.stderr.write(f"Error: {err}\n")
        return 1
    # Query commands look at one node: the one named, or (as kube-proxy) this machine.
    guessed = not cfg.hostname_override.strip()
    if args.command == "render":
        try:
            if args.objects:
                if args.format == "nft":
                    raise ConfigError("--objects: --format must be yaml or json")
                return _render_objects(source, args.format or "yaml")
            if args.format == "yaml":
                raise ConfigError("--format yaml: only with --objects")
        except ConfigError as err:
            parser.error(str(err))
        try:
            return asyncio.run(_render(config, source, args.format or "nft", guessed=guessed))
        except (SourceError, BackendError) as err:
            return _source_failed(err)
    if args.command in ("explain", "list"):
        try:
            snapshot = asyncio.run(
                _snapshot(config, source, guessed=guessed, live=getattr(args, "live", False))
            )
            if args.command == "list":
                return run_list(config, snapshot, args)
            return run_explain(config, snapshot, args)
        except ConfigError as err:
            parser.error(str(err))
        except SourceError as err:
            return _source_failed(err)
    if getattr(args, "init_only", False):
        return _init_only(cfg, config)
    try:
        return asyncio.run(_run(cfg, config, source, args.once, metrics))
    except ServerBindError as err:
        # bindAddressHardFail: as upstream, the proxy exits non-zero.
        log.error("Error running ProxyServer: %s", err)
        return 1
    except SourceError as err:  # run --once only: run itself never gives up
        return _source_failed(err)


def _running_mode(
    args: argparse.Namespace,
) -> Callable[[KubeProxyConfiguration], str]:
    """``--live`` without a proxy mode: the mode running on this node, said on stderr."""

    def find(cfg: KubeProxyConfiguration) -> str:
        from kubeproxy.explain.running import running_mode

        pin = Path(getattr(args, "ebpf_pin_path", None) or ProxyConfig.ebpf_pin_path)
        found = running_mode(cfg.metrics_bind_address, pin)
        log.info("Proxy mode %s: %s (--proxy-mode chooses another)", found.mode, found.how)
        return found.mode

    return find


def _source_failed(err: SourceError | BackendError) -> int:
    """A one-shot command without the source's state, or whose mode cannot run: exit 1."""
    sys.stderr.write(f"Error: {err}\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
