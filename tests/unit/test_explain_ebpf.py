"""``explain`` in ebpf mode: what the socket hooks take, what they leave to nftables.

One row per decision (:func:`kubeproxy.backends.ebpf.inspect.through_hooks` on top of the
nftables walk), the hooks' map entries it names, and ``--live``'s comparison with a
pinned map (pure). The kernel's agreement: tests/kernel/test_ebpf.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kubeproxy.backends.ebpf.inspect import socket_drift, socket_objects, through_hooks
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.bpf.socklb import Backends, Target
from kubeproxy.explain.command import explain_packet
from kubeproxy.explain.packet import explain
from kubeproxy.model.fate import Explanation, NodeAddresses, Origin, Outcome, Packet
from kubeproxy.model.plan import plan_service_port
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import Endpoint, IPFamily, L4Protocol, ServicePort, TrafficPolicy
from tests.unit.conftest import service_port
from tests.unit.test_explain import CLIENT, L1, NODE_IP, POD, R1, Case, family, svc, tcp

LOCAL = TrafficPolicy.LOCAL
NODE = NodeAddresses(frozenset({NODE_IP}))
EXT = "203.0.113.10"


def run(s: ServicePort, eps: tuple[Endpoint, ...], packet: Packet, **kw: Any) -> Explanation:
    fam = family()
    plan = plan_service_port(s, eps, fam)
    assert plan is not None
    nft = explain(packet, fam, [plan], {s.name: eps}, node=NODE, **kw)
    return through_hooks(nft, fam, {s.name: eps})


BOTH = {"10.244.1.10:8080", "10.244.2.10:8080"}
CASES = [
    Case("clusterip-from-a-pod", svc(), (L1, R1), tcp(POD, "10.96.0.10"), Outcome.SOCKET_LB,
         BOTH, False, "the socket hook gives the connection one of 2 endpoint(s)"),
    Case("clusterip-from-the-node", svc(), (L1, R1), tcp(NODE_IP, "10.96.0.10"),
         Outcome.SOCKET_LB, BOTH, False, "not masqueraded: the packets carry the client's own"),
    Case("clusterip-from-outside", svc(), (L1, R1), tcp(CLIENT, "10.96.0.10"), Outcome.DNAT,
         BOTH, True, "from outside this node, so not a socket of the hooked cgroup"),
    Case("internal-local", svc(itp=LOCAL), (L1, R1), tcp(POD, "10.96.0.10"),
         Outcome.SOCKET_LB, {"10.244.1.10:8080"}, False, "internalTrafficPolicy Local"),
    Case("no-endpoints", svc(), (), tcp(POD, "10.96.0.10"), Outcome.REJECT, set(),
         False, "no endpoint for this route, so no socket-hook entry"),
    Case("nodeport", svc(node_port=30080), (L1,), tcp(NODE_IP, NODE_IP, 30080), Outcome.DNAT,
         {"10.244.1.10:8080"}, True, "NodePorts are not socket-hook frontends"),
    Case("external-ip", svc(external_ips=(EXT,)), (L1, R1), tcp(POD, EXT), Outcome.SOCKET_LB,
         BOTH, False, "externalTrafficPolicy Cluster"),
    # nftables mode DROPs the node's own connection here (no local endpoint); the hooks
    # give it the cluster-wide endpoints, as nftables mode's short-circuit does for Pods.
    Case("external-local-from-the-node", svc(external_ips=(EXT,), etp=LOCAL), (R1,),
         tcp(NODE_IP, EXT), Outcome.SOCKET_LB, {"10.244.2.10:8080"},
         False, "externalTrafficPolicy Local, but a socket on this node"),
    Case("lb-source-ranges", svc(load_balancer_ips=("198.51.100.20",),
                                 load_balancer_source_ranges=("10.244.0.0/16",)),
         (L1,), tcp(POD, "198.51.100.20"), Outcome.DNAT, {"10.244.1.10:8080"},
         True, "the source address is not known yet at connect()"),
    Case("sctp", service_port(protocol=L4Protocol.SCTP), (L1,),
         tcp(POD, "10.96.0.10", protocol=L4Protocol.SCTP), Outcome.DNAT, {"10.244.1.10:8080"},
         False, "SCTP sockets are not rewritten"),
    Case("no-service", svc(), (L1,), tcp(POD, "10.96.0.99"), Outcome.NONE, set(),
         False, "no Service frontend"),
    Case("pod-origin-given", svc(), (L1,), tcp(CLIENT, "10.96.0.10"), Outcome.SOCKET_LB,
         {"10.244.1.10:8080"}, False, "a Pod on another node is served by its own node",
         origin=Origin.POD),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decision(case: Case) -> None:
    result = run(case.svc, case.eps, case.packet, origin=case.origin)
    assert result.mode == "ebpf"
    assert result.verdict is case.verdict, result.reasons
    assert set(result.endpoints) == case.endpoints
    assert result.masquerade is case.masquerade, result.reasons
    assert any(case.reason in r for r in result.reasons), result.reasons
    if case.verdict is Outcome.SOCKET_LB:
        assert sum(c.probability for c in result.candidates) == pytest.approx(1)


def test_the_hooks_entries_are_named_slot_by_slot() -> None:
    s = replace(svc(), affinity_timeout=600)
    result = run(s, (L1, R1), tcp(POD, "10.96.0.10"))
    assert [str(o) for o in socket_objects(result)] == [
        "bpf: kp_svc4 element { 10.96.0.10:80/TCP slot 0 : 2 endpoint(s), affinity 600s }",
        "bpf: kp_svc4 element { 10.96.0.10:80/TCP slot 1 : 10.244.1.10:8080 }",
        "bpf: kp_svc4 element { 10.96.0.10:80/TCP slot 2 : 10.244.2.10:8080 }",
    ]
    assert any("client is the socket's network namespace" in r for r in result.reasons)


T1, T2 = Target("10.244.1.10", 8080), Target("10.244.2.10", 8080)


def test_live_drift_compares_the_pinned_entry_with_the_plan() -> None:
    result = run(svc(), (L1, R1), tcp(POD, "10.96.0.10"))
    assert socket_drift(result, Backends((T2, T1)), []) == []
    assert socket_drift(result, Backends((T1, Target("10.244.9.9", 8080)), 30), []) == [
        "missing endpoint 10.244.2.10:8080 in kp_svc4 (10.96.0.10:80/TCP)",
        "extra endpoint 10.244.9.9:8080 in kp_svc4 (10.96.0.10:80/TCP)",
        "kp_svc4 (10.96.0.10:80/TCP): affinity 30s, the plan says 0s",
    ]
    assert socket_drift(result, Backends(()), ["connect4"]) == [
        "hook connect4 has no pinned link (not attached)",
        "kp_svc4 has no entry for 10.96.0.10:80/TCP: the hooks leave it to nftables",
    ]


def test_live_drift_finds_an_entry_the_plan_leaves_to_nftables() -> None:
    result = run(svc(), (), tcp(POD, "10.96.0.10"))
    assert socket_drift(result, Backends(()), []) == []
    assert socket_drift(result, Backends((T1,)), []) == [
        "kp_svc4 holds 10.96.0.10:80/TCP -> 10.244.1.10:8080, but the plan leaves it to "
        "nftables: the hooks would rewrite it"
    ]


def test_the_command_explains_ebpf_mode_with_the_hooks_objects() -> None:
    s = svc()
    config = ProxyConfig(hostname="node-a", mode=ProxyMode.EBPF, cluster_cidrs=("10.244.0.0/16",))
    snapshot = Snapshot(
        {s.name: s}, {s.name: (L1,)}, NodeState("node-a", "zone-a", {IPFamily.IPv4: NODE_IP})
    )
    hooked = explain_packet(config, snapshot, tcp(POD, "10.96.0.10"))
    assert hooked.result.verdict is Outcome.SOCKET_LB
    assert [o.table for o in hooked.objects] == ["bpf", "bpf"]
    outside = explain_packet(config, snapshot, tcp(CLIENT, "10.96.0.10"))
    assert outside.result.verdict is Outcome.DNAT
    assert outside.objects and all(o.table == "ip kube-proxy" for o in outside.objects)
