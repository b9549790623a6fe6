"""Cost of ``kubeproxy explain`` and ``kubeproxy list`` at N Services (no root, no kernel).

    python -m bench.explain [--services 10000] [--endpoints 10]

Writes the synthetic cluster (bench/cluster.py) to a manifest directory and loads it as
the commands do (manifest source -> ProxyState -> snapshot). Then, best of 3: planning
every ServicePort of one family (what both commands do first), explaining one packet on
that plan, the ``list`` rows; and each whole command as a process (interpreter start and
YAML decoding included), once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from bench.cluster import cluster, cluster_ip
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.explain.listing import rows
from kubeproxy.explain.packet import explain
from kubeproxy.model.events import dispatch
from kubeproxy.model.fate import Packet
from kubeproxy.model.planning import family_plans, service_port_plans
from kubeproxy.model.state import ProxyState, Snapshot
from kubeproxy.model.types import IPFamily
from kubeproxy.sources import initial_state
from kubeproxy.sources.manifests import ManifestSource

ROOT = Path(__file__).resolve().parents[1]
NODE_YAML = """apiVersion: v1
kind: Node
metadata: {name: node-a}
status: {addresses: [{type: InternalIP, address: 192.168.50.1}]}
"""


def best(fn: Callable[[], object], runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


async def load(path: Path) -> Snapshot:
    state = ProxyState("node-a")
    dispatch(state, await initial_state(ManifestSource(path)))
    return state.collect()[0]


def command(*args: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "kubeproxy", *args], check=True, capture_output=True, env=env
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kpbench-explain-") as tmp:
        path = Path(tmp)
        (path / "node.yaml").write_text(NODE_YAML)
        (path / "cluster.yaml").write_text(
            yaml.safe_dump_all(cluster(opts.services, opts.endpoints))
        )
        start = time.perf_counter()
        snapshot = asyncio.run(load(path))
        t_load = time.perf_counter() - start
        config = ProxyConfig(hostname="node-a", families=(IPFamily.IPv4,))
        fam = family_plans(config.planning, snapshot)[0]

        def plan() -> list[object]:
            return [p for p in service_port_plans(snapshot, fam).values() if p is not None]

        plans = [p for p in service_port_plans(snapshot, fam).values() if p is not None]
        last = cluster_ip(opts.services - 1)
        packet = Packet("10.128.0.1", last, 80)
        t_plan = best(plan)
        t_explain = best(lambda: explain(packet, fam, plans, snapshot.endpoints))
        t_rows = best(lambda: rows(plans, snapshot.endpoints, "node-a"))
        flags = ["--manifests", tmp, "--hostname-override", "node-a"]
        t_cmd_explain = command("explain", *flags, "--src", "10.128.0.1", "--dst", last,
                                "--port", "80")  # fmt: skip
        t_cmd_list = command("list", *flags)
    n = opts.services
    print(f"{n} Services x {opts.endpoints} endpoints (IPv4)")
    print(f"  load the manifests (once)   {t_load:8.2f} s")
    print(f"  plan every ServicePort      {t_plan * 1000:8.1f} ms")
    print(f"  explain one packet (plans)  {t_explain * 1000:8.1f} ms")
    print(f"  list rows                   {t_rows * 1000:8.1f} ms")
    print(f"  kubeproxy explain (process) {t_cmd_explain:8.2f} s")
    print(f"  kubeproxy list (process)    {t_cmd_list:8.2f} s")


if __name__ == "__main__":
    main()
