"""One informer: list, then watch, one resource type, turning it into model events.

This follows client-go's Reflector (tools/cache/reflector.go) where it matters:

* **List** with ``resourceVersion`` from ``relistResourceVersion``: ``"0"`` the first time
  (servable from the API server's watch cache), the last seen version after that (never
  older than what we have seen), and ``""`` (a consistent read) once that version was
  reported expired or too large. Pages of ``limit`` items are requested, except when
  listing at a specific version from a server that did not paginate the first list
  (so the watch cache can serve it). A continue token that expired mid-list (410) makes
  us fetch the whole list again, unpaginated, as client-go's pager does.
* **Watch** from the list's (later: the last seen) resourceVersion with
  ``allowWatchBookmarks=true`` and a random ``timeoutSeconds`` in
  [min_watch_timeout, 2 * min_watch_timeout); every event and BOOKMARK advances the
  version, so a watch that ends (timeout, dropped connection) resumes where it stopped.
* **410 Gone** (an HTTP status or an ERROR event) relists, and the relist is diffed against
  what we knew: only adds, updates and deletes are emitted.
* **Every list is logged at --v=2** with its size and resourceVersion, and a relist with
  why it happened: upstream's reflector logs "Caches populated" at V2 for each list, so at
  the verbosity operators run, a relist (an API server restart, a compacted history) shows.
* **Failures** (refused, reset, timeouts, 5xx, 403...) keep the last state and retry with
  capped exponential backoff and jitter; the first failure and the recovery are logged
  once each. A watch that ends within a second without any event counts as a failure
  for the backoff (client-go's "very short watch"), so a broken server cannot make us
  spin. When one informer reaches the server again, the others retry at once rather
  than each waiting out its own backoff (:class:`Wakeup`; client-go's reflectors are
  independent).

Deviation, on purpose: when a watch cannot be *started* for any reason, client-go relists
(except for connection refused and 429); we retry the watch from the same version, since
the server answers 410 if that version is no longer usable and a relist would only
re-read what we have.

What we store per object is its resourceVersion and parsed model (None when the object is
invalid, filtered out, or of no use to a proxy). A relist skips decoding objects whose
resourceVersion has not changed, and MODIFIED events whose model did not change (a Node
status heartbeat, a Service's annotations) emit nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from msgspec import Raw

from kubeproxy.logs import V2
from kubeproxy.model.events import Event, Model
from kubeproxy.model.parse import InvalidObjectError, skipped_parts
from kubeproxy.model.types import EndpointSlice, NamespacedName
from kubeproxy.sources.kube_client import ApiClient, ApiError, RequestError, UnreachableError
from kubeproxy.sources.kube_decode import (
    Decoded,
    DecodeError,
    decode_event,
    decode_list,
    decode_status,
    gc_paused,
    object_decoder,
)

log = logging.getLogger(__name__)

Emit = Callable[[list[Event]], None]


@dataclass(frozen=True)
class Resource:
    """One API resource type the proxy watches, and how to filter and parse it."""

    name: str  # plural resource name, also used in log lines: "services"
    kind: str  # "Service"
    path: str  # cluster-wide collection path: "/api/v1/services"
    parse: Callable[[Mapping[str, Any]], Model | None]
    label_selector: str = ""
    field_selector: str = ""
    # A field selector older API servers reject (400); dropped, with one log line, if so.
    optional_field_selector: str = ""
    # Client-side filter on labels, for what a label selector cannot express.
    wanted: Callable[[Mapping[str, Any]], bool] = lambda labels: True


@dataclass(frozen=True)
class Tuning:
    """Timings and sizes; the defaults are client-go's (or close), tests shrink them."""

    page_size: int = 500  # client-go pager default
    min_watch_timeout: float = 300.0  # watches last 5-10 minutes, as client-go
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    # Decoded between two returns to the event loop during a large list.
    decode_chunk: int = 500
    # KubeSource batching: a batch is closed after this much quiet, or this long at most.
    # 0: hand over what has arrived as soon as the consumer asks (after one turn of the
    # event loop). Coalescing then comes from the sync itself, as upstream: events that
    # arrive while a sync runs are folded into the change trackers and all go into the
    # next one, so a flood costs a few syncs without delaying a lone change.
    batch_quiet: float = 0.0
    batch_max_delay: float = 0.25


