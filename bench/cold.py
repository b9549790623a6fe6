"""Where a cold start's CPU goes, in-process, in CPU seconds (steadier than wall time on a
shared machine), and the process's resident memory after each stage.

    python -m bench.cold [--services 10000] [--endpoints 10] [--dir DIR] [--cache-dir C]

CPU seconds include reaped child processes; wall seconds are given too. No root, no
kernel. Stages, as ``kubeproxy run --manifests DIR`` goes through them: the
directory (one YAML file per Service: the Service and its EndpointSlice, as
:mod:`bench.e2e` writes it; generated into ``--dir`` if that is empty or missing) read by
the standalone source (YAML, parsing, the control plane's pass-through), the events
folded into the change trackers, then one full nftables sync (collect, plan, render,
index, every transaction printed) with a runner that only prints the script. The same
objects are also parsed the way the API source parses them (decoded dicts to models).
To measure the code before a change, put that checkout's ``src`` first on PYTHONPATH.
With ``--cache-dir`` the source keeps its parse cache there (as ``run
--manifests-cache-dir``): the first run writes it (timed apart), a second run is a restart.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from bench.cluster import cluster, service_objects
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.nftables.transaction import Transaction
from kubeproxy.model.events import dispatch
from kubeproxy.model.parse import parse_endpoint_slice, parse_service
from kubeproxy.model.state import ProxyState
from kubeproxy.model.types import IPFamily
from kubeproxy.sources.standalone import StandaloneSource

T = TypeVar("T")


class PrintOnly:
    """A runner that prints each transaction's script and applies nothing."""

    def __init__(self) -> None:
        self.bytes = 0

    def apply(self, tx: Transaction) -> None:
        self.bytes += len(str(tx))

    def check(self, tx: Transaction) -> None:
        str(tx)

    def list_tables(self) -> list[tuple[str, str]]:
        return []

    def has_table(self, family: str, table: str) -> bool:
        return False

    def list_objects(self, family: str, table: str) -> dict[str, set[str]]:
        return {"chain": set(), "set": set(), "map": set()}


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds() -> float:
    """This process's CPU time and its reaped children's."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(results: dict[str, Any], stage: str, fn: Callable[[], T]) -> T:
    started, wall = cpu_seconds(), time.perf_counter()
    value = fn()
    results[stage] = {
        "cpu_s": round(cpu_seconds() - started, 3),
        "wall_s": round(time.perf_counter() - wall, 3),
        "rss_mb": rss_mb(),
    }
    return value


def write_directory(directory: Path, services: int, endpoints: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(services):
        text = yaml.safe_dump_all(service_objects(i, endpoints), sort_keys=False)
        (directory / f"svc-{i}.yaml").write_text(text)


def ipv4_config() -> ProxyConfig:
    """node-a, IPv4 only, the synthetic cluster's Pod CIDR; no servers."""
    return ProxyConfig(
        hostname="node-a",
        families=(IPFamily.IPv4,),
        cluster_cidrs=("10.128.0.0/9",),
        healthz_bind_address="",
        metrics_bind_address="",
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cold", description=__doc__)
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="kpcold-"))
    if not directory.exists() or not any(directory.iterdir()):
        write_directory(directory, args.services, args.endpoints)
    gc.collect()
    results: dict[str, Any] = {"start": {"rss_mb": rss_mb()}}

    source = timed(
        results,
        "parse cache: load",
        # Not passed without --cache-dir: the code before the cache has no such argument.
        lambda: StandaloneSource(
            directory,
            persist=False,
            **({"cache_dir": args.cache_dir} if args.cache_dir else {}),
        ),
    )
    events = timed(results, "manifests: read, YAML, parse", source.reload)
    cache = getattr(source.manifests, "cache", None)  # None: the code before it
    if cache is not None:
        results["parse cache: files served"] = cache.hits
        timed(results, "parse cache: write", source.manifests.save_cache)
    state = ProxyState("node-a")
    timed(results, "trackers: fold the events", lambda: dispatch(state, events))
    config = ipv4_config()
    runner = PrintOnly()
    backend = NftablesBackend(config, runner)

    def full_sync() -> None:
        snapshot, _ = state.collect()
        backend.sync(snapshot, None)

    timed(results, "full sync: collect, render, print", full_sync)
    results["script_mb"] = round(runner.bytes / 2**20, 1)

    objects = list(cluster(args.services, args.endpoints))

    def parse_api() -> int:
        parsed = [
            parse_service(o) if o["kind"] == "Service" else parse_endpoint_slice(o) for o in objects
        ]
        return len(parsed)

    timed(results, "API objects: parse (decoded dicts)", parse_api)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
