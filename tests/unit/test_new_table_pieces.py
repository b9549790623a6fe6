"""A big full sync into tables that do not exist yet goes in pieces (nft's memory grows
with its input); the result is the one-transaction table, a ServicePort's entry elements
come after everything else, and an existing table is never changed in pieces."""

from __future__ import annotations

import itertools
import threading

from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.backends.nftables.table import is_entry
from kubeproxy.dataplane.nftables.fake import FakeNftables
from kubeproxy.dataplane.nftables.runner import NftError
from kubeproxy.dataplane.nftables.transaction import (
    AddElements,
    DefineTable,
    DeleteTable,
    Transaction,
)
from kubeproxy.model.state import Snapshot
from tests.unit.conftest import service_port
from tests.unit.test_sync_orchestration import CONFIG, fresh_dump, snapshot


class Recording(FakeNftables):
    def __init__(self) -> None:
        super().__init__()
        self.transactions: list[Transaction] = []

    def apply(self, tx: Transaction) -> None:
        super().apply(tx)
        self.transactions.append(tx)


def cluster(services: int = 6) -> Snapshot:
    return snapshot(
        *(
            service_port(f"svc-{i}", cluster_ips=(f"10.96.0.{10 + i}",), node_port=30000 + i)
            for i in range(services)
        ),
        endpoints=3,
    )


def backend(fake: FakeNftables, piece: int) -> NftablesBackend:
    b = NftablesBackend(CONFIG, fake)
    b.new_table_piece = piece
    return b


def test_a_new_table_is_loaded_in_pieces_and_ends_as_one_transaction_would() -> None:
    fake = Recording()
    snap = cluster()
    backend(fake, piece=4).sync(snap, None)
    assert fake.dump() == fresh_dump(snap)
    first, *pieces = fake.transactions
    assert any(isinstance(op, DefineTable) for op in first)
    assert len(pieces) > 3
    adds = [op for tx in pieces for op in tx]
    assert all(isinstance(op, AddElements) and len(op.elements) <= 4 for op in adds)
    assert all(len(tx) == 1 for tx in pieces)
    # The entry sets' elements (the shared chains' "-dests" sets) come last: a
    # ServicePort is reachable only once all of its other elements are in.
    entry = [isinstance(op, AddElements) and is_entry(op.set_name) for op in adds]
    assert entry == sorted(entry) and any(entry)
    define = next(op for op in first if isinstance(op, DefineTable))
    entry_maps = [s for s in define.definition.sets if is_entry(s.name)]
    assert entry_maps and not any(s.elements for s in entry_maps)


def test_a_small_new_table_and_an_existing_table_are_one_transaction() -> None:
    fake = Recording()
    snap = cluster()
    b = backend(fake, piece=1000)
    b.sync(snap, None)
    assert len(fake.transactions) == 1
    b.new_table_piece = 4
    fake.transactions.clear()
    bigger = cluster(8)
    b.sync(bigger, None)  # a full sync over the existing table: atomic
    assert len(fake.transactions) == 1
    assert fake.dump() == fresh_dump(bigger)


def test_a_refused_piece_replaces_the_table_in_one_transaction() -> None:
    fake = Recording()
    snap = cluster()
    refused = {"count": 0}

    def refuse(tx: Transaction) -> str | None:
        # The third piece is refused once.
        if any(isinstance(op, AddElements) for op in tx) and refused["count"] < 3:
            refused["count"] += 1
            return "injected" if refused["count"] == 3 else None
        return None

    fake.refuse = refuse
    result = backend(fake, piece=4).sync(snap, None)
    assert result.full and result.isolated == []
    assert fake.dump() == fresh_dump(snap)
    last = fake.transactions[-1]  # the tables replaced, all in one
    assert any(isinstance(op, DeleteTable) for op in last)
    assert sum(isinstance(op, DefineTable) for op in last) == 1


def test_a_piece_failing_in_nft_is_retried_whole() -> None:
    fake = Recording()
    snap = cluster()
    b = backend(fake, piece=4)
    calls = {"n": 0}
    original = fake.apply

    def flaky(tx: Transaction) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise NftError("nft: injected", str(tx))
        original(tx)

    fake.apply = flaky  # type: ignore[method-assign]
    b.sync(snap, None)
    assert fake.dump() == fresh_dump(snap)


class Concurrent(Recording):
    """Takes transactions from several threads, as the nft process runner does; records
    how many were in flight at once and, on a logical clock (one tick per event, under
    a lock), when each began and was committed. The first piece after the table waits
    until a second transaction is in flight, so a runner that applies two at once is
    seen doing it, whatever the timing (the wait's bound only keeps a serial runner
    from hanging the test: it then fails on ``most``)."""

    concurrent_applies = 2

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.clock = itertools.count()
        self.begun = 0
        self.active = 0
        self.most = 0
        self.second_in_flight = threading.Event()
        self.spans: list[tuple[int, int, Transaction]] = []

    def apply(self, tx: Transaction) -> None:
        with self.lock:
            self.active += 1
            self.begun += 1
            self.most = max(self.most, self.active)
            began = next(self.clock)
            first_piece = self.begun == 2
            if self.active == 2:
                self.second_in_flight.set()
        if first_piece:
            self.second_in_flight.wait(timeout=60)
        with self.lock:
            try:
                super().apply(tx)
            finally:
                self.active -= 1
                self.spans.append((began, next(self.clock), tx))


def test_the_pieces_go_two_at_once_and_the_entry_elements_after_all_others_in_order() -> None:
    fake = Concurrent()
    snap = cluster(10)
    backend(fake, piece=4).sync(snap, None)
    assert fake.dump() == fresh_dump(snap)
    assert fake.most == 2

    def entry(tx: Transaction) -> bool:
        return any(isinstance(op, AddElements) and is_entry(op.set_name) for op in tx)

    (_, table_done, first), *pieces = sorted(fake.spans, key=lambda span: span[0])
    assert any(isinstance(op, DefineTable) for op in first)
    assert all(began >= table_done for began, _, _ in pieces)
    others_done = max(done for _, done, tx in pieces if not entry(tx))
    late = [(began, done) for began, done, tx in pieces if entry(tx)]
    assert len(late) > 1 and min(late)[0] >= others_done
    # One at a time, so the Services become reachable in order.
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(late))
