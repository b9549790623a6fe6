"""A Kubernetes API server stand-in for tests: real HTTP on 127.0.0.1, documented semantics.

It serves v1 Services and Nodes, discovery.k8s.io/v1 EndpointSlices and
networking.k8s.io/v1 ServiceCIDRs the way https://kubernetes.io/docs/reference/using-api/api-concepts/
describes, so a client that works against it relies on nothing a real API server would
not do:

* one global ``resourceVersion`` counter, bumped by every create/update/delete (as etcd's
  revision), in object metadata and in List metadata; List items carry no kind/apiVersion;
* **list**: ``limit`` / ``continue`` pagination over a consistent snapshot; the
  resourceVersion semantics of the API concepts table — unset: most recent; ``"0"``: any
  (with ``watch_cache``, served from the "cache": ``limit`` ignored); ``N`` without limit:
  not older than N; ``N`` with limit: exactly N (410 Expired if compacted); ``N`` newer
  than the server: 504 with cause ResourceVersionTooLarge; a continue token from before
  the compaction: 410 Expired;
* **selectors**: ``labelSelector`` (``k``, ``!k``, ``k=v``, ``k==v``, ``k!=v``,
  ``k in (a,b)``, ``k notin (a,b)``) and ``fieldSelector`` (``metadata.name``,
  ``metadata.namespace``, and ``spec.clusterIP`` / ``spec.type`` on Services unless
  ``service_field_selectors=False`` emulates an API server older than 1.31); an object
  that stops (starts) matching during a watch is seen as DELETED (ADDED), as the watch
  cache does;
* **watch** (``watch=true``): a chunked stream of ``{"type": ..., "object": ...}`` lines;
  unset/``"0"`` start with synthetic ADDED events for the current state; ``N`` replays
  history after N, or answers 410 when N is older than the compaction point — as an
  ERROR event carrying a Status (what API servers do since watches are served by the
  watch cache) or, with ``gone_as_status=True``, as an HTTP 410 response;
  ``allowWatchBookmarks=true`` enables BOOKMARK events (sent by :meth:`ApiServer.bookmark`
  and right before ``timeoutSeconds`` closes the stream);
* discovery: ``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>/<version>``; ServiceCIDRs
  can be switched off (``service_cidrs=False``: not in discovery, 404 on the path);
* bearer-token authentication when ``token`` is set (401 otherwise); HTTPS with an
  ``ssl_context`` (which may require client certificates).

What a test can do to it: mutate objects (:meth:`~ApiServer.create`,
:meth:`~ApiServer.update`, :meth:`~ApiServer.apply`, :meth:`~ApiServer.delete`),
:meth:`~ApiServer.compact` history, :meth:`~ApiServer.drop_watches` (connections cut,
optionally mid-line), :meth:`~ApiServer.expire_watches` (410 ERROR events),
:meth:`~ApiServer.stop` / :meth:`~ApiServer.start` (down/up on the same port),
:meth:`~ApiServer.fail_with` (answer every request with an error status),
:meth:`~ApiServer.forbid` (403 for one resource, as RBAC),
:meth:`~ApiServer.slow_watches` (every watch event late), and read
:attr:`~ApiServer.requests` to see what the client asked for.

Realistic object builders (``*_object``), with the metadata a real API server adds
(managedFields, ownerReferences...), are at the end, for benchmarks and decoding tests.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import itertools
import json
import re
import ssl
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects


@dataclass(frozen=True)
class ResourceType:
    plural: str
    kind: str
    group: str  # "" for the core group
    version: str
    namespaced: bool
    field_labels: tuple[str, ...] = ("metadata.name", "metadata.namespace")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


SERVICES = ResourceType(
    "services",
    "Service",
    "",
    "v1",
    True,
    ("metadata.name", "metadata.namespace", "spec.clusterIP", "spec.type"),
)
ENDPOINT_SLICES = ResourceType("endpointslices", "EndpointSlice", "discovery.k8s.io", "v1", True)
NODES = ResourceType("nodes", "Node", "", "v1", False)
SERVICE_CIDRS = ResourceType("servicecidrs", "ServiceCIDR", "networking.k8s.io", "v1", False)
TYPES = {t.kind: t for t in (SERVICES, ENDPOINT_SLICES, NODES, SERVICE_CIDRS)}

# Other resources of the groups we serve, so discovery documents look like real ones.
_OTHER_RESOURCES = {
    "v1": ["configmaps", "endpoints", "namespaces", "pods", "secrets"],
    "discovery.k8s.io/v1": [],
    "networking.k8s.io/v1": ["ingressclasses", "ingresses", "networkpolicies"],
}


@dataclass(frozen=True)
class RequestRecord:
    path: str
    params: dict[str, str]
    method: str = "GET"

    @property
    def watch(self) -> bool:
        return self.params.get("watch") in ("true", "1")


@dataclass
class _Change:
    rv: int
    type: str  # ADDED / MODIFIED / DELETED
    obj: Obj  # the new object (DELETED: the last state, at the deletion's version)
    old: Obj | None


@dataclass
class _Store:
    """All versions of the objects of one type since the compaction point."""

    type: ResourceType
    versions: dict[Key, list[tuple[int, Obj | None]]] = field(default_factory=dict)
    log: list[_Change] = field(default_factory=list)
    _cache: tuple[int, int, list[str], list[Obj]] | None = None
    _mutations: int = 0

    def current(self, key: Key) -> Obj | None:
        history = self.versions.get(key)
        return history[-1][1] if history else None

    def record(self, change: _Change, key: Key) -> None:
        self.versions.setdefault(key, []).append(
            (change.rv, None if change.type == "DELETED" else change.obj)
        )
        self.log.append(change)
        self._mutations += 1

    def at(self, rv: int) -> tuple[list[str], list[Obj]]:
        """The objects as of ``rv`` in key order (etcd's): key strings, objects."""
        if self._cache is not None and self._cache[:2] == (rv, self._mutations):
            return self._cache[2], self._cache[3]
        items: list[tuple[str, Obj]] = []
        for key, history in self.versions.items():
            obj = None
            for version, candidate in reversed(history):
                if version <= rv:
                    obj = candidate
                    break
            if obj is not None:
                items.append((_key_string(key), obj))
        items.sort(key=lambda item: item[0])
        keys, objs = [k for k, _ in items], [o for _, o in items]
        self._cache = (rv, self._mutations, keys, objs)
        return keys, objs

    def compact(self, rv: int) -> None:
        """Forget versions older than ``rv`` (keeping each object's state as of ``rv``)."""
        for key in list(self.versions):
            history = self.versions[key]
            keep = [v for v in history if v[0] > rv]
            older = [v for v in history if v[0] <= rv]
            if older and older[-1][1] is not None:
                keep.insert(0, older[-1])
            if keep:
                self.versions[key] = keep
            else:
                del self.versions[key]
        self.log = [c for c in self.log if c.rv > rv]
        self._cache = None


@dataclass(eq=False)
class Gate:
    """A held request: ``arrived`` is set when it comes in, set ``released`` to serve it."""

    predicate: Callable[[RequestRecord], bool]
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class _Watcher:
    type: ResourceType
    matches: Callable[[Obj], bool]
    bookmarks: bool
    queue: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)


