"""Services through the real API server and controllers, to packets on every node.

The Services are made the way users make them (kubectl, or objects through the API);
their ClusterIPs come from the real allocator, their EndpointSlices from the real
controller; kubeproxy on each node programs them, and real connections go through.
"""

from __future__ import annotations

import json

from kubeproxy.lab.kube.cluster import OUTSIDE_IP, KubeLab, wait_for
from tests.realk8s.conftest import answers, service_ip


def web(kube: KubeLab, namespace: str, *where: str) -> list[str]:
    """Pods labelled app=web on the nodes ``where``; their names."""
    names = []
    for i, node in enumerate(where):
        name = f"{namespace}-web-{i}"
        kube.add_pod(name, node, namespace=namespace, labels={"app": "web"})
        names.append(name)
    return names


def test_a_kubectl_service_gets_its_clusterip_from_the_real_allocator_and_answers_everywhere(
    kube: KubeLab, namespace: str
) -> None:
    pods = web(kube, namespace, "node-a", "node-b")
    kube.kubectl("-n", namespace, "create", "service", "clusterip", "web", "--tcp=80:8080")
    ip = service_ip(kube, namespace, "web")
    # The allocator's record of it: an IPAddress object naming the Service.
    ipaddress = kube.api().get("IPAddress", ip)
    assert ipaddress["spec"]["parentRef"]["name"] == "web"
    for node in kube.nodes.values():
        assert answers(kube, node.netns, ip, 80).pod in pods  # from each node itself
    # From a Pod on a node with no endpoint of its own, both Pods answer in time.
    client = kube.add_pod(f"{namespace}-client", "node-c", namespace=namespace)
    seen = {answers(kube, client.netns, ip, 80).pod for _ in range(30)}
    assert seen == set(pods)


def test_node_port_from_outside_on_every_node(kube: KubeLab, namespace: str) -> None:
    pods = web(kube, namespace, "node-a")
    out = kube.kubectl(
        "-n", namespace, "create", "service", "nodeport", "web", "--tcp=80:8080", "-o", "json"
    )
    node_port = json.loads(out.stdout)["spec"]["ports"][0]["nodePort"]
    replies = [answers(kube, kube.outside_ns, n.ip, node_port) for n in kube.nodes.values()]
    assert len(replies) == 3 and {r.pod for r in replies} == {pods[0]}
    # externalTrafficPolicy Cluster: the outside client is masqueraded.
    assert OUTSIDE_IP not in {r.client_ip for r in replies}


def test_dual_stack_service_answers_on_both_families(kube: KubeLab, namespace: str) -> None:
    pods = web(kube, namespace, "node-b")
    kube.api().create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {
                "ipFamilyPolicy": "RequireDualStack",
                "selector": {"app": "web"},
                "ports": [{"port": 80, "targetPort": 8080}],
            },
        }
    )
    v4, v6 = service_ip(kube, namespace, "web", 4), service_ip(kube, namespace, "web", 6)
    wait_for(
        lambda: len(kube.api().list_of("EndpointSlice", namespace)) == 2,
        what="an EndpointSlice per family",
    )
    node_a = kube.nodes["node-a"].netns
    assert answers(kube, node_a, v4, 80).pod == pods[0]
    assert answers(kube, node_a, v6, 80).pod == pods[0]
