"""The upstream binaries the real-cluster lab runs, from the build cache.

``KUBEPROXY_UPSTREAM_BIN`` (a directory) wins once it holds every binary; otherwise
``scripts/build-upstream`` is run, which is a no-op returning the cached directory once
the binaries are built, waits for a build another process is running (scripts/test
starts one in the background and names its directory up front), and builds otherwise
(about 15 minutes on two cores the first time).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
BUILD = ROOT / "scripts" / "build-upstream"
NAMES = ("kube-apiserver", "kube-controller-manager", "kube-proxy", "kubectl", "etcd")


class MissingBinariesError(RuntimeError):
    pass


@dataclass(frozen=True)
class Binaries:
    directory: Path

    def __getitem__(self, name: str) -> str:
        return str(self.directory / name)

    @property
    def apiserver(self) -> str:
        return self["kube-apiserver"]

    @property
    def controller_manager(self) -> str:
        return self["kube-controller-manager"]

    @property
    def kube_proxy(self) -> str:
        return self["kube-proxy"]

    @property
    def kubectl(self) -> str:
        return self["kubectl"]

    @property
    def etcd(self) -> str:
        return self["etcd"]

    def version(self) -> str:
        """``v1.37.2``: what kube-apiserver says it is."""
        out = subprocess.run(
            [self.apiserver, "--version"], capture_output=True, text=True, check=True
        ).stdout
        return out.split()[-1]


def find(build: bool = True) -> Binaries:
    """The binaries' directory; MissingBinariesError says how to get them."""
    given = os.environ.get("KUBEPROXY_UPSTREAM_BIN")
    directory = Path(given) if given else None
    if (directory is None or _missing(directory)) and build:
        proc = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise MissingBinariesError(f"scripts/build-upstream failed:\n{proc.stderr[-3000:]}")
        directory = directory or Path(proc.stdout.strip().splitlines()[-1])
    if directory is None:
        raise MissingBinariesError("set KUBEPROXY_UPSTREAM_BIN or run scripts/build-upstream")
    missing = _missing(directory)
    if missing:
        raise MissingBinariesError(
            f"{directory}: no {', '.join(missing)} (run scripts/build-upstream)"
        )
    return Binaries(directory)


def _missing(directory: Path) -> list[str]:
    return [n for n in NAMES if not (directory / n).is_file()]
