"""Topology: the real EndpointSlice controller's hints, and routing that follows them.

The lab's nodes: node-a and node-c in zone-a, node-b alone in zone-b, 4 allocatable CPUs
each (so zone-a has 2/3 of the CPU). Hints are what kube-controller-manager writes; the
tests read them from the EndpointSlices, assert they are there (or gone), then check
where node-b's proxy (kubeproxy, and upstream kube-proxy as the oracle: conftest.py)
and node-a's kubeproxy send a client's connections.

``topology-mode: Auto`` (upstream's TopologyCache): hints only when every Node has a zone
and allocatable CPU, at least as many ready endpoints as zones, and every zone can get
its minimum share, ``ceil(cpu_share * endpoints / 1.2)``, without going over. Three
ready endpoints, two in zone-a and one in zone-b, need minimums of 2 and 1: each
endpoint is hinted for its own zone. With the zone-b one not ready, two endpoints cannot
cover minimums of 2 and 1, and the controller takes the hints away.

``trafficDistribution`` (PreferClose, PreferSameZone, PreferSameNode; v1.37 serves all
three): no CPU arithmetic, every ready endpoint is hinted for its own zone (and, for
PreferSameNode, its own node). A node whose zone (and node) no hint names uses every
endpoint, as does one where some ready endpoint has no hint.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubeproxy.lab.kube.api import Obj
from kubeproxy.lab.kube.cluster import KubeLab, wait_for
from tests.realk8s.conftest import answers, service_ip
from tests.realk8s.services.conftest import NODE, NodeProxy, attempt, service
from tests.realk8s.test_services import web

ASKS = 30  # two equally likely endpoints both answer in 30 tries but with p = 2**-29


def hints(kube: KubeLab, namespace: str, name: str) -> dict[str, Obj | None]:
    """The IPv4 EndpointSlices' hints of Service ``name``, by the endpoint's Pod name."""
    slices = kube.api().list_of(
        "EndpointSlice", namespace, labelSelector=f"kubernetes.io/service-name={name}"
    )
    return {
        ep["targetRef"]["name"]: ep.get("hints")
        for s in slices
        if s["addressType"] == "IPv4"
        for ep in s.get("endpoints") or ()
    }


def hinted(
    kube: KubeLab, namespace: str, name: str, want: dict[str, Obj | None]
) -> dict[str, Obj | None]:
    """Wait until the controller has written exactly ``want``."""
    result: dict[str, Obj | None] = wait_for(
        lambda: (got := hints(kube, namespace, name)) == want and got,
        what=f"hints {want} on {namespace}/{name}",
    )
    return result


def zone(z: str) -> Obj:
    return {"forZones": [{"name": z}]}


def reached(kube: KubeLab, netns: str, ip: str) -> set[str]:
    """Which Pods answer ``ASKS`` connections from ``netns`` (once rules are there)."""
    answers(kube, netns, ip, 80)
    return {attempt(kube, netns, ip, 80) for _ in range(ASKS)}


def converges(kube: KubeLab, netns: str, ips: Iterable[str], want: set[str]) -> None:
    """Rules follow the controller's hints a moment after they are written: ask until
    every IP reaches exactly ``want`` (a proxy that never does fails the test)."""
    for ip in ips:
        wait_for(lambda ip=ip: reached(kube, netns, ip) == want, what=f"{ip} reaching {want}")


def test_topology_mode_auto_follows_the_controllers_hints(
    kube: KubeLab, namespace: str, proxy: NodeProxy
) -> None:
    on_a, on_b, on_c = web(kube, namespace, "node-a", NODE, "node-c")
    service(kube, namespace, annotations={"service.kubernetes.io/topology-mode": "Auto"})
    ip = service_ip(kube, namespace, "web")
    hinted(
        kube,
        namespace,
        "web",
        {on_a: zone("zone-a"), on_b: zone("zone-b"), on_c: zone("zone-a")},
    )
    client_b = kube.add_pod(f"{namespace}-client-b", NODE, namespace=namespace)
    client_a = kube.add_pod(f"{namespace}-client-a", "node-a", namespace=namespace)
    # zone-b's clients reach zone-b's endpoint only; zone-a's both of zone-a's.
    converges(kube, client_b.netns, [ip], {on_b})
    assert reached(kube, proxy.node.netns, ip) == {on_b}
    converges(kube, client_a.netns, [ip], {on_a, on_c})

    # zone-b's endpoint not ready: no hints at all, so every ready endpoint, everywhere.
    kube.set_pod_ready(on_b, False)
    hinted(kube, namespace, "web", {on_a: None, on_b: None, on_c: None})
    converges(kube, client_b.netns, [ip], {on_a, on_c})
    assert reached(kube, proxy.node.netns, ip) == {on_a, on_c}


def test_traffic_distribution_follows_the_controllers_zone_and_node_hints(
    kube: KubeLab, namespace: str, proxy: NodeProxy
) -> None:
    on_a, on_b, on_c = web(kube, namespace, "node-a", NODE, "node-c")
    node_of = {on_a: "node-a", on_b: NODE, on_c: "node-c"}
    zone_of = {on_a: "zone-a", on_b: "zone-b", on_c: "zone-a"}
    kinds = {"close": "PreferClose", "zone": "PreferSameZone", "node": "PreferSameNode"}
    ips = {}
    for name, distribution in kinds.items():
        service(kube, namespace, name, trafficDistribution=distribution)
        ips[name] = service_ip(kube, namespace, name)
    for name in ("close", "zone"):
        hinted(kube, namespace, name, {pod: zone(z) for pod, z in zone_of.items()})
    hinted(
        kube,
        namespace,
        "node",
        {pod: {"forNodes": [{"name": node_of[pod]}], **zone(zone_of[pod])} for pod in node_of},
    )
    client_b = kube.add_pod(f"{namespace}-client-b", NODE, namespace=namespace)
    client_a = kube.add_pod(f"{namespace}-client-a", "node-a", namespace=namespace)
    for name, ip in ips.items():
        converges(kube, client_b.netns, [ip], {on_b})
        assert reached(kube, proxy.node.netns, ip) == {on_b}, name
        # node-a's kubeproxy: its zone's endpoints, or its node's own with PreferSameNode.
        converges(kube, client_a.netns, [ip], {on_a} if name == "node" else {on_a, on_c})

    # node-b's endpoint not ready: the others keep their hints, none names zone-b or
    # node-b, so node-b uses every ready endpoint.
    kube.set_pod_ready(on_b, False)
    hinted(kube, namespace, "close", {on_a: zone("zone-a"), on_b: None, on_c: zone("zone-a")})
    converges(kube, client_b.netns, ips.values(), {on_a, on_c})
    for ip in ips.values():
        assert reached(kube, proxy.node.netns, ip) == {on_a, on_c}
