"""Parse Kubernetes-shaped dicts (decoded YAML/JSON) into the immutable model types.

Each ``parse_*`` function either returns a model object or raises :class:`InvalidObjectError`
naming the kind, namespace/name and the first field that is wrong, so a source can log
one clear line and skip that object while every other object keeps working.

Validation follows the API server's rules where they matter to a proxy (IP syntax, port
ranges, unique port names and port/protocol pairs, DNS label names) because objects from
a manifest directory have not been through an API server. Headless and ExternalName
Services parse to a :class:`Service` with no ports: valid, but nothing to proxy.
"""

from __future__ import annotations

import ipaddress
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

from kubeproxy.model.types import (
    ANNOTATION_TRIGGER_TIME,
    DEFAULT_AFFINITY_TIMEOUT_SECONDS,
    LABEL_SERVICE_NAME,
    PLAIN_IPV4,
    TAINT_TO_BE_DELETED,
    EndpointConditions,
    EndpointSlice,
    IPFamily,
    L4Protocol,
    NamespacedName,
    Node,
    NodeAddress,
    Service,
    ServiceCIDR,
    ServicePort,
    ServicePortName,
    ServiceType,
    SliceEndpoint,
    SlicePort,
    TrafficPolicy,
    family_of,
)

# Anchored with \Z, not $: "$" also matches before a trailing newline, which would let
# a name like "web\n" through into log lines and rule scripts.
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z"
)
_PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_ZONE_OR_NODE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")


class InvalidObjectError(ValueError):
    """An object that cannot be used; the message is one loggable line."""

    def __init__(self, kind: str, key: str, reason: str) -> None:
        super().__init__(f"Skipping invalid {kind} {key}: {reason}")
        self.kind = kind
        self.key = key
        self.reason = reason


class _InvalidError(Exception):
    """Raised inside a parser; converted to InvalidObjectError with the object's identity."""


def _fail(path: str, message: str) -> _InvalidError:
    return _InvalidError(f"{path}: {message}")


def _mapping(obj: Any, path: str) -> Mapping[str, Any]:
    if type(obj) is dict:  # the common case, without an ABC check
        return obj
    if obj is None:
        return {}
    if not isinstance(obj, Mapping):
        raise _fail(path, f"must be an object, got {type(obj).__name__}")
    return obj


def _list(obj: Any, path: str) -> list[Any]:
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise _fail(path, f"must be a list, got {type(obj).__name__}")
    return obj


def _str(obj: Any, path: str, default: str = "") -> str:
    if obj is None:
        return default
    if not isinstance(obj, str):
        raise _fail(path, f"must be a string, got {type(obj).__name__}")
    return obj


def _bool(obj: Any, path: str, default: bool) -> bool:
    if obj is None:
        return default
    if not isinstance(obj, bool):
        raise _fail(path, f"must be a boolean, got {obj!r}")
    return obj


def _int(obj: Any, path: str, lo: int, hi: int, *, default: int | None = None) -> int:
    if obj is None:
        if default is None:
            raise _fail(path, "required")
        return default
    if isinstance(obj, bool) or not isinstance(obj, int):
        raise _fail(path, f"must be an integer, got {obj!r}")
    if not lo <= obj <= hi:
        raise _fail(path, f"must be between {lo} and {hi}, got {obj}")
    return obj


def canonical_ip(value: Any, path: str) -> str:
    """Validate an IP address and return its canonical spelling."""
    if type(value) is str and PLAIN_IPV4.fullmatch(value):
        return value  # already canonical
    text = _str(value, path)
    try:
        # Python accepts IPv6 zone IDs ("fe80::1%eth0") with arbitrary text after the "%"
        # and keeps them in str(); Kubernetes IPs never have one, and the text would end
        # up verbatim in rule scripts.
        if "%" in text:
            raise ValueError(text)
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise _fail(path, f"invalid IP address {text!r}") from None


