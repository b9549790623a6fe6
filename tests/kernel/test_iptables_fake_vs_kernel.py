"""The strict iptables fake against the real thing: every case of
``tests/iptables_fake_cases.py`` is applied step by step to a fake and, through
:class:`~kubeproxy.dataplane.iptables.runner.IptablesCommand`, to iptables 1.8.9 in a
scratch network namespace, once per flavour (nft and legacy, each in its own namespace
so neither sees the other's tables). Both must accept or both refuse each step, with the
same result for single commands; a refused restore must fail at the same line, in the
same table, with the same tables committed before it; and after each step the
``iptables-save`` output of filter, nat and mangle (counters zeroed, comment lines
dropped) must equal the fake's ``save()`` text exactly, so the fake's canonical forms
are iptables' own.

The runner's own behaviour against the real commands (chain listings, the canary
check, flavour detection, cleanup) is checked here too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

from kubeproxy.dataplane.iptables.cleanup import cleanup_chains
from kubeproxy.dataplane.iptables.fake import FakeIptables
from kubeproxy.dataplane.iptables.restore import Restore
from kubeproxy.dataplane.iptables.runner import (
    FLAVORS,
    Flavor,
    IptablesCommand,
    IptablesError,
    chains_from_save,
    command_names,
    detect_flavor,
)
from kubeproxy.lab.netns import add_netns, delete_netns, list_netns, ns_exec
from kubeproxy.lab.rulestate import BUILTIN_CHAINS, empty_rules
from kubeproxy.model.types import IPFamily
from tests.conftest import require_tool
from tests.iptables_fake_cases import (
    CASES,
    COMPARED_TABLES,
    Case,
    Op,
    RestoreOp,
    normalise,
    restore,
)

FAMILIES = (IPFamily.IPv4, IPFamily.IPv6)


@pytest.fixture(autouse=True)
def _iptables_tools() -> None:
    for family in FAMILIES:
        for flavor in FLAVORS:
            for name in command_names(family, flavor):
                require_tool(name)


@pytest.fixture(scope="module")
def namespaces() -> Iterator[dict[Flavor, str]]:
    """One scratch namespace per flavour, deleted by name at the end."""
    base = f"kpipt{os.getpid() % 100000}"
    names: dict[Flavor, str] = {flavor: f"{base}{flavor[0]}" for flavor in FLAVORS}
    try:
        for name in names.values():
            add_netns(name)
        yield names
    finally:
        for name in names.values():
            delete_netns(name)
    assert not set(names.values()) & set(list_netns())


def _outcome(
    op: Op, ipt: FakeIptables | IptablesCommand
) -> tuple[bool | None, IptablesError | None]:
    try:
        return op.apply(ipt), None
    except IptablesError as err:
        return None, err


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_fake_agrees_with_iptables(
    case: Case, flavor: Flavor, namespaces: dict[Flavor, str]
) -> None:
    ns = namespaces[flavor]
    empty_rules(ns, f"iptables-{flavor}")
    real = IptablesCommand(case.family, flavor, netns=ns)
    fake = FakeIptables(case.family, flavor)
    assert case.steps
    for i, step in enumerate(case.steps):
        real_result, real_err = _outcome(step.op, real)
        fake_result, fake_err = _outcome(step.op, fake)
        where = f"step {i}:\n{step.op}\nreal: {real_err}\nfake: {fake_err}"
        if step.kernel_accepts is not None:
            # A documented place where the fake is stricter; the states part here.
            assert real_err is None, where
            assert fake_err is not None, where
            return
        assert (real_err is None) == (not step.refused(flavor)), where
        assert (fake_err is None) == (not step.refused(flavor)), where
        assert fake_err is None or step.explains(str(fake_err)), where
        assert real_result == fake_result == step.result, where
        if real_err is not None and fake_err is not None and isinstance(step.op, RestoreOp):
            if real_err.line is not None:
                assert real_err.line == fake_err.line, where
            assert (real_err.table, real_err.committed) == (fake_err.table, fake_err.committed), (
                where
            )
        for table in COMPARED_TABLES:
            assert normalise(real.save(table)) == fake.save(table), f"{where}\ntable {table}"


# --------------------------------------------------------------------- the runner


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", FAMILIES)
def test_runner_basics(family: IPFamily, flavor: Flavor, namespaces: dict[Flavor, str]) -> None:
    ns = namespaces[flavor]
    empty_rules(ns, f"iptables-{flavor}")
    ipt = IptablesCommand(family, flavor, netns=ns)
    assert ipt.available() is None
    assert re.fullmatch(r"\d+\.\d+\.\d+", ipt.version)
    assert ipt.has_random_fully
    for table in COMPARED_TABLES:
        assert ipt.chains(table) == chains_from_save(ipt.save(table)) == set(BUILTIN_CHAINS[table])
    data = restore(nat=[":KUBE-A", ":KUBE-B", "-A KUBE-A -j KUBE-B"], mangle=[":KUBE-M"])
    ipt.restore(data)
    ipt.restore(Restore())  # nothing: not even run
    assert ipt.chains("nat") == {*BUILTIN_CHAINS["nat"], "KUBE-A", "KUBE-B"}
    assert ipt.chains("nat") == chains_from_save(ipt.save("nat"))
    assert ipt.chain_exists("mangle", "KUBE-M")
    assert not ipt.chain_exists("filter", "KUBE-M")
    # The other family's tables are its own.
    other = IptablesCommand(
        IPFamily.IPv6 if family is IPFamily.IPv4 else IPFamily.IPv4, flavor, netns=ns
    )
    assert other.chains("nat") == set(BUILTIN_CHAINS["nat"])


def test_nft_chain_listing_without_nft(namespaces: dict[Flavor, str]) -> None:
    ns = namespaces["nft"]
    empty_rules(ns, "iptables-nft")
    with_nft = IptablesCommand(flavor="nft", netns=ns)
    without = IptablesCommand(flavor="nft", netns=ns, nft="")
    with_nft.restore(restore(filter=[":KUBE-F"]))
    want = {*BUILTIN_CHAINS["filter"], "KUBE-F"}
    assert with_nft.chains("filter") == without.chains("filter") == want


def test_legacy_listing_does_not_create_tables(namespaces: dict[Flavor, str]) -> None:
    ns = f"{namespaces['legacy']}x"
    add_netns(ns)
    try:
        ipt = IptablesCommand(flavor="legacy", netns=ns)
        assert ipt.chains("mangle") == set(BUILTIN_CHAINS["mangle"])
        assert ns_exec(ns, "cat", "/proc/net/ip_tables_names").split() == []
        assert ns_exec(ns, "iptables-legacy-save") == ""
    finally:
        delete_netns(ns)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_refused_restore_names_its_table(flavor: Flavor, namespaces: dict[Flavor, str]) -> None:
    ns = namespaces[flavor]
    empty_rules(ns, f"iptables-{flavor}")
    ipt = IptablesCommand(flavor=flavor, netns=ns)
    data = restore(filter=[":KUBE-F"], nat=[":KUBE-N", "-A KUBE-N -j KUBE-MISSING"])
    with pytest.raises(IptablesError) as err:
        ipt.restore(data)
    line = 6 if flavor == "legacy" else 7  # nft: at COMMIT
    assert (err.value.table, err.value.committed, err.value.line) == ("nat", ("filter",), line)
    assert "KUBE-MISSING" in str(err.value)
    assert "table nat; filter committed" in str(err.value)
    assert err.value.input == str(data)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_cleanup_agrees_with_the_fake(flavor: Flavor, namespaces: dict[Flavor, str]) -> None:
    ns = namespaces[flavor]
    empty_rules(ns, f"iptables-{flavor}")
    real = IptablesCommand(flavor=flavor, netns=ns)
    fake = FakeIptables(flavor=flavor)
    data = restore(
        filter=[":KUBE-SERVICES", ":OTHER", "-A INPUT -j KUBE-SERVICES", "-A INPUT -j OTHER"],
        nat=[
            ":KUBE-SERVICES",
            ":KUBE-SVC-A",
            "-A KUBE-SERVICES -j KUBE-SVC-A",
            "-A PREROUTING -j KUBE-SERVICES",
            "-A PREROUTING -j KUBE-SERVICES",
        ],
        mangle=[":KUBE-PROXY-CANARY"],
    )
    jumps = [
        ("nat", "PREROUTING", ("-j", "KUBE-SERVICES")),
        ("filter", "INPUT", ("-j", "KUBE-SERVICES")),
        ("nat", "OUTPUT", ("-j", "KUBE-SERVICES")),  # never added
    ]

    def ours(name: str) -> bool:
        return name.startswith("KUBE-")

    for ipt in (real, fake):
        ipt.restore(data)
    assert cleanup_chains(real, ours, jumps) == cleanup_chains(fake, ours, jumps)
    for table in COMPARED_TABLES:
        assert normalise(real.save(table)) == fake.save(table)
    assert "OTHER" in real.chains("filter")


def test_detect_flavor(namespaces: dict[Flavor, str]) -> None:
    ns = f"{namespaces['nft']}d"
    add_netns(ns)
    try:
        assert detect_flavor(ns) == "nft"  # nothing anywhere
        legacy = IptablesCommand(flavor="legacy", netns=ns)
        legacy.restore(restore(filter=["-A INPUT -j ACCEPT"]))
        assert detect_flavor(ns) == "legacy"  # only legacy holds rules
        nft = IptablesCommand(IPFamily.IPv6, "nft", netns=ns)
        nft.restore(restore(filter=["-A INPUT -j ACCEPT", "-A OUTPUT -j ACCEPT"]))
        assert detect_flavor(ns) == "nft"  # more rules in nft
        legacy.restore(restore(mangle=[":KUBE-IPTABLES-HINT"]))
        assert detect_flavor(ns) == "legacy"  # kubelet's hint beats counting
        nft.ensure_chain("mangle", "KUBE-KUBELET-CANARY")
        assert detect_flavor(ns) == "nft"  # kubelet's nft hint is looked for first
        assert detect_flavor(ns, sbin="/nonexistent") == "nft"  # nothing runs: nft
    finally:
        delete_netns(ns)
