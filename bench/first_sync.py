"""Time to first full sync of a real ``kubeproxy run --once`` against the API stand-in.

    python -m bench.first_sync [--services 10000] [--slices-per-service 2]
                               [--endpoints-per-slice 5]

In a fresh network namespace: the API stand-in (tests/apiserver.py, its own process)
serves N Services and their EndpointSlices shaped like a real API server's; then
``kubeproxy run --once --master http://127.0.0.1:P`` starts, lists everything, decodes,
renders and applies the rules, and exits. Reported: wall time from process start to exit
(imports included), the proxy process's peak RSS (VmHWM) and its nft children's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kubeproxy.lab.netns import add_netns, delete_netns

ROOT = Path(__file__).resolve().parents[1]

SERVER = """
import asyncio, sys
from tests.apiserver import ApiServer, fleet, node_object
async def main():
    api = ApiServer()
    api.create(node_object("node-a", "192.168.50.1"))
    for obj in fleet({services}, {slices}, {endpoints}):
        api.create(obj)
    await api.start()
    print(api.port, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

PROXY = """
import resource, sys, time
from kubeproxy.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(f"RESULT {code} {hwm} {children}", file=sys.stderr)
"""


def run(services: int, slices: int, endpoints: int) -> dict[str, float]:
    ns = f"kpbench-api-{os.getpid() % 100000}"
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'src'}")
    add_netns(ns)
    server = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns,
            sys.executable,
            "-c",
            SERVER.format(services=services, slices=slices, endpoints=endpoints),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        started = time.perf_counter()
        proxy = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                sys.executable,
                "-c",
                PROXY,
                "run",
                "--once",
                "--master",
                f"http://127.0.0.1:{port}",
                "--hostname-override",
                "node-a",
                "--cluster-cidr",
                "10.128.0.0/9",
                "--v=2",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            check=False,
        )
        elapsed = time.perf_counter() - started
        line = next(ln for ln in proxy.stderr.splitlines() if ln.startswith("RESULT"))
        _, code, hwm, children = line.split()
        synced = [ln for ln in proxy.stderr.splitlines() if "Synced full" in ln]
        assert code == "0" and synced, proxy.stderr[-2000:]
        return {
            "services": services,
            "slices": services * slices,
            "endpoints": services * slices * endpoints,
            "seconds": elapsed,
            "proxy_peak_rss_mb": int(hwm) / 1024,
            "nft_peak_rss_mb": int(children) / 1024,
        }
    finally:
        server.terminate()
        server.wait(10)
        delete_netns(ns)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.first_sync", description=__doc__)
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--slices-per-service", type=int, default=2)
    parser.add_argument("--endpoints-per-slice", type=int, default=5)
    args = parser.parse_args()
    result = run(args.services, args.slices_per_service, args.endpoints_per_slice)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
