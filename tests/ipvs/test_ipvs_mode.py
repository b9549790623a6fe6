"""ipvs mode's backend against a real IPVS kernel (inside the user-mode-linux guest):
virtual servers, ipsets and iptables-legacy rules programmed in node-a's namespace over
netlink, ipset and iptables-restore, and real TCP from the outside client and from Pods.
"""

from __future__ import annotations

import socket
import struct
import time
from collections import Counter
from pathlib import Path

import pytest

from kubeproxy.backends.ipvs.proxier import IpvsBackend, cleanup
from kubeproxy.dataplane.ipset import IpsetCommand
from kubeproxy.dataplane.iptables.runner import IptablesCommand
from kubeproxy.dataplane.ipvs import ServiceKey, VirtualServer
from kubeproxy.dataplane.ipvs.netlink import NetlinkLinks
from kubeproxy.lab.cluster import CLIENT_IP, CLUSTER_CIDRS, NODE, NODE_IP, NODE_IP6, Lab
from kubeproxy.lab.connects import NO_ANSWER, ConnectProbe
from kubeproxy.lab.echo import tcp_ask, udp_ask
from kubeproxy.lab.netns import ns_exec
from kubeproxy.lab.netns import sysctls as set_sysctls
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, service
from kubeproxy.model.types import IPFamily, L4Protocol, ServicePort, TrafficPolicy
from tests.ipvs.conftest import (
    B1,
    B2,
    BACKENDS,
    VIP,
    WEB,
    Build,
    asks,
    cleanup_ns,
    config,
    eps,
    hold,
    snap,
    until_listening,
    web,
)
from tests.unit.conftest import port_name


def test_cluster_ip_round_robin_and_off_cluster_clients_are_masqueraded(
    lab: Lab, make: Build
) -> None:
    backend = make(config())
    result = backend.sync(snap((web(), eps(B1, B2))), None)
    assert not backend.errors and result.full
    replies = [lab.executor(lab.client_ns).call(tcp_ask, VIP, 80) for _ in range(10)]
    assert Counter(r.pod for r in replies) == {"backend-1": 5, "backend-2": 5}
    # The client is outside the cluster CIDR: KUBE-CLUSTER-IP marks it for masquerade.
    assert CLIENT_IP not in {r.client_ip for r in replies}
    # A Pod's own traffic keeps its address (and a Pod reaching itself is hairpinned).
    from_pod = lab.in_pod("backend-1").call(tcp_ask, VIP, 80)
    assert from_pod.client_ip in (B1, "10.244.1.1")
    links = ns_exec(lab.node_ns, "ip", "-o", "link", "show", "kube-ipvs0")
    assert "UP" not in links.split("<", 1)[1].split(">", 1)[0].split(",")


def test_node_port_answers_on_the_node_address(lab: Lab, make: Build) -> None:
    backend = make(config())
    backend.sync(snap((web(node_port=30080), eps(B1))), None)
    reply = lab.executor(lab.client_ns).call(tcp_ask, NODE_IP, 30080)
    assert reply.pod == "backend-1" and reply.client_ip != CLIENT_IP


def test_no_endpoints_is_refused(lab: Lab, make: Build) -> None:
    backend = make(config())
    backend.sync(snap((web(), ())), None)
    with pytest.raises(ConnectionRefusedError, match="Connection refused"):
        lab.executor(lab.client_ns).call(tcp_ask, VIP, 80)


@pytest.mark.parametrize("scheduler", ["sh", "mh"])
def test_source_hashing_schedulers_stick_a_client_to_one_backend(
    lab: Lab, make: Build, scheduler: str
) -> None:
    backend = make(config(scheduler))
    backend.sync(snap((web(), eps(B1, B2))), None)
    if scheduler == "sh":
        assert len(set(asks(lab, lab.client_ns, VIP, 80, 8))) == 1
    else:
        # mh with upstream's mh-port flag hashes the source port too: it spreads.
        assert len(set(asks(lab, lab.client_ns, VIP, 80, 12))) == 2


