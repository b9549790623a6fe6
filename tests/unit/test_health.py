"""kubeproxy.health: /healthz and /livez, and the per-Service health-check servers.

The servers are real: each test binds ephemeral ports on 127.0.0.1 and talks HTTP to
them. Time is a fake wall clock, so health transitions happen without sleeping.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import pytest

from kubeproxy.health import (
    BindAddress,
    HealthServer,
    HttpListener,
    ProxyHealth,
    ServiceHealthServers,
    health_check_node_ports,
    local_ready_endpoints,
)
from kubeproxy.health.proxy import ZERO_TIME, format_time
from kubeproxy.health.services import health_check_hosts, local_addresses
from kubeproxy.metrics import Metrics
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.types import IPFamily, NamespacedName, TrafficPolicy
from tests.unit.conftest import endpoint, port_name, service_port

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
TIMEOUT = 60.0  # 2 x the default 30s syncPeriod
A = NamespacedName("default", "a")
B = NamespacedName("default", "b")


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


async def fetch(port: int, path: str = "/", method: str = "GET", body: str | None = None) -> Reply:
    """One request on a fresh connection (a listener closed since must refuse it)."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.request(method, f"http://127.0.0.1:{port}{path}", data=body) as resp,
    ):
        return Reply(resp.status, dict(resp.headers), await resp.text())


@asynccontextmanager
async def started(listener: HttpListener) -> AsyncIterator[HttpListener]:
    await listener.start()
    try:
        yield listener
    finally:
        await listener.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ---------------------------------------------------------------- ProxyHealth


def test_times_are_rfc3339_like_go() -> None:
    assert format_time(None) == "0001-01-01T00:00:00Z"
    assert format_time(T0) == "2023-11-14T22:13:20Z"
    assert format_time(T0 + 0.5) == "2023-11-14T22:13:20.5Z"
    assert format_time(T0 + 0.000123) == "2023-11-14T22:13:20.000123Z"


def test_healthy_while_starting_then_unhealthy_if_the_first_state_never_comes() -> None:
    clock = FakeClock()
    health = ProxyHealth(TIMEOUT, clock)
    health.queued_update()  # queued updates before the sync loop starts do not count
    clock.advance(TIMEOUT - 1)
    code, body = health.healthz()
    assert code == 200
    assert body == {
        "lastUpdated": format_time(clock.now),
        "currentTime": format_time(clock.now),
        "nodeEligible": True,
        "healthy": True,
    }
    # Upstream would stay healthy forever (its gap); ours turns unhealthy, but /livez
    # stays up: restarting does not bring the API server back.
    clock.advance(2)
    code, body = health.healthz()
    assert (code, body["healthy"]) == (503, False)
    assert body["lastUpdated"] == ZERO_TIME
    assert health.livez()[0] == 200
    assert not health.is_healthy()
    # The sync loop starts: healthy again.
    health.updated()
    assert health.healthz()[0] == 200


def test_unhealthy_once_the_oldest_queued_update_is_health_timeout_old() -> None:
    clock = FakeClock()
    health = ProxyHealth(TIMEOUT, clock)
    health.updated()
    clock.advance(5)
    health.queued_update()
    clock.advance(TIMEOUT - 1)
    health.queued_update()  # a newer change does not restart the timer
    assert health.livez()[0] == 200
    clock.advance(1)
    code, body = health.livez()
    assert code == 503
    assert body == {
        "lastUpdated": format_time(T0),
        "currentTime": format_time(T0 + 5 + TIMEOUT),
        "healthy": False,
        "status": {"IPv4": {"lastUpdated": format_time(T0), "healthy": False}},
    }
    health.updated()
    assert health.livez()[0] == 200
    assert health.is_healthy()


def test_status_lists_every_family_the_backend_programs() -> None:
    clock = FakeClock()
    health = ProxyHealth(TIMEOUT, clock, (IPFamily.IPv6, IPFamily.IPv4))
    health.updated()
    clock.advance(1)
    code, body = health.healthz()
    assert code == 200
    assert body["lastUpdated"] == format_time(T0 + 1)  # "now" while healthy
    assert isinstance(body["status"], dict)
    assert list(body["status"]) == ["IPv4", "IPv6"]  # sorted, as Go marshals a map
    assert body["status"] == {
        "IPv4": {"lastUpdated": format_time(T0), "healthy": True},
        "IPv6": {"lastUpdated": format_time(T0), "healthy": True},
    }


# --------------------------------------------------------------- HealthServer