def canonical_cidr(value: Any, path: str) -> str:
    """Validate a CIDR (surrounding whitespace allowed, host bits ignored as upstream)."""
    text = _str(value, path)
    try:
        if "%" in text:  # no IPv6 zone IDs (see canonical_ip)
            raise ValueError(text)
        return str(ipaddress.ip_network(text.strip(), strict=False))
    except ValueError:
        raise _fail(path, f"invalid CIDR {text!r}") from None


def _metadata(obj: Mapping[str, Any], *, namespaced: bool) -> tuple[str, str]:
    meta = _mapping(obj.get("metadata"), "metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise _fail("metadata.name", "required")
    namespace = ""
    if namespaced:
        namespace = _str(meta.get("namespace"), "metadata.namespace", "default") or "default"
        if len(namespace) > 63 or not _DNS1123_LABEL.match(namespace):
            raise _fail("metadata.namespace", f"not a DNS-1123 label: {namespace!r}")
    return namespace, name


def _identity(obj: Any, *, namespaced: bool) -> str:
    """Best-effort namespace/name for log lines, even for garbage input."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return "<unknown>"
    name = meta.get("name")
    name_s = name if isinstance(name, str) else "<unknown>"
    if not namespaced:
        return _printable(name_s)
    ns = meta.get("namespace")
    ns_s = ns if isinstance(ns, str) and ns else "default"
    return _printable(f"{ns_s}/{name_s}")


def _printable(text: str) -> str:
    """Keep hostile names from forging log lines: escape anything non-printable."""
    shown = text if len(text) <= 300 else text[:300] + "..."
    return shown if shown.isprintable() else shown.encode("unicode_escape").decode("ascii")


def _protocol(value: Any, path: str) -> L4Protocol:
    text = _str(value, path, "TCP")
    try:
        return L4Protocol(text)
    except ValueError:
        raise _fail(path, f"unsupported protocol {text!r}") from None


# ---------------------------------------------------------------------------- Service


def parse_service(obj: Any) -> Service:
    try:
        return _parse_service(_mapping(obj, "<root>"))
    except _InvalidError as err:
        raise InvalidObjectError("Service", _identity(obj, namespaced=True), str(err)) from None


def _parse_service(obj: Mapping[str, Any]) -> Service:
    namespace, name = _metadata(obj, namespaced=True)
    if len(name) > 63 or not _DNS1123_LABEL.match(name) or not name[0].isalpha():
        raise _fail("metadata.name", f"not a DNS-1035 label: {name!r}")
    spec = _mapping(obj.get("spec"), "spec")
    type_text = _str(spec.get("type"), "spec.type", "ClusterIP")
    try:
        svc_type = ServiceType(type_text)
    except ValueError:
        raise _fail("spec.type", f"unsupported type {type_text!r}") from None
    if svc_type is ServiceType.EXTERNAL_NAME:
        return Service(namespace, name, ())

    cluster_ips = _cluster_ips(spec)
    if cluster_ips is None:  # headless
        return Service(namespace, name, ())
    meta = _mapping(obj.get("metadata"), "metadata")
    annotations = _mapping(meta.get("annotations"), "metadata.annotations")
    preserve = annotations.get("preserve-destination") == "true"

    external_ips = tuple(
        canonical_ip(ip, f"spec.externalIPs[{i}]")
        for i, ip in enumerate(_list(spec.get("externalIPs"), "spec.externalIPs"))
    )
    lb_ips = _load_balancer_ips(obj) if svc_type is ServiceType.LOAD_BALANCER else ()
    source_ranges = tuple(
        canonical_cidr(r, f"spec.loadBalancerSourceRanges[{i}]")
        for i, r in enumerate(
            _list(spec.get("loadBalancerSourceRanges"), "spec.loadBalancerSourceRanges")
        )
    )
    affinity_timeout = _session_affinity(spec)
    etp = _policy(spec.get("externalTrafficPolicy"), "spec.externalTrafficPolicy")
    itp = _policy(spec.get("internalTrafficPolicy"), "spec.internalTrafficPolicy")
    hc_port = 0
    if svc_type is ServiceType.LOAD_BALANCER or svc_type is ServiceType.NODE_PORT:
        hc_port = _int(
            spec.get("healthCheckNodePort"), "spec.healthCheckNodePort", 0, 65535, default=0
        )
    distribution = spec.get("trafficDistribution")
    if distribution is not None:
        distribution = _str(distribution, "spec.trafficDistribution")

    raw_ports = _list(spec.get("ports"), "spec.ports")
    if not raw_ports:
        raise _fail("spec.ports", "required")
    ports: list[ServicePort] = []
    seen_names: set[str] = set()
    seen_ports: set[tuple[int, L4Protocol]] = set()
    seen_node_ports: set[tuple[int, L4Protocol]] = set()
    for i, raw in enumerate(raw_ports):
        path = f"spec.ports[{i}]"
        port_obj = _mapping(raw, path)
        port_name = _str(port_obj.get("name"), f"{path}.name")
        if port_name and (len(port_name) > 63 or not _PORT_NAME.match(port_name)):
            raise _fail(f"{path}.name", f"not a DNS-1123 label: {port_name!r}")
        if len(raw_ports) > 1 and not port_name:
            raise _fail(f"{path}.name", "required when the Service has more than one port")
        if port_name in seen_names:
            raise _fail(f"{path}.name", f"duplicate port name {port_name!r}")
        seen_names.add(port_name)
        protocol = _protocol(port_obj.get("protocol"), f"{path}.protocol")
        number = _int(port_obj.get("port"), f"{path}.port", 1, 65535)
        if (number, protocol) in seen_ports:
            raise _fail(f"{path}", f"duplicate port {number}/{protocol.value}")
        seen_ports.add((number, protocol))
        node_port = 0
        if svc_type in (ServiceType.NODE_PORT, ServiceType.LOAD_BALANCER):
            node_port = _int(port_obj.get("nodePort"), f"{path}.nodePort", 0, 65535, default=0)
            if node_port and (node_port, protocol) in seen_node_ports:
                raise _fail(f"{path}.nodePort", f"duplicate nodePort {node_port}")
            seen_node_ports.add((node_port, protocol))
        ports.append(
            ServicePort(
                name=ServicePortName(NamespacedName(namespace, name), port_name, protocol),
                cluster_ips=cluster_ips,
                port=number,
                node_port=node_port,
                external_ips=external_ips,
                load_balancer_ips=lb_ips,
                load_balancer_source_ranges=source_ranges,
                affinity_timeout=affinity_timeout,
                external_traffic_policy=etp,
                internal_traffic_policy=itp,
                health_check_node_port=hc_port,
                traffic_distribution=distribution,
                preserve_destination=preserve,
            )
        )
    return Service(namespace, name, tuple(ports))


def _cluster_ips(spec: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The Service's ClusterIPs, one per family; None for a headless Service."""
    raw = _list(spec.get("clusterIPs"), "spec.clusterIPs")
    path = "spec.clusterIPs"
    if not raw:
        single = spec.get("clusterIP")
        raw = [] if single in (None, "") else [single]
        path = "spec.clusterIP"
    if not raw:
        raise _fail("spec.clusterIP", "required (kubeproxy does not allocate ClusterIPs)")
    if raw[0] == "None":
        return None
    ips = tuple(canonical_ip(ip, f"{path}[{i}]") for i, ip in enumerate(raw))
    if len(ips) > 2 or len({family_of(ip) for ip in ips}) != len(ips):
        raise _fail(path, "at most one address per IP family")
    return ips


def _load_balancer_ips(obj: Mapping[str, Any]) -> tuple[str, ...]:
    status = _mapping(obj.get("status"), "status")
    lb = _mapping(status.get("loadBalancer"), "status.loadBalancer")
    ips: list[str] = []
    for i, raw in enumerate(_list(lb.get("ingress"), "status.loadBalancer.ingress")):
        path = f"status.loadBalancer.ingress[{i}]"
        ingress = _mapping(raw, path)
        # ipMode Proxy: the load balancer delivers to the node, not to the VIP, so the
        # proxy must not capture the VIP (KEP-1860).
        if _str(ingress.get("ipMode"), f"{path}.ipMode", "VIP") == "Proxy":
            continue
        if ingress.get("ip"):
            ips.append(canonical_ip(ingress["ip"], f"{path}.ip"))
    return tuple(dict.fromkeys(ips))


def _session_affinity(spec: Mapping[str, Any]) -> int | None:
    affinity = _str(spec.get("sessionAffinity"), "spec.sessionAffinity", "None")
    if affinity == "None":
        return None
    if affinity != "ClientIP":
        raise _fail("spec.sessionAffinity", f"unsupported value {affinity!r}")
    cfg = _mapping(spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
    client = _mapping(cfg.get("clientIP"), "spec.sessionAffinityConfig.clientIP")
    return _int(
        client.get("timeoutSeconds"),
        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
        1,
        86400,
        default=DEFAULT_AFFINITY_TIMEOUT_SECONDS,
    )


def _policy(value: Any, path: str) -> TrafficPolicy:
    text = _str(value, path, "Cluster")
    try:
        return TrafficPolicy(text)
    except ValueError:
        raise _fail(path, f"unsupported value {text!r}") from None


# ---------------------------------------------------------------------- EndpointSlice


def parse_endpoint_slice(obj: Any) -> EndpointSlice | None:
    """Parse an EndpointSlice; None for slices a proxy ignores (FQDN address type)."""
    try:
        return _parse_endpoint_slice(_mapping(obj, "<root>"))
    except _InvalidError as err:
        key = _identity(obj, namespaced=True)
        raise InvalidObjectError("EndpointSlice", key, str(err)) from None


def skipped_parts(endpoint_slice: EndpointSlice) -> str | None:
    """One loggable line for what :func:`parse_endpoint_slice` left out of the slice (a
    port, an endpoint), or None when nothing was."""
    if not endpoint_slice.skipped:
        return None
    key = f"{endpoint_slice.namespace}/{endpoint_slice.name}"
    return f"Ignoring part of EndpointSlice {key}: {'; '.join(endpoint_slice.skipped)}"


def _parse_endpoint_slice(obj: Mapping[str, Any]) -> EndpointSlice | None:
    namespace, name = _metadata(obj, namespaced=True)
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        raise _fail("metadata.name", f"not a DNS-1123 subdomain: {name!r}")
    if obj.get("addressType") == "FQDN":
        return None  # proxies never use FQDN slices, whatever else they hold
    meta = _mapping(obj.get("metadata"), "metadata")
    labels = _mapping(meta.get("labels"), "metadata.labels")
    service_name = _str(labels.get(LABEL_SERVICE_NAME), f"metadata.labels[{LABEL_SERVICE_NAME}]")
    if not service_name:
        raise _fail(f"metadata.labels[{LABEL_SERVICE_NAME}]", "required")
    if len(service_name) > 63 or not _DNS1123_LABEL.match(service_name):
        raise _fail(
            f"metadata.labels[{LABEL_SERVICE_NAME}]", f"not a Service name: {service_name!r}"
        )
    address_type = _str(obj.get("addressType"), "addressType")
    if address_type == "FQDN":
        return None
    try:
        family = IPFamily(address_type)
    except ValueError:
        raise _fail("addressType", f"unsupported value {address_type!r}") from None

    skipped: list[str] = []
    ports: list[SlicePort] = []
    seen: set[tuple[str, L4Protocol]] = set()
    for i, raw in enumerate(_list(obj.get("ports"), "ports")):
        path = f"ports[{i}]"
        port_obj = _mapping(raw, path)
        port_name = _str(port_obj.get("name"), f"{path}.name")
        protocol = _protocol(port_obj.get("protocol"), f"{path}.protocol")
        number = port_obj.get("port")
        if type(number) is not int or not 0 < number <= 65535:
            # The API server accepts any number, or none ("all ports", which no proxy
            # implements); upstream skips a missing or 0 port, and only that port.
            skipped.append(f"{path}.port: not a usable port: {number!r}")
            continue
        if (port_name, protocol) in seen:
            raise _fail(path, f"duplicate port {port_name!r}/{protocol.value}")
        seen.add((port_name, protocol))
        ports.append(SlicePort(port_name, protocol, number))

    endpoints: list[SliceEndpoint] = []
    for i, raw in enumerate(_list(obj.get("endpoints"), "endpoints")):
        # Only a bad endpoint is left out (the API server would have refused the whole
        # slice; from a manifest the rest still serves). Its fields are checked with
        # paths relative to it: spelling the full path up front would cost more than the
        # checks (once per endpoint).
        try:
            ep = raw if type(raw) is dict else _mapping(raw, f"endpoints[{i}]")
        except _InvalidError as err:
            skipped.append(str(err))
            continue
        try:
            endpoints.append(_slice_endpoint(ep, family))
        except _InvalidError as err:
            skipped.append(f"endpoints[{i}].{err}")
    annotations = _mapping(meta.get("annotations"), "metadata.annotations")
    return EndpointSlice(
        namespace=namespace,
        name=name,
        service_name=service_name,
        address_type=family,
        ports=tuple(ports),
        endpoints=tuple(endpoints),
        trigger_time=_trigger_time(annotations.get(ANNOTATION_TRIGGER_TIME)),
        skipped=tuple(skipped),
    )


# The eight possible conditions, shared: a cluster has one per endpoint otherwise.
_CONDITIONS = {
    (ready, serving, terminating): EndpointConditions(ready, serving, terminating)
    for ready in (True, False)
    for serving in (True, False)
    for terminating in (True, False)
}


def _slice_endpoint(ep: Mapping[str, Any], family: IPFamily) -> SliceEndpoint:
    """One endpoint; error paths relative to it (the caller prefixes ``endpoints[i].``)."""
    addresses_raw = _list(ep.get("addresses"), "addresses")
    if not addresses_raw:
        raise _fail("addresses", "at least one address is required")
    first = addresses_raw[0]
    if (
        len(addresses_raw) == 1
        and family is IPFamily.IPv4
        and type(first) is str
        and PLAIN_IPV4.fullmatch(first)
    ):
        # Nearly every endpoint: one canonical IPv4 address, checked once (this runs for
        # every endpoint of every changed slice).
        addresses: tuple[str, ...] = (first,)
    else:
        addresses = tuple(
            a if type(a) is str and PLAIN_IPV4.fullmatch(a) else canonical_ip(a, f"addresses[{j}]")
            for j, a in enumerate(addresses_raw)
        )
        for j, address in enumerate(addresses):
            if family_of(address) is not family:
                raise _fail(f"addresses[{j}]", f"{address} is not an {family.value} address")
    cond = _mapping(ep.get("conditions"), "conditions")
    conditions = _CONDITIONS[
        _bool(cond.get("ready"), "conditions.ready", True),
        _bool(cond.get("serving"), "conditions.serving", True),
        _bool(cond.get("terminating"), "conditions.terminating", False),
    ]
    node_name = _optional_name(ep.get("nodeName"), "nodeName")
    zone = _zone(ep.get("zone"), "zone") or None
    hints = ep.get("hints")
    if hints is None:
        return SliceEndpoint(addresses, conditions, node_name, zone)
    hints = _mapping(hints, "hints")
    zone_hints = _hint_names(hints.get("forZones"), "hints.forZones", _zone)
    node_hints = _hint_names(hints.get("forNodes"), "hints.forNodes", _optional_name)
    return SliceEndpoint(addresses, conditions, node_name, zone, zone_hints, node_hints)


# Node and zone names already validated, each to its one interned copy: they repeat
# across every endpoint of the cluster. Bounded, in case names keep changing.
_VALID_NAMES: dict[str, str] = {}
_VALID_NAMES_MAX = 65536


def _optional_name(value: Any, path: str) -> str | None:
    known = _VALID_NAMES.get(value) if type(value) is str else None
    if known is not None:
        return known
    text = _str(value, path)
    if not text:
        return None
    if len(text) > 253 or not _ZONE_OR_NODE.match(text):
        raise _fail(path, f"invalid name {_printable(text)!r}")
    name = sys.intern(text)
    if len(_VALID_NAMES) >= _VALID_NAMES_MAX:
        _VALID_NAMES.clear()
    _VALID_NAMES[name] = name
    return name


def _zone(value: Any, path: str) -> str:
    """A zone name as an endpoint or a zone hint gives it: any string. The API server
    checks an endpoint's ``zone`` not at all and a hint's as a label value (``""``
    included); a proxy only compares it with its node's zone label, as upstream, so a
    zone no node has is simply never matched."""
    if type(value) is str:
        return sys.intern(value)
    return sys.intern(_str(value, path))


def _hint_names(value: Any, path: str, name_of: Callable[[Any, str], str | None]) -> frozenset[str]:
    names: set[str] = set()
    for i, raw in enumerate(_list(value, path)):
        where = f"{path}[{i}].name"
        name = name_of(_mapping(raw, f"{path}[{i}]").get("name"), where)
        if name is None:
            raise _fail(where, "required")
        names.add(name)
    return frozenset(names)


def _trigger_time(value: Any) -> float | None:
    # A malformed annotation only loses a metric sample; it must not reject the slice.
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# ------------------------------------------------------------------------------- Node


def parse_node(obj: Any) -> Node:
    try:
        return _parse_node(_mapping(obj, "<root>"))
    except _InvalidError as err:
        raise InvalidObjectError("Node", _identity(obj, namespaced=False), str(err)) from None


def _parse_node(obj: Mapping[str, Any]) -> Node:
    _, name = _metadata(obj, namespaced=False)
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        raise _fail("metadata.name", f"not a DNS-1123 subdomain: {name!r}")
    meta = _mapping(obj.get("metadata"), "metadata")
    labels = _mapping(meta.get("labels"), "metadata.labels")
    label_items = tuple(
        # The key goes into the error's field path: escape it so the message stays one line.
        sorted(
            (str(k), _str(v, f"metadata.labels[{_printable(str(k))}]")) for k, v in labels.items()
        )
    )
    status = _mapping(obj.get("status"), "status")
    addresses: list[NodeAddress] = []
    for i, raw in enumerate(_list(status.get("addresses"), "status.addresses")):
        path = f"status.addresses[{i}]"
        addr = _mapping(raw, path)
        kind = _str(addr.get("type"), f"{path}.type")
        if kind in ("InternalIP", "ExternalIP"):
            ip = canonical_ip(addr.get("address"), f"{path}.address")
            addresses.append(NodeAddress(kind, ip))
    spec = _mapping(obj.get("spec"), "spec")
    taints = _list(spec.get("taints"), "spec.taints")
    to_be_deleted = any(
        isinstance(t, Mapping) and t.get("key") == TAINT_TO_BE_DELETED for t in taints
    )
    # spec.podCIDRs (one per family) supersedes the older single spec.podCIDR.
    raw_cidrs = _list(spec.get("podCIDRs"), "spec.podCIDRs")
    pod_cidrs = tuple(canonical_cidr(c, f"spec.podCIDRs[{i}]") for i, c in enumerate(raw_cidrs))
    if not pod_cidrs and spec.get("podCIDR"):
        pod_cidrs = (canonical_cidr(spec.get("podCIDR"), "spec.podCIDR"),)
    return Node(
        name=name,
        labels=label_items,
        addresses=tuple(addresses),
        deleting=bool(meta.get("deletionTimestamp")),
        to_be_deleted_taint=to_be_deleted,
        pod_cidrs=pod_cidrs,
    )


# ------------------------------------------------------------------------ ServiceCIDR


def parse_service_cidr(obj: Any) -> ServiceCIDR:
    try:
        return _parse_service_cidr(_mapping(obj, "<root>"))
    except _InvalidError as err:
        raise InvalidObjectError(
            "ServiceCIDR", _identity(obj, namespaced=False), str(err)
        ) from None


def _parse_service_cidr(obj: Mapping[str, Any]) -> ServiceCIDR:
    _, name = _metadata(obj, namespaced=False)
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        raise _fail("metadata.name", f"not a DNS-1123 subdomain: {name!r}")
    spec = _mapping(obj.get("spec"), "spec")
    cidrs = tuple(
        canonical_cidr(c, f"spec.cidrs[{i}]")
        for i, c in enumerate(_list(spec.get("cidrs"), "spec.cidrs"))
    )
    if not cidrs or len(cidrs) > 2 or len({family_of(c) for c in cidrs}) != len(cidrs):
        raise _fail("spec.cidrs", "one or two CIDRs, at most one per IP family")
    return ServiceCIDR(name, cidrs)


def object_key(kind: str, obj: Mapping[str, Any]) -> NamespacedName | None:
    """The identity of a raw object, used to pair adds/updates/deletes across reloads."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    if kind in ("Node", "ServiceCIDR"):
        return NamespacedName("", meta["name"])
    ns = meta.get("namespace")
    return NamespacedName(ns if isinstance(ns, str) and ns else "default", meta["name"])


# ---------------------------------------------------------------- raw object shapes


# A field's expected shape: a mapping of its fields, a one-item list (every item has
# that shape; no item may be null), a check called with (value, path) that raises
# _InvalidError, or Required(shape). An absent (None) field passes unless Required:
# defaults are the reader's business.
@dataclass(frozen=True, slots=True)
class Required:
    shape: Shape


Check = Callable[[Any, str], object]
Shape: TypeAlias = "Mapping[str, Shape] | list[Shape] | Check | Required"


def check_shape(kind: str, obj: Any, shape: Mapping[str, Shape], *, namespaced: bool) -> None:
    """Raise InvalidObjectError (one line, naming the field) unless every field ``shape``
    declares has its type and range, and the object's name is a DNS-1123 subdomain (and
    its namespace a DNS-1123 label).

    For raw objects that code reads before any ``parse_*`` function sees them (the
    standalone control plane reads Pods, and Services before they have a ClusterIP):
    that code may then trust the types of what it reads."""
    try:
        root = _mapping(obj, "<root>")
        _, name = _metadata(root, namespaced=namespaced)
        if len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
            raise _fail("metadata.name", f"not a DNS-1123 subdomain: {name!r}")
        _check(root, shape, "")
    except _InvalidError as err:
        raise InvalidObjectError(kind, _identity(obj, namespaced=namespaced), str(err)) from None


def _check(value: Any, shape: Shape, path: str) -> None:
    if isinstance(shape, Required):
        if value is None:
            raise _fail(path, "required")
        shape = shape.shape
    if value is None:
        return
    if isinstance(shape, Mapping):
        fields = _mapping(value, path or "<root>")
        for key, inner in shape.items():
            _check(fields.get(key), inner, f"{path}.{key}" if path else key)
    elif isinstance(shape, list):
        for i, item in enumerate(_list(value, path)):
            _check(item, Required(shape[0]), f"{path}[{i}]")
    elif not isinstance(shape, Required):  # Required(Required(...)) means Required(...)
        shape(value, path)
    else:
        _check(value, shape, path)


def string(value: Any, path: str) -> object:
    return _str(value, path)


def boolean(value: Any, path: str) -> object:
    return _bool(value, path, False)


def port_number(value: Any, path: str) -> object:
    return _int(value, path, 1, 65535, default=1)


def port_or_zero(value: Any, path: str) -> object:
    return _int(value, path, 0, 65535, default=0)


def int_or_string(value: Any, path: str) -> object:
    """A port number, or a port name (``targetPort``)."""
    if isinstance(value, str):
        return value
    return port_number(value, path)


def ip_address(value: Any, path: str) -> object:
    return canonical_ip(value, path)


def node_name(value: Any, path: str) -> object:
    return _optional_name(value, path)


def string_map(value: Any, path: str) -> object:
    """Labels, annotations, a selector: string keys, string values."""
    for key, item in _mapping(value, path).items():
        where = f"{path}[{_printable(str(key))}]"
        if not isinstance(key, str):
            raise _fail(where, f"key must be a string, got {type(key).__name__}")
        _str(item, where)
    return value


def invalid(path: str, message: str) -> Exception:
    """The error a custom check raises (caught by :func:`check_shape`)."""
    return _fail(path, message)
