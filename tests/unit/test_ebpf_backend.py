"""ebpf mode without root: the service map's layout and write order on the strict fake
map, which ServicePorts the hooks serve, and the backend's full, partial and restart
syncs (the real EbpfBackend over FakeNftables and a FakeMap)."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest

from kubeproxy.backends.base import BackendError
from kubeproxy.backends.ebpf.proxier import EbpfBackend
from kubeproxy.backends.ebpf.render import socket_entries
from kubeproxy.backends.ebpf.teardown import SocketTeardown
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.bpf import build
from kubeproxy.dataplane.bpf.libbpf import BpfError
from kubeproxy.dataplane.bpf.socklb import (
    NONE,
    Backends,
    FakeMap,
    Frontend,
    ServiceTable,
    SockLBError,
    Target,
    mount_type,
)
from kubeproxy.dataplane.nftables.fake import FakeNftables
from kubeproxy.metrics import Metrics
from kubeproxy.model.plan import ServicePortPlan
from kubeproxy.model.planning import family_plans, service_port_plans
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import (
    Endpoint,
    IPFamily,
    L4Protocol,
    ServicePort,
    ServicePortName,
    TrafficPolicy,
)
from tests.conftest import require_tool
from tests.unit.conftest import service_port

CONFIG = ProxyConfig(
    hostname="node-a",
    mode=ProxyMode.EBPF,
    families=(IPFamily.IPv4, IPFamily.IPv6),
    cluster_cidrs=("10.244.0.0/16",),
    healthz_bind_address="",
    metrics_bind_address="",
)
NODE = NodeState("node-a", "zone-a", {IPFamily.IPv4: "192.168.50.1"})
WEB = Frontend("10.96.0.10", 80, L4Protocol.TCP)


class RecordingMap(FakeMap):
    """The fake map, remembering each write as ("update"|"delete", slot)."""

    def __init__(self) -> None:
        super().__init__(12, 8)
        self.log: list[tuple[str, int]] = []

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        super().update(key, value, flags)
        self.log.append(("update", int.from_bytes(key[6:8], "little")))

    def delete(self, key: bytes) -> bool:
        self.log.append(("delete", int.from_bytes(key[6:8], "little")))
        return super().delete(key)


def table_of(kv4: FakeMap, kv6: FakeMap | None = None) -> ServiceTable:
    """The table over ``kv4`` (and an IPv6 map of its own unless given)."""
    return ServiceTable(kv4, kv6 if kv6 is not None else FakeMap(24, 20))


def targets(n: int, base: int = 10, affinity: int = 0) -> Backends:
    return Backends(tuple(Target(f"10.244.1.{base + i}", 8080) for i in range(n)), affinity)


# ------------------------------------------------------------------ the map


def test_growing_writes_the_slots_before_the_count() -> None:
    kv = RecordingMap()
    table = table_of(kv)
    table.write(WEB, targets(2))
    assert kv.log == [("update", 1), ("update", 2), ("update", 0)]
    assert table.dump() == {WEB: targets(2)}


def test_shrinking_writes_the_count_before_removing_slots() -> None:
    kv = RecordingMap()
    table = table_of(kv)
    table.write(WEB, targets(3))
    kv.log.clear()
    table.write(WEB, targets(1, base=20), before=targets(3))
    assert kv.log == [("update", 1), ("update", 0), ("delete", 2), ("delete", 3)]
    assert table.dump() == {WEB: targets(1, base=20)}


def test_removing_a_frontend_removes_its_count_first() -> None:
    kv = RecordingMap()
    table = table_of(kv)
    table.write(WEB, targets(2))
    kv.log.clear()
    table.write(WEB, NONE, before=targets(2))
    assert kv.log == [("delete", 0), ("delete", 1), ("delete", 2)]
    assert kv.data == {}


def test_dump_keeps_slots_a_cut_short_write_left() -> None:
    """Slots beyond the count are reported, so the next write removes them."""
    kv = FakeMap(12, 8)
    table = table_of(kv)
    table.write(WEB, targets(3))
    # A shrink to one endpoint that died after writing the count: slots 2 and 3 remain.
    count_key = next(k for k in kv.data if k[6:8] == b"\0\0")
    kv.data[count_key] = kv.data[count_key][:6] + (1).to_bytes(2, "little")
    assert len(table.dump()[WEB].targets) == 3
    table.write(WEB, targets(1), before=table.dump()[WEB])
    assert table.dump() == {WEB: targets(1)}
    assert len(kv.data) == 2


def test_read_gives_one_frontend_as_dump_does() -> None:
    table = table_of(FakeMap(12, 8))
    table.write(WEB, targets(3, affinity=30))
    table.write(Frontend("10.96.0.11", 80, L4Protocol.TCP), targets(1))
    assert table.read(WEB) == table.dump()[WEB] == targets(3, affinity=30)
    assert table.read(Frontend("10.96.0.12", 80, L4Protocol.TCP)) == NONE


# --------------------------------------------------------------- what is served


def plan_of(
    port: ServicePort, eps: tuple[Endpoint, ...], family: IPFamily = IPFamily.IPv4
) -> ServicePortPlan:
    snap = Snapshot({port.name: port}, {port.name: eps}, NODE)
    fam = next(f for f in family_plans(CONFIG.planning, snap) if f.family is family)
    plan = service_port_plans(snap, fam)[port.name]
    assert plan is not None
    return plan


EPS = (Endpoint("10.244.1.10", 8080, "node-a"), Endpoint("10.244.2.10", 8080, "node-b"))


def test_a_cluster_ip_with_endpoints_is_served_by_the_hooks() -> None:
    entries = socket_entries(plan_of(service_port(), EPS))
    assert entries == {WEB: Backends((Target("10.244.1.10", 8080), Target("10.244.2.10", 8080)))}


@pytest.mark.parametrize(
    ("port", "eps", "why"),
    [
        (service_port(), (), "no endpoints: nftables REJECTs"),
        (
            service_port(itp=TrafficPolicy.LOCAL),
            (Endpoint("10.244.2.10", 8080, "node-b"),),
            "no local endpoint: nftables DROPs",
        ),
        (service_port(protocol=L4Protocol.SCTP), EPS, "SCTP"),
    ],
)
def test_what_the_hooks_leave_to_nftables(
    port: ServicePort, eps: tuple[Endpoint, ...], why: str
) -> None:
    assert socket_entries(plan_of(port, eps)) == {}, why


def test_ipv6_cluster_ips_are_served_too() -> None:
    port = service_port(cluster_ips=("fd00:96::10",))
    eps = (Endpoint("fd00:10:244:1::10", 8080, "node-a"),)
    frontend = Frontend("fd00:96::10", 80, L4Protocol.TCP)
    assert socket_entries(plan_of(port, eps, IPFamily.IPv6)) == {
        frontend: Backends((Target("fd00:10:244:1::10", 8080),))
    }


def test_a_dual_stack_service_port_has_a_frontend_in_each_map() -> None:
    kv4, kv6 = FakeMap(12, 8), FakeMap(24, 20)
    port = service_port(cluster_ips=("10.96.0.10", "fd00:96::10"))
    eps = (Endpoint("10.244.1.10", 8080, "node-a"), Endpoint("fd00:10:244:1::10", 8080, "node-a"))
    b = backend(kv4, kv6=kv6)
    b.sync(Snapshot({port.name: port}, {port.name: eps}, NODE), None)
    assert table_of(kv4, kv6).dump() == {
        WEB: Backends((Target("10.244.1.10", 8080),)),
        Frontend("fd00:96::10", 80, L4Protocol.TCP): Backends((Target("fd00:10:244:1::10", 8080),)),
    }
    assert len(kv4.data) == len(kv6.data) == 2
    # Gone: both go.
    b.sync(Snapshot({}, {}, NODE), {port.name})
    assert kv4.data == kv6.data == {}


def test_internal_traffic_policy_local_serves_the_local_endpoints_only() -> None:
    entries = socket_entries(plan_of(service_port(itp=TrafficPolicy.LOCAL), EPS))
    assert entries == {WEB: Backends((Target("10.244.1.10", 8080),))}


def test_session_affinity_goes_into_the_count_slot() -> None:
    port = replace(service_port(), affinity_timeout=10800)
    entries = socket_entries(plan_of(port, EPS))
    assert entries[WEB].affinity == 10800
    kv = FakeMap(12, 8)
    table = table_of(kv)
    table.write(WEB, entries[WEB])
    assert table.dump() == entries
    kv.writes = 0
    # Only the timeout changed: only slot 0 is written.
    table.write(WEB, replace(entries[WEB], affinity=60), before=entries[WEB])
    assert kv.writes == 1
    assert table.dump()[WEB].affinity == 60


def test_external_and_load_balancer_ips_are_served_for_local_clients() -> None:
    port = service_port(
        external_ips=("192.0.2.10",), load_balancer_ips=("198.51.100.10",), node_port=30080
    )
    entries = socket_entries(plan_of(port, EPS))
    both = Backends((Target("10.244.1.10", 8080), Target("10.244.2.10", 8080)))
    assert entries == {
        WEB: both,
        Frontend("192.0.2.10", 80, L4Protocol.TCP): both,
        Frontend("198.51.100.10", 80, L4Protocol.TCP): both,
    }


def test_external_policy_local_gives_local_clients_every_endpoint() -> None:
    """As nftables mode's short-circuit: the node and its Pods are not held to Local."""
    port = service_port(external_ips=("192.0.2.10",), etp=TrafficPolicy.LOCAL)
    eps = (Endpoint("10.244.2.10", 8080, "node-b"),)
    entries = socket_entries(plan_of(port, eps))
    assert entries[Frontend("192.0.2.10", 80, L4Protocol.TCP)].targets == (
        Target("10.244.2.10", 8080),
    )


