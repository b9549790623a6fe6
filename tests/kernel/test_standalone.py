"""A manifest directory as a cluster, with real packets: Pods and Nodes in two zones.

kubeproxy (``run --once`` on node-a, zone-a) reads Pods, Nodes and Services without a
clusterIP, allocates the ClusterIPs (kept in the directory's state file), computes the
EndpointSlices with hints, and programs node-a. A client Pod on node-a then connects for
real: with topology hints only the zone-a Pods answer, without them every Pod does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubeproxy.controlplane.statefile import STATE_FILE_NAME
from kubeproxy.lab.cluster import (
    NODE,
    NODE_IP,
    NODE_IP6,
    REMOTE_NODE,
    REMOTE_NODE_IP,
    Lab,
    stop_process,
)
from kubeproxy.lab.echo import tally, tcp_ask
from kubeproxy.lab.objects import ManifestDir, node, pod, service
from tests.kernel.conftest import HTTP, PODS, sync, wait_for

AUTO = {"service.kubernetes.io/topology-mode": "Auto"}
TARGET = {**HTTP, "targetPort": "http"}  # the Pods' named container port (8080)
WEB = ("local-1", "local-2", "remote-1", "remote-2")


def cluster_manifests(
    manifests: ManifestDir,
    *,
    hints: bool = True,
    not_ready: frozenset[str] | set[str] = frozenset(),
) -> None:
    zoned = service("zoned", (), [TARGET], selector={"app": "web"})
    if hints:
        zoned["metadata"]["annotations"] = AUTO
    manifests.write(
        "node.yaml",
        node(NODE, [NODE_IP, NODE_IP6], zone="zone-a", cpu="4"),
        node(REMOTE_NODE, [REMOTE_NODE_IP], zone="zone-b", cpu="4"),
    )
    manifests.write(
        "cluster.yaml",
        zoned,
        service("everywhere", (), [TARGET], selector={"app": "web"}),
        service("close", (), [TARGET], selector={"app": "web"}, trafficDistribution="PreferClose"),
        *(
            pod(name, PODS[name][0], [PODS[name][1]], {"app": "web"}, ready=name not in not_ready)
            for name in WEB
        ),
    )


def allocated(manifests: ManifestDir) -> dict[str, Any]:
    state = json.loads((manifests.path / STATE_FILE_NAME).read_text())
    return {key.split("/")[1]: entry["clusterIPs"][0] for key, entry in state["services"].items()}


def answered(lab: Lab, vip: str) -> set[str]:
    return set(lab.in_pod("client").call(tally, tcp_ask, vip, 80, count=40))


def test_zone_a_client_reaches_only_zone_a_pods_with_hints_and_every_pod_without(
    lab: Lab, manifests: ManifestDir
) -> None:
    cluster_manifests(manifests)
    log = sync(lab, manifests)
    assert "TopologyAwareHintsEnabled" in log
    ips = allocated(manifests)
    assert set(ips) == {"zoned", "everywhere", "close"}
    assert all(ip.startswith("10.") for ip in ips.values())  # the default 10.96.0.0/12

    assert answered(lab, ips["zoned"]) == {"local-1", "local-2"}
    assert answered(lab, ips["close"]) == {"local-1", "local-2"}
    assert answered(lab, ips["everywhere"]) == set(WEB)

    # Hints off (the annotation removed): the same Service, the same ClusterIP (a new
    # process reads the state file), every Pod.
    cluster_manifests(manifests, hints=False)
    sync(lab, manifests)
    assert allocated(manifests) == ips
    assert answered(lab, ips["zoned"]) == set(WEB)


def test_a_not_ready_pod_leaves_and_a_bad_cluster_ip_costs_only_its_service(
    lab: Lab, manifests: ManifestDir
) -> None:
    cluster_manifests(manifests, not_ready={"local-1"})
    manifests.write(
        "more.yaml", service("outside", "192.168.99.1", [TARGET], selector={"app": "web"})
    )
    log = sync(lab, manifests)
    assert "Skipping Service default/outside: spec.clusterIPs" in log
    ips = allocated(manifests)
    assert "outside" not in ips
    assert answered(lab, ips["everywhere"]) == {"local-2", "remote-1", "remote-2"}


def test_a_running_proxy_follows_pod_changes(
    lab: Lab, manifests: ManifestDir, tmp_path: Path
) -> None:
    cluster_manifests(manifests)
    log = tmp_path / "log"
    proc = lab.start(manifests.path, "--v=2", log=log)
    try:
        wait_for((manifests.path / STATE_FILE_NAME).exists)
        ips = allocated(manifests)
        wait_for(lambda: answered(lab, ips["zoned"]) == {"local-1", "local-2"})
        # local-1 not ready: 3 endpoints cannot give each zone its minimum share, so the
        # controller drops every hint and the zone-a client reaches the other three.
        cluster_manifests(manifests, not_ready={"local-1"})
        wait_for(lambda: answered(lab, ips["zoned"]) == {"local-2", "remote-1", "remote-2"})
        assert "TopologyAwareHintsDisabled" in log.read_text()
        assert answered(lab, ips["everywhere"]) == {"local-2", "remote-1", "remote-2"}
    finally:
        stop_process(proc)
