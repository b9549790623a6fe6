"""kubeproxy against the API stand-in, end to end: watch events become kernel rules.

The stand-in (:class:`tests.apiserver.ApiServer`) runs on its own event loop in a thread
that lives in node-a's network namespace, so ``kubeproxy run --master http://127.0.0.1:P``
started in that namespace reaches it over loopback, exactly as it would reach a local API
server; the test changes objects and watches the effect with real connections.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kubeproxy.lab.cluster import CLUSTER_CIDRS, NODE, NODE_IP, NODE_IP6, Lab
from kubeproxy.lab.echo import outcome, tcp_ask
from kubeproxy.lab.netns import enter_netns
from kubeproxy.lab.objects import Ep, endpoint_slice, node, service
from tests.apiserver import ApiServer
from tests.kernel.conftest import PODS, ip, wait_for

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


class NetnsApi:
    """An ApiServer serving inside a network namespace, driven from the test thread."""

    def __init__(self, netns: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.api = ApiServer()
        ready = threading.Event()

        def main() -> None:
            enter_netns(netns)
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.api.start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=main, name="apiserver", daemon=True)
        self.thread.start()
        ready.wait(10)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        async def run() -> T:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self) -> None:
        self.run(self.api.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def api(lab: Lab) -> Iterator[NetnsApi]:
    server = NetnsApi(lab.node_ns)
    yield server
    server.close()


def start_kubeproxy(lab: Lab, api: NetnsApi, log: Path) -> subprocess.Popen[str]:
    return lab.spawn(
        lab.kubeproxy_command(
            "run",
            "--master",
            api.api.url,
            "--hostname-override",
            NODE,
            "--cluster-cidr",
            ",".join(CLUSTER_CIDRS),
            "--v=2",
        ),
        log=log,
    )


def answer(lab: Lab, addr: str) -> str:
    return lab.in_pod("client").call(outcome, tcp_ask, addr, 80, 0.5)


def eps(*pods: str) -> list[Ep]:
    return [Ep(ip(p), node=PODS[p][0]) for p in pods]


def test_watch_events_reach_the_kernel(lab: Lab, api: NetnsApi, tmp_path: Path) -> None:
    api.call(api.api.create, node(NODE, [NODE_IP, NODE_IP6], zone="zone-a"))
    api.call(api.api.create, service("web", "10.96.40.1"))
    api.call(api.api.create, endpoint_slice("web", eps("local-1")))
    log = tmp_path / "log"
    proc = start_kubeproxy(lab, api, log)
    try:
        # Initial list: the rules appear.
        wait_for(lambda: answer(lab, "10.96.40.1") == "local-1")
        # Update.
        api.call(api.api.update, endpoint_slice("web", eps("remote-1")))
        wait_for(lambda: answer(lab, "10.96.40.1") == "remote-1")
        # Add.
        api.call(api.api.create, service("web2", "10.96.40.2"))
        api.call(api.api.create, endpoint_slice("web2", eps("local-2")))
        wait_for(lambda: answer(lab, "10.96.40.2") == "local-2")

        # Disconnected while things change, and history compacted meanwhile: the watch
        # resumes with 410 Gone, kubeproxy relists, and what disappeared is deleted.
        api.run(api.api.stop())
        api.call(api.api.delete, "Service", "web", "default")
        api.call(api.api.delete, "EndpointSlice", "web-ipv4", "default")
        api.call(api.api.create, service("web3", "10.96.40.3"))
        api.call(api.api.create, endpoint_slice("web3", eps("local-1")))
        api.call(api.api.compact)
        # The API server is unreachable: the last rules keep serving.
        time.sleep(1.0)
        assert answer(lab, "10.96.40.1") == "remote-1"
        assert answer(lab, "10.96.40.2") == "local-2"
        api.run(api.api.start())
        wait_for(lambda: answer(lab, "10.96.40.3") == "local-1")
        wait_for(lambda: answer(lab, "10.96.40.1") != "remote-1")
        assert answer(lab, "10.96.40.2") == "local-2"
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(10)
    text = log.read_text()
    assert "Synced full" in text
    assert "Synced partial" in text
