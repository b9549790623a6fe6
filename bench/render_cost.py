"""CPU cost of the nftables backend's scripts, without the kernel: a full sync's and a
partial sync's, at N Services x E endpoints, and their size.

    python -m bench.render_cost [--services 10000] [--endpoints 10] [--rounds 5]
                                [--src OTHER_CHECKOUT/src] [--apply]

Measures CPU time (``time.process_time``: the process's own, so other load on the machine
changes it far less than wall time), best of ``--rounds``, of

* ``full``: ``NftablesBackend.render`` — plan every ServicePort, build the table, print
  the script a cold full sync applies;
* ``partial``: one new Service's partial sync — its rules, the index diff and the
  transaction printed (what a partial sync hands to libnftables);
* ``nft``: with ``--apply`` (root), the full script loaded by ``nft -f`` into a network
  namespace made for it and deleted after: the ``nft`` process's CPU time, user + system
  (the kernel's netlink work runs in its system time), best of ``--rounds``.

``--src`` runs the same measurement on another checkout's ``src`` (e.g. ``git archive
HEAD~1 src``), in a child process, for a before/after comparison on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def apply_cpu(script: str, rounds: int) -> float:
    """Best CPU time (user + system) of ``nft -f`` loading ``script`` into an empty
    network namespace."""
    import resource

    from kubeproxy.lab.netns import add_netns, delete_netns

    best = float("inf")
    for r in range(rounds):
        ns = f"kprcost{os.getpid() % 100000}x{r}"
        add_netns(ns)
        try:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(
                ["ip", "netns", "exec", ns, "nft", "-f", "-"], input=script, text=True, check=True
            )
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            best = min(best, used)
        finally:
            delete_netns(ns)
    return best


def measure(services: int, endpoints: int, rounds: int, apply_script: bool) -> dict[str, Any]:
    from bench.cluster import cluster, service_objects
    from bench.sync_worker import apply, parse_all
    from kubeproxy.backends.nftables.index import TableIndex
    from kubeproxy.backends.nftables.proxier import NftablesBackend
    from kubeproxy.backends.nftables.render import render_service_port
    from kubeproxy.config.runtime import ProxyConfig
    from kubeproxy.dataplane.nftables.runner import NftCommand
    from kubeproxy.dataplane.nftables.transaction import TableRef, Transaction
    from kubeproxy.model.plan import plan_service_port
    from kubeproxy.model.planning import family_plans
    from kubeproxy.model.state import ProxyState
    from kubeproxy.model.types import IPFamily

    config = ProxyConfig(
        hostname="node-a", families=(IPFamily.IPv4,), cluster_cidrs=("10.128.0.0/9",)
    )
    state = ProxyState("node-a")
    apply(state, parse_all(cluster(services, endpoints)))
    snapshot, _ = state.collect()
    backend = NftablesBackend(config, NftCommand())

    full_cpu, script = [], ""
    for _ in range(rounds):
        started = time.process_time()
        script = backend.render(snapshot)
        full_cpu.append(time.process_time() - started)

    (fam,) = family_plans(config.planning, snapshot)
    rules = {}
    for name, port in snapshot.services.items():
        plan = plan_service_port(port, snapshot.endpoints.get(name, ()), fam)
        if plan is not None:
            rules[name] = render_service_port(plan, fam)
    index = TableIndex.build(fam, rules)
    apply(state, parse_all(service_objects(services, endpoints, first_endpoint=0)))
    new_snapshot, changes = state.collect()
    (new_name,) = changes.service_ports
    port = new_snapshot.services[new_name]
    partial_cpu, partial_text = [], ""
    for _ in range(rounds):
        started = time.process_time()
        plan = plan_service_port(port, new_snapshot.endpoints.get(new_name, ()), fam)
        assert plan is not None
        change = index.change({new_name: render_service_port(plan, fam)})
        tx = Transaction()
        change.emit(tx, TableRef("ip", "kube-proxy"))
        partial_text = str(tx)
        partial_cpu.append(time.process_time() - started)
    nft_cpu = apply_cpu(script, rounds) if apply_script else None
    return {
        "nft_cpu_s": nft_cpu,
        "services": services,
        "endpoints": endpoints,
        "full_cpu_s": min(full_cpu),
        "full_script_bytes": len(script.encode()),
        "partial_cpu_ms": min(partial_cpu) * 1000,
        "partial_script_bytes": len(partial_text.encode()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.render_cost", description=__doc__)
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--src", type=Path, help="measure this checkout's src instead")
    parser.add_argument("--apply", action="store_true", help="also nft -f the script (root)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.services, args.endpoints, args.rounds, args.apply)))
        return 0
    src = (args.src or ROOT / "src").resolve()
    out = subprocess.run(
        [
            *(sys.executable, "-m", "bench.render_cost", "--worker"),
            *("--services", str(args.services), "--endpoints", str(args.endpoints)),
            *("--rounds", str(args.rounds)),
            *(("--apply",) if args.apply else ()),
        ],
        env=dict(os.environ, PYTHONPATH=f"{ROOT}:{src}"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"src: {src}")
    print(
        f"{args.services:,} x {args.endpoints}: full sync script {result['full_cpu_s']:.2f} s CPU,"
        f" {result['full_script_bytes'] / 1e6:.2f} MB; partial (+1 Service)"
        f" {result['partial_cpu_ms']:.2f} ms CPU, {result['partial_script_bytes']} bytes"
    )
    if result["nft_cpu_s"] is not None:
        print(f"nft -f of the full script: {result['nft_cpu_s']:.2f} s CPU (user + system)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
