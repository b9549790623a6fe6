"""kubeproxy.controlplane against the real kube-apiserver and kube-controller-manager, at length.

    .venv/bin/python -m bench.controlplane_parity --seeds 100
    .venv/bin/python -m bench.controlplane_parity --seeds 300 --first 101 --alloc-seeds 0

Root (network namespaces) and the upstream binaries (``KUBEPROXY_UPSTREAM_BIN``). Starts
a control plane alone in a namespace (dual-stack, the small ranges of
:mod:`kubeproxy.lab.kube.allocparity`) and runs there:

* ``--seeds`` random clusters (seeds ``--first`` on) through
  :func:`kubeproxy.lab.kube.hintparity.run_seed`: the real controller's EndpointSlices,
  hints and events against kubeproxy's (the library's reconcile, and a whole standalone
  cluster);
* ``--alloc-seeds`` allocation scenarios (:func:`kubeproxy.lab.kube.allocparity.run`);

then the same allocation scenarios on a single-stack control plane (IPv4 only), where
every IPv6 request must be refused for the same reason. Prints a Markdown report: the
cases met (how many Services of each kind), every difference, and the time taken; exits
1 if there was any difference. The tests (tests/realk8s/test_controlplane_parity.py) run
a handful of the same seeds.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from kubeproxy.lab.kube import allocparity, hintparity
from kubeproxy.lab.kube.binaries import find
from kubeproxy.lab.kube.controlplane import ControlPlane, lone_control_plane


def hints(cp: ControlPlane, first: int, count: int) -> tuple[list[str], list[str]]:
    """The report's lines and the differences, over ``count`` seeds."""
    api = cp.api()
    cases: collections.Counter[str] = collections.Counter()
    differences: list[str] = []
    ties_otherwise = pods = services = 0
    started = time.monotonic()
    try:
        for seed in range(first, first + count):
            result = hintparity.run_seed(api, seed)
            cases.update(result.summary)
            services += len(result.summary)
            pods += len(result.cluster.pods)
            ties_otherwise += len(result.ties_broken_otherwise)
            for name, found in result.differences.items():
                differences += [f"seed {seed} {name}: {d}" for d in found]
            mark = "ok" if result.ok else "DIFFERENT"
            print(f"  hints seed {seed}: {mark}; {'; '.join(result.summary)}", file=sys.stderr)
    finally:
        hintparity.clear_nodes(api)
    elapsed = time.monotonic() - started
    lines = [
        f"Seeds {first}-{first + count - 1}: {services} Services over {pods} Pods, "
        f"{elapsed:.0f} s ({elapsed / count:.1f} s a seed). "
        f"{len(differences)} differences. Zones tied and upstream took another of the "
        f"accepted outcomes than kubeproxy's name order: {ties_otherwise} times.",
        "",
        "| Services | case (kubeproxy's result, which the real controller's matched) |",
        "|---|---|",
        *(f"| {n} | {case} |" for case, n in sorted(cases.items(), key=lambda c: (-c[1], c[0]))),
    ]
    return lines, differences


def allocation(
    cp: ControlPlane, seeds: list[int], cidrs: tuple[str, ...]
) -> tuple[list[str], list[str]]:
    api = cp.api()
    reasons: collections.Counter[str] = collections.Counter()
    differences: list[str] = []
    steps = 0
    started = time.monotonic()
    for seed in seeds:
        scenario = allocparity.run(api, seed, service_cidrs=cidrs)
        steps += len(scenario.steps)
        reasons.update(s.real.reason or "accepted" for s in scenario.steps)
        differences += [f"seed {seed}: {d}" for d in scenario.differences]
        found = len(scenario.differences)
        print(
            f"  allocation seed {seed} ({', '.join(cidrs)}): {found} differences", file=sys.stderr
        )
    elapsed = time.monotonic() - started
    tally = ", ".join(f"{reason} {n}" for reason, n in sorted(reasons.items()))
    lines = [
        f"{', '.join(cidrs)}: {len(seeds)} scenarios, {steps} requests ({tally}), "
        f"{elapsed:.0f} s; {len(differences)} differences."
    ]
    return lines, differences


def main() -> int:
    # The standalone cluster logs every Service it refuses; the report says what matters.
    logging.getLogger("kubeproxy").setLevel(logging.CRITICAL)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100, help="random clusters for hints")
    parser.add_argument("--first", type=int, default=1, help="the first hint seed")
    parser.add_argument("--alloc-seeds", type=int, default=5, help="allocation scenarios")
    args = parser.parse_args()
    binaries = find()
    tag = os.getpid() % 100000
    report = [f"kube-apiserver and kube-controller-manager {binaries.version()}", ""]
    differences: list[str] = []
    alloc_seeds = list(range(1, args.alloc_seeds + 1))
    with tempfile.TemporaryDirectory(prefix="kubeproxy-cpparity-bench-") as tmp:
        dual = allocparity.SERVICE_CIDRS
        with lone_control_plane(
            f"kpcpb{tag}", Path(tmp) / "dual", binaries, dual, extra_args=allocparity.APISERVER_ARGS
        ) as cp:
            if args.seeds:
                lines, found = hints(cp, args.first, args.seeds)
                report += ["### EndpointSlices and hints", "", *lines, ""]
                differences += found
            if alloc_seeds:
                lines, found = allocation(cp, alloc_seeds, dual)
                report += ["### ClusterIPs and NodePorts", "", *lines]
                differences += found
        if alloc_seeds:
            single = dual[:1]
            with lone_control_plane(
                f"kpcpb{tag}s",
                Path(tmp) / "single",
                binaries,
                single,
                extra_args=allocparity.APISERVER_ARGS,
            ) as cp:
                lines, found = allocation(cp, alloc_seeds, single)
                report += [*lines, ""]
                differences += found
    report += (
        ["Differences:", *(f"- {d}" for d in differences)] if differences else ["No differences."]
    )
    print("\n".join(report))
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