class Backoff:
    """Capped exponential backoff with jitter: delays in [d/2, d), d = initial * 2^n <= max."""

    def __init__(
        self, initial: float, maximum: float, rng: Callable[[], float] = random.random
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self._rng = rng
        self._attempt = 0

    def next_delay(self) -> float:
        delay = min(self.maximum, self.initial * 2.0**self._attempt)
        if delay < self.maximum:
            self._attempt += 1
        return delay * (0.5 + 0.5 * self._rng())

    def reset(self) -> None:
        self._attempt = 0


class Wakeup:
    """Cuts every informer's backoff short when one of them reaches the API server again.

    The server is back for all of them: after a long outage each informer would
    otherwise wait out its own backoff (jittered, up to ``backoff_max``), so a Service
    and its EndpointSlices could come back tens of seconds apart. A wakeup needs a
    recovery, which needs a failure streak first, so a broken server cannot make the
    informers spin.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or until the next :meth:`fire`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), seconds)


# Told about every failed attempt: (what, action, error), e.g. ("services", "list", err).
FailureObserver = Callable[[str, str, BaseException], None]


class Health:
    """Logs the start of a failure streak and its end, once each, not every retry.

    ``on_failure`` hears of every failed attempt (the source keeps the last one, which a
    one-shot command reports when it gives up: :mod:`kubeproxy.sources.oneshot`)."""

    def __init__(
        self,
        what: str,
        on_recovery: Callable[[], None] | None = None,
        on_failure: FailureObserver | None = None,
    ) -> None:
        self.what = what
        self.failures = 0
        self._since = 0.0
        self._on_recovery = on_recovery
        # The latest failure while failing ("cannot list services: ..."), else None.
        self.last_error: str | None = None
        self._on_failure = on_failure

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def failed(self, action: str, err: BaseException) -> None:
        if not self.failures:
            self._since = time.monotonic()
            log.warning(
                "Cannot %s %s: %s (keeping the last known state, retrying with backoff)",
                action,
                self.what,
                err,
            )
        else:
            log.debug("Still cannot %s %s: %s", action, self.what, err)
        self.failures += 1
        self.last_error = f"cannot {action} {self.what}: {err}"
        if self._on_failure is not None:
            self._on_failure(self.what, action, err)

    def recovered(self) -> None:
        if self.failures:
            log.info(
                "Reconnected to the API server for %s after %d failed attempts in %.1fs",
                self.what,
                self.failures,
                time.monotonic() - self._since,
            )
            self.failures = 0
            self.last_error = None
            if self._on_recovery is not None:
                self._on_recovery()


@dataclass(frozen=True, slots=True)
class _WatchEnd:
    # Delivered events or lasted a while: resume at once (else after a backoff).
    progressed: bool
    # Our resourceVersion is too old: relist.
    gone: bool = False
    # What the server said when it was gone.
    why: str = ""


@dataclass(slots=True)
class _Known:
    resource_version: str
    model: Model | None


def transition(old: Model | None, new: Model | None) -> list[Event]:
    """The event (if any) turning ``old`` into ``new``; None means absent."""
    if old is None:
        return [] if new is None else [Event.added(new)]
    if new is None:
        return [Event.deleted(old)]
    return [] if old == new else [Event.modified(old, new)]


class Informer:
    """List+watch one :class:`Resource` for as long as :meth:`run` runs."""

    def __init__(
        self,
        client: ApiClient,
        resource: Resource,
        emit: Emit,
        tuning: Tuning,
        wakeup: Wakeup | None = None,
        *,
        on_failure: FailureObserver | None = None,
    ) -> None:
        """``wakeup``: shared by the informers of one source (see :class:`Wakeup`);
        ``on_failure``: told of every failed list or watch (see :class:`Health`)."""
        self._client = client
        self._resource = resource
        self._emit = emit
        self._tuning = tuning
        self._decode = object_decoder(resource.kind)
        self._decode_meta = object_decoder(resource.kind, metadata_only=True)
        self._known: dict[NamespacedName, _Known] = {}
        self._use_optional_selector = bool(resource.optional_field_selector)
        self._rv_unavailable = False
        self._paginated = False
        # Why the next list is a relist ("" for the first list), for its log line.
        self._relist_why = ""
        self._backoff = Backoff(tuning.backoff_initial, tuning.backoff_max)
        self._wakeup = wakeup or Wakeup()
        self.health = Health(resource.name, self._wakeup.fire, on_failure)
        self.synced = asyncio.Event()
        # client-go's lastSyncResourceVersion.
        self.resource_version = ""

    @property
    def resource(self) -> Resource:
        return self._resource

    async def run(self) -> None:
        """Never returns; cancel the task to stop."""
        relist = True
        just_listed = False
        while True:
            action = "list" if relist else "watch"
            try:
                if relist:
                    await self._list()
                    relist, just_listed = False, True
                    action = "watch"
                end = await self._watch()
            except ApiError as err:
                if self._drop_optional_selector(err):
                    continue
                if err.too_large_resource_version:
                    # The server never saw our version (etcd restored from a backup, a
                    # different cluster behind the same address): start over.
                    self._rv_unavailable = relist = True
                    self._relist_why = str(err)
                self.health.failed(action, err)
            except (RequestError, DecodeError) as err:
                self.health.failed(action, err)
            except Exception as err:
                # A bug must not stop this resource for good: log it, back off, relist.
                if not self.health.failing:
                    log.exception("Unexpected error in the %s informer", self._resource.name)
                self.health.failed(action, err)
                relist = True
                self._relist_why = f"after an unexpected error: {err}"
            else:
                relist = end.gone
                self._relist_why = end.why
                # Gone from the very first watch after a list, without a single event,
                # means the server contradicts itself: back off rather than relist in a
                # loop. A 410 after anything else (a watch cut, an outage) relists at
                # once: the history moved on while we were away.
                contradicts = end.gone and just_listed
                just_listed = False
                if end.progressed or (end.gone and not contradicts):
                    self._backoff.reset()
                    continue
            just_listed = False
            await self._wakeup.sleep(self._backoff.next_delay())

    # ------------------------------------------------------------------------- list

    def _selectors(self) -> dict[str, str]:
        params: dict[str, str] = {}
        if self._resource.label_selector:
            params["labelSelector"] = self._resource.label_selector
        fields = [self._resource.field_selector]
        if self._use_optional_selector:
            fields.append(self._resource.optional_field_selector)
        if field_selector := ",".join(f for f in fields if f):
            params["fieldSelector"] = field_selector
        return params

    def _drop_optional_selector(self, err: ApiError) -> bool:
        if not (self._use_optional_selector and err.code == 400 and "field" in str(err)):
            return False
        self._use_optional_selector = False
        log.info(
            "The API server does not support fieldSelector %s on %s; filtering client-side",
            self._resource.optional_field_selector,
            self._resource.name,
        )
        return True

    def _relist_resource_version(self) -> str:
        if self._rv_unavailable:
            return ""
        return self.resource_version or "0"

    async def _list(self) -> None:
        requested = self._relist_resource_version()
        try:
            fresh, events, list_rv, paginated = await self._list_at(requested)
        except ApiError as err:
            if not (err.gone or err.too_large_resource_version):
                raise
            # Our version is unusable: a consistent read of the latest state instead.
            self._rv_unavailable = True
            requested = ""
            fresh, events, list_rv, paginated = await self._list_at(requested)
        if requested == "0" and paginated:
            # The server paginated a list it could have served from its watch cache:
            # it has none for this resource, so keep paginating relists too.
            self._paginated = True
        self._rv_unavailable = False
        self._known = fresh
        self.resource_version = list_rv
        if events:
            self._emit(events)
        why, self._relist_why = self._relist_why, ""
        log.log(
            V2,
            "Listed %d %s at resourceVersion %s%s",
            len(fresh),
            self._resource.name,
            list_rv,
            f" again ({why})" if why else "",
        )
        self.synced.set()

    async def _list_at(
        self, resource_version: str
    ) -> tuple[dict[NamespacedName, _Known], list[Event], str, bool]:
        params = {**self._selectors(), "resourceVersion": resource_version}
        if self._paginated or resource_version in ("", "0"):
            params["limit"] = str(self._tuning.page_size)
        replace = self._replace()
        paginated = False
        token = ""
        while True:
            request = params
            if token:
                # The token pins the snapshot; the API rejects a resourceVersion beside it.
                request = {k: v for k, v in params.items() if k != "resourceVersion"}
                request["continue"] = token
            try:
                body = await self._client.get(self._resource.path, request)
            except ApiError as err:
                if not (err.gone and token):
                    raise
                # The continue token expired mid-list: the whole list again, in one
                # response at the requested version (client-go's pager does the same).
                log.debug("Continue token for %s expired; listing again", self._resource.name)
                params.pop("limit", None)
                replace, token, paginated = self._replace(), "", False
                continue
            self.health.recovered()
            page = decode_list(body)
            del body
            await replace.add(page.items or ())
            token = page.metadata.continue_token
            if not token:
                fresh, events = replace.finish()
                return fresh, events, page.metadata.resource_version, paginated
            paginated = True

    # ------------------------------------------------------------------------ watch

    async def _watch(self) -> _WatchEnd:
        timeout = self._tuning.min_watch_timeout * (1.0 + random.random())
        params = {
            **self._selectors(),
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(max(1, int(timeout))),
        }
        started = time.monotonic()
        established = False
        received = 0
        try:
            # Our own deadline a little after the server's, for servers that ignore it.
            async with self._client.watch(
                self._resource.path, params, timeout=timeout + 30
            ) as lines:
                established = True
                self.health.recovered()
                async for line in lines:
                    event = decode_event(line)
                    if event.type == "ERROR":
                        raise ApiError(500, decode_status(event.object), "watch ERROR event")
                    received += 1
                    self._on_event(event.type, event.object)
        except ApiError as err:
            # 410 as the HTTP status of the watch request, or as an ERROR event.
            if not err.gone:
                raise
            log.debug("Watch of %s: %s; relisting", self._resource.name, err)
            return _WatchEnd(received > 0, gone=True, why=str(err))
        except UnreachableError as err:
            if not established:
                raise
            # Cut mid-stream (API server restart, proxy idle timeout): resume.
            log.debug("Watch of %s ended: %s", self._resource.name, err)
        return _WatchEnd(received > 0 or time.monotonic() - started >= 1.0)

    def _on_event(self, kind: str, raw: Raw) -> None:
        if kind == "BOOKMARK":
            meta = self._decode_meta(raw)
            if meta.resource_version:
                self.resource_version = meta.resource_version
            return
        if kind == "DELETED":
            decoded = self._decode_meta(raw)
            known = self._known.pop(NamespacedName(decoded.namespace, decoded.name), None)
            if known is not None and known.model is not None:
                self._emit([Event.deleted(known.model)])
        elif kind in ("ADDED", "MODIFIED"):
            decoded, new = self._model(raw)
            key = NamespacedName(decoded.namespace, decoded.name)
            old = self._known.get(key)
            self._known[key] = _Known(decoded.resource_version, new)
            if events := transition(old.model if old is not None else None, new):
                self._emit(events)
        else:
            log.debug("Ignoring watch event of type %r for %s", kind, self._resource.name)
            return
        if decoded.resource_version:
            self.resource_version = decoded.resource_version

    # ------------------------------------------------------------------------ shared

    def _replace(self) -> _Replace:
        return _Replace(self._known, self._decode_meta, self._model, self._tuning.decode_chunk)

    def _model(self, raw: Raw) -> tuple[Decoded, Model | None]:
        """Decode and parse one object; the model is None if invalid or not wanted."""
        decoded = self._decode(raw)
        if decoded.obj is None or not self._resource.wanted(decoded.labels):
            return decoded, None
        try:
            model = self._resource.parse(decoded.obj)
        except InvalidObjectError as err:
            log.error("%s", err)
            return decoded, None
        partly = skipped_parts(model) if isinstance(model, EndpointSlice) else None
        if partly:
            log.error("%s", partly)
        return decoded, model


class _Replace:
    """A (re)list in progress: the new store, and the events turning the old one into it."""

    def __init__(
        self,
        old: Mapping[NamespacedName, _Known],
        identify: Callable[[Raw], Decoded],
        model: Callable[[Raw], tuple[Decoded, Model | None]],
        chunk: int,
    ) -> None:
        self._old = old
        self._identify = identify
        self._model = model
        self._chunk = chunk
        self.fresh: dict[NamespacedName, _Known] = {}
        self.events: list[Event] = []

    async def add(self, items: Sequence[Raw]) -> None:
        for start in range(0, len(items), self._chunk):
            with gc_paused():
                for raw in items[start : start + self._chunk]:
                    self._add(raw)
            # Let watches, health checks and the sync runner run between chunks.
            await asyncio.sleep(0)

    def _add(self, raw: Raw) -> None:
        if self._old:
            meta = self._identify(raw)
            key = NamespacedName(meta.namespace, meta.name)
            old = self._old.get(key)
            if old is not None and old.resource_version == meta.resource_version:
                self.fresh[key] = old  # unchanged since we last saw it: nothing to decode
                return
        decoded, new = self._model(raw)
        key = NamespacedName(decoded.namespace, decoded.name)
        old = self._old.get(key)
        self.fresh[key] = _Known(decoded.resource_version, new)
        self.events.extend(transition(old.model if old is not None else None, new))

    def finish(self) -> tuple[dict[NamespacedName, _Known], list[Event]]:
        for key in self._old.keys() - self.fresh.keys():
            model = self._old[key].model
            if model is not None:
                self.events.append(Event.deleted(model))
        return self.fresh, self.events
