"""``explain`` and ``list`` read the Kubernetes API like ``run`` (``--master``): the
stand-in API server on loopback, the commands as separate processes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import NODE, run
from tests.apiserver import ApiServer, service_cidr_object
from tests.unit.conftest import node_obj, service_obj, slice_obj

SRC = Path(__file__).resolve().parents[2] / "src"


async def command(*args: str) -> tuple[int, str, str]:
    """``kubeproxy ARGS`` in a process of its own: exit status, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kubeproxy",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(SRC)),
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def kubeproxy(*args: str) -> Any:
    code, out, err = await command(*args)
    assert code == 0, err
    return json.loads(out)


def test_explain_and_list_against_the_api() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            api.create(service_obj("web", clusterIP="10.96.0.10", ports=[{"port": 80}]))
            api.create(slice_obj("web-1", "web", endpoints=[{"addresses": ["10.1.0.1"]}]))
            api.create(node_obj(NODE, addresses=[{"type": "InternalIP", "address": "192.0.2.1"}]))
            api.create(service_cidr_object("kubernetes", "10.96.0.0/16"))
            flags = ["--master", api.url, "--hostname-override", NODE, "-o", "json"]
            flags += ["--proxy-mode", "nftables"]
            flags += ["--cluster-cidr", "10.1.0.0/16"]

            listed = await kubeproxy("list", *flags)
            assert [(r["frontend"], r["service"]) for r in listed] == [
                ("10.96.0.10:80", "default/web")
            ]
            packet = ["--src", "10.1.0.9", "--dst", "10.96.0.10", "--port", "80"]
            explained = await kubeproxy("explain", *flags, *packet)
            assert explained["verdict"] == "DNAT"
            assert explained["endpoints"] == ["10.1.0.1:8080"]
            assert explained["origin"] == "pod"
            # The ServiceCIDR object from the API: unallocated addresses are dropped.
            packet = ["--src", "10.1.0.9", "--dst", "10.96.7.7", "--port", "80"]
            assert (await kubeproxy("explain", *flags, *packet))["verdict"] == "DROP"

    run(scenario, timeout=60)


PACKET = ("--src", "10.1.0.9", "--dst", "10.96.0.10", "--port", "80")


@pytest.mark.parametrize("which", ["list", "explain", "render"])
def test_one_shot_commands_give_up_on_a_dead_server(which: str) -> None:
    """Nothing listens: after --request-timeout the command exits 1, naming the server
    and the last error (run itself retries forever: test_kube_source)."""

    async def scenario() -> None:
        api = ApiServer()
        await api.start()
        await api.stop()  # the port is known and refuses connections
        extra = PACKET if which == "explain" else ()
        code, out, err = await command(
            which, "--master", api.url, "--hostname-override", NODE,
            "--request-timeout", "1s", *extra,
        )  # fmt: skip
        assert code == 1, err
        assert out == ""
        last = err.splitlines()[-1]
        assert last.startswith(f"Error: API server {api.url}: no complete state within 1s")
        assert "last error: cannot " in last and "Connect" in last

    run(scenario, timeout=60)


@pytest.mark.parametrize("which", ["list", "explain"])
def test_one_shot_commands_name_the_verb_and_resource_they_are_denied(which: str) -> None:
    """RBAC refuses EndpointSlices: the command does not wait for a deadline (there is
    none: --request-timeout 0) but exits 1 at once, naming the verb and the resource."""

    async def scenario() -> None:
        async with ApiServer() as api:
            api.forbid("endpointslices")
            extra = PACKET if which == "explain" else ()
            code, _, err = await command(
                which, "--master", api.url, "--hostname-override", NODE,
                "--request-timeout", "0", *extra,
            )  # fmt: skip
            assert code == 1, err
            assert err.splitlines()[-1] == (
                f"Error: API server {api.url}: cannot list endpointslices: HTTP 403 "
                "(Forbidden): endpointslices.discovery.k8s.io is forbidden: User "
                '"system:anonymous" cannot list resource "endpointslices" in API group '
                '"discovery.k8s.io" at the cluster scope'
            )

    run(scenario, timeout=60)


def test_one_shot_commands_give_up_when_unauthorized() -> None:
    async def scenario() -> None:
        async with ApiServer(token="secret") as api:
            code, _, err = await command(
                "list", "--master", api.url, "--hostname-override", NODE, "--request-timeout", "0"
            )
            assert code == 1, err
            assert err.splitlines()[-1].startswith(f"Error: API server {api.url}: cannot ")
            assert "HTTP 401 (Unauthorized)" in err.splitlines()[-1]

    run(scenario, timeout=60)