def test_healthz_and_livez_over_http_follow_the_proxy_and_are_counted() -> None:
    clock = FakeClock()
    health = ProxyHealth(TIMEOUT, clock)
    metrics = Metrics()

    async def scenario() -> None:
        async with started(HealthServer(health, "127.0.0.1:0", metrics)) as server:
            reply = await fetch(server.port, "/healthz")
            assert reply.status == 200
            assert reply.headers["Content-Type"] == "application/json"
            assert reply.headers["X-Content-Type-Options"] == "nosniff"
            assert reply.json()["healthy"] is True

            health.updated()
            health.queued_update()
            clock.advance(TIMEOUT)
            assert (await fetch(server.port, "/healthz")).status == 503
            assert (await fetch(server.port, "/livez", method="HEAD")).status == 503

            health.updated()
            assert (await fetch(server.port, "/healthz")).status == 200
            assert (await fetch(server.port, "/livez")).status == 200
            assert (await fetch(server.port, "/metrics")).status == 404

    asyncio.run(scenario())
    value = metrics.registry.get_sample_value
    assert value("kubeproxy_proxy_healthz_total", {"code": "200"}) == 2
    assert value("kubeproxy_proxy_healthz_total", {"code": "503"}) == 1
    assert value("kubeproxy_proxy_livez_total", {"code": "200"}) == 1
    assert value("kubeproxy_proxy_livez_total", {"code": "503"}) == 1


