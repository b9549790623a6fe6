"""Fault injection at the edges: data-plane tools that fail or hang when told to.

:class:`FaultyTools` writes a wrapper script for each tool kubeproxy runs (``nft``, the
``iptables-restore`` flavours and families, ``conntrack``) into a directory that goes
first in kubeproxy's ``PATH``. A wrapper passes every call through to the real tool
(resolved when the wrapper is written) unless a fault is switched on for it, and then
only for calls that change the kernel (``nft -f``, ``iptables-restore --noflush``,
``conntrack -D``): ``fail`` exits 1 with a kernel-like refusal on stderr, ``hang`` sleeps
for an hour (until the caller's timeout kills it). Each faulted call is counted.

nftables mode normally talks to the kernel in-process through libnftables, where no
wrapper can reach; :meth:`FaultyTools.env` also puts a directory with an unloadable
``libnftables.so.1`` first in ``LD_LIBRARY_PATH``, so kubeproxy falls back to the ``nft``
binary, as it does on a node without the library. (A fault inside the library itself
cannot be injected from outside; the refusal path is the same NftError either way.)

Nothing here touches kubeproxy's code: the proxy under test is an ordinary process that
finds these tools where it looks for tools.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Tool -> the argument that marks a call changing the kernel.
MUTATING = {
    "nft": "-f",
    "iptables-nft-restore": "--noflush",
    "ip6tables-nft-restore": "--noflush",
    "iptables-legacy-restore": "--noflush",
    "ip6tables-legacy-restore": "--noflush",
    "conntrack": "-D",
}
FAULTS = ("fail", "hang")
REFUSAL = "injected fault: the kernel refused the transaction (Operation not permitted)"

_WRAPPER = """#!/bin/sh
# kubeproxy fault-injection wrapper for {tool} (see kubeproxy.lab.faults)
unset LD_LIBRARY_PATH  # the real tool loads the real libnftables
fault=$(cat '{control}' 2>/dev/null)
if [ -n "$fault" ]; then
  case " $* " in
    *" {marker} "*)
      echo "$fault" >> '{control}.hits'
      case "$fault" in
        fail) echo '{refusal}' >&2; exit 1 ;;
        hang) exec sleep 3600 ;;
      esac ;;
  esac
fi
exec '{real}' "$@"
"""


class FaultyTools:
    """Wrappers under ``root`` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.control = root / "control"
        self.lib = root / "lib"
        for directory in (self.bin, self.control, self.lib):
            directory.mkdir(parents=True, exist_ok=True)
        # Not an ELF file: dlopen refuses it, and kubeproxy uses the nft binary.
        (self.lib / "libnftables.so.1").write_text("not a library\n")
        for tool, marker in MUTATING.items():
            real = shutil.which(tool)
            if real is None:
                continue  # a mode this machine cannot run; its tests skip
            wrapper = self.bin / tool
            wrapper.write_text(
                _WRAPPER.format(
                    tool=tool,
                    control=self.control / tool,
                    marker=marker,
                    refusal=REFUSAL,
                    real=real,
                )
            )
            wrapper.chmod(0o755)

    def env(self) -> tuple[str, ...]:
        """A command prefix (``env NAME=VALUE...``) that makes a process use the wrappers."""
        return (
            "env",
            f"PATH={self.bin}{os.pathsep}{os.environ.get('PATH', '/usr/sbin:/usr/bin')}",
            f"LD_LIBRARY_PATH={self.lib}",
        )

    def inject(self, tool: str, fault: str | None) -> None:
        """Switch ``fault`` ("fail", "hang") on for ``tool``'s kernel-changing calls;
        None switches it off (calls in progress keep their fault)."""
        if tool not in MUTATING:
            raise ValueError(f"no wrapper for {tool}")
        control = self.control / tool
        if fault is None:
            control.unlink(missing_ok=True)
        elif fault in FAULTS:
            control.write_text(fault + "\n")
        else:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")

    def hits(self, tool: str) -> int:
        """How many calls of ``tool`` were faulted so far."""
        try:
            return len((self.control / f"{tool}.hits").read_text().splitlines())
        except FileNotFoundError:
            return 0
