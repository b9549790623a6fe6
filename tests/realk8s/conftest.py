"""The real-Kubernetes tier: upstream's kube-apiserver, kube-controller-manager, kubectl
(and kube-proxy, for migrations) built here, with kubeproxy on every node.

One cluster serves the whole session (:mod:`kubeproxy.lab.kube.cluster`: three nodes in
two zones, kubeproxy in nftables mode on each, reading the API server with deploy/'s
ServiceAccount); building it takes about 10 s. Each test works in a Kubernetes namespace
of its own (:func:`namespace`), deleted afterwards, and Pods named after it, so tests do
not see each other's Services. A test that stops or restarts a component puts it back.

Needs root (network namespaces) and the upstream binaries (``scripts/build-upstream``,
which ``scripts/bootstrap`` runs on a root machine): on a root run their absence is a
failure, never a skip.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.lab.echo import Reply, tcp_ask
from kubeproxy.lab.kube.binaries import Binaries, MissingBinariesError, find
from kubeproxy.lab.kube.cluster import KubeLab, wait_for
from kubeproxy.lab.kube.differential.probes import CI_BUDGET
from kubeproxy.lab.kube.differential.run import Differential
from kubeproxy.lab.netns import list_netns
from tests.conftest import IS_ROOT

NODES = (("node-a", "zone-a"), ("node-b", "zone-b"), ("node-c", "zone-a"))
# How kubeproxy runs on every node of the session's cluster.
PROXY_FLAGS = ("--proxy-mode", "nftables", "--v=2")
_NAMES = itertools.count()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/realk8s/" in str(item.fspath):
            item.add_marker(pytest.mark.realk8s)
            if not IS_ROOT:
                item.add_marker(pytest.mark.skip(reason="needs root (network namespaces)"))


@pytest.fixture(scope="session")
def binaries() -> Binaries:
    try:
        return find()
    except MissingBinariesError as err:
        pytest.fail(f"the upstream binaries are missing on a root run: {err}")


@pytest.fixture(scope="session")
def kube(binaries: Binaries) -> Iterator[KubeLab]:
    prefix = f"kpr{os.getpid() % 100000}"
    with tempfile.TemporaryDirectory(prefix="kubeproxy-realk8s-") as tmp:
        lab = KubeLab(prefix, Path(tmp), binaries)
        try:
            lab.build(NODES)
            for node in lab.nodes:
                lab.start_kubeproxy(node, *PROXY_FLAGS)
            for node in lab.nodes:
                wait_for(
                    lambda n=node: "Synced full rules" in proxy_log(lab, n),
                    timeout=60,
                    what=f"kubeproxy's first sync on {node}",
                )
            yield lab
        finally:
            lab.close()
    leftovers = [ns for ns in list_netns() if ns.startswith(prefix)]
    assert not leftovers, f"namespaces left behind: {leftovers}"


# The node the differential tests compare on (its session kubeproxy stops meanwhile).
DIFFERENTIAL_NODE = "node-a"
_DIFFERENTIALS = itertools.count()


@pytest.fixture(scope="module")
def differential(kube: KubeLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Differential]:
    """The differential on node-a (tests/realk8s/test_differential*.py): node-a's session
    kubeproxy stops for the module and is started again afterwards, on a node cleaned of
    everything the comparison ran."""
    node = DIFFERENTIAL_NODE
    # Each module's own: the previous one's pool namespace may still be terminating.
    prefix = f"d{os.getpid() % 10000}x{next(_DIFFERENTIALS)}"
    kube.stop_kubeproxy(node)
    diff = Differential(
        kube, node, prefix, Path(tmp_path_factory.mktemp("differential")), budget=CI_BUDGET
    )
    try:
        diff.setup()
        yield diff
    finally:
        diff.close()
        kube.api().delete("Namespace", prefix)
        diff.node.reset()
        synced = proxy_log(kube, node).count("Synced full rules")
        kube.start_kubeproxy(node, *PROXY_FLAGS)
        wait_for(
            lambda: proxy_log(kube, node).count("Synced full rules") > synced,
            timeout=60,
            what=f"the session's kubeproxy back on {node}",
        )


def proxy_log(lab: KubeLab, node: str) -> str:
    path = lab.workdir / f"kubeproxy-{node}.log"
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture
def namespace(kube: KubeLab) -> Iterator[str]:
    """A Kubernetes namespace for this test, deleted afterwards."""
    name = f"t{next(_NAMES)}-{os.getpid() % 10000}"
    kube.kubectl("create", "namespace", name)
    # The ServiceAccount admission plugin refuses Pods until the controller has made the
    # namespace's default account (slower after a test restarted the control plane).
    wait_for(
        lambda: kube.api().get("ServiceAccount", "default", name),
        what=f"namespace {name}'s default ServiceAccount",
    )
    yield name
    # No kubelet ends a Pod's graceful deletion: the namespace controller, which deletes
    # Pods first, would wait for them forever, and the namespace's Services would stay
    # programmed on every node for the rest of the session.
    kube.kubectl(
        "-n", name, "delete", "pods", "--all", "--grace-period=0", "--force", "--wait=false",
        check=False,
    )  # fmt: skip
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


def ask(kube: KubeLab, netns: str, ip: str, port: int, timeout: float = 1.0) -> Reply:
    """One TCP request from ``netns`` (a node's, a Pod's, the outside host's)."""
    return kube.executor(netns).call(tcp_ask, ip, port, timeout)


def answers(
    kube: KubeLab,
    netns: str,
    ip: str,
    port: int,
    *,
    want: Callable[[Reply], bool] = lambda _: True,
    timeout: float = 30.0,
) -> Reply:
    """The first answer ``want`` accepts, asking again until then (rules take a moment
    to follow the API: the controller, the watch, the sync)."""

    def once() -> Reply | None:
        reply = ask(kube, netns, ip, port)
        return reply if want(reply) else None

    result: Reply = wait_for(once, timeout=timeout, what=f"an answer from {ip}:{port} in {netns}")
    return result


def service_ip(kube: KubeLab, namespace: str, name: str, family: int = 4) -> str:
    spec: dict[str, Any] = kube.api().get("Service", name, namespace)["spec"]
    ips = [str(ip) for ip in spec["clusterIPs"] if (":" in ip) == (family == 6)]
    return ips[0]


def settle(seconds: float = 0.5) -> None:
    """A pause that lets a change that should NOT happen show itself (used with a check
    of the state after it, never as the only check)."""
    time.sleep(seconds)
