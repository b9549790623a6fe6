"""kubeproxy.model.parse: API defaults, normalisation, and one-line errors for bad input.

Objects from a manifest directory never went through an API server, so the parser is the
only thing standing between a typo (or a hostile name) and the rule script / the log.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kubeproxy.model.parse import (
    InvalidObjectError,
    object_key,
    parse_endpoint_slice,
    parse_node,
    parse_service,
    skipped_parts,
)
from kubeproxy.model.types import (
    DEFAULT_AFFINITY_TIMEOUT_SECONDS,
    LABEL_SERVICE_NAME,
    LABEL_ZONE,
    TAINT_TO_BE_DELETED,
    EndpointConditions,
    IPFamily,
    L4Protocol,
    NamespacedName,
    NodeAddress,
    TrafficPolicy,
)
from tests.unit.conftest import node_obj, service_obj, slice_obj

# ====================================================================== Service: happy path


def test_service_minimal_gets_api_defaults() -> None:
    svc = parse_service(service_obj())
    assert (svc.namespace, svc.name) == ("default", "web")
    (port,) = svc.ports
    # protocol defaults to TCP; a single port may be unnamed.
    assert str(port.name) == "default/web/TCP"
    assert port.name.port == ""
    assert port.protocol is L4Protocol.TCP
    assert port.port == 80
    assert port.cluster_ips == ("10.96.0.10",)
    assert port.node_port == 0
    assert port.affinity_timeout is None
    assert port.external_traffic_policy is TrafficPolicy.CLUSTER
    assert port.internal_traffic_policy is TrafficPolicy.CLUSTER
    assert port.traffic_distribution is None
    assert not port.externally_accessible


@pytest.mark.parametrize("namespace", [None, ""], ids=["missing", "empty"])
def test_service_namespace_defaults_to_default(namespace: str | None) -> None:
    obj = service_obj()
    obj["metadata"]["namespace"] = namespace
    assert parse_service(obj).namespace == "default"


@pytest.mark.parametrize(
    "spec",
    [
        {"clusterIP": "None"},
        {"clusterIP": "None", "clusterIPs": ["None"]},
        {"clusterIPs": ["None"]},
        # Headless Services may have no ports at all.
        {"clusterIP": "None", "ports": []},
        {"type": "ExternalName", "externalName": "example.com", "clusterIP": None},
        {"type": "ExternalName", "externalName": "example.com", "ports": []},
    ],
    ids=[
        "headless",
        "headless-clusterIPs",
        "headless-only-clusterIPs",
        "headless-no-ports",
        "externalname",
        "externalname-no-ports",
    ],
)
def test_headless_and_externalname_have_no_ports(spec: dict[str, Any]) -> None:
    # Valid objects (no error), but there is nothing for a proxy to program.
    svc = parse_service(service_obj(**spec))
    assert svc.ports == ()
    assert svc.key == NamespacedName("default", "web")


def test_same_port_number_on_three_protocols_is_three_service_ports() -> None:
    ports = [
        {"name": "tcp", "port": 53, "protocol": "TCP"},
        {"name": "udp", "port": 53, "protocol": "UDP"},
        {"name": "sctp", "port": 53, "protocol": "SCTP"},
    ]
    svc = parse_service(service_obj(ports=ports))
    assert [(p.name.port, p.protocol, p.port) for p in svc.ports] == [
        ("tcp", L4Protocol.TCP, 53),
        ("udp", L4Protocol.UDP, 53),
        ("sctp", L4Protocol.SCTP, 53),
    ]
    assert len({p.name for p in svc.ports}) == 3


def test_addresses_are_canonicalised() -> None:
    # Two spellings of one address must compare equal and be safe to write into rules.
    svc = parse_service(
        service_obj(
            clusterIP=None,
            clusterIPs=["10.96.0.10", "FD00:0:0::0A"],
            externalIPs=["192.0.2.1", "2001:DB8::1"],
        )
    )
    (port,) = svc.ports
    assert port.cluster_ips == ("10.96.0.10", "fd00::a")
    assert port.cluster_ip(IPFamily.IPv6) == "fd00::a"
    assert port.external_ips == ("192.0.2.1", "2001:db8::1")
    assert port.externally_accessible


def test_single_cluster_ip_used_when_cluster_ips_missing() -> None:
    (port,) = parse_service(service_obj(clusterIP="10.96.0.11")).ports
    assert port.cluster_ips == ("10.96.0.11",)


@pytest.mark.parametrize(
    ("ingress", "expected"),
    [
        ([{"ip": "192.0.2.10"}], ("192.0.2.10",)),
        ([{"ip": "192.0.2.10", "ipMode": "VIP"}], ("192.0.2.10",)),
        # ipMode Proxy: the LB delivers to the node, the VIP must not be captured.
        ([{"ip": "192.0.2.10", "ipMode": "Proxy"}], ()),
        (
            [{"ip": "192.0.2.10", "ipMode": "Proxy"}, {"ip": "192.0.2.11", "ipMode": "VIP"}],
            ("192.0.2.11",),
        ),
        # hostname-only ingress (AWS style) has no IP to capture
        ([{"hostname": "lb.example.com"}], ()),
        ([{"ip": "192.0.2.10"}, {"ip": "192.0.2.10"}], ("192.0.2.10",)),
        ([], ()),
    ],
    ids=["vip-default", "vip", "proxy", "mixed", "hostname", "deduped", "none"],
)
def test_load_balancer_ingress(ingress: list[dict[str, str]], expected: tuple[str, ...]) -> None:
    obj = service_obj(
        type="LoadBalancer",
        ports=[{"port": 80, "nodePort": 30080}],
        status={"loadBalancer": {"ingress": ingress}},
    )
    (port,) = parse_service(obj).ports
    assert port.load_balancer_ips == expected


def test_load_balancer_status_ignored_unless_type_load_balancer() -> None:
    obj = service_obj(status={"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}})
    (port,) = parse_service(obj).ports
    assert port.load_balancer_ips == ()


def test_load_balancer_source_ranges_accept_surrounding_whitespace() -> None:
    # upstream trims these (they are often copied from annotations / docs).
    obj = service_obj(
        type="LoadBalancer",
        ports=[{"port": 80, "nodePort": 30080}],
        loadBalancerSourceRanges=[" 10.0.0.0/8", "192.168.1.7/24 \n", "\t2001:db8::/32 "],
    )
    (port,) = parse_service(obj).ports
    # host bits are dropped, as upstream does
    assert port.load_balancer_source_ranges == ("10.0.0.0/8", "192.168.1.0/24", "2001:db8::/32")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, None),
        ({"sessionAffinity": "None"}, None),
        ({"sessionAffinity": "ClientIP"}, DEFAULT_AFFINITY_TIMEOUT_SECONDS),
        ({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {}}, 10800),
        ({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {}}}, 10800),
        (
            {
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
            },
            60,
        ),
    ],
    ids=["unset", "none", "clientip-default", "empty-config", "empty-clientip", "explicit"],
)
def test_session_affinity(spec: dict[str, Any], expected: int | None) -> None:
    assert DEFAULT_AFFINITY_TIMEOUT_SECONDS == 10800
    (port,) = parse_service(service_obj(**spec)).ports
    assert port.affinity_timeout == expected


def test_node_port_service_fields() -> None:
    obj = service_obj(
        type="NodePort",
        externalTrafficPolicy="Local",
        internalTrafficPolicy="Local",
        healthCheckNodePort=32000,
        trafficDistribution="PreferClose",
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
    )
    (port,) = parse_service(obj).ports
    assert port.node_port == 30080
    assert port.health_check_node_port == 32000
    assert port.external_traffic_policy is TrafficPolicy.LOCAL
    assert port.internal_traffic_policy is TrafficPolicy.LOCAL
    assert port.external_policy_local
    assert port.traffic_distribution == "PreferClose"


def test_node_ports_ignored_for_cluster_ip_service() -> None:
    obj = service_obj(ports=[{"port": 80, "nodePort": 30080}], healthCheckNodePort=32000)
    (port,) = parse_service(obj).ports
    assert (port.node_port, port.health_check_node_port) == (0, 0)
    # eTP Local on a Service nobody outside can reach does nothing
    assert (
        not parse_service(service_obj(externalTrafficPolicy="Local")).ports[0].external_policy_local
    )


# ================================================================= EndpointSlice: happy path


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        (None, EndpointConditions(ready=True, serving=True, terminating=False)),
        ({}, EndpointConditions(ready=True, serving=True, terminating=False)),
        ({"ready": False}, EndpointConditions(ready=False, serving=True, terminating=False)),
        ({"serving": False}, EndpointConditions(ready=True, serving=False, terminating=False)),
        (
            {"ready": False, "serving": True, "terminating": True},
            EndpointConditions(ready=False, serving=True, terminating=True),
        ),
        ({"terminating": True}, EndpointConditions(ready=True, serving=True, terminating=True)),
        (
            {"ready": None, "serving": None, "terminating": None},
            EndpointConditions(ready=True, serving=True, terminating=False),
        ),
    ],
    ids=[
        "no-conditions",
        "empty",
        "not-ready",
        "not-serving",
        "serving-terminating",
        "terminating-only",
        "explicit-nulls",
    ],
)
def test_endpoint_condition_defaults(
    conditions: dict[str, Any] | None, expected: EndpointConditions
) -> None:
    # API conventions: nil ready/serving mean true, nil terminating means false.
    ep: dict[str, Any] = {"addresses": ["10.1.0.1"]}
    if conditions is not None:
        ep["conditions"] = conditions
    eps = parse_endpoint_slice(slice_obj(endpoints=[ep]))
    assert eps is not None
    assert eps.endpoints[0].conditions == expected


def test_slice_full_parse() -> None:
    obj = slice_obj(
        namespace="shop",
        ports=[
            {"name": "http", "port": 8080},
            {"name": "dns", "port": 53, "protocol": "UDP"},
        ],
        endpoints=[
            {
                "addresses": ["10.1.0.1", "10.1.0.2"],
                "nodeName": "node-a",
                "zone": "zone-a",
                "hints": {
                    "forZones": [{"name": "zone-a"}, {"name": "zone-b"}],
                    "forNodes": [{"name": "node-a"}],
                },
            }
        ],
        annotations={"endpoints.kubernetes.io/last-change-trigger-time": "2024-05-01T10:00:00Z"},
    )
    eps = parse_endpoint_slice(obj)
    assert eps is not None
    assert eps.key == NamespacedName("shop", "web-abc")
    assert eps.service == NamespacedName("shop", "web")
    assert eps.address_type is IPFamily.IPv4
    # protocol defaults to TCP on slice ports too
    assert [(p.name, p.protocol, p.port) for p in eps.ports] == [
        ("http", L4Protocol.TCP, 8080),
        ("dns", L4Protocol.UDP, 53),
    ]
    (ep,) = eps.endpoints
    # the endpoint's IP comes from addresses (all kept here; the tracker uses the first)
    assert ep.addresses == ("10.1.0.1", "10.1.0.2")
    assert ep.node_name == "node-a"
    assert ep.zone == "zone-a"
    assert ep.zone_hints == {"zone-a", "zone-b"}
    assert ep.node_hints == {"node-a"}
    assert eps.trigger_time == datetime(2024, 5, 1, 10, tzinfo=UTC).timestamp()


def test_slice_ipv6_addresses_are_canonicalised() -> None:
    obj = slice_obj(address_type="IPv6", endpoints=[{"addresses": ["FD00:0::0001"]}])
    eps = parse_endpoint_slice(obj)
    assert eps is not None
    assert eps.endpoints[0].addresses == ("fd00::1",)


def test_fqdn_slice_is_ignored() -> None:
    obj = slice_obj(address_type="FQDN", endpoints=[{"addresses": ["example.com"]}])
    assert parse_endpoint_slice(obj) is None


@pytest.mark.parametrize(
    "value", ["yesterday", 12345, None], ids=["garbage", "not-a-string", "missing"]
)
def test_bad_trigger_time_does_not_reject_slice(value: Any) -> None:
    # It only feeds a metric; losing one sample is better than dropping the endpoints.
    annotations = (
        {} if value is None else {"endpoints.kubernetes.io/last-change-trigger-time": value}
    )
    eps = parse_endpoint_slice(slice_obj(annotations=annotations))
    assert eps is not None
    assert eps.trigger_time is None


def test_slice_port_without_number_is_skipped_not_the_slice() -> None:
    # The API allows a nil port ("not restricted"); a proxy cannot use it. Upstream skips
    # that port only, and keeps the slice's other ports and its endpoints.
    eps = parse_endpoint_slice(
        slice_obj(ports=[{"name": "x", "port": None}, {"name": "http", "port": 8080}])
    )
    assert eps is not None
    assert [p.name for p in eps.ports] == ["http"]
    assert eps.endpoints


def test_fqdn_slice_without_service_label_is_still_just_ignored() -> None:
    obj = slice_obj(address_type="FQDN", endpoints=[{"addresses": ["example.com"]}])
    del obj["metadata"]["labels"]
    assert parse_endpoint_slice(obj) is None


def test_slice_without_ports_or_endpoints() -> None:
    eps = parse_endpoint_slice(slice_obj(ports=[], endpoints=[]))
    assert eps is not None
    assert (eps.ports, eps.endpoints) == ((), ())


# ========================================================================= Node: happy path


def test_node_parse() -> None:
    obj = node_obj(
        labels={LABEL_ZONE: "zone-a", "kubernetes.io/hostname": "node-a"},
        addresses=[
            {"type": "Hostname", "address": "node-a"},  # not an IP: ignored, not rejected
            {"type": "ExternalIP", "address": "198.51.100.1"},
            {"type": "InternalIP", "address": "10.0.0.1"},
            {"type": "InternalIP", "address": "fd00::1"},
            {"type": "InternalIP", "address": "10.0.0.2"},
        ],
        taints=[{"key": TAINT_TO_BE_DELETED, "effect": "NoSchedule"}],
        deletion_timestamp="2024-05-01T10:00:00Z",
    )
    node = parse_node(obj)
    assert node.name == "node-a"
    assert node.zone == "zone-a"
    assert NodeAddress("InternalIP", "10.0.0.1") in node.addresses
    assert all(a.type != "Hostname" for a in node.addresses)
    # first InternalIP per family wins over ExternalIP
    assert node.primary_ips() == {IPFamily.IPv4: "10.0.0.1", IPFamily.IPv6: "fd00::1"}
    assert node.deleting
    assert node.to_be_deleted_taint


def test_node_defaults() -> None:
    node = parse_node(node_obj())
    assert node.zone is None
    assert node.addresses == ()
    assert not node.deleting
    assert not node.to_be_deleted_taint


def test_object_key() -> None:
    assert object_key("Service", service_obj()) == NamespacedName("default", "web")
    assert object_key("Service", service_obj(namespace="shop")) == NamespacedName("shop", "web")
    assert object_key("Node", node_obj()) == NamespacedName("", "node-a")
    assert object_key("Service", {"metadata": {}}) is None
    assert object_key("Service", {}) is None


# =============================================================================== Bad input


def _with_ports(*ports: dict[str, Any]) -> dict[str, Any]:
    return service_obj(ports=list(ports))


def _spec(**spec: Any) -> dict[str, Any]:
    return service_obj(**spec)


def _slice_ep(**ep: Any) -> dict[str, Any]:
    return slice_obj(endpoints=[{"addresses": ["10.1.0.1"], **ep}])


BAD_SERVICES: list[tuple[str, Any, str]] = [
    # (id, object, field path that must appear in the message)
    ("port-0", _with_ports({"port": 0}), "spec.ports[0].port"),
    ("port-70000", _with_ports({"port": 70000}), "spec.ports[0].port"),
    ("port-negative", _with_ports({"port": -1}), "spec.ports[0].port"),
    ("port-string", _with_ports({"port": "80"}), "spec.ports[0].port"),
    ("port-bool", _with_ports({"port": True}), "spec.ports[0].port"),
    ("port-missing", _with_ports({"name": "x"}), "spec.ports[0].port"),
    (
        "duplicate-port-protocol",
        _with_ports({"name": "a", "port": 80}, {"name": "b", "port": 80, "protocol": "TCP"}),
        "spec.ports[1]",
    ),
    (
        "duplicate-port-name",
        _with_ports({"name": "a", "port": 80}, {"name": "a", "port": 81}),
        "spec.ports[1].name",
    ),
    (
        "missing-port-name-with-two-ports",
        _with_ports({"name": "a", "port": 80}, {"port": 81}),
        "spec.ports[1].name",
    ),
    ("bad-port-name", _with_ports({"name": "HTTP_1", "port": 80}), "spec.ports[0].name"),
    ("bad-protocol", _with_ports({"port": 80, "protocol": "HTTP"}), "spec.ports[0].protocol"),
    (
        "node-port-70000",
        _spec(type="NodePort", ports=[{"port": 80, "nodePort": 70000}]),
        "spec.ports[0].nodePort",
    ),
    (
        "duplicate-node-port",
        _spec(
            type="NodePort",
            ports=[
                {"name": "a", "port": 80, "nodePort": 30080},
                {"name": "b", "port": 81, "nodePort": 30080},
            ],
        ),
        "spec.ports[1].nodePort",
    ),
    ("no-ports", _spec(ports=[]), "spec.ports"),
    ("ports-not-a-list", _spec(ports={"port": 80}), "spec.ports"),
    ("port-not-a-dict", _spec(ports=[80]), "spec.ports[0]"),
    ("bad-cluster-ip", _spec(clusterIP="10.96.0.300"), "spec.clusterIP"),
    ("cluster-ip-hostname", _spec(clusterIP="my-service"), "spec.clusterIP"),
    ("cluster-ip-cidr", _spec(clusterIP="10.96.0.0/12"), "spec.clusterIP"),
    # Python's ipaddress keeps IPv6 zone IDs (any text after "%") in str(): it would reach
    # the rule script verbatim.
    ("cluster-ip-zone-id", _spec(clusterIP="fd00::1%eth0"), "spec.clusterIP"),
    ("cluster-ip-injection", _spec(clusterIP="fd00::1%x; flush ruleset"), "spec.clusterIP"),
    ("missing-cluster-ip", _spec(clusterIP=None), "spec.clusterIP"),
    (
        "bad-cluster-ips-entry",
        _spec(clusterIP=None, clusterIPs=["10.96.0.10", "fd00::zz"]),
        "spec.clusterIPs[1]",
    ),
    (
        "two-cluster-ips-same-family",
        _spec(clusterIP=None, clusterIPs=["10.96.0.10", "10.96.0.11"]),
        "spec.clusterIPs",
    ),
    ("bad-external-ip", _spec(externalIPs=["192.0.2.1", "192.0.2"]), "spec.externalIPs[1]"),
    ("external-ip-number", _spec(externalIPs=[3232235777]), "spec.externalIPs[0]"),
    (
        "bad-source-range",
        _spec(loadBalancerSourceRanges=["10.0.0.0/33"]),
        "spec.loadBalancerSourceRanges[0]",
    ),
    (
        "source-range-zone-id",
        _spec(loadBalancerSourceRanges=["fe80::%eth0/64"]),
        "spec.loadBalancerSourceRanges[0]",
    ),
    (
        "bad-lb-ingress-ip",
        service_obj(
            type="LoadBalancer",
            ports=[{"port": 80, "nodePort": 30080}],
            status={"loadBalancer": {"ingress": [{"ip": "not-an-ip"}]}},
        ),
        "status.loadBalancer.ingress[0].ip",
    ),
    ("bad-type", _spec(type="Ingress"), "spec.type"),
    ("bad-affinity", _spec(sessionAffinity="Cookie"), "spec.sessionAffinity"),
    (
        "affinity-timeout-0",
        _spec(
            sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 0}}
        ),
        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
    ),
    (
        "affinity-timeout-too-long",
        _spec(
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 86401}},
        ),
        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
    ),
    ("bad-etp", _spec(externalTrafficPolicy="Nearby"), "spec.externalTrafficPolicy"),
    ("bad-itp", _spec(internalTrafficPolicy="local"), "spec.internalTrafficPolicy"),
    ("traffic-distribution-not-string", _spec(trafficDistribution=1), "spec.trafficDistribution"),
    ("spec-not-a-dict", {"metadata": {"name": "web"}, "spec": ["x"]}, "spec"),
    ("no-name", {"metadata": {}, "spec": {}}, "metadata.name"),
    ("name-not-a-string", {"metadata": {"name": 7}}, "metadata.name"),
    ("metadata-not-a-dict", {"metadata": "web"}, "metadata"),
    ("list-object", [service_obj()], "<root>"),
    ("string-object", "kind: Service", "<root>"),
    ("int-object", 42, "<root>"),
    ("none-object", None, "metadata.name"),
    ("name-with-uppercase", service_obj(name="Web"), "metadata.name"),
    ("name-starting-with-digit", service_obj(name="1web"), "metadata.name"),
    ("bad-namespace", service_obj(namespace="Shop"), "metadata.namespace"),
]


@pytest.mark.parametrize(
    ("obj", "path"), [c[1:] for c in BAD_SERVICES], ids=[c[0] for c in BAD_SERVICES]
)
def test_bad_service_is_one_line_error(obj: Any, path: str) -> None:
    with pytest.raises(InvalidObjectError) as info:
        parse_service(obj)
    _check_one_line(info.value, "Service", path)


# What costs only an endpoint or a port: upstream skips an endpoint without an address
# and a port that is missing or 0, and the API server checks no port number at all.
BAD_PARTS: list[tuple[str, Any, str]] = [
    ("bad-address", _slice_ep(addresses=["10.1.0.256"]), "endpoints[0].addresses[0]"),
    ("address-zone-id", _slice_ep(addresses=["fe80::1%eth0"]), "endpoints[0].addresses[0]"),
    ("second-address-bad", _slice_ep(addresses=["10.1.0.1", "x"]), "endpoints[0].addresses[1]"),
    ("no-addresses", _slice_ep(addresses=[]), "endpoints[0].addresses"),
    (
        "family-mismatch-v6-in-v4",
        _slice_ep(addresses=["fd00::1"]),
        "endpoints[0].addresses[0]",
    ),
    (
        "family-mismatch-v4-in-v6",
        slice_obj(address_type="IPv6", endpoints=[{"addresses": ["10.1.0.1"]}]),
        "endpoints[0].addresses[0]",
    ),
    ("ready-not-bool", _slice_ep(conditions={"ready": "yes"}), "endpoints[0].conditions.ready"),
    (
        "terminating-not-bool",
        _slice_ep(conditions={"terminating": 1}),
        "endpoints[0].conditions.terminating",
    ),
    ("bad-node-name", _slice_ep(nodeName="node a"), "endpoints[0].nodeName"),
    (
        "node-hint-bad-name",
        _slice_ep(hints={"forNodes": [{"name": "a;b"}]}),
        "endpoints[0].hints.forNodes[0].name",
    ),
    ("endpoint-not-an-object", {**slice_obj(), "endpoints": ["10.1.0.1"]}, "endpoints[0]"),
    ("port-0", slice_obj(ports=[{"port": 0}]), "ports[0].port"),
    ("port-70000", slice_obj(ports=[{"port": 70000}]), "ports[0].port"),
    ("port-negative", slice_obj(ports=[{"port": -1}]), "ports[0].port"),
    ("port-not-a-number", slice_obj(ports=[{"port": "80"}]), "ports[0].port"),
]


@pytest.mark.parametrize(("obj", "path"), [c[1:] for c in BAD_PARTS], ids=[c[0] for c in BAD_PARTS])
def test_a_bad_endpoint_or_port_costs_only_itself_with_one_line(obj: Any, path: str) -> None:
    parsed = parse_endpoint_slice(obj)
    assert parsed is not None
    line = skipped_parts(parsed)
    assert line is not None and line.startswith("Ignoring part of EndpointSlice default/web-abc: ")
    assert path in line and line.isprintable(), line
    good = slice_obj()
    whole = parse_endpoint_slice({**good, "ports": good.get("ports", [])})
    assert whole is not None and skipped_parts(whole) is None
    if path.startswith("ports"):
        assert parsed.ports == () and len(parsed.endpoints) == len(whole.endpoints)
    else:
        assert parsed.endpoints == () and parsed.ports == whole.ports


def test_a_slice_keeps_its_good_ports_and_endpoints_beside_a_bad_one() -> None:
    """As upstream's endpointInfoByServicePort: a port 0 beside a good port."""
    parsed = parse_endpoint_slice(
        slice_obj(
            ports=[{"name": "a", "port": 0}, {"name": "b", "port": 8080}],
            endpoints=[{"addresses": ["10.1.0.1"]}, {"addresses": []}, {"addresses": ["10.1.0.2"]}],
        )
    )
    assert parsed is not None
    assert [p.name for p in parsed.ports] == ["b"]
    assert [e.addresses for e in parsed.endpoints] == [("10.1.0.1",), ("10.1.0.2",)]
    assert parsed.skipped == (
        "ports[0].port: not a usable port: 0",
        "endpoints[1].addresses: at least one address is required",
    )


