"""The IPVS and ipset fakes against the guest's kernel (Linux 6.1): every case of
tests/ipvs_fake_cases.py runs step by step on NetlinkIpvs/NetlinkLinks in a fresh
namespace and on FakeIpvs/FakeLinks, every case of tests/ipset_fake_cases.py on ipset
7.17 there and on FakeIpset; both must do what the table says and end each step in the
same state (tests/parity.py)."""

from __future__ import annotations

import pytest

from kubeproxy.dataplane.ipset import IpsetCommand
from kubeproxy.dataplane.ipvs.fake import FakeIpvs, FakeLinks
from kubeproxy.dataplane.ipvs.netlink import NetlinkIpvs, NetlinkLinks
from kubeproxy.lab.netns import ns_exec
from tests import ipset_fake_cases as ipset
from tests import ipvs_fake_cases as ipvs
from tests.ipvs.conftest import IPTABLES
from tests.parity import Case, check_both
from tests.unit.test_fake_parity import fake_ipset


@pytest.mark.parametrize("case", ipvs.CASES, ids=str)
def test_ipvs_fake_agrees_with_the_kernel(case: Case[ipvs.IpvsSystem], netns: str) -> None:
    real = ipvs.IpvsSystem(NetlinkIpvs(netns), NetlinkLinks(netns))
    try:
        check_both(ipvs.TABLE, case, real, ipvs.IpvsSystem(FakeIpvs(), FakeLinks()))
    finally:
        real.ipvs.close()
        real.links.close()


@pytest.mark.parametrize("case", ipset.CASES, ids=str)
def test_ipset_fake_agrees_with_the_kernel(case: Case[ipset.IpsetSystem], netns: str) -> None:
    def reference(name: str) -> None:
        rule = ("-A", "INPUT", "-m", "set", "--match-set", name, "src", "-j", "ACCEPT")
        ns_exec(netns, IPTABLES, *rule)

    real = ipset.IpsetSystem(IpsetCommand(netns), reference)
    check_both(ipset.TABLE, case, real, fake_ipset())
