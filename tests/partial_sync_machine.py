"""A Hypothesis state machine for partial syncs, run on the fake and on the kernel.

Random changes to Services and endpoints — one ServicePort or several at once, with
shared external IPs and load-balancer IPs so destinations get contested, session
affinity, both traffic policies, dual stack — are synced partially by one backend,
while a fresh backend does a full sync of the same snapshot. After every step both must
hold exactly the same state, and no partial sync may need the full-sync fallback.

:class:`PartialVersusFull` leaves three things to its subclasses: where the backends
write (``runner``), how a runner's state is read for comparison (``state``), and the
size of the world (``SERVICES``): the fake (tests/unit) runs many Services and steps,
the kernel (tests/kernel) fewer, and also checks that the fake agrees with it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config import ProxyConfig
from kubeproxy.dataplane.nftables.runner import NftRunner
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import (
    Endpoint,
    IPFamily,
    L4Protocol,
    NamespacedName,
    ServicePort,
    ServicePortName,
    TrafficPolicy,
)

CONFIG = ProxyConfig(
    hostname="node-a",
    families=(IPFamily.IPv4, IPFamily.IPv6),
    cluster_cidrs=("10.244.0.0/16", "fd00:10:244::/56"),
    service_cidrs=("10.96.0.0/16",),
)
NODE = NodeState("node-a", "zone-a", {IPFamily.IPv4: "192.168.50.1", IPFamily.IPv6: "fd00:50::1"})
PROTOCOLS = st.sampled_from([L4Protocol.TCP, L4Protocol.UDP])


def port_name(i: int, proto: L4Protocol = L4Protocol.TCP) -> ServicePortName:
    return ServicePortName(NamespacedName("default", f"s{i}"), "p", proto)


services = st.builds(
    lambda vip, port, np, etp, itp, aff, ext, lb, ranges, v6: {
        "cluster_ips": (f"10.96.0.{vip}", f"fd00:10:96::{vip}") if v6 else (f"10.96.0.{vip}",),
        "port": port,
        "node_port": np,
        "external_traffic_policy": etp,
        "internal_traffic_policy": itp,
        "affinity_timeout": aff,
        "external_ips": ext,
        "load_balancer_ips": lb,
        "load_balancer_source_ranges": ranges,
    },
    st.integers(1, 4),
    st.sampled_from([80, 443]),
    st.sampled_from([0, 30001, 30002]),
    st.sampled_from(list(TrafficPolicy)),
    st.sampled_from(list(TrafficPolicy)),
    st.sampled_from([None, None, 60, 120]),
    st.sampled_from([(), ("203.0.113.1",), ("203.0.113.1", "2001:db8::1")]),
    st.sampled_from([(), ("198.51.100.1",), ("198.51.100.1", "2001:db8::2")]),
    st.sampled_from(
        [(), ("10.0.0.0/8", "10.1.0.0/16"), ("192.168.50.0/24",), ("198.51.100.0/24",)]
    ),
    st.booleans(),
)
endpoint = st.builds(
    lambda i, node, ready, term, port, v6: Endpoint(
        ip=(
            f"fd00:10:244:{1 if node == 'node-a' else 2}::{i}"
            if v6
            else f"10.244.{1 if node == 'node-a' else 2}.{i}"
        ),
        port=port,
        node_name=node,
        ready=ready,
        serving=True,
        terminating=term,
    ),
    st.integers(1, 6),
    st.sampled_from(["node-a", "node-b"]),
    st.booleans(),
    st.booleans(),
    st.sampled_from([8080, 9090]),
    st.booleans(),
)


class PartialVersusFull(RuleBasedStateMachine):
    SERVICES: ClassVar[int] = 6

    # --------------------------------------------------------- for subclasses

    def runner(self, role: str) -> NftRunner:
        """An nft runner for ``role`` ("partial" or "full"), holding no kube-proxy table."""
        raise NotImplementedError

    def backend(self, role: str) -> Any:
        """The backend under test for ``role``; it has ``sync`` and ``last_transaction``
        (or ``last_restore``)."""
        return NftablesBackend(CONFIG, self.runner(role))

    def state(self, backend: Any) -> object:
        """What ``backend`` programmed, in a form two backends can be compared by."""
        raise NotImplementedError

    def after_step(self) -> None:
        """Further checks after every sync."""

    # -------------------------------------------------------------- machine

    @initialize()
    def start(self) -> None:
        self.under_test = self.backend("partial")
        self.services: dict[ServicePortName, ServicePort] = {}
        self.endpoints: dict[ServicePortName, tuple[Endpoint, ...]] = {}
        self.synced = False

    def _sync(self, changed: set[ServicePortName]) -> None:
        snap = Snapshot(dict(self.services), dict(self.endpoints), NODE)
        result = self.under_test.sync(snap, changed if self.synced else None)
        # A partial sync must never need the full-sync fallback.
        assert result.full is not self.synced, _applied(self.under_test)
        assert result.isolated == [] and result.partial_failures == 0
        self.synced = True
        fresh = self.backend("full")
        fresh.sync(snap, None)
        assert self.state(self.under_test) == self.state(fresh)
        self.after_step()

    def _index(self) -> st.SearchStrategy[int]:
        return st.integers(0, self.SERVICES - 1)

    @rule(data=st.data(), proto=PROTOCOLS, spec=services)
    def put_service(self, data: st.DataObject, proto: L4Protocol, spec: dict[str, Any]) -> None:
        name = port_name(data.draw(self._index()), proto)
        self.services[name] = ServicePort(name=name, **spec)
        self._sync({name})

    @rule(data=st.data(), drop=st.booleans())
    def change_several(self, data: st.DataObject, drop: bool) -> None:
        # Several ServicePorts in one partial sync: two of them may now claim (or stop
        # claiming) the same destination, a new one may win a destination from an
        # existing one, one may go away.
        changes = data.draw(
            st.lists(
                st.tuples(self._index(), PROTOCOLS, services),
                min_size=2,
                max_size=4,
                unique_by=lambda c: (c[0], c[1]),
            )
        )
        changed = set()
        for i, proto, spec in changes:
            name = port_name(i, proto)
            self.services[name] = ServicePort(name=name, **spec)
            self.endpoints[name] = data.draw(
                st.lists(endpoint, max_size=4, unique_by=lambda e: (e.ip, e.port)).map(tuple)
            )
            changed.add(name)
        if drop and self.services:
            gone = data.draw(st.sampled_from(sorted(self.services)))
            del self.services[gone]
            self.endpoints.pop(gone, None)
            changed.add(gone)
        self._sync(changed)

    @rule(data=st.data(), proto=PROTOCOLS)
    def delete_service(self, data: st.DataObject, proto: L4Protocol) -> None:
        name = port_name(data.draw(self._index()), proto)
        self.services.pop(name, None)
        self.endpoints.pop(name, None)
        self._sync({name})

    @rule(
        data=st.data(),
        proto=PROTOCOLS,
        eps=st.lists(endpoint, max_size=4, unique_by=lambda e: (e.ip, e.port)),
    )
    def set_endpoints(self, data: st.DataObject, proto: L4Protocol, eps: list[Endpoint]) -> None:
        name = port_name(data.draw(self._index()), proto)
        self.endpoints[name] = tuple(eps)
        self._sync({name})

    @rule()
    def periodic_full_resync(self) -> None:
        # A full sync over a live table (flush + re-add) must land on the same state too.
        snap = Snapshot(dict(self.services), dict(self.endpoints), NODE)
        assert self.under_test.sync(snap, None).full
        # The flush-and-re-add path, not the fallback that replaces the table.
        assert "delete table" not in _applied(self.under_test)
        fresh = self.backend("full")
        fresh.sync(snap, None)
        assert self.state(self.under_test) == self.state(fresh)
        self.after_step()

    @rule(data=st.data(), proto=PROTOCOLS)
    def move_to_other_address(self, data: st.DataObject, proto: L4Protocol) -> None:
        i = data.draw(self._index())
        name = port_name(i, proto)
        if name in self.services:
            svc = self.services[name]
            self.services[name] = replace(svc, cluster_ips=(f"10.96.1.{i}",))
            self._sync({name})


def _applied(backend: Any) -> str:
    text = getattr(backend, "last_transaction", None)
    return str(text if text is not None else backend.last_restore)
