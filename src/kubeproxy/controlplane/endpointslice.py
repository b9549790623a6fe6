"""The EndpointSlice controller's reconciler, as a pure function over Kubernetes JSON dicts.

After upstream's ``staging/src/k8s.io/endpointslice`` (``reconciler.go``, ``utils.go``,
``util/controller_utils.go``, ``util/endpointset.go``) and the controller's
``syncService`` in ``pkg/controller/endpointslice``. Map of this module:

* :func:`select_pods` — the Pods a Service manages slices for: none for ExternalName
  Services or Services without a selector; else the Pods of its namespace whose labels
  match the selector.
* :func:`pod_to_endpoint` / :func:`endpoint_ports` — one Pod as an endpoint: its IPs of the
  slice's address type; ``ready`` = Pod Ready and not terminating (or
  ``publishNotReadyAddresses``), ``serving`` = Pod Ready, ``terminating`` = has a
  ``deletionTimestamp``; ``nodeName``; ``zone`` from the Node's
  ``topology.kubernetes.io/zone`` label; ``hostname`` when the Pod's subdomain is the
  Service. Ports: each Service port's targetPort, a named one resolved per Pod from its
  containers' ports (and restartable init containers) with the same protocol; a Service
  port the Pod cannot resolve is left out of that Pod's port set.
* :func:`reconcile` — the whole of ``Reconcile`` for one Service: slices of address types
  the Service no longer has are deleted; per address type, Pods are grouped by their
  resolved port set (one group = one set of slices), and per group the placement is
  upstream's, which keeps churn small:

  1. walk existing slices: keep endpoints still desired (updated in place when their
     conditions, zone, node or target changed), drop the rest; a slice left empty is
     deleted, a changed one updated, an untouched one stays unchanged;
  2. fill the slices being updated anyway, fullest first, with the new endpoints;
  3. put what is left into the unchanged slice that ends up closest to full without
     overflowing (only when fewer than a full slice remain), else into new slices.

  Then an empty placeholder slice when a Service has no endpoints at all, topology hints
  (:mod:`.topologycache` for ``service.kubernetes.io/topology-mode: Auto``,
  :mod:`.trafficdist` for ``spec.trafficDistribution``; the annotation wins), and
  ``finalize``'s rule that a slice to create takes over the name of a slice to delete
  rather than deleting one and creating another.

Endpoints are identified as upstream's endpoint hash does: sorted addresses, hostname,
and target Pod namespace/name. Orders that upstream leaves to Go map iteration (which
endpoint is placed first, which slice is filled first among equals) follow input order
here, so the same input always gives the same output. Inputs are never mutated; returned
slices are new dicts (their untouched sub-objects may be shared with the inputs).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubeproxy.controlplane._slices import Obj, copy_slice
from kubeproxy.controlplane.topologycache import (
    TOPOLOGY_AWARE_HINTS_DISABLED,
    TopologyCache,
    event,
    format_with_address_type,
    remove_hints_from_slices,
)
from kubeproxy.controlplane.trafficdist import reconcile_hints

#: ``--max-endpoints-per-slice`` default of kube-controller-manager.
DEFAULT_MAX_ENDPOINTS_PER_SLICE = 100
CONTROLLER_NAME = "endpointslice-controller.k8s.io"
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
LABEL_HEADLESS = "service.kubernetes.io/headless"
LABEL_ZONE = "topology.kubernetes.io/zone"
ANNOTATION_TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"
ANNOTATION_TOPOLOGY_MODE = "service.kubernetes.io/topology-mode"
ANNOTATION_TOPOLOGY_AWARE_HINTS = "service.kubernetes.io/topology-aware-hints"  # deprecated
_RESERVED_LABELS = frozenset({LABEL_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_HEADLESS})
_TRAFFIC_DISTRIBUTIONS = frozenset({"PreferClose", "PreferSameZone", "PreferSameNode"})

EndpointKey = tuple[tuple[str, ...], str, str, str]
PortKey = tuple[tuple[str, str, int, str], ...]


@dataclass
class ReconcileResult:
    """What one reconcile wants written, plus the events upstream would record."""

    to_create: list[Obj] = field(default_factory=list)
    to_update: list[Obj] = field(default_factory=list)
    to_delete: list[Obj] = field(default_factory=list)
    events: list[dict[str, str]] = field(default_factory=list)
    #: Pods skipped because their Node is unknown (upstream requeues the Service).
    errors: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------- Pods to endpoints


def select_pods(service: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> list[Obj] | None:
    """The Pods whose endpoints the Service gets, or None when the controller leaves it alone.

    None for ExternalName Services and Services without a selector (their slices, if
    any, are managed by someone else). An empty selector is the same as none: the API
    server drops an empty map, so the controller never sees one.
    """
    spec = service.get("spec") or {}
    selector = spec.get("selector")
    if spec.get("type") == "ExternalName" or not selector:
        return None
    namespace = (service.get("metadata") or {}).get("namespace", "default")
    selected = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if metadata.get("namespace", "default") != namespace:
            continue
        labels = metadata.get("labels") or {}
        if all(labels.get(k) == v for k, v in selector.items()):
            selected.append(dict(pod))
    return selected


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def should_pod_be_in_endpoints(pod: Mapping[str, Any]) -> bool:
    """Not terminal (Succeeded/Failed) and has an IP; terminating Pods stay (as upstream)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return False
    return bool(status.get("podIP") or status.get("podIPs"))


