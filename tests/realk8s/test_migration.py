"""Replacing upstream's kube-proxy with kubeproxy on a node, and going back, under traffic
(docs/replacing-kube-proxy.md), with upstream's own kube-proxy (v1.37.2) built here.

On node-c of the session cluster (its kubeproxy stopped and its rules removed first;
put back at the end), for each of upstream's modes in turn: upstream serving ->
kubeproxy in the mode kubeadm's ConfigMap gives it (upstream's; blank means iptables) ->
upstream back -> kubeproxy in the other mode -> kubeproxy switched to upstream's mode
(the guide's way back) -> upstream back -> kubeproxy in the other mode -> upstream back
at once. Each proxy goes as a DaemonSet's Pod does (SIGTERM: its rules stay) before the
next starts, and a Service is deleted while none runs (a rollout's moment without a
proxy). All the while a Pod on node-c connects every 10 ms to a ClusterIP whose
endpoints are on node-a and node-b, the outside host to node-c's NodePort, and one
established connection on each path exchanges data.

Asserted: no connect fails and no established connection breaks, except in the last
handover, where upstream starts over the other mode's rules: it removes them at its
start, before its first sync, and until that sync new connections are not proxied
(measured and printed; the guide says what to expect and how to avoid it). After every
handover only the running proxy's rules remain: kubeproxy's exactly as on a node that
never had another proxy; upstream's exactly as it wrote them on the clean node, besides
objects of ours it does not delete and nothing reaches (listed in the printout). Neither
proxy logged a failed or refused sync on the way.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.lab.cluster import stop_process
from kubeproxy.lab.connects import ConnectProbe
from kubeproxy.lab.flow import LongFlow, StreamEcho
from kubeproxy.lab.kube.cluster import KubeLab, wait_for
from kubeproxy.lab.kube.migration import (
    Upstream,
    differences_besides_leftovers,
    kubeproxy_cleanup,
    kubeproxy_reference,
    node_rules,
)
from kubeproxy.lab.rulestate import differences
from tests.realk8s.conftest import PROXY_FLAGS, answers

NODE = "node-c"
STREAM_PORT = 9000
TAKEOVER_TIMEOUT = 60.0
# What each proxy logs when the kernel refuses a sync: a takeover that first failed and
# then succeeded on a retry ends in the same rules, so the logs are checked too.
KUBEPROXY_FAILED = ("Sync failed", "Full sync refused", "Partial sync refused")
UPSTREAM_FAILED = ("Failed to execute iptables-restore", "nftables sync failed")
# How the node's rules differ from the running proxy's alone, and what it left of the
# previous proxy's that nothing reaches.
Comparison = tuple[list[str], list[str]]


@dataclass(frozen=True)
class Step:
    proxy: str  # "upstream" or "kubeproxy"
    mode: str  # kubeproxy's "" is a blank mode (iptables)

    def __str__(self) -> str:
        return f"{self.proxy} {self.mode or 'blank'}"

    def kubeproxy_flags(self) -> tuple[str, ...]:
        return ("--proxy-mode", self.mode) if self.mode else ()


def steps(mode: str) -> list[Step]:
    """The module docstring's sequence for upstream in ``mode``."""
    same, other = ("", "nftables") if mode == "iptables" else ("nftables", "")
    up = Step("upstream", mode)
    kp = [Step("kubeproxy", m) for m in (same, other, same, other)]
    return [up, kp[0], up, kp[1], kp[2], up, kp[3], up]


@dataclass
class Handover:
    step: Step
    started: float  # time.monotonic() at its start
    seconds: float  # from its start until only its rules were there
    leftovers: list[str]


@pytest.fixture
def node_c_free(kube: KubeLab) -> Iterator[None]:
    """node-c without the session's kubeproxy, and without rules; kubeproxy put back
    afterwards, in full charge again (the other modes' rules gone)."""
    kube.stop_kubeproxy(NODE)
    try:
        kubeproxy_cleanup(kube, NODE)
        yield
    finally:
        kube.start_kubeproxy(NODE, *PROXY_FLAGS)
        netns = kube.nodes[NODE].netns
        reference = kubeproxy_reference(kube, NODE, kube.workdir / "restore", *PROXY_FLAGS)
        wait_for(
            lambda: node_rules(netns) == reference,
            timeout=TAKEOVER_TIMEOUT,
            what=f"the session's kubeproxy back in charge of {NODE}",
        )


