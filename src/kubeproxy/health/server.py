"""The proxy's health HTTP server: ``/healthz`` and ``/livez`` on healthzBindAddress.

Answers come from a :class:`~kubeproxy.health.proxy.ProxyHealth`; each answer is counted
by status code (``kubeproxy_proxy_healthz_total`` / ``kubeproxy_proxy_livez_total``)
through a :class:`ProbeCounter`, which :class:`kubeproxy.metrics.Metrics` is. As with
Go's ServeMux, any method is answered and other paths get 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from kubeproxy.health.listener import BindAddress, HttpListener, json_response
from kubeproxy.health.proxy import ProxyHealth

DEFAULT_HEALTHZ_BIND_ADDRESS = "0.0.0.0:10256"


class ProbeCounter(Protocol):
    def count_healthz(self, code: int) -> None: ...

    def count_livez(self, code: int) -> None: ...


class HealthServer(HttpListener):
    def __init__(
        self,
        health: ProxyHealth,
        address: str = DEFAULT_HEALTHZ_BIND_ADDRESS,
        counter: ProbeCounter | None = None,
    ) -> None:
        """Raises ValueError for a malformed ``address``; :meth:`start` raises OSError."""
        self.address = BindAddress.parse(address)
        app = web.Application()
        app.router.add_route(
            "*", "/healthz", _probe(health.healthz, counter.count_healthz if counter else None)
        )
        app.router.add_route(
            "*", "/livez", _probe(health.livez, counter.count_livez if counter else None)
        )
        super().__init__(app, [self.address.host], self.address.port)


def _probe(
    answer: Callable[[], tuple[int, dict[str, object]]],
    count: Callable[[int], None] | None,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(_: web.Request) -> web.StreamResponse:
        code, body = answer()
        if count is not None:
            count(code)
        return json_response(code, body)

    return handle
