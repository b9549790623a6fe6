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

import re
from dataclasses import replace
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.backends.nftables.table import LOCAL_OFFSET, is_backends
from kubeproxy.config.runtime import ProxyConfig
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


_BACKENDS_MAP = re.compile(r"^\tmap (\S+) \{$")
_ELEMENT = re.compile(r"^\t\t\t(.+) \. (\d+) : (.+)$")


def any_index(dump: str) -> str:
    """The strict fake's dump with each destination's endpoints in a backends map sorted
    and indexed from 0 (``LOCAL_OFFSET`` for node-local ones): a partial sync keeps an
    endpoint at its index, a fresh full sync indexes in address order, and a packet
    meets ``numgen random mod N`` either way (as :mod:`kubeproxy.lab.rulestate` compares
    kernels)."""
    out: list[str] = []
    groups: dict[tuple[str, int], list[str]] = {}
    backends = False
    for line in dump.splitlines():
        element = _ELEMENT.match(line) if backends else None
        if element is not None:
            first = LOCAL_OFFSET if int(element[2]) >= LOCAL_OFFSET else 0
            groups.setdefault((element[1], first), []).append(element[3])
            continue
        for (key, first), values in sorted(groups.items()):
            out.extend(f"\t\t\t{key} . {first + i} : {v}" for i, v in enumerate(sorted(values)))
        groups.clear()
        if not line.startswith("\t\t"):  # a table, chain, set or map begins
            header = _BACKENDS_MAP.match(line)
            backends = header is not None and is_backends(header[1])
        out.append(line)
    return "\n".join(out)


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
        assert result.isolated == [] and result.partial_failures == {}
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

    @rule(
        data=st.data(),
        hosts=st.lists(st.integers(1, 6), min_size=2, max_size=5, unique=True),
        nodes=st.lists(st.sampled_from(["node-a", "node-b"]), min_size=5, max_size=5),
    )
    def ready_endpoints(self, data: st.DataObject, hosts: list[int], nodes: list[str]) -> None:
        # Several ready IPv4 endpoints (the random ones are often of mixed families or
        # not ready): something for replace_one_endpoint to shuffle.
        if not self.services:
            return
        name = data.draw(st.sampled_from(sorted(self.services)))
        self.endpoints[name] = tuple(
            Endpoint(f"10.244.{1 if node == 'node-a' else 2}.{h}", 8080, node)
            for h, node in zip(hosts, nodes, strict=False)
        )
        self._sync({name})

    @rule(data=st.data(), host=st.integers(7, 12))
    def replace_one_endpoint(self, data: st.DataObject, host: int) -> None:
        # The same count, one endpoint of a Service replaced by one like it (same
        # family, node and conditions): in nftables mode the newcomer takes the leaver's
        # index in the backends map and the others stay, where a fresh full sync indexes
        # in the given order (the newcomer is put first).
        candidates = sorted(n for n, eps in self.endpoints.items() if eps and n in self.services)
        if not candidates:
            return
        name = data.draw(st.sampled_from(candidates))
        eps = list(self.endpoints[name])
        leaver = eps.pop(data.draw(st.integers(0, len(eps) - 1)))
        sep = ":" if ":" in leaver.ip else "."
        new = leaver._replace(ip=f"{leaver.ip.rsplit(sep, 1)[0]}{sep}{host}")
        if any((e.ip, e.port) == (new.ip, new.port) for e in eps):
            return
        self.endpoints[name] = (new, *eps)
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
