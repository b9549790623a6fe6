"""Element comments naming the ServicePort (``namespace/name:port``) survive hostile
names: whatever the strings, nft applies the script and lists the comment we meant.

The names here cannot come from a valid API object (the API server validates them); the
backend must not rely on that. Runs in a network namespace the test creates and deletes.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from kubeproxy.backends.nftables.inspect import parse_elements
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.nftables.runner import NftCommand
from kubeproxy.dataplane.nftables.transaction import element_comment
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import (
    Endpoint,
    IPFamily,
    L4Protocol,
    NamespacedName,
    ServicePort,
    ServicePortName,
)
from tests.kernel.conftest import scratch_netns

HOSTILE = [
    ("ns", 'a"b', "http"),
    ("ns", "back\\slash", "p"),
    ("ns", "new\nline", "p"),
    ('x" : goto evil; flush ruleset; "', "s", "p"),
    ("ns", "comma,brace}{", "p"),
    ("ns", "ünïcode", "pört"),
    ("n" * 63, "s" * 63, "p" * 15),
    ("ns", "x" * 300, ""),
]


@pytest.fixture
def netns() -> Iterator[str]:
    yield from scratch_netns("kpcmt")


def nft(ns: str, *args: str, script: str | None = None) -> str:
    result = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", *args],
        input=script,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_hostile_names_become_comments_nft_accepts(netns: str) -> None:
    ports: dict[ServicePortName, ServicePort] = {}
    endpoints: dict[ServicePortName, tuple[Endpoint, ...]] = {}
    for i, (namespace, name, port) in enumerate(HOSTILE):
        spn = ServicePortName(NamespacedName(namespace, name), port, L4Protocol.TCP)
        ports[spn] = ServicePort(name=spn, cluster_ips=(f"10.96.0.{i + 1}",), port=80)
        # Every other one without endpoints: its comment is on the no-endpoint element.
        endpoints[spn] = (Endpoint(ip=f"10.244.1.{i + 1}", port=8080),) if i % 2 else ()
    snap = Snapshot(
        services=ports,
        endpoints=endpoints,
        node=NodeState("node-a", None, {IPFamily.IPv4: "192.168.50.1"}),
    )
    config = ProxyConfig(hostname="node-a", families=(IPFamily.IPv4,))
    script = NftablesBackend(config, NftCommand()).render(snap)
    nft(netns, "-f", "-", script=script)

    listed: dict[str, str] = {}
    # With endpoints: the element of the shared chain's set; without: the no-endpoint map.
    for keyword, map_name in (("set", "cluster-ip-1-dests"), ("map", "no-endpoint-services")):
        text = nft(netns, "list", keyword, "ip", "kube-proxy", map_name)
        assert set(parse_elements(text)) == {
            f"10.96.0.{i + 1} . tcp . 80"
            for i in range(len(HOSTILE))
            if bool(i % 2) == (keyword == "set")
        }
        for line in text.splitlines():
            if ' comment "' in line:
                key = line.split(" comment ")[0].strip().removeprefix("elements = { ")
                listed[key] = line.split(' comment "')[1].split('"')[0]
    expected = {
        f"10.96.0.{i + 1} . tcp . 80": element_comment(
            f"{namespace}/{name}:{port}" if port else f"{namespace}/{name}"
        )
        for i, (namespace, name, port) in enumerate(HOSTILE)
    }
    assert listed == expected
    assert expected["10.96.0.7 . tcp . 80"].endswith("...")
    assert len(expected["10.96.0.7 . tcp . 80"]) == 128