def test_every_scheduler_is_accepted_by_the_kernel(lab: Lab, make: Build) -> None:
    """Each of the kernel's schedulers, set in place on the live virtual server (netlink
    "set"), still serves (the backend's own probe at start covers "add")."""
    backend = make(config())
    backend.sync(snap((web(), eps(B1))), None)
    key = ServiceKey(VIP, "TCP", 80)
    for scheduler in ("wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh"):
        backend.ipvs.set_service(VirtualServer(key, scheduler))
        listed = {vs.key: vs for vs in backend.ipvs.services()}
        assert listed[key].scheduler == scheduler
        assert lab.executor(lab.client_ns).call(tcp_ask, VIP, 80).pod == "backend-1"
    # The next full sync puts the configured scheduler back.
    backend.sync(snap((web(), eps(B1))), None)
    assert {vs.key: vs for vs in backend.ipvs.services()}[key].scheduler == "rr"


def test_session_affinity_is_ipvs_persistence(lab: Lab, make: Build) -> None:
    backend = make(config())
    backend.sync(snap((web(affinity_timeout=300), eps(B1, B2))), None)
    vs = backend.ipvs.services()
    assert VirtualServer(ServiceKey(VIP, "TCP", 80), "rr", 1, 300) in vs
    assert len(set(asks(lab, lab.client_ns, VIP, 80, 6))) == 1


def test_graceful_termination_keeps_established_and_steers_new(lab: Lab, make: Build) -> None:
    backend = make(config())
    held = ServicePort(name=port_name("held"), cluster_ips=("10.96.0.20",), port=90)
    both = (web(), eps(B1, B2))
    backend.sync(snap(both, (held, eps(B2, port=9090))), None)
    serving = lab.in_pod("backend-2").submit(hold, 9090)
    outside = lab.executor(lab.client_ns)
    client = until_listening(lambda: outside.call(socket.create_connection, ("10.96.0.20", 90), 5))
    # backend-2 goes away from both Services.
    backend.sync(snap((web(), eps(B1)), (held, ())), {WEB, held.name})
    key = ServiceKey("10.96.0.20", "TCP", 90)
    dests = {d.address: d for d in backend.ipvs.destinations(key)}
    assert dests[B2].weight == 0 and dests[B2].active == 1
    with client:
        client.settimeout(5)
        client.sendall(b"ping")
        assert client.recv(16) == b"PING"  # the established connection still works
    serving.result(10)
    # New connections to the echo Service avoid backend-2.
    assert set(asks(lab, lab.client_ns, VIP, 80, 6)) == {"backend-1"}


def test_cleanup_removes_only_ours(lab: Lab, make: Build) -> None:
    backend = make(config())
    backend.sync(snap((web(node_port=30080), eps(B1))), None)
    theirs = VirtualServer(ServiceKey("192.168.50.1", "TCP", 4443), "wlc")
    backend.ipvs.add_service(theirs)
    ns = lab.node_ns
    links = NetlinkLinks(ns)
    try:
        removed = cleanup(
            backend.ipvs,
            links,
            IpsetCommand(ns),
            [IptablesCommand(IPFamily.IPv4, "legacy", netns=ns)],
        )
    finally:
        links.close()
    assert removed
    assert [vs.key for vs in backend.ipvs.services()] == [theirs.key]
    assert "kube-ipvs0" not in ns_exec(ns, "ip", "-o", "link", check=False)
    assert "KUBE-" not in ns_exec(ns, "ipset", "list", "-n", check=False)
    backend.ipvs.delete_service(theirs.key)


