"""ebpf mode in the real kernel: socket hooks on a cgroup of the test's own, real sockets.

kubeproxy runs in node-a's namespace with ``--proxy-mode ebpf``, its hooks attached to a
cgroup the test creates (:class:`~kubeproxy.lab.sockclient.BpfLab`) and its pins on a
BPF filesystem the test mounts; only the test's client processes ever join that cgroup.
A client in the cgroup, in the client Pod's namespace, reaches the ClusterIP with no NAT
(node-a's conntrack has no entry for the ClusterIP); a client outside the cgroup (the
test process itself) still goes through the nftables rules of the same kubeproxy.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.dataplane.bpf.libbpf import link_info, obj_get
from kubeproxy.dataplane.bpf.socklb import MAPS, PROGRAMS, map_pin
from kubeproxy.lab.cluster import CLIENT_IP, NODE_IP, Lab, stop_process
from kubeproxy.lab.echo import tally, tcp_ask
from kubeproxy.lab.netns import ns_exec, sh
from kubeproxy.lab.objects import ManifestDir, endpoint_slice, service
from kubeproxy.lab.sockclient import BpfLab
from tests.conftest import require_tool
from tests.kernel.conftest import HTTP, eps, ip, sync, wait_for

PROXY_MODES = ("ebpf",)
TARGET = {"name": "http", "port": 8080}
DNS = {"name": "dns", "port": 53, "protocol": "UDP"}
DNS_TARGET = {"name": "dns", "port": 8080, "protocol": "UDP"}
VIP = "10.96.7.1"
VIP6 = "fd00:96::7:1"


@pytest.fixture(scope="module")
def bpf(lab: Lab) -> Iterator[BpfLab]:
    require_tool("bpftool", "to see what is attached to the test cgroup")
    with BpfLab(f"{lab.prefix}-ebpf") as built:
        yield built
    assert not built.root.exists(), "the test's mounts and cgroup were not removed"


def web(manifests: ManifestDir, *pods: str, name: str = "web", vip: str = VIP) -> None:
    manifests.write(
        f"{name}.yaml",
        service(name, vip, [HTTP, DNS]),
        endpoint_slice(name, eps(*pods), [TARGET, DNS_TARGET]),
    )


def client(lab: Lab, bpf: BpfLab, action: str, count: float = 30, port: int = 80) -> Any:
    return bpf.client(lab.pods["client"].netns, action, VIP, port, count)


def conntrack_to(lab: Lab, address: str) -> list[str]:
    out = ns_exec(lab.node_ns, "conntrack", "-L", "-d", address, check=False)
    return [line for line in out.splitlines() if line.startswith(("tcp", "udp"))]


def test_a_cluster_ip_connects_straight_to_an_endpoint_without_nat(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    web(manifests, "local-1", "remote-1")
    sync(lab, manifests, *bpf.flags())
    ns_exec(lab.node_ns, "conntrack", "-F", check=False)
    seen = client(lab, bpf, "tcp")
    assert set(seen["answers"]) == {"local-1", "remote-1"}, seen
    # getpeername() gives the address the application connected to.
    assert seen["peers"] == [f"{VIP}:80"]
    # No DNAT happened anywhere: nothing in node-a's conntrack was addressed to the VIP.
    assert conntrack_to(lab, VIP) == []
    # The same Service from outside the cgroup: nftables' DNAT, as in nftables mode.
    outside = lab.in_pod("client").call(tally, tcp_ask, VIP, 80, count=10)
    assert set(outside) <= {"local-1", "remote-1"}, outside
    assert conntrack_to(lab, VIP) != []


def test_udp_replies_come_from_the_cluster_ip(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    web(manifests, "local-1", "local-2")
    sync(lab, manifests, *bpf.flags())
    for action in ("udp", "udp-connected"):
        seen = client(lab, bpf, action, port=53)
        assert set(seen["answers"]) == {"local-1", "local-2"}, (action, seen)
        assert seen["peers"] == [f"{VIP}:53"], (action, seen)


def test_ipv6_cluster_ips_too(lab: Lab, bpf: BpfLab, manifests: ManifestDir) -> None:
    manifests.write(
        "web6.yaml",
        service("web6", VIP6, [HTTP, DNS], ipFamilies=["IPv6"]),
        endpoint_slice("web6", eps("local-1", "remote-1", family=6), [TARGET, DNS_TARGET]),
    )
    sync(lab, manifests, *bpf.flags())
    ns_exec(lab.node_ns, "conntrack", "-F", check=False)
    tcp_and_udp_reach(lab, bpf, VIP6, {"local-1", "remote-1"})
    assert conntrack_to(lab, VIP6) == []


def tcp_and_udp_reach(lab: Lab, bpf: BpfLab, host: str, pods: set[str]) -> None:
    """From the client Pod in the cgroup, TCP :80 and UDP :53 (unconnected and
    connected) to ``host`` reach every one of ``pods``, with ``host`` as the peer."""
    netns = lab.pods["client"].netns
    for action, port in (("tcp", 80), ("udp", 53), ("udp-connected", 53)):
        seen = bpf.client(netns, action, host, port, 20)
        assert set(seen["answers"]) == pods, (action, seen)
        assert seen["peers"] == [f"[{host}]:{port}"], (action, seen)


def test_a_service_without_endpoints_is_refused_by_the_nftables_rules(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    web(manifests)
    sync(lab, manifests, *bpf.flags())
    seen = client(lab, bpf, "tcp", count=5)
    assert seen["answers"] == {"ECONNREFUSED": 5}


def test_an_endpoint_change_takes_effect_in_a_running_proxy(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    web(manifests, "local-1")
    proc = lab.start(manifests.path, *bpf.flags())
    try:
        wait_for(lambda: set(client(lab, bpf, "tcp", 5)["answers"]) == {"local-1"})
        ns_exec(lab.node_ns, "conntrack", "-F", check=False)
        web(manifests, "remote-2")  # a partial sync of this ServicePort
        wait_for(lambda: set(client(lab, bpf, "tcp", 10)["answers"]) == {"remote-2"})
        assert proc.poll() is None
        # The hooks did it (nftables' DNAT would have left entries for the VIP).
        assert conntrack_to(lab, VIP) == []
    finally:
        stop_process(proc)


def test_a_restart_keeps_serving_without_a_gap(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    web(manifests, "local-1", "local-2")
    sync(lab, manifests, *bpf.flags())
    links, tables = _link_ids(bpf), _table_handles(lab)
    ns_exec(lab.node_ns, "conntrack", "-F", check=False)
    loop = bpf.spawn_client(lab.pods["client"].netns, "loop", VIP, 80, 4)
    time.sleep(0.5)
    for _ in range(2):  # each run loads new programs and swaps them into the links
        sync(lab, manifests, *bpf.flags())
    out, _ = loop.communicate(timeout=30)
    answers = json.loads(out)["answers"]
    assert set(answers) == {"local-1", "local-2"}, answers
    # Every connection was rewritten by a hook: none fell through to nftables' DNAT.
    assert conntrack_to(lab, VIP) == []
    assert _link_ids(bpf) == links  # the same links: never detached
    # ... and the same nftables tables: ebpf mode does not clean nftables mode up.
    assert _table_handles(lab) == tables
    assert _attached(bpf) == HOOKS


def test_a_new_cgroup_path_moves_the_hooks(lab: Lab, bpf: BpfLab, manifests: ManifestDir) -> None:
    web(manifests, "local-1")
    sync(lab, manifests, *bpf.flags())
    other = bpf.cgroup2 / f"{bpf.cgroup.name}-b"
    other.mkdir()
    try:
        moved = [f if f != str(bpf.cgroup) else str(other) for f in bpf.flags()]
        sync(lab, manifests, *moved)
        assert _attached(bpf) == []
        assert _attached(bpf, other) == HOOKS
        sync(lab, manifests, *bpf.flags())
        assert _attached(bpf, other) == []
        assert _attached(bpf) == HOOKS
    finally:
        other.rmdir()


def test_node_ports_and_external_traffic_stay_with_nftables(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    """A mixed cluster: a Service only reachable through its NodePort still is."""
    manifests.write(
        "np.yaml",
        service("np", "10.96.7.2", [{**HTTP, "nodePort": 30080}], type="NodePort"),
        endpoint_slice("np", eps("remote-1"), [TARGET]),
    )
    sync(lab, manifests, *bpf.flags())
    outside = lab.executor(lab.client_ns).call(tally, tcp_ask, NODE_IP, 30080, count=5)
    assert outside == {"remote-1": 5}


def test_cleanup_removes_programs_links_and_pins(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    web(manifests, "local-1")
    sync(lab, manifests, *bpf.flags())
    assert _attached(bpf) == HOOKS
    result = lab.run(lab.kubeproxy_command("cleanup", "--ebpf-pin-path", str(bpf.pin_path)))
    assert result.returncode == 0, result.stderr
    assert "bpf link connect4" in result.stderr
    assert _attached(bpf) == []
    assert not bpf.pin_path.exists()
    assert not lab.rules_present()


def test_client_ip_affinity_keeps_each_client_on_one_endpoint(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    manifests.write(
        "web.yaml",
        service("web", VIP, [HTTP, DNS], sessionAffinity="ClientIP"),
        endpoint_slice("web", eps("local-1", "local-2", "remote-1"), [TARGET, DNS_TARGET]),
    )
    sync(lab, manifests, *bpf.flags())
    ns_exec(lab.node_ns, "conntrack", "-F", check=False)
    for action, port in (("tcp", 80), ("udp", 53)):
        seen = client(lab, bpf, action, count=20, port=port)
        assert len(seen["answers"]) == 1, (action, seen)  # one client: one endpoint
    # The hooks did it: nftables' affinity would have DNATed (entries for the VIP).
    assert conntrack_to(lab, VIP) == []


def test_client_ip_affinity_ends_with_its_timeout(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    manifests.write(
        "web.yaml",
        service(
            "web",
            VIP,
            [HTTP],
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 1}},
        ),
        endpoint_slice("web", eps("local-1", "local-2", "remote-1"), [TARGET]),
    )
    sync(lab, manifests, *bpf.flags())
    chosen = set()
    for _ in range(8):  # each round within the timeout, the rounds 1.2 s apart
        seen = client(lab, bpf, "tcp", count=5)
        assert len(seen["answers"]) == 1, seen
        chosen.update(seen["answers"])
        time.sleep(1.2)
    # 8 rounds, 3 endpoints: one endpoint every time has odds of 1 in 2,187.
    assert len(chosen) > 1, chosen


def test_a_removed_endpoint_loses_its_connected_udp_sockets(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    """As nftables mode deletes the conntrack entries of a removed UDP endpoint."""
    web(manifests, "local-1")
    proc = lab.start(manifests.path, *bpf.flags())
    try:
        wait_for(lambda: set(client(lab, bpf, "udp", 3, port=53)["answers"]) == {"local-1"})
        netns = lab.pods["client"].netns
        stay = bpf.spawn_client(netns, "udp-stay", VIP, 53, 5)
        # A socket connected to the Pod itself, not through the Service: left alone.
        direct = bpf.spawn_client(netns, "udp-stay", ip("local-1"), 8080, 5)
        time.sleep(1.5)
        web(manifests, "local-2")  # local-1 still runs: only the teardown moves the socket
        out, _ = stay.communicate(timeout=30)
        first, error, then = json.loads(out)["sequence"]
        # The socket was aborted (recv: ECONNABORTED) and disconnected (send: no address).
        assert (first, then) == ("local-1", "local-2")
        assert error in ("ECONNABORTED", "EDESTADDRREQ")
        out, _ = direct.communicate(timeout=30)
        assert json.loads(out)["sequence"] == ["local-1"]
        assert proc.poll() is None
    finally:
        stop_process(proc)


def test_external_ips_from_the_node_are_served_by_the_hooks(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    external = "203.0.113.10"
    manifests.write(
        "ext.yaml",
        service("ext", VIP, [HTTP], externalIPs=[external]),
        endpoint_slice("ext", eps("local-1", "remote-1"), [TARGET]),
    )
    sync(lab, manifests, *bpf.flags())
    ns_exec(lab.node_ns, "conntrack", "-F", check=False)
    seen = bpf.client(lab.pods["client"].netns, "tcp", external, 80, 20)
    assert set(seen["answers"]) == {"local-1", "remote-1"}, seen
    assert seen["peers"] == [f"{external}:80"]
    assert conntrack_to(lab, external) == []


def test_ipv4_mapped_ipv6_destinations_reach_the_ipv4_service(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    web(manifests, "local-1", "remote-1")
    sync(lab, manifests, *bpf.flags())
    ns_exec(lab.node_ns, "conntrack", "-F", check=False)
    tcp_and_udp_reach(lab, bpf, f"::ffff:{VIP}", {"local-1", "remote-1"})
    assert conntrack_to(lab, VIP) == []


def test_pins_of_another_map_layout_are_replaced_without_a_gap(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    web(manifests, "local-1", "local-2")
    sync(lab, manifests, *bpf.flags())
    # Pretend an older version pinned them: its names, its (here: same) maps.
    old = {}
    for name in MAPS:
        pin = map_pin(bpf.pin_path, name)
        old[name] = pin.with_name(name)
        pin.rename(old[name])
    ns_exec(lab.node_ns, "conntrack", "-F", check=False)
    loop = bpf.spawn_client(lab.pods["client"].netns, "loop", VIP, 80, 3)
    time.sleep(0.5)
    sync(lab, manifests, *bpf.flags())
    out, _ = loop.communicate(timeout=30)
    answers = json.loads(out)["answers"]
    assert set(answers) == {"local-1", "local-2"}, answers
    assert conntrack_to(lab, VIP) == []
    assert not any(pin.exists() for pin in old.values())
    assert all(map_pin(bpf.pin_path, name).exists() for name in MAPS)


def test_without_the_fallback_flag_a_node_without_the_hooks_refuses_to_start(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir, tmp_path: Path
) -> None:
    web(manifests, "local-1")
    flags = ("--ebpf-cgroup-path", str(tmp_path), "--ebpf-pin-path", str(bpf.pin_path))
    result = lab.sync_once(manifests.path, *flags)
    assert result.returncode != 0
    assert "not a cgroup v2 directory" in result.stderr
    assert "--ebpf-fallback nftables" in result.stderr
    # With it: nftables mode serves the ClusterIP (DNAT, so conntrack has the VIP).
    sync(lab, manifests, *flags, "--ebpf-fallback", "nftables")
    ns_exec(lab.node_ns, "conntrack", "-F", check=False)
    seen = client(lab, bpf, "tcp", count=5)
    assert seen["answers"] == {"local-1": 5}
    assert conntrack_to(lab, VIP) != []
    assert not bpf.pin_path.exists()  # the earlier test's hooks were removed


def test_explain_says_what_the_hooks_do_and_the_kernel_agrees(
    lab: Lab, bpf: BpfLab, manifests: ManifestDir
) -> None:
    """``explain --live`` in ebpf mode: the pinned map holds the plan's entry (no drift),
    a hooked client reaches exactly the explained endpoints, and what the hooks leave
    alone is nftables mode's explanation, still without drift."""
    web(manifests, "local-1", "remote-1")
    manifests.write(
        "none.yaml",
        service("none", "10.96.7.3", [HTTP]),
        endpoint_slice("none", [], [TARGET]),
    )
    sync(lab, manifests, *bpf.flags())

    def explain(src: str, dst: str) -> Any:
        return lab.explain(manifests.path, *bpf.flags(), "--src", src, "--dst", dst, "--port", "80")

    hooked = explain(ip("client"), VIP)
    assert hooked["verdict"] == "SOCKET-LB", hooked["reasons"]
    assert hooked["drift"] == [], hooked["drift"]
    assert hooked["masquerade"] is False
    explained = {e.split(":")[0] for e in hooked["endpoints"]}
    assert explained == {ip("local-1"), ip("remote-1")}
    assert any("kp_svc4" in o for o in hooked["kernelObjects"])
    ns_exec(lab.node_ns, "conntrack", "-F", check=False)
    answered = set(client(lab, bpf, "tcp")["answers"])
    assert answered == {"local-1", "remote-1"}
    assert conntrack_to(lab, VIP) == []  # the hooks did it, as explained
    # From outside the node: nftables' DNAT, its objects checked live (no drift).
    outside = explain(CLIENT_IP, VIP)
    assert outside["verdict"] == "DNAT", outside["reasons"]
    assert outside["drift"] == [], outside["drift"]
    # No endpoints: no map entry (checked in the pinned map), nftables REJECTs.
    refused = explain(ip("client"), "10.96.7.3")
    assert refused["verdict"] == "REJECT", refused["reasons"]
    assert refused["drift"] == [], refused["drift"]
    assert bpf.client(lab.pods["client"].netns, "tcp", "10.96.7.3", 80, 3)["answers"] == {
        "ECONNREFUSED": 3
    }
    # list --live: every frontend, nftables' objects and the hooks' map entries.
    code, listed = lab.list_live(manifests.path, *bpf.flags())
    assert (code, listed["mode"], listed["kernelOnly"]) == (0, "ebpf", []), listed
    assert all(r["drift"] == [] for r in listed["frontends"]), listed
    # The plan changes but the proxy has not synced it: the map read finds the difference.
    web(manifests, "local-1", "remote-1", "local-2")
    stale = explain(ip("client"), VIP)
    missing = f"missing endpoint {ip('local-2')}:8080 in kp_svc4 ({VIP}:80/TCP)"
    assert missing in stale["drift"]
    code, listed = lab.list_live(manifests.path, *bpf.flags())
    drifted = {r["frontend"]: r["drift"] for r in listed["frontends"] if r["drift"]}
    assert code == 1
    assert missing in drifted[f"{VIP}:80"], drifted


