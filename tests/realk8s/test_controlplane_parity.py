"""kubeproxy.controlplane against the real control plane: the same requests to both.

A control plane alone in a network namespace (no nodes, no proxies:
:func:`~kubeproxy.lab.kube.controlplane.lone_control_plane`) with small ranges
(a /27 and a /123 for ClusterIPs, 20 nodePorts) serves this module. Allocation
(:mod:`kubeproxy.lab.kube.allocparity`): a seeded sequence of Service creates and deletes
goes to kube-apiserver and to a StandaloneCluster, step by step, until every range is
full. EndpointSlices and hints (:mod:`kubeproxy.lab.kube.hintparity`): random clusters
written through the API, and kube-controller-manager's slices and events compared with
kubeproxy's. A handful of seeds here, chosen to cover every outcome; ``python -m
bench.controlplane_parity`` runs a hundred and more (bench/RESULTS.md). Two differences
kept on purpose (docs/controlplane.md) are pinned here, so a change upstream shows.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeproxy.lab.kube import allocparity, hintparity
from kubeproxy.lab.kube.binaries import Binaries
from kubeproxy.lab.kube.controlplane import ControlPlane, lone_control_plane
from kubeproxy.lab.netns import list_netns

# Seeds chosen so that together they meet every case (what hintparity.category calls
# them, which the test checks): each hint mode, each reason Auto hints are refused, and
# zones that tie (upstream then picks in Go map order; either outcome is accepted).
HINT_SEEDS = {
    4: ("Auto IPv4: hinted", "PreferSameZone IPv4", "PreferSameNode IPv4"),
    7: ("overload threshold", "Auto IPv4: hinted, endpoints moved", "Auto IPv4/IPv6: hinted"),
    19: ("PreferSameNode IPv4/IPv6", "Insufficient number of endpoints"),
    286: ("ties: 2 possible outcomes",),
    388: ("do not have a zone specified", "PreferSameNode IPv4/IPv6"),
    3: ("Insufficient Node information",),
}


@pytest.fixture(scope="module")
def control_plane(binaries: Binaries) -> Iterator[ControlPlane]:
    netns = f"kpcp{os.getpid() % 100000}"
    with (
        tempfile.TemporaryDirectory(prefix="kubeproxy-cpparity-") as tmp,
        lone_control_plane(
            netns,
            Path(tmp),
            binaries,
            allocparity.SERVICE_CIDRS,
            extra_args=allocparity.APISERVER_ARGS,
        ) as cp,
    ):
        yield cp
    assert netns not in list_netns()


def test_cluster_ips_and_node_ports_are_allocated_as_the_real_api_server_does(
    control_plane: ControlPlane,
) -> None:
    # Not waiting for the added ServiceCIDR to be gone: nothing after needs its range.
    scenario = allocparity.run(control_plane.api(), seed=1, steps=30, settle=False)
    report = "\n".join(step.line() for step in scenario.steps)
    assert not scenario.differences, report
    # The scenario met every outcome on the way (else it would prove less than it says).
    reasons = {step.real.reason for step in scenario.steps}
    assert reasons == {"", "allocated", "not-in-range", "full", "invalid"}, report
    filled = [s for s in scenario.steps if s.what.startswith("fill") and not s.real.accepted]
    assert [s.what for s in filled] == [
        "fill IPv4",
        "fill IPv6",
        "fill nodePorts",
        "fill IPv4 over both ranges",
    ], report
    # Random values came from both bands (the static one once the dynamic one was full).
    assert set().union(*(step.bands() for step in scenario.steps)) == {"static", "dynamic"}


def test_two_service_cidrs_of_one_cidr_being_deleted_still_take_addresses_upstream_only(
    control_plane: ControlPlane,
) -> None:
    """A difference kept on purpose (docs/controlplane.md): upstream's allocator stays
    ready while more than one ServiceCIDR names its CIDR, even when all are being
    deleted; ours takes nothing from a CIDR whose ServiceCIDRs are all being deleted."""
    real, ours = allocparity.twin_service_cidrs_deleted(control_plane.api())
    assert (real.accepted, real.cluster_ips) == (True, ("10.100.1.7",)), real.brief()
    assert (ours.accepted, ours.reason) == (False, "not-in-range"), ours.brief()


@pytest.mark.parametrize("seed", list(HINT_SEEDS), ids=[f"seed{s}" for s in HINT_SEEDS])
def test_endpoint_slices_and_hints_are_the_real_controllers(
    control_plane: ControlPlane, seed: int
) -> None:
    result = hintparity.run_seed(control_plane.api(), seed)
    described = "\n".join([hintparity.describe_cluster(result.cluster), *result.summary])
    assert result.ok, f"{described}\n" + "\n".join(
        f"{name}: {d}" for name, ds in result.differences.items() for d in ds
    )
    for case in HINT_SEEDS[seed]:  # what the seed was chosen for did happen
        assert any(case in line for line in result.summary), described


def test_a_node_cpu_change_alone_reaches_upstream_hints_only_with_the_next_node_event(
    control_plane: ControlPlane,
) -> None:
    """A difference kept on purpose (docs/controlplane.md): upstream's controller ignores
    a Node whose allocatable CPU alone changed until a Node is added or deleted or
    changes readiness or zone; a standalone cluster recomputes at once."""
    change = hintparity.node_cpu_change(control_plane.api())
    assert change.real_before == hintparity.BEFORE_CPU_CHANGE
    assert change.real_after_cpu == hintparity.BEFORE_CPU_CHANGE  # resynced, old shares
    assert change.real_after_node_event == hintparity.AFTER_CPU_CHANGE
    assert change.ours_after_cpu == hintparity.AFTER_CPU_CHANGE
