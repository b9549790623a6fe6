"""``kubeproxy explain`` against the real kernel: for each flow the packet-flow tests send,
explain's verdict and endpoints are what the kernel did.

Each scenario is one of the setups of test_traffic.py, test_features.py and
test_detect_local.py (same Services, endpoints and flags). For each flow, explain runs
first, in node-a's namespace with the flags the proxy ran with (``Lab.explain``, with
``--live``: its drift report must be empty); then the flow is sent for real and the
outcome compared:

* ``DNAT`` — exactly the explained endpoints answer (a subset for session affinity),
  and the endpoint sees the client's own address unless explain says masquerade;
* ``REJECT`` — every connection is refused; ``DROP`` — every one times out;
* ``NONE`` — no endpoint answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from kubeproxy.backends.iptables.names import ServicePortChains
from kubeproxy.explain.running import fetch_url
from kubeproxy.lab.cluster import (
    CLIENT_IP,
    CLIENT_IP6,
    CLUSTER_CIDRS,
    NODE,
    NODE_IP,
    NODE_IP6,
    POD_CIDRS,
    REMOTE_NODE_IP,
    Lab,
    stop_process,
)
from kubeproxy.lab.echo import tcp_ask, udp_ask
from kubeproxy.lab.netns import ns_exec
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, node, service
from kubeproxy.model.types import L4Protocol, NamespacedName, ServicePortName
from tests.kernel.conftest import ALL_MODES, HTTP, PODS, eps, ip, sync, wait_for
from tests.kernel.test_detect_local import host_interface
from tests.kernel.test_features import load_balancer
from tests.kernel.test_traffic import nodeport

PROXY_MODES = ALL_MODES

Outcome = tuple[str, str | None]  # (pod, client address it saw) or (failure, None)


@dataclass(frozen=True)
class Flow:
    """A connection from ``where``: ``outside`` (the client), ``node``, or a Pod by name."""

    where: str
    dst: str
    port: int = 80
    protocol: str = "TCP"
    sticky: bool = False  # session affinity: one endpoint of those explained answers
    interface: bool = False  # tell explain the interface the Pod's packets come in on


@dataclass(frozen=True)
class Scenario:
    id: str
    objects: tuple[dict[str, Any], ...]
    flows: tuple[Flow, ...]
    flags: tuple[str, ...] = ()
    pod_cidrs: bool = False


def fw(ranges: list[str]) -> tuple[dict[str, Any], ...]:
    return (
        load_balancer(
            "fw", "10.96.20.3", [{"ip": "198.51.100.20"}], node_port=30501,
            loadBalancerSourceRanges=ranges,
        ),
        endpoint_slice("fw", eps("local-1")),
    )  # fmt: skip


DETECT_LOCAL = (
    service("local-check", "10.96.40.1"),
    endpoint_slice("local-check", [Ep(ip("local-1"), node=NODE)]),
)
TARGET = {"name": "http", "port": 8080}

SCENARIOS = (
    Scenario(
        "cluster-ip",
        (
            service("web", "10.96.1.1", [HTTP, {"name": "dns", "port": 53, "protocol": "UDP"}]),
            endpoint_slice(
                "web",
                [*eps("local-1", "local-2", "remote-1"), Ep(ip("remote-2"), ready=False)],
                [TARGET, {"name": "dns", "port": 8080, "protocol": "UDP"}],
            ),
        ),
        (
            Flow("client", "10.96.1.1"),
            Flow("client", "10.96.1.1", 53, "UDP"),
            Flow("node", "10.96.1.1"),
            Flow("client", "10.96.1.1", 82),
        ),
    ),
    Scenario(
        "outside-to-cluster-ip",
        (service("web", "10.96.4.1", [HTTP]), endpoint_slice("web", eps("remote-1"))),
        (Flow("outside", "10.96.4.1"),),
    ),
    Scenario(
        "ipv6-cluster-ip",
        (
            service("web6", ["10.96.1.2", "fd00:10:96::2"], [HTTP]),
            endpoint_slice("web6", eps("local-1", "remote-1")),
            endpoint_slice("web6", eps("local-2", "remote-2", family=6)),
        ),
        (Flow("client", "fd00:10:96::2"), Flow("client", "10.96.1.2")),
    ),
    Scenario(
        "no-endpoints-reject",
        (nodeport("empty", "10.96.1.4", 30100), endpoint_slice("empty", [])),
        (Flow("client", "10.96.1.4"), Flow("outside", NODE_IP, 30100)),
    ),
    Scenario(
        "only-terminating",
        (
            service("draining", "10.96.1.5", [HTTP]),
            endpoint_slice(
                "draining",
                [
                    *eps("local-1", "remote-1", ready=False, serving=True, terminating=True),
                    *eps("local-2", ready=False, serving=False, terminating=True),
                ],
            ),
        ),
        (Flow("client", "10.96.1.5"),),
    ),
    Scenario(
        "internal-local",
        (
            service("cache", "10.96.2.1", [HTTP], internalTrafficPolicy="Local"),
            endpoint_slice("cache", eps("local-1", "remote-1", "remote-2")),
            service("cache2", "10.96.2.2", [HTTP], internalTrafficPolicy="Local"),
            endpoint_slice("cache2", eps("remote-1")),
        ),
        (Flow("client", "10.96.2.1"), Flow("client", "10.96.2.2")),
    ),
    Scenario(
        "external-local",
        (
            nodeport("shop", "10.96.3.1", 30200, externalTrafficPolicy="Local"),
            endpoint_slice("shop", eps("local-1", "remote-1", "remote-2")),
            nodeport("shop2", "10.96.3.2", 30201, externalTrafficPolicy="Local"),
            endpoint_slice("shop2", eps("remote-1")),
        ),
        (
            Flow("outside", NODE_IP, 30200),
            Flow("client", "10.96.3.1"),
            Flow("outside", NODE_IP, 30201),
            Flow("client", NODE_IP, 30201),
            Flow("node", NODE_IP, 30201),
        ),
    ),
    Scenario(
        "external-cluster-masquerades",
        (nodeport("shop", "10.96.3.3", 30202), endpoint_slice("shop", eps("local-1", "remote-1"))),
        (Flow("outside", NODE_IP, 30202), Flow("outside", "192.168.60.1", 30202)),
    ),
    Scenario(
        "nodeport-addresses",
        (nodeport("shop", "10.96.3.4", 30203), endpoint_slice("shop", eps("local-1"))),
        (Flow("outside", "192.168.60.1", 30203), Flow("outside", NODE_IP, 30203)),
        flags=("--nodeport-addresses", "192.168.60.0/24"),
    ),
    Scenario(
        "hairpin",
        (service("self", "10.96.4.2", [HTTP]), endpoint_slice("self", eps("local-1"))),
        (Flow("local-1", "10.96.4.2"),),
    ),
    Scenario(
        "masquerade-all",
        (service("web", "10.96.4.3", [HTTP]), endpoint_slice("web", eps("remote-1"))),
        (Flow("client", "10.96.4.3"),),
        flags=("--masquerade-all",),
    ),
    Scenario(
        "external-ips",
        (
            service("ext", "10.96.20.1", [HTTP], externalIPs=["203.0.113.10"]),
            endpoint_slice("ext", eps("local-1", "remote-1")),
        ),
        (Flow("outside", "203.0.113.10"),),
    ),
    Scenario(
        "load-balancer-local",
        (
            load_balancer(
                "lb",
                "10.96.20.2",
                [{"ip": "198.51.100.10"}, {"ip": "198.51.100.11", "ipMode": "Proxy"}],
                externalTrafficPolicy="Local",
            ),
            endpoint_slice("lb", eps("local-1", "remote-1")),
        ),
        (Flow("outside", "198.51.100.10"), Flow("outside", "198.51.100.11")),
    ),
    Scenario(
        "source-ranges-allow-outside",
        fw([" 192.168.60.0/24 ", "172.16.0.0/12"]),
        (
            Flow("outside", "198.51.100.20"),
            Flow("client", "198.51.100.20"),
            Flow("outside", NODE_IP, 30501),
            Flow("client", "10.96.20.3"),
        ),
    ),
    Scenario(
        "source-ranges-allow-pods",
        fw(["10.244.0.0/16"]),
        (Flow("outside", "198.51.100.20"), Flow("client", "198.51.100.20")),
    ),
    Scenario(
        "session-affinity",
        (
            service(
                "sticky",
                "10.96.21.1",
                [HTTP],
                sessionAffinity="ClientIP",
                sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}},
            ),
            endpoint_slice("sticky", eps("local-1", "local-2", "remote-1")),
        ),
        (Flow("client", "10.96.21.1", sticky=True),),
    ),
    Scenario(
        "service-cidrs",
        (service("web", "10.96.24.1", [HTTP]), endpoint_slice("web", eps("local-1"))),
        (
            Flow("client", "10.96.24.1"),
            Flow("client", "10.96.24.1", 81),
            Flow("client", "10.96.99.99"),
        ),
        flags=("--service-cluster-ip-range", "10.96.0.0/16"),
    ),
    Scenario(
        "nodeports-on-localhost",
        (
            service("np", "10.96.25.1", [{**HTTP, "nodePort": 30800}], type="NodePort"),
            endpoint_slice("np", eps("local-1")),
        ),
        (Flow("node", NODE_IP, 30800), Flow("node", "127.0.0.1", 30800)),
        flags=("--nodeport-addresses", "0.0.0.0/0"),
    ),
    Scenario(
        "detect-local-cluster-cidr",
        DETECT_LOCAL,
        (Flow("client", "10.96.40.1"), Flow("remote-1", "10.96.40.1")),
        pod_cidrs=True,
    ),
    Scenario(
        "detect-local-node-cidr",
        DETECT_LOCAL,
        (Flow("client", "10.96.40.1"), Flow("remote-1", "10.96.40.1")),
        flags=("--detect-local-mode", "NodeCIDR"),
        pod_cidrs=True,
    ),
    Scenario(
        "detect-local-interface-prefix",
        DETECT_LOCAL,
        (
            Flow("client", "10.96.40.1", interface=True),
            Flow("remote-1", "10.96.40.1", interface=True),
        ),
        flags=("--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "vp"),
        pod_cidrs=True,
    ),
    Scenario(
        "detect-local-bridge-interface",
        DETECT_LOCAL,
        (
            Flow("client", "10.96.40.1", interface=True),
            Flow("local-2", "10.96.40.1", interface=True),
        ),
        flags=("--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "{client_if}"),
        pod_cidrs=True,
    ),
    Scenario(
        "invalid-service-skipped",
        (
            service("good", "10.96.5.1", [HTTP]),
            endpoint_slice("good", eps("local-1")),
            service("bad", "10.96.5.2", [{"name": "http", "port": 0}]),
            endpoint_slice("bad", eps("local-2")),
        ),
        (Flow("client", "10.96.5.1"), Flow("client", "10.96.5.2")),
    ),
    Scenario(
        "remote-node-is-not-a-nodeport",
        (nodeport("shop", "10.96.7.1", 30300), endpoint_slice("shop", eps("local-1"))),
        (Flow("outside", REMOTE_NODE_IP, 30300),),
    ),
    Scenario(
        "dual-stack-nodeport",
        (
            service(
                "ds",
                ["10.96.26.1", "fd00:10:96::26"],
                [{**HTTP, "nodePort": 30600}],
                type="NodePort",
            ),
            endpoint_slice("ds", eps("local-1", "remote-1")),
            endpoint_slice("ds", eps("remote-2", family=6)),
        ),
        (Flow("outside", NODE_IP6, 30600), Flow("client", "fd00:10:96::26")),
    ),
)


def source(lab: Lab, flow: Flow) -> tuple[str, str]:
    """(network namespace, source address) of a flow."""
    v6 = ":" in flow.dst
    if flow.where == "outside":
        return lab.client_ns, CLIENT_IP6 if v6 else CLIENT_IP
    if flow.where == "node":
        if flow.dst.startswith("127."):
            return lab.node_ns, flow.dst
        return lab.node_ns, NODE_IP6 if v6 else NODE_IP
    return lab.pods[flow.where].netns, ip(flow.where, 6 if v6 else 4)


def flags(lab: Lab, scenario: Scenario) -> tuple[str, ...]:
    """The scenario's flags, ``{client_if}`` being the node's interface to the client Pod."""
    client_if = host_interface(lab, "client")
    return tuple(f.format(client_if=client_if) for f in scenario.flags)


def observe(dst: str, port: int, protocol: str, count: int, timeout: float) -> list[Outcome]:
    ask = tcp_ask if protocol == "TCP" else udp_ask
    out: list[Outcome] = []
    for _ in range(count):
        try:
            reply = ask(dst, port, timeout)
            out.append((reply.pod, reply.client_ip))
        except ConnectionRefusedError:
            out.append(("refused", None))
        except TimeoutError:
            out.append(("timeout", None))
        except OSError as err:
            out.append((f"error:{err.errno}", None))
    return out


def pod_of(endpoint: str) -> str:
    address = endpoint.rpartition(":")[0].strip("[]")
    return next(name for name, (_, v4, v6) in PODS.items() if address in (v4, v6))


def check(lab: Lab, manifests: ManifestDir, scenario: Scenario, flow: Flow) -> None:
    ns, src = source(lab, flow)
    packet = ["--src", src, "--dst", flow.dst, "--port", str(flow.port)]
    packet += ["--protocol", flow.protocol]
    if flow.interface:
        packet += ["--in-interface", host_interface(lab, flow.where)]
    explained = lab.explain(manifests.path, *flags(lab, scenario), *packet)
    what = f"{flow} in {lab.mode}: {explained['verdict']} {explained['reasons']}"
    assert explained["drift"] == [], what
    verdict = explained["verdict"]
    n = len(explained["endpoints"])
    count, timeout = (max(12, 15 * n), 2.0) if verdict == "DNAT" else (2, 0.5)
    seen = lab.executor(ns).call(observe, flow.dst, flow.port, flow.protocol, count, timeout)
    kinds = {pod for pod, _ in seen}
    if verdict == "DNAT":
        expected = {pod_of(e) for e in explained["endpoints"]}
        assert kinds <= expected if flow.sticky else kinds == expected, (what, seen)
        if flow.sticky:
            assert len(kinds) == 1, (what, seen)
        # The node's own connections are masqueraded to a node address, which may be
        # their source address already: nothing to see from the endpoint.
        if flow.where != "node":
            masqueraded = {client != src for _, client in seen}
            assert masqueraded == {explained["masquerade"]}, (what, seen)
    elif verdict == "REJECT":
        assert kinds == {"refused"}, (what, seen)
    elif verdict == "DROP":
        assert kinds == {"timeout"}, (what, seen)
    else:
        assert verdict == "NONE", what
        assert not kinds & set(PODS), (what, seen)


# iptables-nft is left out of this matrix: it is given the same iptables-restore input
# as iptables-legacy, so explain's verdicts are the same; how each flavour holds and
# lists the rules is checked by the --live tests below in every mode, and the packet
# behaviour of the nft flavour by tests/kernel/test_traffic.py and test_features.py.
# (The 25 scenarios cost about 4 minutes a mode.)
@pytest.mark.proxy_modes("nftables", "iptables-legacy")
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_explain_agrees_with_the_kernel(
    lab: Lab, manifests: ManifestDir, scenario: Scenario
) -> None:
    if scenario.pod_cidrs:
        manifests.write(
            "node.yaml", node(NODE, [NODE_IP, NODE_IP6], zone="zone-a", pod_cidrs=POD_CIDRS[NODE])
        )
    manifests.write("svc.yaml", *scenario.objects)
    sync(lab, manifests, *flags(lab, scenario))
    for flow in scenario.flows:
        check(lab, manifests, scenario, flow)


def test_live_reports_drift(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        service("web", "10.96.50.1", [HTTP]),
        endpoint_slice("web", eps("local-1", "remote-1")),
    )
    sync(lab, manifests)
    packet = ("--src", ip("client"), "--dst", "10.96.50.1", "--port", "80")
    assert lab.explain(manifests.path, *packet)["drift"] == []
    # Someone removes an endpoint behind the proxy's back.
    remove_by_hand(lab, manifests, "10.96.50.1", "remote-1")
    drift = lab.explain(manifests.path, *packet)["drift"]
    assert drift and all(ip("remote-1") in d for d in drift), drift


def remove_by_hand(lab: Lab, manifests: ManifestDir, vip: str, pod: str) -> None:
    """Take ``pod`` out of the rules of Service ``web`` (``vip``:80) behind the proxy's
    back: its backends-map element (nftables) or its KUBE-SEP- chain's rule (iptables)."""
    if lab.mode == "nftables":
        packet = ("--src", ip("client"), "--dst", vip, "--port", "80")
        backends, index = explain_index(lab.explain(manifests.path, *packet), ip(pod))
        element = f"{{ {vip} . tcp . 80 . {index} }}"
        ns_exec(lab.node_ns, "nft", "delete", "element", "ip", "kube-proxy", backends, element)
    else:
        name = ServicePortName(NamespacedName("default", "web"), "http", L4Protocol.TCP)
        sep = ServicePortChains(name).sep(f"{ip(pod)}:8080")
        binary = "iptables-legacy" if lab.mode == "iptables-legacy" else "iptables-nft"
        ns_exec(lab.node_ns, binary, "-t", "nat", "-F", sep)