@pytest.mark.parametrize(
    "endpoint",
    [
        {"zone": "zone a/with spaces"},
        {"zone": "web\nforged"},
        {"hints": {"forZones": [{"name": ""}]}},
        {"hints": {"forZones": [{}]}},
        {"hints": {"forZones": [{"name": "zone a/b"}]}},
    ],
    ids=[
        "zone-with-space-and-slash",
        "zone-escaped-newline",
        "hint-empty",
        "hint-unnamed",
        "hint-odd",
    ],
)
def test_any_zone_or_zone_hint_is_taken_as_upstream_takes_it(endpoint: dict[str, Any]) -> None:
    """The API server checks an endpoint's zone not at all and a zone hint as a label
    value ("" included); upstream only compares them with its node's zone."""
    parsed = parse_endpoint_slice(_slice_ep(**endpoint))
    assert parsed is not None and skipped_parts(parsed) is None
    (ep,) = parsed.endpoints
    assert ep.zone == endpoint.get("zone")
    if "hints" in endpoint:
        assert ep.zone_hints == frozenset({endpoint["hints"]["forZones"][0].get("name", "")})


BAD_SLICES: list[tuple[str, Any, str]] = [
    (
        "duplicate-port",
        slice_obj(ports=[{"name": "a", "port": 80}, {"name": "a", "port": 81}]),
        "ports[1]",
    ),
    ("bad-port-protocol", slice_obj(ports=[{"port": 80, "protocol": "ICMP"}]), "ports[0].protocol"),
    ("bad-address-type", slice_obj(address_type="IPv5"), "addressType"),
    ("missing-service-label", {"metadata": {"name": "web-abc"}}, LABEL_SERVICE_NAME),
    ("bad-service-label", slice_obj(service="Web"), LABEL_SERVICE_NAME),
    ("bad-name", slice_obj(name="web_abc"), "metadata.name"),
    ("endpoints-not-a-list", {**slice_obj(), "endpoints": {"a": 1}}, "endpoints"),
    ("list-object", [slice_obj()], "<root>"),
]


