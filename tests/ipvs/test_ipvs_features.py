"""ipvs mode's remaining features against a real IPVS kernel (inside the guest): the
endpoint selection (traffic policies, terminating fallback, topology) reaching real
servers, wrr and mh as the kernel reads them back, ``--ipvs-exclude-cidrs``,
masquerading without a cluster CIDR or with ``--masquerade-all``, ``--nodeport-addresses``,
KUBE-IPVS-FILTER's REJECT, and ``kubeproxy explain --live`` in ipvs mode.
docs/ipvs-layout.md maps each feature to its test.
"""

from __future__ import annotations

import json
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.backends.ipvs.proxier import IpvsBackend
from kubeproxy.dataplane.ipvs import (
    FLAG_SCHED1,
    FLAG_SCHED2,
    Change,
    Destination,
    ServiceKey,
    VirtualServer,
)
from kubeproxy.lab.cluster import (
    CLIENT_GW,
    CLIENT_IP,
    CLUSTER_CIDRS,
    NODE,
    NODE_IP,
    REMOTE_NODE,
    Lab,
)
from kubeproxy.lab.echo import tcp_ask
from kubeproxy.lab.netns import ns_exec
from kubeproxy.lab.netns import sysctls as set_sysctls
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, service
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.types import Endpoint, ServicePort, TrafficPolicy
from tests.ipvs.conftest import (
    B1,
    B2,
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

REMOTE = "10.244.2.10"  # an echo Pod on node-b, which runs no proxy
KEY = ServiceKey(VIP, "TCP", 80)
# What upstream's ipvs mode puts in its sets for a Local NodePort with a health check.
LOCAL_SETS = {
    "KUBE-NODE-PORT-TCP": "30082",
    "KUBE-NODE-PORT-LOCAL-TCP": "30082",
    "KUBE-HEALTH-CHECK-NODE-PORT": "30999",
}


@pytest.fixture(scope="module")
def remote(lab: Lab) -> str:
    lab.add_pod("remote-1", REMOTE_NODE, [REMOTE])
    return REMOTE


def real_servers(backend: IpvsBackend, key: ServiceKey = KEY) -> set[str]:
    """The real servers new connections may go to (a drained one has weight 0 while
    the kernel still counts connections to it, TIME_WAIT's included)."""
    return {d.address for d in backend.ipvs.destinations(key) if d.weight}


def test_wrr_gives_every_endpoint_weight_one_so_traffic_is_even(lab: Lab, make: Build) -> None:
    """upstream writes weight 1 for every real server: wrr serves like rr."""
    backend = make(config("wrr"))
    backend.sync(snap((web(), eps(B1, B2))), None)
    assert {d.weight for d in backend.ipvs.destinations(KEY)} == {1}
    assert Counter(asks(lab, lab.client_ns, VIP, 80, 10)) == {"backend-1": 5, "backend-2": 5}


def test_mh_carries_mh_port_and_not_mh_fallback(lab: Lab, make: Build) -> None:
    """upstream sets only FlagSourceHash (mh-port) and has no setting for mh-fallback."""
    backend = make(config("mh"))
    backend.sync(snap((web(), eps(B1, B2))), None)
    (vs,) = [vs for vs in backend.ipvs.services() if vs.key == KEY]
    assert vs.scheduler == "mh" and vs.flags & FLAG_SCHED2 and not vs.flags & FLAG_SCHED1
    (line,) = [x for x in ns_exec(lab.node_ns, "ipvsadm", "-Sn").splitlines() if "-A" in x]
    assert "mh-port" in line and "mh-fallback" not in line, line


def test_local_policies_without_a_local_endpoint_use_the_cluster_wide_ones(
    lab: Lab, make: Build, remote: str
) -> None:
    """upstream's ipvs mode (kubernetes#97081): with a Local policy and no local
    endpoint, the virtual servers get the cluster-wide endpoints, so local Pods still
    reach the Service; an outside client's NodePort traffic is not masqueraded (its
    reply comes back through node-a here, as the lab routes node-b's Pods through it).
    A ClusterIP-only Service with internalTrafficPolicy Local has no cluster-wide set
    (upstream's CategorizeEndpoints): its virtual server has no real server: refused."""
    backend = make(config())
    svc = web(
        node_port=30082,
        internal_traffic_policy=TrafficPolicy.LOCAL,
        external_traffic_policy=TrafficPolicy.LOCAL,
        health_check_node_port=30999,
    )
    internal = ServicePort(
        name=port_name("internal"),
        cluster_ips=("10.96.0.12",),
        port=80,
        internal_traffic_policy=TrafficPolicy.LOCAL,
    )
    remote_ep = (Endpoint(remote, 8080, REMOTE_NODE),)
    result = backend.sync(snap((svc, remote_ep), (internal, remote_ep)), None)
    assert result.no_local["IPv4"] == (2, 1)
    assert real_servers(backend) == {remote}
    assert real_servers(backend, ServiceKey(NODE_IP, "TCP", 30082)) == {remote}
    assert backend.ipvs.destinations(ServiceKey("10.96.0.12", "TCP", 80)) == []
    sets = {s: ns_exec(lab.node_ns, "ipset", "list", s) for s in LOCAL_SETS}
    assert all(member in sets[s] for s, member in LOCAL_SETS.items()), sets
    pod = lab.in_pod("backend-1")
    assert pod.call(tcp_ask, VIP, 80).pod == "remote-1"
    with pytest.raises(ConnectionRefusedError, match="Connection refused"):
        pod.call(tcp_ask, "10.96.0.12", 80)
    reply = lab.executor(lab.client_ns).call(tcp_ask, NODE_IP, 30082)
    assert reply.pod == "remote-1" and reply.client_ip == CLIENT_IP
    # With a local endpoint, only local ones serve.
    both = (*remote_ep, *eps(B1))
    backend.sync(snap((svc, both), (internal, both)), {WEB, internal.name})
    assert real_servers(backend) == {B1}
    assert real_servers(backend, ServiceKey("10.96.0.12", "TCP", 80)) == {B1}
    assert set(asks(lab, lab.client_ns, NODE_IP, 30082, 4)) == {"backend-1"}


def test_terminating_endpoints_serve_when_none_is_ready(lab: Lab, make: Build) -> None:
    backend = make(config())
    draining = (
        Endpoint(B1, 8080, NODE, ready=False, serving=True, terminating=True),
        Endpoint(B2, 8080, NODE, ready=False, serving=False, terminating=True),
    )
    backend.sync(snap((web(), draining)), None)
    assert real_servers(backend) == {B1}
    assert set(asks(lab, lab.client_ns, VIP, 80, 4)) == {"backend-1"}
    # A ready endpoint appears: the terminating one leaves.
    backend.sync(snap((web(), (draining[0], *eps(B2)))), {WEB})
    assert real_servers(backend) == {B2}


def test_topology_hints_pick_the_real_servers(lab: Lab, make: Build) -> None:
    backend = make(config())
    hinted = (
        Endpoint(B1, 8080, NODE, zone="zone-a", zone_hints=frozenset({"zone-a"})),
        Endpoint(B2, 8080, NODE, zone="zone-b", zone_hints=frozenset({"zone-b"})),
    )
    backend.sync(snap((web(), hinted), zone="zone-a"), None)
    assert real_servers(backend) == {B1}
    assert set(asks(lab, lab.client_ns, VIP, 80, 4)) == {"backend-1"}
    backend.sync(snap((web(), hinted), zone="zone-b"), None)  # the node moved zones
    assert real_servers(backend) == {B2}


def test_exclude_cidrs_keep_foreign_virtual_servers(lab: Lab, make: Build) -> None:
    """A full or partial sync deletes a virtual server that is not ours unless it is in
    ``--ipvs-exclude-cidrs`` (upstream's cleanLegacyService); an excluded one keeps its
    real servers, and its address on its own device is never touched."""
    backend = make(config(exclude_cidrs=("192.168.70.0/24",)))
    state = snap((web(), eps(B1)))
    backend.sync(state, None)
    kept = VirtualServer(ServiceKey("192.168.70.1", "TCP", 443), "wlc")
    gone = VirtualServer(ServiceKey("192.168.71.1", "TCP", 443), "wlc")
    ns_exec(lab.node_ns, "ip", "link", "add", "lb0", "type", "dummy")
    ns_exec(lab.node_ns, "ip", "addr", "add", "192.168.70.1/32", "dev", "lb0")
    try:
        for vs in (kept, gone):
            backend.ipvs.apply(
                [Change.add_service(vs), Change.add_dest(vs.key, Destination(B2, 8443))]
            )
        backend.sync(state, {WEB})  # partial: leaves the kernel's other entries alone
        backend.sync(state, None)  # full: reads the kernel back
        assert not backend.errors, backend.errors
        listed = {vs.key for vs in backend.ipvs.services()}
        assert listed == {KEY, kept.key}
        assert backend.ipvs.destinations(kept.key) == [Destination(B2, 8443, 1)]
        assert "192.168.70.1/32" in ns_exec(lab.node_ns, "ip", "-o", "addr", "show", "lb0")
        assert lab.executor(lab.client_ns).call(tcp_ask, VIP, 80).pod == "backend-1"
    finally:
        backend.ipvs.apply([Change.delete_service(kept.key)])
        ns_exec(lab.node_ns, "ip", "link", "del", "lb0")


def test_without_cluster_cidr_outside_clients_keep_their_address(lab: Lab, make: Build) -> None:
    """No local-traffic detector: KUBE-CLUSTER-IP masquerades only node-originated
    traffic (``src,dst``), as upstream."""
    backend = make(config(cluster_cidrs=()))
    backend.sync(snap((web(), eps(B1))), None)
    assert lab.executor(lab.client_ns).call(tcp_ask, VIP, 80).client_ip == CLIENT_IP


def test_masquerade_all_masquerades_pods_too(lab: Lab, make: Build) -> None:
    backend = make(config(masquerade_all=True))
    backend.sync(snap((web(), eps(B2))), None)
    reply = lab.in_pod("backend-1").call(tcp_ask, VIP, 80)
    assert reply.pod == "backend-2" and reply.client_ip != B1


def test_nodeport_addresses_choose_where_node_ports_listen(lab: Lab, make: Build) -> None:
    backend = make(config(nodeport_addresses=NodePortAddresses(("192.168.60.0/24",), False)))
    backend.sync(snap((web(node_port=30083), eps(B1))), None)
    ports = {vs.key for vs in backend.ipvs.services() if vs.key.port == 30083}
    assert ports == {ServiceKey(CLIENT_GW, "TCP", 30083)}
    assert lab.executor(lab.client_ns).call(tcp_ask, CLIENT_GW, 30083).pod == "backend-1"


def test_a_service_address_rejects_ports_that_are_no_service(lab: Lab, make: Build) -> None:
    """KUBE-IPVS-FILTER (kubernetes#72236): a node's own listener is not reachable on a
    ``kube-ipvs0`` address, while it is on the node's address."""
    backend = make(config())
    backend.sync(snap((web(), eps(B1))), None)
    listening = lab.executor(lab.node_ns).submit(hold, 2222)
    outside = lab.executor(lab.client_ns)
    conn = until_listening(lambda: outside.call(socket.create_connection, (NODE_IP, 2222), 5))
    with conn:
        with pytest.raises(ConnectionRefusedError, match="Connection refused"):
            outside.call(socket.create_connection, (VIP, 2222), 5)
        conn.settimeout(5)
        conn.sendall(b"ping")
        assert conn.recv(16) == b"PING"
    listening.result(10)


def test_explain_agrees_with_the_ipvs_kernel(lab: Lab, tmp_path: Path) -> None:
    """``kubeproxy explain --live`` in ipvs mode after ``kubeproxy run --once``: the
    virtual server and real servers it names are the kernel's (no drift), connections
    reach exactly the explained endpoints, masqueraded as explained; a real server
    deleted by hand is reported."""
    mdir = ManifestDir(tmp_path / "manifests")
    mdir.path.mkdir()
    mdir.write(
        "web.yaml",
        service("web", "10.96.0.31", ports=[{"name": "http", "port": 80}]),
        endpoint_slice("web", [Ep(B1, node=NODE), Ep(B2, node=NODE)]),
    )
    flags = (
        "--manifests", str(mdir.path), "--hostname-override", NODE,
        "--cluster-cidr", ",".join(CLUSTER_CIDRS), "--proxy-mode", "ipvs",
        "--iptables-backend", "legacy",
    )  # fmt: skip
    packet = ("--src", CLIENT_IP, "--dst", "10.96.0.31", "--port", "80", "--live", "-o", "json")
    try:
        done = lab.run(lab.kubeproxy_command("run", *flags, "--once"))
        assert done.returncode == 0, done.stderr
        said = explain_json(lab, *flags, *packet)
        assert said["verdict"] == "DNAT" and said["drift"] == [], said
        assert set(said["endpoints"]) == {f"{B1}:8080", f"{B2}:8080"}
        assert said["masquerade"] is True
        replies = [lab.executor(lab.client_ns).call(tcp_ask, "10.96.0.31", 80) for _ in range(4)]
        assert {r.pod for r in replies} == {"backend-1", "backend-2"}
        assert CLIENT_IP not in {r.client_ip for r in replies}
        code, listed = list_json(lab, *flags)
        assert (code, listed["mode"], listed["kernelOnly"]) == (0, "ipvs", []), listed
        assert [r["drift"] for r in listed["frontends"]] == [[]]
        ns_exec(lab.node_ns, "ipvsadm", "-d", "-t", "10.96.0.31:80", "-r", f"{B2}:8080")
        drift = explain_json(lab, *flags, *packet)["drift"]
        assert drift == [f"missing ipvs: TCP/10.96.0.31:80 -> {B2}:8080 weight 1"], drift
        # list --live: the same drift on that frontend, and exit status 1.
        code, listed = list_json(lab, *flags)
        assert code == 1
        assert [r["drift"] for r in listed["frontends"]] == [drift]
        # A Service gone from the source while its virtual server and address stay.
        mdir.remove("web.yaml")
        code, listed = list_json(lab, *flags)
        assert (code, listed["frontends"]) == (1, [])
        assert listed["kernelOnly"] == [
            "ipvs: virtual server TCP/10.96.0.31:80 rr: no Service has this frontend (stale)",
            "kube-ipvs0: address 10.96.0.31: no Service has it (stale)",
        ]
    finally:
        set_sysctls(lab.node_ns, {"net.ipv4.ip_forward": "1"})
        cleanup_ns(lab.node_ns)


def list_json(lab: Lab, *args: str) -> tuple[int, dict[str, Any]]:
    done = lab.run(lab.kubeproxy_command("list", *args, "--live", "-o", "json"))
    assert done.returncode in (0, 1), done.stderr  # 1: drift found
    data: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, data


def explain_json(lab: Lab, *args: str) -> dict[str, Any]:
    done = lab.run(lab.kubeproxy_command("explain", *args))
    assert done.returncode in (0, 1), done.stderr  # 1: drift found
    data: dict[str, Any] = json.loads(done.stdout)
    return data
