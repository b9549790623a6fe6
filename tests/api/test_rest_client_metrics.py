"""client-go's rest_client_* metrics count and time every request to the API server,
labelled as client-go labels them (the "Kubernetes / Proxy" dashboard charts them)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

from kubeproxy.metrics import Metrics
from kubeproxy.sources import initial_state
from kubeproxy.sources.kube import KubeSource
from tests.api.conftest import NODE, eventually, run, source_for
from tests.apiserver import ApiServer
from tests.unit.conftest import service_obj


async def retrying(source: KubeSource) -> None:
    """Let the source try (and retry) for a moment; it never gives up by itself."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(initial_state(source), 1.0)


def test_each_request_is_counted_by_code_host_and_method() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            api.create(service_obj("web", "10.96.0.10"))
            metrics = Metrics()
            source = source_for(api)
            source.connection = replace(source.connection, observe=metrics.api_request)
            await initial_state(source)
            host = api.url.removeprefix("http://").rstrip("/")
            value = metrics.registry.get_sample_value
            ok = value("rest_client_requests_total", {"code": "200", "host": host, "method": "GET"})
            assert ok is not None and ok >= 4  # a list per resource at least
            count = value("rest_client_request_duration_seconds_count",
                          {"host": host, "verb": "GET"})  # fmt: skip
            assert count is not None and count >= ok

            api.fail_with(500)
            await retrying(source)
            failed = value(
                "rest_client_requests_total", {"code": "500", "host": host, "method": "GET"}
            )
            assert failed is not None and failed >= 1

        # The server is gone: no answer at all is "<error>", as client-go labels it.
        await retrying(source)
        errors = metrics.registry.get_sample_value(
            "rest_client_requests_total", {"code": "<error>", "host": host, "method": "GET"}
        )
        assert errors is not None and errors >= 1

    run(scenario)


def test_the_proxy_records_upstreams_starting_event_once() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            metrics = Metrics()
            source = source_for(api)
            source.connection = replace(source.connection, observe=metrics.api_request)
            source.announce = True
            await initial_state(source)
            await eventually(lambda: len(api.events) == 1)
            (event,) = api.events
            assert event["reason"] == "Starting" and event["action"] == "StartKubeProxy"
            assert event["type"] == "Normal" and event["reportingController"] == "kube-proxy"
            assert event["regarding"] == {"kind": "Node", "name": NODE, "apiVersion": "v1"}
            assert event["metadata"]["name"].startswith(f"{NODE}.")
            host = api.url.removeprefix("http://").rstrip("/")
            created = metrics.registry.get_sample_value(
                "rest_client_requests_total", {"code": "201", "host": host, "method": "POST"}
            )
            assert created == 1
            await initial_state(source)  # a second watch of the same source: no new event
            await asyncio.sleep(0.1)
            assert len(api.events) == 1

    run(scenario)


def test_render_explain_and_once_record_no_event() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            await initial_state(source_for(api))
            await asyncio.sleep(0.1)
            assert api.events == []

    run(scenario)
