"""The HTTP plumbing every kube-proxy server shares: bind addresses, listeners, JSON replies.

* :class:`BindAddress` parses ``healthzBindAddress`` / ``metricsBindAddress`` values
  (``host:port``, ``[v6]:port``, ``:port``) the way upstream validates them: the host is
  an IP literal or empty.
* :class:`HttpListener` runs one aiohttp application (or low-level server) on one port of
  one or more hosts, and tells the port it really bound (tests bind port 0).
* :func:`json_response` writes a JSON body with upstream's headers. One header more
  than upstream's (Go's net/http sends none): aiohttp's ``Server: Python/… aiohttp/…``,
  which it adds to every response unless one is set, and which only its private hooks
  could remove; no probe or load balancer reads it (the health-check answers are
  otherwise byte for byte upstream's: tests/realk8s/services/test_service_types.py).

An empty or unspecified host (``0.0.0.0``, ``::``) listens on every address of both
families, as Go's ``net.Listen("tcp", "0.0.0.0:port")`` does; asyncio needs ``host=None``
for that, since binding ``0.0.0.0`` itself would be IPv4 only.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web

# Probes and scrapes are answered instantly; do not let shutdown wait on a slow client.
SHUTDOWN_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class BindAddress:
    # None: every local address of both families.
    host: str | None
    port: int

    @classmethod
    def parse(cls, text: str) -> BindAddress:
        """Parse ``host:port``; raises ValueError saying what is wrong."""
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"{text!r}: expected host:port, [IPv6]:port or :port")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            if ":" not in host:
                raise ValueError(f"{text!r}: only IPv6 addresses go in brackets")
        elif ":" in host:
            raise ValueError(f"{text!r}: put an IPv6 address in brackets, as [{host}]:port")
        try:
            port = int(port_text)
        except ValueError:
            raise ValueError(f"{text!r}: port {port_text!r} is not a number") from None
        if not 0 <= port <= 65535:
            raise ValueError(f"{text!r}: port {port} is out of range")
        if not host:
            return cls(None, port)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{text!r}: {host!r} is not an IP address") from None
        return cls(None if ip.is_unspecified else str(ip), port)

    def __str__(self) -> str:
        if self.host is None:
            return f":{self.port}"
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


class HttpListener:
    """An aiohttp application or low-level server bound to one port on some hosts."""

    def __init__(
        self, target: web.Application | web.Server, hosts: Sequence[str | None], port: int
    ) -> None:
        self._runner: web.BaseRunner
        if isinstance(target, web.Application):
            # Probes arrive every few seconds: an access log line each would drown the log.
            self._runner = web.AppRunner(target, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
        else:
            self._runner = web.ServerRunner(target, shutdown_timeout=SHUTDOWN_TIMEOUT)
        self._hosts = tuple(hosts) or (None,)
        self._requested_port = port
        self._started = False

    async def start(self) -> None:
        """Bind every host; raises OSError (with nothing left open) if any bind fails."""
        await self._runner.setup()
        try:
            for host in self._hosts:
                await web.TCPSite(self._runner, host, self._requested_port).start()
        except OSError:
            await self._runner.cleanup()
            raise
        self._started = True

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self._runner.cleanup()

    @property
    def port(self) -> int:
        """The port actually bound (differs from the requested one only for port 0)."""
        addresses = self._runner.addresses
        if not addresses:
            raise RuntimeError("listener is not started")
        port: int = addresses[0][1]
        return port


def json_response(
    status: int,
    body: Mapping[str, object],
    *,
    indent: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """A JSON reply with upstream's headers; compact like Go's json.Marshal unless indented."""
    text = json.dumps(body, indent=indent, separators=None if indent else (",", ":"))
    response = web.Response(status=status, body=text.encode(), content_type="application/json")
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers.update(headers or {})
    return response