def test_load_balancer_source_ranges_stay_with_nftables() -> None:
    port = replace(
        service_port(load_balancer_ips=("198.51.100.10",)),
        load_balancer_source_ranges=("203.0.113.0/24",),
    )
    assert set(socket_entries(plan_of(port, EPS))) == {WEB}


# ------------------------------------------------------------------ the backend


class FakeLB:
    def __init__(self, kv: FakeMap, kv6: FakeMap) -> None:
        self.services = table_of(kv, kv6)
        self.closed = False
        # What the map held when the hooks were pointed at it.
        self.attached_with: dict[Frontend, Backends] | None = None
        self.destroyed: list[tuple[Frontend, Target]] = []

    def attach(self) -> None:
        if self.attached_with is None:
            self.attached_with = self.services.dump()

    def destroy_stale(self, stale: Iterable[tuple[Frontend, Target]]) -> int:
        self.destroyed.extend(stale)
        return len(self.destroyed)

    def check(self) -> str | None:
        return None

    def close(self) -> None:
        self.closed = True


def backend(
    kv: FakeMap, nft: FakeNftables | None = None, kv6: FakeMap | None = None
) -> EbpfBackend:
    v6 = kv6 if kv6 is not None else FakeMap(24, 20)
    b = EbpfBackend(CONFIG, NftablesBackend(CONFIG, nft or FakeNftables()), lambda: FakeLB(kv, v6))
    b.start()
    return b


