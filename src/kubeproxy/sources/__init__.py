"""Where Services, EndpointSlices, Nodes and ServiceCIDRs come from.

Every source has the same interface, :class:`Source`: ``watch(stop)`` yields the complete
initial state as its first batch of :class:`~kubeproxy.model.events.Event`, then a batch
whenever something changes. :mod:`~kubeproxy.sources.manifests` reads a directory of YAML;
:mod:`~kubeproxy.sources.kube` lists and watches the Kubernetes API;
:mod:`~kubeproxy.sources.oneshot` bounds how long one-shot commands wait for a source.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Protocol, runtime_checkable

from kubeproxy.model.events import Event


class Source(Protocol):
    def watch(self, stop: asyncio.Event) -> AsyncGenerator[list[Event], None]: ...


@runtime_checkable
class ReportsProblems(Protocol):
    """A source that can say why it is not delivering (the API source)."""

    def problem(self) -> str | None: ...


def source_problem(source: Source) -> str | None:
    """Why ``source`` cannot deliver now (None: no known problem)."""
    return source.problem() if isinstance(source, ReportsProblems) else None


async def initial_state(source: Source) -> list[Event]:
    """The source's complete initial state, then stop watching (``run --once``)."""
    stop = asyncio.Event()
    stream = source.watch(stop)
    try:
        return await anext(stream)
    finally:
        stop.set()
        await stream.aclose()
