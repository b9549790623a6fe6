"""Command line: ``kubeproxy run | render | cleanup``, flags named as upstream kube-proxy's.

Argument parsing and turning flags into a :class:`~kubeproxy.config.ProxyConfig` only;
the work happens in :mod:`kubeproxy.app` and the backends.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import sys
from pathlib import Path

from kubeproxy import logs
from kubeproxy.app import Proxy, install_signal_handlers
from kubeproxy.backends import BACKENDS, create_backend
from kubeproxy.config import (
    ConfigError,
    ProxyConfig,
    default_hostname,
    detect_families,
    parse_cidrs,
)
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.sources.events import dispatch
from kubeproxy.sources.manifests import ManifestSource

log = logging.getLogger("kubeproxy")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "t"):
        return True
    if value in ("false", "0", "no", "f"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}")


def _add_proxy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--proxy-mode",
        default="nftables",
        help=f"which proxy mode to use: {', '.join(BACKENDS)} (default nftables)",
    )
    p.add_argument(
        "--hostname-override",
        default="",
        help="the name of this node (default: the OS hostname, lower-cased)",
    )
    p.add_argument(
        "--cluster-cidr",
        default="",
        help="the Pod CIDR range(s), comma-separated (one per IP family); traffic "
        "to a ClusterIP from outside it is masqueraded",
    )
    p.add_argument(
        "--nodeport-addresses",
        action="append",
        default=[],
        help="CIDRs and/or 'primary' whose local addresses accept NodePort "
        "traffic (default: primary)",
    )
    p.add_argument(
        "--service-cluster-ip-range",
        action="append",
        default=[],
        help="ClusterIP range(s), one per IP family (repeat or comma-separate for dual "
        "stack): unallocated addresses in them are dropped, unused ports of allocated "
        "ClusterIPs rejected",
    )
    p.add_argument(
        "--masquerade-all",
        nargs="?",
        const=True,
        default=False,
        type=_bool,
        help="SNAT all traffic sent via Service cluster IPs",
    )
    p.add_argument(
        "--bind-address",
        default="0.0.0.0",
        help="a specific IP here is taken as the node's primary IP of its family",
    )
    p.add_argument(
        "--manifests",
        type=Path,
        required=True,
        help="directory of Service, EndpointSlice and Node manifests (YAML/JSON)",
    )


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--v",
        "-v",
        type=int,
        default=0,
        metavar="N",
        help="log verbosity (as kube-proxy: 2 = per-sync detail, 4 = debug)",
    )
    parser = argparse.ArgumentParser(
        prog="kubeproxy",
        parents=[common],
        description="A Python reimplementation of Kubernetes kube-proxy.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", parents=[common], help="run the proxy until SIGTERM")
    _add_proxy_flags(run)
    run.add_argument("--once", action="store_true", help="sync once and exit")
    run.add_argument(
        "--cleanup",
        action="store_true",
        help="remove everything kubeproxy created and exit (as kube-proxy)",
    )

    render = sub.add_parser(
        "render", parents=[common], help="print the nft script 'run' would apply; touches nothing"
    )
    _add_proxy_flags(render)

    sub.add_parser(
        "cleanup", parents=[common], help="remove everything kubeproxy created, and nothing else"
    )
    return parser


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    try:
        nodeports = NodePortAddresses.parse(args.nodeport_addresses)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        ipaddress.ip_address(args.bind_address)
    except ValueError:
        raise ConfigError(f"--bind-address: invalid IP {args.bind_address!r}") from None
    mode = args.proxy_mode or "nftables"
    if mode not in BACKENDS:
        raise ConfigError(
            f"--proxy-mode: unsupported mode {mode!r} (supported: {', '.join(BACKENDS)})"
        )
    return ProxyConfig(
        hostname=(args.hostname_override.strip().lower() or default_hostname()),
        mode=mode,
        cluster_cidrs=parse_cidrs(args.cluster_cidr, "--cluster-cidr"),
        service_cidrs=parse_cidrs(
            ",".join(args.service_cluster_ip_range), "--service-cluster-ip-range"
        ),
        nodeport_addresses=nodeports,
        masquerade_all=args.masquerade_all,
        bind_address=args.bind_address,
        families=detect_families(),
    )


def _cleanup() -> int:
    from kubeproxy.backends.nftables.proxier import NftablesBackend
    from kubeproxy.dataplane.nft import NftCommand, NftError

    backend = NftablesBackend(ProxyConfig(hostname=default_hostname()), NftCommand())
    try:
        removed = backend.cleanup()
    except NftError as err:
        log.error("Cleanup failed: %s", err)
        return 1
    log.info("Removed %s", ", ".join(removed) if removed else "nothing (no kubeproxy tables)")
    return 0


def _render(config: ProxyConfig, directory: Path) -> int:
    backend = create_backend(config)
    proxy = Proxy(config, backend)
    dispatch(proxy.state, ManifestSource(directory).reload())
    snapshot, _ = proxy.state.collect()
    sys.stdout.write(backend.render(snapshot))
    return 0


async def _run(config: ProxyConfig, directory: Path, once: bool) -> int:
    stop = asyncio.Event()
    if not once:
        install_signal_handlers(stop)
    proxy = Proxy(config, create_backend(config))
    log.info(
        "Starting kubeproxy: mode=%s node=%s families=%s manifests=%s",
        config.mode,
        config.hostname,
        ",".join(f.value for f in config.families),
        directory,
    )
    return await proxy.run(ManifestSource(directory), stop, once=once)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.setup(args.v)
    if args.command == "cleanup" or getattr(args, "cleanup", False):
        return _cleanup()
    try:
        config = config_from_args(args)
    except ConfigError as err:
        parser.error(str(err))
    if not args.manifests.is_dir():
        parser.error(f"--manifests: {args.manifests} is not a directory")
    if args.command == "render":
        return _render(config, args.manifests)
    return asyncio.run(_run(config, args.manifests, args.once))


if __name__ == "__main__":
    sys.exit(main())