def _pod_ips(pod: Mapping[str, Any]) -> list[str]:
    status = pod.get("status") or {}
    ips = [entry.get("ip", "") for entry in status.get("podIPs") or ()]
    # Hand-written manifests often set only podIP; the API server keeps both in step.
    if not ips and status.get("podIP"):
        ips = [status["podIP"]]
    return [ip for ip in ips if ip]


def _is_ipv6(ip: str) -> bool:
    return _address(ip)[1]


def _address(ip: str) -> tuple[str, bool]:
    """The address as upstream's ``getEndpointAddresses`` writes it (parsed and printed
    again: the API server keeps IPv6 addresses as given, ``FD00:0::C``), and whether it
    is IPv6."""
    if ":" not in ip:
        return ip, False  # IPv4 (or not an address): the common case, without parsing
    try:
        parsed = ipaddress.ip_address(ip)
    except ValueError:
        return ip, False
    return str(parsed), parsed.version == 6


def pod_to_endpoint(
    pod: Mapping[str, Any],
    node: Mapping[str, Any] | None,
    service: Mapping[str, Any],
    address_type: str,
) -> Obj:
    """Upstream ``podToEndpoint``: one endpoint of the given address type for a Pod."""
    metadata = pod.get("metadata") or {}
    pod_spec = pod.get("spec") or {}
    svc_meta = service.get("metadata") or {}
    svc_spec = service.get("spec") or {}
    serving = _pod_ready(pod)
    terminating = bool(metadata.get("deletionTimestamp"))
    # For compatibility, ready is never true for a terminating Pod unless the Service
    # publishes not-ready addresses.
    ready = bool(svc_spec.get("publishNotReadyAddresses")) or (serving and not terminating)
    want_v6 = address_type == "IPv6"
    target_ref: Obj = {
        "kind": "Pod",
        "namespace": metadata.get("namespace", "default"),
        "name": metadata.get("name", ""),
    }
    if metadata.get("uid"):
        target_ref["uid"] = metadata["uid"]
    endpoint: Obj = {
        "addresses": [ip for ip, v6 in map(_address, _pod_ips(pod)) if v6 == want_v6],
        "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
        "targetRef": target_ref,
    }
    if pod_spec.get("nodeName"):
        endpoint["nodeName"] = pod_spec["nodeName"]
    zone = ((node or {}).get("metadata") or {}).get("labels", {}).get(LABEL_ZONE)
    if zone:
        endpoint["zone"] = zone
    if (
        pod_spec.get("hostname")
        and pod_spec.get("subdomain") == svc_meta.get("name")
        and metadata.get("namespace", "default") == svc_meta.get("namespace", "default")
    ):
        endpoint["hostname"] = pod_spec["hostname"]
    return endpoint


