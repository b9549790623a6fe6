"""NodePort and healthCheckNodePort allocation (kubeproxy.controlplane.portallocator)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeproxy.controlplane.ipallocator import ErrAllocated, ErrFull, ErrNotInRange
from kubeproxy.controlplane.portallocator import (
    NodePortAllocator,
    PortRange,
    allocate_service_node_ports,
    calculate_port_range_offset,
    parse_port_range,
    release_service_node_ports,
)


@pytest.mark.parametrize(
    ("text", "base", "size"),
    [("30000-32767", 30000, 2768), ("30000+2767", 30000, 2768), ("8080", 8080, 1), ("", 0, 0)],
)
def test_parse_port_range(text: str, base: int, size: int) -> None:
    assert parse_port_range(text) == PortRange(base, size)


@pytest.mark.parametrize("text", ["32767-30000", "1-70000", "abc", "1-b"])
def test_parse_port_range_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=rf"(invalid|unable to parse) port range: {text}$"):
        parse_port_range(text)


@pytest.mark.parametrize(
    ("text", "offset"),
    [
        ("30000-32767", 86),  # the default range: 2768/32
        ("30000-30015", 0),  # 16 ports: no static band
        ("30000-30016", 16),  # 17/32 = 0, raised to the minimum
        ("30000-30511", 16),  # 512/32
        ("30000-31023", 32),
        ("30000-34095", 128),  # 4096/32, the maximum
        ("20000-39999", 128),
    ],
)
def test_port_range_offset(text: str, offset: int) -> None:
    assert calculate_port_range_offset(parse_port_range(text)) == offset


def test_default_range_bands() -> None:
    allocator = NodePortAllocator()
    assert allocator.static_band() == (30000, 30085)
    assert allocator.free() == 2768


def test_allocate_errors() -> None:
    allocator = NodePortAllocator("30000-30001")
    allocator.allocate(30000)
    with pytest.raises(ErrAllocated, match="port is already allocated"):
        allocator.allocate(30000)
    with pytest.raises(ErrNotInRange, match="The range of valid ports is 30000-30001"):
        allocator.allocate(8080)
    assert allocator.allocate_next() == 30001
    with pytest.raises(ErrFull, match="range is full"):
        allocator.allocate_next()
    allocator.release(8080)  # out of range: a no-op
    allocator.release(30000)
    assert allocator.allocated() == [30001]


def test_static_band_only_after_the_dynamic_band_is_full() -> None:
    allocator = NodePortAllocator("30000-30049", rng=random.Random(1))  # offset 16
    first = {allocator.allocate_next() for _ in range(34)}
    assert first == set(range(30016, 30050))
    rest = {allocator.allocate_next() for _ in range(16)}
    assert rest == set(range(30000, 30016))


def _svc(kind: str, ports: list[dict], **spec: object) -> dict:  # type: ignore[type-arg]
    return {"metadata": {"name": "web"}, "spec": {"type": kind, "ports": ports, **spec}}


def test_node_ports_for_each_port_number() -> None:
    allocator = NodePortAllocator(rng=random.Random(2))
    service = _svc(
        "NodePort",
        [
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            {"name": "dns-udp", "port": 53, "protocol": "UDP"},
            {"name": "http", "port": 80, "nodePort": 30080},
        ],
    )
    got = allocate_service_node_ports(service, allocator)
    tcp, udp, http = (p["nodePort"] for p in got["spec"]["ports"])
    assert tcp == udp != http == 30080
    assert "nodePort" not in service["spec"]["ports"][0]  # the input is left alone
    assert allocator.used() == 2
    assert "healthCheckNodePort" not in got["spec"]


def test_a_later_port_with_the_same_number_donates_its_requested_node_port() -> None:
    allocator = NodePortAllocator()
    got = allocate_service_node_ports(
        _svc(
            "NodePort",
            [{"port": 53, "protocol": "TCP"}, {"port": 53, "protocol": "UDP", "nodePort": 30053}],
        ),
        allocator,
    )
    assert [p["nodePort"] for p in got["spec"]["ports"]] == [30053, 30053]


def test_load_balancer_without_node_ports_keeps_only_requested_ones() -> None:
    allocator = NodePortAllocator()
    got = allocate_service_node_ports(
        _svc(
            "LoadBalancer",
            [{"port": 80}, {"port": 443, "nodePort": 30443}],
            allocateLoadBalancerNodePorts=False,
        ),
        allocator,
    )
    assert [p.get("nodePort") for p in got["spec"]["ports"]] == [None, 30443]


@pytest.mark.parametrize(
    ("kind", "policy", "needs"),
    [
        ("LoadBalancer", "Local", True),
        ("LoadBalancer", "Cluster", False),
        ("NodePort", "Local", False),
        ("ClusterIP", "Local", False),
    ],
)
def test_health_check_node_port_from_the_same_range(kind: str, policy: str, needs: bool) -> None:
    allocator = NodePortAllocator("30000-30099", rng=random.Random(3))
    got = allocate_service_node_ports(
        _svc(kind, [{"port": 80}], externalTrafficPolicy=policy), allocator
    )
    check = got["spec"].get("healthCheckNodePort")
    if not needs:
        assert check is None
        return
    assert check in allocator.port_range and allocator.has(check)
    assert check != got["spec"]["ports"][0]["nodePort"]
    release_service_node_ports(got, allocator)
    assert allocator.used() == 0


def test_requested_health_check_node_port_and_rollback() -> None:
    allocator = NodePortAllocator()
    allocator.allocate(30999)
    service = _svc(
        "LoadBalancer",
        [{"port": 80, "nodePort": 30080}],
        externalTrafficPolicy="Local",
        healthCheckNodePort=30999,
    )
    with pytest.raises(ErrAllocated, match="provided port is already allocated"):
        allocate_service_node_ports(service, allocator)
    assert not allocator.has(30080)  # the nodePort taken before the failure was given back
    service["spec"]["healthCheckNodePort"] = 30998
    got = allocate_service_node_ports(service, allocator)
    assert got["spec"]["healthCheckNodePort"] == 30998


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    requests=st.lists(st.one_of(st.none(), st.integers(30000, 30040)), max_size=60),
)
def test_node_ports_are_never_handed_out_twice(seed: int, requests: list[int | None]) -> None:
    allocator = NodePortAllocator("30000-30039", rng=random.Random(seed))
    held: set[int] = set()
    for request in requests:
        try:
            if request is None:
                port = allocator.allocate_next()
            else:
                allocator.allocate(request)
                port = request
        except (ErrFull, ErrAllocated, ErrNotInRange):
            assert (request is None and len(held) == 40) or request in held or request == 30040
            continue
        assert port not in held
        held.add(port)
    assert set(allocator.allocated()) == held
