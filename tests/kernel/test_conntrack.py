"""Stale UDP conntrack entries, for real: kubeproxy programs node-a, UDP clients keep one
socket (one source port) and keep sending, and the cleanup runs in node-a's namespace.

What the kernel does without cleanup is checked first in each test (the flow sticks to
what its conntrack entry says, whatever the new rules say); then the filters computed
from the sync's own tracker results are run with the real ``conntrack`` tool and the
flow moves. The sysctl test runs in a namespace of its own, so the timeouts it changes
touch nothing else.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.defaults import default_config
from kubeproxy.config.duration import Duration
from kubeproxy.config.runtime import ProxyConfig, conntrack_settings
from kubeproxy.dataplane.conntrack import (
    ConntrackCommand,
    Entry,
    FakeConntrack,
    Filter,
    apply,
    stale_conntrack_filters,
)
from kubeproxy.dataplane.nftables.runner import NftCommand
from kubeproxy.dataplane.sysctl import HASHSIZE, HOST_PROC, NETFILTER, apply_conntrack_sysctls
from kubeproxy.lab.cluster import CLUSTER_CIDRS, NODE, NODE_IP, REMOTE_NODE, Lab
from kubeproxy.lab.echo import tally, udp_ask
from kubeproxy.lab.netns import NetnsExecutor, add_netns, delete_netns, ns_exec
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, service
from kubeproxy.model.events import dispatch
from kubeproxy.model.state import ProxyState
from kubeproxy.model.types import IPFamily, L4Protocol
from kubeproxy.sources.manifests import ManifestSource
from tests.kernel.conftest import PODS, ip, wait_for

UDP = L4Protocol.UDP
DNS = {"name": "dns", "port": 53, "protocol": "UDP"}
DNS_TARGET = {"name": "dns", "port": 8080, "protocol": "UDP"}


class Tracked:
    """A sync without the conntrack phase: the manifests go through ManifestSource,
    ProxyState and the nftables backend into node-a, and the filters the sync would run
    come back from the real tracker results, for the test to apply (or not)."""

    def __init__(self, lab: Lab, manifests: ManifestDir) -> None:
        self.source = ManifestSource(manifests.path)
        self.state = ProxyState(NODE)
        config = ProxyConfig(
            hostname=NODE, cluster_cidrs=CLUSTER_CIDRS, families=(IPFamily.IPv4, IPFamily.IPv6)
        )
        self.backend = NftablesBackend(config, NftCommand(netns=lab.node_ns))

    def sync(self) -> list[Filter]:
        dispatch(self.state, self.source.reload())
        snapshot, changes = self.state.collect()
        self.backend.sync(snapshot, None)
        return stale_conntrack_filters(
            snapshot.services,
            snapshot.endpoints,
            changes.services,
            changes.endpoints,
            IPFamily.IPv4,
        )


def udp_client(lab: Lab, ns: str) -> socket.socket:
    """One UDP socket in ``ns``; every ask below sends from its one source port."""

    def make() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("0.0.0.0", 0))
        return sock

    return lab.executor(ns).call(make)


def ask(
    lab: Lab, ns: str, sock: socket.socket, addr: str, port: int, *, count: int = 5
) -> dict[str, int]:
    return lab.executor(ns).call(tally, udp_ask, addr, port, 0.5, sock, count=count)


def clean(lab: Lab, filters: list[Filter]) -> int:
    result = lab.executor(lab.node_ns).call(apply, ConntrackCommand(), filters)
    assert result.failed == []
    return result.deleted


def eps(*pods: str) -> list[Ep]:
    return [Ep(ip(p), node=PODS[p][0]) for p in pods]


@pytest.fixture
def client_socket(lab: Lab) -> Iterator[socket.socket]:
    sock = udp_client(lab, lab.pods["client"].netns)
    yield sock
    sock.close()


def test_a_udp_flow_leaves_a_removed_endpoint_only_once_conntrack_is_cleared(
    lab: Lab, manifests: ManifestDir, client_socket: socket.socket
) -> None:
    tracked = Tracked(lab, manifests)
    manifests.write(
        "dns.yaml",
        service("dns", "10.96.7.1", [DNS]),
        endpoint_slice("dns", eps("local-1"), [DNS_TARGET]),
    )
    tracked.sync()
    client_ns = lab.pods["client"].netns
    assert ask(lab, client_ns, client_socket, "10.96.7.1", 53) == {"local-1": 5}

    manifests.write(
        "dns.yaml",
        service("dns", "10.96.7.1", [DNS]),
        endpoint_slice("dns", eps("local-2"), [DNS_TARGET]),
    )
    filters = tracked.sync()
    # The rules now say local-2, but the flow's conntrack entry still says local-1 (whose
    # Pod is still there and answering).
    assert ask(lab, client_ns, client_socket, "10.96.7.1", 53) == {"local-1": 5}
    # A new flow already follows the rules.
    fresh = udp_client(lab, client_ns)
    try:
        assert ask(lab, client_ns, fresh, "10.96.7.1", 53, count=2) == {"local-2": 2}
    finally:
        fresh.close()

    assert filters == [Filter.for_nat("10.96.7.1", ip("local-1"), UDP, 53, endpoint_port=8080)]
    assert clean(lab, filters) == 1
    assert ask(lab, client_ns, client_socket, "10.96.7.1", 53) == {"local-2": 5}


def test_a_udp_nodeport_flow_from_outside_moves_after_cleanup(
    lab: Lab, manifests: ManifestDir
) -> None:
    tracked = Tracked(lab, manifests)

    def objects(*pods: str) -> tuple[dict[str, object], ...]:
        return (
            service("dns-np", "10.96.7.2", [{**DNS, "nodePort": 30053}], type="NodePort"),
            endpoint_slice("dns-np", eps(*pods), [DNS_TARGET]),
        )

    manifests.write("dns.yaml", *objects("remote-1"))
    tracked.sync()
    sock = udp_client(lab, lab.client_ns)
    try:
        assert ask(lab, lab.client_ns, sock, NODE_IP, 30053) == {"remote-1": 5}
        manifests.write("dns.yaml", *objects("remote-2"))
        filters = tracked.sync()
        assert ask(lab, lab.client_ns, sock, NODE_IP, 30053) == {"remote-1": 5}

        assert Filter.for_port_nat(30053, ip("remote-1"), UDP, endpoint_port=8080) in filters
        assert clean(lab, filters) == 1
        assert ask(lab, lab.client_ns, sock, NODE_IP, 30053) == {"remote-2": 5}
    finally:
        sock.close()
    assert PODS["remote-2"][0] == REMOTE_NODE


def test_a_flow_cached_before_the_service_had_endpoints_is_natted_after_cleanup(
    lab: Lab, manifests: ManifestDir, client_socket: socket.socket
) -> None:
    tracked = Tracked(lab, manifests)
    tracked.sync()  # no Service yet: nothing DNATs 10.96.7.3
    client_ns = lab.pods["client"].netns
    before = ask(lab, client_ns, client_socket, "10.96.7.3", 53, count=2)
    assert "local-1" not in before, before

    manifests.write(
        "dns.yaml",
        service("dns-late", "10.96.7.3", [DNS]),
        endpoint_slice("dns-late", eps("local-1"), [DNS_TARGET]),
    )
    filters = tracked.sync()
    # The flow's entry was made without NAT, and keeps the flow away from the endpoint.
    stuck = ask(lab, client_ns, client_socket, "10.96.7.3", 53, count=2)
    assert "local-1" not in stuck, stuck

    # Not NATed: the Service IP itself is the entry's reply source.
    assert filters == [Filter.for_nat("10.96.7.3", "10.96.7.3", UDP, 53)]
    assert clean(lab, filters) >= 1
    assert ask(lab, client_ns, client_socket, "10.96.7.3", 53) == {"local-1": 5}


def test_the_running_proxy_clears_stale_entries_itself(
    lab: Lab, manifests: ManifestDir, client_socket: socket.socket
) -> None:
    # The same story through `kubeproxy run`: the sync's conntrack phase does the cleanup.
    manifests.write(
        "dns.yaml",
        service("dns-live", "10.96.7.4", [DNS]),
        endpoint_slice("dns-live", eps("local-1"), [DNS_TARGET]),
    )
    proc = lab.start(manifests.path)
    try:
        client_ns = lab.pods["client"].netns
        wait_for(
            lambda: ask(lab, client_ns, client_socket, "10.96.7.4", 53, count=1) == {"local-1": 1}
        )
        manifests.write(
            "dns.yaml",
            service("dns-live", "10.96.7.4", [DNS]),
            endpoint_slice("dns-live", eps("local-2"), [DNS_TARGET]),
        )
        # Same socket, same source port: it moves only because the entry was deleted.
        wait_for(
            lambda: ask(lab, client_ns, client_socket, "10.96.7.4", 53, count=1) == {"local-2": 1}
        )
    finally:
        proc.terminate()
        proc.wait(10)


def conntrack_ids(lab: Lab, cluster_ip: str) -> dict[str, str]:
    """The UDP entries to ``cluster_ip`` in node-a's table: reply source -> entry id (a
    deleted entry comes back, from the flow's next packet, with another id)."""
    text = ns_exec(
        lab.node_ns, "conntrack", "-L", "-p", "udp", "--orig-dst", cluster_ip, "-o", "id",
        check=False,
    )  # fmt: skip
    out = {}
    for line in text.splitlines():
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        srcs = [w.split("=", 1)[1] for w in line.split() if w.startswith("src=")]
        if "id" in words and len(srcs) == 2:
            out[srcs[1]] = words["id"]
    return out