def test_kubeproxy_run_programs_ipvs_mode(lab: Lab, tmp_path: Path) -> None:
    """The whole program: ``kubeproxy run --proxy-mode ipvs --once`` over manifests, in
    node-a's namespace, with iptables-legacy (the guest has no iptables-nft): upstream's
    sysctls (per namespace, so the namespace's own), strict ARP, the IPVS timeouts."""
    mdir = ManifestDir(tmp_path / "manifests")
    mdir.path.mkdir()
    mdir.write(
        "web.yaml",
        service("web", "10.96.0.30", type="NodePort",
                ports=[{"name": "http", "port": 80, "nodePort": 30090}]),
        endpoint_slice("web", [Ep(B1, node=NODE), Ep(B2, node=NODE)]),
    )  # fmt: skip
    # Undo what earlier tests' fixtures set, so that the run has to set each one; the
    # namespace is shared with later tests, so everything is put back afterwards (strict
    # ARP left on makes their connections time out).
    before = {k: read_sysctl(lab.node_ns, k) for k in UPSTREAM_SYSCTLS}
    set_sysctls(lab.node_ns, dict.fromkeys(UPSTREAM_SYSCTLS, "0"))
    command = lab.kubeproxy_command(
        "run", "--manifests", str(mdir.path), "--hostname-override", NODE,
        "--cluster-cidr", ",".join(CLUSTER_CIDRS), "--proxy-mode", "ipvs",
        "--iptables-backend", "legacy", "--ipvs-scheduler", "wrr", "--once",
        "--ipvs-tcp-timeout", "15m", "--ipvs-tcpfin-timeout", "30s",
        "--ipvs-udp-timeout", "45s", "--ipvs-strict-arp",
    )  # fmt: skip
    try:
        result = lab.run(command)
        assert result.returncode == 0, result.stderr
        replies = asks(lab, lab.client_ns, "10.96.0.30", 80, 4)
        assert Counter(replies) == {"backend-1": 2, "backend-2": 2}
        assert asks(lab, lab.client_ns, NODE_IP, 30090, 1)[0] in BACKENDS
        got = {k: read_sysctl(lab.node_ns, k) for k in (*UPSTREAM_SYSCTLS, CONN_REUSE)}
        # conn_reuse_mode is upstream's only on kernels 4.1-5.8: left at 6.1's default.
        assert got == {**UPSTREAM_SYSCTLS, CONN_REUSE: "1"}
        table = ns_exec(lab.node_ns, "ipvsadm", "-Ln")
        assert "10.96.0.30:80 wrr" in table
        # The timeouts went in over netlink (IPVS_CMD_SET_CONFIG).
        timeouts = ns_exec(lab.node_ns, "ipvsadm", "-L", "--timeout")
        assert "900 30 45" in timeouts, timeouts
        # IPv6 too (the guest has it): the sets of that family are upstream's KUBE-6- ones.
        assert "KUBE-6-CLUSTER-IP" in ns_exec(lab.node_ns, "ipset", "list", "-n")
    finally:
        set_sysctls(lab.node_ns, before)
        cleanup_ns(lab.node_ns)


# What upstream's ipvs mode sets (net.ipv4.conf.all.* with --ipvs-strict-arp).
UPSTREAM_SYSCTLS = {
    "net.ipv4.vs.conntrack": "1",
    "net.ipv4.vs.expire_nodest_conn": "1",
    "net.ipv4.vs.expire_quiescent_template": "1",
    "net.ipv4.ip_forward": "1",
    "net.ipv4.conf.all.arp_ignore": "1",
    "net.ipv4.conf.all.arp_announce": "2",
}
CONN_REUSE = "net.ipv4.vs.conn_reuse_mode"


def read_sysctl(ns: str, name: str) -> str:
    return ns_exec(ns, "cat", "/proc/sys/" + name.replace(".", "/")).strip()


