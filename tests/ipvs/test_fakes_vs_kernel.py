"""The IPVS and ipset fakes against the guest's kernel (Linux 6.1): every case of
tests/ipvs_fake_cases.py runs step by step on NetlinkIpvs/NetlinkLinks in a fresh
namespace and on FakeIpvs/FakeLinks, and both must do what the table says and end each
step in the same state (tests/parity.py)."""

from __future__ import annotations

import pytest

from kubeproxy.dataplane.ipvs.fake import FakeIpvs, FakeLinks
from kubeproxy.dataplane.ipvs.netlink import NetlinkIpvs, NetlinkLinks
from tests import ipvs_fake_cases as ipvs
from tests.parity import Case, check_both


@pytest.mark.parametrize("case", ipvs.CASES, ids=str)
def test_ipvs_fake_agrees_with_the_kernel(case: Case[ipvs.IpvsSystem], netns: str) -> None:
    real = ipvs.IpvsSystem(NetlinkIpvs(netns), NetlinkLinks(netns))
    try:
        check_both(ipvs.TABLE, case, real, ipvs.IpvsSystem(FakeIpvs(), FakeLinks()))
    finally:
        real.ipvs.close()
        real.links.close()