class ApiError(Exception):
    """Answered as a Status with this code."""

    def __init__(self, code: int, reason: str, message: str, causes: list[Obj] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.causes = code, reason, message, causes

    @property
    def status(self) -> Obj:
        return status(self.code, self.reason, self.message, self.causes)


def _forbidden(rtype: ResourceType, verb: str) -> ApiError:
    """RBAC's refusal, worded as the API server words it."""
    resource = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
    return ApiError(
        403,
        "Forbidden",
        f'{resource} is forbidden: User "system:anonymous" cannot {verb} resource '
        f'"{rtype.plural}" in API group "{rtype.group}" at the cluster scope',
    )


def _too_old(rv: int, compacted: int) -> ApiError:
    return ApiError(410, "Expired", f"too old resource version: {rv} ({compacted})")


def _too_large(rv: int, current: int) -> ApiError:
    cause = {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
    return ApiError(
        504, "Timeout", f"Too large resource version: {rv}, current: {current}", [cause]
    )


def status(code: int, reason: str, message: str, causes: list[Obj] | None = None) -> Obj:
    """A metav1.Status, as the API server returns for errors."""
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if causes:
        body["details"] = {"causes": causes}
    return body


class ApiServer:
    """See the module docstring. Use as ``async with ApiServer() as api: ... api.url``."""

    def __init__(
        self,
        *,
        watch_cache: bool = True,
        gone_as_status: bool = False,
        service_cidrs: bool = True,
        service_field_selectors: bool = True,
        token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        too_large_wait: float = 3.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.watch_cache = watch_cache
        self.gone_as_status = gone_as_status
        self.service_cidrs = service_cidrs
        self.service_field_selectors = service_field_selectors
        self.token = token
        self.host = host
        self.port = port
        self.too_large_wait = too_large_wait
        self.ssl_context = ssl_context
        self.rv = 1
        self.compacted = 0
        self.requests: list[RequestRecord] = []
        # Events created (POST .../events.k8s.io/v1/namespaces/NS/events), as posted.
        self.events: list[Obj] = []
        self._stores = {kind: _Store(t) for kind, t in TYPES.items()}
        self._watchers: set[_Watcher] = set()
        self._runner: web.AppRunner | None = None
        self._failure: tuple[int, str] | None = None
        self._forbidden: set[str] = set()
        self.watch_delay: float | None = None
        self._gates: list[Gate] = []
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        scheme = "http" if self.ssl_context is None else "https"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def up(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        """Listen (again: on the same port after :meth:`stop`)."""
        app = web.Application()
        app.router.add_route("GET", "/{path:.*}", self._handle)
        app.router.add_route("POST", "/{path:.*}", self._create)
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.TCPSite(
            runner, self.host, self.port, reuse_address=True, ssl_context=self.ssl_context
        )
        await site.start()
        self._runner = runner
        if not self.port:
            server = site._server
            assert isinstance(server, asyncio.Server)
            self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Go down: cut every watch, close every connection, refuse new ones."""
        if self._runner is None:
            return
        self.drop_watches()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def hold(self, predicate: Callable[[RequestRecord], bool]) -> Gate:
        """Hold the next request matching ``predicate`` until the gate is released."""
        gate = Gate(predicate)
        self._gates.append(gate)
        return gate

    def slow_watches(self, delay: float | None) -> None:
        """Hold every watch event line ``delay`` seconds before sending it (None: not)."""
        self.watch_delay = delay

    def forbid(self, plural: str) -> None:
        """Answer every request for ``plural`` (``endpointslices``...) with 403, as RBAC
        does when the client's role lacks the verb."""
        self._forbidden.add(plural)

    def fail_with(self, code: int | None, reason: str = "InternalError") -> None:
        """Answer every request with ``code`` (None: serve normally again)."""
        self._failure = None if code is None else (code, reason)

    # ------------------------------------------------------------------- mutations

    def create(self, obj: Obj) -> Obj:
        kind, key = _identify(obj)
        if self._stores[kind].current(key) is not None:
            raise ValueError(f"{kind} {key} already exists")
        return self._write(kind, key, obj, "ADDED")

    def update(self, obj: Obj) -> Obj:
        kind, key = _identify(obj)
        if self._stores[kind].current(key) is None:
            raise ValueError(f"{kind} {key} not found")
        return self._write(kind, key, obj, "MODIFIED")

    def apply(self, obj: Obj) -> Obj:
        """Create or update."""
        kind, key = _identify(obj)
        event = "MODIFIED" if self._stores[kind].current(key) is not None else "ADDED"
        return self._write(kind, key, obj, event)

    def delete(self, kind: str, name: str, namespace: str = "") -> None:
        key = (namespace if TYPES[kind].namespaced else "", name)
        store = self._stores[kind]
        old = store.current(key)
        if old is None:
            raise ValueError(f"{kind} {key} not found")
        self.rv += 1
        last = {**old, "metadata": {**old["metadata"], "resourceVersion": str(self.rv)}}
        self._publish(store, key, _Change(self.rv, "DELETED", last, old))

    def _write(self, kind: str, key: Key, obj: Obj, event: str) -> Obj:
        store = self._stores[kind]
        old = store.current(key)
        self.rv += 1
        meta = {**obj.get("metadata", {}), "resourceVersion": str(self.rv)}
        if TYPES[kind].namespaced:
            meta["namespace"] = key[0]
        if old is not None:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
        else:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", "2025-01-01T00:00:00Z")
        # Stored without kind/apiVersion, as List items are served.
        stored = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
        stored["metadata"] = meta
        self._publish(store, key, _Change(self.rv, event, stored, old))
        return stored

    def _publish(self, store: _Store, key: Key, change: _Change) -> None:
        store.record(change, key)
        self._changed.set()
        for watcher in self._watchers:
            if watcher.type is store.type and (line := _event_line(watcher, change)):
                watcher.queue.put_nowait(("line", line))

    def compact(self) -> None:
        """Compact history at the current version: older versions become "too old"."""
        self.compacted = self.rv
        for store in self._stores.values():
            store.compact(self.rv)

    # -------------------------------------------------------------- watch control

    def bookmark(self) -> None:
        """Send a BOOKMARK at the current version to every watch that allows bookmarks."""
        for watcher in self._watchers:
            if watcher.bookmarks:
                watcher.queue.put_nowait(("line", _bookmark_line(watcher.type, self.rv)))

    def drop_watches(self, *, mid_line: bool = False) -> None:
        """Cut every watch connection (after half an event line if ``mid_line``)."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(("drop", mid_line))

    def expire_watches(self) -> None:
        """End every watch with an ERROR event: 410 Expired (the watcher fell behind)."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(("expire", None))

    @property
    def watch_count(self) -> int:
        return len(self._watchers)

    # --------------------------------------------------------------------- serving

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        params = dict(request.query)
        record = RequestRecord(request.path, params)
        self.requests.append(record)
        for gate in self._gates:
            if gate.predicate(record):
                self._gates.remove(gate)
                gate.arrived.set()
                await gate.released.wait()
                break
        try:
            if self._failure is not None:
                code, reason = self._failure
                raise ApiError(code, reason, f"injected failure {code}")
            if self.token is not None and request.headers.get("Authorization") != (
                f"Bearer {self.token}"
            ):
                raise ApiError(401, "Unauthorized", "Unauthorized")
            discovery = self._discovery(request.path)
            if discovery is not None:
                return _json(200, discovery)
            rtype, namespace = self._route(request.path)
            watch = params.get("watch") in ("true", "1")
            if rtype.plural in self._forbidden:
                raise _forbidden(rtype, "watch" if watch else "list")
            if watch:
                return await self._watch(request, rtype, namespace, params)
            return _json(200, self._list(rtype, namespace, params))
        except ApiError as err:
            return _json(err.code, err.status)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        """Only Events can be created, as the API server does it: 201 with the object."""
        self.requests.append(RequestRecord(request.path, dict(request.query), "POST"))
        try:
            if self._failure is not None:
                code, reason = self._failure
                raise ApiError(code, reason, f"injected failure {code}")
            m = re.fullmatch(r"/apis/events\.k8s\.io/v1/namespaces/([^/]+)/events", request.path)
            if m is None:
                raise ApiError(405, "MethodNotAllowed", f"POST {request.path} is not served")
            if request.headers.get("Content-Type") != "application/json":
                raise ApiError(415, "UnsupportedMediaType", "the body must be JSON")
            obj = json.loads(await request.read())
            if (obj.get("apiVersion"), obj.get("kind")) != ("events.k8s.io/v1", "Event"):
                raise ApiError(400, "BadRequest", "not an events.k8s.io/v1 Event")
            if obj.get("metadata", {}).get("namespace", m.group(1)) != m.group(1):
                raise ApiError(400, "BadRequest", "the namespace of the body does not match")
            required = ("eventTime", "reportingController", "reportingInstance", "action")
            missing = [f for f in required if not obj.get(f)]
            if missing:
                raise ApiError(422, "Invalid", f"Event is invalid: {', '.join(missing)} required")
            self.rv += 1
            obj["metadata"] = {**obj["metadata"], "resourceVersion": str(self.rv)}
            self.events.append(obj)
            return _json(201, obj)
        except ApiError as err:
            return _json(err.code, err.status)

    def _discovery(self, path: str) -> Obj | None:
        path = path.rstrip("/")
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"]}
        groups = {"discovery.k8s.io": "v1", "networking.k8s.io": "v1"}
        if path == "/apis":
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": name,
                        "versions": [{"groupVersion": f"{name}/{v}", "version": v}],
                        "preferredVersion": {"groupVersion": f"{name}/{v}", "version": v},
                    }
                    for name, v in groups.items()
                ],
            }
        for group_version, others in _OTHER_RESOURCES.items():
            prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
            if path != prefix:
                continue
            served = [t for t in self._served() if t.api_version == group_version]
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": [
                    {
                        "name": t.plural,
                        "singularName": t.kind.lower(),
                        "namespaced": t.namespaced,
                        "kind": t.kind,
                        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                    }
                    for t in served
                ]
                + [{"name": name, "namespaced": True, "kind": "", "verbs": []} for name in others],
            }
        return None

    def _served(self) -> list[ResourceType]:
        return [t for t in TYPES.values() if self.service_cidrs or t is not SERVICE_CIDRS]

    def _route(self, path: str) -> tuple[ResourceType, str | None]:
        for rtype in self._served():
            if path == f"{rtype.prefix}/{rtype.plural}":
                return rtype, None
            match = re.fullmatch(rf"{rtype.prefix}/namespaces/([^/]+)/{rtype.plural}", path)
            if match and rtype.namespaced:
                return rtype, match.group(1)
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _matcher(
        self, rtype: ResourceType, namespace: str | None, params: Mapping[str, str]
    ) -> Callable[[Obj], bool]:
        labels = parse_label_selector(params.get("labelSelector", ""))
        allowed = rtype.field_labels
        if rtype is SERVICES and not self.service_field_selectors:
            allowed = ("metadata.name", "metadata.namespace")
        fields = parse_field_selector(params.get("fieldSelector", ""), allowed)

        def matches(obj: Obj) -> bool:
            meta = obj["metadata"]
            if namespace is not None and meta.get("namespace") != namespace:
                return False
            return labels(meta.get("labels") or {}) and fields(obj)

        return matches

    def _list(self, rtype: ResourceType, namespace: str | None, params: Mapping[str, str]) -> Obj:
        matches = self._matcher(rtype, namespace, params)
        requested = params.get("resourceVersion", "")
        limit = _int_param(params, "limit")
        start = ""
        if token := params.get("continue", ""):
            if requested:
                raise ApiError(
                    400,
                    "BadRequest",
                    "specifying resource version is not allowed when using continue",
                )
            snapshot, start = _decode_continue(token)
            if snapshot < self.compacted:
                raise ApiError(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent "
                    "list result. You can start a new list without the continue parameter.",
                )
        elif requested in ("", "0"):
            snapshot = self.rv
            if requested == "0" and self.watch_cache:
                limit = 0  # the watch cache serves RV=0 in full, ignoring limit
        else:
            wanted = _rv(requested)
            if wanted > self.rv:
                raise _too_large(wanted, self.rv)
            if limit:  # "Exact": that very snapshot, if not compacted away
                if wanted < self.compacted:
                    raise _too_old(wanted, self.compacted)
                snapshot = wanted
            else:  # "NotOlderThan": the latest state is at least that fresh
                snapshot = self.rv
        keys, objs = self._stores[rtype.kind].at(snapshot)
        page: list[Obj] = []
        last = ""
        more = False
        for i in range(bisect.bisect_right(keys, start), len(keys)):
            if not matches(objs[i]):
                continue
            if limit and len(page) == limit:
                more = True
                break
            page.append(objs[i])
            last = keys[i]
        meta: Obj = {"resourceVersion": str(snapshot)}
        if more:
            meta["continue"] = _encode_continue(snapshot, last)
            if namespace is None and not {"labelSelector", "fieldSelector"} & params.keys():
                meta["remainingItemCount"] = len(keys) - bisect.bisect_right(keys, last)
        return {
            "kind": f"{rtype.kind}List",
            "apiVersion": rtype.api_version,
            "metadata": meta,
            "items": page,
        }

    async def _watch(
        self,
        request: web.Request,
        rtype: ResourceType,
        namespace: str | None,
        params: Mapping[str, str],
    ) -> web.StreamResponse:
        matches = self._matcher(rtype, namespace, params)
        timeout = float(_int_param(params, "timeoutSeconds")) or None
        watcher = _Watcher(rtype, matches, params.get("allowWatchBookmarks") == "true")
        requested = params.get("resourceVersion", "")
        error: Obj | None = None
        since = 0
        if requested not in ("", "0"):
            since = _rv(requested)
            if since < self.compacted:
                error = _too_old(since, self.compacted).status
                if self.gone_as_status:
                    return _json(410, error)
            elif since > self.rv and not await self._catch_up(since):
                # The watch cache waits a little for a version it has not seen, then fails.
                cause = {
                    "reason": "ResourceVersionTooLarge",
                    "message": "Too large resource version",
                }
                message = f"Too large resource version: {since}, current: {self.rv}"
                error = status(504, "Timeout", message, [cause])
        initial: list[bytes] = []
        if error is None:
            if requested in ("", "0"):
                # "Get State and Start at ...": synthetic ADDED events for what exists now.
                for obj in self._stores[rtype.kind].at(self.rv)[1]:
                    if matches(obj):
                        initial.append(_line("ADDED", rtype, obj))
            else:
                for change in self._stores[rtype.kind].log:
                    if change.rv > since and (line := _event_line(watcher, change)):
                        initial.append(line)
            # Before any await: every change published from now on reaches this watcher.
            self._watchers.add(watcher)
        try:
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            if error is not None:
                await response.write(b'{"type":"ERROR","object":' + _encode(error) + b"}\n")
                await response.write_eof()
                return response
            for line in initial:
                await response.write(line)
            if await self._stream(request, response, watcher, timeout):
                await response.write_eof()
        finally:
            self._watchers.discard(watcher)
        return response

    async def _catch_up(self, rv: int) -> bool:
        deadline = asyncio.get_running_loop().time() + self.too_large_wait
        while self.rv < rv:
            self._changed.clear()
            left = deadline - asyncio.get_running_loop().time()
            try:
                await asyncio.wait_for(self._changed.wait(), max(left, 0))
            except TimeoutError:
                return False
        return True

    async def _stream(
        self,
        request: web.Request,
        response: web.StreamResponse,
        watcher: _Watcher,
        timeout: float | None,
    ) -> bool:
        """Forward queued lines until timeout or a control message; False if cut."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else deadline - loop.time()
            try:
                if left is not None and left <= 0:
                    raise TimeoutError
                what, arg = await asyncio.wait_for(watcher.queue.get(), left)
            except TimeoutError:
                # Deliver what is queued, then a last bookmark, then end the stream.
                while not watcher.queue.empty():
                    what, arg = watcher.queue.get_nowait()
                    if what == "line":
                        await response.write(arg)
                if watcher.bookmarks:
                    await response.write(_bookmark_line(watcher.type, self.rv))
                return True
            if what == "line":
                if self.watch_delay:
                    await asyncio.sleep(self.watch_delay)
                await response.write(arg)
            elif what == "expire":
                expired = status(410, "Expired", "too old resource version: watcher fell behind")
                await response.write(b'{"type":"ERROR","object":' + _encode(expired) + b"}\n")
                return True
            elif what == "drop":
                if arg:
                    await response.write(b'{"type":"MODIFIED","object":{"metadata":')
                assert request.transport is not None
                request.transport.abort()
                return False


# ------------------------------------------------------------------------- helpers


def _identify(obj: Obj) -> tuple[str, Key]:
    kind = obj["kind"]
    meta = obj["metadata"]
    namespace = (meta.get("namespace") or "default") if TYPES[kind].namespaced else ""
    return kind, (namespace, meta["name"])


def _key_string(key: Key) -> str:
    return f"{key[0]}/{key[1]}" if key[0] else key[1]


def _rv(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, "BadRequest", f"invalid resource version {text!r}") from None
    if value < 0:
        raise ApiError(400, "BadRequest", f"invalid resource version {text!r}")
    return value


def _int_param(params: Mapping[str, str], name: str) -> int:
    text = params.get(name, "")
    try:
        return int(text) if text else 0
    except ValueError:
        raise ApiError(400, "BadRequest", f"invalid {name} {text!r}") from None


def _encode_continue(rv: int, last_key: str) -> str:
    token = {"v": "meta.k8s.io/v1", "rv": rv, "start": last_key + "\x00"}
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode()


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError):
        raise ApiError(400, "BadRequest", "continue key is not valid") from None


_encoder = msgspec.json.Encoder()


def _encode(obj: Obj) -> bytes:
    return _encoder.encode(obj)


def _json(code: int, body: Obj) -> web.Response:
    return web.Response(status=code, body=_encode(body), content_type="application/json")


def _line(event: str, rtype: ResourceType, obj: Obj) -> bytes:
    full = {"kind": rtype.kind, "apiVersion": rtype.api_version, **obj}
    return b'{"type":"' + event.encode() + b'","object":' + _encode(full) + b"}\n"


def _bookmark_line(rtype: ResourceType, rv: int) -> bytes:
    obj: Obj = {"kind": rtype.kind, "apiVersion": rtype.api_version}
    obj["metadata"] = {"resourceVersion": str(rv)}
    return b'{"type":"BOOKMARK","object":' + _encode(obj) + b"}\n"


def _event_line(watcher: _Watcher, change: _Change) -> bytes | None:
    """The line a watcher with a selector sees for a change (watch cache semantics)."""
    now = watcher.matches(change.obj)
    before = change.old is not None and watcher.matches(change.old)
    if change.type == "DELETED":
        return _line("DELETED", watcher.type, change.obj) if now else None
    if now and before:
        return _line("MODIFIED", watcher.type, change.obj)
    if now:
        return _line("ADDED", watcher.type, change.obj)
    if before:
        # It stopped matching: gone from this watcher's point of view.
        return _line("DELETED", watcher.type, change.obj)
    return None


# ----------------------------------------------------------------------- selectors

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"[-A-Za-z0-9_.]*"


def parse_label_selector(text: str) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate on labels for a label selector (the API's grammar); 400 if invalid."""
    checks = [_label_check(term.strip()) for term in _split_terms(text) if term.strip()]
    return lambda labels: all(check(labels) for check in checks)


