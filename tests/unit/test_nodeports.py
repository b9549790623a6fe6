"""kubeproxy.model.nodeports: the --nodeport-addresses flag, parsed and resolved per family."""

from __future__ import annotations

import pytest

from kubeproxy.model.nodeports import FamilyNodePorts, NodePortAddresses
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


@pytest.mark.parametrize("values", [["primary", "10.0.0.0/8"], ["10.0.0.0/8,primary"]])
def test_primary_and_cidrs_do_not_mix(values: list[str]) -> None:
    # As upstream's validation: "can't use both 'primary' and CIDRs".
    with pytest.raises(ValueError, match="both 'primary' and CIDRs"):
        NodePortAddresses.parse(values)


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
