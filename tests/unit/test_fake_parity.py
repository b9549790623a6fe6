"""The smaller fakes, without root: every case of their tables (tests/parity.py) does
on the fake what the table says the kernel does. The same tables run against the real
thing as root: IPVS and ipset in the user-mode-linux guest (tests/ipvs/), BPF maps and
nfacct on the host (tests/kernel/)."""

from __future__ import annotations

import pytest

from kubeproxy.dataplane.bpf.socklb import FakeMap
from kubeproxy.dataplane.ipset.fake import FakeIpset
from kubeproxy.dataplane.iptables.fake import FakeIptables
from kubeproxy.dataplane.iptables.runner import Flavor
from kubeproxy.dataplane.ipvs.fake import FakeIpvs, FakeLinks
from kubeproxy.dataplane.nfacct import FakeNfacct
from kubeproxy.model.types import IPFamily
from tests import bpf_map_cases as bpf
from tests import ipset_fake_cases as ipset
from tests import ipvs_fake_cases as ipvs
from tests import nfacct_fake_cases as nfacct
from tests.parity import Case, check_fake


@pytest.mark.parametrize("case", ipvs.CASES, ids=str)
def test_ipvs_case(case: Case[ipvs.IpvsSystem]) -> None:
    check_fake(ipvs.TABLE, case, ipvs.IpvsSystem(FakeIpvs(), FakeLinks()))


def fake_ipset() -> ipset.IpsetSystem:
    fake = FakeIpset()
    return ipset.IpsetSystem(fake, fake.in_use.add)


@pytest.mark.parametrize("case", ipset.CASES, ids=str)
def test_ipset_case(case: Case[ipset.IpsetSystem]) -> None:
    check_fake(ipset.TABLE, case, fake_ipset())


@pytest.mark.parametrize("case", bpf.CASES, ids=str)
def test_bpf_map_case(case: Case[bpf.MapSystem]) -> None:
    check_fake(bpf.TABLE, case, bpf.MapSystem(FakeMap))


def fake_nfacct(flavor: Flavor) -> nfacct.NfacctSystem:
    counters = FakeNfacct()
    iptables = FakeIptables(IPFamily.IPv4, flavor)
    iptables.nfacct_counters = counters.counters
    return nfacct.NfacctSystem(counters, iptables)


@pytest.mark.parametrize(
    ("flavor", "case"), nfacct.CASES, ids=[f"{f}-{c}" for f, c in nfacct.CASES]
)
def test_nfacct_case(flavor: Flavor, case: Case[nfacct.NfacctSystem]) -> None:
    check_fake(nfacct.TABLE, case, fake_nfacct(flavor))
