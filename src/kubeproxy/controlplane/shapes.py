"""The shapes of the raw objects the standalone control plane reads, checked first.

:class:`~kubeproxy.controlplane.standalone.StandaloneCluster` reads Pods, Nodes and
Services (before they have a ClusterIP) as raw documents, where no ``parse_*`` function
has looked yet (and ServiceCIDRs and hand-written EndpointSlices, whose parsers check
them whole). An API server would have refused a wrongly typed field; here :func:`checked`
does, for every field the control plane reads: an object that fails is one log line
(kind, namespace/name, the field and why) and absent, as in the manifest source, and the
control plane can trust the types it reads.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from kubeproxy.controlplane.topologycache import parse_quantity
from kubeproxy.model.parse import (
    InvalidObjectError,
    Required,
    Shape,
    boolean,
    check_shape,
    int_or_string,
    invalid,
    ip_address,
    node_name,
    parse_endpoint_slice,
    parse_service_cidr,
    port_number,
    port_or_zero,
    string,
    string_map,
)

log = logging.getLogger(__name__)


def _quantity(value: Any, path: str) -> object:
    try:
        quantity = parse_quantity(value) if isinstance(value, (str, int)) else None
    except ValueError:
        quantity = None
    if quantity is None or not quantity.is_finite() or quantity < Decimal(0):
        raise invalid(path, f"not a resource quantity: {value!r}")
    return quantity


_METADATA: Mapping[str, Shape] = {
    "name": string,
    "namespace": string,
    "uid": string,
    "labels": string_map,
    "annotations": string_map,
    "deletionTimestamp": string,
    "generateName": string,
}
_CONDITIONS: Shape = [{"type": string, "status": string}]
_CONTAINER: Shape = {
    "name": string,
    "restartPolicy": string,
    "ports": [{"name": string, "containerPort": Required(port_number), "protocol": string}],
}

POD: Mapping[str, Shape] = {
    "metadata": _METADATA,
    "spec": {
        "nodeName": node_name,
        "hostname": string,
        "subdomain": string,
        "restartPolicy": string,
        "containers": [_CONTAINER],
        "initContainers": [_CONTAINER],
    },
    "status": {
        "phase": string,
        "podIP": ip_address,
        "podIPs": [{"ip": ip_address}],
        "conditions": _CONDITIONS,
    },
}
SERVICE: Mapping[str, Shape] = {
    "metadata": _METADATA,
    "spec": Required(
        {
            "type": string,
            "selector": string_map,
            "clusterIP": string,
            "clusterIPs": [string],
            "ipFamilies": [string],
            "ipFamilyPolicy": string,
            "ports": [
                {
                    "name": string,
                    "protocol": string,
                    "appProtocol": string,
                    "port": Required(port_number),
                    "targetPort": int_or_string,
                    "nodePort": port_or_zero,
                }
            ],
            "healthCheckNodePort": port_or_zero,
            "externalTrafficPolicy": string,
            "internalTrafficPolicy": string,
            "publishNotReadyAddresses": boolean,
            "allocateLoadBalancerNodePorts": boolean,
            "trafficDistribution": string,
        }
    ),
}
# What the topology cache reads beyond parse_node (which the Node also goes through).
NODE: Mapping[str, Shape] = {
    "metadata": _METADATA,
    "status": {"conditions": _CONDITIONS, "allocatable": {"cpu": _quantity}},
}
_SHAPES = {"Pod": (POD, True), "Service": (SERVICE, True), "Node": (NODE, False)}
# Read raw too (their CIDRs, their labels and endpoints), and fully checked by their parser.
_PARSERS: dict[str, Any] = {
    "ServiceCIDR": parse_service_cidr,
    "EndpointSlice": parse_endpoint_slice,
}


def problem(kind: str, doc: Mapping[str, Any]) -> InvalidObjectError | None:
    """Why the control plane cannot read ``doc``; None if it can (or has no shape to
    check for ``kind``)."""
    try:
        if kind in _PARSERS:
            _PARSERS[kind](doc)
        elif kind in _SHAPES:
            shape, namespaced = _SHAPES[kind]
            check_shape(kind, doc, shape, namespaced=namespaced)
    except InvalidObjectError as err:
        return err
    return None


def checked(kind: str, doc: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``doc``, or None (logged) if the control plane cannot read it. A ServiceCIDR's
    CIDRs come back in their canonical spelling (the allocator takes them as written)."""
    if doc is None:
        return None
    err = problem(kind, doc)
    if err is not None:
        log.error("%s", err)
        return None
    if kind == "ServiceCIDR":
        spec = {**doc["spec"], "cidrs": list(parse_service_cidr(doc).cidrs)}
        return {**doc, "spec": spec}
    return doc