def _split_terms(text: str) -> list[str]:
    """Split on the commas that separate requirements (not those inside "in (a,b)")."""
    terms, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _label_check(term: str) -> Callable[[Mapping[str, Any]], bool]:
    if match := re.fullmatch(rf"!\s*({_KEY})", term):
        key = match[1]
        return lambda labels: key not in labels
    if match := re.fullmatch(rf"({_KEY})", term):
        key = match[1]
        return lambda labels: key in labels
    if match := re.fullmatch(rf"({_KEY})\s*(==|!=|=)\s*({_VALUE})", term):
        key, op, value = match[1], match[3], match[4]
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := re.fullmatch(rf"({_KEY})\s+(in|notin)\s*\(([^)]*)\)", term):
        key, op = match[1], match[3]
        values = {v.strip() for v in match[4].split(",")}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")


def parse_field_selector(text: str, allowed: Iterable[str]) -> Callable[[Obj], bool]:
    """A predicate for a field selector (``=``, ``==``, ``!=`` terms); 400 if unsupported."""
    checks: list[Callable[[Obj], bool]] = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        match = re.fullmatch(r"([A-Za-z.]+)\s*(==|!=|=)\s*(.*)", term)
        if match is None:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
        path, op, value = match.groups()
        if path not in allowed:
            raise ApiError(400, "BadRequest", f"field label not supported: {path}")
        checks.append(_field_check(path, op, value))
    return lambda obj: all(check(obj) for check in checks)


