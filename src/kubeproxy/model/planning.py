"""The planning phase every backend shares: planning settings + snapshot → the node's plan.

:class:`PlanSettings` is the part of the configuration planning reads (the composition
root derives it from the proxy configuration, once: ``ProxyConfig.planning``), so the
model never sees the configuration schema. :func:`plan_node` builds a sync's
:class:`NodePlan`: the node-level plan of each IP family the proxy serves
(:func:`kubeproxy.model.plan.plan_family`) and, on demand, the plans of the ServicePorts
the sync needs (ebpf mode hands the same plan to the nftables backend it runs). Backends
translate the plan; ``explain`` and ``list`` read the same one; ``render --format json``
prints it (:func:`describe_node`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.plan import (
    DEFAULT_MASQUERADE_MARK,
    DetectLocal,
    FamilyPlan,
    ServicePortPlan,
    describe,
    describe_family,
    plan_family,
    plan_service_ports,
)
from kubeproxy.model.state import Snapshot
from kubeproxy.model.topology import FeatureFlags
from kubeproxy.model.types import IPFamily, ServicePortName

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanSettings:
    """What planning needs from the configuration (every field a policy input)."""

    families: tuple[IPFamily, ...] = (IPFamily.IPv4,)
    nodeport_addresses: NodePortAddresses = field(default_factory=NodePortAddresses)
    detect_local: DetectLocal = field(default_factory=DetectLocal)
    cluster_cidrs: tuple[str, ...] = ()
    service_cidrs: tuple[str, ...] = ()
    masquerade_all: bool = False
    masquerade_mark: int = DEFAULT_MASQUERADE_MARK
    features: FeatureFlags = field(default_factory=FeatureFlags)
    # NodePorts on 127.0.0.1 may be wanted (iptables mode's iptables.localhostNodePorts);
    # the plan grants them only where --nodeport-addresses admits loopback.
    localhost_nodeports: bool = False
    # The mode, for ``render --format json`` only: planning never depends on it.
    mode: str = ""

    @property
    def route_localnet(self) -> bool:
        """Whether the node needs ``net.ipv4.conf.all.route_localnet=1``: IPv4 NodePorts
        on 127.0.0.1 are in the plan (upstream sets it only then)."""
        return IPFamily.IPv4 in self.families and self.nodeport_addresses.serves_localhost(
            IPFamily.IPv4, self.localhost_nodeports
        )


# The node-level inputs rarely change between syncs, and planning them (CIDR parsing and
# merging) was two thirds of a one-ServicePort partial sync's planning at 10,000
# Services (bench.ebpf's change-to-effect): pure, so remembered by its arguments.
_plan_family = functools.lru_cache(maxsize=16)(plan_family)


def family_plans(
    settings: PlanSettings, snapshot: Snapshot, warned: set[IPFamily] | None = None
) -> list[FamilyPlan]:
    """The node-level plan of each family; ``warned`` remembers one-time warnings."""
    node = snapshot.node
    plans = []
    for family in settings.families:
        primary = node.primary_ips.get(family)
        if (
            warned is not None
            and family not in warned
            and settings.nodeport_addresses.primary
            and primary is None
            and settings.nodeport_addresses.for_family(family, None).match_all
            and _has_node_ports(snapshot, family)
        ):
            warned.add(family)
            log.warning(
                "No %s primary IP known for node %s (no Node object with an InternalIP or "
                "ExternalIP, and no --bind-address): NodePorts are accepted on every local "
                "address of that family, as upstream kube-proxy does",
                family.value,
                node.name,
            )
        plans.append(
            _plan_family(
                family,
                node=node.topology,
                primary_ip=primary,
                nodeport_addresses=settings.nodeport_addresses,
                detect_local=settings.detect_local,
                cluster_cidrs=settings.cluster_cidrs,
                node_pod_cidrs=node.pod_cidrs,
                service_cidrs=(*settings.service_cidrs, *snapshot.service_cidrs),
                masquerade_all=settings.masquerade_all,
                masquerade_mark=settings.masquerade_mark,
                flags=settings.features,
                localhost_nodeports=settings.localhost_nodeports,
            )
        )
    return plans


def service_port_plans(
    snapshot: Snapshot, fam: FamilyPlan, names: Iterable[ServicePortName] | None = None
) -> dict[ServicePortName, ServicePortPlan | None]:
    return plan_service_ports(snapshot.services, snapshot.endpoints, fam, names)


@dataclass
class NodePlan:
    """One sync's plan of this node: built once, read by every backend of the sync.

    ``families`` holds the node-level plan of each family served; :meth:`service_ports`
    plans ServicePorts when asked, and remembers those of a partial sync for the rest of
    the sync (ebpf mode and the nftables backend it runs plan each changed ServicePort
    once)."""

    snapshot: Snapshot
    families: tuple[FamilyPlan, ...]
    _ports: dict[IPFamily, dict[ServicePortName, ServicePortPlan | None]] = field(
        default_factory=dict, repr=False
    )

    def service_ports(
        self, fam: FamilyPlan, names: Iterable[ServicePortName] | None = None
    ) -> dict[ServicePortName, ServicePortPlan | None]:
        """The plans of ``names`` (every ServicePort when None; None for a name that
        no longer exists or has nothing in this family)."""
        if names is None:
            # Not remembered: a full sync's plans would then all live until the sync
            # ends, beside what the backend builds from them (+5 MB at 10,000 Services).
            return service_port_plans(self.snapshot, fam)
        known = self._ports.setdefault(fam.family, {})
        wanted = list(names)
        missing = [n for n in wanted if n not in known]
        if missing:
            known.update(service_port_plans(self.snapshot, fam, missing))
        return {n: known[n] for n in wanted}


def plan_node(
    settings: PlanSettings, snapshot: Snapshot, warned: set[IPFamily] | None = None
) -> NodePlan:
    return NodePlan(snapshot, tuple(family_plans(settings, snapshot, warned)))


def describe_node(settings: PlanSettings, snapshot: Snapshot) -> dict[str, Any]:
    """The whole plan as JSON-ready data (``render --format json``)."""
    plan = plan_node(settings, snapshot)
    ports: list[dict[str, Any]] = []
    for fam in plan.families:
        plans = plan.service_ports(fam)
        ports.extend(describe(p) for _, p in sorted(plans.items()) if p is not None)
    return {
        "mode": settings.mode,
        "families": [describe_family(f) for f in plan.families],
        "servicePorts": ports,
    }


def _has_node_ports(snapshot: Snapshot, family: IPFamily) -> bool:
    return any(svc.node_port and svc.cluster_ip(family) for svc in snapshot.services.values())