@pytest.mark.parametrize(
    ("deleting", "taint"), [(True, False), (False, True)], ids=["deleting", "autoscaler-taint"]
)
def test_a_node_going_away_fails_healthz_but_not_livez(deleting: bool, taint: bool) -> None:
    health = ProxyHealth(TIMEOUT, FakeClock())
    health.updated()

    async def scenario() -> None:
        async with started(HealthServer(health, "127.0.0.1:0")) as server:
            health.sync_node(deleting=deleting, to_be_deleted_taint=taint)
            healthz = await fetch(server.port, "/healthz")
            assert healthz.status == 503
            assert healthz.json()["nodeEligible"] is False
            assert healthz.json()["healthy"] is True
            livez = await fetch(server.port, "/livez")
            assert livez.status == 200
            assert "nodeEligible" not in livez.json()

            health.sync_node(deleting=False, to_be_deleted_taint=False)
            assert (await fetch(server.port, "/healthz")).status == 200

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("0.0.0.0:10256", None, 10256),
        ("[::]:10256", None, 10256),
        (":10256", None, 10256),
        ("127.0.0.1:10249", "127.0.0.1", 10249),
        ("[fd00::0001]:80", "fd00::1", 80),
    ],
)
def test_bind_addresses(text: str, host: str | None, port: int) -> None:
    assert BindAddress.parse(text) == BindAddress(host, port)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("10256", "expected host:port"),
        ("fd00::1:80", "in brackets"),
        ("[10.0.0.1]:80", "only IPv6"),
        ("node-a:80", "not an IP address"),
        ("1.2.3.4:x", "not a number"),
        ("1.2.3.4:70000", "out of range"),
    ],
)
def test_bad_bind_addresses(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        BindAddress.parse(text)


# ------------------------------------------------------ ServiceHealthServers


def test_health_check_ports_come_from_local_policy_services_only() -> None:
    local = replace(
        service_port("a", etp=TrafficPolicy.LOCAL, node_port=30080), health_check_node_port=32000
    )
    services = {
        local.name: local,
        port_name("a", "https"): replace(local, name=port_name("a", "https")),
        port_name("b"): replace(
            service_port("b", node_port=30081), health_check_node_port=32001
        ),  # externalTrafficPolicy Cluster
        port_name("c"): service_port("c", etp=TrafficPolicy.LOCAL, node_port=30082),
    }
    assert health_check_node_ports(services) == {A: 32000}


def test_local_ready_endpoints_count_pods_on_this_node() -> None:
    endpoints = {
        port_name("a", "http"): (
            endpoint("10.0.0.1", node="node-a"),
            endpoint("10.0.0.2", node="node-a", ready=False, serving=True, terminating=True),
            endpoint("10.0.0.3", node="node-b"),
        ),
        port_name("a", "https"): (
            endpoint("10.0.0.1", port=8443, node="node-a"),
            endpoint("10.0.0.4", port=8443, node="node-a"),
        ),
        port_name("b"): (endpoint("10.0.1.1", node="node-a"), endpoint("fd00::1", node="node-a")),
        port_name("c"): (endpoint("10.0.2.1", node="node-b"),),
    }
    assert local_ready_endpoints(endpoints, "node-a") == {A: 2, B: 1}


def loopback_servers(healthy: Callable[[], bool], hostname: str = "") -> ServiceHealthServers:
    """Health checks on 127.0.0.1 only (--nodeport-addresses 127.0.0.1/32, IPv4)."""
    return ServiceHealthServers(
        healthy,
        hostname,
        node_ports=NodePortAddresses.parse(["127.0.0.1/32"]),
        families=(IPFamily.IPv4,),
        list_addresses=lambda: ["127.0.0.1", "192.0.2.1"],
    )


def test_service_health_checks_open_and_close_as_services_come_and_go() -> None:
    servers = loopback_servers(lambda: True, "node-a")

    async def scenario() -> None:
        try:
            assert await servers.sync({A: 0, B: 0}, {A: 2, NamespacedName("x", "y"): 1}) == []
            port_a, port_b = servers.ports[A], servers.ports[B]

            reply = await fetch(port_a, "/any/path", method="POST")
            assert reply.status == 200
            assert reply.headers["X-Load-Balancing-Endpoint-Weight"] == "2"
            assert reply.headers["Content-Type"] == "application/json"
            assert reply.text == (
                '{\n\t"service": {\n\t\t"namespace": "default",\n\t\t"name": "a"\n\t},'
                '\n\t"localEndpoints": 2,\n\t"serviceProxyHealthy": true\n}'
            )
            reply = await fetch(port_b)
            assert reply.status == 503
            assert reply.headers["X-Load-Balancing-Endpoint-Weight"] == "0"
            assert reply.json()["localEndpoints"] == 0

            await servers.sync({A: 0}, {A: 1, B: 3})
            assert servers.ports == {A: port_a}
            with pytest.raises(aiohttp.ClientConnectionError, match="Connect call failed"):
                await fetch(port_b)
            assert (await fetch(port_a)).headers["X-Load-Balancing-Endpoint-Weight"] == "1"

            new_port = free_port()
            await servers.sync({A: new_port}, {A: 1})
            assert servers.ports == {A: new_port}
            assert (await fetch(new_port)).status == 200
            with pytest.raises(aiohttp.ClientConnectionError, match="Connect call failed"):
                await fetch(port_a)

            await servers.sync({}, {})
            assert servers.ports == {}
            with pytest.raises(aiohttp.ClientConnectionError, match="Connect call failed"):
                await fetch(new_port)
        finally:
            await servers.close()

    asyncio.run(scenario())


def test_service_health_checks_fail_while_the_proxy_is_unhealthy() -> None:
    clock = FakeClock()
    health = ProxyHealth(TIMEOUT, clock)
    health.updated()
    servers = loopback_servers(health.is_healthy)

    async def scenario() -> None:
        try:
            await servers.sync({A: 0}, {A: 3})
            assert (await fetch(servers.ports[A])).status == 200
            health.queued_update()
            clock.advance(TIMEOUT)
            reply = await fetch(servers.ports[A])
            assert reply.status == 503
            assert reply.headers["X-Load-Balancing-Endpoint-Weight"] == "3"
            assert reply.json()["serviceProxyHealthy"] is False
        finally:
            await servers.close()

    asyncio.run(scenario())


def test_a_port_that_cannot_be_bound_is_reported_once_and_the_others_keep_working(
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken: int = blocker.getsockname()[1]
    servers = loopback_servers(lambda: True, "node-a")

    async def scenario() -> None:
        try:
            failures = await servers.sync({A: taken, B: 0}, {A: 1, B: 1})
            assert [(f.service, f.port) for f in failures] == [(A, taken)]
            assert failures[0].message.startswith(
                f'node node-a failed to start healthcheck "default/a" on port {taken}: '
            )
            assert (await fetch(servers.ports[B])).status == 200

            assert await servers.sync({A: taken, B: 0}, {A: 1, B: 1}) == []
            assert set(servers.failures) == {A}
            assert A not in servers.ports

            blocker.close()
            assert await servers.sync({A: taken, B: 0}, {A: 1, B: 1}) == []
            assert servers.failures == {}
            assert (await fetch(taken)).status == 200
        finally:
            blocker.close()
            await servers.close()

    with caplog.at_level(logging.ERROR, logger="kubeproxy.health.services"):
        asyncio.run(scenario())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert f'healthcheck "default/a" on port {taken}' in errors[0]


# ------------------------------------------------- where health checks listen

V4, V6 = IPFamily.IPv4, IPFamily.IPv6
LOCAL = ["127.0.0.1", "::1", "10.0.0.5", "192.168.1.5", "fd00::5", "fe80::5%eth0", "10.0.0.6"]


@pytest.mark.parametrize(
    ("flag", "primary", "hosts"),
    [
        # primary: the node's primary IP of each family, if it is a local address.
        (["primary"], {V4: "10.0.0.5", V6: "fd00::5"}, ("10.0.0.5", "fd00::5")),
        (["primary"], {V4: "10.0.0.99"}, ("::",)),  # not local: nothing for IPv4
        # No primary IP known for a family, or a loopback one: all of that family.
        (["primary"], {V4: "10.0.0.5"}, ("10.0.0.5", "::")),
        (["primary"], {V4: "127.0.0.1", V6: "::1"}, (None,)),
        (["primary"], {}, (None,)),
        # CIDRs: every local address inside; a family without CIDRs gets all of it.
        (["10.0.0.0/24"], {}, ("10.0.0.5", "10.0.0.6", "::")),
        (["10.0.0.0/24", "fe80::/10"], {}, ("10.0.0.5", "10.0.0.6", "fe80::5%eth0")),
        (["0.0.0.0/0", "fd00::/64"], {}, ("0.0.0.0", "fd00::5")),
        (["0.0.0.0/0", "::/0"], {V4: "10.0.0.5"}, (None,)),
        (["127.0.0.0/8", "::1/128"], {}, ("127.0.0.1", "::1")),
        (["172.16.0.0/12"], {}, ("::",)),
    ],
)
def test_health_check_hosts_follow_nodeport_addresses(
    flag: list[str], primary: dict[IPFamily, str], hosts: tuple[str | None, ...]
) -> None:
    node_ports = NodePortAddresses.parse(flag)
    assert health_check_hosts(node_ports, (V4, V6), primary, LOCAL) == hosts


def test_health_check_hosts_of_a_single_stack_proxy() -> None:
    node_ports = NodePortAddresses.parse(["172.16.0.0/12"])
    assert health_check_hosts(node_ports, (V4,), {}, LOCAL) == ()
    assert health_check_hosts(NodePortAddresses(), (V4,), {V4: "10.0.0.5"}, LOCAL) == ("10.0.0.5",)


def test_local_addresses_include_loopback() -> None:
    assert "127.0.0.1" in local_addresses()


def test_service_health_checks_listen_on_the_selected_addresses_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # All of 127/8 is local on Linux: 127.0.0.1 and 127.0.0.2 stand for two node
    # addresses, of which --nodeport-addresses selects the ones in 127.0.0.2/31.
    listed = ["127.0.0.1", "127.0.0.2"]
    servers = ServiceHealthServers(
        lambda: True,
        "node-a",
        node_ports=NodePortAddresses.parse(["127.0.0.2/31"]),
        families=(IPFamily.IPv4,),
        list_addresses=lambda: listed,
    )
    port = free_port()

    async def ask(host: str) -> int:
        connector = aiohttp.TCPConnector(force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.get(f"http://{host}:{port}/") as resp,
        ):
            return resp.status

    async def scenario() -> None:
        try:
            await servers.sync({A: port}, {A: 1})
            assert list(servers.hosts or ()) == ["127.0.0.2"]
            assert await ask("127.0.0.2") == 200
            with pytest.raises(aiohttp.ClientConnectionError, match="Connect call failed"):
                await ask("127.0.0.1")
            # A matching address appears on the node: the health check listens there too.
            listed.append("127.0.0.3")
            await servers.sync({A: port}, {A: 1})
            assert list(servers.hosts or ()) == ["127.0.0.2", "127.0.0.3"]
            assert await ask("127.0.0.3") == 200
            # No matching address left: nothing listens, and a warning says so.
            listed[:] = ["127.0.0.1"]
            with caplog.at_level(logging.WARNING, logger="kubeproxy.health.services"):
                assert await servers.sync({A: port}, {A: 1}) == []
            assert not servers.hosts and servers.ports == {}
            with pytest.raises(aiohttp.ClientConnectionError, match="Connect call failed"):
                await ask("127.0.0.2")
            assert "No local address matches --nodeport-addresses 127.0.0.2/31" in caplog.text
        finally:
            await servers.close()

    asyncio.run(scenario())
