"""The differential test's generated addresses (kubeproxy.lab.kube.differential.states)."""

import ipaddress
import json

import pytest

from kubeproxy.lab.kube.differential import pinned
from kubeproxy.lab.kube.differential.states import (
    Slot,
    State,
    cidr_ip,
    generate,
    service_cidrs,
    service_object,
    slice_object,
)


@pytest.mark.parametrize("block", range(16))
def test_a_states_service_cidrs_are_spelled_as_the_api_server_wants(block: int) -> None:
    # The API server refuses a ServiceCIDR not in canonical form (block 0's IPv6 one was
    # "fd00:10:97:0::/112"), and stores addresses canonical.
    for cidr in service_cidrs(block):
        assert cidr == str(ipaddress.ip_network(cidr))
    for family in ("IPv4", "IPv6"):
        ip = cidr_ip(block, 250, family)
        assert ip == str(ipaddress.ip_address(ip))
        assert any(
            ipaddress.ip_address(ip) in ipaddress.ip_network(c) for c in service_cidrs(block)
        )


def test_a_services_port_names_are_unique_in_every_state() -> None:
    # Seed 1035 named two ports "p2" (a port skipped, then the same port in the other
    # protocol named after the count) and the API server refused the Service.
    nodes = [("node-a", "zone-a"), ("node-b", "zone-b"), ("node-c", "zone-a")]
    slots = [Slot(f"df-{n[-1]}{i}", n) for n, _ in nodes for i in range(3)]
    checked = 0
    for seed in [1035, *range(200)]:
        for svc in generate(seed, nodes, slots, "node-a").services:
            names = [p.name for p in svc.ports]
            assert len(names) == len(set(names)), (seed, svc.name, names)
            checked += 1
    assert checked > 200


def test_the_pinned_states_for_some_modes_keep_the_services_their_cases_speak_for() -> None:
    # In the ipvs guest each Service costs upstream's syncs on one CPU: CI's ipvs run
    # takes only the Services a pinned case has ipvs outcomes for, with their Pods.
    nodes = [("node-a", "zone-a"), ("node-b", "zone-b")]
    slots = [Slot(f"df-{n[-1]}{i}", n) for n, _ in nodes for i in range(3)]
    (full,) = pinned.states(slots, "node-a", 2)
    (ipvs,) = pinned.states(slots, "node-a", 2, modes=("ipvs",))
    hand = ["dup", "zero", "zones", "mesh", "both"]
    assert [s.name for s in full.services] == ["empty", "six", "lsix", *hand]
    assert [s.name for s in ipvs.services] == ["lsix"]
    assert [p.slot for p in ipvs.pods] == ["df-a2", "df-b0"]
    assert ipvs.slices == ()
    (host,) = pinned.states(slots, "node-a", 2, modes=("nftables", "iptables"))
    assert [s.name for s in host.services] == ["empty", "six", *hand]
    assert {s.service for s in host.slices} == set(hand)
    expected = {c.service for c in pinned.CASES if c.expected("ipvs") is not None}
    assert expected == {"lsix"}


def test_hand_written_slices_round_trip_and_are_spelled_as_written() -> None:
    nodes = [("node-a", "zone-a"), ("node-b", "zone-b")]
    slots = [Slot(f"df-{n[-1]}{i}", n) for n, _ in nodes for i in range(3)]
    (state,) = pinned.states(slots, "node-a", 2)
    assert State.from_json(json.loads(json.dumps(state.to_json()))) == state
    pods = {s.name: (s.node, f"10.244.0.{i}", f"fd00::{i}") for i, s in enumerate(slots)}
    by_name = {s.name: slice_object(s, "ns", pods) for s in state.slices}
    assert by_name["zero-a"]["ports"][0] == {"name": "other", "protocol": "TCP", "port": 0}
    (zones,) = by_name["zones-a"]["endpoints"]
    assert zones["zone"] == "zone a/b" and zones["hints"] == {"forZones": [{"name": ""}]}
    assert by_name["mesh-a"]["metadata"]["labels"] == {
        "kubernetes.io/service-name": "mesh",
        "service.kubernetes.io/service-proxy-name": "someone-else",
    }
    dup = [by_name[n]["endpoints"][0] for n in ("dup-a", "dup-b")]
    assert dup[0]["addresses"] == dup[1]["addresses"] == ["10.244.0.1"]
    # Their Services select nothing: the EndpointSlice controller leaves them alone.
    services = {s.name: service_object(s, "ns") for s in state.services}
    assert "selector" not in services["dup"]["spec"] and services["six"]["spec"]["selector"]


def test_a_case_selects_its_services_probes_and_with_a_port_that_ports_only() -> None:
    http, other = (
        next(c for c in pinned.CASES if c.service == "zero" and c.port == p)
        for p in ("http", "other")
    )
    key = "s900000 zero:{} cluster-ip TCP 10.96.0.1:{} from pod-local"
    assert http.selects(key.format("http", 80)) and not http.selects(key.format("other", 81))
    assert other.selects(key.format("other", 81))
    assert not http.selects("s900000 zeroes:http cluster-ip TCP 10.96.0.1:80 from pod-local")
    dup = next(c for c in pinned.CASES if c.service == "dup")
    assert dup.selects("s900000 dup:http cluster-ip TCP 10.96.0.2:80 from pod-local")
