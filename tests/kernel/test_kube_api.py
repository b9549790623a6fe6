"""kubeproxy against the API stand-in, end to end: watch events become kernel rules.

The stand-in runs in node-a's network namespace (:class:`tests.netns_api.NetnsApi`), so
``kubeproxy run --master http://127.0.0.1:P`` started there reaches it over loopback;
the test changes objects and watches the effect with real connections.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from kubeproxy.lab.cluster import NODE, NODE_IP, NODE_IP6, Lab
from kubeproxy.lab.echo import outcome, tcp_ask
from kubeproxy.lab.objects import Ep, endpoint_slice, node, service
from tests.kernel.conftest import PODS, ip, wait_for
from tests.netns_api import NetnsApi, start_kubeproxy

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@pytest.fixture
def api(lab: Lab) -> Iterator[NetnsApi]:
    server = NetnsApi(lab.node_ns)
    yield server
    server.close()


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


def test_run_once_gives_up_on_an_absent_api_server(lab: Lab) -> None:
    """``run --once`` is a one-shot (scripts, init containers wait for it): with nothing
    listening it exits 1 after --request-timeout, naming the server; ``run`` itself keeps
    retrying (tests/unit/test_oneshot.py)."""
    master = "http://127.0.0.1:1"
    command = lab.kubeproxy_command(
        "run", "--once", "--master", master, "--hostname-override", NODE,
        "--request-timeout", "1s",
    )  # fmt: skip
    result = lab.run(command)
    assert result.returncode == 1, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith(f"Error: API server {master}: no complete state within 1s"), last
