"""The ``--manifests`` source: a directory read as a small cluster (thin edge).

Wires three parts: :class:`~kubeproxy.sources.manifests.ManifestSource` reads the files
and yields raw-object events, :class:`~kubeproxy.controlplane.standalone.StandaloneCluster`
turns them into completed Service / EndpointSlice events (pure), and
:class:`~kubeproxy.controlplane.statefile.StateFile` keeps the allocations in
``DIR/.kubeproxy-state.json`` across restarts (saved after every batch that changed them;
``persist=False`` for ``render``, which must touch nothing).
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

from kubeproxy.controlplane.standalone import StandaloneCluster
from kubeproxy.controlplane.statefile import Allocation, StateFile
from kubeproxy.model.events import Event
from kubeproxy.sources.manifests import ManifestSource
from kubeproxy.sources.parsecache import ParseCache


class StandaloneSource:
    def __init__(
        self,
        directory: Path,
        *,
        service_cidrs: Sequence[str] = (),
        persist: bool = True,
        poll_interval: float = 1.0,
        cache_dir: Path | None = None,
    ) -> None:
        self.directory = directory
        # Parsed files kept in cache_dir across restarts (None: none kept).
        cache = ParseCache.open(cache_dir, os.path.abspath(directory)) if cache_dir else None
        self.manifests = ManifestSource(
            directory, poll_interval=poll_interval, raw=True, cache=cache
        )
        self.state = StateFile.beside(directory)
        self.persist = persist
        self._saved: dict[str, Allocation] = self.state.load()
        # A fixed seed: the same directory and state file give the same allocations, so
        # `render --objects` shows what `run` will allocate. (Upstream starts at random to
        # spread concurrent API servers apart; here there is one writer.)
        self.cluster = StandaloneCluster(
            service_cidrs=service_cidrs, remembered=self._saved, rng=random.Random(0)
        )
        # A first load's files are folded in as they are read: the control plane's work
        # on them overlaps the helper processes' reading of the rest.
        self.manifests.on_first_load = self.cluster.fold

    def reload(self) -> list[Event]:
        """Re-read the directory: the proxy's events for what changed."""
        events = self.cluster.apply(self.manifests.reload())
        self._save()
        return events

    async def watch(self, stop: asyncio.Event) -> AsyncGenerator[list[Event], None]:
        """The complete initial state, then a batch whenever the proxy's view changes."""
        first = True
        async for batch in self.manifests.watch(stop):
            events = self.cluster.apply(batch)
            del batch  # not held while the proxy programs the events (a start's 20,000)
            self._save()
            if events or first:
                yield events
            first = False

    def objects(self) -> list[dict[str, Any]]:
        """The completed Services and every EndpointSlice (``render --objects``)."""
        self.reload()
        return self.cluster.objects()

    def _save(self) -> None:
        allocations = self.cluster.allocations()
        if self.persist and allocations != self._saved and self.state.save(allocations):
            self._saved = allocations
