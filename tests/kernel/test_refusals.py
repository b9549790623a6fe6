"""Inputs real clusters produce that the kernel must never be asked to refuse, and what
happens when it refuses anyway: no single Service may stop the sync of the others.

Each test reproduces a finding of the review that filed issue 8 (the failing state is
described in the test's docstring) through ``kubeproxy run --once`` and real packets.
"""

from __future__ import annotations

from typing import Any

from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.nftables.runner import NftCommand
from kubeproxy.lab.cluster import CLIENT_IP6, NODE_IP, Lab
from kubeproxy.lab.echo import tally, tcp_ask
from kubeproxy.lab.netns import ns_exec
from kubeproxy.lab.objects import ManifestDir, endpoint_slice, service
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import (
    Endpoint,
    IPFamily,
    L4Protocol,
    NamespacedName,
    ServicePort,
    ServicePortName,
)
from tests.kernel.conftest import HTTP, eps, ip, sync


def outside(lab: Lab, addr: str, port: int = 80, count: int = 5) -> dict[str, int]:
    return lab.executor(lab.client_ns).call(tally, tcp_ask, addr, port, 1.0, count=count)


def service_cidr(name: str, *cidrs: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "spec": {"cidrs": list(cidrs)},
    }


def test_overlapping_service_cidrs_and_nodeport_addresses(lab: Lab, manifests: ManifestDir) -> None:
    """Extending the Service range as documented leaves two overlapping ServiceCIDRs;
    nft answered "conflicting intervals specified" and nothing was ever programmed."""
    manifests.write(
        "cidrs.yaml",
        service_cidr("kubernetes", "10.96.0.0/28"),
        service_cidr("extended", "10.96.0.0/24"),
    )
    manifests.write(
        "svc.yaml",
        service("web", "10.96.0.5", [{**HTTP, "nodePort": 30610}], type="NodePort"),
        endpoint_slice("web", eps("local-1")),
    )
    sync(lab, manifests, "--nodeport-addresses", "192.168.50.0/24,192.168.50.1/32")
    assert outside(lab, NODE_IP, 30610) == {"local-1": 5}
    assert lab.in_pod("client").call(tally, tcp_ask, "10.96.0.5", 80, count=3) == {"local-1": 3}
    # An unallocated address of the merged range is still dropped (not refused).
    assert lab.in_pod("client").call(tally, tcp_ask, "10.96.0.77", 80, 0.5, count=1) == {
        "timeout": 1
    }


def test_ipv6_load_balancer_ip_is_not_firewalled_by_ipv4_source_ranges(
    lab: Lab, manifests: ManifestDir
) -> None:
    """An IPv6 LB IP on a Service whose loadBalancerSourceRanges are all IPv4 got a
    firewall entry with no allowed source: every IPv6 client was dropped. As upstream,
    ranges are filtered per family: no IPv6 range means no IPv6 firewall."""
    manifests.write(
        "svc.yaml",
        service(
            "dual",
            ["10.96.30.1", "fd00:10:96::30:1"],
            [{**HTTP, "nodePort": 30611}],
            type="LoadBalancer",
            ipFamilies=["IPv4", "IPv6"],
            ipFamilyPolicy="RequireDualStack",
            loadBalancerSourceRanges=["172.16.0.0/12"],
            status={"loadBalancer": {"ingress": [{"ip": "198.51.100.60"}, {"ip": "2001:db8::60"}]}},
        ),
        endpoint_slice("dual", eps("local-1")),
        endpoint_slice("dual", eps("local-1", family=6)),
    )
    sync(lab, manifests)
    # IPv4: the client (192.168.60.2) is outside the IPv4 ranges: filtered.
    assert outside(lab, "198.51.100.60", count=2) == {"timeout": 2}
    # IPv6: no IPv6 range was given, so the IPv6 LB IP is open.
    got = lab.executor(lab.client_ns).call(tcp_ask, "2001:db8::60", 80)
    assert got.pod == "local-1"
    assert got.client_ip != CLIENT_IP6  # Cluster policy: masqueraded


