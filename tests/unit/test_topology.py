"""kubeproxy.model.topology.categorize_endpoints: one table, one row per rule or safeguard.

Rows follow the module docstring, the Kubernetes docs (traffic policies, terminating
endpoints, topology-aware routing safeguards, trafficDistribution) and the cases of
upstream's pkg/proxy/topology_test.go (TestCategorizeEndpoints).

Conventions: this node is "node-a" in "zone-a"; ``local=True`` puts an endpoint on this
node, otherwise it is on "node-b". Expected sets are given as IP suffixes ("10.0.0.<n>").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kubeproxy.model.topology import (
    EndpointSelection,
    FeatureFlags,
    NodeTopology,
    TopologyMode,
    categorize_endpoints,
    topology_mode_from_hints,
)
from kubeproxy.model.types import Endpoint, ServicePort, TrafficPolicy
from tests.unit.conftest import endpoint, service_port

LOCAL, CLUSTER = TrafficPolicy.LOCAL, TrafficPolicy.CLUSTER
NODE = NodeTopology("node-a", "zone-a")
NO_ZONE = NodeTopology("node-a", None)
NODE_FLAGS_OFF = FeatureFlags(prefer_same_traffic_distribution=False)
ZONE, NODEMODE, NONE = (
    TopologyMode.PREFER_SAME_ZONE,
    TopologyMode.PREFER_SAME_NODE,
    TopologyMode.NONE,
)


def ep(
    n: int,
    *,
    ready: bool = True,
    serving: bool | None = None,
    terminating: bool = False,
    local: bool = False,
    zones: tuple[str, ...] = (),
    nodes: tuple[str, ...] = (),
) -> Endpoint:
    return endpoint(
        f"10.0.0.{n}",
        port=80,
        ready=ready,
        serving=serving,
        terminating=terminating,
        node="node-a" if local else "node-b",
        zone_hints=zones,
        node_hints=nodes,
    )


def term(
    n: int,
    *,
    local: bool = False,
    serving: bool = True,
    zones: tuple[str, ...] = (),
) -> Endpoint:
    """A terminating endpoint (never ready); serving unless said otherwise."""
    return ep(n, ready=False, serving=serving, terminating=True, local=local, zones=zones)


def svc(
    *,
    itp: TrafficPolicy = CLUSTER,
    etp: TrafficPolicy = CLUSTER,
    node_port: int = 0,
    external_ips: tuple[str, ...] = (),
    lb_ips: tuple[str, ...] = (),
) -> ServicePort:
    return service_port(
        itp=itp,
        etp=etp,
        node_port=node_port,
        external_ips=external_ips,
        load_balancer_ips=lb_ips,
    )


CLUSTER_IP = svc()
NODE_PORT = svc(node_port=30080)
ETP_LOCAL = svc(etp=LOCAL, node_port=30080)
ITP_LOCAL = svc(itp=LOCAL)


@dataclass
class Case:
    id: str
    endpoints: list[Endpoint]
    svc: ServicePort = CLUSTER_IP
    node: NodeTopology = NODE
    flags: FeatureFlags = field(default_factory=FeatureFlags)
    # None: the ServicePort never uses that set (it must then be empty).
    cluster: set[int] | None = None
    local: set[int] | None = None
    has_any: bool = True
    mode: TopologyMode = NONE


CASES = [
    # ------------------------------------------------------------------ basics
    Case("no-endpoints", [], cluster=set(), has_any=False),
    Case("no-endpoints-itp-local", [], ITP_LOCAL, local=set(), has_any=False),
    Case("cluster-all-ready", [ep(1), ep(2)], cluster={1, 2}),
    Case("cluster-some-ready", [ep(1, ready=False), ep(2)], cluster={2}),
    # ------------------------------------------------- terminating fallback, cluster
    Case(
        "cluster-none-ready-falls-back-to-serving-terminating",
        [term(1, local=True), term(2), ep(3, ready=False)],
        cluster={1, 2},
    ),
    Case(
        "cluster-none-ready-none-serving",
        [term(1, serving=False), ep(2, ready=False)],
        cluster=set(),
        has_any=False,
    ),
    Case(
        "cluster-ready-wins-over-terminating",
        [ep(1), term(2), term(3, local=True)],
        cluster={1},
    ),
    # terminating but still ready (rare but allowed): it is ready, so usable
    Case("cluster-ready-and-terminating", [ep(1, terminating=True)], cluster={1}),
    # ----------------------------------------------------- internalTrafficPolicy Local
    Case("itp-local-some-local", [ep(1, local=True), ep(2)], ITP_LOCAL, local={1}),
    Case("itp-local-all-local", [ep(1, local=True), ep(2, local=True)], ITP_LOCAL, local={1, 2}),
    # no local endpoint: traffic is dropped, but the service does have endpoints elsewhere
    Case("itp-local-all-remote", [ep(1), ep(2)], ITP_LOCAL, local=set(), has_any=True),
    Case(
        "itp-local-ready-wins-over-local-terminating",
        [ep(1, local=True), term(2, local=True)],
        ITP_LOCAL,
        local={1},
    ),
    # the fallback is decided for the local set on its own: remote ready endpoints do not
    # stop this node from draining to its own terminating ones
    Case(
        "itp-local-local-terminating-remote-ready",
        [term(1, local=True), ep(2)],
        ITP_LOCAL,
        local={1},
    ),
    Case(
        "itp-local-only-remote-terminating",
        [term(1), term(2)],
        ITP_LOCAL,
        local=set(),
        has_any=True,
    ),
    Case(
        "itp-local-nothing-usable",
        [ep(1, ready=False, local=True), term(2, serving=False, local=True)],
        ITP_LOCAL,
        local=set(),
        has_any=False,
    ),
    # ------------------------------------------------------ externalTrafficPolicy Local
    Case("etp-cluster-node-port", [ep(1, local=True), ep(2)], NODE_PORT, cluster={1, 2}),
    Case("etp-local-node-port", [ep(1, local=True), ep(2)], ETP_LOCAL, cluster={1, 2}, local={1}),
    Case(
        "etp-local-load-balancer-ip",
        [ep(1, local=True), ep(2)],
        svc(etp=LOCAL, lb_ips=("192.0.2.1",)),
        cluster={1, 2},
        local={1},
    ),
    Case(
        "etp-local-external-ip",
        [ep(1, local=True), ep(2)],
        svc(etp=LOCAL, external_ips=("192.0.2.2",)),
        cluster={1, 2},
        local={1},
    ),
    # eTP Local means nothing for a Service nobody outside the cluster can reach
    Case(
        "etp-local-plain-cluster-ip-ignored",
        [ep(1, local=True), ep(2)],
        svc(etp=LOCAL),
        cluster={1, 2},
    ),
    Case(
        "etp-local-all-remote",
        [ep(1), ep(2)],
        ETP_LOCAL,
        cluster={1, 2},
        local=set(),
    ),
    # upstream "iTP: Cluster, eTP: Local, with terminating endpoints"
    Case(
        "etp-local-local-terminating-drains",
        [ep(0), ep(1, ready=False, local=True), term(2, local=True), term(3)],
        ETP_LOCAL,
        cluster={0},
        local={2},
    ),
    # externally reachable + iTP Local: the cluster set is still needed (short-circuit of
    # pod/node traffic to external addresses)
    Case(
        "itp-local-etp-local-external",
        [ep(1, local=True), ep(2)],
        svc(itp=LOCAL, etp=LOCAL, node_port=30080),
        cluster={1, 2},
        local={1},
    ),
    Case(
        "itp-local-etp-cluster-external",
        [ep(1, local=True), ep(2)],
        svc(itp=LOCAL, node_port=30080),
        cluster={1, 2},
        local={1},
    ),
    Case(
        "itp-local-etp-local-all-remote-terminating",
        [term(1), term(2)],
        svc(itp=LOCAL, etp=LOCAL, node_port=30080),
        cluster={1, 2},
        local=set(),
    ),
    # ------------------------------------------------------------------- zone hints
    Case(
        "zone-hints-filter",
        [
            ep(1, zones=("zone-a",)),
            ep(2, zones=("zone-b",)),
            ep(3, zones=("zone-c",)),
            ep(4, zones=("zone-a",)),
        ],
        cluster={1, 4},
        mode=ZONE,
    ),
    Case(
        "zone-hints-multiple-per-endpoint",
        [
            ep(1, zones=("zone-a", "zone-b")),
            ep(2, zones=("zone-b", "zone-c")),
            ep(3, zones=("zone-c", "zone-a")),
        ],
        cluster={1, 3},
        mode=ZONE,
    ),
    # safeguard: one ready endpoint without a hint = transition under way
    Case(
        "zone-hints-one-missing",
        [ep(1, zones=("zone-a",)), ep(2, zones=("zone-b",)), ep(3)],
        cluster={1, 2, 3},
    ),
    # safeguard: no hint for this zone (e.g. a new zone) = filtering would black-hole
    Case(
        "zone-hints-none-for-this-zone",
        [ep(1, zones=("zone-b",)), ep(2, zones=("zone-c",))],
        cluster={1, 2},
    ),
    # safeguard: this node has no zone label
    Case(
        "zone-hints-node-without-zone",
        [ep(1, zones=("zone-a",)), ep(2, zones=("zone-b",))],
        node=NO_ZONE,
        cluster={1, 2},
    ),
    # only ready endpoints are looked at: an unready, unhinted endpoint does not disable
    # topology, and an unready endpoint hinted for us is not used
    Case(
        "zone-hints-unready-without-hint-ignored",
        [ep(1, zones=("zone-a",)), ep(2, zones=("zone-b",)), ep(3, ready=False), term(4)],
        cluster={1},
        mode=ZONE,
    ),
    # upstream "only unready endpoints in same zone (should not filter)"
    Case(
        "zone-hints-only-unready-in-this-zone",
        [
            ep(1, ready=False, zones=("zone-a",)),
            ep(2, zones=("zone-b",)),
            ep(3, zones=("zone-c",)),
            ep(4, ready=False, zones=("zone-a",)),
        ],
        cluster={2, 3},
    ),
    # nothing ready: hints are irrelevant, fall back to serving-terminating everywhere
    Case(
        "zone-hints-nothing-ready",
        [term(1, zones=("zone-b",)), term(2, zones=("zone-a",))],
        cluster={1, 2},
    ),
    # ------------------------------------------------------------------- node hints
    Case(
        "node-hints-first",
        [
            ep(1, nodes=("node-a",), zones=("zone-a",)),
            ep(2, nodes=("node-b",), zones=("zone-a",)),
            ep(3, nodes=("node-c",), zones=("zone-b",)),
        ],
        cluster={1},
        mode=NODEMODE,
    ),
    Case(
        "node-hints-none-for-this-node-then-zone",
        [
            ep(1, nodes=("node-c",), zones=("zone-a",)),
            ep(2, nodes=("node-b",), zones=("zone-a",)),
            ep(3, nodes=("node-d",), zones=("zone-b",)),
        ],
        cluster={1, 2},
        mode=ZONE,
    ),
    Case(
        "node-hints-one-missing-then-zone",
        [
            ep(1, nodes=("node-a",), zones=("zone-a",)),
            ep(2, zones=("zone-a",)),
            ep(3, nodes=("node-d",), zones=("zone-b",)),
        ],
        cluster={1, 2},
        mode=ZONE,
    ),
    Case(
        "node-hints-none-for-node-no-zone-match-then-all",
        [ep(1, nodes=("node-c",), zones=("zone-b",)), ep(2, nodes=("node-d",), zones=("zone-c",))],
        cluster={1, 2},
    ),
    Case(
        "node-hints-without-zone-hints",
        [ep(1, nodes=("node-a",)), ep(2, nodes=("node-b",))],
        cluster={1},
        mode=NODEMODE,
    ),
    # node hints work even where the node has no zone label
    Case(
        "node-hints-node-without-zone",
        [ep(1, nodes=("node-a",)), ep(2, nodes=("node-b",))],
        node=NO_ZONE,
        cluster={1},
        mode=NODEMODE,
    ),
    # PreferSameTrafficDistribution off: node hints are ignored, zone hints still apply
    Case(
        "node-hints-flag-off-uses-zone",
        [
            ep(1, nodes=("node-a",), zones=("zone-a",)),
            ep(2, nodes=("node-b",), zones=("zone-a",)),
            ep(3, nodes=("node-c",), zones=("zone-b",)),
        ],
        flags=NODE_FLAGS_OFF,
        cluster={1, 2},
        mode=ZONE,
    ),
    Case(
        "node-hints-flag-off-no-zone-hints",
        [ep(1, nodes=("node-a",)), ep(2, nodes=("node-b",))],
        flags=NODE_FLAGS_OFF,
        cluster={1, 2},
    ),
    # --------------------------------------------------- topology vs Local policies
    # upstream "externalTrafficPolicy: Local, topology ignored for Local endpoints"
    Case(
        "etp-local-topology-not-applied-to-local-set",
        [
            ep(1, local=True, zones=("zone-a",)),
            ep(2, local=True, zones=("zone-b",)),
            ep(3, zones=("zone-c",)),
            ep(4, zones=("zone-a",)),
        ],
        ETP_LOCAL,
        cluster={1, 4},
        local={1, 2},
        mode=ZONE,
    ),
    Case(
        "itp-local-topology-not-applied-to-local-set",
        [
            ep(1, local=True, nodes=("node-x",)),
            ep(2, local=True, nodes=("node-a",)),
            ep(3, nodes=("node-a",)),
        ],
        ITP_LOCAL,
        local={1, 2},
        # the cluster set is never used, so no topology decision is made
        mode=NONE,
    ),
]


def _ips(eps: tuple[Endpoint, ...]) -> set[int]:
    return {int(e.ip.rsplit(".", 1)[1]) for e in eps}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_categorize_endpoints(case: Case) -> None:
    sel = categorize_endpoints(case.endpoints, case.svc, case.node, case.flags)
    assert _ips(sel.cluster) == (case.cluster or set()), "cluster set"
    assert _ips(sel.local) == (case.local or set()), "local set"
    assert sel.has_any is case.has_any
    assert sel.topology_mode is case.mode
    # The sets are used exactly when the ServicePort's policies say so.
    if case.cluster is None:
        assert not case.svc.uses_cluster_endpoints
    if case.local is None:
        assert not case.svc.uses_local_endpoints
    # whatever was chosen is reachable, and nothing else
    assert set(sel.all_reachable) == set(sel.cluster) | set(sel.local)


def test_case_ids_are_unique() -> None:
    assert len({c.id for c in CASES}) == len(CASES)


def test_endpoints_may_be_any_iterable() -> None:
    sel = categorize_endpoints(iter([ep(1), ep(2)]), CLUSTER_IP, NODE)
    assert _ips(sel.cluster) == {1, 2}


def test_input_order_is_kept() -> None:
    # Backends index endpoints; a stable order avoids needless rule churn.
    eps = [ep(3), ep(1), ep(2)]
    assert list(categorize_endpoints(eps, CLUSTER_IP, NODE).cluster) == eps


# ======================================================== EndpointSelection accessors


@pytest.mark.parametrize(
    ("port", "internal_is_local", "external_is_local"),
    [
        (CLUSTER_IP, False, False),
        (ITP_LOCAL, True, False),
        (ETP_LOCAL, False, True),
        (svc(itp=LOCAL, etp=LOCAL, node_port=30080), True, True),
        # eTP Local without any external address: external() is the cluster set
        (svc(etp=LOCAL), False, False),
    ],
    ids=["cluster", "itp-local", "etp-local", "both-local", "etp-local-not-external"],
)
def test_internal_and_external_pick_the_policy_set(
    port: ServicePort, internal_is_local: bool, external_is_local: bool
) -> None:
    sel = EndpointSelection(cluster=(ep(1), ep(2)), local=(ep(1, local=True),), has_any=True)
    assert sel.internal(port) == (sel.local if internal_is_local else sel.cluster)
    assert sel.external(port) == (sel.local if external_is_local else sel.cluster)


def test_all_reachable_merges_topology_and_locality() -> None:
    # upstream "conflicting topology and localness require merging allEndpoints": the
    # cluster set holds a remote same-zone endpoint, the local set a local other-zone one.
    eps = [
        ep(0, local=True, zones=("zone-a",)),
        ep(1, local=True, zones=("zone-b",)),
        ep(2, zones=("zone-a",)),
        ep(3, zones=("zone-b",)),
    ]
    sel = categorize_endpoints(eps, ETP_LOCAL, NODE)
    assert _ips(sel.cluster) == {0, 2}
    assert _ips(sel.local) == {0, 1}
    assert _ips(sel.all_reachable) == {0, 1, 2}
    assert len(sel.all_reachable) == 3  # no duplicates


def test_all_reachable_includes_local_terminating() -> None:
    sel = categorize_endpoints([ep(0), term(1, local=True)], ETP_LOCAL, NODE)
    assert _ips(sel.all_reachable) == {0, 1}


def test_all_reachable_of_empty_selection() -> None:
    assert EndpointSelection((), (), False).all_reachable == ()


# ============================================================= topology_mode_from_hints


@pytest.mark.parametrize(
    ("endpoints", "node", "flags", "expected"),
    [
        ((), NODE, FeatureFlags(), NONE),
        ((ep(1, ready=False, zones=("zone-a",)),), NODE, FeatureFlags(), NONE),
        ((ep(1, zones=("zone-a",)),), NODE, FeatureFlags(), ZONE),
        ((ep(1, zones=("zone-a",)),), NodeTopology("node-a", ""), FeatureFlags(), NONE),
        ((ep(1, nodes=("node-a",)),), NODE, FeatureFlags(), NODEMODE),
        ((ep(1, nodes=("node-a",)),), NODE, NODE_FLAGS_OFF, NONE),
        ((ep(1, nodes=("node-a",)),), NodeTopology("node-z", "zone-a"), FeatureFlags(), NONE),
    ],
    ids=[
        "no-endpoints",
        "nothing-ready",
        "zone",
        "empty-zone-label",
        "node",
        "node-flag-off",
        "other-node",
    ],
)
def test_topology_mode_from_hints(
    endpoints: tuple[Endpoint, ...], node: NodeTopology, flags: FeatureFlags, expected: TopologyMode
) -> None:
    assert topology_mode_from_hints(endpoints, node, flags) is expected


def test_feature_flag_default_matches_upstream() -> None:
    # PreferSameTrafficDistribution is on by default upstream.
    assert FeatureFlags().prefer_same_traffic_distribution is True