def web_service(kube: KubeLab, namespace: str, name: str = "web") -> dict[str, Any]:
    """A NodePort Service of the app=web Pods: ports http (80) and stream; its spec."""
    kube.api().create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "type": "NodePort",
                "selector": {"app": "web"},
                "ports": [
                    {"name": "http", "port": 80, "targetPort": 8080},
                    {"name": "stream", "port": STREAM_PORT, "targetPort": STREAM_PORT},
                ],
            },
        }
    )
    wait_for(
        lambda: any(
            s["metadata"]["labels"].get("kubernetes.io/service-name") == name
            and len(s.get("endpoints") or []) == 2
            for s in kube.api().list_of("EndpointSlice", namespace)
        ),
        what=f"the endpoints of {namespace}/{name}",
    )
    spec: dict[str, Any] = kube.api().get("Service", name, namespace)["spec"]
    return spec


def quiet(kube: KubeLab) -> None:
    """Wait until no Service of a namespace being deleted is left (earlier tests'), so
    the objects every proxy programs stay the same while this test compares rules."""

    def done() -> bool:
        going = {
            ns["metadata"]["name"]
            for ns in kube.api().list_of("Namespace")
            if ns["metadata"].get("deletionTimestamp")
        }
        return not any(s["metadata"]["namespace"] in going for s in kube.api().list_of("Service"))

    wait_for(done, timeout=60, what="the Services of deleted namespaces gone")


class Node:
    """node-c's proxies, one at a time, and the checks that each has taken over."""

    def __init__(self, kube: KubeLab, workdir: Path) -> None:
        self.kube = kube
        self.workdir = workdir
        self.netns = kube.nodes[NODE].netns
        self.upstream = Upstream(kube, NODE)
        self.kubeproxy: subprocess.Popen[str] | None = None
        self.upstream_rules: dict[str, Any] = {}
        self.logs: list[Path] = []

    def stop(self) -> None:
        self.upstream.stop()
        if self.kubeproxy is not None:
            stop_process(self.kubeproxy)
            self.kubeproxy = None

    def start(self, step: Step) -> list[str]:
        """Start ``step``'s proxy; return once only its rules are on the node, with what
        of the previous proxy's it left (objects nothing reaches)."""
        if step.proxy == "upstream":
            self.upstream.start(step.mode)
            if not self.upstream_rules:
                return self._first_upstream()
            return self._wait(
                lambda state: differences_besides_leftovers(state, self.upstream_rules)
            )
        log = self.workdir / f"kubeproxy-{len(self.logs)}-{step.mode or 'blank'}.log"
        self.logs.append(log)
        flags = (*step.kubeproxy_flags(), "--v=2")
        self.kubeproxy = self.kube.spawn(self.kube.kubeproxy_command(NODE, *flags), log)
        reference = kubeproxy_reference(self.kube, NODE, self.workdir, *flags)
        return self._wait(lambda state: (differences(state, reference), []))

    def _first_upstream(self) -> list[str]:
        """Upstream on the clean node: its rules once they stop changing."""

        def settled() -> bool:
            before = node_rules(self.netns)
            time.sleep(0.5)  # a sync under way shows as a change
            self.upstream_rules = node_rules(self.netns)
            return bool(before) and before == self.upstream_rules

        wait_for(settled, timeout=TAKEOVER_TIMEOUT, what="upstream's first rules")
        return []

    def _wait(self, check: Callable[[dict[str, Any]], Comparison]) -> list[str]:
        last: Comparison = ([], [])

        def taken_over() -> bool:
            nonlocal last
            last = check(node_rules(self.netns))
            return not last[0]

        try:
            wait_for(taken_over, timeout=TAKEOVER_TIMEOUT)
        except TimeoutError:
            logs = [self.upstream.log_text()[-3000:]] + [p.read_text()[-3000:] for p in self.logs]
            raise AssertionError(
                "\n".join(["the rules are not the running proxy's alone:", *last[0][:20], *logs])
            ) from None
        return last[1]


