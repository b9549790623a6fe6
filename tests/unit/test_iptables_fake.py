"""The strict iptables fake, without root.

Every case of ``tests/iptables_fake_cases.py`` (the same ones the comparison with the
real commands runs) is checked here for its outcome and for all-or-nothing per table: a
refused table is left exactly as it was, the tables before it are committed, the ones
after it untouched. The other tests look at the printed state, the inspection helpers,
fault injection and speed.
"""

from __future__ import annotations

import pytest

from kubeproxy.dataplane.iptables.fake import FakeIptables
from kubeproxy.dataplane.iptables.restore import TABLES, Restore, TableInput
from kubeproxy.dataplane.iptables.rule_values import probability_text, save_string
from kubeproxy.dataplane.iptables.rules import _parse, parse_rule
from kubeproxy.dataplane.iptables.runner import FLAVORS, Flavor, Iptables, IptablesError
from kubeproxy.model.types import IPFamily
from tests.iptables_fake_cases import CASES, Case, RestoreOp, restore


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_case(case: Case, flavor: Flavor) -> None:
    fake = FakeIptables(case.family, flavor)
    assert case.steps
    for i, step in enumerate(case.steps):
        before = dict(fake.tables)
        dumps = {name: t.save() for name, t in before.items()}
        if not step.refused(flavor):
            assert step.op.apply(fake) == step.result, f"step {i}"
            continue
        with pytest.raises(IptablesError) as err:
            step.op.apply(fake)
        assert step.explains(str(err.value)), f"step {i}: {err.value}"
        if not isinstance(step.op, RestoreOp):
            assert fake.tables == before, f"step {i} changed the state"
            continue
        assert err.value.input == str(step.op.data)
        assert err.value.committed == step.committed, f"step {i}"
        assert err.value.table is not None
        assert err.value.line is not None
        line = str(step.op.data).splitlines()[err.value.line - 1]
        assert line, f"step {i}: line {err.value.line} does not exist"
        for name in TABLES:
            if name in step.committed:
                assert fake.tables[name] is not before[name], f"step {i}: {name} not committed"
            else:
                assert fake.tables[name] is before[name], f"step {i} changed {name}"
                assert fake.tables[name].save() == dumps[name], f"step {i} changed {name}"


def _nat(fake: FakeIptables) -> FakeIptables:
    fake.restore(restore(nat=[":KUBE-A", "-A KUBE-A -j RETURN"]))
    return fake


def test_fake_is_an_iptables() -> None:
    ipt: Iptables = FakeIptables(IPFamily.IPv6, "legacy")
    assert (ipt.family, ipt.flavor, ipt.version) == (IPFamily.IPv6, "legacy", "1.8.9")
    assert ipt.has_random_fully
    assert ipt.available() is None
    assert FakeIptables(unavailable="no iptables here").available() == "no iptables here"


def test_save_prints_as_iptables_save() -> None:
    fake = FakeIptables()
    fake.restore(
        restore(
            nat=[
                ":KUBE-SVC-X",
                ":KUBE-MARK-MASQ",
                "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
                "-A KUBE-SVC-X -m comment --comment ns/svc:http -m tcp -p tcp -d 10.96.0.1 "
                "--dport 80 -j KUBE-MARK-MASQ",
                "-A OUTPUT -j KUBE-SVC-X",
            ]
        )
    )
    assert fake.save("nat") == (
        "*nat\n"
        ":PREROUTING ACCEPT [0:0]\n"
        ":INPUT ACCEPT [0:0]\n"
        ":OUTPUT ACCEPT [0:0]\n"
        ":POSTROUTING ACCEPT [0:0]\n"
        ":KUBE-MARK-MASQ - [0:0]\n"
        ":KUBE-SVC-X - [0:0]\n"
        "-A OUTPUT -j KUBE-SVC-X\n"
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n"
        '-A KUBE-SVC-X -d 10.96.0.1/32 -p tcp -m comment --comment "ns/svc:http" '
        "-m tcp --dport 80 -j KUBE-MARK-MASQ\n"
        "COMMIT\n"
    )
    # Read access keeps the arguments as written.
    assert fake.tables["nat"].chains["KUBE-MARK-MASQ"].rules == [
        ("-j", "MARK", "--or-mark", "0x4000")
    ]
    assert fake.dump() == fake.save("nat")
    assert fake.chains("nat") == {
        "PREROUTING",
        "INPUT",
        "OUTPUT",
        "POSTROUTING",
        "KUBE-MARK-MASQ",
        "KUBE-SVC-X",
    }
    assert FakeIptables().dump() == ""


