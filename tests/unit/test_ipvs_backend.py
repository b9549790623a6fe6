"""ipvs mode on the strict fakes (IPVS table, links, ipset, iptables): what a sync wants,
what it changes, graceful termination and cleanup, without an IPVS kernel.
tests/kernel/test_ipvs_*.py checks packets through a real IPVS kernel."""

from __future__ import annotations

import errno
import ipaddress
from dataclasses import replace
from pathlib import Path

import pytest

from kubeproxy.backends.base import BackendError
from kubeproxy.backends.ipvs import names as n
from kubeproxy.backends.ipvs.diff import Observed, diff
from kubeproxy.backends.ipvs.graceful import Action, GracefulTermination
from kubeproxy.backends.ipvs.proxier import IpvsBackend, cleanup, sysctls
from kubeproxy.backends.ipvs.render import desired_state
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ConfigError, IpvsSettings, ProxyConfig
from kubeproxy.dataplane.ipset.fake import FakeIpset
from kubeproxy.dataplane.iptables.fake import FakeIptables
from kubeproxy.dataplane.ipvs import (
    FLAG_PERSISTENT,
    FLAG_SCHED2,
    Destination,
    Ipvs,
    IpvsError,
    ServiceKey,
    VirtualServer,
)
from kubeproxy.dataplane.ipvs.fake import FakeIpvs, FakeLinks
from kubeproxy.dataplane.kernel import kernel_version
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.planning import family_plans, service_port_plans
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import Endpoint, IPFamily, ServicePort, TrafficPolicy
from tests.unit.conftest import port_name

NODE = NodeState("node-a", None, {IPFamily.IPv4: "192.168.50.1"})
CONFIG = ProxyConfig(
    hostname="node-a",
    mode=ProxyMode.IPVS,
    families=(IPFamily.IPv4,),
    cluster_cidrs=("10.244.0.0/16",),
    nodeport_addresses=NodePortAddresses((), primary=False),
)
WEB = port_name("web")
DB = port_name("db")
VIP = ServiceKey("10.96.0.10", "TCP", 80)


def web(**kw: object) -> ServicePort:
    fields: dict[str, object] = {"name": WEB, "cluster_ips": ("10.96.0.10",), "port": 80}
    fields.update(kw)
    return ServicePort(**fields)  # type: ignore[arg-type]


def eps(*ips: str, node: str = "node-b") -> tuple[Endpoint, ...]:
    return tuple(Endpoint(ip, 8080, node) for ip in ips)


def snap(*ports: tuple[ServicePort, tuple[Endpoint, ...]]) -> Snapshot:
    return Snapshot({p.name: p for p, _ in ports}, {p.name: e for p, e in ports}, NODE)


class World:
    def __init__(self, tmp: Path, config: ProxyConfig = CONFIG) -> None:
        self.ipvs = FakeIpvs()
        self.links = FakeLinks({"192.168.50.1", "127.0.0.1"})
        self.ipset = FakeIpset()
        self.iptables = FakeIptables(IpvsFamily, "legacy")
        self.now = 1000.0
        for path, _ in sysctls(config, (4, 19)):
            if not (tmp / "sys" / path).exists():
                (tmp / "sys" / path).parent.mkdir(parents=True, exist_ok=True)
                (tmp / "sys" / path).write_text("0\n")
        self.backend = IpvsBackend(
            config,
            open_ipvs=lambda: self.ipvs,
            links=self.links,
            ipset=self.ipset,
            runners={IPFamily.IPv4: self.iptables},
            clock=lambda: self.now,
            proc=tmp,
            release="6.1.0",
        )


IpvsFamily = IPFamily.IPv4


def desired(snapshot: Snapshot, config: ProxyConfig = CONFIG, scheduler: str = "rr"):  # type: ignore[no-untyped-def]
    fam = family_plans(config.planning, snapshot)[0]
    plans = [p for p in service_port_plans(snapshot, fam).values() if p is not None]
    return desired_state(fam, plans, scheduler=scheduler, node_addresses={"192.168.50.1"})


# ------------------------------------------------------------------ want (pure)


def test_a_cluster_ip_is_one_virtual_server_with_nat_real_servers_of_weight_1() -> None:
    want = desired(snap((web(), eps("10.244.1.1", "10.244.2.1"))))
    assert want.services == {VIP: VirtualServer(VIP, "rr")}
    assert want.dests[VIP] == {("10.244.1.1", 8080): 1, ("10.244.2.1", 8080): 1}
    assert want.bind == {"10.96.0.10"}
    assert want.members["KUBE-CLUSTER-IP"] == {"10.96.0.10,tcp:80"}
    assert want.members["KUBE-IPVS-IPS"] == {"10.96.0.10"}