def _field_check(path: str, op: str, value: str) -> Callable[[Obj], bool]:
    def get(obj: Obj) -> str:
        current: Any = obj
        for part in path.split("."):
            current = current.get(part) if isinstance(current, dict) else None
        return "" if current is None else str(current)

    if op == "!=":
        return lambda obj: get(obj) != value
    return lambda obj: get(obj) == value


# ---------------------------------------------------------- realistic object builders

_uids = (str(uuid.UUID(int=i)) for i in itertools.count(1))


def _managed(manager: str, api_version: str, fields: Obj) -> Obj:
    return {
        "manager": manager,
        "operation": "Update",
        "apiVersion": api_version,
        "time": "2025-01-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }


def service_object(name: str, namespace: str, cluster_ip: str, *, port: int = 80) -> Obj:
    """A ClusterIP Service as ``kubectl get -o json`` shows it (managedFields included)."""
    return {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": next(_uids),
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "bench"},
            "annotations": {"meta.helm.sh/release-name": name},
            "managedFields": [
                _managed(
                    "helm",
                    "v1",
                    {
                        "f:metadata": {"f:labels": {".": {}, "f:app.kubernetes.io/name": {}}},
                        "f:spec": {
                            "f:internalTrafficPolicy": {},
                            "f:ports": {".": {}, f'k:{{"port":{port},"protocol":"TCP"}}': {}},
                            "f:selector": {},
                            "f:sessionAffinity": {},
                            "f:type": {},
                        },
                    },
                )
            ],
        },
        "spec": {
            "clusterIP": cluster_ip,
            "clusterIPs": [cluster_ip],
            "internalTrafficPolicy": "Cluster",
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": 8080}],
            "selector": {"app.kubernetes.io/name": name},
            "sessionAffinity": "None",
            "type": "ClusterIP",
        },
        "status": {"loadBalancer": {}},
    }


