"""Service types end to end: the real API server and controllers, packets through node-b.

LoadBalancer (``status.loadBalancer.ingress`` written through the status subresource, as
a cloud controller would; ``ipMode``; ``loadBalancerSourceRanges``), externalIPs,
``externalTrafficPolicy: Local`` with its ``healthCheckNodePort`` (endpoints not ready,
added, terminating, deleted), ``internalTrafficPolicy: Local``, ClientIP session affinity
and the dual-stack policies test_services.py leaves out. Every test runs with kubeproxy and
with upstream kube-proxy on node-b (``proxy``, conftest.py): node-b is where the
assertions that matter are made; the other nodes run kubeproxy.
"""

from __future__ import annotations

import itertools
import json

from kubeproxy.lab.echo import Reply
from kubeproxy.lab.kube.api import Obj
from kubeproxy.lab.kube.cluster import OUTSIDE_IP, KubeLab, wait_for
from tests.realk8s.conftest import answers, service_ip
from tests.realk8s.services.conftest import (
    NODE,
    HealthCheck,
    NodeProxy,
    OutsideRoutes,
    attempt,
    health_check,
    service,
    settles_on,
)
from tests.realk8s.test_services import web

# Addresses a load balancer or a router would bring to the nodes (TEST-NET-1, and the
# IPv6 documentation prefix); one per use, so a Service of an earlier test still being
# deleted with its namespace never shares one.
_HOSTS = itertools.count(10)


def next_ip(family: int = 4) -> str:
    n = next(_HOSTS)
    return f"192.0.2.{n}" if family == 4 else f"2001:db8::{n:x}"


def set_ingress(kube: KubeLab, namespace: str, name: str, *ingress: Obj) -> None:
    """What a cloud controller does once its load balancer exists."""
    kube.api().patch_status(
        "Service", name, {"status": {"loadBalancer": {"ingress": list(ingress)}}}, namespace
    )


def endpoint_conditions(kube: KubeLab, namespace: str, pod: str) -> Obj | None:
    """The conditions of ``pod``'s IPv4 endpoint, as the real controller published them."""
    for s in kube.api().list_of("EndpointSlice", namespace):
        for ep in s.get("endpoints") or ():
            if s["addressType"] == "IPv4" and ep["targetRef"]["name"] == pod:
                conditions: Obj = ep["conditions"]
                return conditions
    return None


def ready_endpoints(kube: KubeLab, namespace: str, count: int) -> None:
    """Wait until the real controller has published ``count`` ready IPv4 endpoints."""

    def ready() -> int:
        slices = kube.api().list_of("EndpointSlice", namespace)
        return sum(
            1
            for s in slices
            if s["addressType"] == "IPv4"
            for ep in s.get("endpoints") or ()
            if ep["conditions"].get("ready")
        )

    wait_for(lambda: ready() == count, what=f"{count} ready endpoints in {namespace}")


def test_load_balancer_and_external_ips_answer_from_outside_and_inside(
    kube: KubeLab, namespace: str, proxy: NodeProxy, outside_routes: OutsideRoutes
) -> None:
    pods = web(kube, namespace, "node-a", "node-c")  # none on node-b: it forwards
    lb, proxied, external = next_ip(), next_ip(), next_ip()
    service(kube, namespace, type="LoadBalancer", externalIPs=[external])
    set_ingress(
        kube, namespace, "web", {"ip": lb, "ipMode": "VIP"}, {"ip": proxied, "ipMode": "Proxy"}
    )
    for ip in (lb, external):
        outside_routes.add(ip, NODE)
        reply = answers(kube, kube.outside_ns, ip, 80)
        assert reply.pod in pods
        assert reply.client_ip != OUTSIDE_IP  # externalTrafficPolicy Cluster: masqueraded
    # From a Pod and from the node itself, the same addresses reach the same Pods
    # without leaving the node.
    client = kube.add_pod(f"{namespace}-client", NODE, namespace=namespace)
    for netns in (client.netns, proxy.node.netns):
        for ip in (lb, external):
            assert answers(kube, netns, ip, 80).pod in pods
    # ipMode Proxy: the load balancer delivers to the nodes itself, so the proxy leaves
    # that address alone and traffic to it goes where the routes say (here: the outside
    # host, which refuses it).
    assert attempt(kube, client.netns, proxied, 80) == "refused"
    assert attempt(kube, proxy.node.netns, proxied, 80) == "refused"