def test_load_balancer_ip_inside_a_range_that_holds_the_node_ip(
    lab: Lab, manifests: ManifestDir
) -> None:
    """The "allow from node" element (the LB IP itself) overlapped a source range that
    contains it: the kernel answered "File exists" and this one Service blocked every
    sync. The other Service here must work, and this one too."""
    manifests.write(
        "svc.yaml",
        service(
            "vip",
            "10.96.30.2",
            [{**HTTP, "nodePort": 30612}],
            type="LoadBalancer",
            # The node (192.168.50.1) is in the second range, the LB IP in the first.
            loadBalancerSourceRanges=["198.51.100.0/24", "192.168.0.0/16"],
            status={"loadBalancer": {"ingress": [{"ip": "198.51.100.61"}]}},
        ),
        endpoint_slice("vip", eps("local-1")),
        service("other", "10.96.30.3", [HTTP]),
        endpoint_slice("other", eps("remote-1")),
    )
    sync(lab, manifests)
    assert lab.in_pod("client").call(tally, tcp_ask, "10.96.30.3", 80, count=2) == {"remote-1": 2}
    # The outside client (192.168.60.2) is inside 192.168.0.0/16: allowed.
    assert outside(lab, "198.51.100.61") == {"local-1": 5}


# ---------------------------------------------------- what the kernel does refuse

CONFIG = ProxyConfig(
    hostname="node-a",
    families=(IPFamily.IPv4,),
    cluster_cidrs=("10.244.0.0/16",),
)
NODE = NodeState("node-a", "zone-a", {IPFamily.IPv4: NODE_IP})


def port(name: str, cluster_ip: str, **kw: Any) -> ServicePort:
    spn = ServicePortName(NamespacedName("default", name), "http", L4Protocol.TCP)
    return ServicePort(name=spn, cluster_ips=(cluster_ip,), port=80, **kw)


def test_a_service_the_kernel_refuses_is_left_out_and_the_rest_programmed(lab: Lab) -> None:
    """nft refuses a NodePort above 65535 ("Service out of range"); the parser never lets
    one through, so the model object is built directly: it stands for any ServicePort
    whose rules the kernel refuses."""
    good = port("good", "10.96.31.1")
    bad = port("bad", "10.96.31.2", node_port=70000)
    endpoints = (Endpoint(ip("local-1"), 8080, "node-a"),)
    backend = NftablesBackend(CONFIG, NftCommand(netns=lab.node_ns))
    snap = Snapshot({good.name: good, bad.name: bad}, {good.name: endpoints}, NODE)
    result = backend.sync(snap, None)
    assert result.full
    assert [line.split(" (")[0] for line in result.isolated] == [str(bad.name)]
    assert "Service out of range" in result.isolated[0]
    assert lab.in_pod("client").call(tally, tcp_ask, "10.96.31.1", 80, count=2) == {"local-1": 2}
    listing = ns_exec(lab.node_ns, "nft", "list", "table", "ip", "kube-proxy")
    assert "10.96.31.2" not in listing

    # An unrelated change: partial, and the refused one stays out without being retried.
    other = port("other", "10.96.31.3")
    snap = Snapshot(
        {good.name: good, bad.name: bad, other.name: other},
        {good.name: endpoints, other.name: endpoints},
        NODE,
    )
    result = backend.sync(snap, {other.name})
    assert not result.full
    assert "10.96.31.2" not in backend.last_transaction
    assert lab.in_pod("client").call(tally, tcp_ask, "10.96.31.3", 80, count=1) == {"local-1": 1}

    # Fixed: it is programmed by the partial sync of its change.
    fixed = port("bad", "10.96.31.2", node_port=30613)
    snap = Snapshot(
        {good.name: good, bad.name: fixed, other.name: other},
        {good.name: endpoints, other.name: endpoints, bad.name: endpoints},
        NODE,
    )
    result = backend.sync(snap, {bad.name})
    assert not result.full and result.isolated == []
    assert lab.in_pod("client").call(tally, tcp_ask, "10.96.31.2", 80, count=2) == {"local-1": 2}