def test_session_affinity_is_persistence_and_mh_hashes_the_source_port() -> None:
    want = desired(snap((web(affinity_timeout=600), eps("10.244.1.1"))), scheduler="mh")
    vs = want.services[VIP]
    assert vs.flags == FLAG_PERSISTENT | FLAG_SCHED2 and vs.timeout == 600
    assert vs.scheduler == "mh"


def test_node_ports_go_on_node_addresses_but_never_loopback() -> None:
    want = desired(snap((web(node_port=30080), eps("10.244.1.1"))))
    node_key = ServiceKey("192.168.50.1", "TCP", 30080)
    assert node_key in want.services
    assert "192.168.50.1" not in want.bind  # a node address is not bound to kube-ipvs0
    assert want.members["KUBE-NODE-PORT-TCP"] == {"30080"}
    assert not want.members["KUBE-NODE-PORT-LOCAL-TCP"]


def test_local_policy_without_local_endpoints_falls_back_to_cluster_ones() -> None:
    # upstream's ipvs mode (kubernetes#97081): local Pods can still use the Service.
    svc = web(node_port=30080, external_traffic_policy=TrafficPolicy.LOCAL)
    want = desired(snap((svc, eps("10.244.1.1"))))
    assert want.dests[ServiceKey("192.168.50.1", "TCP", 30080)] == {("10.244.1.1", 8080): 1}
    assert want.members["KUBE-NODE-PORT-LOCAL-TCP"] == {"30080"}
    local = desired(snap((svc, (*eps("10.244.1.1"), *eps("10.244.9.9", node="node-a")))))
    assert local.dests[ServiceKey("192.168.50.1", "TCP", 30080)] == {("10.244.9.9", 8080): 1}
    assert local.members["KUBE-LOOP-BACK"] == {"10.244.9.9,tcp:8080,10.244.9.9"}


def test_load_balancer_source_ranges_fill_the_firewall_sets() -> None:
    svc = web(load_balancer_ips=("203.0.113.7",), load_balancer_source_ranges=("198.51.100.0/24",))
    want = desired(snap((svc, eps("10.244.1.1"))))
    assert want.members["KUBE-LOAD-BALANCER-FW"] == {"203.0.113.7,tcp:80"}
    assert want.members["KUBE-LOAD-BALANCER-SOURCE-CIDR"] == {"203.0.113.7,tcp:80,198.51.100.0/24"}
    assert want.lb_no_node_access == [("203.0.113.7", "tcp", 80)]
    assert "203.0.113.7" in want.bind


def test_a_zero_source_range_puts_nothing_in_the_firewall_sets() -> None:
    # The kernel refuses a /0 in hash:ip,port,net, so writing one failed every sync
    # (found by the ipset parity table); upstream reads a /0 as "no firewall".
    svc = web(
        load_balancer_ips=("203.0.113.7",),
        load_balancer_source_ranges=("198.51.100.0/24", "0.0.0.0/0"),
    )
    want = desired(snap((svc, eps("10.244.1.1"))))
    assert not want.members.get("KUBE-LOAD-BALANCER-FW")
    assert not want.members.get("KUBE-LOAD-BALANCER-SOURCE-CIDR")
    assert want.lb_no_node_access == []
    assert "203.0.113.7,tcp:80" in want.members["KUBE-LOAD-BALANCER"]


def test_two_service_ports_claiming_one_destination_keep_the_first() -> None:
    other = ServicePort(name=DB, cluster_ips=("10.96.0.10",), port=80)
    want = desired(snap((web(), eps("10.244.1.1")), (other, eps("10.244.3.3"))))
    assert want.owners[VIP] == DB  # sorted by name: default/db first
    assert len(want.conflicts) == 1


def test_ipv6_set_names_are_upstreams() -> None:
    assert n.set_name("KUBE-LOAD-BALANCER-SOURCE-CIDR", True) == "KUBE-6-LOAD-BALANCER-SOURCE-CID"
    assert n.set_name("KUBE-CLUSTER-IP", True) == "KUBE-6-CLUSTER-IP"


# ------------------------------------------------------------------ diff (pure)


