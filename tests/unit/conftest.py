"""Small builders shared by the unit tests.

Two layers: ``*_obj`` build Kubernetes-shaped dicts (what a manifest file decodes to) for
the parser and the manifest source; the others build model objects directly, so tracker
and topology tests do not depend on the parser.
"""

from __future__ import annotations

from typing import Any

from kubeproxy.model.types import (
    LABEL_SERVICE_NAME,
    Endpoint,
    EndpointConditions,
    EndpointSlice,
    IPFamily,
    L4Protocol,
    NamespacedName,
    Service,
    ServicePort,
    ServicePortName,
    SliceEndpoint,
    SlicePort,
    TrafficPolicy,
)

# ------------------------------------------------------------- Kubernetes-shaped dicts


def service_obj(
    name: str = "web",
    namespace: str | None = None,
    *,
    ports: list[dict[str, Any]] | None = None,
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A v1 Service dict: ClusterIP 10.96.0.10, one unnamed TCP port 80 unless overridden."""
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    full_spec: dict[str, Any] = {
        "clusterIP": "10.96.0.10",
        "ports": ports if ports is not None else [{"port": 80}],
    }
    full_spec.update(spec)
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": full_spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def slice_obj(
    name: str = "web-abc",
    service: str = "web",
    namespace: str | None = None,
    *,
    address_type: str = "IPv4",
    ports: list[dict[str, Any]] | None = None,
    endpoints: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A discovery.k8s.io/v1 EndpointSlice dict with one port and one endpoint by default."""
    meta: dict[str, Any] = {"name": name, "labels": {LABEL_SERVICE_NAME: service}}
    if namespace is not None:
        meta["namespace"] = namespace
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": address_type,
        "ports": ports if ports is not None else [{"port": 8080}],
        "endpoints": endpoints if endpoints is not None else [{"addresses": ["10.1.0.1"]}],
    }


def node_obj(
    name: str = "node-a",
    *,
    labels: dict[str, Any] | None = None,
    addresses: list[dict[str, Any]] | None = None,
    taints: list[dict[str, Any]] | None = None,
    deletion_timestamp: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels is not None:
        meta["labels"] = labels
    if deletion_timestamp is not None:
        meta["deletionTimestamp"] = deletion_timestamp
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
    if addresses is not None:
        obj["status"] = {"addresses": addresses}
    if taints is not None:
        obj["spec"] = {"taints": taints}
    return obj


# ----------------------------------------------------------------------- model objects


def port_name(
    service: str = "web", port: str = "http", protocol: L4Protocol = L4Protocol.TCP
) -> ServicePortName:
    return ServicePortName(NamespacedName("default", service), port, protocol)


def service_port(
    service: str = "web",
    port: str = "http",
    protocol: L4Protocol = L4Protocol.TCP,
    *,
    number: int = 80,
    cluster_ips: tuple[str, ...] = ("10.96.0.10",),
    node_port: int = 0,
    external_ips: tuple[str, ...] = (),
    load_balancer_ips: tuple[str, ...] = (),
    itp: TrafficPolicy = TrafficPolicy.CLUSTER,
    etp: TrafficPolicy = TrafficPolicy.CLUSTER,
) -> ServicePort:
    return ServicePort(
        name=port_name(service, port, protocol),
        cluster_ips=cluster_ips,
        port=number,
        node_port=node_port,
        external_ips=external_ips,
        load_balancer_ips=load_balancer_ips,
        external_traffic_policy=etp,
        internal_traffic_policy=itp,
    )


def service(name: str, *ports: ServicePort) -> Service:
    return Service("default", name, ports)


def slice_endpoint(
    *addresses: str,
    ready: bool = True,
    serving: bool | None = None,
    terminating: bool = False,
    node: str | None = None,
    zone: str | None = None,
    zone_hints: tuple[str, ...] = (),
    node_hints: tuple[str, ...] = (),
) -> SliceEndpoint:
    """One slice endpoint; ``serving`` defaults to ``ready`` as the API keeps them in step."""
    return SliceEndpoint(
        addresses=addresses,
        conditions=EndpointConditions(
            ready=ready, serving=ready if serving is None else serving, terminating=terminating
        ),
        node_name=node,
        zone=zone,
        zone_hints=frozenset(zone_hints),
        node_hints=frozenset(node_hints),
    )


def endpoint_slice(
    name: str,
    service: str = "web",
    *,
    ports: tuple[tuple[str, L4Protocol, int], ...] = (("http", L4Protocol.TCP, 8080),),
    endpoints: tuple[SliceEndpoint, ...] = (),
    family: IPFamily = IPFamily.IPv4,
    trigger_time: float | None = None,
) -> EndpointSlice:
    return EndpointSlice(
        namespace="default",
        name=name,
        service_name=service,
        address_type=family,
        ports=tuple(SlicePort(n, proto, num) for n, proto, num in ports),
        endpoints=endpoints,
        trigger_time=trigger_time,
    )


def endpoint(
    ip: str,
    *,
    port: int = 8080,
    ready: bool = True,
    serving: bool | None = None,
    terminating: bool = False,
    node: str | None = None,
    zone: str | None = None,
    zone_hints: tuple[str, ...] = (),
    node_hints: tuple[str, ...] = (),
) -> Endpoint:
    return Endpoint(
        ip=ip,
        port=port,
        node_name=node,
        zone=zone,
        ready=ready,
        serving=ready if serving is None else serving,
        terminating=terminating,
        zone_hints=frozenset(zone_hints),
        node_hints=frozenset(node_hints),
    )
