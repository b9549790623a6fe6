"""``explain`` and ``list`` read the Kubernetes API like ``run`` (``--master``): the
stand-in API server on loopback, the commands as separate processes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.api.conftest import NODE, run
from tests.apiserver import ApiServer, service_cidr_object
from tests.unit.conftest import node_obj, service_obj, slice_obj

SRC = Path(__file__).resolve().parents[2] / "src"


async def kubeproxy(*args: str) -> Any:
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
    assert proc.returncode == 0, err.decode()
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
