"""kubeproxy's nftables mode and upstream kube-proxy's share a table (``ip kube-proxy``),
so a node going from one to the other has the next proxy's first sync meet the previous
one's objects. Each must take the table over in one transaction and leave nothing of
the other hooked in. On the strict fake, with upstream's objects as its nftables mode
(v1.37.2) writes them; tests/realk8s/test_migration.py does the same with the real
kube-proxy, under traffic.
"""

from __future__ import annotations

import logging

import pytest

from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.dataplane.nftables.fake import FakeNftables
from kubeproxy.dataplane.nftables.transaction import (
    BaseChain,
    DeleteTable,
    Set,
    TableRef,
    Transaction,
)
from tests.unit.conftest import service_port
from tests.unit.test_new_table_pieces import Recording
from tests.unit.test_sync_orchestration import CONFIG, fresh_dump, snapshot

T = TableRef("ip", "kube-proxy")
V4_KEY = "ipv4_addr . inet_proto . inet_service"
# Upstream's base chains: name -> (type, hook, priority), as `nft list` shows them.
UPSTREAM_BASE = {
    "filter-prerouting-pre-dnat": ("filter", "prerouting", "-110"),
    "filter-output-pre-dnat": ("filter", "output", "-110"),
    "filter-input": ("filter", "input", "0"),
    "filter-forward": ("filter", "forward", "0"),
    "filter-output": ("filter", "output", "0"),
    "nat-prerouting": ("nat", "prerouting", "-100"),
    "nat-output": ("nat", "output", "-100"),
    "nat-postrouting": ("nat", "postrouting", "100"),
}
UPSTREAM_SETS = (
    Set("cluster-ips", "ipv4_addr", comment="Active ClusterIPs"),
    Set("nodeport-ips", "ipv4_addr", comment="IPs that accept NodePort traffic"),
    Set(
        "hairpin-connections",
        "ipv4_addr . ipv4_addr . inet_proto . inet_service",
        comment="service hairpin connections",
    ),
    Set.map(
        "no-endpoint-services",
        f"{V4_KEY} : verdict",
        "vmap to drop or reject packets to services with no endpoints",
    ),
    Set.map(
        "no-endpoint-nodeports",
        "inet_proto . inet_service : verdict",
        "vmap to drop or reject packets to service nodeports with no endpoints",
    ),
    Set.map(
        "firewall-ips",
        f"{V4_KEY} : verdict",
        "destinations that are subject to LoadBalancerSourceRanges",
    ),
    Set.map(
        "service-ips", f"{V4_KEY} : verdict", "ClusterIP, ExternalIP and LoadBalancer IP traffic"
    ),
    Set.map("service-nodeports", "inet_proto . inet_service : verdict", "NodePort traffic"),
)
# Its other chains; a Service's are named after it, with "/".
SERVICE_CHAIN = "service-5DOO3N5P-m/web/tcp/http"
ENDPOINT_CHAIN = "endpoint-CYD6F4ZM-m/web/tcp/http__10.244.1.10/8080"
AFFINITY_SET = "affinity-CYD6F4ZM-m/web/tcp/http__10.244.1.10/8080"
UPSTREAM_RULES = {
    "nat-prerouting": ["jump services"],
    "nat-output": ["jump services"],
    "nat-postrouting": ["jump masquerading"],
    "filter-prerouting-pre-dnat": ["ct state new jump firewall-check"],
    "filter-output-pre-dnat": ["ct state new jump firewall-check"],
    "filter-input": ["ct state new jump service-endpoints-check"],
    "filter-forward": ["ct state new jump service-endpoints-check"],
    "filter-output": ["ct state new jump service-endpoints-check"],
    "services": [
        "ip daddr . meta l4proto . th dport vmap @service-ips",
        "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
    ],
    "masquerading": ["meta mark & 0x00004000 != 0x00000000 masquerade fully-random"],
    "firewall-check": ["ip daddr . meta l4proto . th dport vmap @firewall-ips"],
    "service-endpoints-check": ["ip daddr . meta l4proto . th dport vmap @no-endpoint-services"],
    "cluster-ips-check": ["ip daddr @cluster-ips reject"],
    "reject-chain": ["reject"],
    ENDPOINT_CHAIN: [
        f"update @{AFFINITY_SET} {{ ip saddr }}",
        "meta l4proto tcp dnat to 10.244.1.10:8080",
    ],
    SERVICE_CHAIN: [f"goto {ENDPOINT_CHAIN}"],
}


def upstream_sync(fake: FakeNftables) -> None:
    """Upstream's full sync into whatever the table holds, as its proxier writes it: the
    table; its base chains added and deleted once (its first sync), then added again;
    every chain added and flushed; its sets and maps added; its rules; a Service."""
    tx = Transaction()
    tx.add_table(T, "rules for kube-proxy")
    for name in UPSTREAM_BASE:
        tx.add_chain(T, name)
        tx.delete_chain(T, name)
    for name, (kind, hook, priority) in UPSTREAM_BASE.items():
        tx.add_chain(T, name, base=BaseChain(kind, hook, priority))
        tx.flush_chain(T, name)
    for s in (*UPSTREAM_SETS, Set(AFFINITY_SET, "ipv4_addr", ("dynamic", "timeout"))):
        tx.add_set(T, s)
    for name in UPSTREAM_RULES:
        tx.add_chain(T, name)
        tx.flush_chain(T, name)
    for name, rules in UPSTREAM_RULES.items():
        tx.add_chain(T, name, rules)
    tx.add_elements(T, "service-ips", [("10.96.0.10 . tcp . 80", f"goto {SERVICE_CHAIN}")])
    fake.apply(tx)


def base_chains(fake: FakeNftables) -> dict[str, str]:
    """Each base chain of ``ip kube-proxy``: its hook line (as dumped)."""
    out, chain = {}, ""
    for line in fake.dump().splitlines():
        if line.strip().startswith("chain "):
            chain = line.split()[1]
        elif "hook" in line and chain:
            out[chain] = line.strip()
    return out


def test_kubeproxy_takes_over_upstreams_table_in_one_transaction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before: its names with "/" were refused ("invalid nftables object name"), failing
    # every sync; then its base chains' priorities, which cannot change in place, had
    # the tables replaced (affinity memory lost) after a refused transaction.
    fake = Recording()
    upstream_sync(fake)
    snap = snapshot(service_port("web", cluster_ips=("10.96.0.10",), node_port=30080))
    with caplog.at_level(logging.WARNING):
        NftablesBackend(CONFIG, fake).sync(snap, None)
    assert "refused" not in caplog.text
    [_, ours] = fake.transactions
    assert not any(isinstance(op, DeleteTable) for op in ours)
    assert fake.dump() == fresh_dump(snap)


def test_upstreams_sync_takes_over_kubeproxys_table_and_unhooks_all_of_it() -> None:
    # Before: upstream's first sync was refused ("File exists": our firewall-ips was a
    # set where it adds a map, our nodeport-ips an interval set), and so was every
    # retry, leaving our last rules in charge; and two base chains of ours had names it
    # does not recreate, so they stayed hooked in beside its own.
    fake = FakeNftables()
    snap = snapshot(service_port("web", cluster_ips=("10.96.0.10",), node_port=30080))
    NftablesBackend(CONFIG, fake).sync(snap, None)
    upstream_sync(fake)
    hooks = base_chains(fake)
    assert set(hooks) == set(UPSTREAM_BASE)
    for name, (_, hook, priority) in UPSTREAM_BASE.items():
        assert f"hook {hook} priority {priority};" in hooks[name]
