"""A cold full sync into a new nftables table, its pieces one or two ``nft`` processes at
a time: the sync's wall time and the part of it spent applying (the kernel and ``nft``).

    python -m bench.new_table [--services 10000] [--endpoints 10] [--rounds 3]   # as root

Runs itself inside a network namespace it creates and deletes by its own name, and
there, ``--rounds`` times alternately for one and two concurrent applies, deletes the
``kube-proxy`` table and runs ``NftablesBackend.sync`` with the production runner
(libnftables for small scripts, ``nft`` processes for the pieces), with the cyclic GC
off as ``kubeproxy run`` has it until its first sync. The render is the same in both;
only how the pieces reach the kernel differs (see ``NftablesBackend._apply_stages``).
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time

from bench.cluster import cluster
from bench.cold import ipv4_config
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.dataplane.nftables import runner as nft_runner
from kubeproxy.lab.netns import temporary_netns
from kubeproxy.model.events import Event, dispatch
from kubeproxy.model.parse import parse_endpoint_slice, parse_service
from kubeproxy.model.state import ProxyState


def measure(services: int, endpoints: int, rounds: int) -> None:
    state = ProxyState("node-a")
    objects = cluster(services, endpoints)
    models = [
        parse_service(o) if o["kind"] == "Service" else parse_endpoint_slice(o) for o in objects
    ]
    dispatch(state, [Event.added(m) for m in models if m is not None])
    config = ipv4_config()
    snapshot, _ = state.collect()
    # As `kubeproxy run` before its first sync (app.Proxy.run): no cyclic GC. With it, a
    # full collection of the loaded state (~0.3 s) can land between the pieces.
    gc.collect()
    gc.disable()
    print("| concurrent applies | full sync (wall) | applying the pieces (wall) |")
    print("|---|---|---|")
    for _ in range(rounds):
        for workers in (1, 2):
            nft_runner.HybridRunner.concurrent_applies = workers
            drop_table()
            backend = NftablesBackend(config, nft_runner.open_runner())
            started = time.perf_counter()
            result = backend.sync(snapshot, None)
            wall = time.perf_counter() - started
            print(f"| {workers} | {wall:.2f} s | {result.apply_seconds:.2f} s |", flush=True)
    drop_table()


def drop_table() -> None:
    subprocess.run(["nft", "delete", "table", "ip", "kube-proxy"], check=False, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.new_table", description=__doc__)
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        measure(args.services, args.endpoints, args.rounds)
        return 0
    with temporary_netns(f"kpnewtable-{os.getpid() % 100000}") as ns:
        argv = [sys.executable, "-m", "bench.new_table", *sys.argv[1:], "--inside"]
        return subprocess.run(["ip", "netns", "exec", ns, *argv], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
