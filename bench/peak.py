"""A command's own wall time and peak RSS, measured from a small process.

Why not ``getrusage(RUSAGE_CHILDREN)`` in the proxy: on Linux a child's ``ru_maxrss``
starts from the high-water mark of the process that spawned it (exec keeps the old
memory's peak), so a 10 MB ``iptables-restore`` started by a 200 MB proxy reports
200 MB. Started from this module's interpreter instead, the command's figure is its own,
or this process's (reported as ``floor_mb``) when it stays below that.

    python -m bench.peak INPUT -- COMMAND ARGS...    (INPUT: a file for stdin, or -)

prints ``{"seconds": ..., "cpu_seconds": ..., "peak_mb": ..., "floor_mb": ..., "status": ...}``;
the time is from spawning the command to reaping it, without this interpreter's
start-up; ``cpu_seconds`` is the command's user + system CPU.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Measured:
    seconds: float
    cpu_seconds: float
    peak_mb: float  # the command's peak RSS (at least floor_mb)
    floor_mb: float  # the measuring process's own peak when it started the command


def measure(argv: list[str], stdin: Path | None = None, netns: str | None = None) -> Measured:
    """Run ``argv`` (in network namespace ``netns``) from a fresh small process."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    out = subprocess.run(
        [*prefix, sys.executable, "-m", "bench.peak", str(stdin or "-"), "--", *argv],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {out.stderr.strip()[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return Measured(result["seconds"], result["cpu_seconds"], result["peak_mb"], result["floor_mb"])


def main(args: list[str]) -> int:
    source, sep, *argv = args
    if sep != "--" or not argv:
        raise SystemExit("usage: python -m bench.peak INPUT|- -- COMMAND ARGS...")
    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stdin = os.open(source if source != "-" else os.devnull, os.O_RDONLY)
    started = time.perf_counter()
    pid = os.posix_spawnp(
        argv[0], argv, dict(os.environ), file_actions=[(os.POSIX_SPAWN_DUP2, stdin, 0)]
    )
    _, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    result = {
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_mb": usage.ru_maxrss / 1024,
        "floor_mb": floor,
        "status": code,
    }
    print(json.dumps(result))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
