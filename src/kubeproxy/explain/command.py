"""``kubeproxy explain`` and ``kubeproxy list`` on a snapshot: the glue around the pure core.

The caller (:mod:`kubeproxy.cli`) loads the snapshot from the same source ``run`` would
use; here the configuration and the snapshot become the same plans a sync programs
(:func:`~kubeproxy.backends.planning.family_plans`,
:func:`~kubeproxy.backends.planning.service_port_plans`), which the pure modules explain
or list. ``--live`` is the only side effect: it reads the node's addresses and the
kernel's objects (:mod:`kubeproxy.explain.live`; in ebpf mode also the pinned map of
the socket hooks, :mod:`kubeproxy.explain.socket_hooks`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path

from kubeproxy.backends.ipvs.names import DUMMY_DEVICE
from kubeproxy.backends.planning import family_plans, service_port_plans
from kubeproxy.config import ConfigError, ProxyConfig
from kubeproxy.dataplane.bpf.socklb import pinned_entry, unlinked_hooks
from kubeproxy.dataplane.ipset import IpsetError
from kubeproxy.dataplane.iptables.runner import IptablesCommand, detect_flavor
from kubeproxy.dataplane.ipvs import IpvsError
from kubeproxy.dataplane.process import ToolError
from kubeproxy.explain import live, socket_hooks
from kubeproxy.explain.listing import Row, rows, select
from kubeproxy.explain.objects import KernelObject, kernel_objects
from kubeproxy.explain.packet import (
    Explanation,
    NodeAddresses,
    Origin,
    Outcome,
    Packet,
    explain,
)
from kubeproxy.model.plan import FamilyPlan, ServicePortPlan
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import IPFamily


@dataclass(frozen=True, slots=True)
class Explained:
    result: Explanation
    objects: tuple[KernelObject, ...]
    drift: list[str] | None  # None unless --live


def _family(config: ProxyConfig, snapshot: Snapshot, family: IPFamily) -> FamilyPlan:
    # Any family can be explained offline, whether or not this machine has it.
    return family_plans(replace(config, families=(family,)), snapshot)[0]


def _plans(snapshot: Snapshot, fam: FamilyPlan) -> list[ServicePortPlan]:
    return [p for _, p in sorted(service_port_plans(snapshot, fam).items()) if p is not None]


def proxy_mode(config: ProxyConfig) -> str:
    """Whose rules the packet walk models (ebpf mode: nftables', then its hooks)."""
    return config.mode if config.mode in ("iptables", "ipvs") else "nftables"


def explain_packet(
    config: ProxyConfig,
    snapshot: Snapshot,
    packet: Packet,
    *,
    origin: Origin | None = None,
    live_check: bool = False,
) -> Explained:
    fam = _family(config, snapshot, packet.family)
    known = frozenset(ip for ip in snapshot.node.primary_ips.values())
    node = NodeAddresses(known)
    mode = proxy_mode(config)
    if live_check:
        # ipvs mode's kube-ipvs0 holds Service addresses, not the node's.
        skip = DUMMY_DEVICE if mode == "ipvs" else None
        try:
            node = NodeAddresses(known | live.node_addresses(skip=skip), complete=True)
        except (ToolError, ValueError) as err:
            raise ConfigError(f"--live: cannot read this node's addresses: {err}") from None
    scheduler = config.ipvs.scheduler
    try:
        result = explain(
            packet, fam, _plans(snapshot, fam), snapshot.endpoints, mode=mode, node=node,
            origin=origin, scheduler=scheduler,
        )  # fmt: skip
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if config.mode == "ebpf":
        result = socket_hooks.through_hooks(result, fam, snapshot.endpoints)
    hooks = result.verdict is Outcome.SOCKET_LB
    objects = (
        socket_hooks.socket_objects(result) if hooks else kernel_objects(result, fam, scheduler)
    )
    drift: list[str] | None = None
    if live_check:
        drift = [] if hooks else _drift(config, result, fam, objects)
        if config.mode == "ebpf" and (hooks or result.origin is not Origin.OUTSIDE):
            drift += _socket_drift(config, result)
    return Explained(result, objects, drift)


def _socket_drift(config: ProxyConfig, result: Explanation) -> list[str]:
    """ebpf mode: the pinned map's entry for the frontend against the plan's (none
    expected when the hooks leave the frontend to nftables)."""
    key = socket_hooks.socket_frontend(result)
    if key is None:
        return []
    pin_dir = Path(config.ebpf_pin_path)
    try:
        have = pinned_entry(pin_dir, key)
    except OSError as err:
        return [f"cannot read the socket hooks' map under {pin_dir}: {err}"]
    return socket_hooks.socket_drift(result, have, unlinked_hooks(pin_dir))


def _drift(
    config: ProxyConfig, result: Explanation, fam: FamilyPlan, objects: tuple[KernelObject, ...]
) -> list[str]:
    try:
        if proxy_mode(config) == "ipvs":
            return live.ipvs_drift(objects, live.read_ipvs(objects))
        if proxy_mode(config) == "nftables":
            chains, elements = live.read_nft(result, fam, objects)
            if not chains:
                return [f"no table {fam.family.value} kube-proxy: kubeproxy has not synced here"]
            return live.nft_drift(result, fam, objects, chains, elements)
        flavor = config.iptables_backend
        chosen = (
            detect_flavor() if flavor == "auto" else ("legacy" if flavor == "legacy" else "nft")
        )
        save = IptablesCommand(fam.family, chosen).save("nat")
        return live.iptables_drift(result, objects, save)
    except (ToolError, RuntimeError, IpvsError, IpsetError) as err:
        return [f"cannot read the kernel's rules: {err}"]


def node_warnings(
    node: NodeState, has_object: bool, *, guessed: bool, live: bool = False
) -> list[str]:
    """What the answer assumes about the node, when the source could not say (pure).

    ``has_object``: the source has a Node named ``node.name``; ``guessed``: that name is
    this machine's hostname, not ``--hostname-override``; ``live``: the node's addresses
    come from the kernel (``--live``) rather than the Node object."""
    out: list[str] = []
    if guessed:
        out.append(
            f"No --hostname-override (hostnameOverride): this machine's hostname "
            f"{node.name!r} is taken as the node's name, as kube-proxy does; give the "
            "name of the node to look at"
        )
    if not has_object:
        out.append(
            f"No Node object named {node.name!r}: its addresses, zone and podCIDRs are "
            + (
                "unknown (the addresses are read from this machine: --live)"
                if live
                else "unknown: 'this node' is loopback only, NodePorts on its addresses "
                "and topology hints are judged without them"
            )
        )
    elif not node.primary_ips and not live:
        out.append(
            f"Node {node.name!r} has no InternalIP or ExternalIP address: 'this node' is "
            "loopback only and its NodePort addresses are not known"
        )
    return out


def list_frontends(
    config: ProxyConfig,
    snapshot: Snapshot,
    namespace: str | None = None,
    names: Collection[str] = (),
) -> list[Row]:
    """Every frontend's row, of the Services in ``namespace`` named ``names`` (see
    :func:`~kubeproxy.explain.listing.select`)."""
    out: list[Row] = []
    for fam in family_plans(config, snapshot):
        plans = select(_plans(snapshot, fam), namespace, names)
        out.extend(rows(plans, snapshot.endpoints, snapshot.node.name))
    return out
