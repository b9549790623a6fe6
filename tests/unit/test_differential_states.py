"""The differential test's generated addresses (kubeproxy.lab.kube.differential.states)."""

import ipaddress

import pytest

from kubeproxy.lab.kube.differential import pinned
from kubeproxy.lab.kube.differential.states import Slot, cidr_ip, generate, service_cidrs


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
    assert [s.name for s in full.services] == ["empty", "six", "lsix"]
    assert [s.name for s in ipvs.services] == ["lsix"]
    assert [p.slot for p in ipvs.pods] == ["df-a2", "df-b0"]
    (host,) = pinned.states(slots, "node-a", 2, modes=("nftables", "iptables"))
    assert [s.name for s in host.services] == ["empty", "six"]
    expected = {c.service for c in pinned.CASES if c.expected("ipvs") is not None}
    assert expected == {"lsix"}
