"""HTTP to the Kubernetes API server: configuration, credentials, rate limiting, requests.

* :func:`load_connection` turns ``--kubeconfig`` / ``--master`` into a :class:`Connection`
  exactly as upstream kube-proxy's ``createClient`` does: neither given -> the in-cluster
  service account; otherwise the kubeconfig's current context (if any) with the server
  URL overridden by ``--master`` (if any). The kubeconfig is read by lightkube
  (``lightkube.KubeConfig``), including its TLS setup and its auth (token, token file,
  basic auth, client certificates, exec plugins).
* :class:`Credentials` runs lightkube's auth flow to get the ``Authorization`` header,
  and again after a 401 (a rotated service-account token file, an expired exec token).
* :class:`TokenBucket` is client-go's request rate limiter (``clientConnection.qps`` /
  ``burst``): every request, including each list page and each watch, takes a token.
* :class:`ApiClient` does the requests with aiohttp: :meth:`~ApiClient.get` returns a body,
  :meth:`~ApiClient.watch` yields the lines of a chunked watch stream as they arrive,
  :meth:`~ApiClient.post` creates an object (an Event).
  Failures are a :class:`RequestError`: :class:`ApiError` (the server answered with an
  error Status), :class:`UnreachableError` (no usable HTTP answer: refused, reset,
  timeout, TLS failure) or :class:`CredentialsError`.

Only JSON is spoken: ``contentType: application/vnd.kubernetes.protobuf`` (upstream's
default) is accepted and served as JSON, with one log line.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx2  # lightkube's HTTP library: its auth flows speak httpx2 requests/responses
import msgspec
from lightkube import KubeConfig
from lightkube.config.client_adapter import user_auth, verify_cluster
from lightkube.config.kubeconfig import SERVICE_ACCOUNT, SingleConfig
from lightkube.config.models import Cluster, User
from lightkube.core.exceptions import ConfigError as LightkubeConfigError

from kubeproxy import __version__
from kubeproxy.config.runtime import ConfigError
from kubeproxy.sources.kube_decode import Status, decode_status

log = logging.getLogger(__name__)

JSON = "application/json"
PROTOBUF = "application/vnd.kubernetes.protobuf"
# client-go's defaults for a zero qps / burst (rest.Config: DefaultQPS, DefaultBurst).
DEFAULT_QPS = 5.0
DEFAULT_BURST = 10
USER_AGENT = f"kubeproxy/{__version__} (linux)"

RequestObserver = Callable[[str, str, str, float], None]

# Dead peers (a control-plane node that vanished without a RST) are noticed by TCP
# keepalive after ~30 s + 4 x 10 s instead of at the end of a 5-10 minute watch.
_KEEPALIVE = (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 4))


class RequestError(Exception):
    """A request did not succeed; the message is one line."""


class ApiError(RequestError):
    """The API server answered with an error (an HTTP error status or a watch ERROR event)."""

    def __init__(self, code: int, status: Status | None, fallback: str = "") -> None:
        self.code = status.code if status is not None and status.code else code
        self.status = status or Status(code=code, message=fallback)
        reason = f" ({self.status.reason})" if self.status.reason else ""
        super().__init__(f"HTTP {self.code}{reason}: {self.status.message or fallback}")

    @property
    def gone(self) -> bool:
        """410: the resourceVersion or continue token is too old (client-go isExpiredError)."""
        return self.code == 410 or self.status.reason in ("Expired", "Gone")

    @property
    def too_large_resource_version(self) -> bool:
        """The server has not seen the requested resourceVersion yet (client-go's check)."""
        return self.status.has_cause("ResourceVersionTooLarge") or (
            self.code == 504 and "Too large resource version" in str(self)
        )


class UnreachableError(RequestError):
    """No usable HTTP answer: connection refused/reset, timeout, TLS or protocol error."""


class CredentialsError(RequestError):
    """The credentials could not be obtained (token file unreadable, exec plugin failed)."""


@dataclass
class TokenBucket:
    """client-go's token-bucket rate limiter: ``burst`` requests at once, then ``qps``.

    Each caller reserves a token (the count may go negative) and sleeps until its token
    is due, so waiting requests are served in arrival order.
    """

    qps: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    _tokens: float = field(init=False)
    _last: float = field(init=False)

    def __post_init__(self) -> None:
        self._tokens = float(self.burst)
        self._last = self.clock()

    async def acquire(self) -> None:
        if self.qps < 0:  # negative qps: no limit (as client-go)
            return
        now = self.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        if self._tokens < 0:
            await self.sleep(-self._tokens / self.qps)


class Credentials:
    """The Authorization header for lightkube's auth object (None: send none)."""

    def __init__(self, auth: httpx2.Auth | None, server: str) -> None:
        self._auth = auth
        self._server = server
        self._header: str | None = None
        self._fetched = False

    async def header(self) -> str | None:
        if self._auth is not None and not self._fetched:
            await self._run(after_401=False)
        return self._header

    async def refresh(self) -> None:
        """After a 401: let the auth re-read its token file or re-run its exec plugin."""
        if self._auth is not None:
            await self._run(after_401=True)

    async def _run(self, *, after_401: bool) -> None:
        assert self._auth is not None
        request = httpx2.Request("GET", self._server)
        flow = self._auth.async_auth_flow(request)
        try:
            request = await flow.__anext__()
            if after_401:
                request = await flow.asend(httpx2.Response(401, request=request))
        except StopAsyncIteration:
            pass  # a static credential: nothing new to try
        except (LightkubeConfigError, OSError, ValueError, KeyError) as err:
            raise CredentialsError(f"cannot get credentials: {err}") from None
        finally:
            await flow.aclose()
        self._header = request.headers.get("Authorization")
        self._fetched = True


@dataclass
class Connection:
    """Where the API server is and how to talk to it; :meth:`client` opens a session."""

    server: str
    ssl_context: ssl.SSLContext | None
    credentials: Credentials
    limiter: TokenBucket
    trust_env: bool = True
    # Told about every request: (method, host, code or "<error>", seconds to the answer),
    # for client-go's rest_client_* metrics.
    observe: RequestObserver | None = None

    @property
    def host(self) -> str:
        """The server's host[:port], as client-go's metrics label it."""
        url = urllib.parse.urlsplit(self.server)
        return url.netloc or self.server

    @asynccontextmanager
    async def client(self) -> AsyncIterator[ApiClient]:
        connector = aiohttp.TCPConnector(
            ssl=self.ssl_context if self.ssl_context is not None else False,
            socket_factory=_keepalive_socket,
        )
        async with aiohttp.ClientSession(
            base_url=self.server.rstrip("/") + "/",
            connector=connector,
            trust_env=self.trust_env,
            headers={"Accept": JSON, "User-Agent": USER_AGENT},
            auto_decompress=True,
        ) as session:
            yield ApiClient(session, self)


def _keepalive_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _KEEPALIVE:
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    return sock


class ApiClient:
    """Requests against one API server over one aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, connection: Connection) -> None:
        self._session = session
        self._connection = connection

    async def get(
        self, path: str, params: Mapping[str, str] | None = None, *, read_timeout: float = 60.0
    ) -> bytes:
        """GET ``path``: the body of a 2xx answer; raises ApiError or UnreachableError."""
        timeout = aiohttp.ClientTimeout(sock_connect=10, sock_read=read_timeout)
        async with self._request(path, params, timeout) as response:
            try:
                return await response.read()
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                raise UnreachableError(_describe(err)) from None

    @asynccontextmanager
    async def watch(
        self, path: str, params: Mapping[str, str], *, timeout: float
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """Open a watch stream; yields an iterator over its lines (events) as they arrive.

        ``timeout`` bounds the whole stream on our side too, in case the server does not
        honour ``timeoutSeconds``. A stream cut mid-line raises :class:`UnreachableError`; the
        partial line is never decoded.
        """
        client_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=10)
        async with self._request(path, {**params, "watch": "true"}, client_timeout) as response:
            yield _lines(response)

    async def post(self, path: str, body: bytes, *, timeout: float = 30.0) -> bytes:
        """POST a JSON ``body`` to ``path`` (creating an object): the answer's body."""
        client_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=10)
        async with self._request(path, None, client_timeout, method="POST", data=body) as r:
            try:
                return await r.read()
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                raise UnreachableError(_describe(err)) from None

    def _observed(self, method: str, code: str, started: float) -> None:
        observe = self._connection.observe
        if observe is not None:
            observe(method, self._connection.host, code, time.monotonic() - started)

    @asynccontextmanager
    async def _request(
        self,
        path: str,
        params: Mapping[str, str] | None,
        timeout: aiohttp.ClientTimeout,
        *,
        method: str = "GET",
        data: bytes | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        credentials = self._connection.credentials
        for attempt in range(2):
            await self._connection.limiter.acquire()
            headers = {"Content-Type": JSON} if data is not None else {}
            auth = await credentials.header()
            if auth is not None:
                headers["Authorization"] = auth
            started = time.monotonic()
            try:
                response = await self._session.request(
                    method,
                    path.lstrip("/"),
                    params=params,
                    data=data,
                    headers=headers,
                    timeout=timeout,
                )
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                self._observed(method, "<error>", started)
                raise UnreachableError(_describe(err)) from None
            self._observed(method, str(response.status), started)
            try:
                if response.status == 401 and attempt == 0:
                    # A rotated token file or an expired exec token: refresh once.
                    await credentials.refresh()
                    continue
                if response.status >= 300:
                    body = await _read_error_body(response)
                    raise ApiError(
                        response.status, decode_status(body), body[:200].decode(errors="replace")
                    )
                yield response
                return
            finally:
                response.release()
        raise AssertionError("unreachable")  # pragma: no cover


async def _read_error_body(response: aiohttp.ClientResponse) -> bytes:
    try:
        return await response.read()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return b""


async def _lines(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    buffer = b""
    try:
        async for chunk in response.content.iter_any():
            buffer += chunk
            if b"\n" not in chunk:
                continue
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    yield line
    except (aiohttp.ClientError, OSError, TimeoutError) as err:
        raise UnreachableError(_describe(err)) from None
    if buffer.strip():
        # The stream ended cleanly but without a final newline: a complete JSON object
        # is still an event; anything else is a truncated one and fails to decode.
        yield buffer


def _describe(err: BaseException) -> str:
    if isinstance(err, TimeoutError | asyncio.TimeoutError):
        return "timed out"
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{type(err).__name__}: {text}" if type(err).__name__ not in text else text


# ------------------------------------------------------------------------ configuration


def load_connection(
    kubeconfig: str | None,
    master: str | None,
    *,
    qps: float = DEFAULT_QPS,
    burst: int = DEFAULT_BURST,
    content_type: str = JSON,
    service_account: str | None = None,
) -> Connection:
    """Build a :class:`Connection` from flags as upstream's createClient does.

    Raises :class:`~kubeproxy.config.runtime.ConfigError` naming what is wrong.
    """
    check_content_type(content_type)
    config = _single_config(kubeconfig or None, master or None, service_account)
    cluster = config.cluster
    if master:
        cluster = msgspec.structs.replace(cluster, server=master)
    server = cluster.server
    if not server.startswith(("https://", "http://")):
        raise ConfigError(f"API server URL {server!r} must start with https:// or http://")
    user = config.user or User()
    if server.startswith("https://"):
        _check_files(config, cluster, user)
    try:
        context = (
            verify_cluster(cluster, user, config.abs_file)
            if server.startswith("https://")
            else None
        )
        auth = user_auth(user)
    except (LightkubeConfigError, OSError, ssl.SSLError, ValueError) as err:
        raise ConfigError(f"cannot use the API server credentials: {err}") from None
    return Connection(
        server=server,
        ssl_context=context,
        credentials=Credentials(auth, server),
        limiter=TokenBucket(qps or DEFAULT_QPS, burst or DEFAULT_BURST),
    )


def _check_files(config: SingleConfig, cluster: Cluster, user: User) -> None:
    """Every file the kubeconfig names for TLS (and lightkube will read: inline data wins
    for the client's) can be read; else a ConfigError naming the field and the file (the
    ssl module's own error, "No such file or directory", names neither)."""
    files = [("certificate-authority", cluster.certificate_auth)]
    if not user.client_cert_data:
        files.append(("client-certificate", user.client_cert))
    if not user.client_key_data:
        files.append(("client-key", user.client_key))
    for what, name in files:
        if not name:
            continue
        path = config.abs_file(name)
        try:
            with open(path, "rb"):
                pass
        except OSError as err:
            raise ConfigError(
                f"cannot use the API server credentials: {what} {path}: {err.strerror or err}"
            ) from None


def check_content_type(content_type: str) -> None:
    if content_type in ("", JSON):
        return
    if content_type == PROTOBUF:
        log.info("clientConnection.contentType %s is not supported; using %s", PROTOBUF, JSON)
        return
    raise ConfigError(
        f"clientConnection.contentType: unsupported {content_type!r} (use {JSON} or {PROTOBUF})"
    )


def _single_config(
    kubeconfig: str | None, master: str | None, service_account: str | None
) -> SingleConfig:
    try:
        if kubeconfig is None and master is None:
            log.info(
                "Neither kubeconfig file nor master URL was specified, "
                "falling back to in-cluster config"
            )
            try:
                conf = KubeConfig.from_service_account(service_account or SERVICE_ACCOUNT)
            except (KeyError, LightkubeConfigError) as err:
                raise ConfigError(
                    f"not running in a Pod ({err} missing) and neither --kubeconfig "
                    "nor --master given"
                ) from None
        elif kubeconfig is not None:
            conf = KubeConfig.from_file(kubeconfig)
        else:
            assert master is not None
            conf = KubeConfig.from_server(master)
        single = conf.get()
    except KeyError as err:  # lightkube: a context naming a missing cluster/user, or no env
        raise ConfigError(f"invalid client configuration: missing {err}") from None
    except (LightkubeConfigError, OSError, ValueError, TypeError, msgspec.ValidationError) as err:
        raise ConfigError(f"invalid client configuration: {err}") from None
    assert single is not None
    return single