def test_a_restart_keeps_flows_to_serving_endpoints_and_clears_the_stale_ones(
    lab: Lab, manifests: ManifestDir
) -> None:
    """Upstream's reconciler, at the first sync: the flow to an endpoint that still
    serves keeps its conntrack entry across the restart (no UDP flow breaks); the flow
    to an endpoint removed while no proxy ran is cleared, and moves."""

    def write(stale: str) -> None:
        manifests.write(
            "dns.yaml",
            service("dns-keep", "10.96.7.5", [DNS]),
            endpoint_slice("dns-keep", eps("local-1"), [DNS_TARGET]),
            service("dns-move", "10.96.7.6", [DNS]),
            endpoint_slice("dns-move", eps(stale), [DNS_TARGET]),
        )

    client_ns = lab.pods["client"].netns
    keep, move = udp_client(lab, client_ns), udp_client(lab, client_ns)
    try:
        write("local-1")
        lab.sync_once(manifests.path)
        assert ask(lab, client_ns, keep, "10.96.7.5", 53) == {"local-1": 5}
        assert ask(lab, client_ns, move, "10.96.7.6", 53) == {"local-1": 5}
        before = conntrack_ids(lab, "10.96.7.5")
        assert list(before) == [ip("local-1")]
        write("local-2")  # while no proxy runs
        assert lab.sync_once(manifests.path).returncode == 0
        assert conntrack_ids(lab, "10.96.7.5") == before
        assert ask(lab, client_ns, keep, "10.96.7.5", 53) == {"local-1": 5}
        assert conntrack_ids(lab, "10.96.7.5") == before
        assert ask(lab, client_ns, move, "10.96.7.6", 53) == {"local-2": 5}
    finally:
        keep.close()
        move.close()