def test_diff_gives_only_what_changed_and_spares_excluded_cidrs() -> None:
    want = desired(snap((web(), eps("10.244.1.1", "10.244.1.2"))))
    foreign = ServiceKey("172.30.0.5", "TCP", 443)
    stale = ServiceKey("10.96.0.99", "UDP", 53)
    observed = Observed(
        services={
            VIP: VirtualServer(VIP, "wrr"),
            foreign: VirtualServer(foreign),
            stale: VirtualServer(stale),
        },
        dests={
            VIP: {("10.244.1.1", 8080): Destination("10.244.1.1", 8080, 1),
                  ("10.244.1.9", 8080): Destination("10.244.1.9", 8080, 1, active=2)},
            foreign: {}, stale: {},
        },
        bound={"10.96.0.10", "10.96.0.99"},
        members={},
    )  # fmt: skip
    specs = n.FamilySets(False).specs()
    changes = diff(
        want, observed, v6=False, specs=specs, exclude=[ipaddress.ip_network("172.30.0.0/16")]
    )
    assert changes.set_services == [VirtualServer(VIP, "rr")]
    assert changes.add_services == []
    assert changes.add_dests == [(VIP, Destination("10.244.1.2", 8080, 1))]
    assert [d for _, d in changes.remove_dests] == [Destination("10.244.1.9", 8080, 1, 2)]
    assert changes.delete_services == [stale]  # never the excluded one
    assert changes.unbind == ["10.96.0.99"] and changes.bind == []
    assert len(changes.create_sets) == len(specs)


# ---------------------------------------------------------- graceful (pure)


def test_graceful_termination_waits_for_connections_then_deletes() -> None:
    g = GracefulTermination(interval=60)
    busy = Destination("10.244.1.1", 8080, 1, active=1)
    assert g.remove(VIP, busy, now=0) is Action.QUIESCE
    assert g.remove(VIP, busy, now=1) is Action.WAIT
    assert g.due(now=59) == []
    item = (VIP, busy.endpoint)
    assert g.due(now=60) == [item]
    assert not g.settle(item, Destination("10.244.1.1", 8080, 0, active=0, inactive=1), now=60)
    assert g.due(now=100) == []
    assert g.settle(item, Destination("10.244.1.1", 8080, 0), now=120)
    assert g.waiting == {}


def test_graceful_termination_deletes_idle_udp_and_sctp_at_once() -> None:
    g = GracefulTermination()
    busy = Destination("10.244.1.1", 53, 1, active=3)
    assert g.remove(ServiceKey("10.96.0.10", "UDP", 53), busy, now=0) is Action.DELETE
    assert g.remove(VIP, Destination("10.244.1.1", 8080), now=0) is Action.DELETE
    assert g.remove(VIP, busy, now=0) is Action.QUIESCE
    assert g.cancel(VIP, busy.endpoint) and g.waiting == {}


# ------------------------------------------------------- orchestration (fakes)


