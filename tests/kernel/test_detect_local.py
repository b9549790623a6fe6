"""``--detect-local-mode``: which sources count as "a local Pod", through real packets.

A connection to a ClusterIP is masqueraded unless it comes from a local Pod. Remote
Pods (node-b, 10.244.2.0/24) reach node-a's ClusterIPs through node-a here, so each mode
shows in the client address the endpoint sees: ClusterCIDR counts them as local,
NodeCIDR (node-a's podCIDR 10.244.1.0/24) does not; InterfaceNamePrefix and
BridgeInterface match the interface the packet came in on.
"""

from __future__ import annotations

import pytest

from kubeproxy.lab.cluster import NODE, NODE_IP, NODE_IP6, POD_CIDRS, Lab
from kubeproxy.lab.echo import tcp_ask
from kubeproxy.lab.netns import ns_exec
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, node, service
from tests.kernel.conftest import ALL_MODES, PODS, ip, sync

PROXY_MODES = ALL_MODES

CLUSTER_IP = "10.96.40.1"


def host_interface(lab: Lab, pod: str) -> str:
    """The node-side interface a Pod's packets come in on."""
    route = ns_exec(lab.node_ns, "ip", "-o", "route", "get", ip(pod)).split()
    return route[route.index("dev") + 1]


def seen_from(lab: Lab, pod: str) -> str:
    """The client address the endpoint sees when ``pod`` connects to the ClusterIP."""
    return lab.in_pod(pod).call(tcp_ask, CLUSTER_IP, 80).client_ip


@pytest.fixture
def setup(lab: Lab, manifests: ManifestDir) -> ManifestDir:
    manifests.write(
        "node.yaml", node(NODE, [NODE_IP, NODE_IP6], zone="zone-a", pod_cidrs=POD_CIDRS[NODE])
    )
    manifests.write(
        "svc.yaml",
        service("local-check", CLUSTER_IP),
        endpoint_slice("local-check", [Ep(ip("local-1"), node=PODS["local-1"][0])]),
    )
    return manifests


def test_cluster_cidr_counts_every_pod_of_the_cluster(lab: Lab, setup: ManifestDir) -> None:
    sync(lab, setup)  # the default: ClusterCIDR with the lab's --cluster-cidr
    assert seen_from(lab, "client") == ip("client")
    assert seen_from(lab, "remote-1") == ip("remote-1")


def test_node_cidr_counts_only_this_nodes_pods(lab: Lab, setup: ManifestDir) -> None:
    sync(lab, setup, "--detect-local-mode", "NodeCIDR")
    assert seen_from(lab, "client") == ip("client")
    assert seen_from(lab, "remote-1") != ip("remote-1")  # masqueraded


def test_interface_name_prefix(lab: Lab, setup: ManifestDir) -> None:
    prefix = host_interface(lab, "client")[:2]  # the lab's Pod veths: vp0, vp1, ...
    sync(
        lab,
        setup,
        "--detect-local-mode",
        "InterfaceNamePrefix",
        "--pod-interface-name-prefix",
        prefix,
    )
    assert seen_from(lab, "client") == ip("client")
    assert seen_from(lab, "remote-1") != ip("remote-1")  # came in on eth0


def test_bridge_interface(lab: Lab, setup: ManifestDir) -> None:
    bridge = host_interface(lab, "client")
    sync(lab, setup, "--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", bridge)
    assert seen_from(lab, "client") == ip("client")
    assert seen_from(lab, "local-2") != ip("local-2")  # another interface: not "local"


def test_an_interface_name_that_could_reach_the_rules_is_refused(
    lab: Lab, setup: ManifestDir
) -> None:
    result = lab.sync_once(
        setup.path,
        "--detect-local-mode",
        "InterfaceNamePrefix",
        "--pod-interface-name-prefix",
        'x" accept',
    )
    assert result.returncode != 0
    assert "detectLocal.interfaceNamePrefix" in result.stderr
