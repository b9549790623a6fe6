"""``python -m bench``: the sync and data-path benchmarks (root; uses network namespaces).

    python -m bench [--mode nftables|iptables] [--flavor nft|legacy] [--sizes ...]

For each mode (nftables; or iptables mode in the nft and legacy flavours of iptables, both
unless ``--flavor`` picks one) and each size, runs ``bench.sync_worker`` in a fresh
namespace (cold full sync split into render and kernel apply, the kernel tool alone on
the same input in another empty namespace, partial syncs, peak RSS), then the data-path
connect-latency benchmark, prints Markdown tables and writes them with the raw numbers to
``bench/out/``. See bench/RESULTS.md for recorded runs.
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
from bench.modes import Mode
from kubeproxy.lab.netns import add_netns, delete_netns

ROOT = Path(__file__).resolve().parents[1]


def sync_run(mode: Mode, services: int, endpoints: int) -> dict[str, Any]:
    tag = os.getpid() % 100000
    ns, floor_ns = f"kpbench-sync-{tag}", f"kpbench-floor-{tag}"
    add_netns(ns)
    add_netns(floor_ns)
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
                mode.name,
                str(services),
                str(endpoints),
                floor_ns,
            ],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            cwd=ROOT,
        )
        if out.returncode != 0:
            raise RuntimeError(f"bench.sync_worker failed: {out.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result
    finally:
        delete_netns(ns)
        delete_netns(floor_ns)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def written(partial: dict[str, Any]) -> str:
    w = partial["rules_written"]
    return f"{w['median']:.0f}" if w["min"] == w["max"] else f"{w['min']}-{w['max']}"


def restart_cell(restart: dict[str, Any], iptables: bool) -> str:
    """A second backend's first sync over the first one's rules: total (kernel part)."""
    cell = f"{ms(restart['total'])} ({ms(restart['apply'])} kernel"
    return cell + (f", {restart['rules_written']} rules written)" if iptables else ")")


def sync_table(mode: Mode, rows: list[dict[str, Any]]) -> str:
    iptables = mode.flavor is not None
    extra = " | rules written (1 endpoint / +1 Service)" if iptables else ""
    lines = [
        "| Services x endpoints | cold full sync (CPU) | render | kernel apply "
        f"| {mode.floor_label} (CPU) | ratio | restart: full sync over it "
        "| partial: 1 endpoint (median / p90"
        f"{'; the tool alone' if iptables else ''}) "
        "| partial: +1 Service (median / p90)"
        f"{extra} | peak RSS: proxy | kernel tool's own | sum | RUSAGE_CHILDREN |",
        "|---" * (14 if iptables else 13) + "|",
    ]
    for r in rows:
        cold, pe, pa = r["cold"], r["partial_endpoint"], r["partial_add_service"]
        cells = [
            f"{r['services']:,} x {r['endpoints']}",
            ms(cold["total"]) + (f" ({ms(cold['cpu'])})" if "cpu" in cold else ""),
            ms(cold["render"]),
            ms(cold["apply"]),
            ms(r["floor"]) + (f" ({ms(r['floor_cpu'])})" if "floor_cpu" in r else ""),
            f"{cold['total'] / r['floor']:.2f}x",
            restart_cell(r["restart"], iptables),
            f"{ms(pe['median'])} / {ms(pe['p90'])}"
            + (f"; {ms(r['partial_floor'])}" if r.get("partial_floor") else ""),
            f"{ms(pa['median'])} / {ms(pa['p90'])}",
        ]
        if iptables:
            cells.append(f"{written(pe)} / {written(pa)}")
        cells += [
            f"{r['rss_mb']:.0f} MB",
            f"{r['tool_peak_mb']:.0f} MB",
            f"{r['rss_mb'] + r['tool_peak_mb']:.0f} MB",
            f"{r['children_maxrss_mb']:.0f} MB",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def path_cell(met: dict[str, Any] | None) -> str:
    if met is None:
        return ""
    tree = " + ".join(f"{examined}/{length}" for examined, length in met["tree"])
    return (
        f" | {met['examined']} ({met['nat_prerouting']} nat PREROUTING, tree {tree}; "
        f"{met['filter_forward']} filter FORWARD; {met['nat_postrouting']} nat POSTROUTING)"
    )


def datapath_table(mode: Mode, rows: list[dict[str, Any]], repeat: bool = True) -> str:
    # Relative to the smallest size's repeat (the last row), measured warm; or without a
    # repeat, to the first row.
    base = rows[-1 if repeat else 0]["median_us"] if rows else 1.0
    iptables = mode.flavor is not None
    lines = [
        "| Services installed | connections | connect median | connect p99 | "
        f"median vs smallest{' (its repeat)' if repeat else ''} |"
        + (" rules the first packet examines (dispatch tree: examined/length per level) |"
           if iptables else ""),
        "|---" * (6 if iptables else 5) + "|",
    ]  # fmt: skip
    lines.extend(
        f"| {r['services']:,} | {r['connections']:,} | {r['median_us']:.0f} us | "
        f"{r['p99_us']:.0f} us | {r['median_us'] / base:.2f}x{path_cell(r.get('rules_met'))} |"
        for r in rows
    )
    return "\n".join(lines)


def modes(args: argparse.Namespace) -> list[Mode]:
    if args.mode == "nftables":
        return [Mode("nftables")]
    flavors = [args.flavor] if args.flavor else ["nft", "legacy"]
    return [Mode(f"iptables-{f}") for f in flavors]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--mode", choices=("nftables", "iptables"), default="nftables")
    parser.add_argument(
        "--flavor", choices=("nft", "legacy"), help="iptables mode: one flavour (default both)"
    )
    parser.add_argument(
        "--sizes", default="100,1000,10000,30000", help="Service counts for the sync benchmark"
    )
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--datapath-sizes", default="100,10000,30000")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument(
        "--no-repeat",
        action="store_true",
        help="data path: do not measure the first size again at the end",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces, nftables/iptables)")
    if args.flavor and args.mode != "iptables":
        parser.error("--flavor is for --mode iptables")

    sections, raw = [], {}
    for mode in modes(args):
        sync_rows = []
        for size in (int(s) for s in args.sizes.split(",") if s):
            print(f"{mode.name} sync: {size} Services x {args.endpoints} endpoints ...",
                  file=sys.stderr)  # fmt: skip
            sync_rows.append(sync_run(mode, size, args.endpoints))
        sizes = [int(s) for s in args.datapath_sizes.split(",") if s]
        print(f"{mode.name} data path: {sizes} ...", file=sys.stderr)
        repeat = not args.no_repeat
        path_rows = datapath.run(sizes, mode, args.connections, repeat=repeat) if sizes else []
        parts = [f"### {mode.name} ({mode.version()})"]
        if sync_rows:
            parts.append(sync_table(mode, sync_rows))
        if path_rows:
            parts.append(datapath_table(mode, path_rows, repeat))
        sections.append("\n\n".join(parts))
        raw[mode.name] = {"sync": sync_rows, "datapath": path_rows}

    machine = (
        f"{platform.node()}: {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )
    command = " ".join(["python -m bench", *sys.argv[1:]])
    report = "\n\n".join([f"Machine: {machine}", f"Command: `{command}`", *sections])
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(report + "\n")
    (args.out / "results.json").write_text(
        json.dumps({"machine": machine, "command": command, "modes": raw}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
