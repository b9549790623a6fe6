"""The ``explain`` and ``list`` subcommands: their own arguments, and running them on a
snapshot (:mod:`kubeproxy.cli` adds ``run``'s flags, loads the configuration and the
snapshot). What they print is :mod:`.output`'s and :mod:`.listing`'s; the work is
:mod:`.command`'s, imported when a command runs: ``run`` does not need it (about 0.1 s
of its start).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from typing import TYPE_CHECKING

from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ConfigError, ProxyConfig
from kubeproxy.model.fate import Origin, Packet
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import L4Protocol

if TYPE_CHECKING:  # argparse's subparsers action: private, and generic only when checked
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_explain_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    explain = sub.add_parser(
        "explain",
        help="why a packet goes where: the Service, endpoints, masquerade, DROP/REJECT, "
        "and the kernel objects; touches nothing",
    )
    explain.add_argument("--src", required=True, help="the packet's source IP")
    explain.add_argument("--dst", required=True, help="the packet's destination IP")
    explain.add_argument("--port", required=True, type=int, help="the destination port")
    explain.add_argument(
        "--protocol", type=str.upper, choices=[p.value for p in L4Protocol], default="TCP"
    )
    explain.add_argument(
        "--origin",
        choices=[o.value for o in Origin],
        help="where the packet comes from (default: inferred from --src as the rules "
        "classify it: a local Pod by --detect-local-mode, this node by its addresses)",
    )
    explain.add_argument(
        "--in-interface",
        help="the interface the packet arrives on (for --detect-local-mode "
        "BridgeInterface / InterfaceNamePrefix)",
    )
    explain.add_argument(
        "--live",
        action="store_true",
        help="also read this node's addresses and the kernel's rules, and report drift; "
        "without --proxy-mode, in the mode running here (the running proxy's /proxyMode, "
        "else the rules the kernel holds)",
    )
    explain.add_argument("-o", "--output", choices=("text", "json"), default="text")

    return explain


def add_list_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    listing = sub.add_parser(
        "list", help="every frontend (ClusterIP, NodePort, external, LB) and its endpoints"
    )
    listing.add_argument(
        "-o",
        "--output",
        choices=("text", "wide", "json"),
        default="text",
        help="wide and json name every endpoint: address, node, zone, ready / serving / "
        "terminating, on this node or not, used by the frontend or not",
    )
    listing.add_argument(
        "-n",
        "--namespace",
        help="only Services in this namespace (default: every namespace)",
    )
    listing.add_argument(
        "names", nargs="*", metavar="NAME", help="only the Services of these names"
    )
    listing.add_argument(
        "--live",
        action="store_true",
        help="also read what this node's kernel holds for every frontend and mark drift "
        "(without --proxy-mode, in the mode running here, as explain --live); without -n "
        "or names, also the rules no Service explains; exit status 1 on any drift",
    )
    return listing


def packet_of(args: argparse.Namespace) -> Packet:
    try:
        src, dst = (str(ipaddress.ip_address(a)) for a in (args.src, args.dst))
    except ValueError as err:
        raise ConfigError(f"--src/--dst: {err}") from None
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port: {args.port} is not a port number")
    return Packet(src, dst, args.port, L4Protocol(args.protocol), args.in_interface)


def run_explain(config: ProxyConfig, snapshot: Snapshot, args: argparse.Namespace) -> int:
    # Imported here: `run` does not need them (about 0.1 s of its start).
    from kubeproxy.explain import output
    from kubeproxy.explain.command import explain_packet

    origin = Origin(args.origin) if args.origin else None
    done = explain_packet(config, snapshot, packet_of(args), origin=origin, live_check=args.live)
    if args.output == "json":
        data = output.as_dict(done.result, done.objects, done.drift)
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        sys.stdout.write(output.as_text(done.result, done.objects, done.drift))
    return 1 if done.drift else 0


def run_list(config: ProxyConfig, snapshot: Snapshot, args: argparse.Namespace) -> int:
    from kubeproxy.explain import listing
    from kubeproxy.explain.command import list_frontends

    fmt = args.output
    if not args.live:
        listed = list_frontends(config, snapshot, args.namespace, args.names)
        if fmt == "json":
            sys.stdout.write(json.dumps([r.as_dict() for r in listed], indent=2) + "\n")
        else:
            sys.stdout.write(listing.table(listed, wide=fmt == "wide"))
        return 0
    from kubeproxy.explain.command import list_live, proxy_mode

    listed, kernel_only = list_live(config, snapshot, args.namespace, args.names)
    mode = proxy_mode(config) if config.mode != ProxyMode.EBPF else "ebpf"
    if fmt == "json":
        data = {
            "mode": mode,
            "frontends": [r.as_dict() for r in listed],
            "kernelOnly": kernel_only,
        }
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        sys.stdout.write(listing.table(listed, wide=fmt == "wide"))
        sys.stdout.write(listing.drift_report(listed, kernel_only, mode))
    return 1 if kernel_only or any(r.drift for r in listed) else 0
