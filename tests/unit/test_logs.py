"""kubeproxy.logs: klog text lines, component-base JSON lines, and verbosity."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator

import pytest

from kubeproxy import logs
from kubeproxy.logs import V2


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """Where the root logger writes during the test; its handlers come back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    out = io.StringIO()
    try:
        yield out
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_json_lines_follow_component_bases_schema(stream: io.StringIO) -> None:
    logs.setup(2, stream, fmt="json")
    log = logging.getLogger("kubeproxy.test")
    before = time.time() * 1000
    log.info("Synced %s rules", "full", extra={"servicePorts": 3, "node": "node-a"})
    log.log(V2, "detail")
    log.debug("hidden at v=2")
    log.warning("careful")
    try:
        raise OSError("address already in use")
    except OSError:
        log.exception("Healthz server failed")
    log.error("no exception", extra={"err": ValueError("bad value")})
    after = time.time() * 1000
    info, detail, warning, failed, plain = lines(stream)

    # ts: float milliseconds since the epoch, as upstream's epochMillisTimeEncoder.
    assert isinstance(info["ts"], float) and before <= info["ts"] <= after
    assert re.fullmatch(r"unit/test_logs\.py:\d+", str(info["caller"]))
    assert list(info) == ["ts", "caller", "msg", "v", "servicePorts", "node"]
    assert info["msg"] == "Synced full rules"
    assert (info["v"], info["servicePorts"], info["node"]) == (0, 3, "node-a")
    assert detail["v"] == 2
    assert warning["v"] == 0  # klog warnings are v=0 info lines in JSON
    # Errors: no "v", the error text in "err" (zapr's ErrorKey).
    assert "v" not in failed
    assert failed["msg"] == "Healthz server failed"
    assert failed["err"] == "address already in use"
    assert "Traceback" in str(failed["stacktrace"])
    assert plain["err"] == "bad value" and "v" not in plain


def test_text_lines_are_klogs(stream: io.StringIO) -> None:
    logs.setup(0, stream)
    logging.getLogger("kubeproxy.test").warning("careful %d", 1)
    logging.getLogger("kubeproxy.test").log(V2, "hidden at v=0")
    (line,) = stream.getvalue().splitlines()
    assert re.fullmatch(r"W\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ test_logs\.py:\d+\] careful 1", line)


def test_verbosity_changes_without_replacing_the_handler(stream: io.StringIO) -> None:
    logs.setup(0, stream, fmt="json")
    log = logging.getLogger("kubeproxy.test")
    log.log(V2, "hidden")
    logs.set_verbosity(4)
    log.debug("debug")
    logs.set_verbosity(0)
    log.log(V2, "hidden again")
    assert [entry["msg"] for entry in lines(stream)] == ["debug"]
    assert lines(stream)[0]["v"] == 4


def test_unknown_formats_are_refused() -> None:
    with pytest.raises(ValueError, match="unsupported log format 'xml'"):
        logs.setup(0, io.StringIO(), fmt="xml")


def test_vmodule_raises_verbosity_for_matching_files_only(stream: io.StringIO) -> None:
    logs.setup(0, stream, vmodule=[("test_lo*", 4), ("unit/nothing", 2)])
    log = logging.getLogger("kubeproxy.test")
    log.debug("debug here")  # this file matches test_lo*=4
    logging.getLogger().handlers[0].handle(
        logging.LogRecord("x", V2, "/src/kubeproxy/app.py", 1, "v2 elsewhere", None, None)
    )
    logging.getLogger().handlers[0].handle(
        logging.LogRecord("x", V2, "/src/unit/nothing.py", 1, "v2 by path", None, None)
    )
    text = stream.getvalue()
    assert "debug here" in text and "v2 by path" in text
    assert "v2 elsewhere" not in text
    # The global verbosity still applies to everything, and can change at run time.
    logs.set_verbosity(2)
    logging.getLogger().handlers[0].handle(
        logging.LogRecord("x", V2, "/src/kubeproxy/app.py", 1, "now shown", None, None)
    )
    assert "now shown" in stream.getvalue()
    logs.setup(0, stream)  # no rules left behind for other tests