def endpoint_slice_object(
    name: str,
    namespace: str,
    service: str,
    addresses: Iterable[str],
    *,
    nodes: tuple[str, ...] = ("node-a", "node-b", "node-c"),
    zone: str = "zone-a",
) -> Obj:
    """An EndpointSlice as the EndpointSlice controller writes it (one address each)."""
    endpoints = []
    managed_endpoints: Obj = {}
    for i, address in enumerate(addresses):
        pod = f"{service}-{abs(hash((name, i))) % 10**10:010d}-{i:05d}"
        endpoints.append(
            {
                "addresses": [address],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": nodes[i % len(nodes)],
                "targetRef": {
                    "kind": "Pod",
                    "namespace": namespace,
                    "name": pod,
                    "uid": next(_uids),
                },
                "zone": zone,
            }
        )
        managed_endpoints[f'k:{{"addresses":["{address}"]}}'] = {
            ".": {},
            "f:addresses": {},
            "f:conditions": {".": {}, "f:ready": {}, "f:serving": {}, "f:terminating": {}},
            "f:nodeName": {},
            "f:targetRef": {},
            "f:zone": {},
        }
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name,
            "generateName": f"{service}-",
            "namespace": namespace,
            "uid": next(_uids),
            "generation": 1,
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "labels": {
                "app.kubernetes.io/name": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "kubernetes.io/service-name": service,
            },
            "annotations": {
                "endpoints.kubernetes.io/last-change-trigger-time": "2025-01-01T00:00:00Z"
            },
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": service,
                    "uid": next(_uids),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                _managed(
                    "kube-controller-manager",
                    "discovery.k8s.io/v1",
                    {
                        "f:addressType": {},
                        "f:endpoints": managed_endpoints,
                        "f:metadata": {
                            "f:annotations": {
                                ".": {},
                                "f:endpoints.kubernetes.io/last-change-trigger-time": {},
                            },
                            "f:generateName": {},
                            "f:labels": {
                                ".": {},
                                "f:endpointslice.kubernetes.io/managed-by": {},
                                "f:kubernetes.io/service-name": {},
                            },
                            "f:ownerReferences": {".": {}, 'k:{"uid":"..."}': {}},
                        },
                        "f:ports": {},
                    },
                )
            ],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def node_object(name: str, address: str, *, zone: str = "zone-a") -> Obj:
    """A Node with the status a kubelet reports (conditions, images, addresses)."""
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": next(_uids),
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "topology.kubernetes.io/zone": zone,
            },
        },
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "MemoryPressure", "status": "False"},
            ],
            "images": [
                {"names": [f"registry.k8s.io/image-{i}:v1.0.{i}"], "sizeBytes": 10**7 + i}
                for i in range(20)
            ],
        },
    }


def service_cidr_object(name: str, *cidrs: str) -> Obj:
    return {
        "kind": "ServiceCIDR",
        "apiVersion": "networking.k8s.io/v1",
        "metadata": {"name": name},
        "spec": {"cidrs": list(cidrs)},
    }


def fleet(services: int, slices_per_service: int, endpoints_per_slice: int) -> Iterable[Obj]:
    """Services with their EndpointSlices, spread over 100 namespaces (bench sizes)."""
    for i in range(services):
        namespace = f"ns-{i % 100}"
        name = f"svc-{i}"
        yield service_object(name, namespace, f"10.{96 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}")
        for j in range(slices_per_service):
            base = (i * slices_per_service + j) * endpoints_per_slice
            addresses = [
                f"10.{128 + ((base + k) >> 16)}.{((base + k) >> 8) & 255}.{(base + k) & 255}"
                for k in range(endpoints_per_slice)
            ]
            yield endpoint_slice_object(f"{name}-{j:05x}", namespace, name, addresses)
