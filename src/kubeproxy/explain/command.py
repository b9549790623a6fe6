"""``kubeproxy explain`` and ``kubeproxy list`` on a snapshot: the glue around the pure core.

The caller (:mod:`kubeproxy.cli`) loads the snapshot from the same source ``run`` would
use; here the configuration and the snapshot become the same plans a sync programs
(:func:`~kubeproxy.model.planning.family_plans`,
:func:`~kubeproxy.model.planning.service_port_plans`), which the pure modules explain
or list. ``--live`` is the only side effect: it reads the node's addresses and the
kernel's objects, through the mode's own
:class:`~kubeproxy.backends.inspection.Inspector` (in ebpf mode also the pinned map of
the socket hooks, :mod:`kubeproxy.backends.ebpf.inspect`).

``list --live`` (:func:`list_live`) checks every frontend the way ``explain --live``
checks one packet's: each frontend is explained for a new connection from outside
(:func:`~kubeproxy.explain.packet.explain_frontend`; ipvs mode: on each NodePort
address; ebpf mode: also from this node, through the socket hooks: the inspector's
``frontend_addresses`` and ``origins``), its kernel objects
computed by the same renderers and compared with the same pure functions, the kernel
read once for all of them (one :class:`~kubeproxy.backends.inspection.LiveKernel`).
Unfiltered, it also reports what the kernel holds that no frontend explains.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from kubeproxy.backends.inspection import Inspector, KernelObject, LiveKernel, node_addresses
from kubeproxy.backends.registry import inspector, node_inspector
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ConfigError, ProxyConfig
from kubeproxy.dataplane.process import ToolError
from kubeproxy.explain.listing import Row, row, rows, select, sort_key
from kubeproxy.explain.packet import explain, explain_frontend
from kubeproxy.model.fate import Explanation, NodeAddresses, Origin, Packet
from kubeproxy.model.plan import FamilyPlan, FrontendKind, ServicePortPlan
from kubeproxy.model.planning import family_plans, service_port_plans
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import IPFamily


@dataclass(frozen=True, slots=True)
class Explained:
    result: Explanation
    objects: tuple[KernelObject, ...]
    drift: list[str] | None  # None unless --live


def _family(config: ProxyConfig, snapshot: Snapshot, family: IPFamily) -> FamilyPlan:
    # Any family can be explained offline, whether or not this machine has it.
    return family_plans(replace(config, families=(family,)).planning, snapshot)[0]


def _plans(snapshot: Snapshot, fam: FamilyPlan) -> list[ServicePortPlan]:
    return [p for _, p in sorted(service_port_plans(snapshot, fam).items()) if p is not None]


_OWN_WALK = (ProxyMode.IPTABLES, ProxyMode.IPVS, ProxyMode.KERNELSPACE)


def proxy_mode(config: ProxyConfig) -> str:
    """Whose rules the packet walk models (ebpf mode: nftables', then its hooks)."""
    return config.mode if config.mode in _OWN_WALK else "nftables"


def _live(config: ProxyConfig, *, whole: bool = False) -> LiveKernel:
    return LiveKernel(config.iptables_backend, whole=whole)


def _node_addresses(kernel: LiveKernel, mode: Inspector) -> frozenset[str]:
    try:
        return node_addresses(kernel.read, skip=mode.service_address_link)
    except (ToolError, ValueError) as err:
        raise ConfigError(f"--live: cannot read this node's addresses: {err}") from None


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
    rules = node_inspector(config.mode, config, live=live_check)
    kernel = _live(config)
    if live_check:
        node = NodeAddresses(known | _node_addresses(kernel, rules), complete=True)
    scheduler = config.ipvs.scheduler
    try:
        result = explain(
            packet, fam, _plans(snapshot, fam), snapshot.endpoints, mode=mode, node=node,
            origin=origin, scheduler=scheduler, rules=rules.rules,
        )  # fmt: skip
    except ValueError as err:
        raise ConfigError(str(err)) from None
    result = rules.before_rules(result, fam, snapshot.endpoints)
    objects = rules.kernel_objects(result, fam, scheduler)
    drift = _drift(rules, result, fam, objects, kernel) if live_check else None
    return Explained(result, objects, drift)


def _drift(
    mode: Inspector,
    result: Explanation,
    fam: FamilyPlan,
    objects: tuple[KernelObject, ...],
    kernel: LiveKernel,
) -> list[str]:
    try:
        return mode.drift(result, fam, objects, kernel)
    except RuntimeError as err:  # every dataplane tool's error is one
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


def list_live(
    config: ProxyConfig,
    snapshot: Snapshot,
    namespace: str | None = None,
    names: Collection[str] = (),
) -> tuple[list[Row], list[str]]:
    """Every (selected) frontend's row with its drift, and, when nothing is filtered out,
    what the kernel holds that no frontend explains (see the module docstring)."""
    mode = node_inspector(config.mode, config, live=True)
    scheduler = config.ipvs.scheduler
    kernel = _live(config, whole=True)
    addresses: frozenset[str] = frozenset()
    if mode.service_address_link is not None:
        # Its frontends' addresses are on a link of their own, and its NodePorts are
        # programmed per node address (ipvs mode).
        addresses = _node_addresses(kernel, mode)
    whole = namespace is None and not names
    out: list[tuple[FrontendKind, Row]] = []
    expected: list[KernelObject] = []
    families: list[tuple[FamilyPlan, list[ServicePortPlan]]] = []
    for fam in family_plans(config.planning, snapshot):
        plans = select(_plans(snapshot, fam), namespace, names)
        families.append((fam, plans))
        for plan in plans:
            for frontend in plan.frontends:
                drift: list[str] = []
                for origin in mode.origins(frontend):
                    for node_ip in mode.frontend_addresses(fam, frontend, addresses):
                        result = explain_frontend(
                            plan, frontend, fam, snapshot.endpoints, mode=mode.rules.mode,
                            origin=origin, node_ip=node_ip, scheduler=scheduler,
                            rules=mode.rules,
                        )  # fmt: skip
                        result = mode.before_rules(result, fam, snapshot.endpoints)
                        objects = mode.kernel_objects(result, fam, scheduler)
                        expected.extend(objects)
                        drift += _drift(mode, result, fam, objects, kernel)
                # One line per difference, however many origins found it.
                drift = list(dict.fromkeys(drift))
                r = row(
                    plan, frontend, snapshot.endpoints, snapshot.node.name,
                    untouched=mode.rules.load_balancers is not None,
                )  # fmt: skip
                out.append((frontend.kind, replace(r, drift=tuple(drift))))
    kernel_only: list[str] = []
    if whole:
        try:
            kernel_only = mode.kernel_only(families, expected, kernel)
        except RuntimeError as err:
            kernel_only = [f"cannot read the kernel's rules: {err}"]
    out.sort(key=lambda r: sort_key(*r))
    return [r for _, r in out], kernel_only


def list_frontends(
    config: ProxyConfig,
    snapshot: Snapshot,
    namespace: str | None = None,
    names: Collection[str] = (),
) -> list[Row]:
    """Every frontend's row, of the Services in ``namespace`` named ``names`` (see
    :func:`~kubeproxy.explain.listing.select`)."""
    out: list[Row] = []
    # A mode of load balancers (kernelspace) makes none for a frontend without endpoints.
    untouched = inspector(proxy_mode(config)).rules.load_balancers is not None
    for fam in family_plans(config.planning, snapshot):
        plans = select(_plans(snapshot, fam), namespace, names)
        out.extend(rows(plans, snapshot.endpoints, snapshot.node.name, untouched=untouched))
    return out
