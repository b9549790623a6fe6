"""One-shot commands read a source with a deadline; the proxy itself never gives up.

``kubeproxy run`` keeps retrying an API server that is down or refuses it, for as long as
it takes (a node's proxy must outlive outages). ``render``, ``explain``, ``list`` and
``run --once`` are one-shots: a person or a script waits for them, so they read the
source through :class:`Bounded`, which gives up

* at once when the source reports a failure retrying will not cure here (a
  :class:`Trouble` that is ``final``: the server answered 401 or 403, or there are no
  credentials to send), naming the server, the verb and the resource;
* after ``timeout`` seconds otherwise (``--request-timeout``, as kubectl's), naming the
  server and the last failure seen, or saying that nothing answered.

Either way it raises :class:`SourceError`; the command prints it and exits 1. What
failed is known only to sources that report it (:class:`Reporting`: the API source);
others are bounded by the deadline alone.

The bound wraps the source from outside (its ``watch`` stream), so the API source's own
retry loop (:mod:`kubeproxy.sources.kube_informer`) stays exactly the proxy's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kubeproxy.model.events import Event
from kubeproxy.sources import Source

# kubectl's --request-timeout is 0 (no limit) by default; a one-shot that hangs helps no
# one, so ours gives up after this long unless told otherwise.
DEFAULT_TIMEOUT = 30.0


class SourceError(Exception):
    """A one-shot command could not get the source's initial state; one line."""


@dataclass(frozen=True, slots=True)
class Trouble:
    """A source's last failure: ``message`` names the verb, the resource and the error;
    ``final`` when retrying within a one-shot command cannot help (denied, no
    credentials)."""

    message: str
    final: bool = False


@runtime_checkable
class Reporting(Protocol):
    """A source that can say why it has not delivered yet (the API source)."""

    @property
    def server(self) -> str: ...

    @property
    def trouble(self) -> Trouble | None: ...

    async def final_trouble(self) -> Trouble:
        """Return once a final trouble happens (wait forever if none does)."""
        ...


class Bounded:
    """``source`` whose first batch comes within ``timeout`` seconds (None: no bound),
    or :class:`SourceError` (see the module docstring). Later batches are not bounded."""

    def __init__(self, source: Source, timeout: float | None) -> None:
        self.source = source
        self.timeout = timeout

    async def watch(self, stop: asyncio.Event) -> AsyncGenerator[list[Event], None]:
        stream = self.source.watch(stop)
        try:
            yield await self._first(stream)
            async for batch in stream:
                yield batch
        finally:
            await stream.aclose()

    async def _first(self, stream: AsyncGenerator[list[Event], None]) -> list[Event]:
        first: asyncio.Future[list[Event]] = asyncio.ensure_future(anext(stream))
        waiters: set[asyncio.Future[Any]] = {first}
        source = self.source if isinstance(self.source, Reporting) else None
        final: asyncio.Future[Trouble] | None = None
        if source is not None:
            final = asyncio.ensure_future(source.final_trouble())
            waiters.add(final)
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in waiters:
                if not waiter.done():
                    waiter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiter
        if first in done:
            return first.result()
        where = f"API server {source.server}: " if source is not None else ""
        if final is not None and final in done:
            raise SourceError(f"{where}{final.result().message}")
        trouble = source.trouble if source is not None else None
        last = f"; last error: {trouble.message}" if trouble is not None else "; no answer"
        raise SourceError(
            f"{where}no complete state within {self.timeout:g}s (--request-timeout){last}"
        )


async def bounded_initial_state(source: Source, timeout: float | None) -> list[Event]:
    """The source's complete initial state within ``timeout`` seconds, then stop."""
    from kubeproxy.sources import initial_state

    return await initial_state(Bounded(source, timeout))
