"""``python -m bench``: the nftables benchmark suite (root; uses network namespaces).

Runs, for each size, ``bench.sync_worker`` in a fresh namespace (cold full sync split into
render and kernel apply, ``nft -f`` alone on the same script, partial syncs, peak RSS),
then the data-path connect-latency benchmark, prints Markdown tables and writes them with
the raw numbers to ``bench/out/``. See bench/RESULTS.md for recorded runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import datapath
from kubeproxy.lab.netns import add_netns, delete_netns

ROOT = Path(__file__).resolve().parents[1]


def sync_run(services: int, endpoints: int) -> dict[str, Any]:
    ns = f"kpbench-sync-{os.getpid() % 100000}"
    add_netns(ns)
    try:
        env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'src'}")
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                sys.executable,
                "-m",
                "bench.sync_worker",
                str(services),
                str(endpoints),
            ],
            capture_output=True,
            text=True,
            check=True,
            env=env,
            cwd=ROOT,
        )
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result
    finally:
        delete_netns(ns)


def nft_version() -> str:
    proc = subprocess.run(["nft", "--version"], capture_output=True, text=True, check=False)
    return proc.stdout.strip()


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def sync_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| Services x endpoints | cold full sync | render | kernel apply | `nft -f` alone "
        "| ratio | partial: 1 endpoint (median / p90) | partial: +1 Service (median / p90) "
        "| peak RSS (proxy) | peak RSS (nft child) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cold = r["cold"]
        lines.append(
            f"| {r['services']:,} x {r['endpoints']} | {ms(cold['total'])} | "
            f"{ms(cold['render'])} | {ms(cold['apply'])} | {ms(r['nft_alone'])} | "
            f"{cold['total'] / r['nft_alone']:.2f}x | "
            f"{ms(r['partial_endpoint']['median'])} / {ms(r['partial_endpoint']['p90'])} | "
            f"{ms(r['partial_add_service']['median'])} / "
            f"{ms(r['partial_add_service']['p90'])} | "
            f"{r['rss_mb']:.0f} MB | {r['nft_child_rss_mb']:.0f} MB |"
        )
    return "\n".join(lines)


def datapath_table(rows: list[dict[str, Any]]) -> str:
    # Relative to the smallest size's repeat (the last row), measured warm.
    base = rows[-1]["median_us"] if rows else 1.0
    lines = [
        "| Services installed | connections | connect median | connect p99 | "
        "median vs smallest (its repeat) |",
        "|---|---|---|---|---|",
    ]
    lines.extend(
        f"| {r['services']:,} | {r['connections']:,} | {r['median_us']:.0f} us | "
        f"{r['p99_us']:.0f} us | {r['median_us'] / base:.2f}x |"
        for r in rows
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--sizes", default="100,1000,10000,30000", help="Service counts for the sync benchmark"
    )
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--datapath-sizes", default="100,10000,30000")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces, nftables)")

    sync_rows = []
    for size in (int(s) for s in args.sizes.split(",") if s):
        print(f"sync benchmark: {size} Services x {args.endpoints} endpoints ...", file=sys.stderr)
        sync_rows.append(sync_run(size, args.endpoints))
    sizes = [int(s) for s in args.datapath_sizes.split(",") if s]
    print(f"data-path benchmark: {sizes} ...", file=sys.stderr)
    path_rows = datapath.run(sizes, args.connections) if sizes else []

    machine = (
        f"{platform.node()}: {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}, "
        f"{nft_version()}"
    )
    report = "\n\n".join(
        [
            f"Machine: {machine}",
            f"Command: `{' '.join(['python -m bench', *sys.argv[1:]])}`",
            sync_table(sync_rows),
            datapath_table(path_rows),
        ]
    )
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(report + "\n")
    (args.out / "results.json").write_text(
        json.dumps({"machine": machine, "sync": sync_rows, "datapath": path_rows}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
