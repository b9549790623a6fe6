"""The strict nftables fake, without root.

Every case of ``tests/nft_fake_cases.py`` (the same ones the kernel comparison runs) is
checked here for its outcome and for all-or-nothing: a refused step leaves the state
exactly as it was. The other tests look at the resulting state, the runner interface,
the inspection helpers and how many interval comparisons a big sync costs (its time is
bench/nft_fake.py's).
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings

from kubeproxy.dataplane.nftables import fake_batch, fake_state
from kubeproxy.dataplane.nftables.fake import (
    BaseSpec,
    FakeNftables,
    canonical_key,
    parse_priority,
    parse_set_type,
    rule_references,
)
from kubeproxy.dataplane.nftables.fake_types import Bounds
from kubeproxy.dataplane.nftables.runner import NftError
from kubeproxy.dataplane.nftables.transaction import (
    Chain,
    DeleteChain,
    FlushTable,
    Set,
    Transaction,
)
from tests.nft_fake_cases import (
    BACKENDS,
    CASES,
    FIREWALL,
    SETUP,
    Case,
    T,
    big_syncs,
    chain,
    define,
    delete_elems,
    dset,
    elems,
    firewall_of,
    ok,
    random_batches,
    random_setup,
)


def applied(*steps: Transaction) -> FakeNftables:
    fake = FakeNftables()
    for tx in steps:
        fake.apply(tx)
    return fake


@pytest.mark.parametrize("case", CASES, ids=str)
def test_case(case: Case) -> None:
    fake = FakeNftables()
    for i, step in enumerate(case.steps):
        before, dump = fake.tables, fake.dump()
        if step.error is None:
            fake.apply(step.tx)
            continue
        with pytest.raises(NftError) as err:
            fake.apply(step.tx)
        assert step.error in str(err.value), f"step {i}"
        assert err.value.script == str(step.tx)
        assert fake.tables is before, f"step {i} changed the state"
        assert fake.dump() == dump, f"step {i} changed committed objects"
    assert fake.applied + fake.refused == len(case.steps)


def _recounted(fake: FakeNftables) -> dict[tuple[str, str], tuple[Counter[str], Counter[str]]]:
    """Every table's references counted from scratch."""
    out = {}
    for key, t in fake.tables.items():
        chains: Counter[str] = Counter()
        sets: Counter[str] = Counter()
        for c in t.chains.values():
            for rule in c.rules:
                refs = rule_references(rule)
                chains.update(refs.chains)
                sets.update(refs.sets)
        for s in t.sets.values():
            if s.type.is_verdict_map:
                chains.update(str(v).split()[1] for v in s.elements.values() if " " in str(v))
        out[key] = (chains, sets)
    return out


@settings(max_examples=300, deadline=None)
@given(batches=random_batches)
def test_random_batches_are_all_or_nothing(batches: list[Transaction]) -> None:
    """Refused batches change nothing, check() agrees with apply(), and the reference
    counts kept along the way match a recount."""
    fake = applied(random_setup())

    def check_counts() -> None:
        kept = {key: (+t.chain_refs, +t.set_refs) for key, t in fake.tables.items()}
        assert kept == {key: (+c, +s) for key, (c, s) in _recounted(fake).items()}

    check_counts()
    for tx in batches:
        before, dump = fake.tables, fake.dump()
        try:
            fake.check(tx)
        except NftError as err:
            with pytest.raises(NftError) as again:
                fake.apply(tx)
            assert str(again.value) == str(err)
            assert fake.tables is before
            assert fake.dump() == dump
            continue
        fake.apply(tx)
        check_counts()


# --------------------------------------------------------------------------- state


def test_flush_table_keeps_chains_sets_and_elements() -> None:
    fake = applied(SETUP.tx, ok(FlushTable(T)).tx)
    t = fake.tables[("ip", "t")]
    assert {name: c.rules for name, c in t.chains.items()} == {"x": [], "c": [], "in": []}
    assert t.chains["in"].base == BaseSpec("filter", "input", -110)
    assert t.sets["s"].elements == {"1.1.1.1": None}
    assert t.sets["m"].elements == {"10.96.0.1 . tcp . 80": "goto x"}


