"""The one place that talks to nftables: run a script with ``nft -f -`` (one atomic batch).

:class:`NftRunner` is the small interface backends depend on; :class:`NftCommand` is the
real implementation. There is no fake: nft and the kernel are available wherever
kubeproxy can do anything useful, and tests run them in throw-away network namespaces.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Protocol


class NftError(RuntimeError):
    """nft refused a script; nothing from it was applied (nft batches are atomic)."""

    def __init__(self, message: str, script: str) -> None:
        super().__init__(message)
        self.script = script


class NftRunner(Protocol):
    def apply(self, script: str) -> None:
        """Apply a script atomically or raise NftError having changed nothing."""

    def check(self, script: str) -> None:
        """Validate a script without applying it (``nft -c``); raise NftError if invalid."""

    def list_tables(self) -> list[tuple[str, str]]:
        """(family, name) of every table in this network namespace."""


class NftCommand:
    """Runs the ``nft`` binary."""

    def __init__(self, binary: str | None = None) -> None:
        found = binary or shutil.which("nft") or "/usr/sbin/nft"
        self.binary = found

    def _run(self, args: list[str], script: str | None = None) -> str:
        try:
            proc = subprocess.run(
                [self.binary, *args],
                input=script,
                capture_output=True,
                text=True,
                check=False,
            )
        except FileNotFoundError:
            raise NftError(
                f"{self.binary} not found (install the nftables package)", script or ""
            ) from None
        if proc.returncode != 0:
            raise NftError(_summarise(proc.stderr), script or "")
        return proc.stdout

    def apply(self, script: str) -> None:
        self._run(["-f", "-"], script)

    def check(self, script: str) -> None:
        self._run(["-c", "-f", "-"], script)

    def list_tables(self) -> list[tuple[str, str]]:
        out = self._run(["list", "tables"])
        tables = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "table":
                tables.append((parts[1], parts[2]))
        return tables

    def list_table(self, family: str, name: str) -> str:
        return self._run(["list", "table", family, name])


def _summarise(stderr: str, limit: int = 20) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if len(lines) > limit:
        lines = [*lines[:limit], f"... ({len(lines) - limit} more lines)"]
    return "nft: " + "\n".join(lines) if lines else "nft failed with no output"
