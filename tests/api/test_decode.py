"""kubeproxy.sources.kube_decode: fast decoding must not change what the parser sees.

The per-kind Structs skip the fields the parser does not read; if parse.py starts
reading one they do not declare, these comparisons (typed path vs. a plain JSON decode)
fail for the objects below, which set every field the model uses.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from typing import Any

import pytest

from kubeproxy.model.events import Model
from kubeproxy.model.parse import (
    InvalidObjectError,
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
)
from kubeproxy.sources.kube_decode import (
    DecodeError,
    decode_event,
    decode_list,
    decode_resource_names,
    decode_status,
    gc_paused,
    object_decoder,
)
from tests.apiserver import endpoint_slice_object, node_object, service_object
from tests.unit.conftest import node_obj, service_obj, slice_obj

Parser = Callable[[Any], Model | None]
PARSERS: dict[str, Parser] = {
    "Service": parse_service,
    "EndpointSlice": parse_endpoint_slice,
    "Node": parse_node,
    "ServiceCIDR": parse_service_cidr,
}


def rich_service() -> dict[str, Any]:
    obj = service_obj(
        "lb",
        "prod",
        ports=[
            {"name": "http", "port": 80, "nodePort": 30080},
            {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
        ],
        status={
            "loadBalancer": {
                "ingress": [{"ip": "203.0.113.7"}, {"ip": "203.0.113.8", "ipMode": "Proxy"}]
            },
            "conditions": [{"type": "Ready"}],
        },
        type="LoadBalancer",
        clusterIPs=["10.96.0.10", "fd00::10"],
        externalIPs=["198.51.100.1"],
        loadBalancerSourceRanges=["203.0.113.0/24"],
        sessionAffinity="ClientIP",
        sessionAffinityConfig={"clientIP": {"timeoutSeconds": 600}},
        externalTrafficPolicy="Local",
        internalTrafficPolicy="Local",
        healthCheckNodePort=32000,
        trafficDistribution="PreferClose",
    )
    obj["metadata"]["labels"] = {"app": "lb"}
    obj["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    return obj


def rich_slice() -> dict[str, Any]:
    return slice_obj(
        "lb-1",
        "lb",
        "prod",
        ports=[{"name": "http", "port": 8080}, {"name": "dns", "port": 53, "protocol": "UDP"}],
        endpoints=[
            {
                "addresses": ["10.1.0.1"],
                "conditions": {"ready": False, "serving": True, "terminating": True},
                "nodeName": "node-a",
                "zone": "zone-a",
                "hints": {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "node-a"}]},
                "targetRef": {"kind": "Pod", "name": "lb-abc"},
            },
            {"addresses": ["10.1.0.2"]},
        ],
        annotations={"endpoints.kubernetes.io/last-change-trigger-time": "2025-01-01T00:00:00Z"},
    )


def rich_node() -> dict[str, Any]:
    obj = node_obj(
        "node-a",
        labels={"topology.kubernetes.io/zone": "zone-a", "kubernetes.io/os": "linux"},
        addresses=[
            {"type": "InternalIP", "address": "192.168.0.1"},
            {"type": "InternalIP", "address": "fd00::1"},
            {"type": "ExternalIP", "address": "198.51.100.9"},
            {"type": "Hostname", "address": "node-a"},
        ],
        taints=[{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}],
        deletion_timestamp="2025-01-01T00:00:00Z",
    )
    obj["status"]["images"] = [{"names": ["pause"], "sizeBytes": 1}]
    return obj


def cidr() -> dict[str, Any]:
    return {
        "kind": "ServiceCIDR",
        "apiVersion": "networking.k8s.io/v1",
        "metadata": {"name": "kubernetes", "resourceVersion": "5"},
        "spec": {"cidrs": ["10.96.0.0/16", "fd00:96::/112"]},
    }


VALID = {
    "service": ("Service", rich_service()),
    "headless-service": ("Service", service_obj("h", clusterIP="None")),
    "external-name": ("Service", service_obj("e", type="ExternalName")),
    "slice": ("EndpointSlice", rich_slice()),
    "fqdn-slice": ("EndpointSlice", slice_obj(address_type="FQDN")),
    "node": ("Node", rich_node()),
    "service-cidr": ("ServiceCIDR", cidr()),
    "realistic-service": ("Service", service_object("svc-1", "ns-1", "10.96.1.1")),
    "realistic-slice": (
        "EndpointSlice",
        endpoint_slice_object("svc-1-abc", "ns-1", "svc-1", ["10.1.0.1", "10.1.0.2"]),
    ),
    "realistic-node": ("Node", node_object("node-a", "192.168.0.1")),
}


def broken(base: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(json.dumps(base))
    target = obj
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return obj


INVALID = {
    "metadata-not-an-object": ("Service", broken(rich_service(), ("metadata",), "x")),
    "status-not-an-object": ("Service", broken(rich_service(), ("status",), [1])),
    "spec-wrong-type": ("Service", broken(rich_service(), ("spec",), 7)),
    "bad-port": ("Service", broken(rich_service(), ("spec", "ports"), [{"port": "80"}])),
    "labels-not-an-object": ("EndpointSlice", broken(rich_slice(), ("metadata", "labels"), 5)),
    "endpoints-not-a-list": ("EndpointSlice", broken(rich_slice(), ("endpoints",), {"a": 1})),
    "node-status-addresses": ("Node", broken(rich_node(), ("status", "addresses"), "x")),
    "node-status-not-object": ("Node", broken(rich_node(), ("status",), "x")),
    "cidr-spec": ("ServiceCIDR", broken(cidr(), ("spec", "cidrs"), ["nope"])),
}


def outcome(parser: Parser, obj: Any) -> Model | str | None:
    try:
        return parser(obj)
    except InvalidObjectError as err:
        return str(err)


@pytest.mark.parametrize("kind,obj", VALID.values(), ids=list(VALID))
def test_typed_decoding_parses_exactly_like_a_plain_json_decode(
    kind: str, obj: dict[str, Any]
) -> None:
    raw = json.dumps(obj).encode()
    decoded = object_decoder(kind)(raw)
    assert decoded.obj is not None
    expected = outcome(PARSERS[kind], json.loads(raw))
    assert not isinstance(expected, str), expected
    assert outcome(PARSERS[kind], decoded.obj) == expected
    assert decoded.name == obj["metadata"]["name"]
    assert decoded.namespace == obj["metadata"].get("namespace", "")


@pytest.mark.parametrize("kind,obj", INVALID.values(), ids=list(INVALID))
def test_invalid_objects_give_the_parsers_own_error(kind: str, obj: dict[str, Any]) -> None:
    raw = json.dumps(obj).encode()
    decoded = object_decoder(kind)(raw)
    expected = outcome(PARSERS[kind], json.loads(raw))
    assert isinstance(expected, str)
    assert outcome(PARSERS[kind], decoded.obj) == expected


def test_metadata_only_decoding_identifies_without_decoding_the_rest() -> None:
    raw = json.dumps(rich_slice()).encode()
    decoded = object_decoder("EndpointSlice", metadata_only=True)(raw)
    assert (decoded.namespace, decoded.name, decoded.obj) == ("prod", "lb-1", None)
    assert decoded.labels == {"kubernetes.io/service-name": "lb"}


def test_lists_keep_items_raw_and_read_the_list_metadata() -> None:
    body = json.dumps(
        {
            "kind": "ServiceList",
            "metadata": {"resourceVersion": "42", "continue": "abc", "remainingItemCount": 3},
            "items": [rich_service(), service_obj("b")],
        }
    ).encode()
    page = decode_list(body)
    assert (page.metadata.resource_version, page.metadata.continue_token) == ("42", "abc")
    assert page.items is not None and len(page.items) == 2
    assert object_decoder("Service")(page.items[1]).name == "b"
    assert decode_list(b'{"metadata":{"resourceVersion":"1"},"items":null}').items is None


def test_watch_events_status_and_discovery() -> None:
    event = decode_event(b'{"type":"ADDED","object":{"metadata":{"name":"x"}}}')
    assert event.type == "ADDED"
    assert object_decoder("Node", metadata_only=True)(event.object).name == "x"
    status = decode_status(
        b'{"kind":"Status","code":504,"reason":"Timeout","message":"m",'
        b'"details":{"causes":[{"reason":"ResourceVersionTooLarge"}]}}'
    )
    assert status is not None and status.has_cause("ResourceVersionTooLarge")
    assert decode_status(b"<html>bad gateway</html>") is None
    names = decode_resource_names(b'{"resources":[{"name":"servicecidrs"},{"name":"ingresses"}]}')
    assert names == {"servicecidrs", "ingresses"}


@pytest.mark.parametrize(
    "call",
    [
        lambda: decode_list(b"not json"),
        lambda: decode_event(b'{"type":"ADDED","obj'),
        lambda: object_decoder("Service")(b"[1, 2]"),
        lambda: object_decoder("Service")(b'{"metadata": '),
        lambda: decode_resource_names(b"{"),
    ],
)
def test_garbage_is_a_one_line_decode_error(call: Callable[[], object]) -> None:
    with pytest.raises(DecodeError) as info:
        call()
    assert "\n" not in str(info.value)


def test_gc_paused_restores_the_collector_state() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()