def test_declarative_table_appends_rules_and_adds_elements() -> None:
    again = define(dset("s", "ipv4_addr", "1.1.1.2"), Chain("c", ["counter"]), Chain("y"))
    fake = applied(SETUP.tx, ok(again).tx)
    t = fake.tables[("ip", "t")]
    assert t.chains["c"].rules == ["ip saddr @s drop", "counter", "counter"]
    assert t.chains["y"].rules == []
    assert t.sets["s"].elements == {"1.1.1.1": None, "1.1.1.2": None}


def test_comments_are_set_at_creation_only() -> None:
    (case,) = [c for c in CASES if c.name.startswith("comments of tables")]
    t = applied(*(step.tx for step in case.steps)).tables[("ip", "t")]
    assert (t.comment, t.chains["c"].comment, t.sets["s"].comment) == (
        "table 1",
        "chain 1",
        "set 1",
    )


def test_replace_chain_leaves_exactly_the_new_rules() -> None:
    tx = Transaction()
    tx.replace_chain(T, "c", ["counter", "drop"])
    fake = applied(SETUP.tx, tx)
    assert fake.tables[("ip", "t")].chains["c"].rules == ["counter", "drop"]
    fake.apply(tx)  # idempotent: what the backend relies on when retrying
    assert fake.tables[("ip", "t")].chains["c"].rules == ["counter", "drop"]


def test_elements_are_stored_as_nft_prints_them() -> None:
    fake = applied(
        SETUP.tx,
        ok(
            define(
                dset("i", "ipv4_addr", "10.0.0.1/24", "10.1.0.0-10.1.0.255", flags=("interval",)),
                dset("p", "inet_proto . inet_service", "6 . 80", "58 . 0", "ipv6-icmp . 1"),
                dset("v6", "ipv6_addr", "FD00:0::0:1"),
                dset("b", BACKENDS, "10.96.0.1 . 17 . 53 . 0 : 10.244.0.1 . 53"),
            )
        ).tx,
    )
    sets = fake.tables[("ip", "t")].sets
    assert sets["i"].elements == {"10.0.0.0/24": None, "10.1.0.0/24": None}
    assert sets["p"].elements == {"tcp . 80": None, "ipv6-icmp . 0": None, "ipv6-icmp . 1": None}
    assert sets["v6"].elements == {"fd00::1": None}
    assert sets["b"].elements == {"10.96.0.1 . udp . 53 . 0": "10.244.0.1 . 53"}


def test_a_refused_batch_leaves_earlier_committed_objects_untouched() -> None:
    """Copy-on-write: objects a test held on to stay as they were committed."""
    fake = applied(SETUP.tx)
    t = fake.tables[("ip", "t")]
    s, c = t.sets["s"], t.chains["c"]
    tx = Transaction()
    tx.add_elements(T, "s", [("2.2.2.2", None)])
    tx.add_chain(T, "c", ["counter"])
    fake.apply(tx)
    assert s.elements == {"1.1.1.1": None}
    assert c.rules == ["ip saddr @s drop", "counter"]
    new = fake.tables[("ip", "t")]
    assert new.sets["s"].elements == {"1.1.1.1": None, "2.2.2.2": None}
    assert new.chains["c"].rules == ["ip saddr @s drop", "counter", "counter"]


def test_reference_counts_follow_every_removal_path() -> None:
    fake = applied(SETUP.tx)
    t = fake.tables[("ip", "t")]
    assert (t.chain_refs["x"], t.set_refs["s"], t.set_refs["m"]) == (1, 1, 1)
    tx = Transaction()
    tx.flush_table(T)
    tx.flush_set(T, "map", "m")
    fake.apply(tx)
    t = fake.tables[("ip", "t")]
    assert (t.chain_refs["x"], t.set_refs["s"], t.set_refs["m"]) == (0, 0, 0)


# -------------------------------------------------------------------------- runner


def test_list_tables_and_objects() -> None:
    fake = applied(SETUP.tx)
    assert fake.list_tables() == [("ip", "t")]
    assert fake.list_objects("ip", "t") == {"chain": {"x", "c", "in"}, "set": {"s"}, "map": {"m"}}
    assert fake.list_objects("ip6", "t") == {"chain": set(), "set": set(), "map": set()}
    assert fake.has_table("ip", "t")
    assert not fake.has_table("ip6", "t")


def test_check_validates_without_changing_anything() -> None:
    fake = applied(SETUP.tx)
    dump = fake.dump()
    tx = Transaction()
    tx.delete_chain(T, "c")
    fake.check(tx)
    assert fake.dump() == dump
    tx.delete_chain(T, "x")  # still in the verdict map
    with pytest.raises(NftError, match="Device or resource busy"):
        fake.check(tx)
    assert fake.dump() == dump
    assert (fake.applied, fake.refused, fake.checked) == (1, 0, 1)


