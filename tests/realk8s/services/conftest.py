"""The Service-type tests' proxy under test, and an outside host that tells a leak from a drop.

**The proxy under test** (:func:`proxy`, package-scoped, two parameters): every test here
runs once with kubeproxy on :data:`NODE` and once with upstream's own kube-proxy (v1.37,
nftables mode, the binary the lab built) there instead, the other nodes keeping
kubeproxy. The assertions about :data:`NODE` are the same for both, so upstream is the
oracle for each of them; where the two differ the test says which does what, and why.
Swapping stops kubeproxy, deletes its tables, starts upstream and waits for its first
sync of both families; putting back does the reverse and waits for kubeproxy's first full
sync. Each could take the other's tables over (tests/realk8s/test_migration.py), but
upstream deletes only what it knows by name: kubeproxy's other chains, sets and maps
would stay in its table, unreachable, and an oracle is easier to read without them.
pytest groups the package's tests by parameter, so the whole package swaps once, and puts
kubeproxy back before any test outside the package runs.

**The outside host refuses what it would have to forward** (:func:`refusing_outside`,
package-scoped, automatic): the nodes' default route leads to it, so a packet to a
Service address that no rule handled ("leaked") is answered by a TCP reset there, and
the client sees ``refused``; a packet the proxy drops is a ``timeout``. (With the plain
outside host, which does not forward, both would be timeouts.) It gets routes to the
Pods' networks and a default route for that, and a test routes its LoadBalancer and
external IPs to a node through :func:`outside_routes`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubeproxy.lab.cluster import stop_process
from kubeproxy.lab.echo import outcome, tcp_ask
from kubeproxy.lab.kube.api import Obj
from kubeproxy.lab.kube.cluster import CLUSTER_CIDRS, KubeLab, KubeNode, wait_for
from kubeproxy.lab.netns import ns_exec, sh, sysctls
from tests.realk8s.conftest import PROXY_FLAGS, proxy_log

# The node whose proxy is under test (zone-b: the only node of its zone).
NODE = "node-b"
UPSTREAM_SYNCED = (
    '"SyncProxyRules complete" ipFamily="IPv4"',
    '"SyncProxyRules complete" ipFamily="IPv6"',
)
REFUSE_TABLE = "kplab-refuse"
SINK = "kplabsink"
REFUSE_RULES = f"""
table inet {REFUSE_TABLE} {{
    chain forward {{
        type filter hook forward priority 0; policy accept;
        meta l4proto tcp reject with tcp reset
        reject
    }}
}}
"""


def delete_proxy_tables(netns: str) -> None:
    """The nftables mode's tables (kubeproxy's and upstream's have the same names)."""
    for family in ("ip", "ip6"):
        ns_exec(netns, "nft", "delete", "table", family, "kube-proxy", check=False)


def _upstream_synced(log: str) -> bool:
    for trouble in ("nftables sync failed", "address already in use"):
        if trouble in log:
            raise RuntimeError(f"upstream kube-proxy: {trouble}: {log[-3000:]}")
    return all(line in log for line in UPSTREAM_SYNCED)


