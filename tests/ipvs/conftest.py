"""IPVS tests: they run inside a user-mode-linux guest, a real kernel with IPVS.

On the host (``./scripts/test``, CI, ``.venv/bin/pytest tests/ipvs``) nothing here touches
the kernel: the selected tests are handed to ONE guest running one pytest session, and
each is reported on the host with the guest's outcome (:mod:`tests.ipvs.guest_session`).
Inside the guest (:func:`kubeproxy.lab.uml.in_guest`) they run for real, each in fresh
namespaces it deletes by name. The guest's nf_tables has no ip/ip6/inet families, so
nothing here uses ``nft``, and iptables is the legacy variant (:data:`IPTABLES`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeproxy.lab import uml
from kubeproxy.lab.cluster import NODE, Lab
from kubeproxy.lab.netns import list_netns, temporary_netns
from tests.ipvs import guest_session

HERE = Path(__file__).parent
# The guest's kernel has no nf_tables ip/ip6/inet tables: iptables-nft fails there.
IPTABLES = "iptables-legacy"
IP6TABLES = "ip6tables-legacy"

# name -> IPv4 of an echo Pod on node-a (the proxy's node).
BACKENDS = {"backend-1": "10.244.1.10", "backend-2": "10.244.1.11"}
_LABS = itertools.count()


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only the chosen tests go in
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.ipvs)
    if not uml.in_guest():
        guest_session.replace_items(config, items, HERE)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if uml.in_guest():
        guest_session.record(report)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """node-a, node-b and an outside client, with two echo Pods on node-a."""
    prefix = f"kpv{os.getpid() % 100000}x{next(_LABS)}"
    with Lab(prefix) as built:
        for name, ip in BACKENDS.items():
            built.add_pod(name, NODE, [ip])
        yield built
    leftovers = [ns for ns in list_netns() if ns.startswith(prefix)]
    assert not leftovers, f"namespaces left behind: {leftovers}"


@pytest.fixture
def netns() -> Iterator[str]:
    """One empty namespace (loopback up), deleted by name afterwards."""
    with temporary_netns(f"kpv{os.getpid() % 100000}n{next(_LABS)}") as name:
        yield name
