"""Hostile input, kernel level (issue 12 part 1): every render of a state built from good
and mutated objects (:mod:`tests.fuzz_objects`) is accepted by ``nft -c -f`` and by
iptables-restore in both flavours and both families (see ``kernel_refusals``), checked
inside a scratch namespace this module creates and deletes by its own name. So are the
largest objects: a Service with 1,000 ports and a slice with 10,000 endpoints.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from kubeproxy.dataplane.iptables.runner import FLAVORS, command_names
from kubeproxy.lab.netns import add_netns, delete_netns, list_netns
from kubeproxy.model.types import IPFamily
from tests.conftest import require_tool
from tests.fuzz_objects import (
    Doc,
    big_objects,
    kernel_refusals,
    load,
    mixed_objects,
    mixed_snapshot,
    renders,
)


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    for family in IPFamily:
        for flavor in FLAVORS:
            require_tool(command_names(family, flavor)[2])
    name = f"kpfuzz{os.getpid() % 100000}"
    add_netns(name)
    try:
        yield name
    finally:
        delete_netns(name)
    assert name not in list_netns()


def test_every_fuzzed_render_is_accepted_by_the_kernel(netns: str) -> None:
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(mixed_objects())
    def check(objects: tuple[list[Doc], list[Doc]]) -> None:
        assert kernel_refusals(netns, renders(mixed_snapshot(*objects))) == []

    check()


def test_the_largest_objects_render_and_are_accepted(netns: str) -> None:
    snapshot, messages = load(big_objects())
    assert len(snapshot.services) == 1001
    assert not [m for _, m in messages if m.startswith("Skipping")]
    assert kernel_refusals(netns, renders(snapshot)) == []


def test_the_checkers_do_refuse(netns: str) -> None:
    """The check above is only worth something if a bad script fails it: every checker
    (nft, and four iptables-restore runs) must refuse one."""
    bad = "*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j KUBE-MISSING\nCOMMIT\n"
    scripts = {
        "nftables": "add table inet kube-proxy\nadd chain inet kube-proxy x { oops }\n",
        "iptables": "# iptables-restore --noflush (IPv4)\n"
        + bad
        + "# ip6tables-restore --noflush (IPv6)\n"
        + bad,
    }
    assert len(kernel_refusals(netns, scripts)) == 5
