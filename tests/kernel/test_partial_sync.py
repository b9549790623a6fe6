"""Partial syncs: small transactions that end exactly where a full sync would.

The central check is the Hypothesis state machine of tests/partial_sync_machine.py:
random Service/endpoint changes are applied with partial syncs to one network namespace,
while a fresh backend does a full sync of the same snapshot into a second, empty
namespace; after every step both kernels must hold the same tables (compared from nft's
JSON listing, element order ignored). Every transaction is also applied to the strict
fake, which must accept and refuse exactly what the kernel does and end in the same
state.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.dataplane.nftables.fake import FakeNftables
from kubeproxy.dataplane.nftables.runner import NftCommand, NftError, NftRunner
from kubeproxy.dataplane.nftables.transaction import Transaction
from kubeproxy.lab.cluster import Lab
from kubeproxy.lab.echo import tcp_ask
from kubeproxy.lab.netns import add_netns, delete_netns, list_netns, ns_exec
from kubeproxy.lab.rulestate import nft_state
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import (
    Endpoint,
    ServicePort,
)
from tests.kernel.conftest import ip
from tests.kernel.test_nft_fake_vs_kernel import fake_state, kernel_state
from tests.partial_sync_machine import CONFIG, NODE, PartialVersusFull, port_name


class TeeRunner:
    """The kernel of a namespace, with the strict fake applying every transaction too:
    both must accept or both refuse (so the fake stays honest under the real workload)."""

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.kernel = NftCommand(netns=ns)
        self.fake = FakeNftables()

    def apply(self, tx: Transaction) -> None:
        try:
            self.fake.apply(tx)
        except NftError as err:
            fake_error: NftError | None = err
        else:
            fake_error = None
        try:
            self.kernel.apply(tx)
        except NftError as err:
            assert fake_error is not None, f"only the kernel refused: {err}\n{tx}"
            raise
        assert fake_error is None, f"only the fake refused: {fake_error}\n{tx}"

    def check(self, tx: Transaction) -> None:
        self.kernel.check(tx)

    def list_tables(self) -> list[tuple[str, str]]:
        return self.kernel.list_tables()

    def has_table(self, family: str, table: str) -> bool:
        return self.kernel.has_table(family, table)

    def list_objects(self, family: str, table: str) -> dict[str, set[str]]:
        return self.kernel.list_objects(family, table)


class OnTheKernel(PartialVersusFull):
    lab: Lab  # set by the test

    def runner(self, role: str) -> NftRunner:
        ns = f"{self.lab.prefix}-{role}"
        delete_netns(ns)
        add_netns(ns)
        return TeeRunner(ns) if role == "partial" else NftCommand(netns=ns)

    def state(self, backend: Any) -> object:
        runner = backend.runner
        assert isinstance(runner, TeeRunner | NftCommand)
        ns = runner.ns if isinstance(runner, TeeRunner) else runner.netns
        assert ns is not None
        return nft_state(ns)

    def after_step(self) -> None:
        tee = self.under_test.runner
        assert isinstance(tee, TeeRunner)
        assert kernel_state(tee.ns) == fake_state(tee.fake)

    def teardown(self) -> None:
        for role in ("partial", "full"):
            delete_netns(f"{self.lab.prefix}-{role}")


def test_partial_syncs_match_a_full_sync_and_the_fake(lab: Lab) -> None:
    OnTheKernel.lab = lab
    machine = settings(
        max_examples=25,
        stateful_step_count=12,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )(OnTheKernel)
    machine.TestCase().runTest()
    assert not [
        ns
        for ns in list_netns()
        if ns.startswith(f"{lab.prefix}-") and ns.endswith(("-partial", "-full"))
    ]


# ------------------------------------------------------------------- one change


def snapshot(n: int, extra_endpoint: bool = False) -> Snapshot:
    svcs = {}
    eps = {}
    for i in range(n):
        name = port_name(i)
        svcs[name] = ServicePort(
            name=name, cluster_ips=(f"10.96.{i // 250}.{i % 250 + 1}",), port=80
        )
        eps[name] = tuple(Endpoint(f"10.244.2.{j + 10}", 8080, "node-b") for j in range(3))
    if extra_endpoint:
        first = port_name(0)
        eps[first] = (*eps[first], Endpoint("10.244.2.99", 8080, "node-b"))
    return Snapshot(svcs, eps, NODE)


@pytest.fixture
def scratch(lab: Lab) -> Any:
    ns = f"{lab.prefix}-scratch"
    delete_netns(ns)
    add_netns(ns)
    yield ns
    delete_netns(ns)


def test_a_change_touches_only_the_changed_service(scratch: str) -> None:
    backend = NftablesBackend(CONFIG, NftCommand(netns=scratch))
    assert backend.sync(snapshot(50), None).full
    result = backend.sync(snapshot(50, extra_endpoint=True), {port_name(0)})
    assert not result.full
    tx = backend.last_transaction
    # Only s0's ClusterIP appears; the count change moves it to another shared chain.
    assert "10.96.0.1 . tcp . 80" in tx
    assert "10.96.0.2 " not in tx and "10.96.0.3 " not in tx
    assert "flush table" not in tx and "list" not in tx
    assert "add chain ip kube-proxy cluster-ip-4" in tx
    assert "@cluster-ip-4-dests goto cluster-ip-4" in tx
    assert tx.count("\n") <= 12, tx
    # A second identical sync has nothing to do.
    assert backend.sync(snapshot(50, extra_endpoint=True), {port_name(0)}).operations == 0


def test_two_changed_service_ports_claiming_one_destination(scratch: str) -> None:
    """One partial sync changes the owner of a shared external IP:port and adds a new
    ServicePort that takes the destination over (smaller name): the review found stale
    backends, or a KeyError for the new one."""
    ext = ("203.0.113.9",)
    a = ServicePort(name=port_name(1), cluster_ips=("10.96.0.11",), port=80, external_ips=ext)
    first = Snapshot({a.name: a}, {a.name: (Endpoint(ip("local-1"), 8080, "node-a"),)}, NODE)
    backend = NftablesBackend(CONFIG, NftCommand(netns=scratch))
    backend.sync(first, None)
    new = ServicePort(name=port_name(0), cluster_ips=("10.96.0.10",), port=80, external_ips=ext)
    second = Snapshot(
        {a.name: a, new.name: new},
        {
            a.name: (Endpoint(ip("local-2"), 8080, "node-a"),),
            new.name: (Endpoint(ip("remote-1"), 9090, "node-b"),),
        },
        NODE,
    )
    assert not backend.sync(second, {a.name, new.name}).full
    fresh_ns = f"{scratch}-fresh"
    add_netns(fresh_ns)
    try:
        NftablesBackend(CONFIG, NftCommand(netns=fresh_ns)).sync(second, None)
        assert nft_state(scratch) == nft_state(fresh_ns)
    finally:
        delete_netns(fresh_ns)
    listing = ns_exec(scratch, "nft", "list", "map", "ip", "kube-proxy", "external-ip-1-backends")
    assert "203.0.113.9 . tcp . 80 . 0 : 10.244.2.10 . 9090" in listing


def test_removing_an_affinity_service_is_one_partial_sync(scratch: str) -> None:
    """The chains of a ClientIP-affinity ServicePort reference each other; deleting them
    in the wrong order was refused ("Device or resource busy") and only the full-sync
    retry a second later removed them."""
    sticky = ServicePort(
        name=port_name(0), cluster_ips=("10.96.0.20",), port=80, affinity_timeout=60
    )
    eps = (Endpoint(ip("local-1"), 8080, "node-a"), Endpoint(ip("remote-1"), 8080, "node-b"))
    backend = NftablesBackend(CONFIG, NftCommand(netns=scratch))
    backend.sync(Snapshot({sticky.name: sticky}, {sticky.name: eps}, NODE), None)
    assert "aff-" in ns_exec(scratch, "nft", "list", "chains")
    result = backend.sync(Snapshot({}, {}, NODE), {sticky.name})
    assert not result.full
    listing = ns_exec(scratch, "nft", "list", "table", "ip", "kube-proxy")
    assert "chain aff" not in listing and "set affset-" not in listing


def test_adding_an_endpoint_to_an_affinity_service_is_one_partial_sync(scratch: str) -> None:
    """With only remote endpoints nothing but the affinity chains changes; nft 1.0.6
    refused the rewritten chain's reference to an existing affinity set."""
    sticky = ServicePort(
        name=port_name(0), cluster_ips=("10.96.0.21",), port=80, affinity_timeout=60
    )
    first = Endpoint(ip("remote-1"), 8080, "node-b")
    backend = NftablesBackend(CONFIG, NftCommand(netns=scratch))
    backend.sync(Snapshot({sticky.name: sticky}, {sticky.name: (first,)}, NODE), None)
    more = (first, Endpoint(ip("remote-2"), 8080, "node-b"))
    assert not backend.sync(
        Snapshot({sticky.name: sticky}, {sticky.name: more}, NODE), {sticky.name}
    ).full