@pytest.mark.parametrize(
    ("obj", "path"), [c[1:] for c in BAD_SLICES], ids=[c[0] for c in BAD_SLICES]
)
def test_bad_slice_is_one_line_error(obj: Any, path: str) -> None:
    with pytest.raises(InvalidObjectError) as info:
        parse_endpoint_slice(obj)
    _check_one_line(info.value, "EndpointSlice", path)


BAD_NODES: list[tuple[str, Any, str]] = [
    (
        "bad-address",
        node_obj(addresses=[{"type": "InternalIP", "address": "10.0.0"}]),
        "status.addresses[0].address",
    ),
    (
        "address-zone-id",
        node_obj(addresses=[{"type": "InternalIP", "address": "fe80::1%eth0"}]),
        "status.addresses[0].address",
    ),
    ("bad-name", node_obj(name="Node_A"), "metadata.name"),
    ("label-not-a-string", node_obj(labels={LABEL_ZONE: 3}), f"metadata.labels[{LABEL_ZONE}]"),
    ("taints-not-a-list", {**node_obj(), "spec": {"taints": "x"}}, "spec.taints"),
    ("list-object", [], "<root>"),
]


@pytest.mark.parametrize(("obj", "path"), [c[1:] for c in BAD_NODES], ids=[c[0] for c in BAD_NODES])
def test_bad_node_is_one_line_error(obj: Any, path: str) -> None:
    with pytest.raises(InvalidObjectError) as info:
        parse_node(obj)
    _check_one_line(info.value, "Node", path)


