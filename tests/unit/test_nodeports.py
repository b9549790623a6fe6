"""kubeproxy.model.nodeports: the --nodeport-addresses flag, parsed and resolved per family."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeproxy.backends.iptables.proxier import init_node
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.model.nodeports import FamilyNodePorts, NodePortAddresses
from kubeproxy.model.planning import PlanSettings, family_plans
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import IPFamily

V4, V6 = IPFamily.IPv4, IPFamily.IPv6


@pytest.mark.parametrize(
    ("values", "cidrs", "primary"),
    [
        # Unset means every address (nftables mode's "primary" default comes from the
        # configuration, as upstream's platformApplyDefaults).
        ([], (), False),
        ([""], (), False),
        (["primary"], (), True),
        (["10.0.0.0/8"], ("10.0.0.0/8",), False),
        # both the repeated-flag and the comma-separated spellings
        (["10.0.0.0/8", "fd00::/64"], ("10.0.0.0/8", "fd00::/64"), False),
        (["10.0.0.0/8,fd00::/64"], ("10.0.0.0/8", "fd00::/64"), False),
        ([" 10.0.0.0/8 , ,", " 192.168.0.0/16 "], ("10.0.0.0/8", "192.168.0.0/16"), False),
        ([" primary ", ""], (), True),
        # host bits dropped, spellings canonicalised, duplicates removed (first kept)
        (["10.1.2.3/8", "10.0.0.0/8", "FD00:0::/64"], ("10.0.0.0/8", "fd00::/64"), False),
        # a bare address is its own /32 (/128)
        (["192.168.1.5", "fd00::5"], ("192.168.1.5/32", "fd00::5/128"), False),
        (["0.0.0.0/0"], ("0.0.0.0/0",), False),
    ],
    ids=[
        "empty",
        "empty-string",
        "primary",
        "one-cidr",
        "two-flags",
        "comma-separated",
        "whitespace-and-empty-items",
        "primary-with-blanks",
        "canonical-dedup",
        "bare-ip",
        "all-v4",
    ],
)
def test_parse(values: list[str], cidrs: tuple[str, ...], primary: bool) -> None:
    npa = NodePortAddresses.parse(values)
    assert npa.cidrs == cidrs
    assert npa.primary is primary


@pytest.mark.parametrize(
    ("values", "cidrs", "primary"),
    [
        (["primary", "10.0.0.0/8"], ("10.0.0.0/8",), True),
        (["10.0.0.0/8,primary"], ("10.0.0.0/8",), True),
        (["localhost"], ("127.0.0.0/8", "::1/128"), False),
        (["all"], ("0.0.0.0/0", "::/0"), False),
        (["primary,localhost", "fd00::/64"], ("127.0.0.0/8", "::1/128", "fd00::/64"), True),
    ],
)
def test_keywords_and_cidrs_mix(values: list[str], cidrs: tuple[str, ...], primary: bool) -> None:
    # v1.37 (expandNodePortAddressKeywords): any mix of keywords and CIDRs.
    npa = NodePortAddresses.parse(values)
    assert (npa.cidrs, npa.primary) == (cidrs, primary)
    assert NodePortAddresses.parse([str(npa)]) == npa


@pytest.mark.parametrize(
    ("values", "family", "primary_ip", "expected"),
    [
        (["primary", "10.0.0.0/8"], V4, "172.16.0.1", ("172.16.0.1/32", "10.0.0.0/8")),
        (["primary", "10.0.0.0/8"], V6, "fd00::1", ("fd00::1/128",)),
        # A loopback primary IP is skipped; the CIDRs stay.
        (["primary", "10.0.0.0/8"], V4, "127.0.0.1", ("10.0.0.0/8",)),
        (["localhost"], V6, "fd00::1", ("::1/128",)),
        (["primary", "localhost"], V4, "10.0.0.1", ("10.0.0.1/32", "127.0.0.0/8")),
    ],
)
def test_keywords_resolve_per_family(
    values: list[str], family: IPFamily, primary_ip: str, expected: tuple[str, ...]
) -> None:
    assert NodePortAddresses.parse(values).for_family(family, primary_ip) == FamilyNodePorts(
        False, expected
    )


def test_all_is_every_address() -> None:
    for family, ip in ((V4, "10.0.0.1"), (V6, "fd00::1")):
        assert NodePortAddresses.parse(["all", "primary"]).for_family(family, ip).match_all


def test_parse_accepts_tuple() -> None:
    assert NodePortAddresses.parse(("10.0.0.0/8",)).cidrs == ("10.0.0.0/8",)


@pytest.mark.parametrize(
    "bad",
    [
        "foo",
        "10.0.0.0/33",
        "10.0.0.0/8/8",
        "Primary",
        "primary2",
        "300.0.0.0/8",
        # Python keeps IPv6 zone IDs (any text after "%"): must not reach the rule script
        "fe80::%eth0/64",
        "fe80::%x;flush ruleset/64",
    ],
)
def test_parse_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="--nodeport-addresses") as info:
        NodePortAddresses.parse(["10.0.0.0/8", bad])
    message = str(info.value)
    assert repr(bad) in message  # names the bad entry
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize(
    ("values", "family", "primary_ip", "expected"),
    [
        (["primary"], V4, "10.0.0.1", FamilyNodePorts(False, ("10.0.0.1/32",))),
        (["primary"], V6, "fd00::1", FamilyNodePorts(False, ("fd00::1/128",))),
        # No primary IP of that family (or only loopback): upstream's fallback to the
        # whole family, i.e. every local address.
        (["primary"], V6, None, FamilyNodePorts(True, ())),
        (["primary"], V4, "127.0.0.1", FamilyNodePorts(True, ())),
        (["10.0.0.0/8"], V4, "10.0.0.1", FamilyNodePorts(False, ("10.0.0.0/8",))),
        # A family the list does not mention: every local address, as upstream.
        (["10.0.0.0/8"], V6, "fd00::1", FamilyNodePorts(True, ())),
        # A whole-family CIDR means every local address, whatever else is listed.
        (["0.0.0.0/0"], V4, "10.0.0.1", FamilyNodePorts(True, ())),
        (["10.0.0.0/8", "0.0.0.0/0"], V4, "10.0.0.1", FamilyNodePorts(True, ())),
        (["::/0"], V6, None, FamilyNodePorts(True, ())),
        # CIDRs ignore the primary IP.
        (["192.168.0.0/16"], V4, "10.0.0.1", FamilyNodePorts(False, ("192.168.0.0/16",))),
        (["10.0.0.0/8", "fd00::/64"], V6, None, FamilyNodePorts(False, ("fd00::/64",))),
    ],
    ids=[
        "primary-v4",
        "primary-v6",
        "primary-missing",
        "primary-loopback",
        "cidr",
        "other-family-not-mentioned",
        "match-all",
        "match-all-wins",
        "match-all-v6",
        "cidrs-ignore-primary",
        "dual-stack-list",
    ],
)
def test_for_family(
    values: list[str], family: IPFamily, primary_ip: str | None, expected: FamilyNodePorts
) -> None:
    assert NodePortAddresses.parse(values).for_family(family, primary_ip) == expected


@pytest.mark.parametrize(
    ("ports", "enabled"),
    [
        (FamilyNodePorts(True, ()), True),
        (FamilyNodePorts(False, ("10.0.0.1/32",)), True),
        (FamilyNodePorts(False, ()), False),
    ],
    ids=["match-all", "ranges", "none"],
)
def test_enabled(ports: FamilyNodePorts, enabled: bool) -> None:
    assert ports.enabled is enabled


@pytest.mark.parametrize("values", [[], ["primary"], ["10.0.0.0/8", "fd00::/64"]])
def test_str_round_trips(values: list[str]) -> None:
    npa = NodePortAddresses.parse(values)
    assert NodePortAddresses.parse([str(npa)]) == npa


def test_default_is_primary_and_an_empty_flag_every_address() -> None:
    assert NodePortAddresses() == NodePortAddresses.parse(["primary"])
    assert str(NodePortAddresses()) == "primary"
    # Nothing given (iptables and ipvs modes' default): every local address.
    every = NodePortAddresses.parse([])
    assert every.for_family(IPFamily.IPv4, "10.0.0.1").match_all
    assert every.for_family(IPFamily.IPv6, None).match_all


@pytest.mark.parametrize(
    ("values", "families", "wanted", "route_localnet"),
    [
        ([], (V4,), True, True),  # every local address: 127.0.0.1 among them
        (["127.0.0.0/8", "10.0.0.0/8"], (V4,), True, True),
        (["0.0.0.0/0"], (V4,), True, True),
        (["fd00::/8"], (V4,), True, True),  # no IPv4 CIDR: every IPv4 address
        # CVE-2020-8558: never when the IPv4 NodePort addresses leave loopback out.
        (["10.0.0.0/8"], (V4,), True, False),
        (["primary"], (V4,), True, False),
        (["primary", "10.0.0.0/8"], (V4,), True, False),
        (["primary", "localhost"], (V4,), True, True),
        (["all"], (V4,), True, True),
        # upstream: a loopback network, or one holding 127.0.0.0
        (["127.0.0.5/32"], (V4,), True, True),
        (["96.0.0.0/3"], (V4,), True, True),
        (["128.0.0.0/1"], (V4,), True, False),
        ([], (V4,), False, False),  # iptables.localhostNodePorts false, or not iptables
        ([], (V6,), True, False),  # IPv4 not served: no IPv4 localhost NodePorts
    ],
)
def test_route_localnet_is_wanted_only_with_ipv4_localhost_nodeports(
    values: list[str], families: tuple[IPFamily, ...], wanted: bool, route_localnet: bool
) -> None:
    """One decision for the plan's localhost rules and the sysctl (upstream's
    ContainsIPv4Loopback, per its IPv4 proxier)."""
    addresses = NodePortAddresses.parse(values)
    settings = PlanSettings(
        families=families, nodeport_addresses=addresses, localhost_nodeports=wanted
    )
    assert settings.route_localnet is route_localnet
    assert addresses.serves_localhost(V6, wanted) is False
    if V4 in families:
        plan = family_plans(settings, Snapshot({}, {}, NodeState("node-a")))[0]
        assert plan.localhost_nodeports is route_localnet


@pytest.mark.parametrize(
    ("values", "written"), [([], "1"), (["127.0.0.1/32"], "1"), (["10.0.0.0/8"], "0")]
)
def test_iptables_init_node_writes_route_localnet_only_when_the_plan_serves_localhost(
    tmp_path: Path, values: list[str], written: str
) -> None:
    sysctl = tmp_path / "sys/net/ipv4/conf/all/route_localnet"
    sysctl.parent.mkdir(parents=True)
    sysctl.write_text("0\n")
    config = ProxyConfig(
        "node-a", mode=ProxyMode.IPTABLES, nodeport_addresses=NodePortAddresses.parse(values)
    )
    init_node(config, tmp_path)
    assert sysctl.read_text().strip() == written
