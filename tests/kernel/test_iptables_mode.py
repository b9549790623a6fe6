"""iptables mode's own behaviour, through real packets and real iptables (both flavours).

The packet tests shared with nftables mode (test_traffic, test_features,
test_detect_local) run in every mode; here is what only iptables mode does: NodePorts on
127.0.0.1 and on every local address by default, upstream's chain names, partial syncs
that end where a full sync would, the canary, and cleanup.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings

from kubeproxy.backends.iptables.diff import differing
from kubeproxy.backends.iptables.names import is_generated
from kubeproxy.backends.iptables.proxier import IptablesBackend, _canonical, cleanup
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.iptables.listing import parse_save
from kubeproxy.dataplane.iptables.runner import Flavor, IptablesCommand
from kubeproxy.dataplane.nfacct import NfacctCommand
from kubeproxy.lab.cluster import NODE_IP, Lab
from kubeproxy.lab.echo import Reply, tally, tcp_ask
from kubeproxy.lab.netns import add_netns, delete_netns, list_netns, ns_exec
from kubeproxy.lab.objects import ManifestDir, endpoint_slice, service
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import Endpoint, IPFamily, L4Protocol, ServicePort, TrafficPolicy
from tests.kernel.conftest import HTTP, eps, proc_of, sync
from tests.partial_sync_machine import CONFIG, NODE, PartialVersusFull, port_name

PROXY_MODES = ("iptables-nft", "iptables-legacy")


def flavor(lab: Lab) -> Flavor:
    return "legacy" if lab.mode == "iptables-legacy" else "nft"


def save(ns: str, flavor: str, family: int = 4) -> str:
    tool = f"ip{'6' if family == 6 else ''}tables-{flavor}-save"
    return ns_exec(ns, tool)


def listing(text: str) -> list[str]:
    """An iptables-save listing as state: sorted lines, without counters and comments."""
    lines = (re.sub(r"\[\d+:\d+\]", "", line) for line in text.splitlines())
    return sorted(line for line in lines if not line.startswith("#"))


def nodeport(lab: Lab, manifests: ManifestDir, port: int) -> None:
    manifests.write(
        "svc.yaml",
        service("np", "10.96.50.1", [{**HTTP, "nodePort": port}], type="NodePort"),
        endpoint_slice("np", eps("local-1")),
    )


def test_nodeports_answer_on_localhost_and_every_local_address(
    lab: Lab, manifests: ManifestDir
) -> None:
    nodeport(lab, manifests, 30900)
    sync(lab, manifests)
    node = lab.executor(lab.node_ns)
    # iptables mode's default --nodeport-addresses: every local address.
    assert node.call(tally, tcp_ask, NODE_IP, 30900, count=2) == {"local-1": 2}
    assert node.call(tally, tcp_ask, "192.168.60.1", 30900, count=2) == {"local-1": 2}
    # 127.0.0.1 too (localhostNodePorts, masqueraded: the endpoint cannot answer 127.0.0.1).
    reply: Reply = node.call(tcp_ask, "127.0.0.1", 30900)
    assert reply.pod == "local-1" and reply.client_ip != "127.0.0.1"
    assert ns_exec(lab.node_ns, "cat", "/proc/sys/net/ipv4/conf/all/route_localnet").strip() == "1"
    rules = save(lab.node_ns, flavor(lab))
    assert "block incoming localnet connections" in rules
    # Counted as upstream counts them, for its localhost NodePort metric.
    assert re.search(r"-d 127.0.0.0/8 .*--nfacct-name +localhost_nps_accepted_pkts", rules)
    assert re.search(r"--ctstate INVALID -m nfacct --nfacct-name +ct_state_invalid", rules)
    assert NfacctCommand(lab.node_ns).packets()["localhost_nps_accepted_pkts"] >= 1
    # Never on ::1.
    assert node.call(tally, tcp_ask, "::1", 30900, 0.5, count=1) != {"local-1": 1}


def test_nodeport_addresses_without_loopback_leave_route_localnet_alone(
    lab: Lab, manifests: ManifestDir
) -> None:
    """CVE-2020-8558: with --nodeport-addresses excluding 127.0.0.0/8 nothing needs
    route_localnet, and upstream does not set it: the node's NodePorts still answer on
    its own address, never on 127.0.0.1."""
    nodeport(lab, manifests, 30902)
    ns_exec(lab.node_ns, "sysctl", "-qw", "net.ipv4.conf.all.route_localnet=0")
    sync(lab, manifests, "--nodeport-addresses", f"{NODE_IP}/32")
    assert ns_exec(lab.node_ns, "cat", "/proc/sys/net/ipv4/conf/all/route_localnet").strip() == "0"
    node = lab.executor(lab.node_ns)
    assert node.call(tally, tcp_ask, NODE_IP, 30902, count=2) == {"local-1": 2}
    assert node.call(tally, tcp_ask, "127.0.0.1", 30902, 0.5, count=1) != {"local-1": 1}


def test_localhost_nodeports_can_be_turned_off(lab: Lab, manifests: ManifestDir) -> None:
    nodeport(lab, manifests, 30901)
    sync(lab, manifests, "--iptables-localhost-nodeports=false")
    node = lab.executor(lab.node_ns)
    assert node.call(tally, tcp_ask, NODE_IP, 30901, count=2) == {"local-1": 2}
    assert node.call(tally, tcp_ask, "127.0.0.1", 30901, 0.5, count=2) != {"local-1": 2}


def test_upstream_chain_names_and_comments(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        service("svc1", "10.96.51.1", [{"name": "p80", "port": 80}], namespace="ns1"),
        endpoint_slice("svc1", eps("local-1"), [{"name": "p80", "port": 8080}], namespace="ns1"),
    )
    sync(lab, manifests)
    rules = save(lab.node_ns, flavor(lab))
    # The chain upstream kube-proxy gives ns1/svc1:p80 (its own tests' golden value).
    assert ":KUBE-SVC-XPGD46QRK7WJZT7O" in rules
    assert re.search(r'--comment "ns1/svc1:p80 cluster IP".*-j KUBE-SVC-XPGD46QRK7WJZT7O', rules)
    assert re.search(r"-A KUBE-SEP-\w+ .*-j DNAT --to-destination 10.244.1.10:8080", rules)


# ------------------------------------------------------- partial syncs, kernel truth


class OnTheKernel(PartialVersusFull):
    """Partial syncs into one namespace, fresh full syncs into another: the same
    ``iptables-save`` (counters aside) after every step."""

    lab: ClassVar[Lab]
    flavor: ClassVar[Flavor]

    def __init__(self) -> None:
        super().__init__()
        self.procs: list[Path] = []

    def backend(self, role: str) -> Any:
        ns = f"{self.lab.prefix}-{role}"
        delete_netns(ns)
        add_netns(ns)
        config = replace(CONFIG, mode=ProxyMode.IPTABLES)
        runners = {f: IptablesCommand(f, self.flavor, netns=ns) for f in config.families}
        proc = proc_of(ns, Path(tempfile.mkdtemp(prefix=f"{ns}-proc-")))
        self.procs.append(proc)
        backend = IptablesBackend(config, runners, proc=proc)
        backend.start()
        return backend

    def state(self, backend: Any) -> object:
        return [
            (family, listing(runner.save("filter") + runner.save("nat")))
            for family, runner in sorted(backend.runners.items())
        ]

    def teardown(self) -> None:
        for role in ("partial", "full"):
            delete_netns(f"{self.lab.prefix}-{role}")
        for proc in self.procs:
            shutil.rmtree(proc, ignore_errors=True)


class OnIptablesNft(OnTheKernel):
    flavor = "nft"


class OnIptablesLegacy(OnTheKernel):
    flavor = "legacy"


def test_partial_syncs_match_a_full_sync(lab: Lab) -> None:
    machine: type[OnTheKernel] = OnIptablesNft if flavor(lab) == "nft" else OnIptablesLegacy
    machine.lab = lab
    settings(
        max_examples=8,
        stateful_step_count=8,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )(machine).TestCase().runTest()
    ours = (f"{lab.prefix}-partial", f"{lab.prefix}-full")
    assert not [n for n in list_netns() if n in ours]


# ------------------------------------------------------------- canary and cleanup


@pytest.fixture
def scratch(lab: Lab) -> Any:
    ns = f"{lab.prefix}-scratch"
    delete_netns(ns)
    add_netns(ns)
    yield ns
    delete_netns(ns)


def test_canary_notices_flushed_tables_and_a_full_sync_repairs(
    lab: Lab, scratch: str, tmp_path: Path
) -> None:
    config = ProxyConfig(hostname="node-a", mode=ProxyMode.IPTABLES, families=(IPFamily.IPv4,))
    runner = IptablesCommand(IPFamily.IPv4, flavor(lab), netns=scratch)
    backend = IptablesBackend(config, {IPFamily.IPv4: runner}, proc=proc_of(scratch, tmp_path))
    backend.start()
    svc = ServicePort(name=port_name(0), cluster_ips=("10.96.52.1",), port=80)
    snap = Snapshot({svc.name: svc}, {svc.name: (Endpoint("10.244.1.10", 8080, "node-a"),)}, NODE)
    backend.sync(snap, None)
    assert backend.check() is None
    before = runner.save("nat")
    # What a firewall reload does.
    for table in ("mangle", "nat", "filter"):
        ns_exec(scratch, f"iptables-{flavor(lab)}", "-t", table, "-F")
        ns_exec(scratch, f"iptables-{flavor(lab)}", "-t", table, "-X")
    assert backend.check() is not None
    assert backend.sync(snap, None).full
    assert backend.check() is None
    assert listing(runner.save("nat")) == listing(before)


def test_cleanup_removes_our_chains_in_both_flavours_and_nothing_else(
    lab: Lab, scratch: str, tmp_path: Path
) -> None:
    config = ProxyConfig(hostname="node-a", mode=ProxyMode.IPTABLES, families=(IPFamily.IPv4,))
    svc = ServicePort(name=port_name(0), cluster_ips=("10.96.53.1",), port=80)
    snap = Snapshot({svc.name: svc}, {svc.name: (Endpoint("10.244.1.10", 8080, "node-a"),)}, NODE)
    flavors: tuple[Flavor, ...] = ("nft", "legacy")
    for fl in flavors:
        runner = IptablesCommand(IPFamily.IPv4, fl, netns=scratch)
        backend = IptablesBackend(
            replace(config, localhost_nodeports=True),
            {IPFamily.IPv4: runner},
            proc=proc_of(scratch, tmp_path / fl),
        )
        backend.start()
        backend.sync(snap, None)
        ns_exec(scratch, f"iptables-{fl}", "-N", "MY-CHAIN")
        ns_exec(scratch, f"iptables-{fl}", "-A", "INPUT", "-j", "MY-CHAIN")
    removed = cleanup(netns=scratch)
    assert any("KUBE-SVC-" in r for r in removed)
    for fl in ("nft", "legacy"):
        left = save(scratch, fl) + ns_exec(scratch, f"iptables-{fl}-save", "-t", "nat")
        assert "KUBE-SVC-" not in left and "KUBE-SERVICES" not in left
        assert "MY-CHAIN" in left


def test_a_service_iptables_refuses_is_left_out_and_the_rest_programmed(
    lab: Lab, scratch: str, tmp_path: Path
) -> None:
    """A NodePort above 65535 (the parser never lets one through; the model object is
    built directly) stands for any ServicePort whose rules iptables refuses."""
    config = ProxyConfig(hostname="node-a", mode=ProxyMode.IPTABLES, families=(IPFamily.IPv4,))
    runner = IptablesCommand(IPFamily.IPv4, flavor(lab), netns=scratch)
    backend = IptablesBackend(config, {IPFamily.IPv4: runner}, proc=proc_of(scratch, tmp_path))
    backend.start()
    good = ServicePort(name=port_name(0), cluster_ips=("10.96.54.1",), port=80)
    bad = ServicePort(name=port_name(1), cluster_ips=("10.96.54.2",), port=80, node_port=70000)
    eps_ = (Endpoint("10.244.1.10", 8080, "node-a"),)
    snap = Snapshot({good.name: good, bad.name: bad}, {good.name: eps_, bad.name: eps_}, NODE)
    result = backend.sync(snap, None)
    assert [line.split(" (")[0] for line in result.isolated] == [str(bad.name)]
    rules = runner.save("nat")
    assert "10.96.54.1" in rules and "10.96.54.2" not in rules


# ------------------------------------------- full syncs diffed against iptables-save


def rich_snapshot(changed: bool = False) -> Snapshot:
    """Dual-stack ServicePorts using every rule shape iptables mode writes (affinity,
    NodePort, external and LB IPs with source ranges, both Local policies, no
    endpoints), so the canonical comparison is checked against each real flavour."""
    ep = (
        Endpoint("10.244.1.10", 8080, "node-a"),
        Endpoint("10.244.2.10", 8080, "node-b"),
        Endpoint("fd00:10:244:1::10", 8080, "node-a"),
    )
    ports = [
        ServicePort(
            name=port_name(0),
            cluster_ips=("10.96.55.1", "fd00:10:96::55:1"),
            port=80,
            node_port=30955,
            external_ips=("203.0.113.55",),
            load_balancer_ips=("198.51.100.55", "2001:db8::55"),
            load_balancer_source_ranges=("10.0.0.0/8", "2001:db8::/32"),
            affinity_timeout=120,
            external_traffic_policy=TrafficPolicy.LOCAL,
            health_check_node_port=31955,
        ),
        ServicePort(
            name=port_name(1, L4Protocol.UDP),
            cluster_ips=("10.96.55.2",),
            port=53,
            internal_traffic_policy=TrafficPolicy.LOCAL,
        ),
        ServicePort(name=port_name(2), cluster_ips=("10.96.55.3",), port=80, node_port=30956),
        ServicePort(name=port_name(3), cluster_ips=("10.96.55.4",), port=443),
    ]
    endpoints = {
        ports[0].name: ep,
        ports[1].name: (Endpoint("10.244.2.11", 5353, "node-b"),),  # none local: DROP
        ports[2].name: (),  # no endpoints: REJECT
        ports[3].name: ep[:1],
    }
    if changed:  # while the proxy was down: one Service gone, one with other endpoints
        del endpoints[ports[3].name]
        ports.pop()
        endpoints[ports[0].name] = (Endpoint("10.244.1.12", 8080, "node-a"),)
    return Snapshot({p.name: p for p in ports}, endpoints, NODE)


def dual_backend(ns: str, fl: Flavor, proc: Path) -> IptablesBackend:
    config = replace(CONFIG, mode=ProxyMode.IPTABLES)
    runners = {f: IptablesCommand(f, fl, netns=ns) for f in config.families}
    backend = IptablesBackend(config, runners, proc=proc_of(ns, proc))
    backend.start()
    return backend


def chains_written(backend: IptablesBackend) -> list[str]:
    lines = backend.last_restore.splitlines()
    return [line.split()[0][1:] for line in lines if line.startswith(":")]


def per_service(chains: list[str]) -> list[str]:
    return [c for c in chains if is_generated(c)]


def both_families(backend: IptablesBackend) -> list[tuple[IPFamily, list[str]]]:
    return [
        (family, listing(runner.save("filter") + runner.save("nat")))
        for family, runner in sorted(backend.runners.items())
    ]


def test_after_a_full_sync_iptables_save_lists_every_chain_as_we_compare_it(
    lab: Lab, scratch: str, tmp_path: Path
) -> None:
    backend = dual_backend(scratch, flavor(lab), tmp_path)
    snap = rich_snapshot()
    backend.sync(snap, None)
    plans = backend._fams(backend.plan(snap))
    assert [fam.family for fam in plans] == sorted(backend.runners)
    for fam in plans:
        runner = backend.runners[fam.family]
        state, desired = backend._build(backend.plan(snap), fam)
        canonical = _canonical(runner, state.settings)
        for table, chains in desired.chains.items():
            assert len(chains) > 3
            saved = parse_save(runner.save(table))
            assert differing(chains.items(), saved, canonical) == set()
            if table == "nat":  # and the ServicePorts' own chains
                assert differing(desired.own(), saved, canonical) == set()
            # The runner's own listing (nft: -S lines through iptables-nft-restore).
            assert runner.rules(table, runner.chains(table)) == saved


def test_a_restart_over_an_identical_table_writes_no_per_service_chain(
    lab: Lab, scratch: str, tmp_path: Path
) -> None:
    snap = rich_snapshot()
    dual_backend(scratch, flavor(lab), tmp_path).sync(snap, None)
    restarted = dual_backend(scratch, flavor(lab), tmp_path)
    before = both_families(restarted)
    assert restarted.sync(snap, None).full
    assert both_families(restarted) == before
    assert chains_written(restarted) and per_service(chains_written(restarted)) == []


def test_a_full_sync_repairs_a_chain_changed_by_hand(
    lab: Lab, scratch: str, tmp_path: Path
) -> None:
    backend = dual_backend(scratch, flavor(lab), tmp_path)
    snap = rich_snapshot()
    backend.sync(snap, None)
    before = both_families(backend)
    nat = backend.runners[IPFamily.IPv4].save("nat")
    sep = re.findall(r"^:(KUBE-SEP-\w+)", nat, re.MULTILINE)[0]
    svc = re.findall(r"^:(KUBE-SVC-\w+)", nat, re.MULTILINE)[0]
    tool = f"iptables-{flavor(lab)}"
    ns_exec(scratch, tool, "-t", "nat", "-D", sep, "1")  # a rule deleted by hand
    ns_exec(scratch, tool, "-t", "nat", "-A", svc, "-j", "RETURN")  # and one added
    assert both_families(backend) != before
    backend.sync(snap, None)
    assert both_families(backend) == before
    assert sorted(per_service(chains_written(backend))) == sorted([sep, svc])


def test_a_restart_rewrites_what_changed_while_down_and_deletes_stale_chains(
    lab: Lab, scratch: str, tmp_path: Path
) -> None:
    dual_backend(scratch, flavor(lab), tmp_path).sync(rich_snapshot(), None)
    changed = rich_snapshot(changed=True)
    restarted = dual_backend(scratch, flavor(lab), tmp_path)
    restarted.sync(changed, None)
    assert "-X KUBE-SEP-" in restarted.last_restore and "-X KUBE-SVC-" in restarted.last_restore
    # Exactly what a full sync of the changed Services into an empty namespace holds.
    fresh_ns = f"{lab.prefix}-fresh"
    delete_netns(fresh_ns)
    add_netns(fresh_ns)
    try:
        fresh = dual_backend(fresh_ns, flavor(lab), tmp_path / "fresh")
        fresh.sync(changed, None)
        assert both_families(restarted) == both_families(fresh)
    finally:
        delete_netns(fresh_ns)
