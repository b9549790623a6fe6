"""Endpoint selection: which endpoints a ServicePort may use on this node.

One pure function, :func:`categorize_endpoints`, after upstream's ``CategorizeEndpoints``
(``pkg/proxy/topology.go``). Everything it depends on is an argument: the endpoints (of one
IP family), the ServicePort, this node's name and zone, and the feature flags. The rules:

* **Usable** means ready. If no endpoint is ready, serving-and-terminating endpoints are
  used instead; this fallback is decided separately for the cluster set and the local set
  (so a node whose local endpoints are all terminating keeps draining to them).
* **Cluster set** (used by Cluster traffic policy): usable endpoints filtered by topology.
  Topology comes from the EndpointSlice hints, which the EndpointSlice controller writes for
  ``trafficDistribution`` (PreferClose / PreferSameZone / PreferSameNode) and for the
  ``service.kubernetes.io/topology-mode: Auto`` annotation:

  - node hints are used when every ready endpoint has a node hint and at least one names
    this node (PreferSameNode; only with the PreferSameTrafficDistribution feature);
  - otherwise zone hints, when every ready endpoint has a zone hint and at least one
    names this node's zone;
  - otherwise every endpoint (the safeguards: a missing hint means a transition is under
    way; no hint for this node/zone means a new zone, so filtering would black-hole).

* **Local set** (used by Local traffic policy): this node's ready endpoints, else its
  serving-and-terminating ones. Topology never applies to it.
* internalTrafficPolicy chooses the set for ClusterIP traffic; externalTrafficPolicy the
  set for NodePort / external IP / load-balancer traffic, and only when the Service is
  reachable from outside at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from kubeproxy.model.types import Endpoint, ServicePort


class TopologyMode(StrEnum):
    NONE = ""
    PREFER_SAME_ZONE = "PreferSameZone"
    PREFER_SAME_NODE = "PreferSameNode"


@dataclass(frozen=True, slots=True)
class FeatureFlags:
    """Feature gates that change selection (upstream names, upstream defaults)."""

    prefer_same_traffic_distribution: bool = True


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """Who "this node" is, for locality decisions."""

    name: str
    zone: str | None = None


@dataclass(frozen=True, slots=True)
class EndpointSelection:
    """The result of :func:`categorize_endpoints` for one ServicePort and one IP family.

    ``cluster`` is empty when the ServicePort never uses Cluster policy, ``local`` when it
    never uses Local policy. ``has_any`` says whether any usable endpoint exists anywhere
    in the cluster (so "no endpoints" can be told apart from "none on this node").
    """

    cluster: tuple[Endpoint, ...]
    local: tuple[Endpoint, ...]
    has_any: bool
    topology_mode: TopologyMode = TopologyMode.NONE

    def internal(self, svc: ServicePort) -> tuple[Endpoint, ...]:
        """Endpoints for traffic to the ClusterIP."""
        return self.local if svc.internal_policy_local else self.cluster

    def external(self, svc: ServicePort) -> tuple[Endpoint, ...]:
        """Endpoints for NodePort, external IP and load-balancer traffic."""
        return self.local if svc.external_policy_local else self.cluster

    @property
    def all_reachable(self) -> tuple[Endpoint, ...]:
        """Union of both sets: every endpoint this node may send traffic to."""
        seen = dict.fromkeys(self.cluster)
        seen.update(dict.fromkeys(self.local))
        return tuple(seen)


def categorize_endpoints(
    endpoints: Iterable[Endpoint],
    svc: ServicePort,
    node: NodeTopology,
    flags: FeatureFlags = FeatureFlags(),
) -> EndpointSelection:
    eps = tuple(endpoints)
    if not eps:
        return EndpointSelection((), (), False)

    cluster: tuple[Endpoint, ...] = ()
    mode = TopologyMode.NONE
    has_any = False
    if svc.uses_cluster_endpoints:
        mode = topology_mode_from_hints(eps, node, flags)
        if mode is TopologyMode.NONE:  # the common case, on the hot path of a full sync
            cluster = tuple(ep for ep in eps if ep.ready)
        else:
            cluster = tuple(ep for ep in eps if ep.ready and _available(ep, mode, node))
        if not cluster:
            # Topology was already ruled out if it would leave no ready endpoint, so the
            # problem here is that nothing is ready anywhere: drain to terminating ones.
            cluster = tuple(ep for ep in eps if ep.serving and ep.terminating)
        has_any = bool(cluster)

    local: tuple[Endpoint, ...] = ()
    if svc.uses_local_endpoints:
        local_ready = tuple(ep for ep in eps if ep.ready and ep.is_local(node.name))
        if local_ready:
            local = local_ready
        else:
            local = tuple(
                ep for ep in eps if ep.serving and ep.terminating and ep.is_local(node.name)
            )
        has_any = has_any or any(ep.ready or (ep.serving and ep.terminating) for ep in eps)

    return EndpointSelection(cluster, local, has_any, mode)


def topology_mode_from_hints(
    endpoints: tuple[Endpoint, ...], node: NodeTopology, flags: FeatureFlags
) -> TopologyMode:
    """Which hints (if any) may filter the cluster set, applying the safeguards."""
    ready = [ep for ep in endpoints if ep.ready]
    if not ready:
        return TopologyMode.NONE
    if (
        flags.prefer_same_traffic_distribution
        and all(ep.node_hints for ep in ready)
        and any(node.name in ep.node_hints for ep in ready)
    ):
        return TopologyMode.PREFER_SAME_NODE
    if (
        node.zone is not None
        and all(ep.zone_hints for ep in ready)
        and any(node.zone in ep.zone_hints for ep in ready)
    ):
        return TopologyMode.PREFER_SAME_ZONE
    return TopologyMode.NONE


def _available(ep: Endpoint, mode: TopologyMode, node: NodeTopology) -> bool:
    if mode is TopologyMode.PREFER_SAME_NODE:
        return node.name in ep.node_hints
    if mode is TopologyMode.PREFER_SAME_ZONE:
        return node.zone in ep.zone_hints
    return True