def fake_lb(b: EbpfBackend) -> FakeLB:
    lb = b.socket_lb
    assert isinstance(lb, FakeLB)
    return lb


def snapshot(n: int, endpoints: int = 2) -> Snapshot:
    ports = [service_port(f"svc{i}", cluster_ips=(f"10.96.0.{i + 1}",)) for i in range(n)]
    eps = {
        p.name: tuple(Endpoint(f"10.244.1.{10 + j}", 8080, "node-a") for j in range(endpoints))
        for p in ports
    }
    return Snapshot({p.name: p for p in ports}, eps, NODE)


def test_a_full_sync_programs_nftables_and_the_map() -> None:
    kv, nft = FakeMap(12, 8), FakeNftables()
    result = backend(kv, nft).sync(snapshot(3), None)
    assert result.full
    assert len(table_of(kv).dump()) == 3
    assert result.elements >= 3 * 3
    # Everything else (NodePorts, REJECT, the ClusterIP for other cgroups) is nftables'.
    assert "10.96.0.1" in nft.dump()


def test_a_partial_sync_touches_only_the_changed_service_ports() -> None:
    kv = FakeMap(12, 8)
    b = backend(kv)
    snap = snapshot(50)
    b.sync(snap, None)
    name = next(iter(snap.services))
    eps = dict(snap.endpoints)
    eps[name] = (*eps[name], Endpoint("10.244.2.99", 8080, "node-b"))
    kv.writes = 0
    result = b.sync(Snapshot(snap.services, eps, NODE), {name})
    assert not result.full
    assert kv.writes == 2  # the new slot, then the count
    # The element count is kept as the map changes; a restart reads the map back and
    # counts it afresh.
    assert backend(kv).sync(Snapshot(snap.services, eps, NODE), None).elements == result.elements
    assert table_of(kv).dump()[Frontend("10.96.0.1", 80, L4Protocol.TCP)].targets[-1] == Target(
        "10.244.2.99", 8080
    )


