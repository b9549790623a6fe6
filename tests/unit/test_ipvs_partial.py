"""ipvs mode's partial syncs on the strict fakes: only the changed ServicePorts are
planned, rendered and diffed, and the kernel ends up exactly where a full sync from
scratch would put it, shared addresses and set members included."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from kubeproxy.backends.ipvs import names as n
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import Endpoint, ServicePort, ServicePortName, TrafficPolicy
from tests.unit.conftest import port_name
from tests.unit.test_ipvs_backend import DB, VIP, WEB, World, eps, snap, web


def kernel(w: World) -> tuple[Any, ...]:
    """Everything the backend programs, comparable between two worlds."""
    return (
        w.ipvs.table,
        {k: {e: d.weight for e, d in v.items()} for k, v in w.ipvs.dests.items()},
        w.links.addresses(n.DUMMY_DEVICE),
        {name: set(s.members) for name, s in w.ipset.state.items()},
        w.iptables.save("nat") + w.iptables.save("filter"),
    )


def from_scratch(tmp: Path, snapshot: Snapshot) -> tuple[Any, ...]:
    fresh = World(tmp)
    fresh.backend.start()
    fresh.backend.sync(snapshot, None)
    assert not fresh.backend.errors
    return kernel(fresh)


def test_a_partial_sync_renders_only_the_changed_service_port(tmp_path: Path) -> None:
    w = World(tmp_path / "a")
    w.backend.start()
    ports = [
        (web(name=port_name(f"s{i}"), cluster_ips=(f"10.96.1.{i}",)), eps("10.244.1.1"))
        for i in range(1, 41)
    ]
    assert w.backend.sync(snap(*ports), None).rendered == 40
    ports[7] = (ports[7][0], eps("10.244.1.2"))
    result = w.backend.sync(snap(*ports), {ports[7][0].name})
    assert result.rendered == 1 and not result.full
    assert result.elements == 80  # the whole state's size, kept as it changes
    assert kernel(w) == from_scratch(tmp_path / "b", snap(*ports))


def test_shared_addresses_and_set_members_stay_while_one_user_is_left(tmp_path: Path) -> None:
    """Two Services share an external IP (kube-ipvs0, KUBE-IPVS-IPS) and a local
    endpoint (KUBE-LOOP-BACK): removing one leaves both in place."""
    w = World(tmp_path / "a")
    w.backend.start()
    local = eps("10.244.1.5", node="node-a")
    a = web(external_ips=("203.0.113.9",))
    b = ServicePort(name=DB, cluster_ips=("10.96.0.11",), port=81, external_ips=("203.0.113.9",))
    w.backend.sync(snap((a, local), (b, local)), None)
    loop_back = "10.244.1.5,tcp:8080,10.244.1.5"
    w.backend.sync(snap((a, local)), {DB})
    assert "203.0.113.9" in w.links.addresses(n.DUMMY_DEVICE)
    assert loop_back in w.ipset.state["KUBE-LOOP-BACK"].members
    assert "203.0.113.9" in w.ipset.state["KUBE-IPVS-IPS"].members
    assert kernel(w) == from_scratch(tmp_path / "b", snap((a, local)))
    w.backend.sync(snap(), {WEB})
    assert w.links.addresses(n.DUMMY_DEVICE) == set()
    assert not w.ipset.state["KUBE-LOOP-BACK"].members
    assert kernel(w) == from_scratch(tmp_path / "c", snap())


def test_a_changed_service_port_claiming_anothers_address_renders_everything(
    tmp_path: Path,
) -> None:
    """Which of two claims wins (the first by name) is decided over the whole state."""
    w = World(tmp_path)
    w.backend.start()
    w.backend.sync(snap((web(), eps("10.244.1.1"))), None)
    rival = ServicePort(name=DB, cluster_ips=("10.96.0.10",), port=80)
    state = snap((web(), eps("10.244.1.1")), (rival, eps("10.244.3.3")))
    result = w.backend.sync(state, {DB})
    assert result.rendered == 2 and len(result.conflicts) == 1
    assert set(w.ipvs.dests[VIP]) == {("10.244.3.3", 8080)}  # default/db sorts first
    # The loser changes alone: still decided over everything.
    state = snap((web(), eps("10.244.1.2")), (rival, eps("10.244.3.3")))
    assert w.backend.sync(state, {WEB}).rendered == 2


def _random_port(rng: random.Random, i: int) -> tuple[ServicePort, tuple[Endpoint, ...]]:
    local = rng.random() < 0.3
    policy = TrafficPolicy.LOCAL if local else TrafficPolicy.CLUSTER
    svc = ServicePort(
        name=port_name(f"s{i}"),
        cluster_ips=(f"10.96.0.{i}",),
        # Own ports (external and LB addresses are shared), now and then a conflict.
        port=80 if rng.random() < 0.25 else 8000 + i,
        node_port=30000 + i if rng.random() < 0.5 else 0,
        external_ips=tuple(rng.sample(("203.0.113.1", "203.0.113.2"), rng.randint(0, 2))),
        load_balancer_ips=("198.51.100.7",) if rng.random() < 0.3 else (),
        load_balancer_source_ranges=("192.0.2.0/24",) if rng.random() < 0.3 else (),
        external_traffic_policy=policy,
        affinity_timeout=60 if rng.random() < 0.2 else None,
    )
    nodes = ("node-a", "node-b")
    endpoints = tuple(
        Endpoint(f"10.244.{rng.randint(1, 2)}.{rng.randint(1, 6)}", 8080, rng.choice(nodes))
        for _ in range(rng.randint(0, 3))
    )
    return svc, endpoints


def test_random_partial_syncs_end_where_a_full_sync_would(tmp_path: Path) -> None:
    rng = random.Random(14)
    w = World(tmp_path / "w")
    w.backend.start()
    ports: dict[ServicePortName, tuple[ServicePort, tuple[Endpoint, ...]]] = {}
    for i in range(1, 13):
        svc, endpoints = _random_port(rng, i)
        ports[svc.name] = (svc, endpoints)
    w.backend.sync(snap(*ports.values()), None)
    incremental = 0
    for step in range(40):
        changed = set()
        for _ in range(rng.randint(1, 3)):
            i = rng.randint(1, 14)
            name = port_name(f"s{i}")
            if name in ports and rng.random() < 0.2:
                del ports[name]
            else:
                svc, endpoints = _random_port(rng, i)
                ports[name] = (svc, endpoints)
            changed.add(name)
        state = snap(*ports.values())
        incremental += w.backend.sync(state, changed).rendered == len(changed)
        assert kernel(w) == from_scratch(tmp_path / f"s{step}", state), step
    # Most steps replaced only their contributions; conflicts re-rendered everything.
    assert 20 < incremental < 40