def _find_port(pod: Mapping[str, Any], service_port: Mapping[str, Any]) -> int | None:
    """Upstream ``findPort``: a number as is, a name from the Pod's container ports."""
    protocol = service_port.get("protocol") or "TCP"
    target = service_port.get("targetPort")
    if target is None or target == "":
        target = service_port.get("port")  # the API server's default
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    pod_spec = pod.get("spec") or {}
    containers = list(pod_spec.get("containers") or ())
    # Sidecars (init containers that keep running) publish ports too.
    containers += [
        c for c in pod_spec.get("initContainers") or () if c.get("restartPolicy") == "Always"
    ]
    for container in containers:
        for port in container.get("ports") or ():
            if port.get("name") == target and (port.get("protocol") or "TCP") == protocol:
                return int(port["containerPort"])
    return None


def _named_target(service_port: Mapping[str, Any]) -> bool:
    target = service_port.get("targetPort")
    return isinstance(target, str) and target != "" and not target.isdigit()


def endpoint_ports(service: Mapping[str, Any], pod: Mapping[str, Any]) -> list[Obj]:
    """The slice ports a Pod gives the Service (upstream ``getEndpointPorts``)."""
    spec = service.get("spec") or {}
    result: list[Obj] = []
    for service_port in spec.get("ports") or ():
        number = _find_port(pod, service_port)
        if number is None:
            continue
        port: Obj = {
            "name": service_port.get("name", ""),
            "port": number,
            "protocol": service_port.get("protocol") or "TCP",
        }
        if service_port.get("appProtocol") is not None:
            port["appProtocol"] = service_port["appProtocol"]
        result.append(port)
    return result


def _port_key(ports: Sequence[Mapping[str, Any]]) -> PortKey:
    return tuple(
        sorted(
            (
                p.get("name") or "",
                p.get("protocol") or "TCP",
                int(p.get("port") or 0),
                p.get("appProtocol") or "",
            )
            for p in ports
        )
    )


def _sorted_ports(ports: list[Obj]) -> list[Obj]:
    # Upstream sorts by a hash of each port; any fixed order does the same job.
    return sorted(ports, key=lambda p: _port_key([p]))


def endpoint_key(endpoint: Mapping[str, Any]) -> EndpointKey:
    """Upstream's endpoint hash: addresses, hostname and target Pod identify an endpoint."""
    ref = endpoint.get("targetRef") or {}
    return (
        tuple(sorted(endpoint.get("addresses") or ())),
        endpoint.get("hostname") or "",
        ref.get("namespace", ""),
        ref.get("name", ""),
    )


