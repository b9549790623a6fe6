"""Kubernetes-shaped dicts for the controlplane tests: Services, Pods, Nodes, slices.

Each builder takes only what a test varies; everything else has the value a real
cluster would show (Ready Pods and Nodes, 4 allocatable CPUs, TCP ports).
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def service(
    name: str = "web",
    *,
    namespace: str = "default",
    uid: str = "svc-uid",
    ports: list[Obj] | None = None,
    families: tuple[str, ...] = ("IPv4",),
    cluster_ip: str = "10.96.0.10",
    selector: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    traffic_distribution: str | None = None,
    **spec: Any,
) -> Obj:
    body: Obj = {
        "selector": {"app": name} if selector is None else selector,
        "ports": [{"name": "http", "port": 80, "targetPort": 8080}] if ports is None else ports,
        "ipFamilies": list(families),
        "clusterIP": cluster_ip,
        **spec,
    }
    if traffic_distribution is not None:
        body["trafficDistribution"] = traffic_distribution
    meta: Obj = {"name": name, "namespace": namespace, "uid": uid}
    if annotations:
        meta["annotations"] = annotations
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": body}


def pod(
    name: str,
    ips: tuple[str, ...] | str,
    *,
    node: str = "node-a1",
    app: str = "web",
    namespace: str = "default",
    ready: bool = True,
    terminating: bool = False,
    phase: str = "Running",
    container_ports: list[Obj] | None = None,
    **spec: Any,
) -> Obj:
    ip_list = (ips,) if isinstance(ips, str) else ips
    meta: Obj = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": {"app": app}}
    if terminating:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "ports": container_ports or []}],
            **spec,
        },
        "status": {
            "phase": phase,
            "podIP": ip_list[0] if ip_list else "",
            "podIPs": [{"ip": ip} for ip in ip_list],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def node(
    name: str,
    zone: str | None,
    *,
    cpu: str = "4",
    ready: bool = True,
    labels: dict[str, str] | None = None,
) -> Obj:
    all_labels = dict(labels or {})
    if zone is not None:
        all_labels["topology.kubernetes.io/zone"] = zone
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "status": {
            "allocatable": {"cpu": cpu},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def nodes_by_name(*nodes: Obj) -> dict[str, Obj]:
    return {n["metadata"]["name"]: n for n in nodes}


def endpoint(
    ip: str,
    zone: str | None = None,
    *,
    ready: bool = True,
    node_name: str | None = None,
    hint_zones: tuple[str, ...] | None = None,
    hint_nodes: tuple[str, ...] | None = None,
) -> Obj:
    ep: Obj = {
        "addresses": [ip],
        "conditions": {"ready": ready, "serving": ready, "terminating": False},
        "targetRef": {"kind": "Pod", "namespace": "default", "name": f"pod-{ip}"},
    }
    if zone is not None:
        ep["zone"] = zone
    if node_name is not None:
        ep["nodeName"] = node_name
    hints: Obj = {}
    if hint_zones is not None:
        hints["forZones"] = [{"name": z} for z in hint_zones]
    if hint_nodes is not None:
        hints["forNodes"] = [{"name": n} for n in hint_nodes]
    if hint_zones is not None or hint_nodes is not None:
        ep["hints"] = hints
    return ep


def endpoint_slice(name: str, endpoints: list[Obj], *, address_type: str = "IPv4") -> Obj:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default"},
        "addressType": address_type,
        "endpoints": endpoints,
    }


def hints_of(endpoint_slices: list[Obj]) -> dict[str, Any]:
    """Address -> hints dict (or None) over every endpoint of the slices."""
    return {
        ep["addresses"][0]: ep.get("hints")
        for s in endpoint_slices
        for ep in s.get("endpoints") or ()
    }
