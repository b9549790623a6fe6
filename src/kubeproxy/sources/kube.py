"""The Kubernetes API source: Services, EndpointSlices, this node's Node and ServiceCIDRs.

A sibling of :class:`~kubeproxy.sources.manifests.ManifestSource` with the same
:meth:`KubeSource.watch` contract: the first batch is the complete initial state, later
batches are ADDED / MODIFIED / DELETED events of model objects.

Map of the API source:

* :mod:`kubeproxy.sources.kube` (here) — what is watched, with which selectors, and the
  batching of events for the consumer;
* :mod:`kubeproxy.sources.kube_informer` — list+watch of one resource (client-go's
  Reflector semantics: pagination, resourceVersion bookkeeping, bookmarks, 410 relists,
  backoff);
* :mod:`kubeproxy.sources.kube_client` — configuration (lightkube kubeconfig / in-cluster),
  auth, rate limiting, HTTP with aiohttp (real chunked watch streams);
* :mod:`kubeproxy.sources.kube_decode` — msgspec decoding of lists, watch lines, Status.

What is watched, as upstream kube-proxy does (cmd/kube-proxy/app/server.go):

* v1 Services without the ``service.kubernetes.io/service-proxy-name`` label, and (API
  servers >= 1.31 support the field) not headless: ``spec.clusterIP!=None``;
* discovery.k8s.io/v1 EndpointSlices without the ``service.kubernetes.io/headless`` label,
  whatever their proxy-name label (upstream filters Services only by it: a slice
  labelled for another proxy still serves a Service that is not);
* v1 Nodes with ``fieldSelector=metadata.name=<this node>``;
* networking.k8s.io/v1 ServiceCIDRs, when ``GET /apis/networking.k8s.io/v1`` lists them.

With a proxy name configured, objects labelled with exactly that name are wanted too;
a label selector cannot say "absent or equal to X", so the proxy-name label is then
filtered here instead of by the API server.

Batching: informers append events to one queue; the consumer receives everything that
arrived while it was busy. By default a batch is handed over as soon as the consumer asks
(a lone change waits for nothing; a flood is coalesced by the syncs themselves: what
arrives during one goes into the next); with ``batch_quiet`` > 0 a batch is closed only
after that long without new events (at most ``batch_max_delay`` after the first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from kubeproxy.model.events import Event
from kubeproxy.model.parse import (
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
)
from kubeproxy.model.types import LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME
from kubeproxy.sources.kube_client import (
    DEFAULT_BURST,
    DEFAULT_QPS,
    JSON,
    ApiClient,
    ApiError,
    Connection,
    CredentialsError,
    RequestError,
    RequestObserver,
    load_connection,
)
from kubeproxy.sources.kube_decode import DecodeError, decode_resource_names
from kubeproxy.sources.kube_events import post_event, starting_event
from kubeproxy.sources.kube_informer import (
    Backoff,
    Health,
    Informer,
    Resource,
    Tuning,
    Wakeup,
)
from kubeproxy.sources.oneshot import Trouble

log = logging.getLogger(__name__)

NETWORKING_V1 = "/apis/networking.k8s.io/v1"


def resources(node_name: str, proxy_name: str | None = None) -> list[Resource]:
    """The resources to watch for ``node_name`` (ServiceCIDRs last: only if served)."""
    not_proxied_elsewhere = "" if proxy_name else f"!{LABEL_SERVICE_PROXY_NAME}"

    def ours(labels: Mapping[str, Any]) -> bool:
        return labels.get(LABEL_SERVICE_PROXY_NAME) in (None, proxy_name)

    return [
        Resource(
            name="services",
            kind="Service",
            path="/api/v1/services",
            parse=parse_service,
            label_selector=not_proxied_elsewhere,
            optional_field_selector="spec.clusterIP!=None",
            wanted=ours,
        ),
        Resource(
            name="endpointslices",
            kind="EndpointSlice",
            path="/apis/discovery.k8s.io/v1/endpointslices",
            parse=parse_endpoint_slice,
            label_selector=f"!{LABEL_HEADLESS}",
        ),
        Resource(
            name="nodes",
            kind="Node",
            path="/api/v1/nodes",
            parse=parse_node,
            field_selector=f"metadata.name={node_name}",
        ),
        Resource(
            name="servicecidrs",
            kind="ServiceCIDR",
            path=f"{NETWORKING_V1}/servicecidrs",
            parse=parse_service_cidr,
        ),
    ]


class KubeSource:
    """Objects from the Kubernetes API, as batches of events (see the module docstring)."""

    def __init__(
        self,
        connection: Connection,
        node_name: str,
        *,
        proxy_name: str | None = None,
        tuning: Tuning | None = None,
        announce: bool = False,
    ) -> None:
        """``announce``: record upstream's ``Starting`` Event for the Node (the proxy
        itself; not ``render``, ``explain`` or ``--once``)."""
        self.connection = connection
        self.node_name = node_name
        self.proxy_name = proxy_name or None
        self.tuning = tuning or Tuning()
        self.announce = announce
        # The informers' (and the discovery's) failure trackers while watch() runs.
        self._health: list[Health] = []
        self._trouble: Trouble | None = None
        self._final = asyncio.Event()

    def problem(self) -> str | None:
        """Why the API server does not answer as it should now, or None (for the proxy's
        logs and /healthz while it waits for the initial state): the failures not yet
        followed by a success, unlike :attr:`trouble`, the last failure ever."""
        errors = [h.last_error for h in self._health if h.last_error is not None]
        if not errors:
            return None
        return f"{self.connection.server}: {'; '.join(errors)}"

    # One-shot commands ask these when the initial state does not come (sources.oneshot).

    @property
    def server(self) -> str:
        return self.connection.server

    @property
    def trouble(self) -> Trouble | None:
        """The last failed request (list, watch or discovery), if any."""
        return self._trouble

    async def final_trouble(self) -> Trouble:
        await self._final.wait()
        assert self._trouble is not None
        return self._trouble

    def _failed(self, what: str, action: str, err: BaseException) -> None:
        # Denied (after the credentials were refreshed once) or no credentials: the proxy
        # retries, as upstream, but a one-shot command has nothing to wait for.
        final = isinstance(err, CredentialsError) or (
            isinstance(err, ApiError) and err.code in (401, 403)
        )
        self._trouble = Trouble(f"cannot {action} {what}: {err}", final)
        if final:
            self._final.set()

    @classmethod
    def from_flags(
        cls,
        *,
        kubeconfig: str | None,
        master: str | None,
        node_name: str,
        proxy_name: str | None = None,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        content_type: str = JSON,
        observe: RequestObserver | None = None,
        announce: bool = False,
    ) -> KubeSource:
        """Build from upstream's flags / clientConnection fields; raises ConfigError."""
        connection = load_connection(
            kubeconfig, master, qps=qps, burst=burst, content_type=content_type
        )
        connection.observe = observe
        return cls(connection, node_name, proxy_name=proxy_name, announce=announce)

    async def watch(self, stop: asyncio.Event) -> AsyncGenerator[list[Event], None]:
        """Yield the complete initial state once every informer has listed, then changes.

        Returns when ``stop`` is set (without yielding a partial initial state).
        """
        *base, service_cidrs = resources(self.node_name, self.proxy_name)
        batcher = _Batcher(self.tuning, stop)
        wakeup = Wakeup()
        async with self.connection.client() as client:
            informers: list[Informer] = []
            tasks: list[asyncio.Task[None]] = [asyncio.create_task(batcher.watch_stop())]

            def start(resource: Resource) -> None:
                informer = Informer(
                    client, resource, batcher.put, self.tuning, wakeup, on_failure=self._failed
                )
                informers.append(informer)
                self._health.append(informer.health)
                tasks.append(asyncio.create_task(informer.run(), name=f"watch-{resource.name}"))

            if self.announce:
                self.announce = False  # once per process, as upstream
                event = starting_event(self.node_name, time.time())
                tasks.append(asyncio.create_task(post_event(client, event)))
            try:
                for resource in base:
                    start(resource)
                served = await self._service_cidrs_served(client, stop)
                if served is None:
                    return
                if served:
                    start(service_cidrs)
                else:
                    log.info("The API server does not serve ServiceCIDRs; not watching them")
                for informer in informers:
                    if not await _wait(informer.synced, stop):
                        return
                log.info("Initial state listed from %s", self.connection.server)
                yield batcher.take()
                while (batch := await batcher.next()) is not None:
                    yield batch
            finally:
                self._health = []
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _service_cidrs_served(self, client: ApiClient, stop: asyncio.Event) -> bool | None:
        """Whether networking.k8s.io/v1 serves ServiceCIDRs; None if stopped first."""
        health = Health("the networking.k8s.io/v1 API", on_failure=self._failed)
        self._health.append(health)
        backoff = Backoff(self.tuning.backoff_initial, self.tuning.backoff_max)
        while not stop.is_set():
            try:
                body = await client.get(NETWORKING_V1)
                health.recovered()
                return "servicecidrs" in decode_resource_names(body)
            except ApiError as err:
                if err.code == 404:  # the whole group/version is not served
                    health.recovered()
                    return False
                health.failed("discover", err)
            except (RequestError, DecodeError) as err:
                health.failed("discover", err)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff.next_delay())
        return None