def _check_one_line(err: InvalidObjectError, kind: str, path: str) -> None:
    message = str(err)
    # One loggable line: no raw line breaks of any kind.
    assert len(message.splitlines()) == 1, message
    assert "\n" not in message
    assert message.startswith(f"Skipping invalid {kind} "), message
    assert err.kind == kind
    assert path in message, message
    assert path in err.reason
    # identity: namespace/name for namespaced kinds, name for Nodes, "<unknown>" if absent
    assert err.key in message


def test_error_names_kind_namespace_name_and_field() -> None:
    with pytest.raises(InvalidObjectError) as info:
        parse_service(service_obj(namespace="shop", ports=[{"port": 0}]))
    assert str(info.value) == (
        "Skipping invalid Service shop/web: spec.ports[0].port: must be between 1 and 65535, got 0"
    )
    assert info.value.key == "shop/web"


def test_error_for_slice_and_node_identity() -> None:
    with pytest.raises(
        InvalidObjectError, match=r"^Skipping invalid EndpointSlice default/web-abc: "
    ):
        parse_endpoint_slice(slice_obj(address_type="x"))
    with pytest.raises(InvalidObjectError, match=r"^Skipping invalid Node node-a: "):
        parse_node(node_obj(addresses=[{"type": "InternalIP", "address": "x"}]))


