"""The planning phase every backend shares: configuration + snapshot → service plans.

:func:`family_plans` resolves the node-level part of the plan for each IP family the
proxy serves (:func:`kubeproxy.model.plan.plan_family` with this configuration and this
node's state); :func:`service_port_plans` plans the ServicePorts a sync needs. Backends
translate the result; ``render --format json`` prints it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any

from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.model.plan import (
    FamilyPlan,
    ServicePortPlan,
    describe,
    describe_family,
    plan_family,
    plan_service_ports,
)
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import IPFamily, ServicePortName

log = logging.getLogger(__name__)

# The node-level inputs rarely change between syncs, and planning them (CIDR parsing and
# merging) was two thirds of a one-ServicePort partial sync's planning at 10,000
# Services (bench.ebpf's change-to-effect): pure, so remembered by its arguments.
_plan_family = functools.lru_cache(maxsize=16)(plan_family)


def family_plans(
    config: ProxyConfig, snapshot: Snapshot, warned: set[IPFamily] | None = None
) -> list[FamilyPlan]:
    """The node-level plan of each family; ``warned`` remembers one-time warnings."""
    node = snapshot.node
    plans = []
    for family in config.families:
        primary = node.primary_ips.get(family)
        if (
            warned is not None
            and family not in warned
            and config.nodeport_addresses.primary
            and primary is None
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
                nodeport_addresses=config.nodeport_addresses,
                detect_local=config.detect_local,
                cluster_cidrs=config.cluster_cidrs,
                node_pod_cidrs=node.pod_cidrs,
                service_cidrs=(*config.service_cidrs, *snapshot.service_cidrs),
                masquerade_all=config.masquerade_all,
                masquerade_mark=config.masquerade_mark,
                flags=config.features,
                localhost_nodeports=config.mode == "iptables" and config.localhost_nodeports,
            )
        )
    return plans


def service_port_plans(
    snapshot: Snapshot, fam: FamilyPlan, names: Iterable[ServicePortName] | None = None
) -> dict[ServicePortName, ServicePortPlan | None]:
    return plan_service_ports(snapshot.services, snapshot.endpoints, fam, names)


def describe_snapshot(config: ProxyConfig, snapshot: Snapshot) -> dict[str, Any]:
    """The whole plan as JSON-ready data (``render --format json``)."""
    fams = family_plans(config, snapshot)
    ports: list[dict[str, Any]] = []
    for fam in fams:
        plans = service_port_plans(snapshot, fam)
        ports.extend(describe(p) for _, p in sorted(plans.items()) if p is not None)
    return {
        "mode": config.mode,
        "families": [describe_family(f) for f in fams],
        "servicePorts": ports,
    }


def _has_node_ports(snapshot: Snapshot, family: IPFamily) -> bool:
    return any(svc.node_port and svc.cluster_ip(family) for svc in snapshot.services.values())