def test_a_sync_programs_every_side_and_a_second_one_changes_nothing(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.backend.start()
    s = snap((web(node_port=30080), eps("10.244.1.1", "10.244.2.1")))
    result = w.backend.sync(s, None)
    assert result.full and not w.backend.errors
    assert set(w.ipvs.table) == {VIP, ServiceKey("192.168.50.1", "TCP", 30080)}
    assert w.links.addresses(n.DUMMY_DEVICE) == {"10.96.0.10"}
    assert w.ipset.state["KUBE-CLUSTER-IP"].members == {"10.96.0.10,tcp:80"}
    nat = w.iptables.tables["nat"].chains
    assert "KUBE-SERVICES" in nat and "KUBE-NODE-PORT" in nat
    calls, scripts = len(w.ipvs.calls), len(w.ipset.scripts)
    w.backend.sync(s, set())
    assert len(w.ipvs.calls) == calls
    assert len(w.ipset.scripts) == scripts + 1 and w.ipset.scripts[-1] == ""


def test_a_partial_sync_touches_only_the_changed_destination(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.backend.start()
    w.backend.sync(snap((web(), eps("10.244.1.1"))), None)
    w.ipvs.calls.clear()
    w.backend.sync(snap((web(), eps("10.244.1.1", "10.244.1.2"))), {WEB})
    assert w.ipvs.calls == ["add-dest TCP/10.96.0.10:80 10.244.1.2:8080 weight 1"]


def test_a_sync_sends_ipvs_changes_in_a_few_batches_and_reports_each_refusal(
    tmp_path: Path,
) -> None:
    w = World(tmp_path)
    w.backend.start()
    ports = [
        (web(name=port_name(f"s{i}"), cluster_ips=(f"10.96.1.{i}",)), eps("10.244.1.1"))
        for i in range(1, 51)
    ]
    w.ipvs.batches = 0
    w.backend.sync(snap(*ports[1:]), None)
    # Virtual servers, then their real servers: two batches for 98 objects.
    assert w.ipvs.batches == 2 and not w.backend.errors
    # Someone else's virtual server behind our back: our add is refused (EEXIST), and
    # its destinations are not tried (no error for each of them).
    w.ipvs.add_service(VirtualServer(ServiceKey("10.96.1.1", "TCP", 80), "wlc"))
    w.backend.sync(snap(*ports), {ports[0][0].name})
    assert len(w.backend.errors) == 1 and "TCP/10.96.1.1:80" in w.backend.errors[0]
    assert "EEXIST" in w.backend.errors[0] or "exists" in w.backend.errors[0]
    assert len(w.ipvs.dests) == 50 and not w.ipvs.dests[ServiceKey("10.96.1.1", "TCP", 80)]


def test_a_removed_endpoint_with_connections_drains_at_weight_0(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.backend.start()
    w.backend.sync(snap((web(), eps("10.244.1.1", "10.244.1.2"))), None)
    w.ipvs.conns[(VIP, ("10.244.1.2", 8080))] = (1, 0)
    w.ipvs.calls.clear()
    w.backend.sync(snap((web(), eps("10.244.1.1"))), {WEB})
    assert w.ipvs.calls == ["set-dest TCP/10.96.0.10:80 10.244.1.2:8080 weight 0"]
    w.now += 61
    assert w.backend.check() is None  # still busy: kept
    assert ("10.244.1.2", 8080) in w.ipvs.dests[VIP]
    w.ipvs.conns[(VIP, ("10.244.1.2", 8080))] = (0, 0)
    w.now += 61
    w.backend.check()
    assert ("10.244.1.2", 8080) not in w.ipvs.dests[VIP]


def test_an_endpoint_back_before_it_drained_gets_its_weight_back(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.backend.start()
    w.backend.sync(snap((web(), eps("10.244.1.1", "10.244.1.2"))), None)
    w.ipvs.conns[(VIP, ("10.244.1.2", 8080))] = (1, 0)
    w.backend.sync(snap((web(), eps("10.244.1.1"))), {WEB})
    w.backend.sync(snap((web(), eps("10.244.1.1", "10.244.1.2"))), {WEB})
    assert w.ipvs.dests[VIP][("10.244.1.2", 8080)].weight == 1
    assert w.backend.graceful.waiting == {}


def test_a_removed_service_goes_with_its_address_and_set_members(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.backend.start()
    w.backend.sync(snap((web(), eps("10.244.1.1"))), None)
    w.backend.sync(snap(), {WEB})
    assert w.ipvs.table == {} and w.links.addresses(n.DUMMY_DEVICE) == set()
    assert w.ipset.state["KUBE-CLUSTER-IP"].members == frozenset()


def test_a_full_sync_reads_the_kernel_and_repairs_it(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.backend.start()
    s = snap((web(), eps("10.244.1.1")))
    w.backend.sync(s, None)
    w.ipvs.delete_destination(VIP, "10.244.1.1", 8080)  # behind our back
    w.backend.sync(s, set())  # partial: trusts its picture
    assert w.ipvs.dests[VIP] == {}
    w.backend.sync(s, None)
    assert ("10.244.1.1", 8080) in w.ipvs.dests[VIP]


def test_excluded_virtual_servers_survive_full_syncs(tmp_path: Path) -> None:
    config = replace(CONFIG, ipvs=IpvsSettings(exclude_cidrs=("172.30.0.0/16",)))
    w = World(tmp_path, config)
    w.backend.start()
    theirs = VirtualServer(ServiceKey("172.30.0.5", "TCP", 443))
    w.ipvs.add_service(theirs)
    w.backend.sync(snap(), None)
    assert theirs.key in w.ipvs.table


def test_start_fails_clearly_without_ipvs_or_with_an_unknown_scheduler(tmp_path: Path) -> None:
    def no_ipvs() -> Ipvs:
        raise IpvsError("the kernel has no IPVS (family not found)", errno.ENOENT)

    w = World(tmp_path)
    w.backend.open_ipvs = no_ipvs
    with pytest.raises(BackendError, match="can't use the IPVS proxier: the kernel has no IPVS"):
        w.backend.start()
    w = World(tmp_path, replace(CONFIG, ipvs=IpvsSettings(scheduler="mh")))
    w.ipvs.schedulers = ("rr",)
    with pytest.raises(BackendError, match="scheduler 'mh'"):
        w.backend.start()
    assert w.ipvs.table == {}


def test_start_sets_upstreams_sysctls(tmp_path: Path) -> None:
    config = replace(CONFIG, ipvs=IpvsSettings(strict_arp=True, tcp_timeout=900, udp_timeout=30))
    for path, _ in sysctls(config, (4, 19)):
        (tmp_path / "sys" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "sys" / path).write_text("0\n")
    w = World(tmp_path, config)
    w.backend.release = "4.19.0-1-amd64"
    w.backend.start()
    read = {p: (tmp_path / "sys" / p).read_text().strip() for p, _ in sysctls(config, (4, 19))}
    assert read["net/ipv4/vs/conntrack"] == "1"
    assert read["net/ipv4/vs/conn_reuse_mode"] == "0"
    assert read["net/ipv4/conf/all/arp_announce"] == "2"
    assert w.ipvs.timeouts == (900, 120, 30)
    # conn_reuse_mode is left alone from 5.9 on (kubernetes#93297).
    assert "net/ipv4/vs/conn_reuse_mode" not in dict(sysctls(config, kernel_version("6.1.0")))


def test_cleanup_removes_only_ours(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.backend.start()
    w.backend.sync(snap((web(node_port=30080), eps("10.244.1.1"))), None)
    theirs = VirtualServer(ServiceKey("192.168.50.1", "TCP", 443))
    w.ipvs.add_service(theirs)
    removed = cleanup(w.ipvs, w.links, w.ipset, [w.iptables])
    assert set(w.ipvs.table) == {theirs.key}
    assert not w.links.exists(n.DUMMY_DEVICE)
    assert w.ipset.state == {}
    assert "KUBE-SERVICES" not in w.iptables.tables["nat"].chains
    assert any("ipvs service" in r for r in removed)


def test_render_prints_ipvsadm_ipset_and_iptables_inputs(tmp_path: Path) -> None:
    w = World(tmp_path)
    text = w.backend.render(snap((web(affinity_timeout=60), eps("10.244.1.1"))))
    assert "-A -t 10.96.0.10:80 -s rr -p 60\n" in text
    assert "-a -t 10.96.0.10:80 -r 10.244.1.1:8080 -m -w 1\n" in text
    assert "add KUBE-CLUSTER-IP 10.96.0.10,tcp:80\n" in text
    assert "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT" in text
    assert w.ipvs.calls == [] and w.links.calls == []


def test_render_puts_node_ports_on_the_node_objects_address(tmp_path: Path) -> None:
    """render describes the node the flags name: its NodePort virtual servers are on the
    Node object's primary IP, never on the addresses of the machine render runs on."""
    w = World(tmp_path)
    w.links.node = {"10.1.2.3", "127.0.0.1"}  # this machine: not node-a
    text = w.backend.render(snap((web(node_port=30080), eps("10.244.1.1"))))
    assert "-A -t 192.168.50.1:30080 -s rr\n" in text
    assert "10.1.2.3" not in text
    assert "add KUBE-NODE-PORT-TCP 30080\n" in text


# --------------------------------------------------------------- configuration


def test_the_ipvs_section_reaches_the_backend_and_bad_schedulers_are_refused() -> None:
    from kubeproxy import cli

    args = cli.build_parser().parse_args(
        ["run", "--proxy-mode", "ipvs", "--ipvs-scheduler", "mh", "--ipvs-strict-arp",
         "--ipvs-exclude-cidrs", "172.30.0.0/16", "--ipvs-tcp-timeout", "15m",
         "--manifests", "."]
    )  # fmt: skip
    cfg = cli.load_configuration(args)
    ipvs = cli.proxy_config(cfg, args).ipvs
    assert ipvs == IpvsSettings("mh", ("172.30.0.0/16",), True, 900, 0, 0)
    bad = cli.build_parser().parse_args(["run", "--proxy-mode", "ipvs", "--ipvs-scheduler", "x"])
    with pytest.raises(ConfigError, match=r"ipvs.scheduler: Invalid value: \"x\""):
        cli.load_configuration(bad)


def test_cleanup_without_traces_of_ipvs_mode_touches_nothing(tmp_path: Path) -> None:
    w = World(tmp_path)
    theirs = VirtualServer(ServiceKey("192.168.50.1", "TCP", 443))
    w.ipvs.add_service(theirs)
    before = w.iptables.dump()
    assert cleanup(w.ipvs, w.links, w.ipset, [w.iptables]) == []
    assert set(w.ipvs.table) == {theirs.key} and w.iptables.dump() == before
