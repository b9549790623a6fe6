"""Packets through the real kernel: kubeproxy programs node-a, clients connect for real.

Every test writes Services and EndpointSlices, runs ``kubeproxy run --once`` inside
node-a's namespace, then opens TCP/UDP connections from a Pod on node-a (internal
traffic) or from the outside client (external traffic) and checks which Pods answered
and which source address they saw.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubeproxy.lab.cluster import (
    CLIENT_IP,
    NODE,
    NODE_IP,
    POD_GATEWAYS,
    REMOTE_NODE,
    REMOTE_NODE_IP,
    Lab,
)
from kubeproxy.lab.echo import Reply, tally, tcp_ask, udp_ask
from kubeproxy.lab.netns import ns_exec
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, service
from tests.kernel.conftest import ALL_MODES, HTTP, eps, ip, sync, wait_for

PROXY_MODES = ALL_MODES

TARGET = {"name": "http", "port": 8080}


def nodeport(name: str, cluster_ip: str, node_port: int, **spec: Any) -> dict[str, Any]:
    return service(name, cluster_ip, [{**HTTP, "nodePort": node_port}], type="NodePort", **spec)


def from_client_pod(
    lab: Lab, vip: str, port: int = 80, count: int = 60, ask: object = tcp_ask
) -> dict[str, int]:
    return lab.in_pod("client").call(tally, ask, vip, port, count=count)


def from_outside(
    lab: Lab, addr: str, port: int, count: int = 60, ask: object = tcp_ask
) -> dict[str, int]:
    return lab.executor(lab.client_ns).call(tally, ask, addr, port, count=count)


def sources(lab: Lab, ns: str, addr: str, port: int, count: int = 30) -> set[tuple[str, str]]:
    """(pod, source address it saw) for ``count`` connections from namespace ``ns``."""

    def ask() -> set[tuple[str, str]]:
        out = set()
        for _ in range(count):
            reply: Reply = tcp_ask(addr, port)
            out.add((reply.pod, reply.client_ip))
        return out

    return lab.executor(ns).call(ask)


# ------------------------------------------------------------------- ClusterIP


def test_cluster_ip_reaches_every_ready_endpoint_and_nothing_else(
    lab: Lab, manifests: ManifestDir
) -> None:
    manifests.write(
        "svc.yaml",
        service("web", "10.96.1.1", [HTTP, {"name": "dns", "port": 53, "protocol": "UDP"}]),
        endpoint_slice(
            "web",
            [
                *eps("local-1", "local-2", "remote-1"),
                # not ready and not terminating: must never be chosen
                Ep(ip("remote-2"), node=REMOTE_NODE, ready=False),
            ],
            [TARGET, {"name": "dns", "port": 8080, "protocol": "UDP"}],
        ),
    )
    sync(lab, manifests)
    seen = from_client_pod(lab, "10.96.1.1", count=120)
    assert set(seen) == {"local-1", "local-2", "remote-1"}, seen
    seen_udp = from_client_pod(lab, "10.96.1.1", 53, count=90, ask=udp_ask)
    assert set(seen_udp) == {"local-1", "local-2", "remote-1"}, seen_udp
    # Pod-to-ClusterIP traffic keeps the Pod's address (no masquerade inside the cluster).
    assert sources(lab, lab.pods["client"].netns, "10.96.1.1", 80) <= {
        (p, ip("client")) for p in ("local-1", "local-2", "remote-1")
    }


def test_cluster_ip_ipv6(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        service("web6", ["10.96.1.2", "fd00:10:96::2"], [HTTP]),
        endpoint_slice("web6", eps("local-1", "remote-1")),
        endpoint_slice("web6", eps("local-2", "remote-2", family=6)),
    )
    sync(lab, manifests)
    assert set(from_client_pod(lab, "fd00:10:96::2", count=60)) == {"local-2", "remote-2"}
    assert set(from_client_pod(lab, "10.96.1.2", count=60)) == {"local-1", "remote-1"}


def test_service_ports_route_to_their_own_target_ports(lab: Lab, manifests: ManifestDir) -> None:
    # Two ServicePorts, each endpoint port found by name in the slice.
    manifests.write(
        "svc.yaml",
        service("multi", "10.96.1.3", [{"name": "a", "port": 80}, {"name": "b", "port": 81}]),
        endpoint_slice(
            "multi", eps("local-1"), [{"name": "a", "port": 8080}, {"name": "b", "port": 9090}]
        ),
    )
    sync(lab, manifests)
    assert from_client_pod(lab, "10.96.1.3", 80, count=5) == {"local-1": 5}
    assert from_client_pod(lab, "10.96.1.3", 81, count=5) == {"local-1": 5}
    # Port 82 is not a ServicePort: nothing DNATs it, nothing answers.
    assert from_client_pod(lab, "10.96.1.3", 82, count=1) != {"local-1": 1}


def test_no_endpoints_refuses_connections(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        nodeport("empty", "10.96.1.4", 30100),
        endpoint_slice("empty", []),
    )
    sync(lab, manifests)
    assert from_client_pod(lab, "10.96.1.4", count=5) == {"refused": 5}
    assert from_outside(lab, NODE_IP, 30100, count=5) == {"refused": 5}


def test_only_terminating_endpoints_still_serve(lab: Lab, manifests: ManifestDir) -> None:
    # No ready endpoint anywhere: serving+terminating ones are used (graceful drain).
    manifests.write(
        "svc.yaml",
        service("draining", "10.96.1.5", [HTTP]),
        endpoint_slice(
            "draining",
            [
                *eps("local-1", "remote-1", ready=False, serving=True, terminating=True),
                *eps("local-2", ready=False, serving=False, terminating=True),
            ],
        ),
    )
    sync(lab, manifests)
    assert set(from_client_pod(lab, "10.96.1.5", count=60)) == {"local-1", "remote-1"}


# --------------------------------------------------------------- traffic policy


def test_internal_traffic_policy_local_reaches_only_local_endpoints(
    lab: Lab, manifests: ManifestDir
) -> None:
    manifests.write(
        "svc.yaml",
        service("cache", "10.96.2.1", [HTTP], internalTrafficPolicy="Local"),
        endpoint_slice("cache", eps("local-1", "remote-1", "remote-2")),
    )
    sync(lab, manifests)
    assert from_client_pod(lab, "10.96.2.1", count=60) == {"local-1": 60}


def test_internal_traffic_policy_local_without_local_endpoints_drops(
    lab: Lab, manifests: ManifestDir
) -> None:
    manifests.write(
        "svc.yaml",
        service("cache", "10.96.2.2", [HTTP], internalTrafficPolicy="Local"),
        endpoint_slice("cache", eps("remote-1")),
    )
    sync(lab, manifests)
    # DROP, not REJECT: endpoints exist, just not on this node.
    seen = lab.in_pod("client").call(tally, tcp_ask, "10.96.2.2", 80, 0.3, count=2)
    assert seen == {"timeout": 2}


def test_external_traffic_policy_local_nodeport_keeps_client_ip(
    lab: Lab, manifests: ManifestDir
) -> None:
    manifests.write(
        "svc.yaml",
        nodeport("shop", "10.96.3.1", 30200, externalTrafficPolicy="Local"),
        endpoint_slice("shop", eps("local-1", "remote-1", "remote-2")),
    )
    sync(lab, manifests)
    assert from_outside(lab, NODE_IP, 30200, count=40) == {"local-1": 40}
    assert sources(lab, lab.client_ns, NODE_IP, 30200) == {("local-1", CLIENT_IP)}
    # The ClusterIP is internal traffic: Cluster policy, every endpoint.
    assert set(from_client_pod(lab, "10.96.3.1", count=90)) == {"local-1", "remote-1", "remote-2"}


def test_external_traffic_policy_local_without_local_endpoints(
    lab: Lab, manifests: ManifestDir
) -> None:
    manifests.write(
        "svc.yaml",
        nodeport("shop", "10.96.3.2", 30201, externalTrafficPolicy="Local"),
        endpoint_slice("shop", eps("remote-1")),
    )
    sync(lab, manifests)
    # Outside clients are dropped (the load balancer's health check steers them away)...
    seen = lab.executor(lab.client_ns).call(tally, tcp_ask, NODE_IP, 30201, 0.3, count=2)
    assert seen == {"timeout": 2}
    # ...but Pods are short-circuited to the cluster-wide endpoints, as upstream.
    assert from_client_pod(lab, NODE_IP, 30201, count=10) == {"remote-1": 10}


def test_external_traffic_policy_cluster_masquerades(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        nodeport("shop", "10.96.3.3", 30202),
        endpoint_slice("shop", eps("local-1", "remote-1")),
    )
    sync(lab, manifests)
    seen = sources(lab, lab.client_ns, NODE_IP, 30202, count=40)
    assert {pod for pod, _ in seen} == {"local-1", "remote-1"}
    # The backend never sees the client: the node's address towards the backend instead.
    assert seen == {("local-1", POD_GATEWAYS[NODE][0]), ("remote-1", NODE_IP)}


@pytest.mark.proxy_modes("nftables")  # nftables mode's behaviour, not upstream iptables'
def test_nodeport_only_on_primary_address_by_default(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        nodeport("shop", "10.96.3.4", 30203),
        endpoint_slice("shop", eps("local-1")),
    )
    sync(lab, manifests)
    assert from_outside(lab, NODE_IP, 30203, count=3) == {"local-1": 3}
    # 192.168.60.1 is node-a's address towards the client, not its primary IP.
    assert from_outside(lab, "192.168.60.1", 30203, count=1) == {"refused": 1}
    # --nodeport-addresses with a CIDR opens it there too.
    sync(lab, manifests, "--nodeport-addresses", "192.168.60.0/24,192.168.50.1/32")
    assert from_outside(lab, "192.168.60.1", 30203, count=3) == {"local-1": 3}
    assert from_outside(lab, NODE_IP, 30203, count=3) == {"local-1": 3}


# ------------------------------------------------------------------ masquerade


def test_cluster_ip_from_outside_the_cluster_is_masqueraded(
    lab: Lab, manifests: ManifestDir
) -> None:
    manifests.write(
        "svc.yaml",
        service("web", "10.96.4.1", [HTTP]),
        endpoint_slice("web", eps("remote-1")),
    )
    sync(lab, manifests)
    # The outside client routes the service range to node-a (a static route, as upstream
    # describes); its source is not in --cluster-cidr, so it must be masqueraded.
    assert sources(lab, lab.client_ns, "10.96.4.1", 80, count=5) == {("remote-1", NODE_IP)}


def test_hairpin_pod_reaching_itself_is_masqueraded(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        service("self", "10.96.4.2", [HTTP]),
        endpoint_slice("self", eps("local-1")),
    )
    sync(lab, manifests)
    seen = sources(lab, lab.pods["local-1"].netns, "10.96.4.2", 80, count=5)
    # Without masquerade the Pod would answer itself directly and the connection would
    # never be un-DNATed; it sees the node's gateway address instead.
    assert seen == {("local-1", POD_GATEWAYS[NODE][0])}


def test_masquerade_all(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        service("web", "10.96.4.3", [HTTP]),
        endpoint_slice("web", eps("remote-1")),
    )
    sync(lab, manifests, "--masquerade-all")
    assert sources(lab, lab.pods["client"].netns, "10.96.4.3", 80, count=5) == {
        ("remote-1", NODE_IP)
    }


def test_node_itself_reaches_cluster_ip(lab: Lab, manifests: ManifestDir) -> None:
    # Host-network processes take the output path (nat-output chain).
    manifests.write(
        "svc.yaml",
        service("web", "10.96.4.4", [HTTP]),
        endpoint_slice("web", eps("local-2", "remote-2")),
    )
    sync(lab, manifests)
    seen = lab.executor(lab.node_ns).call(tally, tcp_ask, "10.96.4.4", 80, count=40)
    assert set(seen) == {"local-2", "remote-2"}


# ---------------------------------------------------------------- bad input


def test_invalid_service_is_skipped_and_others_keep_working(
    lab: Lab, manifests: ManifestDir
) -> None:
    manifests.write(
        "good.yaml",
        service("good", "10.96.5.1", [HTTP]),
        endpoint_slice("good", eps("local-1")),
    )
    manifests.write(
        "bad.yaml",
        service("bad", "10.96.5.2", [{"name": "http", "port": 0}]),
        service("evil", "10.96.5.3; flush ruleset", [HTTP]),
        endpoint_slice("bad", eps("local-2")),
    )
    log = sync(lab, manifests)
    assert from_client_pod(lab, "10.96.5.1", count=5) == {"local-1": 5}
    lines = [line for line in log.splitlines() if "Skipping invalid Service" in line]
    assert len(lines) == 2, log
    assert any("default/bad" in line and "spec.ports[0].port" in line for line in lines)
    assert any("default/evil" in line and "spec.clusterIP" in line for line in lines)


# ------------------------------------------------------------- live updates


def test_endpoint_changes_take_effect_on_the_next_sync(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        service("live", "10.96.6.1", [HTTP]),
        endpoint_slice("live", eps("local-1")),
    )
    proc = lab.start(manifests.path)
    try:
        wait_for(lambda: from_client_pod(lab, "10.96.6.1", count=3) == {"local-1": 3})
        # Endpoint added.
        manifests.write(
            "svc.yaml",
            service("live", "10.96.6.1", [HTTP]),
            endpoint_slice("live", eps("local-1", "remote-1")),
        )
        wait_for(lambda: "remote-1" in from_client_pod(lab, "10.96.6.1", count=20))
        # Endpoint removed.
        manifests.write(
            "svc.yaml",
            service("live", "10.96.6.1", [HTTP]),
            endpoint_slice("live", eps("remote-1")),
        )
        wait_for(lambda: from_client_pod(lab, "10.96.6.1", count=20) == {"remote-1": 20})
        # Service deleted: its rules go, so nothing answers on the ClusterIP any more.
        manifests.remove("svc.yaml")
        wait_for(
            lambda: (
                "remote-1"
                not in lab.in_pod("client").call(tally, tcp_ask, "10.96.6.1", 80, 0.3, count=1)
            )
        )
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(10)
    # SIGTERM leaves the rules in place (as upstream: traffic flows across restarts).
    assert lab.rules_present()


def test_remote_node_address_is_not_a_nodeport(lab: Lab, manifests: ManifestDir) -> None:
    # Sanity check of the lab itself: node-b runs no proxy.
    manifests.write(
        "svc.yaml",
        nodeport("shop", "10.96.7.1", 30300),
        endpoint_slice("shop", eps("local-1")),
    )
    sync(lab, manifests)
    seen = lab.executor(lab.client_ns).call(tally, tcp_ask, REMOTE_NODE_IP, 30300, 0.5, count=1)
    assert seen != {"local-1": 1}


@pytest.mark.parametrize(
    "args", [["--nodeport-addresses", "not-a-cidr"], ["--cluster-cidr", "10.0.0.0/33"]]
)
def test_bad_flags_exit_before_touching_the_kernel(
    lab: Lab, manifests: ManifestDir, args: list[str]
) -> None:
    ns_exec(lab.node_ns, "nft", "add", "table", "ip", "marker")
    try:
        result = lab.sync_once(manifests.path, *args)
        # A configuration error, as upstream: exit 1, every problem, no usage banner.
        assert result.returncode == 1 and "usage:" not in result.stderr, result.stderr
        assert "invalid" in result.stderr or "neither" in result.stderr
    finally:
        ns_exec(lab.node_ns, "nft", "delete", "table", "ip", "marker")