def test_full_sync_restores_what_someone_deleted(scratch: str) -> None:
    backend = NftablesBackend(CONFIG, NftCommand(netns=scratch))
    backend.sync(snapshot(10), None)
    before = nft_state(scratch)
    ns_exec(scratch, "nft", "flush", "chain", "ip", "kube-proxy", "services")
    ns_exec(scratch, "nft", "flush", "set", "ip", "kube-proxy", "cluster-ip-3-dests")
    ns_exec(scratch, "nft", "delete", "chain", "ip", "kube-proxy", "cluster-ip-3")
    ns_exec(scratch, "nft", "flush", "chain", "ip", "kube-proxy", "masquerading")
    ns_exec(scratch, "nft", "delete", "set", "ip", "kube-proxy", "hairpin")
    ns_exec(scratch, "nft", "add", "rule", "ip", "kube-proxy", "services", "drop")
    ns_exec(scratch, "nft", "add", "chain", "ip", "kube-proxy", "intruder")
    assert nft_state(scratch) != before
    backend.sync(snapshot(10), None)
    assert "delete table" not in backend.last_transaction
    assert nft_state(scratch) == before


def test_full_sync_keeps_session_affinity_memory(lab: Lab, scratch: str) -> None:
    # Through the real data path: a client sticks to one endpoint, and a full sync (as
    # the periodic one) does not make it forget.
    name = port_name(0)
    svc = ServicePort(name=name, cluster_ips=("10.96.5.1",), port=80, affinity_timeout=60)
    eps = tuple(
        Endpoint(ip(p), 8080, node)
        for p, node in (("local-1", "node-a"), ("local-2", "node-a"), ("remote-1", "node-b"))
    )
    snap = Snapshot({name: svc}, {name: eps}, NODE)
    node_backend = NftablesBackend(CONFIG, NftCommand(netns=lab.node_ns))
    node_backend.sync(snap, None)
    first = lab.in_pod("client").call(tcp_ask, "10.96.5.1", 80).pod
    for _ in range(3):
        node_backend.sync(snap, None)
        assert "delete table" not in node_backend.last_transaction
        seen = {lab.in_pod("client").call(tcp_ask, "10.96.5.1", 80).pod for _ in range(10)}
        assert seen == {first}