class RefusingMap(FakeMap):
    """The fake map, refusing the next ``refuse`` updates (map writes are one entry at a
    time: what came before a refusal stays written)."""

    refuse = 0

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        if self.refuse:
            self.refuse -= 1
            raise BpfError(errno.E2BIG, "update: map full")
        super().update(key, value, flags)


def test_a_refused_partial_map_write_is_redone_in_full_in_the_same_sync() -> None:
    # The driver's rule for every mode: the map is read back (our record of it is
    # unknown after a refusal) and every entry written, in the same sync.
    kv = RefusingMap(12, 8)
    b = backend(kv)
    snap = snapshot(5)
    b.sync(snap, None)
    name = next(iter(snap.services))
    eps = dict(snap.endpoints)
    eps[name] = (*eps[name], Endpoint("10.244.2.99", 8080, "node-b"))
    changed = Snapshot(snap.services, eps, NODE)
    kv.refuse = 1
    result = b.sync(changed, {name})
    # One refusal, counted under each family the one map serves.
    assert result.full and set(result.partial_failures.values()) == {1}
    want = {f: be for p in plans_of(changed) for f, be in socket_entries(p).items()}
    assert table_of(kv).dump() == want


def plans_of(snap: Snapshot) -> list[ServicePortPlan]:
    fam = family_plans(CONFIG.planning, snap)[0]
    return [p for p in service_port_plans(snap, fam).values() if p is not None]


def test_a_service_port_losing_its_endpoints_leaves_the_map() -> None:
    kv = FakeMap(12, 8)
    b = backend(kv)
    snap = snapshot(2)
    b.sync(snap, None)
    name = next(iter(snap.services))
    b.sync(Snapshot(snap.services, {**snap.endpoints, name: ()}, NODE), {name})
    assert Frontend("10.96.0.1", 80, L4Protocol.TCP) not in table_of(kv).dump()
    deleted = {n: p for n, p in snap.services.items() if n != name}
    b.sync(Snapshot(deleted, snap.endpoints, NODE), {name})
    assert len(table_of(kv).dump()) == 1


def test_a_restart_reads_the_pinned_map_and_rewrites_nothing_that_is_right() -> None:
    kv = FakeMap(12, 8)
    backend(kv).sync(snapshot(20), None)
    kv.writes = 0
    again = backend(kv)  # a new process, the same (pinned) map
    snap = snapshot(20)
    gone = next(iter(snap.services))
    kept = {n: p for n, p in snap.services.items() if n != gone}
    again.sync(Snapshot(kept, snap.endpoints, NODE), None)
    # Only the ServicePort that went away while we were down (its count, 2 slots).
    assert kv.writes == 3


def test_two_service_ports_claiming_one_frontend_first_by_name_wins() -> None:
    kv = FakeMap(12, 8)
    a = service_port("a", cluster_ips=("10.96.0.10",))
    b = service_port("b", cluster_ips=("10.96.0.10",))
    eps: dict[ServicePortName, tuple[Endpoint, ...]] = {
        a.name: (Endpoint("10.244.1.10", 8080, "node-a"),),
        b.name: (Endpoint("10.244.1.11", 8080, "node-a"),),
    }
    be = backend(kv)
    be.sync(Snapshot({a.name: a, b.name: b}, eps, NODE), None)
    assert table_of(kv).dump()[WEB].targets == (Target("10.244.1.10", 8080),)
    # "a" goes away: "b" takes the frontend at the next full sync.
    be.sync(Snapshot({b.name: b}, eps, NODE), None)
    assert table_of(kv).dump()[WEB].targets == (Target("10.244.1.11", 8080),)


def test_the_hooks_are_attached_once_the_first_sync_filled_the_map() -> None:
    b = backend(FakeMap(12, 8))
    assert fake_lb(b).attached_with is None
    b.sync(snapshot(3), None)
    assert len(fake_lb(b).attached_with or {}) == 3