def explain_index(explained: dict[str, Any], address: str) -> tuple[str, str]:
    """The backends map (the shared chain's) and index of an endpoint, from explain's
    kernel objects."""
    for line in explained["kernelObjects"]:
        if "-backends element" in line and f": {address} . " in line:
            backends = line.split(": ", 1)[1].split(" element", 1)[0]
            return backends, str(line.split(" : ")[0].rsplit(" . ", 1)[1])
    raise AssertionError(f"{address} not in {explained['kernelObjects']}")


def test_list_live_checks_every_frontend(lab: Lab, manifests: ManifestDir) -> None:
    """``list --live``: every frontend compared with the kernel (no drift right after a
    sync); an endpoint removed behind the proxy's back is drift on that frontend only;
    a Service gone from the source while its rules stay is named as the kernel's alone."""
    manifests.write(
        "svc.yaml",
        nodeport("web", "10.96.51.1", 30551),
        endpoint_slice("web", eps("local-1", "remote-1")),
        service("db", "10.96.51.2"),
        endpoint_slice("db", eps("remote-2")),
        service("empty", "10.96.51.3"),
    )
    sync(lab, manifests)
    code, listed = lab.list_live(manifests.path)
    frontends = {(r["frontend"], r["service"]): r for r in listed["frontends"]}
    assert set(frontends) >= {
        ("10.96.51.1:80", "default/web"), ("*:30551", "default/web"),
        ("10.96.51.2:80", "default/db"), ("10.96.51.3:80", "default/empty"),
    }  # fmt: skip
    assert (code, listed["kernelOnly"]) == (0, []), listed
    assert all(r["drift"] == [] for r in listed["frontends"]), listed
    assert listed["mode"] == ("nftables" if lab.mode == "nftables" else "iptables")

    # Someone removes an endpoint of web behind the proxy's back.
    remove_by_hand(lab, manifests, "10.96.51.1", "remote-1")
    code, listed = lab.list_live(manifests.path)
    drifted = {r["frontend"]: r["drift"] for r in listed["frontends"] if r["drift"]}
    assert code == 1
    assert "10.96.51.1:80" in drifted, listed
    assert all(ip("remote-1") in d for lines in drifted.values() for d in lines), drifted
    assert "10.96.51.2:80" not in drifted

    # A sync puts web right again; then db and empty leave the source, and the kernel
    # still has their rules (no sync since).
    sync(lab, manifests)
    manifests.write(
        "svc.yaml",
        nodeport("web", "10.96.51.1", 30551),
        endpoint_slice("web", eps("local-1", "remote-1")),
    )
    code, listed = lab.list_live(manifests.path)
    assert code == 1
    assert all(r["drift"] == [] for r in listed["frontends"]), listed
    stale = listed["kernelOnly"]
    assert stale and all("(stale)" in line for line in stale), stale
    if lab.mode == "nftables":
        assert any("10.96.51.2 . tcp . 80" in line for line in stale), stale
    else:
        chains = ServicePortChains(
            ServicePortName(NamespacedName("default", "db"), "http", L4Protocol.TCP)
        )
        assert any(chains.svc in line for line in stale), stale
    # Narrowed to one Service, list --live checks its frontends only.
    code, listed = lab.list_live(manifests.path, "web")
    assert (code, listed["kernelOnly"]) == (0, [])
    assert {r["service"] for r in listed["frontends"]} == {"default/web"}