def test_external_traffic_policy_local_keeps_the_client_address_and_health_checks_follow_endpoints(
    kube: KubeLab, namespace: str, proxy: NodeProxy, outside_routes: OutsideRoutes
) -> None:
    (on_a,) = web(kube, namespace, "node-a")
    svc = service(kube, namespace, type="LoadBalancer", externalTrafficPolicy="Local")
    port: int = svc["spec"]["healthCheckNodePort"]
    node_port: int = svc["spec"]["ports"][0]["nodePort"]
    via_a, via_b = next_ip(), next_ip()
    set_ingress(kube, namespace, "web", {"ip": via_a}, {"ip": via_b})
    outside_routes.add(via_a, "node-a")
    outside_routes.add(via_b, NODE)
    out, node_b = kube.outside_ns, proxy.node

    def health(want: dict[str, int]) -> dict[str, HealthCheck]:
        """Every node's answer, once each node answers with the status ``want`` says."""

        def all_as_wanted() -> dict[str, HealthCheck] | None:
            got = {node: health_check(kube, node, port) for node in want}
            return got if {n: h.status for n, h in got.items()} == want else None

        result: dict[str, HealthCheck] = wait_for(all_as_wanted, what=f"health checks {want}")
        return result

    checks = health({"node-a": 200, NODE: 503, "node-c": 503})
    for node, count in (("node-a", 1), (NODE, 0)):
        body = {
            "service": {"namespace": namespace, "name": "web"},
            "localEndpoints": count,
            "serviceProxyHealthy": True,
        }
        # Byte for byte: Go's json.MarshalIndent with a tab.
        assert checks[node].text == json.dumps(body, indent="\t")
        assert checks[node].headers["X-Load-Balancing-Endpoint-Weight"] == str(count)
        assert checks[node].headers["Content-Type"] == "application/json"

    # From outside: the client's address reaches the Pod; a node without a local
    # endpoint drops (the load balancer would not send there: its health check fails).
    assert answers(kube, out, via_a, 80) == Reply(on_a, OUTSIDE_IP)
    assert answers(kube, out, kube.nodes["node-a"].ip, node_port) == Reply(on_a, OUTSIDE_IP)
    assert settles_on(kube, out, via_b, 80, "timeout") == "timeout"
    assert attempt(kube, out, node_b.ip, node_port) == "timeout"
    # From inside node-b, the policy does not apply: a Pod's traffic (client address kept)
    # and the node's own go to the endpoints anywhere.
    client = kube.add_pod(f"{namespace}-client", NODE, namespace=namespace)
    assert answers(kube, client.netns, via_b, 80) == Reply(on_a, client.ips[0])
    assert answers(kube, client.netns, node_b.ip, node_port) == Reply(on_a, client.ips[0])
    assert answers(kube, node_b.netns, via_b, 80).pod == on_a
    assert answers(kube, node_b.netns, node_b.ip, node_port).pod == on_a

    # The health checks follow the endpoints: not ready, one added on node-b, ready
    # again, the one on node-b deleted.
    kube.set_pod_ready(on_a, False)
    assert health({"node-a": 503, NODE: 503})["node-a"].body["localEndpoints"] == 0
    # No endpoint anywhere: rejected (not dropped, as when some other node has one).
    assert settles_on(kube, out, via_b, 80, "refused") == "refused"
    on_b = f"{namespace}-web-b"
    kube.add_pod(on_b, NODE, namespace=namespace, labels={"app": "web"})
    assert health({"node-a": 503, NODE: 200})[NODE].body["localEndpoints"] == 1
    assert answers(kube, out, via_b, 80) == Reply(on_b, OUTSIDE_IP)
    kube.set_pod_ready(on_a, True)
    assert health({"node-a": 200, NODE: 200, "node-c": 503})["node-a"].status == 200
    # Deleted with a grace period (no kubelet ends it: the Pod stays terminating, its
    # endpoint serving): node-b's health check fails so the load balancer drains it, and
    # what still arrives goes to the terminating endpoint rather than nowhere.
    kube.api().request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/{on_b}",
        {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 300},
    )
    terminating = {"ready": False, "serving": True, "terminating": True}
    wait_for(
        lambda: endpoint_conditions(kube, namespace, on_b) == terminating,
        what=f"{on_b} terminating in its EndpointSlice",
    )
    assert health({"node-a": 200, NODE: 503})[NODE].body["localEndpoints"] == 0
    assert answers(kube, out, via_b, 80) == Reply(on_b, OUTSIDE_IP)
    kube.delete_pod(on_b)  # the grace period cut short: gone
    assert settles_on(kube, out, via_b, 80, "timeout") == "timeout"
    assert health({"node-a": 200, NODE: 503})[NODE].body["localEndpoints"] == 0


