"""kubeproxy.sources.oneshot: one-shot commands give up; ``run`` is never bounded."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from kubeproxy import cli
from kubeproxy.config.runtime import ConfigError
from kubeproxy.model.events import Event
from kubeproxy.sources import initial_state
from kubeproxy.sources.kube import KubeSource
from kubeproxy.sources.oneshot import (
    DEFAULT_TIMEOUT,
    Bounded,
    SourceError,
    Trouble,
    bounded_initial_state,
)


class Silent:
    """A source that never delivers (an API server that never answers)."""

    def __init__(self) -> None:
        self.closed = False

    async def watch(self, stop: asyncio.Event) -> AsyncGenerator[list[Event], None]:
        try:
            await asyncio.Event().wait()
            yield []
        finally:
            self.closed = True


class Denied(Silent):
    """A reporting source whose server refused it (a final trouble) or failed."""

    def __init__(self, trouble: Trouble) -> None:
        super().__init__()
        self._trouble = trouble

    @property
    def server(self) -> str:
        return "https://api.example:6443"

    @property
    def trouble(self) -> Trouble | None:
        return self._trouble

    async def final_trouble(self) -> Trouble:
        if not self._trouble.final:
            await asyncio.Event().wait()
        return self._trouble


class Ready:
    async def watch(self, stop: asyncio.Event) -> AsyncGenerator[list[Event], None]:
        yield []
        await stop.wait()


def test_a_final_trouble_gives_up_without_a_deadline() -> None:
    source = Denied(Trouble("cannot list endpointslices: HTTP 403 (Forbidden): no", final=True))
    with pytest.raises(SourceError) as err:
        asyncio.run(bounded_initial_state(source, None))
    assert str(err.value) == (
        "API server https://api.example:6443: cannot list endpointslices: HTTP 403 (Forbidden): no"
    )
    assert source.closed  # the source's watch was stopped, not left running


def test_the_deadline_names_the_last_error() -> None:
    source = Denied(Trouble("cannot list services: connection refused"))
    with pytest.raises(SourceError) as err:
        asyncio.run(bounded_initial_state(source, 0.05))
    assert str(err.value) == (
        "API server https://api.example:6443: no complete state within 0.05s "
        "(--request-timeout); last error: cannot list services: connection refused"
    )
    assert source.closed


def test_the_deadline_without_a_report() -> None:
    source = Silent()
    with pytest.raises(SourceError, match=r"^no complete state within 0.05s .*; no answer$"):
        asyncio.run(bounded_initial_state(source, 0.05))
    assert source.closed


def test_a_source_that_delivers_is_passed_through() -> None:
    assert asyncio.run(initial_state(Bounded(Ready(), 30.0))) == []


def args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


def source_for(*argv: str) -> object:
    parsed = args(*argv)
    cfg = cli.load_configuration(parsed)
    return cli.make_source(cfg, cli.proxy_config(cfg, parsed), parsed)


MASTER = ("--master", "http://127.0.0.1:1", "--hostname-override", "n")


@pytest.mark.parametrize(
    "argv",
    [
        ("list", *MASTER),
        ("render", *MASTER),
        ("explain", *MASTER, "--src", "1.1.1.1", "--dst", "2.2.2.2", "--port", "1"),
        ("run", "--once", *MASTER),
    ],
)
def test_one_shot_commands_are_bounded(argv: tuple[str, ...]) -> None:
    source = source_for(*argv)
    assert isinstance(source, Bounded)
    assert source.timeout == DEFAULT_TIMEOUT
    assert isinstance(source.source, KubeSource)


def test_run_is_never_bounded() -> None:
    assert isinstance(source_for("run", *MASTER), KubeSource)
    with pytest.raises(ConfigError, match="only one-shot commands give up"):
        source_for("run", *MASTER, "--request-timeout", "10s")


@pytest.mark.parametrize(("text", "seconds"), [("10", 10.0), ("1m30s", 90.0), ("0", 0.0)])
def test_request_timeout_as_kubectl(text: str, seconds: float) -> None:
    source = source_for("list", *MASTER, "--request-timeout", text)
    assert isinstance(source, Bounded)
    assert source.timeout == (seconds or None)  # 0: no limit, as kubectl


@pytest.mark.parametrize("text", ["-1", "10x", "soon"])
def test_bad_request_timeouts_are_usage_errors(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="2"):
        args("list", *MASTER, "--request-timeout", text)
    assert "--request-timeout" in capsys.readouterr().err


def test_request_timeout_is_not_for_manifests(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not --manifests"):
        source_for("list", "--manifests", str(tmp_path), "--request-timeout", "5s")
