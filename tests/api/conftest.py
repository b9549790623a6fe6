"""Helpers for the Kubernetes API source tests: the stand-in server and a watching consumer.

Every test runs its scenario with :func:`run` (``asyncio.run`` with a deadline; no pytest
plugin needed) against a :class:`~tests.apiserver.ApiServer` on 127.0.0.1, and reads the
source through a :class:`Consumer`, which records every batch ``KubeSource.watch`` yields.
Timings are shrunk (:data:`FAST`) so retries and batching take milliseconds; waits are on
conditions with deadlines, never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

from kubeproxy.model.events import Event, EventType, Model
from kubeproxy.model.types import Node, ServiceCIDR
from kubeproxy.sources.kube import KubeSource
from kubeproxy.sources.kube_client import load_connection
from kubeproxy.sources.kube_informer import Tuning
from tests.apiserver import ApiServer
from tests.conftest import relies_on_exception

NODE = "node-a"

FAST = Tuning(
    page_size=500,
    backoff_initial=0.01,
    backoff_max=0.05,
    batch_quiet=0.02,
    batch_max_delay=0.25,
)


def run(scenario: Callable[[], Coroutine[Any, Any, None]], timeout: float = 30.0) -> None:
    """Run an async test scenario to completion, failing it after ``timeout`` seconds."""

    async def bounded() -> None:
        await asyncio.wait_for(scenario(), timeout)

    asyncio.run(bounded())


def source_for(
    api: ApiServer, *, tuning: Tuning = FAST, proxy_name: str | None = None
) -> KubeSource:
    """A KubeSource configured as ``--master <stand-in URL>``, without rate limit."""
    return KubeSource(
        load_connection(None, api.url, qps=-1), NODE, proxy_name=proxy_name, tuning=tuning
    )


def name_of(obj: Model) -> str:
    if isinstance(obj, Node | ServiceCIDR):
        return obj.name
    return f"{obj.namespace}/{obj.name}"


def summary(events: list[Event]) -> list[tuple[str, str, str]]:
    """(event type, kind, name) per event, for compact assertions."""
    out = []
    for event in events:
        obj = event.new if event.new is not None else event.old
        assert obj is not None
        out.append((event.type.value, type(obj).__name__, name_of(obj)))
    return out


@relies_on_exception("AssertionError when the predicate does not hold in time")
async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``predicate`` until true; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


class Consumer:
    """Consumes ``source.watch(stop)`` in a task; records batches and the resulting state."""

    def __init__(self, source: KubeSource) -> None:
        self.source = source
        self.stop = asyncio.Event()
        self.batches: list[list[Event]] = []
        # (kind, name) -> current model object, from applying every event in order.
        self.state: dict[tuple[str, str], Model] = {}
        self._read = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Consumer:
        self._task = asyncio.create_task(self._consume())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop.set()
        assert self._task is not None
        await asyncio.wait_for(self._task, 5.0)

    async def _consume(self) -> None:
        async for batch in self.source.watch(self.stop):
            self.batches.append(batch)
            for event in batch:
                obj = event.new if event.new is not None else event.old
                assert obj is not None
                key = (type(obj).__name__, name_of(obj))
                if event.type is EventType.DELETED:
                    assert key in self.state, f"DELETED for unknown {key}"
                    del self.state[key]
                else:
                    assert (key in self.state) == (event.type is EventType.MODIFIED), event
                    self.state[key] = obj

    async def next_batch(self, timeout: float = 5.0) -> list[Event]:
        """The next batch not yet read by the test."""
        await eventually(lambda: len(self.batches) > self._read, timeout)
        self._read += 1
        return self.batches[self._read - 1]

    async def quiet(self, seconds: float = 0.3) -> list[Event]:
        """Everything yielded during the next ``seconds`` (expected: nothing)."""
        await asyncio.sleep(seconds)
        events = [e for batch in self.batches[self._read :] for e in batch]
        self._read = len(self.batches)
        return events

    def names(self, kind: str) -> set[str]:
        return {name for k, name in self.state if k == kind}

    async def until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        await eventually(predicate, timeout)
        self._read = len(self.batches)