@dataclass
class Upstream:
    """Upstream kube-proxy in nftables mode on one node of the lab.

    As the admin (what it may read is not the question here), with the lab's cluster
    CIDRs; ``--conntrack-max-per-core=0`` leaves nf_conntrack_max alone, which a network
    namespace may not set. Its log: ``<workdir>/upstream-kube-proxy-<node>.log``.
    """

    kube: KubeLab
    node: str
    proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Start it and wait for its first sync of both families (a full one)."""
        log = self.kube.workdir / f"upstream-kube-proxy-{self.node}.log"
        log.unlink(missing_ok=True)
        self.proc = self.kube.spawn(
            ["ip", "netns", "exec", self.kube.nodes[self.node].netns,
             self.kube.binaries.kube_proxy,
             "--kubeconfig", str(self.kube.cp.admin_kubeconfig()),
             "--hostname-override", self.node, "--proxy-mode", "nftables",
             "--cluster-cidr", ",".join(CLUSTER_CIDRS),
             "--conntrack-max-per-core=0", "--v=2"],
            log,
        )  # fmt: skip
        wait_for(
            lambda: _upstream_synced(log.read_text(errors="replace")),
            timeout=60,
            what=f"upstream kube-proxy's first sync on {self.node}",
        )

    def stop(self) -> None:
        """Stop it; its rules stay, as on any stop."""
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


@contextlib.contextmanager
def upstream_on(kube: KubeLab, node: str) -> Iterator[Upstream]:
    """Upstream kube-proxy on ``node`` instead of kubeproxy for the block, kubeproxy after
    (each on a node without the other's tables: see the module docstring)."""
    netns = kube.nodes[node].netns
    kube.stop_kubeproxy(node)
    delete_proxy_tables(netns)
    upstream = Upstream(kube, node)
    try:
        upstream.start()
        yield upstream
    finally:
        upstream.stop()
        delete_proxy_tables(netns)
        seen = len(proxy_log(kube, node))
        kube.start_kubeproxy(node, *PROXY_FLAGS)
        wait_for(
            lambda: "Synced full rules" in proxy_log(kube, node)[seen:],
            timeout=60,
            what=f"kubeproxy's first sync on {node} again",
        )


@dataclass(frozen=True)
class NodeProxy:
    """Which proxy runs on :data:`NODE` for this module's tests."""

    node: KubeNode
    # None: kubeproxy (the session's, with conftest's PROXY_FLAGS).
    upstream: Upstream | None = None

    @property
    def name(self) -> str:
        return "kubeproxy" if self.upstream is None else "upstream"


@pytest.fixture(scope="package", params=["kubeproxy", "upstream"])
def proxy(request: pytest.FixtureRequest, kube: KubeLab) -> Iterator[NodeProxy]:
    """The proxy on :data:`NODE` (see the module docstring)."""
    if request.param == "kubeproxy":
        yield NodeProxy(kube.nodes[NODE])
        return
    with upstream_on(kube, NODE) as upstream:
        yield NodeProxy(kube.nodes[NODE], upstream)


@pytest.fixture(scope="package", autouse=True)
def refusing_outside(kube: KubeLab) -> Iterator[None]:
    """The outside host resets every TCP connection it would forward (see the docstring)."""
    out = kube.outside_ns
    routes: list[tuple[str, ...]] = []
    for node in kube.nodes.values():
        for cidr, via in zip(node.pod_cidrs, (node.ip, node.ip6), strict=True):
            routes.append((cidr, "via", via))
    ns_exec(out, "nft", "-f", "-", input=REFUSE_RULES)
    try:
        # Somewhere to forward everything else to, so that it meets the rule.
        # (A veth pair: this kernel has no dummy links.)
        sh("ip", "-n", out, "link", "add", SINK, "type", "veth", "peer", f"{SINK}-peer")
        sh("ip", "-n", out, "link", "set", SINK, "up")
        sh("ip", "-n", out, "link", "set", f"{SINK}-peer", "up")
        routes += [("default", "dev", SINK), ("::/0", "dev", SINK)]
        for spec in routes:
            sh("ip", "-n", out, "route", "add", *spec)
        sysctls(out, {"net.ipv4.ip_forward": "1", "net.ipv6.conf.all.forwarding": "1"})
        yield
    finally:
        sysctls(out, {"net.ipv4.ip_forward": "0", "net.ipv6.conf.all.forwarding": "0"})
        for spec in routes:
            sh("ip", "-n", out, "route", "del", *spec, check=False)
        sh("ip", "-n", out, "link", "del", SINK, check=False)
        ns_exec(out, "nft", "delete", "table", "inet", REFUSE_TABLE)


@dataclass
class OutsideRoutes:
    """Routes on the outside host to addresses a node should answer for (a cloud load
    balancer's or a router's job); :func:`outside_routes` deletes them after the test."""

    kube: KubeLab
    added: list[str] = field(default_factory=list)

    def add(self, ip: str, node: str) -> None:
        via = self.kube.nodes[node].ip6 if ":" in ip else self.kube.nodes[node].ip
        sh("ip", "-n", self.kube.outside_ns, "route", "replace", ip, "via", via)
        self.added.append(ip)


@pytest.fixture
def outside_routes(kube: KubeLab) -> Iterator[OutsideRoutes]:
    routes = OutsideRoutes(kube)
    yield routes
    for ip in routes.added:
        sh("ip", "-n", kube.outside_ns, "route", "del", ip, check=False)


def service(
    kube: KubeLab,
    namespace: str,
    name: str = "web",
    *,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> Obj:
    """A Service selecting app=web, port 80 to 8080, with ``spec`` fields added."""
    return kube.api().create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {
                "selector": {"app": "web"},
                "ports": [{"port": 80, "targetPort": 8080}],
                **spec,
            },
        }
    )


def attempt(kube: KubeLab, netns: str, ip: str, port: int) -> str:
    """One TCP request: the Pod that answered, ``refused`` or ``timeout``."""
    return kube.executor(netns).call(outcome, tcp_ask, ip, port, 1.0)


def settles_on(kube: KubeLab, netns: str, ip: str, port: int, want: str) -> str:
    """Ask until the outcome is ``want`` (rules follow the API after a moment)."""
    result: str = wait_for(
        lambda: attempt(kube, netns, ip, port) == want and want,
        timeout=30,
        what=f"{want} from {ip}:{port} in {netns}",
    )
    return result


def _http_get(url: str) -> tuple[int, dict[str, str], str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status), dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


@dataclass(frozen=True)
class HealthCheck:
    """One answer of a Service's ``healthCheckNodePort``."""

    status: int
    headers: dict[str, str]
    text: str

    @property
    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self.text)
        return body


def health_check(kube: KubeLab, node: str, port: int) -> HealthCheck:
    """GET a node's health-check node port from the outside host (as a cloud LB does)."""
    status, headers, body = kube.executor(kube.outside_ns).call(
        _http_get, f"http://{kube.nodes[node].ip}:{port}/"
    )
    return HealthCheck(status, headers, body)
