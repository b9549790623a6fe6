"""Whatever valid cluster state we render, the kernel accepts the script (``nft -c``).

Hypothesis generates Services (every type and policy, both families, shared and
conflicting addresses) with random endpoints; each rendering is checked by nft itself
inside a namespace of the lab.
"""

from __future__ import annotations

import subprocess

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.nftables.runner import NftCommand
from kubeproxy.lab.cluster import Lab
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import (
    Endpoint,
    IPFamily,
    L4Protocol,
    NamespacedName,
    ServicePort,
    ServicePortName,
    TrafficPolicy,
)

NODES = ("node-a", "node-b", None)
v4 = st.integers(1, 250).map(lambda i: f"10.96.0.{i}")
v6 = st.integers(1, 250).map(lambda i: f"fd00:10:96::{i:x}")
ep_v4 = st.integers(1, 60).map(lambda i: f"10.244.{i % 3}.{i}")
ep_v6 = st.integers(1, 60).map(lambda i: f"fd00:10:244:{i % 3}::{i:x}")


@st.composite
def endpoint(draw: st.DrawFn, ip: st.SearchStrategy[str]) -> Endpoint:
    return Endpoint(
        ip=draw(ip),
        port=draw(st.integers(1, 65535)),
        node_name=draw(st.sampled_from(NODES)),
        ready=draw(st.booleans()),
        serving=draw(st.booleans()),
        terminating=draw(st.booleans()),
        zone_hints=frozenset(draw(st.sets(st.sampled_from(["zone-a", "zone-b"]), max_size=2))),
    )


@st.composite
def service_port(draw: st.DrawFn, index: int) -> tuple[ServicePort, tuple[Endpoint, ...]]:
    families = draw(st.sampled_from([("4",), ("6",), ("4", "6")]))
    ips = tuple(draw(v4 if f == "4" else v6) for f in families)
    name = ServicePortName(
        NamespacedName("ns", f"s{index}"), "p", draw(st.sampled_from(list(L4Protocol)))
    )
    port = ServicePort(
        name=name,
        cluster_ips=ips,
        port=draw(st.integers(1, 65535)),
        node_port=draw(st.sampled_from([0, 30000 + index, 30000])),
        external_ips=tuple(
            draw(st.lists(st.sampled_from(["203.0.113.1", "2001:db8::1"]), max_size=2, unique=True))
        ),
        load_balancer_ips=tuple(draw(st.lists(st.sampled_from(["198.51.100.1"]), max_size=1))),
        external_traffic_policy=draw(st.sampled_from(list(TrafficPolicy))),
        internal_traffic_policy=draw(st.sampled_from(list(TrafficPolicy))),
    )
    eps = draw(
        st.lists(endpoint(st.one_of(ep_v4, ep_v6)), max_size=6, unique_by=lambda e: (e.ip, e.port))
    )
    return port, tuple(eps)


@st.composite
def snapshot(draw: st.DrawFn) -> Snapshot:
    count = draw(st.integers(0, 8))
    pairs = [draw(service_port(i)) for i in range(count)]
    return Snapshot(
        services={p.name: p for p, _ in pairs},
        endpoints={p.name: e for p, e in pairs},
        node=NodeState(
            "node-a",
            draw(st.sampled_from([None, "zone-a"])),
            {IPFamily.IPv4: "192.168.50.1", IPFamily.IPv6: "fd00:50::1"},
        ),
    )


def test_every_rendering_is_accepted_by_nft(lab: Lab) -> None:
    configs = [
        ProxyConfig(
            hostname="node-a",
            families=(IPFamily.IPv4, IPFamily.IPv6),
            cluster_cidrs=("10.244.0.0/16", "fd00:10:244::/56"),
        ),
        ProxyConfig(
            hostname="node-a",
            families=(IPFamily.IPv4, IPFamily.IPv6),
            masquerade_all=True,
            nodeport_addresses=NodePortAddresses.parse(["0.0.0.0/0", "fd00::/8"]),
        ),
    ]

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(snapshot(), st.sampled_from(configs))
    def check(snap: Snapshot, config: ProxyConfig) -> None:
        script = NftablesBackend(config, NftCommand()).render(snap)
        result = subprocess.run(
            ["ip", "netns", "exec", lab.node_ns, "nft", "-c", "-f", "-"],
            input=script,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr + "\n" + script

    check()