@pytest.mark.parametrize("runner", ["tee", "concurrent"])
def test_a_new_table_loaded_in_pieces_is_the_one_transaction_table(
    lab: Lab, scratch: str, runner: str
) -> None:
    """Pieces of 7 elements (the backend's pieces for a big cluster) into an empty
    kernel give the table one transaction gives, and a partial sync then applies; also
    with the pieces of a stage applied two at a time (nft processes, as in production;
    the strict fake of the "tee" runner takes one at a time)."""
    pieces = NftablesBackend(
        CONFIG, TeeRunner(scratch) if runner == "tee" else NftCommand(netns=scratch)
    )
    pieces.new_table_piece = 7
    pieces.sync(snapshot(12), None)
    assert "add element ip kube-proxy cluster-ip-3-dests" in pieces.last_transaction
    whole_ns = f"{lab.prefix}-whole"
    delete_netns(whole_ns)
    add_netns(whole_ns)
    try:
        NftablesBackend(CONFIG, NftCommand(netns=whole_ns)).sync(snapshot(12), None)
        assert nft_state(scratch) == nft_state(whole_ns)
        assert not pieces.sync(snapshot(12, extra_endpoint=True), {port_name(0)}).full
        NftablesBackend(CONFIG, NftCommand(netns=whole_ns)).sync(
            snapshot(12, extra_endpoint=True), None
        )
        assert nft_state(scratch) == nft_state(whole_ns)
    finally:
        delete_netns(whole_ns)