def _ref_without_version(ref: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if ref is None:
        return None
    return {k: v for k, v in ref.items() if k != "resourceVersion"}


def endpoints_equal_beyond_hash(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Upstream ``EndpointsEqualBeyondHash``: what changes an endpoint in place.

    Hints are not compared: they are the topology stage's business.
    """
    if a.get("nodeName") != b.get("nodeName") or a.get("zone") != b.get("zone"):
        return False
    ca, cb = a.get("conditions") or {}, b.get("conditions") or {}
    if any(ca.get(k) != cb.get(k) for k in ("ready", "serving", "terminating")):
        return False
    return _ref_without_version(a.get("targetRef")) == _ref_without_version(b.get("targetRef"))


# ------------------------------------------------------------------------- slice metadata


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def service_key(service: Mapping[str, Any]) -> str:
    meta = _meta(service)
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def hints_enabled(annotations: Mapping[str, str]) -> bool:
    """Topology-mode Auto: the deprecated annotation, when present, wins over the new one."""
    value = annotations.get(ANNOTATION_TOPOLOGY_AWARE_HINTS)
    if value is None:
        value = annotations.get(ANNOTATION_TOPOLOGY_MODE)
    return value in ("Auto", "auto")


def _service_ip_set(spec: Mapping[str, Any]) -> bool:
    return spec.get("clusterIP") not in (None, "", "None")


def slice_labels(
    current: Mapping[str, str], service: Mapping[str, Any], controller: str
) -> tuple[dict[str, str], bool]:
    """Upstream ``setEndpointSliceLabels``: the Service's labels plus the reserved ones.

    The flag says whether the non-reserved labels differ (the slice then needs an update).
    """
    kept = {k: v for k, v in current.items() if k not in _RESERVED_LABELS}
    wanted = {
        k: v for k, v in (_meta(service).get("labels") or {}).items() if k not in _RESERVED_LABELS
    }
    changed = kept != wanted
    if not _service_ip_set(service.get("spec") or {}):
        wanted[LABEL_HEADLESS] = ""
    wanted[LABEL_SERVICE_NAME] = _meta(service).get("name", "")
    wanted[LABEL_MANAGED_BY] = controller
    return wanted, changed


def _owner_ref(service: Mapping[str, Any]) -> Obj:
    meta = _meta(service)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "name": meta.get("name", ""),
        "uid": meta.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned_by(endpoint_slice: Mapping[str, Any], service: Mapping[str, Any]) -> bool:
    uid = _meta(service).get("uid", "")
    return any(
        ref.get("uid", "") == uid and ref.get("kind") == "Service" and ref.get("apiVersion") == "v1"
        for ref in _meta(endpoint_slice).get("ownerReferences") or ()
    )


def _slice_name_prefix(service_name: str) -> str:
    # The dash makes generated names prettier unless it would overflow a DNS subdomain.
    prefix = f"{service_name}-"
    return prefix if len(prefix) <= 253 else service_name


def new_endpoint_slice(
    service: Mapping[str, Any], ports: list[Obj], address_type: str, controller: str
) -> Obj:
    """An empty slice for the Service (no name: the API server generates it from the prefix)."""
    meta = _meta(service)
    labels, _ = slice_labels({}, service, controller)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "generateName": _slice_name_prefix(meta.get("name", "")),
            "namespace": meta.get("namespace", "default"),
            "labels": labels,
            "ownerReferences": [_owner_ref(service)],
        },
        "addressType": address_type,
        "ports": ports,
        "endpoints": [],
    }


def address_types_for_service(service: Mapping[str, Any]) -> list[str]:
    """Upstream ``getAddressTypesForService``: from ipFamilies, else clusterIP, else both."""
    spec = service.get("spec") or {}
    families = spec.get("ipFamilies") or ()
    types = [t for t in ("IPv4", "IPv6") if t in families]
    if types:
        return types
    cluster_ip = spec.get("clusterIP") or ""
    if cluster_ip and cluster_ip != "None":
        return ["IPv6" if _is_ipv6(cluster_ip) else "IPv4"]
    return ["IPv4", "IPv6"]


def _name(endpoint_slice: Mapping[str, Any]) -> str:
    return str(_meta(endpoint_slice).get("name") or "")


def unchanged_slices(
    existing: Sequence[Mapping[str, Any]], to_update: Sequence[Obj], to_delete: Sequence[Obj]
) -> list[Obj]:
    changed = {_name(s) for s in to_update} | {_name(s) for s in to_delete}
    return [s for s in existing if _name(s) not in changed]  # type: ignore[misc]


# ------------------------------------------------------------------------------ reconcile


@dataclass
class _Options:
    max_per_slice: int
    controller: str
    topology_cache: TopologyCache | None
    traffic_distribution_enabled: bool
    prefer_same_traffic_distribution: bool


@dataclass
class _Pass:
    """One Service and address type being reconciled, and where results go."""

    service: Mapping[str, Any]
    address_type: str
    options: _Options
    result: ReconcileResult


def reconcile(
    service: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    existing_slices: Iterable[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
    *,
    max_endpoints_per_slice: int = DEFAULT_MAX_ENDPOINTS_PER_SLICE,
    topology_cache: TopologyCache | None = None,
    trigger_time: datetime | None = None,
    controller_name: str = CONTROLLER_NAME,
    traffic_distribution_enabled: bool = True,
    prefer_same_traffic_distribution: bool = True,
) -> ReconcileResult:
    """Desired slice writes for one Service, given the Pods it selects (see :func:`select_pods`).

    ``existing_slices`` are the Service's slices managed by ``controller_name`` (others are
    ignored, as upstream's lister filters them); ``nodes`` maps Node names to Node objects
    (for zones). ``topology_cache`` enables ``topology-mode: Auto`` hints and keeps their
    per-Service state between calls, as upstream's controller-wide cache does.
    ``trigger_time`` becomes the ``last-change-trigger-time`` annotation of every slice
    written (none: the annotation is removed). The two flags are upstream's feature gates
    for ``trafficDistribution`` and for its PreferSameZone/PreferSameNode values.
    """
    if max_endpoints_per_slice < 1:
        raise ValueError("max_endpoints_per_slice must be at least 1")
    options = _Options(
        max_endpoints_per_slice,
        controller_name,
        topology_cache,
        traffic_distribution_enabled,
        prefer_same_traffic_distribution,
    )
    meta = _meta(service)
    mine = [
        s
        for s in existing_slices
        if _meta(s).get("namespace", "default") == meta.get("namespace", "default")
        and (_meta(s).get("labels") or {}).get(LABEL_SERVICE_NAME) == meta.get("name")
        and (_meta(s).get("labels") or {}).get(LABEL_MANAGED_BY) == controller_name
    ]
    pod_list = list(pods)
    supported = address_types_for_service(service)
    result = ReconcileResult()
    by_type: dict[str, list[Mapping[str, Any]]] = {t: [] for t in supported}
    for endpoint_slice in mine:
        address_type = endpoint_slice.get("addressType", "")
        if address_type in by_type:
            by_type[address_type].append(endpoint_slice)
        else:
            if topology_cache is not None:
                topology_cache.remove_hints(service_key(service), address_type)
            result.to_delete.append(copy_slice(endpoint_slice))
    for address_type in supported:
        here = _Pass(service, address_type, options, result)
        _reconcile_address_type(here, pod_list, by_type[address_type], nodes)
    stamp = _format_trigger_time(trigger_time)
    for endpoint_slice in [*result.to_create, *result.to_update]:
        metadata = endpoint_slice["metadata"]
        if stamp is not None:
            metadata.setdefault("annotations", {})[ANNOTATION_TRIGGER_TIME] = stamp
        elif ANNOTATION_TRIGGER_TIME in metadata.get("annotations", {}):
            del metadata["annotations"][ANNOTATION_TRIGGER_TIME]
    return result


def _format_trigger_time(when: datetime | None) -> str | None:
    """Go's RFC3339Nano in UTC: fractional seconds without trailing zeros."""
    if when is None:
        return None
    utc = when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += f".{utc.microsecond:06d}".rstrip("0")
    return text + "Z"


def _reconcile_address_type(
    here: _Pass,
    pods: list[Mapping[str, Any]],
    existing: list[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
) -> None:
    """Upstream ``reconcileByAddressType``, including hints and ``finalize``'s name reuse."""
    service, address_type, options, result = (
        here.service,
        here.address_type,
        here.options,
        here.result,
    )
    svc_spec = service.get("spec") or {}
    to_create: list[Obj] = []
    to_update: list[Obj] = []
    to_delete: list[Obj] = []
    existing_by_ports: dict[PortKey, list[Mapping[str, Any]]] = {}
    for endpoint_slice in existing:
        if owned_by(endpoint_slice, service):
            key = _port_key(endpoint_slice.get("ports") or ())
            existing_by_ports.setdefault(key, []).append(endpoint_slice)
        else:
            to_delete.append(copy_slice(endpoint_slice))

    desired_by_ports: dict[PortKey, dict[EndpointKey, Obj]] = {}
    ports_by_key: dict[PortKey, list[Obj]] = {}
    # Without named targetPorts every Pod resolves the same ports: work them out once.
    shared: tuple[list[Obj], PortKey] | None = None
    if not any(_named_target(p) for p in svc_spec.get("ports") or ()):
        ports = endpoint_ports(service, {})
        shared = (ports, _port_key(ports))
    for pod in pods:
        if not should_pod_be_in_endpoints(pod):
            continue
        if shared is None:
            ports = endpoint_ports(service, pod)
            key = _port_key(ports)
        else:
            ports, key = shared
        desired = desired_by_ports.setdefault(key, {})
        ports_by_key.setdefault(key, _sorted_ports(ports))
        node_name = (pod.get("spec") or {}).get("nodeName") or ""
        node = nodes.get(node_name)
        if node is None and not svc_spec.get("publishNotReadyAddresses"):
            pod_meta = _meta(pod)
            result.errors.append(
                f"skipping Pod {pod_meta.get('name', '')} for Service {service_key(service)}: "
                f"Node {node_name} Not Found"
            )
            continue
        endpoint = pod_to_endpoint(pod, node, service, address_type)
        if endpoint["addresses"]:
            desired[endpoint_key(endpoint)] = endpoint

    for key, desired in desired_by_ports.items():
        created, updated, deleted = _reconcile_by_port_mapping(
            here, existing_by_ports.get(key, []), desired, ports_by_key[key]
        )
        to_create += created
        to_update += updated
        to_delete += deleted
    for key, slices in existing_by_ports.items():
        if key not in desired_by_ports:
            to_delete += [copy_slice(s) for s in slices]

    # A Service with no endpoints still gets one empty slice, so consumers can tell
    # "no endpoints" from "not reconciled yet".
    if len(existing) == len(to_delete) and not to_create:
        placeholder = new_endpoint_slice(service, [], address_type, options.controller)
        if len(to_delete) == 1 and _same_placeholder(to_delete[0], placeholder):
            to_delete = []
        else:
            to_create.append(placeholder)

    to_create, to_update, events = _apply_hints(here, existing, to_create, to_update, to_delete)
    result.events += events
    _finalize(service, to_create, to_update, to_delete, result)


def _reconcile_by_port_mapping(
    here: _Pass,
    existing: list[Mapping[str, Any]],
    desired: dict[EndpointKey, Obj],
    ports: list[Obj],
) -> tuple[list[Obj], list[Obj], list[Obj]]:
    """Upstream ``reconcileByPortMapping``: the three placement steps for one port set."""
    service, address_type, options = here.service, here.address_type, here.options
    by_name: dict[str, Obj] = {}
    unchanged: list[str] = []
    to_update: list[str] = []
    to_delete: list[str] = []
    pending = dict(desired)
    # 1. Keep the endpoints still wanted, in place; note which slices changed.
    for endpoint_slice in existing:
        name = _name(endpoint_slice)
        old_endpoints = endpoint_slice.get("endpoints") or []
        kept: list[Obj] = []
        changed = False
        for endpoint in old_endpoints:
            want = pending.pop(endpoint_key(endpoint), None)
            if want is not None:
                kept.append(want)
                changed = changed or not endpoints_equal_beyond_hash(want, endpoint)
        labels, labels_changed = slice_labels(
            _meta(endpoint_slice).get("labels") or {}, service, options.controller
        )
        if changed or len(kept) != len(old_endpoints):
            if not kept:
                to_delete.append(name)
                by_name[name] = copy_slice(endpoint_slice)
                continue
            copied = copy_slice(endpoint_slice)
            copied["endpoints"] = kept
            copied["metadata"]["labels"] = labels
            by_name[name] = copied
            to_update.append(name)
        elif labels_changed:
            copied = copy_slice(endpoint_slice)
            copied["metadata"]["labels"] = labels
            by_name[name] = copied
            to_update.append(name)
        else:
            by_name[name] = endpoint_slice  # type: ignore[assignment]
            unchanged.append(name)

    # 2. Slices written anyway take new endpoints first, the fullest first.
    if pending and to_update:
        for name in sorted(to_update, key=lambda n: -len(by_name[n]["endpoints"])):
            _fill(by_name[name], pending, options.max_per_slice)

    # 3. The rest: into the unchanged slice closest to full, else into new slices.
    to_create: list[Obj] = []
    while pending:
        target: Obj | None = None
        if len(pending) < options.max_per_slice and unchanged:
            found = _slice_to_fill(
                [by_name[n] for n in unchanged], len(pending), options.max_per_slice
            )
            if found is not None:
                target = copy_slice(found)
                by_name[_name(target)] = target
        if target is None:
            target = new_endpoint_slice(service, ports, address_type, options.controller)
        _fill(target, pending, options.max_per_slice)
        name = _name(target)
        if name:
            to_update.append(name)
            unchanged.remove(name)
        else:
            to_create.append(target)
    return to_create, [by_name[n] for n in to_update], [by_name[n] for n in to_delete]


def _fill(endpoint_slice: Obj, pending: dict[EndpointKey, Obj], max_per_slice: int) -> None:
    endpoints = endpoint_slice["endpoints"]
    while pending and len(endpoints) < max_per_slice:
        key = next(iter(pending))
        endpoints.append(pending.pop(key))


def _slice_to_fill(slices: list[Obj], count: int, max_per_slice: int) -> Obj | None:
    """Upstream ``getSliceToFill``: the slice left closest to full after taking ``count``."""
    best: Obj | None = None
    best_room = max_per_slice
    for endpoint_slice in slices:
        room = max_per_slice - (count + len(endpoint_slice.get("endpoints") or ()))
        if 0 <= room < best_room:
            best, best_room = endpoint_slice, room
            if room == 0:
                break
    return best


def _same_placeholder(existing: Mapping[str, Any], placeholder: Mapping[str, Any]) -> bool:
    """Upstream's placeholder comparison: namespace, labels, owners, type, no ports/endpoints."""
    a, b = _meta(existing), _meta(placeholder)
    return (
        a.get("namespace", "default") == b.get("namespace")
        and (a.get("labels") or {}) == b.get("labels")
        and (a.get("ownerReferences") or []) == b.get("ownerReferences")
        and existing.get("addressType") == placeholder.get("addressType")
        and not existing.get("ports")
        and not existing.get("endpoints")
    )


def _valid_traffic_distribution(value: object, options: _Options) -> bool:
    if not isinstance(value, str) or not options.traffic_distribution_enabled:
        return False
    if value == "PreferClose":
        return True
    return options.prefer_same_traffic_distribution and value in _TRAFFIC_DISTRIBUTIONS


def _apply_hints(
    here: _Pass,
    existing: list[Mapping[str, Any]],
    to_create: list[Obj],
    to_update: list[Obj],
    to_delete: list[Obj],
) -> tuple[list[Obj], list[Obj], list[dict[str, str]]]:
    """Topology-mode Auto, else trafficDistribution, else no hints at all."""
    service, address_type, options = here.service, here.address_type, here.options
    annotations = _meta(service).get("annotations") or {}
    traffic_distribution = (service.get("spec") or {}).get("trafficDistribution")
    auto = hints_enabled(annotations)
    use_traffic_distribution = (
        _valid_traffic_distribution(traffic_distribution, options) and not auto
    )
    key = service_key(service)
    cache = options.topology_cache
    events: list[dict[str, str]] = []
    unchanged = unchanged_slices(existing, to_update, to_delete)
    if cache is not None and auto:
        to_create, to_update, events = cache.add_hints(
            key, address_type, to_create, to_update, unchanged
        )
    else:
        if cache is not None:
            if cache.has_populated_hints(key):
                events.append(
                    event(
                        "Warning",
                        "TopologyAwareHintsDisabled",
                        format_with_address_type(TOPOLOGY_AWARE_HINTS_DISABLED, address_type),
                    )
                )
            cache.remove_hints(key, address_type)
        if not use_traffic_distribution:
            to_create, to_update, _ = remove_hints_from_slices(to_create, to_update, unchanged)
    if use_traffic_distribution:
        to_create, to_update, _ = reconcile_hints(
            traffic_distribution,
            to_create,
            to_update,
            unchanged_slices(existing, to_update, to_delete),
        )
    return to_create, to_update, events


def _finalize(
    service: Mapping[str, Any],
    to_create: list[Obj],
    to_update: list[Obj],
    to_delete: list[Obj],
    result: ReconcileResult,
) -> None:
    """Upstream ``finalize``'s pure part: a create reuses the name of a slice to delete."""
    remaining: list[Obj] = []
    for doomed in to_delete:
        if (
            to_create
            and doomed.get("addressType") == to_create[-1].get("addressType")
            and owned_by(doomed, service)
        ):
            reused = to_create.pop()
            reused["metadata"] = {**reused["metadata"], "name": _name(doomed)}
            reused["metadata"].pop("generateName", None)
            to_update.append(reused)
        else:
            remaining.append(doomed)
    # No new slices for a Service being deleted: the garbage collector is removing them.
    if not _meta(service).get("deletionTimestamp"):
        result.to_create += to_create
    result.to_update += to_update
    result.to_delete += remaining