# ------------------------------------------------------------- the tool vs the fake

# Addresses and ports no other test uses, so flows of earlier tests never match.
ENTRIES = [
    # (orig src, orig dst, sport, dport, reply src)
    ("10.250.0.100", "10.96.250.1", 41000, 53, "10.250.1.5"),
    ("10.250.0.100", "10.96.250.1", 41001, 53, "10.250.1.6"),
    ("10.250.0.100", "10.96.250.1", 41002, 54, "10.250.1.5"),
    ("10.250.0.100", "192.168.250.1", 41003, 32053, "10.250.1.5"),
    ("10.250.0.100", "192.168.250.1", 41004, 32054, "10.250.1.5"),
    ("10.250.0.100", "10.96.250.2", 41005, 53, "10.96.250.2"),
    ("fd00:250::100", "fd00:96:250::1", 41006, 53, "fd00:250:1::5"),
    ("fd00:250::100", "fd00:250::1", 41007, 32053, "fd00:250:1::5"),
]


def listed(lab: Lab) -> set[tuple[str, str, int, int, str]]:
    """The UDP entries above still in node-a's table, from ``conntrack -L``."""
    out = set()
    for family in ("ipv4", "ipv6"):
        text = ns_exec(lab.node_ns, "conntrack", "-L", "-f", family, "-p", "udp", check=False)
        for line in text.splitlines():
            fields: dict[str, str] = {}
            for key, _, value in (word.partition("=") for word in line.split()):
                fields.setdefault(key, value)  # the original direction comes first
            row = (fields.get("src"), fields.get("dst"), fields.get("sport"), fields.get("dport"))
            for entry in ENTRIES:
                if row == (entry[0], entry[1], str(entry[2]), str(entry[3])):
                    out.add(entry)
    return out


def as_entry(src: str, dst: str, sport: int, dport: int, reply: str) -> Entry:
    family = IPFamily.IPv6 if ":" in src else IPFamily.IPv4
    return Entry(family, UDP, src, dst, sport, dport, reply, dport)


def insert(lab: Lab) -> None:
    for src, dst, sport, dport, reply in ENTRIES:
        ns_exec(
            lab.node_ns,
            "conntrack", "-I", "-p", "udp", "-t", "120",
            "-s", src, "-d", dst, "--sport", str(sport), "--dport", str(dport),
            "-r", reply, "-q", src, "--reply-port-src", str(dport), "--reply-port-dst", str(sport),
        )  # fmt: skip


