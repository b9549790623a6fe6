"""tests/conftest.py's run policy: missing tools, and no skip outside the allow-list."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from tests import conftest
from tests.conftest import AllowedSkip, SkipPolicy, load_allowed_skips, require_tool


def report(nodeid: str, reason: str, *, xfail: bool = False) -> pytest.TestReport:
    longrepr = ("tests/x.py", 1, f"Skipped: {reason}")
    out = pytest.TestReport(nodeid, ("tests/x.py", 1, "x"), {}, "skipped", longrepr, "setup")
    if xfail:
        out.wasxfail = reason
    return out


def finished(policy: SkipPolicy, status: int = pytest.ExitCode.OK) -> int:
    session = SimpleNamespace(exitstatus=status)
    policy.pytest_sessionfinish(cast(pytest.Session, session))
    return int(session.exitstatus)


ALLOWED = [AllowedSkip("tests/kernel/test_a.py::test_b[*]", "this kernel has IPVS", "because")]


def test_a_skip_the_allow_list_names_passes_a_root_run() -> None:
    policy = SkipPolicy(ALLOWED, enforce=True)
    policy.pytest_runtest_logreport(
        report("tests/kernel/test_a.py::test_b[v4]", "this kernel has IPVS")
    )
    assert policy.unallowed() == {}
    assert finished(policy) == pytest.ExitCode.OK


@pytest.mark.parametrize(
    ("nodeid", "reason"),
    [
        ("tests/kernel/test_a.py::test_c", "this kernel has IPVS"),  # another test
        ("tests/kernel/test_a.py::test_b[v4]", "needs the 'nft' command"),  # another reason
    ],
)
def test_any_other_skip_fails_a_root_run(nodeid: str, reason: str) -> None:
    policy = SkipPolicy(ALLOWED, enforce=True)
    policy.pytest_runtest_logreport(report(nodeid, reason))
    assert policy.unallowed() == {nodeid: reason}
    assert finished(policy) == pytest.ExitCode.TESTS_FAILED
    # A run that failed anyway keeps its own status.
    assert finished(policy, pytest.ExitCode.INTERRUPTED) == pytest.ExitCode.INTERRUPTED


def test_an_xfail_counts_as_a_skip() -> None:
    policy = SkipPolicy(ALLOWED, enforce=True)
    policy.pytest_runtest_logreport(report("tests/unit/test_x.py::test_y", "known bug", xfail=True))
    assert policy.unallowed() == {"tests/unit/test_x.py::test_y": "xfail: known bug"}


def test_an_unprivileged_run_only_lists_its_skips() -> None:
    policy = SkipPolicy(ALLOWED, enforce=False)
    policy.pytest_runtest_logreport(report("tests/kernel/test_a.py::test_c", "needs root"))
    assert policy.unallowed() == {"tests/kernel/test_a.py::test_c": "needs root"}
    assert finished(policy) == pytest.ExitCode.OK


def test_the_allow_list_reads_and_every_entry_names_a_test_that_exists() -> None:
    root = Path(conftest.__file__).parents[1]

    def exists(entry: AllowedSkip) -> bool:
        path, _, name = entry.test.partition("::")
        function = name.split("[")[0].split("::")[-1]
        source = root / path
        return source.is_file() and f"def {function}(" in source.read_text()

    assert [e for e in load_allowed_skips() if not exists(e)] == []


def test_an_entry_without_a_reason_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "allowed.toml"
    path.write_text('[[skip]]\ntest = "tests/a.py::t"\nmessage = "m"\nwhy = ""\n')
    with pytest.raises(pytest.UsageError, match="entry 1 needs exactly test, message and why"):
        load_allowed_skips(path)


def test_require_tool_looks_in_the_env_directory_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = tmp_path / "kubeproxy-test-tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("KUBEPROXY_TEST_BIN", str(tmp_path))
    assert require_tool(tool.name, env="KUBEPROXY_TEST_BIN") == str(tool)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("KUBEPROXY_TEST_BIN")
    assert require_tool(tool.name, env="KUBEPROXY_TEST_BIN") == str(tool)  # then PATH


@pytest.mark.parametrize("root", [True, False])
def test_a_missing_tool_fails_a_root_run_saying_how_to_get_it(
    root: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conftest, "IS_ROOT", root)
    monkeypatch.delenv("KUBEPROXY_TEST_BIN", raising=False)
    outcome = pytest.fail.Exception if root else pytest.skip.Exception
    with pytest.raises(outcome) as info:
        require_tool("kubeproxy-no-such-tool", "x", env="KUBEPROXY_TEST_BIN", how="build it")
    assert "not in $KUBEPROXY_TEST_BIN (unset) or PATH" in str(info.value)
    assert ("build it" in str(info.value)) is root
