"""Test-run policy shared by every suite: a missing prerequisite never passes silently.

* :func:`require_tool` — a test that needs a command (``nft``, ``conntrack``,
  ``openssl``...) calls it. When the run is root (CI, and ``./scripts/test`` on a real
  machine, where ``scripts/bootstrap`` installs every tool) a missing tool is a
  *failure*; only an unprivileged run may skip.
* Real-kernel tests (``tests/kernel/``) need root; an unprivileged run skips them and the
  summary says so loudly, with the count, so nobody mistakes it for a full run. (The
  ``tests/ipvs/`` tests run in a user-mode-linux guest: see tests/ipvs/conftest.py; a skip
  there is counted the same way.)
"""

from __future__ import annotations

import os
import shutil

import pytest

IS_ROOT = os.geteuid() == 0


def require_tool(tool: str, why: str = "") -> None:
    if shutil.which(tool) is not None:
        return
    message = f"needs the {tool!r} command{f' ({why})' if why else ''}"
    if IS_ROOT:
        pytest.fail(f"{message}: missing on a root run, where ./scripts/bootstrap installs it")
    pytest.skip(message)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    kernel = [r for r in skipped if r.nodeid.startswith(("tests/kernel/", "tests/ipvs/"))]
    if not skipped:
        return
    line = "=" * 78
    terminalreporter.write_line(line, yellow=True, bold=True)
    terminalreporter.write_line(
        f"WARNING: {len(skipped)} test(s) SKIPPED, {len(kernel)} of them real-kernel tests: "
        "packet behaviour was not checked by this run"
        + ("" if IS_ROOT else " (run as root: ./scripts/test)"),
        yellow=True,
        bold=True,
    )
    terminalreporter.write_line(line, yellow=True, bold=True)