class _Batcher:
    """Collects informer events; hands them out in as few batches as latency allows."""

    def __init__(self, tuning: Tuning, stop: asyncio.Event) -> None:
        self._quiet = tuning.batch_quiet
        self._max_delay = tuning.batch_max_delay
        self._stop = stop
        self._pending: list[Event] = []
        self._arrived = asyncio.Event()

    def put(self, events: list[Event]) -> None:
        self._pending.extend(events)
        self._arrived.set()

    def take(self) -> list[Event]:
        batch, self._pending = self._pending, []
        self._arrived.clear()
        return batch

    async def watch_stop(self) -> None:
        await self._stop.wait()
        self._arrived.set()  # wake next() so it sees the stop

    async def next(self) -> list[Event] | None:
        """The next non-empty batch; None once stop is set."""
        while not self._pending:
            if self._stop.is_set():
                return None
            self._arrived.clear()
            await self._arrived.wait()
        if self._quiet <= 0:
            # One turn of the loop: events already read from other watches join in.
            await asyncio.sleep(0)
            return None if self._stop.is_set() else self.take()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_delay
        while (left := deadline - loop.time()) > 0 and not self._stop.is_set():
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), min(self._quiet, left))
            except TimeoutError:
                break  # quiet: close the batch
        return None if self._stop.is_set() else self.take()


async def _wait(event: asyncio.Event, stop: asyncio.Event) -> bool:
    """Wait for ``event``; False if ``stop`` is set first."""
    if event.is_set():
        return True
    waiters = [asyncio.create_task(event.wait()), asyncio.create_task(stop.wait())]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return event.is_set() and not stop.is_set()
