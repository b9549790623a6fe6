"""Test-run policy shared by every suite: a missing prerequisite never passes silently.

* :func:`require_tool` — a test that needs a command (``nft``, ``conntrack``,
  ``openssl``, ``kubectl``...) calls it and gets the command's path. When the run is root
  (CI, and ``./scripts/test`` on a real machine, where ``scripts/bootstrap`` installs
  every tool) a missing tool is a *failure* naming how to get it; only an unprivileged
  run may skip.
* Real-kernel tests (``tests/kernel/``) need root; an unprivileged run skips them and the
  summary says so loudly, with the count, so nobody mistakes it for a full run. (The
  ``tests/ipvs/`` tests run in a user-mode-linux guest: see tests/ipvs/conftest.py; a skip
  there is reported on the host as any other.)
* **A root run leaves the host as it found it**: :class:`tests.hostguard.HostGuard`
  fails the run on any change to the host's network sysctls, rules, links or namespaces,
  naming the test module after which it was seen (and restores it).
* **No skip outside the allow-list on a root run.** Every skipped (or xfailed) test is
  recorded; at the end of a root run, one that no entry of ``tests/allowed_skips.toml``
  allows (each entry: the test, a piece of the skip's reason, and why that skip is
  right) fails the run, listed in the summary with its reason. An unprivileged run only
  lists them: a developer without root may skip the kernel tests. Inside the IPVS guest
  the host enforces it, test by test, as the guest's skips are replayed there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest

from kubeproxy.lab import uml
from kubeproxy.lab.kube import binaries
from tests.hostguard import HostGuard

F = TypeVar("F", bound=Callable[..., object])

IS_ROOT = os.geteuid() == 0
ALLOWED_SKIPS = Path(__file__).with_name("allowed_skips.toml")
# Where upstream binaries built from source go (scripts/build-upstream prints it): a
# directory searched before PATH for the tools that name it (kubectl).
UPSTREAM_BIN = "KUBEPROXY_UPSTREAM_BIN"
# The /proc of a backend a test never starts: what start() would write there (the node's
# sysctls) has nowhere to go, so a start() by mistake fails instead of changing the host.
NO_PROC = Path("/nonexistent/proc")


def unavailable(message: str, how: str = "./scripts/bootstrap installs it") -> NoReturn:
    """A prerequisite is missing: a failure on a root run (saying how to get it), a
    skip otherwise."""
    if IS_ROOT:
        pytest.fail(f"{message}: missing on a root run ({how})", pytrace=False)
    pytest.skip(message)


def require_tool(tool: str, why: str = "", *, env: str | None = None, how: str = "") -> str:
    """The path of command ``tool``: from the directory in environment variable ``env``
    first when given, then from PATH. Missing: see :func:`unavailable`."""
    directory = os.environ.get(env, "") if env else ""
    found = (shutil.which(tool, path=directory) if directory else None) or shutil.which(tool)
    if found is not None:
        return found
    where = "PATH"
    if env:
        where = f"${env} ({directory or 'unset'}) or PATH"
    message = f"needs the {tool!r} command{f' ({why})' if why else ''}, not in {where}"
    unavailable(message, how or "./scripts/bootstrap installs it")


def upstream_tool(tool: str, why: str, how: str) -> str:
    """The path of one of upstream's commands (kubectl) in ``$KUBEPROXY_UPSTREAM_BIN``
    (then PATH). scripts/test names that directory while it builds the binaries in the
    background: a root run waits for that build first."""
    if IS_ROOT and os.environ.get(UPSTREAM_BIN):
        # Missing after all: require_tool says what, and how to get it.
        with contextlib.suppress(binaries.MissingBinariesError):
            binaries.find()
    return require_tool(tool, why, env=UPSTREAM_BIN, how=how)


def relies_on_exception(reason: str) -> Callable[[F], F]:
    """Marks a test that checks by not raising: the calls it makes raise on what it
    guards against, so it has no assertion of its own. ``reason`` says which call and
    on what; tests/lint_tests.py (the hollow rule) accepts the test because of it. On a
    helper (``wait_for``) it says that calling the helper is a check."""
    if not reason.strip():
        raise ValueError("relies_on_exception needs the reason")

    def mark(fn: F) -> F:
        fn.relies_on_exception = reason  # type: ignore[attr-defined]
        return fn

    return mark


# ------------------------------------------------------------------- the skip policy


@dataclass(frozen=True)
class AllowedSkip:
    """One entry of tests/allowed_skips.toml."""

    test: str  # a node id; "*" stands for any text (brackets are literal)
    message: str  # a piece of the skip's own reason
    why: str  # why this skip is right where it happens

    def allows(self, nodeid: str, reason: str) -> bool:
        pattern = ".*".join(map(re.escape, self.test.split("*")))
        return re.fullmatch(pattern, nodeid) is not None and self.message in reason


def load_allowed_skips(path: Path = ALLOWED_SKIPS) -> list[AllowedSkip]:
    entries = tomllib.loads(path.read_text()).get("skip", [])
    out = []
    for i, entry in enumerate(entries):
        fields = {k: str(entry.get(k, "")).strip() for k in ("test", "message", "why")}
        if not all(fields.values()) or set(entry) - set(fields):
            raise pytest.UsageError(
                f"{path}: entry {i + 1} needs exactly test, message and why, all non-empty"
            )
        out.append(AllowedSkip(**fields))
    return out


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    wasxfail = getattr(report, "wasxfail", None)
    if wasxfail is not None:
        return f"xfail: {wasxfail}"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class SkipPolicy:
    """Records every skip; fails a root run on those the allow-list does not name."""

    def __init__(self, allowed: list[AllowedSkip], *, enforce: bool) -> None:
        self.allowed = allowed
        self.enforce = enforce
        self.skipped: dict[str, str] = {}

    def _record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if report.skipped:
            self.skipped.setdefault(report.nodeid, skip_reason(report))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    def unallowed(self) -> dict[str, str]:
        return {
            nodeid: reason
            for nodeid, reason in self.skipped.items()
            if not any(a.allows(nodeid, reason) for a in self.allowed)
        }

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.enforce and self.unallowed() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        unallowed = self.unallowed()
        if not self.skipped:
            return
        kernel = [n for n in self.skipped if n.startswith(("tests/kernel/", "tests/ipvs/"))]
        line = "=" * 78
        write = terminalreporter.write_line
        write(line, yellow=True, bold=True)
        write(
            f"WARNING: {len(self.skipped)} test(s) SKIPPED, {len(kernel)} of them real-kernel "
            "tests: packet behaviour was not checked by this run"
            + ("" if IS_ROOT else " (run as root: ./scripts/test)"),
            yellow=True,
            bold=True,
        )
        if unallowed:
            verdict = "FAILED (a root run):" if self.enforce else "a root run would fail on"
            write(
                f"{verdict} {len(unallowed)} skip(s) not in {ALLOWED_SKIPS.name} "
                "(fix the cause, or add an entry with why the skip is right):",
                red=self.enforce,
                yellow=not self.enforce,
                bold=True,
            )
            for nodeid, reason in sorted(unallowed.items()):
                write(f"  {nodeid}: {reason}", red=self.enforce, yellow=not self.enforce)
        write(line, yellow=True, bold=True)


def pytest_configure(config: pytest.Config) -> None:
    # Inside the IPVS guest the host enforces it (it replays each guest skip).
    policy = SkipPolicy(load_allowed_skips(), enforce=IS_ROOT and not uml.in_guest())
    config.pluginmanager.register(policy, "kubeproxy-skip-policy")
    # Only a root run can change the host; the guest's kernel is not the host's.
    if IS_ROOT and not uml.in_guest():
        config.pluginmanager.register(HostGuard(), "kubeproxy-host-guard")


TESTS = Path(__file__).parent


def run_order(item: pytest.Item) -> int:
    """Where a test goes in the run: the host's own tests first; then the IPVS tests,
    whose outcomes come from the guest booted in the background as the run began
    (tests/ipvs/guest_session.py), so it had the host's tests' time; last those needing
    upstream's binaries, which scripts/test builds in the background meanwhile."""
    path = Path(item.path)
    if TESTS / "realk8s" in path.parents or item.get_closest_marker("upstream_binaries"):
        return 2
    if TESTS / "ipvs" in path.parents:
        return 1
    return 0


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort: each module's tests stay together and in order (module fixtures).
    items.sort(key=run_order)
