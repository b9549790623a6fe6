"""The proxy's view of the cluster, fed by source events and read by backends at sync time.

:class:`ProxyState` receives add/update/delete events (from any source) into the change
trackers. At sync time :meth:`ProxyState.collect` folds the pending changes in and returns a
:class:`Snapshot` (what the backend renders) and the set of ServicePorts that changed.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kubeproxy.model.topology import NodeTopology
from kubeproxy.model.tracker import (
    EndpointsChangeTracker,
    EndpointsMap,
    EndpointsUpdate,
    ServiceChangeTracker,
    ServicePortMap,
    ServiceUpdate,
)
from kubeproxy.model.types import (
    Endpoint,
    EndpointSlice,
    IPFamily,
    Node,
    Service,
    ServiceCIDR,
    ServicePort,
    ServicePortName,
)


@dataclass(frozen=True)
class NodeState:
    """What the proxy knows about its own node."""

    name: str
    zone: str | None = None
    primary_ips: Mapping[IPFamily, str] = field(default_factory=dict)
    deleting: bool = False
    # The Node's spec.podCIDRs (detect-local-mode NodeCIDR).
    pod_cidrs: tuple[str, ...] = ()

    @property
    def topology(self) -> NodeTopology:
        return NodeTopology(self.name, self.zone)


@dataclass(frozen=True)
class Snapshot:
    """A read-only view handed to a backend for one sync (valid until the next collect)."""

    services: Mapping[ServicePortName, ServicePort]
    endpoints: Mapping[ServicePortName, tuple[Endpoint, ...]]
    node: NodeState
    # CIDRs of every networking.k8s.io/v1 ServiceCIDR object (sorted, deduplicated).
    service_cidrs: tuple[str, ...] = ()


@dataclass
class Changes:
    """What changed since the previous sync."""

    service_ports: set[ServicePortName]
    node_changed: bool
    services: ServiceUpdate
    endpoints: EndpointsUpdate


class ProxyState:
    def __init__(self, node_name: str, bind_ips: Mapping[IPFamily, str] | None = None) -> None:
        self.node_name = node_name
        self._bind_ips = dict(bind_ips or {})
        self.service_changes = ServiceChangeTracker()
        self.endpoint_changes = EndpointsChangeTracker()
        self.services = ServicePortMap()
        self.endpoints = EndpointsMap()
        self._node: Node | None = None
        self._node_gone = False
        self._node_dirty = True
        self._service_cidrs: dict[str, ServiceCIDR] = {}

    # ------------------------------------------------------------------ events

    def on_service(self, previous: Service | None, current: Service | None) -> bool:
        return self.service_changes.update(previous, current)

    def on_endpoint_slice(self, endpoint_slice: EndpointSlice, *, deleted: bool = False) -> bool:
        return self.endpoint_changes.update(endpoint_slice, deleted=deleted)

    def on_node(self, node: Node | None) -> bool:
        """Record this node's Node object (None when deleted). Other nodes are ignored."""
        if node is not None and node.name != self.node_name:
            return False
        if node != self._node:
            # A Node that existed and went away is a node being removed: as upstream,
            # stop being an eligible load-balancer target.
            self._node_gone = node is None and self._node is not None
            self._node = node
            self._node_dirty = True
        return self._node_dirty

    def on_service_cidr(self, previous: ServiceCIDR | None, current: ServiceCIDR | None) -> bool:
        """A ServiceCIDR was added, changed or deleted (rare: handled as a node-level change)."""
        if current is not None:
            changed = self._service_cidrs.get(current.name) != current
            self._service_cidrs[current.name] = current
        elif previous is not None:
            changed = self._service_cidrs.pop(previous.name, None) is not None
        else:
            changed = False
        if changed:
            self._node_dirty = True
        return self.pending

    @property
    def node(self) -> Node | None:
        """This node's Node object, if the source has one."""
        return self._node

    @property
    def pending(self) -> bool:
        return bool(
            self.service_changes.pending() or self.endpoint_changes.pending() or self._node_dirty
        )

    # -------------------------------------------------------------------- sync

    def node_state(self) -> NodeState:
        node = self._node
        primary = dict(node.primary_ips()) if node is not None else {}
        primary.update(self._bind_ips)
        return NodeState(
            name=self.node_name,
            zone=node.zone if node is not None else None,
            primary_ips=MappingProxyType(primary),
            deleting=self._node_gone or bool(node and (node.deleting or node.to_be_deleted_taint)),
            pod_cidrs=node.pod_cidrs if node is not None else (),
        )

    def collect(self) -> tuple[Snapshot, Changes]:
        """Fold pending changes into the synced view (phase 1 of a sync)."""
        svc_update = self.services.apply(self.service_changes)
        ep_update = self.endpoints.apply(self.endpoint_changes)
        node_changed, self._node_dirty = self._node_dirty, False
        # Read-only views of the live maps, not copies (a copy would cost O(cluster) on
        # every sync): the maps only change here, and syncs run one at a time, so a
        # snapshot stays valid until the next collect().
        snapshot = Snapshot(
            services=MappingProxyType(self.services),
            endpoints=MappingProxyType(self.endpoints),
            node=self.node_state(),
            service_cidrs=tuple(
                sorted({c for sc in self._service_cidrs.values() for c in sc.cidrs})
            ),
        )
        changes = Changes(
            service_ports=svc_update.changed | ep_update.changed,
            node_changed=node_changed,
            services=svc_update,
            endpoints=ep_update,
        )
        return snapshot, changes
