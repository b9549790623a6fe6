"""Running a data-plane command line tool (``nft``, ``iptables-restore``...): the part
every command runner shares.

:func:`run_tool` runs one command, inside a network namespace when asked (``ip netns
exec``), feeding it text on stdin, and kills it when it outlives its timeout, so a hung
tool cannot stall syncing forever. A missing binary and a timeout become a
:class:`ToolError` with one clear sentence; any exit status is returned as is, because
each tool gives its statuses its own meanings.
"""

from __future__ import annotations

import shutil
import subprocess


class ToolError(RuntimeError):
    """The tool could not be run to completion (missing, or killed after its timeout)."""


def run_tool(
    binary: str,
    args: list[str],
    *,
    netns: str | None = None,
    input: str | None = None,
    timeout: float,
    package: str,
    keep_stdout: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``binary args...``; ``package`` names what installs it, for the error;
    ``keep_stdout=False`` sends the output nowhere (``stdout`` is then None)."""
    out = subprocess.PIPE if keep_stdout else subprocess.DEVNULL
    missing = ToolError(f"{binary} not found (install the {package} package)")
    prefix: list[str] = []
    if netns:
        # ``ip netns exec`` would report a missing binary as its own failure (status
        # 255); the namespace shares our file system, so look here first.
        if shutil.which(binary) is None:
            raise missing
        prefix = ["ip", "netns", "exec", netns]
    try:
        if input is None:
            # Never our stdin: some tools read it when given nothing to do
            # (iptables-restore --version waits for input on old versions).
            return subprocess.run(
                [*prefix, binary, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                check=False,
                timeout=timeout,
            )
        return subprocess.run(
            [*prefix, binary, *args],
            input=input,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=timeout,
        )
    except FileNotFoundError:
        raise missing from None
    except subprocess.TimeoutExpired:
        raise ToolError(f"{binary} did not finish within {timeout:g}s and was killed") from None