def test_empty_transactions_reach_nothing() -> None:
    fake = FakeNftables()
    fake.fail_next = NftError("boom", "")
    fake.apply(Transaction())
    fake.check(Transaction())
    assert (fake.applied, fake.refused, fake.checked) == (0, 0, 0)
    assert fake.fail_next is not None


def test_fail_next_refuses_one_transaction() -> None:
    fake = FakeNftables()
    injected = NftError("nft: Error: Could not process rule: Cannot allocate memory", "")
    fake.fail_next = injected
    with pytest.raises(NftError) as err:
        fake.apply(SETUP.tx)
    assert err.value is injected
    assert fake.tables == {}
    fake.apply(SETUP.tx)
    assert (fake.applied, fake.refused, fake.last_error) == (1, 1, injected)


def test_refuse_predicate_sees_every_transaction() -> None:
    fake = FakeNftables()
    seen: list[int] = []

    def refuse(tx: Transaction) -> str | None:
        seen.append(len(tx))
        return "injected" if any(isinstance(op, DeleteChain) for op in tx) else None

    fake.refuse = refuse
    fake.apply(SETUP.tx)
    tx = Transaction()
    tx.delete_chain(T, "c")
    with pytest.raises(NftError, match="injected"):
        fake.check(tx)
    with pytest.raises(NftError, match="injected"):
        fake.apply(tx)
    assert seen == [1, 1, 1]
    assert "c" in fake.tables[("ip", "t")].chains
    assert (fake.applied, fake.refused) == (1, 1)


def test_clones_are_independent() -> None:
    fake = applied(SETUP.tx)
    other = fake.clone()
    tx = Transaction()
    tx.add_elements(T, "s", [("2.2.2.2", None)])
    other.apply(tx)
    assert fake.tables[("ip", "t")].sets["s"].elements == {"1.1.1.1": None}
    assert other.tables[("ip", "t")].sets["s"].elements == {"1.1.1.1": None, "2.2.2.2": None}


def test_error_names_the_operation() -> None:
    tx = Transaction()
    tx.add_table(T)
    tx.add_chain(T, "a", ["jump b"])
    with pytest.raises(NftError) as err:
        FakeNftables().apply(tx)
    assert str(err.value) == (
        "nft: Error: Could not process rule: No such file or directory "
        "(jump/goto to missing chain b)\nadd chain ip t a { jump b; }"
    )


# ------------------------------------------------------------------------ inspection


def test_dump_is_sorted_and_independent_of_order() -> None:
    def build(reverse: bool) -> FakeNftables:
        parts: list[Chain | Set] = [
            dset("s", "ipv4_addr", "10.0.0.2", "10.0.0.1", "10.0.0.10"),
            Chain("b", ["counter", "jump a"]),
            Chain("a"),
            Set("d", "ipv4_addr", ("timeout", "dynamic"), timeout=60, comment="affinity"),
        ]
        return applied(ok(define(*(reversed(parts) if reverse else parts), comment="golden")).tx)

    assert build(False).dump() == build(True).dump()
    assert build(False).dump() == (
        "table ip t {\n"
        '\tcomment "golden"\n'
        "\tchain a {\n"
        "\t}\n"
        "\tchain b {\n"
        "\t\tcounter\n"
        "\t\tjump a\n"
        "\t}\n"
        "\tset d {\n"
        "\t\ttype ipv4_addr\n"
        "\t\tflags dynamic,timeout\n"
        "\t\ttimeout 60s\n"
        '\t\tcomment "affinity"\n'
        "\t}\n"
        "\tset s {\n"
        "\t\ttype ipv4_addr\n"
        "\t\telements = {\n"
        "\t\t\t10.0.0.1\n"
        "\t\t\t10.0.0.10\n"
        "\t\t\t10.0.0.2\n"
        "\t\t}\n"
        "\t}\n"
        "}\n"
    )


def test_dump_of_base_chains_and_maps() -> None:
    assert applied(SETUP.tx).dump().splitlines()[5:12] == [
        "\tchain in {",
        "\t\ttype filter hook input priority -110; policy accept;",
        "\t\tip daddr . meta l4proto . th dport vmap @m",
        "\t}",
        "\tchain x {",
        "\t\tcounter",
        "\t}",
    ]


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("-110", -110), ("dstnat", -100), ("srcnat", 100), ("filter - 10", -10)],
)
def test_parse_priority(text: str, value: int) -> None:
    assert parse_priority(text) == value