def test_load_balancer_source_ranges_decide_who_reaches_the_load_balancer_ip(
    kube: KubeLab, namespace: str, proxy: NodeProxy, outside_routes: OutsideRoutes
) -> None:
    (pod,) = web(kube, namespace, "node-a")
    lb = next_ip()
    service(kube, namespace, type="LoadBalancer", loadBalancerSourceRanges=[f"{OUTSIDE_IP}/32"])
    set_ingress(kube, namespace, "web", {"ip": lb})
    outside_routes.add(lb, NODE)
    client = kube.add_pod(f"{namespace}-client", NODE, namespace=namespace)
    out, node_b = kube.outside_ns, proxy.node.netns
    assert answers(kube, out, lb, 80).pod == pod
    # Sources outside the ranges are dropped, from a Pod or the node itself too.
    assert attempt(kube, client.netns, lb, 80) == "timeout"
    assert attempt(kube, node_b, lb, 80) == "timeout"
    kube.api().patch(
        "Service", "web", {"spec": {"loadBalancerSourceRanges": ["10.244.0.0/16"]}}, namespace
    )
    assert settles_on(kube, out, lb, 80, "timeout") == "timeout"
    assert answers(kube, client.netns, lb, 80).pod == pod
    assert attempt(kube, node_b, lb, 80) == "timeout"


def test_internal_traffic_policy_local_uses_only_this_nodes_endpoints(
    kube: KubeLab, namespace: str, proxy: NodeProxy
) -> None:
    on_a, on_b = web(kube, namespace, "node-a", NODE)
    service(kube, namespace, internalTrafficPolicy="Local")
    ip = service_ip(kube, namespace, "web")
    client_a = kube.add_pod(f"{namespace}-client-a", "node-a", namespace=namespace)
    client_b = kube.add_pod(f"{namespace}-client-b", NODE, namespace=namespace)
    ready_endpoints(kube, namespace, 2)
    for netns, local in ((client_b.netns, on_b), (proxy.node.netns, on_b), (client_a.netns, on_a)):
        answers(kube, netns, ip, 80)
        assert {attempt(kube, netns, ip, 80) for _ in range(10)} == {local}
    # node-b's endpoint not ready: node-b drops, though node-a's endpoint still serves.
    kube.set_pod_ready(on_b, False)
    ready_endpoints(kube, namespace, 1)
    assert settles_on(kube, client_b.netns, ip, 80, "timeout") == "timeout"
    assert attempt(kube, proxy.node.netns, ip, 80) == "timeout"
    assert attempt(kube, client_a.netns, ip, 80) == on_a


def test_client_ip_session_affinity_keeps_each_client_on_one_endpoint(
    kube: KubeLab, namespace: str, proxy: NodeProxy
) -> None:
    pods = web(kube, namespace, "node-a", NODE, "node-c")
    svc = service(kube, namespace, type="NodePort", sessionAffinity="ClientIP")
    node_port: int = svc["spec"]["ports"][0]["nodePort"]
    ip = service_ip(kube, namespace, "web")
    client = kube.add_pod(f"{namespace}-client", NODE, namespace=namespace)
    ready_endpoints(kube, namespace, 3)
    for netns, target, port in (
        (client.netns, ip, 80),
        (proxy.node.netns, ip, 80),
        (kube.outside_ns, proxy.node.ip, node_port),
    ):
        first = answers(kube, netns, target, port).pod
        assert first in pods
        assert {attempt(kube, netns, target, port) for _ in range(10)} == {first}


def test_prefer_dual_stack_and_single_stack_ipv6(
    kube: KubeLab, namespace: str, proxy: NodeProxy, outside_routes: OutsideRoutes
) -> None:
    (pod,) = web(kube, namespace, "node-a")
    prefer = service(
        kube, namespace, "prefer", type="LoadBalancer", ipFamilyPolicy="PreferDualStack"
    )
    # The cluster has both families, IPv4 first: PreferDualStack gets both.
    assert prefer["spec"]["ipFamilies"] == ["IPv4", "IPv6"]
    assert len(prefer["spec"]["clusterIPs"]) == 2
    v6 = service(kube, namespace, "v6", type="NodePort", ipFamilies=["IPv6"])
    assert v6["spec"]["ipFamilyPolicy"] == "SingleStack"
    (v6_ip,) = v6["spec"]["clusterIPs"]
    assert ":" in v6_ip
    node_port: int = v6["spec"]["ports"][0]["nodePort"]
    client = kube.add_pod(f"{namespace}-client", NODE, namespace=namespace)
    for netns in (client.netns, proxy.node.netns):
        for ip in (*prefer["spec"]["clusterIPs"], v6_ip):
            assert answers(kube, netns, ip, 80).pod == pod
    # A load balancer of each family in front of node-b.
    balancers = (next_ip(4), next_ip(6))
    set_ingress(kube, namespace, "prefer", *({"ip": ip} for ip in balancers))
    for ip in balancers:
        outside_routes.add(ip, NODE)
        assert answers(kube, kube.outside_ns, ip, 80).pod == pod
    assert answers(kube, kube.outside_ns, proxy.node.ip6, node_port).pod == pod
    # No IPv4 NodePort for an IPv6-only Service: nothing listens on node-b's port.
    assert attempt(kube, kube.outside_ns, proxy.node.ip, node_port) == "refused"