def test_live_finds_the_mode_running_here(lab: Lab, manifests: ManifestDir) -> None:
    """Without --proxy-mode, ``--live`` compares with the mode running on the node: the
    one whose rules the kernel holds, or the one the running proxy's /proxyMode names."""
    manifests.write("svc.yaml", service("web", "10.96.52.1"), endpoint_slice("web", eps("local-1")))
    sync(lab, manifests)
    mode = "nftables" if lab.mode == "nftables" else "iptables"
    flags = (
        "--manifests", str(manifests.path), "--hostname-override", NODE,
        "--cluster-cidr", ",".join(CLUSTER_CIDRS), "--metrics-bind-address", "127.0.0.1:10249",
    )  # fmt: skip
    done = lab.run(lab.kubeproxy_command("list", *flags, "--live", "-o", "json"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["mode"] == mode
    assert f"Proxy mode {mode}: the kernel holds that mode's rules" in done.stderr
    if lab.mode != "nftables":
        return
    proxy = lab.start(manifests.path, "--metrics-bind-address", "127.0.0.1:10249")
    try:
        url = "http://127.0.0.1:10249/proxyMode"
        wait_for(lambda: lab.executor(lab.node_ns).call(fetch_url, url) == "nftables")
        packet = ("--src", ip("client"), "--dst", "10.96.52.1", "--port", "80")
        done = lab.run(lab.kubeproxy_command("explain", *flags, *packet, "--live", "-o", "json"))
        assert done.returncode == 0, done.stderr
        assert f"Proxy mode nftables: the running proxy's {url} says so" in done.stderr
        assert json.loads(done.stdout)["drift"] == []
    finally:
        stop_process(proxy)
