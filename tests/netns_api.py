"""Driving a running kubeproxy in the lab from outside: its API server, metrics and health.

* :class:`NetnsApi` — the API stand-in (:class:`tests.apiserver.ApiServer`) serving on its
  own event loop in a thread that lives in node-a's network namespace, so ``kubeproxy run
  --master http://127.0.0.1:P`` started in that namespace reaches it over loopback, as it
  would reach a local API server; the caller changes objects and flips fault switches
  from its own thread.
* :func:`scrape` and :func:`healthz` — what ``/metrics`` and ``/healthz`` of the proxy
  in node-a's namespace say right now (asked from inside the namespace, over loopback).
* :func:`ruleset` — the kernel's rules of the lab's mode in node-a's namespace, with the
  packet counters blanked, so two readings compare equal when no rule changed.

Shared by the kernel tests (faults, API outage) and the benchmarks that run them long.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from kubeproxy.lab.cluster import CLUSTER_CIDRS, MODE_FLAGS, NODE, Lab
from kubeproxy.lab.netns import enter_netns, ns_exec
from tests.apiserver import ApiServer

T = TypeVar("T")

METRICS_PORT = 10249
HEALTHZ_PORT = 10256


class NetnsApi:
    """An ApiServer serving inside a network namespace, driven from the caller's thread."""

    def __init__(self, netns: str, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.api = ApiServer(**options)
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
        """Run ``fn(*args)`` on the stand-in's loop (its state is only touched there)."""

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


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def scrape(lab: Lab, port: int = METRICS_PORT) -> dict[str, float]:
    """Every sample of node-a's ``/metrics``: ``name{label="v",...}`` -> value; and, for a
    name with labels, ``name`` -> the largest value over its label sets (a sync is
    recorded under each ``ip_family``: this is what one family saw)."""
    _, text = lab.executor(lab.node_ns).call(_get, f"http://127.0.0.1:{port}/metrics")
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
            if labels:
                samples[sample.name] = max(samples.get(sample.name, sample.value), sample.value)
    return samples


def healthz(lab: Lab, port: int = HEALTHZ_PORT) -> tuple[int, dict[str, Any]]:
    """node-a's ``/healthz``: status code and JSON body."""
    code, body = lab.executor(lab.node_ns).call(_get, f"http://127.0.0.1:{port}/healthz")
    return code, json.loads(body)


_COUNTERS = re.compile(r"counter packets \d+ bytes \d+|\[\d+:\d+\]")


def ruleset(lab: Lab) -> str:
    """node-a's rules in the lab's mode, counters blanked."""
    if lab.mode == "nftables":
        text = ns_exec(lab.node_ns, "nft", "list", "ruleset")
    else:
        save = "iptables-legacy-save" if lab.mode == "iptables-legacy" else "iptables-nft-save"
        text = ns_exec(lab.node_ns, save)
    lines = (line for line in text.splitlines() if not line.startswith("#"))
    return "\n".join(_COUNTERS.sub("counter", line) for line in lines)


def start_kubeproxy(
    lab: Lab, api: NetnsApi, log: Path, *extra: str, prefix: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    """``kubeproxy run --master`` (the stand-in) for node-a, logging at --v=2 to ``log``
    (``prefix`` runs before Python, as in :meth:`Lab.kubeproxy_command`)."""
    return lab.spawn(
        lab.kubeproxy_command(
            "run",
            "--master",
            api.api.url,
            "--hostname-override",
            NODE,
            "--cluster-cidr",
            ",".join(CLUSTER_CIDRS),
            *MODE_FLAGS[lab.mode],
            "--v=2",
            *extra,
            prefix=prefix,
        ),
        log=log,
    )
