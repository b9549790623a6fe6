"""Raw IPVS over netlink in a real kernel: the facts ipvs mode is built on.

No kubeproxy here: a virtual server is programmed directly through pyroute2 in node-a's
namespace, and real TCP from the outside client shows what the kernel does with it.
"""

from __future__ import annotations

from collections import Counter

import pytest

from kubeproxy.lab import ipvs
from kubeproxy.lab.cluster import CLIENT_IP, Lab
from kubeproxy.lab.echo import tcp_ask
from kubeproxy.lab.netns import sysctls
from tests.ipvs.conftest import BACKENDS

VIP = "10.96.0.10"


@pytest.fixture(scope="module")
def virtual_server(lab: Lab) -> None:
    """VIP:80/TCP, round robin over the two echo Pods' port 8080, NAT, on node-a."""
    # What upstream's ipvs mode sets: conntrack entries for IPVS connections, forwarding.
    sysctls(lab.node_ns, {"net.ipv4.vs.conntrack": "1", "net.ipv4.ip_forward": "1"})
    ipvs.add_vip(lab.node_ns, VIP)
    with ipvs.ipvs_in(lab.node_ns) as sock:
        service = ipvs.virtual_server(VIP, 80, scheduler="rr")
        sock.service("add", service=service)
        for ip in BACKENDS.values():
            sock.dest("add", service=service, dest=ipvs.nat_real_server(ip, 8080))


@pytest.mark.usefixtures("virtual_server")
def test_round_robin_splits_evenly_and_keeps_the_client_address(lab: Lab) -> None:
    client = lab.executor(lab.client_ns)
    replies = [client.call(tcp_ask, VIP, 80) for _ in range(10)]
    assert Counter(r.pod for r in replies) == {"backend-1": 5, "backend-2": 5}
    # NAT real servers: the backend sees the client's own address, not the node's.
    assert {r.client_ip for r in replies} == {CLIENT_IP}


@pytest.mark.usefixtures("virtual_server")
def test_table_reads_back_nat_real_servers(lab: Lab) -> None:
    with ipvs.ipvs_in(lab.node_ns) as sock:
        table = ipvs.table(sock)
    assert table == {
        ipvs.VirtualServer(VIP, 80, "TCP", "rr"): [
            ipvs.RealServer(ip, 8080, weight=1, fwd_method=ipvs.FWD_MASQ)
            for ip in sorted(BACKENDS.values())
        ]
    }


def test_set_changes_a_virtual_server_in_place(lab: Lab) -> None:
    """pyroute2's "set" edits (its "update" would delete): the real servers stay."""
    vip = "10.96.0.11"
    ipvs.add_vip(lab.node_ns, vip)
    with ipvs.ipvs_in(lab.node_ns) as sock:
        service = ipvs.virtual_server(vip, 80, scheduler="rr")
        sock.service("add", service=service)
        sock.dest("add", service=service, dest=ipvs.nat_real_server(BACKENDS["backend-1"], 8080))
        sock.service("set", service=ipvs.virtual_server(vip, 80, scheduler="wrr"))
        got = {k: v for k, v in ipvs.table(sock).items() if k.ip == vip}
        sock.service("del", service=service)
    assert got == {
        ipvs.VirtualServer(vip, 80, "TCP", "wrr"): [
            ipvs.RealServer(BACKENDS["backend-1"], 8080, weight=1, fwd_method=ipvs.FWD_MASQ)
        ]
    }
