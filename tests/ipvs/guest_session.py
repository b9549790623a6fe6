"""One guest pytest session for every selected IPVS test, reported test by test on the host.

The host cannot run these tests (its kernel has no IPVS), so after collection each
selected test under tests/ipvs/ is swapped for a :class:`GuestItem` with the same node id
and markers, and the items are moved after the host's own (tests/conftest.py orders
them). As the run starts, ONE user-mode-linux guest (:mod:`kubeproxy.lab.uml`) boots in
a background thread running ``pytest`` on all of their node ids, beside the host's tests
(the guest is one CPU, and most host tests wait on packets); inside, the
reporter (:func:`record`) appends each phase report (setup/call/teardown: outcome,
traceback text, captured output) to a JSON-lines file in a directory the guest writes to
the host. Each host item waits for the guest session to end, then replays its own
test's outcome: a failure in the guest
fails that host item with the guest's traceback, a skip skips it with the guest's reason,
a test the guest never reported (guest crash, timeout) fails with the end of the guest's
output. The guest's whole output is kept in a temporary directory when a test failed
(its path is in the failure), and removed otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.lab import uml
from tests.conftest import require_tool

# The guest session's own budget: boot, every test, power-off (pytest-timeout still
# limits each test inside). 900 s ran out on 2026-11-28 with the 33 IPVS tests alone at
# load average ~10 (the guest has one CPU and cannot see the host taking it away);
# the fakes' kernel cases (tests/ipvs/test_fakes_vs_kernel.py) add ~100-140 s there.
GUEST_TIMEOUT = 1800.0
REPORT_ENV = "KUBEPROXY_UML_REPORT"
SESSION = pytest.StashKey["GuestSession"]()
ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ in the guest


def record(report: pytest.TestReport) -> None:
    """Append one phase report to the file the host named (inside the guest only)."""
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else None
    entry = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "text": report.longreprtext,
        "reason": reason,
        "wasxfail": getattr(report, "wasxfail", None),
        "sections": [[title, body] for title, body in report.sections],
    }
    with open(path, "a") as out:
        out.write(json.dumps(entry) + "\n")


# ------------------------------------------------------------------- on the host


class FailedInGuestError(Exception):
    """The test failed inside the guest (the message is the guest's report)."""


@dataclass
class GuestSession:
    """Runs the selected node ids in one guest, once: in the background from
    :meth:`start`, or on first demand."""

    nodeids: list[str]
    reports: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    output: Path | None = None
    error: str | None = None
    # Whether to keep the guest's output for a look after the run (a test failed).
    keep: bool = False
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Boot the guest now, in a thread; :meth:`results` waits for it."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ipvs-guest", daemon=True)
            self._thread.start()

    def results(self, nodeid: str) -> list[dict[str, Any]]:
        self.start()
        assert self._thread is not None
        self._thread.join()
        return self.reports.get(nodeid, [])

    def _run(self) -> None:
        results = Path(tempfile.mkdtemp(prefix="kubeproxy-ipvs-guest-"))
        report = results / "reports.jsonl"
        self.output = results / "output.log"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--rootdir={ROOT}",
            *self.nodeids,
        ]
        env = uml.guest_env({REPORT_ENV: str(report)})
        try:
            with open(self.output, "wb") as out:
                status = uml.run(
                    command,
                    cwd=ROOT,
                    env=env,
                    rw_dirs=[results],
                    timeout=GUEST_TIMEOUT,
                    stdout=out,
                    stderr=out,
                )
        except (uml.GuestError, ValueError) as err:
            self.error = str(err)
            status = None
        if report.exists():
            for line in report.read_text().splitlines():
                entry = json.loads(line)
                self.reports.setdefault(entry["nodeid"], []).append(entry)
        # pytest's own statuses: 0 passed, 1 tests failed, 5 nothing collected; anything
        # else (usage or internal error) means the session itself went wrong.
        if status not in (None, 0, 1) and self.error is None:
            self.error = f"the guest's pytest exited with status {status}"

    def cleanup(self) -> None:
        if self.output is not None and not self.keep:
            shutil.rmtree(self.output.parent, ignore_errors=True)

    def output_tail(self, lines: int = 60) -> str:
        if self.output is None or not self.output.exists():
            return "(no guest output)"
        text = self.output.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


class GuestItem(pytest.Item):
    """A test under tests/ipvs/ as the host sees it: its outcome comes from the guest."""

    def __init__(self, *, guest: GuestSession, location: tuple[str, int | None, str], **kw: Any):
        super().__init__(**kw)
        self.guest = guest
        self._location = location

    def reportinfo(self) -> tuple[str, int | None, str]:
        return self._location

    def runtest(self) -> None:
        require_tool(uml.UML_KERNEL, "the IPVS tests' guest kernel, from user-mode-linux")
        reports = self.guest.results(self.nodeid)
        if not reports:
            self.guest.keep = True
            why = self.guest.error or "the guest session did not report this test"
            raise FailedInGuestError(f"{why}\n--- end of the guest's output:\n{self.guest_tail()}")
        # Each phase's report repeats the sections of the phases before it.
        for title, body in reports[-1]["sections"]:
            # "Captured stdout call" -> "Captured stdout in the guest call"
            _, what, when = title.rsplit(" ", 2) if title.count(" ") >= 2 else ("", title, "call")
            self.add_report_section(when, f"{what} in the guest", body)
        failed = [e for e in reports if e["outcome"] == "failed"]
        if failed:
            self.guest.keep = True
            first = failed[0]
            raise FailedInGuestError(
                f"failed in the guest ({first['when']}):\n{first['text']}\n"
                f"(whole guest output: {self.guest.output})"
            )
        for entry in reports:
            if entry["outcome"] != "skipped":
                continue
            if entry["wasxfail"] is not None:
                pytest.xfail(f"in the guest: {entry['wasxfail']}")
            pytest.skip(f"in the guest: {entry['reason'] or entry['text']}")

    def guest_tail(self) -> str:
        return f"({self.guest.output})\n{self.guest.output_tail()}"

    def repr_failure(
        self,
        excinfo: pytest.ExceptionInfo[BaseException],
        style: Any = None,
    ) -> str:
        if isinstance(excinfo.value, FailedInGuestError):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style))


def replace_items(config: pytest.Config, items: list[pytest.Item], here: Path) -> None:
    """Swap every selected item under ``here`` for a :class:`GuestItem` of one session."""
    chosen = [(i, item) for i, item in enumerate(items) if here in Path(item.path).parents]
    if not chosen:
        return
    guest = GuestSession([item.nodeid for _, item in chosen])
    config.stash[SESSION] = guest
    config.add_cleanup(guest.cleanup)
    for i, item in chosen:
        assert item.parent is not None
        stand_in = GuestItem.from_parent(
            item.parent,
            name=item.name,
            guest=guest,
            location=item.location,
        )
        stand_in.own_markers = list(item.own_markers)
        stand_in.keywords.update(item.keywords)
        # The first stand-in waits for the whole guest session (pytest-timeout still
        # limits each test inside the guest).
        stand_in.add_marker(pytest.mark.timeout(GUEST_TIMEOUT + 60))
        items[i] = stand_in


def start(config: pytest.Config) -> None:
    """Boot the guest of the selected IPVS tests, if any, in the background (not for a
    ``--collect-only``, nor without the guest's kernel: each item then says what is
    missing)."""
    guest = config.stash.get(SESSION, None)
    if guest is not None and not config.option.collectonly and shutil.which(uml.UML_KERNEL):
        guest.start()