HOOKS = sorted(
    f"cgroup_{kind}{v}_{hook}"
    for v in "46"
    for kind, hook in (
        ("inet", "connect"),
        ("udp", "sendmsg"),
        ("udp", "recvmsg"),
        ("inet", "getpeername"),
    )
)


def _attached(bpf: BpfLab, cgroup: Path | None = None) -> list[str]:
    """The hooks with a program attached to the test cgroup (``bpftool cgroup show``)."""
    out = sh("bpftool", "cgroup", "show", str(cgroup or bpf.cgroup))
    return sorted(line.split()[1] for line in out.splitlines()[1:] if line.strip())


def _link_ids(bpf: BpfLab) -> dict[str, int]:
    out = {}
    for hook in PROGRAMS:
        fd = obj_get(str(bpf.pin_path / f"link_{hook}"))
        try:
            out[hook] = link_info(fd).id
        finally:
            os.close(fd)
    return out


def _table_handles(lab: Lab) -> list[int]:
    """The kernel's handles of node-a's kube-proxy tables (new ones if re-created)."""
    listing = json.loads(ns_exec(lab.node_ns, "nft", "-j", "list", "tables"))
    return sorted(
        item["table"]["handle"]
        for item in listing["nftables"]
        if item.get("table", {}).get("name") == "kube-proxy"
    )