@pytest.mark.parametrize(
    "flt",
    [
        Filter.for_ip("10.96.250.1", UDP),
        Filter.for_ip("10.96.250.1", UDP, 53),
        Filter.for_port(32053, IPFamily.IPv4, UDP),
        Filter.for_port(32053, IPFamily.IPv6, UDP),
        Filter.for_nat("10.96.250.1", "10.250.1.5", UDP, 53),
        Filter.for_nat("10.96.250.1", "10.250.1.5", UDP),
        Filter.for_port_nat(32053, "10.250.1.5", UDP),
        Filter.for_nat("fd00:96:250::1", "fd00:250:1::5", UDP, 53),
        Filter.for_ip("10.96.250.9", UDP),
        # The endpoint's port too (the entries' reply source port is their dport).
        Filter.for_nat("10.96.250.1", "10.250.1.5", UDP, 53, endpoint_port=53),
        Filter.for_nat("10.96.250.1", "10.250.1.5", UDP, 53, endpoint_port=54),
        Filter.for_port_nat(32053, "10.250.1.5", UDP, endpoint_port=32053),
        Filter.for_nat("10.96.250.2", "10.96.250.2", UDP, 53),
    ],
    ids=str,
)
def test_the_tool_and_the_fake_delete_the_same_entries(lab: Lab, flt: Filter) -> None:
    insert(lab)
    try:
        assert listed(lab) == set(ENTRIES)
        deleted = lab.executor(lab.node_ns).call(ConntrackCommand().clear, flt)
        remaining = listed(lab)
        fake = FakeConntrack([as_entry(*e) for e in ENTRIES])
        assert deleted == fake.clear(flt) == len(ENTRIES) - len(remaining)
        assert remaining == {
            (e.orig_src, e.orig_dst, e.orig_src_port, e.orig_dst_port, e.reply_src)
            for e in fake.table
        }
    finally:
        for src, dst, *_ in ENTRIES:
            ns_exec(lab.node_ns, "conntrack", "-D", "-p", "udp", "-s", src, "-d", dst, check=False)


# ----------------------------------------------------------------------- sysctls


def test_conntrack_sysctls_in_a_network_namespace(lab: Lab, tmp_path: Path) -> None:
    name = f"{lab.prefix}-sysctl"
    host_max = int(Path("/proc/sys/net/netfilter/nf_conntrack_max").read_text())
    host_udp = Path("/proc/sys/net/netfilter/nf_conntrack_udp_timeout").read_text()
    # A fake /sys: the hash table size is global, a test must never resize the host's.
    hashsize = tmp_path / "sys" / HASHSIZE
    hashsize.parent.mkdir(parents=True)
    hashsize.write_text("1024\n")
    cfg = default_config().conntrack
    cfg = type(cfg)(
        **{
            **cfg.__dict__,
            "min": host_max + 4096,  # a different nf_conntrack_max than the host's
            "tcp_be_liberal": True,
            "udp_timeout": Duration.of_seconds(45),
        }
    )
    add_netns(name)
    executor = NetnsExecutor(name, workers=1)

    def inside(key: str) -> str:
        return ns_exec(name, "cat", f"/proc/{NETFILTER}/{key}").strip()

    try:
        # A new namespace starts from the kernel's defaults (close_wait 60s, not 1h).
        close_wait = (
            "unchanged" if inside("nf_conntrack_tcp_timeout_close_wait") == "3600" else "set"
        )
        first = executor.call(
            apply_conntrack_sysctls,
            conntrack_settings(cfg),
            # The executor's thread is in the namespace: its /proc/sys/net is the
            # namespace's own.
            proc_root=HOST_PROC,
            sys_root=tmp_path / "sys",
        )
        outcomes = {r.path.rsplit("/", 1)[-1]: r.outcome for r in first}
        # nf_conntrack_max is global and read-only outside the initial namespace:
        # reported, not fatal; the per-namespace timeouts are set.
        assert outcomes == {
            "nf_conntrack_max": "failed",
            "nf_conntrack_tcp_timeout_established": "set",
            "nf_conntrack_tcp_timeout_close_wait": close_wait,
            "nf_conntrack_tcp_be_liberal": "set",
            "nf_conntrack_udp_timeout": "set",
        }
        assert hashsize.read_text() == "1024\n"  # not grown: the max was not set
        assert inside("nf_conntrack_tcp_timeout_established") == "86400"
        assert inside("nf_conntrack_tcp_timeout_close_wait") == "3600"
        assert inside("nf_conntrack_tcp_be_liberal") == "1"
        assert inside("nf_conntrack_udp_timeout") == "45"
        again = executor.call(
            apply_conntrack_sysctls,
            conntrack_settings(cfg),
            # The executor's thread is in the namespace: its /proc/sys/net is the
            # namespace's own.
            proc_root=HOST_PROC,
            sys_root=tmp_path / "sys",
        )
        assert [r.outcome for r in again] == ["failed"] + ["unchanged"] * 4
    finally:
        executor.shutdown()
        delete_netns(name)
    assert int(Path("/proc/sys/net/netfilter/nf_conntrack_max").read_text()) == host_max
    assert Path("/proc/sys/net/netfilter/nf_conntrack_udp_timeout").read_text() == host_udp
    assert os.path.exists("/proc/sys/net/netfilter")