def test_external_ips_load_balancers_source_ranges_and_udp(lab: Lab, make: Build) -> None:
    backend = make(config())
    open_lb = web(
        external_ips=("203.0.113.10",),
        load_balancer_ips=("203.0.113.20",),
        load_balancer_source_ranges=("192.168.60.0/24",),
    )
    closed = ServicePort(
        name=port_name("closed"),
        cluster_ips=("10.96.0.41",),
        port=80,
        load_balancer_ips=("203.0.113.21",),
        load_balancer_source_ranges=("198.51.100.0/24",),
    )
    dns = ServicePort(
        name=port_name("dns", "dns", L4Protocol.UDP),
        cluster_ips=("10.96.0.42",),
        port=53,
        node_port=30053,
    )
    backend.sync(snap((open_lb, eps(B1)), (closed, eps(B1)), (dns, eps(B2))), None)
    assert not backend.errors, backend.errors
    client = lab.executor(lab.client_ns)
    assert client.call(tcp_ask, "203.0.113.10", 80).pod == "backend-1"
    assert client.call(tcp_ask, "203.0.113.20", 80).pod == "backend-1"
    # The client is outside the second load balancer's source ranges: dropped.
    with pytest.raises(TimeoutError, match="timed out"):
        client.call(tcp_ask, "203.0.113.21", 80, 1.0)
    assert client.call(udp_ask, "10.96.0.42", 53).pod == "backend-2"
    # A UDP NodePort: KUBE-NODE-PORT-UDP marks it for masquerade.
    reply = client.call(udp_ask, NODE_IP, 30053)
    assert reply.pod == "backend-2" and reply.client_ip != CLIENT_IP


def test_local_policy_node_port_keeps_the_client_address(lab: Lab, make: Build) -> None:
    backend = make(config())
    svc = web(node_port=30081, external_traffic_policy=TrafficPolicy.LOCAL)
    backend.sync(snap((svc, eps(B1))), None)
    reply = lab.executor(lab.client_ns).call(tcp_ask, NODE_IP, 30081)
    # KUBE-NODE-PORT-LOCAL-TCP returns before the masquerade mark, as upstream.
    assert reply.pod == "backend-1" and reply.client_ip == CLIENT_IP


def test_ipv6_virtual_servers_serve_real_traffic(lab: Lab, make: Build) -> None:
    lab.add_pod("backend-6", NODE, ["10.244.1.16", "fd00:10:244:1::16"])
    backend = make(config(family=IPFamily.IPv6))
    svc = web(cluster_ips=("fd00:96::10",), node_port=30086)
    backend.sync(snap((svc, eps("fd00:10:244:1::16"))), None)
    assert not backend.errors, backend.errors
    listed = {vs.key for vs in backend.ipvs.services()}
    assert {ServiceKey("fd00:96::10", "TCP", 80), ServiceKey(NODE_IP6, "TCP", 30086)} <= listed
    client = lab.executor(lab.client_ns)
    reply = client.call(tcp_ask, "fd00:96::10", 80)
    # An off-cluster client is masqueraded (ip6tables' KUBE-CLUSTER-IP, KUBE-6- sets).
    assert reply.pod == "backend-6" and reply.client_ip != "fd00:60::2"
    assert client.call(tcp_ask, NODE_IP6, 30086).pod == "backend-6"


