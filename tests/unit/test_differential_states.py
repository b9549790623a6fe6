"""The differential test's generated addresses (kubeproxy.lab.kube.differential.states)."""

import ipaddress

import pytest

from kubeproxy.lab.kube.differential.states import cidr_ip, service_cidrs


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
