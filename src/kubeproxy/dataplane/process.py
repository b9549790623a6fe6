"""Running a data-plane command line tool (``nft``, ``iptables-restore``...): the part
every command runner shares.

:func:`run_tool` runs one command, inside a network namespace when asked (``ip netns
exec``), feeding it text on stdin (or pieces of text as an iterable produces them, so
the tool parses the first while the rest are still being made), and kills it when it
outlives its timeout, so a hung tool cannot stall syncing forever. A missing binary and
a timeout become a :class:`ToolError` with one clear sentence; any exit status is
returned as is, because each tool gives its statuses its own meanings.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path

from kubeproxy.dataplane.errors import DataplaneError


class ToolError(DataplaneError):
    """The tool could not be run to completion (missing, or killed after its timeout):
    ``incomplete`` unless the raiser says otherwise (a caller that treats a refusal as
    a ToolError too); ``tool`` is the binary's name."""

    def __init__(self, message: str, tool: str = "", *, incomplete: bool = True) -> None:
        super().__init__(message, tool=tool, incomplete=incomplete)


def run_tool(
    binary: str,
    args: list[str],
    *,
    netns: str | None = None,
    input: str | Iterable[str] | None = None,
    timeout: float,
    package: str,
    keep_stdout: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``binary args...``; ``package`` names what installs it, for the error;
    ``keep_stdout=False`` sends the output nowhere (``stdout`` is then None). An
    ``input`` that is not a string is written piece by piece as it is iterated."""
    out = subprocess.PIPE if keep_stdout else subprocess.DEVNULL
    missing = ToolError(f"{binary} not found (install the {package} package)", Path(binary).name)
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
        if not isinstance(input, str):
            return _stream([*prefix, binary, *args], input, out, timeout)
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
        raise ToolError(
            f"{binary} did not finish within {timeout:g}s and was killed", Path(binary).name
        ) from None


def _stream(
    argv: list[str], pieces: Iterable[str], out: int, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` with stdin written from ``pieces`` as they come. Only the
    tool's stderr (and stdout if kept) is read, after the input: tools that fail on a
    line print one message and stop reading. A timer kills the tool after ``timeout``,
    also while a write waits for it."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.PIPE, text=True
    )
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        assert proc.stdin is not None
        try:
            for piece in pieces:
                proc.stdin.write(piece)
        except BrokenPipeError:
            pass  # it stopped reading: its status and stderr say why
        stdout, stderr = proc.communicate()  # closes stdin (a broken pipe is ignored)
    except BaseException:
        # Killed before the end of its input, the tool commits nothing more.
        proc.kill()
        proc.wait()
        raise
    finally:
        timer.cancel()
    if killed.is_set():
        raise subprocess.TimeoutExpired(argv, timeout)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
