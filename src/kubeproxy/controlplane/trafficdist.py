"""Hints for ``spec.trafficDistribution`` (upstream ``k8s.io/endpointslice/trafficdist``).

One function, :func:`reconcile_hints`, and two heuristics:

* ``PreferClose`` / ``PreferSameZone``: every *ready* endpoint with a zone gets the hint
  ``forZones: [its zone]``; one without a zone gets no hint.
* ``PreferSameNode``: the same, plus ``forNodes: [its nodeName]`` when it has one.
* anything else (unset, or a value this version does not know): no hints at all.

Not-ready endpoints are left as they are (upstream's ``update`` skips them); kube-proxy
only reads the hints of ready endpoints. An unchanged slice whose ready endpoints already
carry exactly the wanted hints stays unchanged; otherwise it moves to the updates as a
copy. Whether the field may be used at all (feature gates, the topology annotation taking
precedence) is the caller's decision — :func:`kubeproxy.controlplane.endpointslice.reconcile`
makes it as upstream's reconciler does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubeproxy.controlplane._slices import Obj, copy_slice, endpoint_ready, with_hints

_CLOSE = frozenset({"PreferClose", "PreferSameZone", "PreferSameNode"})


def _wanted_hints(endpoint: Mapping[str, Any], node_hints: bool) -> Obj | None:
    hints: Obj = {}
    if endpoint.get("zone") is not None:
        hints["forZones"] = [{"name": endpoint["zone"]}]
    if node_hints and endpoint.get("nodeName") is not None:
        hints["forNodes"] = [{"name": endpoint["nodeName"]}]
    return hints or None


def _needs_update(endpoint_slice: Mapping[str, Any], close: bool, node_hints: bool) -> bool:
    for endpoint in endpoint_slice.get("endpoints") or ():
        if not close:
            # Cluster-wide: any hint at all is stale.
            if endpoint.get("hints") is not None:
                return True
            continue
        if not endpoint_ready(endpoint):
            continue
        hints = endpoint.get("hints") or {}
        zones = hints.get("forZones") or []
        nodes = hints.get("forNodes") or []
        zone = endpoint.get("zone")
        if zone is not None:
            if len(zones) != 1 or zones[0].get("name") != zone:
                return True
        elif zones:
            return True
        node = endpoint.get("nodeName")
        if node is not None and node_hints:
            if len(nodes) != 1 or nodes[0].get("name") != node:
                return True
        elif nodes:
            return True
    return False


def _update(endpoint_slice: Mapping[str, Any], close: bool, node_hints: bool) -> Obj:
    copied = copy_slice(endpoint_slice)
    endpoints = copied["endpoints"]
    for i, endpoint in enumerate(endpoints):
        if not close:
            if "hints" in endpoint:
                endpoints[i] = with_hints(endpoint, None)
        elif endpoint_ready(endpoint):
            endpoints[i] = with_hints(endpoint, _wanted_hints(endpoint, node_hints))
    return copied


def reconcile_hints(
    traffic_distribution: str | None,
    slices_to_create: Sequence[Mapping[str, Any]],
    slices_to_update: Sequence[Mapping[str, Any]],
    slices_unchanged: Sequence[Mapping[str, Any]],
) -> tuple[list[Obj], list[Obj], list[Obj]]:
    """``(to_create, to_update, unchanged)`` with the hints ``traffic_distribution`` asks for.

    The returned slices to create and update are new dicts; the unchanged ones returned are
    the very objects passed in, which are never modified.
    """
    close = traffic_distribution in _CLOSE
    node_hints = traffic_distribution == "PreferSameNode"
    to_update = [_update(s, close, node_hints) for s in slices_to_update]
    unchanged: list[Obj] = []
    for endpoint_slice in slices_unchanged:
        if _needs_update(endpoint_slice, close, node_hints):
            to_update.append(_update(endpoint_slice, close, node_hints))
        else:
            unchanged.append(endpoint_slice)  # type: ignore[arg-type]
    to_create = [_update(s, close, node_hints) for s in slices_to_create]
    return to_create, to_update, unchanged
