"""Fixtures for real-kernel tests: a namespace lab, a manifest directory, kubeproxy runs.

The lab (two nodes, an outside client and a set of echo Pods) is built once per test
module and deleted by name at the end, also when a test fails. Each test writes its own
manifests; ``kubeproxy run --once`` replaces the whole kube-proxy table, so tests do not
see each other's Services.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kubeproxy.lab.cluster import NODE, NODE_IP, NODE_IP6, REMOTE_NODE, Lab
from kubeproxy.lab.netns import add_netns, delete_netns, list_netns, ns_exec
from kubeproxy.lab.objects import Ep, ManifestDir, node
from tests.conftest import IS_ROOT, relies_on_exception, require_tool

# name -> (node, IPv4, IPv6)
PODS = {
    "local-1": (NODE, "10.244.1.10", "fd00:10:244:1::10"),
    "local-2": (NODE, "10.244.1.11", "fd00:10:244:1::11"),
    "remote-1": (REMOTE_NODE, "10.244.2.10", "fd00:10:244:2::10"),
    "remote-2": (REMOTE_NODE, "10.244.2.11", "fd00:10:244:2::11"),
    "client": (NODE, "10.244.1.100", "fd00:10:244:1::100"),
}


def scratch_netns(prefix: str) -> Iterator[str]:
    """An empty network namespace named after ``prefix`` and this process, deleted after
    (use as the body of a fixture: ``yield from scratch_netns("kpx")``)."""
    name = f"{prefix}{os.getpid() % 100000}"
    add_netns(name)
    try:
        yield name
    finally:
        delete_netns(name)
    assert name not in list_netns()


# What a backend reads or writes under its /proc (iptables and ipvs modes' node settings
# the tests build in their own process: ipvs ones live in the guest).
NODE_SETTINGS = (
    "sys/net/ipv4/conf/all/route_localnet",
    "sys/net/netfilter/nf_conntrack_tcp_be_liberal",
)


def proc_of(ns: str, root: Path) -> Path:
    """The /proc for a backend a test builds in its own process to program ``ns``:
    ``root``, holding ``ns``'s values of :data:`NODE_SETTINGS`. The test's process lives
    in the host's network namespace, whose /proc/sys/net a real /proc would change
    (route_localnet=1 on the host, and inherited by every new namespace); ``ns``'s own
    is only reachable from a process inside it. The test reads what the backend wrote
    here."""
    for setting in NODE_SETTINGS:
        path = root / setting
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(ns_exec(ns, "cat", f"/proc/{setting}"))
    return root


# Commands every real-kernel test may use (scripts/bootstrap installs them).
TOOLS = ("ip", "nft", "conntrack")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/kernel/" in str(item.fspath):
            item.add_marker(pytest.mark.kernel)
            if not IS_ROOT:
                item.add_marker(pytest.mark.skip(reason="needs root (network namespaces)"))


@pytest.fixture(autouse=True)
def _kernel_tools() -> None:
    """As root, a missing tool fails the test (tests/conftest.py): never a silent pass."""
    for tool in TOOLS:
        require_tool(tool)


# The data planes a packet test can run against: a module lists those it runs in
# (``PROXY_MODES = ALL_MODES``); a test limited to some carries
# ``@pytest.mark.proxy_modes("nftables")``. The default is nftables only.
ALL_MODES = ("nftables", "iptables-nft", "iptables-legacy")
_LABS = itertools.count()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "lab" not in metafunc.fixturenames:
        return
    modes = getattr(metafunc.module, "PROXY_MODES", ("nftables",))
    marker = metafunc.definition.get_closest_marker("proxy_modes")
    if marker is not None:
        modes = tuple(m for m in modes if m in marker.args)
    metafunc.parametrize("lab", modes, indirect=True, scope="module")


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    mode = getattr(request, "param", "nftables")
    # Unique per process and lab, so parallel runs (and labs) never share a namespace.
    prefix = f"kpt{os.getpid() % 100000}x{next(_LABS)}"
    with Lab(prefix, mode=mode) as built:
        for name, (where, v4, v6) in PODS.items():
            built.add_pod(name, where, [v4, v6], ports=(8080, 9090))
        yield built
    leftovers = [ns for ns in list_netns() if ns.startswith(prefix)]
    assert not leftovers, f"namespaces left behind: {leftovers}"


@pytest.fixture
def manifests(tmp_path: Path) -> ManifestDir:
    mdir = ManifestDir(tmp_path / "manifests")
    mdir.path.mkdir()
    mdir.write("node.yaml", node(NODE, [NODE_IP, NODE_IP6], zone="zone-a"))
    return mdir


@relies_on_exception("AssertionError when the predicate does not hold in time")
def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll until ``predicate`` holds (a connection error counts as "not yet")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def ip(pod: str, family: int = 4) -> str:
    _, v4, v6 = PODS[pod]
    return v4 if family == 4 else v6


HTTP = {"name": "http", "port": 80}


def sync(lab: Lab, manifests: ManifestDir, *extra: str) -> str:
    """``kubeproxy run --once`` on node-a with these manifests; must succeed. Its log."""
    result = lab.sync_once(manifests.path, *extra)
    assert result.returncode == 0, result.stderr
    return result.stderr


def eps(
    *pods: str,
    family: int = 4,
    ready: bool | None = None,
    serving: bool | None = None,
    terminating: bool | None = None,
) -> list[Ep]:
    """Endpoints for lab Pods (on their own nodes), with these conditions."""
    return [
        Ep(ip(p, family), node=PODS[p][0], ready=ready, serving=serving, terminating=terminating)
        for p in pods
    ]