def test_udp_endpoints_that_go_away_get_their_sockets_destroyed() -> None:
    kv = FakeMap(12, 8)
    b = backend(kv)
    udp = service_port("dns", "dns", L4Protocol.UDP, number=53)
    eps = {udp.name: EPS}
    b.sync(Snapshot({udp.name: udp}, eps, NODE), None)
    assert fake_lb(b).destroyed == []
    b.sync(Snapshot({udp.name: udp}, {udp.name: EPS[1:]}, NODE), {udp.name})
    assert b.teardown.wait(5)
    frontend = Frontend("10.96.0.10", 53, L4Protocol.UDP)
    assert fake_lb(b).destroyed == [(frontend, Target("10.244.1.10", 8080))]
    assert b.counters()["ebpf_sockets_destroyed"] == 1


class SlowLB(FakeLB):
    """A teardown that waits for the test, and sees the map as it is when it runs."""

    def __init__(self, kv: FakeMap, kv6: FakeMap) -> None:
        super().__init__(kv, kv6)
        self.go = threading.Event()
        self.started = threading.Event()  # a teardown is under way (waiting for go)
        self.seen: list[dict[Frontend, Backends]] = []
        self.fail = False

    def destroy_stale(self, stale: Iterable[tuple[Frontend, Target]]) -> int:
        self.seen.append(self.services.dump())
        self.started.set()
        assert self.go.wait(5)
        if self.fail:
            raise OSError(errno.EOPNOTSUPP, "SOCK_DESTROY: not supported")
        return super().destroy_stale(stale)


def dns_backend() -> tuple[EbpfBackend, SlowLB, ServicePort]:
    lb = SlowLB(FakeMap(12, 8), FakeMap(24, 20))
    b = EbpfBackend(CONFIG, NftablesBackend(CONFIG, FakeNftables()), lambda: lb)
    b.start()
    udp = service_port("dns", "dns", L4Protocol.UDP, number=53)
    b.sync(Snapshot({udp.name: udp}, {udp.name: EPS}, NODE), None)
    return b, lb, udp


DNS = Frontend("10.96.0.10", 53, L4Protocol.UDP)


def test_the_sync_does_not_wait_for_the_socket_teardown() -> None:
    b, lb, udp = dns_backend()
    # The teardown is stuck (lb.go not set), yet the sync and the next one complete.
    b.sync(Snapshot({udp.name: udp}, {udp.name: EPS[1:]}, NODE), {udp.name})
    b.sync(Snapshot({udp.name: udp}, {udp.name: EPS[1:]}, NODE), None)
    assert not b.teardown.wait(0.05)
    lb.go.set()
    assert b.teardown.wait(5)
    assert lb.destroyed == [(DNS, Target("10.244.1.10", 8080))]
    # The map was written first: the teardown saw the endpoint gone already.
    assert lb.seen[0][DNS].targets == (Target("10.244.2.10", 8080),)


def test_a_failed_teardown_is_counted_and_the_syncs_go_on() -> None:
    b, lb, udp = dns_backend()
    lb.fail = True
    lb.go.set()
    b.sync(Snapshot({udp.name: udp}, {udp.name: EPS[1:]}, NODE), {udp.name})
    assert b.teardown.wait(5)
    b.sync(Snapshot({udp.name: udp}, {udp.name: EPS}, NODE), {udp.name})
    counters = b.counters()
    assert counters["ebpf_socket_teardown_failures"] == 1
    assert counters["ebpf_sockets_destroyed"] == 0
    metrics = Metrics("ebpf")
    metrics.counter_reader = b.counters
    text = metrics.exposition().decode()
    assert "kubeproxy_ebpf_socket_teardown_failures_total 1.0" in text
    assert "kubeproxy_ebpf_sockets_destroyed_total 0.0" in text


def test_an_endpoint_back_before_its_teardown_ran_keeps_its_sockets() -> None:
    b, lb, udp = dns_backend()
    b.sync(Snapshot({udp.name: udp}, {udp.name: EPS[:1]}, NODE), {udp.name})  # .2.10 gone
    # The first walk (.2.10) is under way (else the worker could take .1.10 with it)...
    assert lb.started.wait(5)
    b.sync(Snapshot({udp.name: udp}, {udp.name: EPS[1:]}, NODE), {udp.name})  # .1.10 gone
    # ... .1.10 waits for it, and comes back meanwhile.
    b.sync(Snapshot({udp.name: udp}, {udp.name: EPS}, NODE), {udp.name})
    lb.go.set()
    assert b.teardown.wait(5)
    assert (DNS, Target("10.244.1.10", 8080)) not in lb.destroyed


