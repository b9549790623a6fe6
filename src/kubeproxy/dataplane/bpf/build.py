"""Compile the socket load-balancer (``sock_lb.c``) into a BPF object, once, into a cache.

The object's name carries a hash of the source and the compiler flags, so a changed
source is rebuilt and an unchanged one never is; ``scripts/bootstrap`` runs
``python -m kubeproxy.dataplane.bpf.build`` so a node has it before the first start,
and ``--proxy-mode ebpf`` builds it at start if it is missing. The build is
reproducible (same source, same clang: same bytes): debug paths are mapped to ``.``
and nothing time-dependent is embedded. A missing tool or header is named with the
Debian package that provides it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from kubeproxy.dataplane.errors import DataplaneError

SOURCE = Path(__file__).with_name("sock_lb.c")
DEFAULT_CACHE = Path("/var/cache/kubeproxy/bpf")

# -g: BTF, which libbpf needs for the maps' definitions (and bpftool to print them).
FLAGS = ("-target", "bpf", "-O2", "-g", "-Wall", "-Werror")

# What a compiler error about a missing header means, in Debian packages.
_HEADERS = {
    "bpf/bpf_helpers.h": "libbpf-dev",
    "linux/bpf.h": "linux-libc-dev",
    "asm/types.h": "linux-libc-dev",
}


class BuildError(DataplaneError):
    """The BPF object cannot be built here; the message names what is missing."""

    tool = "clang"


def _includes() -> list[str]:
    # <linux/types.h> includes <asm/types.h>, which Debian keeps in the multiarch
    # directory that a -target bpf compiler does not search by itself.
    multiarch = sysconfig.get_config_var("MULTIARCH")
    return [f"-I/usr/include/{multiarch}"] if multiarch else []


def object_name(source: bytes) -> str:
    digest = hashlib.sha256(source + "\0".join(FLAGS).encode()).hexdigest()[:16]
    return f"sock_lb-{digest}.o"


def object_path(cache: Path = DEFAULT_CACHE) -> Path:
    """Where the object for the current source is (or will be) cached."""
    return cache / object_name(SOURCE.read_bytes())


def build(cache: Path = DEFAULT_CACHE, clang: str = "clang") -> Path:
    """The cached object, compiled first if it is not there yet."""
    target = object_path(cache)
    if target.exists():
        return target
    compiler = shutil.which(clang)
    if compiler is None:
        raise BuildError(
            f"cannot build the BPF object: {clang!r} not found "
            "(install Debian's clang and libbpf-dev; scripts/bootstrap does)"
        )
    cache.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed: a concurrent start never reads half a file.
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".o.tmp")
    os.close(fd)
    command = [
        compiler,
        *FLAGS,
        *_includes(),
        f"-fdebug-prefix-map={SOURCE.parent}=.",
        "-c",
        str(SOURCE),
        "-o",
        tmp,
    ]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise BuildError(_explain(proc.stderr))
    os.replace(tmp, target)
    return target


def _explain(stderr: str) -> str:
    for header, package in _HEADERS.items():
        if f"'{header}' file not found" in stderr:
            return f"cannot build the BPF object: {header} missing (install Debian's {package})"
    lines = [line for line in stderr.splitlines() if "error" in line] or stderr.splitlines()
    return "cannot build the BPF object: " + ("; ".join(lines[:5]) or "clang failed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build kubeproxy's BPF object (cached).")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    try:
        path = build(args.cache_dir)
    except (BuildError, OSError) as err:
        sys.stderr.write(f"{err}\n")
        return 1
    sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
