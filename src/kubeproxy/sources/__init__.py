"""Where Services, EndpointSlices, Nodes and ServiceCIDRs come from.

Every source has the same interface, :class:`Source`: ``watch(stop)`` yields the complete
initial state as its first batch of :class:`~kubeproxy.sources.events.Event`, then a batch
whenever something changes. :mod:`~kubeproxy.sources.manifests` reads a directory of YAML;
:mod:`~kubeproxy.sources.kube` lists and watches the Kubernetes API;
:mod:`~kubeproxy.sources.oneshot` bounds how long one-shot commands wait for a source.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Protocol

from kubeproxy.sources.events import Event


class Source(Protocol):
    def watch(self, stop: asyncio.Event) -> AsyncGenerator[list[Event], None]: ...


async def initial_state(source: Source) -> list[Event]:
    """The source's complete initial state, then stop watching (``run --once``)."""
    stop = asyncio.Event()
    stream = source.watch(stop)
    try:
        return await anext(stream)
    finally:
        stop.set()
        await stream.aclose()