# ------------------------------------------------------------------------- hostile names

HOSTILE = [
    ("double-quote", 'we"b'),
    ("single-quote", "we'b"),
    ("semicolon", "web;flush ruleset"),
    ("newline", "web\nERROR forged log line"),
    # "$" in a regex matches before a trailing newline: this one used to be accepted.
    ("trailing-newline", "web\n"),
    ("carriage-return", "web\rforged"),
    ("unicode-line-separator", "web\u2028forged"),
    ("nel", "web\x85forged"),
    ("ansi-escape", "\x1b[31mred"),
    ("unicode", "wéb-ünïcode"),
    ("emoji", "web-🔥"),
    ("space", "web svc"),
    ("long-301", "a" * 301),
    ("long-1000-with-newlines", ("a" * 99 + "\n") * 10),
]


def _hostile_service_name(name: str) -> Any:
    return service_obj(name=name)


def _hostile_service_namespace(name: str) -> Any:
    return service_obj(namespace=name)


def _hostile_port_name(name: str) -> Any:
    return service_obj(ports=[{"name": name, "port": 80}])


def _hostile_slice_name(name: str) -> Any:
    return slice_obj(name=name)


def _hostile_slice_service_label(name: str) -> Any:
    return slice_obj(service=name)


def _hostile_slice_node_name(name: str) -> Any:
    return _slice_ep(nodeName=name)