def test_parse_priority_refuses_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown chain priority"):
        parse_priority("early")


def test_parse_set_type() -> None:
    backends = parse_set_type(BACKENDS, "map")
    assert backends.key == ("ipv4_addr", "inet_proto", "inet_service", "integer")
    assert backends.data == ("ipv4_addr", "inet_service")
    assert backends.unreadable_typeof
    nodeports = parse_set_type("typeof meta l4proto . th dport : ip daddr", "map")
    assert not nodeports.unreadable_typeof
    assert (
        parse_set_type(FIREWALL).key
        == parse_set_type("typeof ip daddr . meta l4proto . th dport . ip saddr").key
    )
    assert parse_set_type("ipv6_addr . inet_service : verdict", "map").is_verdict_map
    for bad, keyword, why in [
        ("ipv4_addr", "map", "a map needs 'key : data'"),
        ("ipv4_addr : verdict", "set", "a map needs 'key : data'"),
        ("integer", "set", "datatype 'integer' is not modelled"),
        ("typeof ip dscp", "set", "typeof expression 'ip dscp' is not modelled"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_set_type(bad, keyword)


def test_canonical_key_bounds() -> None:
    stype = parse_set_type(FIREWALL)
    key, bounds = canonical_key(stype, "1.2.3.4  .  tcp . 80-90 . 10.0.0.0/8", True)
    assert key == "1.2.3.4 . tcp . 80-90 . 10.0.0.0/8"
    assert bounds == ((0x01020304, 0x01020304), (6, 6), (80, 90), (0x0A000000, 0x0AFFFFFF))


# ------------------------------------------------------------------- work, not time


@pytest.fixture
def overlap_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many pairs of intervals the fake compares (a one-element list, counting)."""
    count = [0]
    compare = fake_state._overlap

    def counted(a: tuple[Bounds, ...], b: tuple[Bounds, ...]) -> bool:
        count[0] += 1
        return compare(a, b)

    for module in (fake_state, fake_batch):  # sets' own checks, and batches' churn
        monkeypatch.setattr(module, "_overlap", counted)
    return count


def test_a_large_full_sync_compares_each_interval_with_its_group_only(
    overlap_checks: list[int],
) -> None:
    """10,000 Services: ~150,000 elements in one declarative table, twice, then a
    partial sync. The 20,000 firewall intervals come in groups of two (one per
    ClusterIP): one comparison each group, where a check against the whole set would
    make 2 x 10^8. (The time it takes: python -m bench.nft_fake.)"""
    _, syncs = big_syncs(10_000)
    fake = FakeNftables()
    counts = []
    for tx in syncs:
        overlap_checks[0] = 0
        fake.apply(tx)
        counts.append(overlap_checks[0])
    sets = fake.tables[("ip", "kube-proxy")].sets
    assert len(sets["ip-backends"].elements) == 120_000
    assert len(sets["firewall-allow"].elements) == 20_001
    assert counts == [10_000, 10_000, 2]


def test_interval_checks_do_not_scan_the_whole_set(overlap_checks: list[int]) -> None:
    """A wide element in the first component is compared with everything, but elements
    whose first component is one value only meet their own group."""
    fake, adds = firewall_of(20_000)
    overlap_checks[0] = 0
    for tx in adds:
        fake.apply(tx)
    assert overlap_checks[0] == 200  # each add meets the one element of its group
    tx = Transaction()
    tx.add_elements(T, "f", [("10.96.0.0/16 . tcp . 80 . 10.1.0.0/16", None)])
    with pytest.raises(NftError, match="File exists"):
        fake.apply(tx)


def test_delete_elements_of_a_typeof_map_by_equivalent_keys() -> None:
    fake = applied(
        SETUP.tx,
        ok(define(dset("b", BACKENDS, "10.96.0.1 . tcp . 80 . 0 : 10.244.0.1 . 80"))).tx,
    )
    fake.apply(ok(delete_elems("b", "10.96.0.1 . 6 . 80 . 0")).tx)
    assert fake.tables[("ip", "t")].sets["b"].elements == {}
    fake.apply(ok(elems("b", "10.96.0.1 . tcp . 80 . 1 : 10.244.0.1 . 80"), chain("z")).tx)
