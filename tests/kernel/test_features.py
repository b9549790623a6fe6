"""Every Service feature of nftables mode, through the real kernel.

externalIPs, load-balancer ingress IPs (and ipMode Proxy), loadBalancerSourceRanges,
session affinity, dual stack, SCTP, service CIDRs, and NodePort details.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from kubeproxy.lab.cluster import (
    CLIENT_IP,
    CLIENT_IP6,
    NODE,
    NODE_IP,
    NODE_IP6,
    Lab,
)
from kubeproxy.lab.echo import Reply, tally, tcp_ask, udp_ask, udp_ask_connected
from kubeproxy.lab.objects import ManifestDir, endpoint_slice, service
from kubeproxy.lab.sctp import capture, send_init
from tests.kernel.conftest import ALL_MODES, HTTP, PODS, eps, ip, sync, wait_for

PROXY_MODES = ALL_MODES


def load_balancer(
    name: str, cluster_ip: str, ingress: list[dict[str, str]], **spec: Any
) -> dict[str, Any]:
    return service(
        name,
        cluster_ip,
        [{**HTTP, "nodePort": spec.pop("node_port", 30500)}],
        type="LoadBalancer",
        status={"loadBalancer": {"ingress": ingress}},
        **spec,
    )


def outside(
    lab: Lab, addr: str, port: int = 80, count: int = 20, timeout: float = 1.0
) -> dict[str, int]:
    return lab.executor(lab.client_ns).call(tally, tcp_ask, addr, port, timeout, count=count)


def from_pod(
    lab: Lab,
    addr: str,
    port: int = 80,
    count: int = 20,
    timeout: float = 1.0,
    *,
    pod: str = "client",
) -> dict[str, int]:
    return lab.in_pod(pod).call(tally, tcp_ask, addr, port, timeout, count=count)


# --------------------------------------------------------- external destinations


def test_external_ips(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        service("ext", "10.96.20.1", [HTTP], externalIPs=["203.0.113.10"]),
        endpoint_slice("ext", eps("local-1", "remote-1")),
    )
    sync(lab, manifests)
    assert set(outside(lab, "203.0.113.10", count=40)) == {"local-1", "remote-1"}
    # External traffic with Cluster policy is masqueraded.
    reply: Reply = lab.executor(lab.client_ns).call(tcp_ask, "203.0.113.10", 80)
    assert reply.client_ip != CLIENT_IP


def test_load_balancer_ingress_ip_but_not_ip_mode_proxy(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        load_balancer(
            "lb",
            "10.96.20.2",
            [{"ip": "198.51.100.10"}, {"ip": "198.51.100.11", "ipMode": "Proxy"}],
            externalTrafficPolicy="Local",
        ),
        endpoint_slice("lb", eps("local-1", "remote-1")),
    )
    sync(lab, manifests)
    # Local policy: only node-a's endpoint, and the client's own address is kept.
    seen = lab.executor(lab.client_ns).call(
        lambda: {tcp_ask("198.51.100.10", 80) for _ in range(10)}
    )
    assert seen == {Reply("local-1", CLIENT_IP)}
    # ipMode Proxy: the load balancer proxies to the node, the VIP is not captured.
    assert "local-1" not in outside(lab, "198.51.100.11", count=1, timeout=0.5)


def test_load_balancer_source_ranges(lab: Lab, manifests: ManifestDir) -> None:
    def write(ranges: list[str]) -> None:
        manifests.write(
            "svc.yaml",
            load_balancer(
                "fw",
                "10.96.20.3",
                [{"ip": "198.51.100.20"}],
                node_port=30501,
                loadBalancerSourceRanges=ranges,
            ),
            endpoint_slice("fw", eps("local-1")),
        )

    # Entries may carry whitespace, as the API allows.
    write([" 192.168.60.0/24 ", "172.16.0.0/12"])
    sync(lab, manifests)
    assert outside(lab, "198.51.100.20", count=5) == {"local-1": 5}
    # Pods are filtered too (their address is not in the ranges)...
    assert from_pod(lab, "198.51.100.20", count=2, timeout=0.5) == {"timeout": 2}
    # ...but only on the load-balancer IP: not the NodePort, not the ClusterIP.
    assert outside(lab, NODE_IP, 30501, count=3) == {"local-1": 3}
    assert from_pod(lab, "10.96.20.3", count=3) == {"local-1": 3}

    write(["10.244.0.0/16"])
    sync(lab, manifests)
    assert outside(lab, "198.51.100.20", count=2, timeout=0.5) == {"timeout": 2}
    assert from_pod(lab, "198.51.100.20", count=3) == {"local-1": 3}


def test_an_external_ip_that_is_also_the_load_balancer_ip(lab: Lab, manifests: ManifestDir) -> None:
    """One address as both: upstream's nftables mode firewalls it (its firewall-ips set
    holds the load-balancer IP's destination, whichever way the packet was meant), while
    its iptables mode's external-IP rule comes first and serves every source. Each mode
    as upstream's (kubeproxy's nftables mode once kept one destination and lost the
    firewall)."""
    manifests.write(
        "svc.yaml",
        load_balancer(
            "both",
            "10.96.20.4",
            [{"ip": "198.51.100.30"}],
            node_port=30502,
            externalIPs=["198.51.100.30"],
            loadBalancerSourceRanges=["10.244.0.0/16"],
        ),
        endpoint_slice("both", eps("local-1")),
    )
    sync(lab, manifests)
    served = {"local-1": 2}
    want = {"timeout": 2} if lab.mode == "nftables" else served
    assert outside(lab, "198.51.100.30", count=2, timeout=0.5) == want
    assert from_pod(lab, "198.51.100.30", count=2) == served


def test_an_external_ip_equal_to_another_services_cluster_ip_keeps_the_client_address(
    lab: Lab, manifests: ManifestDir
) -> None:
    """A kept difference (docs/differences-from-upstream.md,
    external-ip-equal-to-a-cluster-ip): upstream's nftables mode masquerades every
    off-cluster packet to an address in its cluster-ips set, so an external IP that is
    also some Service's ClusterIP loses the client address under
    ``externalTrafficPolicy: Local``; kubeproxy masquerades per frontend, as the
    Service's policy says, and as upstream's iptables mode does."""
    manifests.write(
        "svc.yaml",
        service("inner", "10.96.20.5", [HTTP]),
        endpoint_slice("inner", eps("remote-1")),
        service(
            "outer",
            "10.96.20.6",
            [{**HTTP, "port": 81, "nodePort": 30503}],
            type="NodePort",
            externalIPs=["10.96.20.5"],
            externalTrafficPolicy="Local",
        ),
        endpoint_slice("outer", eps("local-1")),
    )
    sync(lab, manifests)
    reply: Reply = lab.executor(lab.client_ns).call(tcp_ask, "10.96.20.5", 81)
    assert reply == Reply("local-1", CLIENT_IP)


# -------------------------------------------------------------- session affinity


def test_session_affinity_sticks_until_the_timeout(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        service(
            "sticky",
            "10.96.21.1",
            [HTTP],
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 2}},
        ),
        endpoint_slice("sticky", eps("local-1", "local-2", "remote-1", "remote-2")),
    )
    sync(lab, manifests)
    first = from_pod(lab, "10.96.21.1", count=30)
    assert len(first) == 1, first  # one client, one endpoint
    chosen = next(iter(first))
    # Another client gets its own (random) choice, and keeps it.
    other = lab.executor(lab.node_ns).call(tally, tcp_ask, "10.96.21.1", 80, count=20)
    assert len(other) == 1, other
    # After the timeout without new connections, the client may move: within a few
    # tries (each a fresh random choice after the timeout) it lands elsewhere.
    moved = False
    for _ in range(12):
        time.sleep(2.3)
        if set(from_pod(lab, "10.96.21.1", count=1)) != {chosen}:
            moved = True
            break
    assert moved, "affinity did not expire"


def test_session_affinity_survives_endpoint_churn_of_other_endpoints(
    lab: Lab, manifests: ManifestDir
) -> None:
    def write(*pods: str) -> None:
        manifests.write(
            "svc.yaml",
            service("sticky2", "10.96.21.2", [HTTP], sessionAffinity="ClientIP"),
            endpoint_slice("sticky2", eps(*pods)),
        )

    write("local-1", "remote-1")
    proc = lab.start(manifests.path)
    try:
        deadline = time.monotonic() + 15
        chosen = ""
        while time.monotonic() < deadline and chosen not in PODS:
            chosen = next(iter(from_pod(lab, "10.96.21.2", count=1, timeout=0.3)))
            time.sleep(0.1)
        assert chosen in ("local-1", "remote-1"), chosen
        others = [p for p in ("local-2", "remote-2") if p != chosen]
        write(chosen, *others)  # partial syncs: the remembered endpoint stays
        time.sleep(2.5)
        assert from_pod(lab, "10.96.21.2", count=20) == {chosen: 20}
        # The remembered endpoint goes away: the client moves to a remaining one (as
        # soon as the change is synced: the watcher debounces, syncs are 1 s apart).
        write(*others)
        wait_for(lambda: set(from_pod(lab, "10.96.21.2", count=20)) <= set(others), timeout=20)
    finally:
        proc.terminate()
        proc.wait(10)


# --------------------------------------------------------------------- dual stack


def test_dual_stack_cluster_ip_and_nodeport(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        service(
            "ds",
            ["10.96.22.1", "fd00:10:96::22:1"],
            [{**HTTP, "nodePort": 30600}, {"name": "dns", "port": 53, "protocol": "UDP"}],
            type="NodePort",
        ),
        endpoint_slice(
            "ds",
            eps("local-1"),
            [{"name": "http", "port": 8080}, {"name": "dns", "port": 8080, "protocol": "UDP"}],
        ),
        endpoint_slice(
            "ds",
            eps("remote-1", family=6),
            [{"name": "http", "port": 8080}, {"name": "dns", "port": 8080, "protocol": "UDP"}],
        ),
    )
    sync(lab, manifests)
    assert from_pod(lab, "10.96.22.1", count=5) == {"local-1": 5}
    assert from_pod(lab, "fd00:10:96::22:1", count=5) == {"remote-1": 5}
    assert lab.in_pod("client").call(tally, udp_ask, "fd00:10:96::22:1", 53, count=5) == {
        "remote-1": 5
    }
    # The IPv6 NodePort on node-a's primary IPv6 address, from outside, masqueraded.
    reply: Reply = lab.executor(lab.client_ns).call(tcp_ask, NODE_IP6, 30600)
    assert reply.pod == "remote-1" and reply.client_ip != CLIENT_IP6
    assert outside(lab, NODE_IP, 30600, count=3) == {"local-1": 3}


# ---------------------------------------------------------------------------- SCTP


def test_sctp_cluster_ip_and_nodeport(lab: Lab, manifests: ManifestDir) -> None:
    # This kernel has no SCTP sockets; raw INIT packets show where the proxy sends them.
    manifests.write(
        "svc.yaml",
        service(
            "sctp",
            "10.96.23.1",
            [{"name": "s", "port": 7777, "protocol": "SCTP", "nodePort": 30700}],
            type="NodePort",
        ),
        endpoint_slice("sctp", eps("local-1"), [{"name": "s", "port": 9999, "protocol": "SCTP"}]),
    )
    sync(lab, manifests)
    for sender, dst, port, source in (
        (lab.in_pod("client"), "10.96.23.1", 7777, ip("client")),
        (lab.executor(lab.client_ns), NODE_IP, 30700, None),
    ):
        arrival = lab.in_pod("local-1").submit(capture, 3.0)
        time.sleep(0.2)
        sender.call(send_init, dst, port, 40001)
        got = arrival.result(timeout=5)
        assert got is not None, f"no SCTP INIT reached the endpoint via {dst}:{port}"
        assert (got.dst_ip, got.dst_port) == (ip("local-1"), 9999)
        if source is not None:  # the Pod's association is not masqueraded
            assert (got.src_ip, got.src_port) == (source, 40001)
        else:  # external traffic is (masquerade fully-random also picks the port)
            assert got.src_ip != CLIENT_IP


# ----------------------------------------------------------------- service CIDRs


@pytest.mark.proxy_modes("nftables")  # nftables mode's behaviour, not upstream iptables'
def test_service_cidrs_drop_unallocated_and_reject_unused_ports(
    lab: Lab, manifests: ManifestDir
) -> None:
    manifests.write(
        "svc.yaml",
        service("web", "10.96.24.1", [HTTP]),
        endpoint_slice("web", eps("local-1")),
        # A ServiceCIDR object adds a range, as the API's networking.k8s.io/v1 does.
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": {"name": "extra"},
            "spec": {"cidrs": ["10.97.0.0/16"]},
        },
    )
    sync(lab, manifests, "--service-cluster-ip-range", "10.96.0.0/16")
    assert from_pod(lab, "10.96.24.1", count=3) == {"local-1": 3}
    # An allocated ClusterIP on a port no Service uses: rejected.
    assert from_pod(lab, "10.96.24.1", 81, count=2) == {"refused": 2}
    # An address in a service range that nothing has: dropped (upstream nftables).
    assert from_pod(lab, "10.96.99.99", count=1, timeout=0.5) == {"timeout": 1}
    assert from_pod(lab, "10.97.1.1", count=1, timeout=0.5) == {"timeout": 1}
    # A wrong protocol on an allocated ClusterIP is rejected too (ICMP to a connected
    # UDP socket surfaces as ECONNREFUSED).

    def udp_refused() -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(1)
            s.connect(("10.96.24.1", 80))
            s.send(b"?")
            try:
                s.recv(64)
            except ConnectionRefusedError:
                return True
            except TimeoutError:
                return False
            return False

    assert lab.in_pod("client").call(udp_refused)


# --------------------------------------------------------------------- NodePorts


@pytest.mark.proxy_modes("nftables")  # nftables mode's behaviour, not upstream iptables'
def test_nodeports_are_not_served_on_localhost(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        service("np", "10.96.25.1", [{**HTTP, "nodePort": 30800}], type="NodePort"),
        endpoint_slice("np", eps("local-1")),
    )
    sync(lab, manifests, "--nodeport-addresses", "0.0.0.0/0")
    node = lab.executor(lab.node_ns)
    assert node.call(tally, tcp_ask, NODE_IP, 30800, count=3) == {"local-1": 3}
    assert node.call(tally, tcp_ask, "192.168.60.1", 30800, count=3) == {"local-1": 3}
    assert node.call(tally, tcp_ask, "127.0.0.1", 30800, count=2) == {"refused": 2}
    assert NODE == "node-a"


def test_a_nodeport_without_endpoints_refuses_the_nodes_own_connection(
    lab: Lab, manifests: ManifestDir
) -> None:
    """As upstream (both modes), the no-endpoint NodePort check is on the input path: the
    node's own connection is refused on arrival (ECONNREFUSED), not dropped on its way
    out (EPERM, errno 1), which nftables mode did until the differential test against
    upstream kube-proxy found it (docs/differences-from-upstream.md)."""
    manifests.write(
        "svc.yaml",
        service(
            "none",
            "10.96.25.2",
            [
                {**HTTP, "nodePort": 30801},
                {**HTTP, "name": "udp", "protocol": "UDP", "nodePort": 30801},
            ],
            type="NodePort",
        ),
        endpoint_slice("none", []),
    )
    sync(lab, manifests)
    node = lab.executor(lab.node_ns)
    for ask in (tcp_ask, udp_ask_connected):
        assert node.call(tally, ask, NODE_IP, 30801, count=2) == {"refused": 2}, ask
    assert outside(lab, NODE_IP, 30801, count=2) == {"refused": 2}