def _sctp_serve(port: int, name: bytes) -> str:
    """In a Pod: accept one SCTP association, send ``name``; the peer's address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))
        server.listen()
        server.settimeout(20)
        conn, peer = server.accept()
        with conn:
            conn.sendall(name)
        return str(peer[0])


def _sctp_ask(ip: str, port: int) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP) as client:
        client.settimeout(10)
        client.connect((ip, port))
        return client.recv(64)


def test_sctp_virtual_server_carries_an_association(lab: Lab, make: Build) -> None:
    """The guest kernel has the sctp module: a real association through IPVS."""
    backend = make(config())
    svc = ServicePort(
        name=port_name("assoc", "sctp", L4Protocol.SCTP),
        cluster_ips=("10.96.0.50",),
        port=132,
        node_port=30132,
    )
    backend.sync(snap((svc, eps(B2, port=9132))), None)
    assert not backend.errors, backend.errors
    listed = backend.ipvs.services()
    assert VirtualServer(ServiceKey("10.96.0.50", "SCTP", 132)) in listed
    # An SCTP NodePort: its own virtual server, and (ip, port) in KUBE-NODE-PORT-SCTP-HASH.
    assert VirtualServer(ServiceKey(NODE_IP, "SCTP", 30132)) in listed
    members = ns_exec(lab.node_ns, "ipset", "list", "KUBE-NODE-PORT-SCTP-HASH")
    assert f"{NODE_IP},sctp:30132" in members, members
    serving = lab.in_pod("backend-2").submit(_sctp_serve, 9132, b"backend-2")
    reply = until_listening(lambda: lab.executor(lab.client_ns).call(_sctp_ask, "10.96.0.50", 132))
    assert reply == b"backend-2"
    assert serving.result(20) != CLIENT_IP  # masqueraded, as TCP


def table(backend: IpvsBackend) -> dict[VirtualServer, set[tuple[str, int, int]]]:
    return {
        vs: {(d.address, d.port, d.weight) for d in backend.ipvs.destinations(vs.key)}
        for vs in backend.ipvs.services()
    }


def test_partial_sync_touches_only_the_changed_real_server(lab: Lab, make: Build) -> None:
    backend = make(config())
    other = ServicePort(name=port_name("other"), cluster_ips=("10.96.0.60",), port=80)
    backend.sync(snap((web(), eps(B1, B2)), (other, eps(B1, B2))), None)
    batch = backend.ipvs.batch  # type: ignore[attr-defined]
    before, messages = table(backend), batch.messages
    result = backend.sync(snap((web(), eps(B1)), (other, eps(B1, B2))), {WEB})
    after = table(backend)
    assert result.rendered == 1  # only the changed ServicePort was planned and rendered
    assert batch.messages - messages == 1  # one IPVS_CMD_DEL_DEST, nothing else
    changed = {vs for vs in before if before[vs] != after[vs]}
    assert [vs.key for vs in changed] == [ServiceKey(VIP, "TCP", 80)]
    assert before[next(iter(changed))] - after[next(iter(changed))] == {(B2, 8080, 1)}
    messages = batch.messages
    backend.sync(snap((web(), eps(B1, B2)), (other, eps(B1, B2))), {WEB})
    assert batch.messages - messages == 1 and table(backend) == before


def test_full_sync_repairs_a_hand_deleted_virtual_server(lab: Lab, make: Build) -> None:
    backend = make(config())
    state = snap((web(), eps(B1)))
    backend.sync(state, None)
    ns_exec(lab.node_ns, "ipvsadm", "-D", "-t", f"{VIP}:80")
    with pytest.raises(
        (ConnectionRefusedError, TimeoutError), match=r"Connection refused|timed out"
    ):
        lab.executor(lab.client_ns).call(tcp_ask, VIP, 80, 1.0)
    result = backend.sync(state, None)  # the periodic full sync reads the kernel back
    assert result.full and not backend.errors
    assert lab.executor(lab.client_ns).call(tcp_ask, VIP, 80).pod == "backend-1"


def test_drained_real_server_is_deleted_once_its_connection_ends(lab: Lab, make: Build) -> None:
    now = [1000.0]
    backend = make(config(), clock=lambda: now[0])
    held = ServicePort(name=port_name("held"), cluster_ips=("10.96.0.70",), port=90)
    key = ServiceKey("10.96.0.70", "TCP", 90)
    backend.sync(snap((held, eps(B2, port=9090))), None)
    serving = lab.in_pod("backend-2").submit(hold, 9090)
    client = lab.executor(lab.client_ns)
    conn = until_listening(lambda: client.call(socket.create_connection, ("10.96.0.70", 90), 5))
    # backend-2 goes; backend-1's echo server takes over.
    backend.sync(snap((held, eps(B1))), {held.name})
    # Weight 0, the held connection active (a retried connect may add an inactive one).
    drained = {d.endpoint: d for d in backend.ipvs.destinations(key)}[(B2, 9090)]
    assert (drained.weight, drained.active) == (0, 1)
    now[0] += 61
    assert backend.flush_terminated() == 0  # still connected: kept
    with conn:
        conn.settimeout(5)
        conn.sendall(b"ping")
        assert conn.recv(16) == b"PING"
        # A reset leaves the IPVS connection in CLOSE: the kernel drops it after 10 s.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    serving.result(10)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        now[0] += 61
        if backend.flush_terminated():
            break
        time.sleep(1)
    assert [d.endpoint for d in backend.ipvs.destinations(key)] == [(B1, 8080)]


def test_switching_between_iptables_and_ipvs_modes_never_stops_serving(
    lab: Lab, tmp_path: Path
) -> None:
    """iptables -> ipvs -> iptables on one node, each a ``kubeproxy run --once`` (as a
    DaemonSet's new Pod), while a client connects every 10 ms. Each mode removes what
    the other left only after its own sync, and leaves the chains both modes name alike
    (nat KUBE-SERVICES and its jumps...): they hold its own rules by then. With
    ``--iptables-backend auto`` the guest's iptables-nft (no nf_tables ip family: it
    lists, but every write fails) is found out and legacy used instead."""
    mdir = ManifestDir(tmp_path / "manifests")
    mdir.path.mkdir()
    mdir.write(
        "web.yaml",
        service("web", "10.96.0.31", type="NodePort",
                ports=[{"name": "http", "port": 80, "nodePort": 30091}]),
        endpoint_slice("web", [Ep(B1, node=NODE), Ep(B2, node=NODE)]),
    )  # fmt: skip

    def run(mode: str) -> str:
        command = lab.kubeproxy_command(
            "run", "--manifests", str(mdir.path), "--hostname-override", NODE,
            "--cluster-cidr", ",".join(CLUSTER_CIDRS), "--proxy-mode", mode,
            "--iptables-backend", "auto", "--once",
        )  # fmt: skip
        result = lab.run(command)
        assert result.returncode == 0, result.stderr
        return result.stderr

    def chains() -> set[str]:
        return {
            line.split()[0][1:]
            for line in ns_exec(lab.node_ns, "iptables-legacy-save").splitlines()
            if line.startswith(":KUBE-")
        }

    lab.run(lab.kubeproxy_command("cleanup"))  # no rules: detection then says nft
    try:
        first = run("iptables")
        assert "iptables-nft does not work in this kernel" in first, first
        assert "using iptables-legacy" in first
        probe = ConnectProbe(lab.client_ns, "10.96.0.31", 80).start()
        # When each step began, to tell in which one a failed connect started.
        steps: list[tuple[float, str]] = []
        try:
            time.sleep(0.5)
            steps.append((time.monotonic(), "to ipvs"))
            to_ipvs = run("ipvs")
            steps.append((time.monotonic(), "in ipvs"))
            time.sleep(0.5)
            in_ipvs = chains()
            steps.append((time.monotonic(), "back to iptables"))
            back = run("iptables")
            steps.append((time.monotonic(), "in iptables"))
            time.sleep(0.5)
        finally:
            attempts = probe.stop()
        assert "Removed what other proxy modes left" in to_ipvs
        assert "Removed what other proxy modes left" in back
        # A connection IPVS accepted just before iptables mode removed its virtual
        # servers loses its answer (IPVS, not conntrack's NAT, carried it: see
        # docs/ipvs-layout.md, "Switching modes"); every connect must still succeed.
        left_ipvs = steps[2][0]
        failed = [
            a
            for a in attempts
            if not a.ok and not (a.outcome.startswith(NO_ANSWER) and a.at >= left_ipvs - 1)
        ]
        assert not failed, (failed[:5], steps, to_ipvs, back)
        assert len(attempts) > 50
        # In ipvs mode: no iptables-mode chain is left, the shared ones are ipvs mode's.
        assert not any(c.startswith(("KUBE-SVC-", "KUBE-SEP-", "KUBE-EXT")) for c in in_ipvs)
        assert {"KUBE-SERVICES", "KUBE-IPVS-FILTER", "KUBE-NODE-PORT"} <= in_ipvs
        # Back in iptables mode: ipvs mode's own objects are gone, iptables mode serves.
        now = chains()
        assert "KUBE-IPVS-FILTER" not in now and any(c.startswith("KUBE-SVC-") for c in now)
        assert "kube-ipvs0" not in ns_exec(lab.node_ns, "ip", "-o", "link")
        assert "KUBE-CLUSTER-IP" not in ns_exec(lab.node_ns, "ipset", "list", "-n")
        assert "10.96.0.31" not in ns_exec(lab.node_ns, "ipvsadm", "-Ln")
    finally:
        cleanup_ns(lab.node_ns)
        lab.run(lab.kubeproxy_command("cleanup"))
