"""kubeproxy.oom: oomScoreAdj written as upstream writes it, failures only logged."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kubeproxy.oom import apply_oom_score_adj


def test_the_value_is_written(tmp_path: Path) -> None:
    target = tmp_path / "oom_score_adj"
    target.write_text("0\n")
    assert apply_oom_score_adj(-999, str(target)) is True
    assert target.read_text() == "-999"


def test_a_failure_is_a_warning_not_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="kubeproxy.oom"):
        # A directory cannot be written as a file: the EISDIR stands in for EACCES.
        assert apply_oom_score_adj(-999, str(tmp_path)) is False
        assert apply_oom_score_adj(-999, str(tmp_path / "missing" / "file")) is False
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert all(m.startswith("Failed to apply OOMScore: cannot write -999") for m in messages)
    assert all(r.levelno == logging.WARNING for r in caplog.records)