@pytest.mark.parametrize("mode", ["iptables", "nftables"])
def test_replacing_upstream_and_going_back_under_traffic(
    kube: KubeLab, namespace: str, node_c_free: None, tmp_path: Path, mode: str
) -> None:
    web = [
        kube.add_pod(f"{namespace}-web-{i}", node, namespace=namespace, labels={"app": "web"})
        for i, node in enumerate(("node-a", "node-b"))
    ]
    echoes = [StreamEcho(pod.netns, STREAM_PORT) for pod in web]
    client = kube.add_pod(f"{namespace}-client", NODE, namespace=namespace)
    spec = web_service(kube, namespace)
    ip, node_ip = spec["clusterIP"], kube.nodes[NODE].ip
    node_ports = {p["name"]: p["nodePort"] for p in spec["ports"]}
    quiet(kube)
    node = Node(kube, tmp_path)
    probes = [
        ConnectProbe(client.netns, ip, 80),
        ConnectProbe(kube.outside_ns, node_ip, node_ports["http"]),
    ]
    flows: list[LongFlow] = []
    handovers: list[Handover] = []
    try:
        for i, step in enumerate(steps(mode)):
            node.stop()
            if i == 1:  # a Service the next proxy programs...
                web_service(kube, namespace, "gone")
            if i == 2:  # ...deleted before the one after starts
                kube.api().delete("Service", "gone", namespace)
            started = time.monotonic()
            leftovers = node.start(step)
            handovers.append(Handover(step, started, time.monotonic() - started, leftovers))
            if i == 0:
                answers(kube, client.netns, ip, 80)
                answers(kube, kube.outside_ns, node_ip, node_ports["http"])
                for probe in probes:
                    probe.start()
                flows = [
                    LongFlow(client.netns, ip, STREAM_PORT),
                    LongFlow(kube.outside_ns, node_ip, node_ports["stream"]),
                ]
            # Traffic through this proxy alone for a while: new connections answered and
            # a round trip on each established one since it took over.
            moment = time.monotonic()
            wait_for(
                lambda m=moment: all(p.answered_since(m) >= 10 for p in probes),
                what=f"connects answered through {step}",
            )
            for flow in flows:
                assert flow.wait_round_trip(moment), f"{step}: {flow.error}"
    finally:
        for probe in probes:
            probe.stop()
        for flow in flows:
            flow.close()
        node.stop()
        for echo in echoes:
            echo.stop()
    report = summary(handovers, probes)
    print(report)
    (tmp_path / "migration.json").write_text(json.dumps(report_data(handovers, probes)))
    for log in node.logs:
        text = log.read_text(errors="replace")
        assert not [m for m in KUBEPROXY_FAILED if m in text], f"{log}:\n{text[-3000:]}"
    upstream_log = node.upstream.log_text()
    assert not [m for m in UPSTREAM_FAILED if m in upstream_log], upstream_log[-3000:]
    last = handovers[-1].started
    early = [a for p in probes for a in p.failures() if a.at < last]
    assert not early, f"{early[:5]}\n{report}"
    for flow in flows:
        assert flow.error is None, flow.error
        assert flow.round_trips(handovers[0].started) > 0
    # After upstream's gap, new connections are proxied again.
    for probe in probes:
        failed = [a.at for a in probe.failures()]
        assert probe.answered_since(max(failed, default=last)) > 0, report


def report_data(handovers: list[Handover], probes: list[ConnectProbe]) -> list[dict[str, Any]]:
    """Per handover: the step, seconds until only its rules were there, the failed
    connects of each probe from its start to the next one's (their span and errors),
    what of the previous proxy's it left."""
    out = []
    for h, nxt in zip(handovers, [*handovers[1:], None], strict=True):
        end = nxt.started if nxt else float("inf")
        failures = [[a for a in p.failures() if h.started <= a.at < end] for p in probes]
        failed = [[a.at for a in f] for f in failures]
        out.append(
            {
                "step": str(h.step),
                "takeover_seconds": round(h.seconds, 2),
                "failed": [len(f) for f in failed],
                "failed_span_seconds": [round(max(f) - min(f), 2) if f else 0 for f in failed],
                "connects": [sum(1 for a in p.attempts if h.started <= a.at < end) for p in probes],
                "errors": [sorted({a.outcome for a in f}) for f in failures],
                "leftovers": h.leftovers,
            }
        )
    return out


def summary(handovers: list[Handover], probes: list[ConnectProbe]) -> str:
    lines = [
        "handover to               takeover  failed connects: pod->ClusterIP, outside->NodePort"
    ]
    for row in report_data(handovers, probes):
        lines.append(
            f"-> {row['step']:<26} {row['takeover_seconds']:6.2f} s   "
            f"{row['failed']} of {row['connects']} (span {row['failed_span_seconds']} s)"
        )
        lines += [f"     failed: {err}" for errors in row["errors"] for err in errors]
        lines += [f"     left: {item}" for item in row["leftovers"]]
    return "\n".join(lines)