def _hostile_zone_hint(name: str) -> Any:
    return _slice_ep(hints={"forZones": [{"name": name}]})


def _hostile_node_name(name: str) -> Any:
    return node_obj(name=name)


def _hostile_node_label_key(name: str) -> Any:
    # The key ends up in the field path of the error about the (non-string) value.
    return node_obj(labels={name: 1})


HOSTILE_PLACES = [
    ("service-name", "Service", parse_service, _hostile_service_name),
    ("service-namespace", "Service", parse_service, _hostile_service_namespace),
    ("service-port-name", "Service", parse_service, _hostile_port_name),
    ("slice-name", "EndpointSlice", parse_endpoint_slice, _hostile_slice_name),
    ("slice-service-label", "EndpointSlice", parse_endpoint_slice, _hostile_slice_service_label),
    ("node-name", "Node", parse_node, _hostile_node_name),
    ("node-label-key", "Node", parse_node, _hostile_node_label_key),
]


@pytest.mark.parametrize("name", [h[1] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
@pytest.mark.parametrize(
    ("kind", "parser", "build"),
    [p[1:] for p in HOSTILE_PLACES],
    ids=[p[0] for p in HOSTILE_PLACES],
)
def test_hostile_names_rejected_with_one_line_message(
    name: str, kind: str, parser: Any, build: Any
) -> None:
    with pytest.raises(InvalidObjectError) as info:
        parser(build(name))
    message = str(info.value)
    assert len(message.splitlines()) == 1, repr(message)
    assert "\n" not in message and "\r" not in message
    assert "\x1b" not in message  # no terminal escapes either
    assert message.startswith(f"Skipping invalid {kind} ")
    # the identity shown is bounded even for a huge name (truncated to 300 chars + "...")
    assert len(info.value.key) <= len("default/") + 300 + len("...")


@pytest.mark.parametrize("name", [h[1] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_a_hostile_node_name_costs_its_endpoint_with_one_printable_line(name: str) -> None:
    parsed = parse_endpoint_slice(_hostile_slice_node_name(name))
    assert parsed is not None and parsed.endpoints == ()
    line = skipped_parts(parsed)
    assert line is not None and line.isprintable() and "endpoints[0].nodeName" in line


@pytest.mark.parametrize("name", [h[1] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_a_hostile_zone_hint_is_kept_for_comparison_only(name: str) -> None:
    parsed = parse_endpoint_slice(_hostile_zone_hint(name))
    assert parsed is not None and parsed.endpoints[0].zone_hints == frozenset({name})


def test_hostile_name_is_escaped_not_dropped() -> None:
    # The operator must still be able to find the object: the name is shown, escaped.
    with pytest.raises(InvalidObjectError) as info:
        parse_service(service_obj(name="web\nERROR forged"))
    assert info.value.key == "default/web\\nERROR forged"
    assert "'web\\nERROR forged'" in info.value.reason


def test_long_name_identity_is_truncated() -> None:
    with pytest.raises(InvalidObjectError) as info:
        parse_service(service_obj(name="a" * 400))
    assert info.value.key == "default/" + "a" * 292 + "..."


def test_known_node_names_are_shared_and_bad_ones_still_refused() -> None:
    # Validated node and zone names are remembered (they repeat on every endpoint); a
    # value of the wrong type or a bad name is refused all the same afterwards.
    first = parse_endpoint_slice(_slice_ep(nodeName="node-a", zone="zone-a"))
    second = parse_endpoint_slice(_slice_ep(nodeName="".join(["node-", "a"]), zone="zone-a"))
    assert first is not None and second is not None
    assert first.endpoints[0].node_name is second.endpoints[0].node_name
    for bad in (["node-a"], "node a", 5):
        parsed = parse_endpoint_slice(_slice_ep(nodeName=bad))
        assert parsed is not None and parsed.endpoints == ()
        assert "endpoints[0].nodeName" in (skipped_parts(parsed) or "")