def test_rule_canonical_forms() -> None:
    v4 = IPFamily.IPv4
    assert parse_rule(["-j", "MARK", "--and-mark", "0xff"], v4).text == (
        "-j MARK --set-xmark 0x0/0xffffff00"
    )
    assert probability_text(0.1) == "0.10000000009"
    assert probability_text(1 / 3) == "0.33333333349"
    assert save_string("it's") == '"it\\\'s"'
    assert save_string("a-b_9") == "a-b_9"
    rule = parse_rule(["-p", "tcp", "-j", "DNAT", "--to-destination", "10.0.0.1:80"], v4)
    assert (rule.target, rule.table, rule.hooks) == (
        "DNAT",
        "nat",
        frozenset({"PREROUTING", "OUTPUT"}),
    )
    assert parse_rule(["-j", "KUBE-X"], v4).jump == "KUBE-X"
    assert parse_rule(["-g", "DNAT"], v4).jump == "DNAT"


def test_without_random_fully() -> None:
    old = FakeIptables(version="1.6.1")
    assert not old.has_random_fully
    with pytest.raises(IptablesError, match="unknown option"):
        old.restore(restore(nat=["-A POSTROUTING -j MASQUERADE --random-fully"]))
    old.restore(restore(nat=["-A POSTROUTING -j MASQUERADE"]))


def test_clone_is_independent() -> None:
    fake = _nat(FakeIptables())
    copy = fake.clone()
    copy.restore(restore(nat=[":KUBE-A", "-A KUBE-A -j MARK --or-mark 1", ":KUBE-B"]))
    copy.ensure_rule("nat", "KUBE-A", ["-j", "RETURN"])
    assert fake.tables["nat"].chains["KUBE-A"].rules == [("-j", "RETURN")]
    assert "KUBE-B" not in fake.tables["nat"].chains
    assert len(copy.tables["nat"].chains["KUBE-A"].rules) == 2


def test_fail_next_refuses_the_next_restore_only() -> None:
    fake = FakeIptables()
    injected = IptablesError("injected")
    fake.fail_next = injected
    fake.restore(Restore())  # nothing to run: does not consume the failure
    with pytest.raises(IptablesError) as err:
        _nat(fake)
    assert err.value is injected
    assert fake.last_error is injected
    assert fake.dump() == ""
    _nat(fake)
    assert (fake.restores, fake.refused, fake.calls["restore"]) == (1, 1, 3)


def test_refuse_a_table_keeps_the_earlier_ones() -> None:
    fake = FakeIptables()
    seen: list[tuple[str, TableInput]] = []

    def refuse(table: str, part: TableInput) -> str | None:
        seen.append((table, part))
        return "nat is refused today" if table == "nat" else None

    fake.refuse = refuse
    data = restore(filter=[":KUBE-F"], nat=[":KUBE-N"])
    with pytest.raises(IptablesError, match="nat is refused today") as err:
        fake.restore(data)
    assert [t for t, _ in seen] == ["filter", "nat"]
    assert (err.value.table, err.value.committed, err.value.line) == ("nat", ("filter",), 4)
    assert "KUBE-F" in fake.chains("filter")
    assert "KUBE-N" not in fake.chains("nat")


def test_flush_all_is_a_firewall_reload() -> None:
    fake = FakeIptables()
    fake.restore(restore(nat=[":KUBE-A"]))
    fake.ensure_chain("mangle", "KUBE-PROXY-CANARY")
    fake.flush_all()
    assert not fake.chain_exists("mangle", "KUBE-PROXY-CANARY")
    assert fake.dump() == ""
    assert fake.calls["chain_exists"] == 1


def test_unknown_table() -> None:
    with pytest.raises(IptablesError, match="Table does not exist"):
        FakeIptables().save("broute")


# --------------------------------------------------------------------------- speed


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_big_restore_parses_each_rule_once(flavor: Flavor) -> None:
    """A full sync of a large cluster's size: 10,000 chains, 100,000 rules."""
    data = Restore()
    for c in range(10_000):
        data.chain("nat", f"KUBE-SEP-{c:05d}")
        data.rule(
            "nat",
            "KUBE-SERVICES",
            "-d",
            f"10.{c >> 8}.{c & 255}.1",
            "-p",
            "tcp",
            "-m",
            "tcp",
            "--dport",
            "80",
            "-j",
            f"KUBE-SEP-{c:05d}",
        )
        for r in range(9):
            data.rule(
                "nat",
                f"KUBE-SEP-{c:05d}",
                "-s",
                f"10.{c >> 8}.{c & 255}.{r + 2}",
                "-j",
                "MARK",
                "--or-mark",
                "0x4000",
            )
    data.chain("nat", "KUBE-SERVICES")
    data.rule("nat", "PREROUTING", "-j", "KUBE-SERVICES")
    fake = FakeIptables(flavor=flavor)
    fake.restore(data)
    # The same rules again are not parsed again (what keeps the fake's full syncs cheap;
    # speed itself is not asserted: see bench/).
    misses = _parse.cache_info().misses
    fake.restore(data)
    assert _parse.cache_info().misses == misses
    fake.restore(restore(nat=[":KUBE-SEP-00001", "-A KUBE-SEP-00001 -j RETURN"]))
    assert len(fake.tables["nat"].chains) == 10_005