def test_teardowns_waiting_are_merged_and_bounded() -> None:
    batches: list[list[tuple[Frontend, Target]]] = []
    go = threading.Event()

    def destroy(pairs: list[tuple[Frontend, Target]]) -> int:
        go.wait(5)
        batches.append(pairs)
        return len(pairs)

    teardown = SocketTeardown(destroy, max_pending=3)
    pairs = [(DNS, Target(f"10.244.1.{i}", 53)) for i in range(6)]
    teardown.submit(pairs[:1], {})  # taken by the worker, which waits for go
    time.sleep(0.05)
    teardown.submit(pairs[1:3], {})
    teardown.submit(pairs[3:], {})  # one fits, two are dropped
    go.set()
    assert teardown.wait(5)
    assert batches == [pairs[:1], pairs[1:4]]
    assert (teardown.stats.destroyed, teardown.stats.dropped) == (4, 2)
    teardown.close()
    teardown.submit(pairs[:1], {})  # after close: nothing runs, it is counted
    assert teardown.wait(0.1)
    assert (teardown.stats.runs, teardown.stats.dropped) == (2, 3)


def test_render_lists_the_socket_entries_after_the_nft_script() -> None:
    text = backend(FakeMap(12, 8)).render(snapshot(1))
    assert "table ip kube-proxy" in text
    assert "# 10.96.0.1:80/TCP -> 10.244.1.10:8080, 10.244.1.11:8080" in text


def test_render_shows_the_affinity_timeout() -> None:
    port = replace(service_port(), affinity_timeout=600)
    text = backend(FakeMap(12, 8)).render(Snapshot({port.name: port}, {port.name: EPS}, NODE))
    assert (
        "# 10.96.0.10:80/TCP -> 10.244.1.10:8080, 10.244.2.10:8080 (ClientIP affinity 600s)" in text
    )


# ----------------------------------------------------------------- the build


def test_the_object_builds_reproducibly_into_its_cache(tmp_path: Path) -> None:
    require_tool("clang", "ebpf mode builds its BPF object")
    first = build.build(tmp_path / "a")
    second = build.build(tmp_path / "b")
    assert first.name == second.name
    assert first.read_bytes() == second.read_bytes()
    assert build.build(tmp_path / "a") == first  # cached: not rebuilt


def test_a_missing_compiler_is_named(tmp_path: Path) -> None:
    with pytest.raises(build.BuildError, match="clang and libbpf-dev"):
        build.build(tmp_path, clang="no-such-clang")


def test_mount_type_finds_the_filesystem_of_a_path(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / / rw - ext4 /dev/sda rw\n40 22 0:35 / /sys/fs/bpf rw - bpf bpf rw\n"
    )
    assert mount_type(Path("/sys/fs/bpf/kubeproxy"), str(info)) == "bpf"
    assert mount_type(Path("/sys/fs/bpfx"), str(info)) == "ext4"


# -------------------------------------------------------------- the fallback


def no_hooks() -> FakeLB:
    raise SockLBError("--ebpf-cgroup-path /x: not a cgroup v2 directory")


def test_a_node_without_what_the_hooks_need_stops_the_start_with_the_reason() -> None:
    b = EbpfBackend(CONFIG, NftablesBackend(CONFIG, FakeNftables()), no_hooks)
    with pytest.raises(BackendError, match=r"not a cgroup v2 directory.*--ebpf-fallback"):
        b.start()


def test_the_operator_may_choose_nftables_mode_instead(tmp_path: Path) -> None:
    config = replace(CONFIG, ebpf_fallback="nftables", ebpf_pin_path=str(tmp_path / "none"))
    nft = FakeNftables()
    b = EbpfBackend(config, NftablesBackend(config, nft), no_hooks)
    b.start()
    assert b.fallback
    assert b.sync(snapshot(2), None).full
    assert "10.96.0.1" in nft.dump()
