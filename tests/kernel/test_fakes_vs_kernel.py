"""The BPF map and nfacct fakes against the host's kernel: every case of
tests/bpf_map_cases.py runs step by step on MapFd over a hash map created for the case
and on FakeMap; every case of tests/nfacct_fake_cases.py on the nfacct tool and
iptables in a scratch namespace and on FakeNfacct/FakeIptables. Both sides must do what
the table says and end each step in the same state (tests/parity.py)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator

import pytest

from kubeproxy.dataplane.bpf import libbpf
from kubeproxy.dataplane.bpf.socklb import FakeMap, KVMap
from kubeproxy.dataplane.iptables.runner import Flavor, IptablesCommand
from kubeproxy.dataplane.nfacct import NfacctCommand
from kubeproxy.lab.rulestate import empty_rules
from kubeproxy.model.types import IPFamily
from tests import bpf_map_cases as bpf
from tests import nfacct_fake_cases as nfacct
from tests.conftest import require_tool
from tests.kernel.conftest import scratch_netns
from tests.parity import Case, check_both
from tests.unit.test_fake_parity import fake_nfacct

BPF_MAP_TYPE_HASH = 1


@pytest.fixture
def real_maps() -> Iterator[bpf.MakeMap]:
    """Makes hash maps in the kernel (libbpf's bpf_map_create); closed afterwards."""
    create = libbpf.lib().lib.bpf_map_create
    create.restype = ctypes.c_int
    create.argtypes = [ctypes.c_int, ctypes.c_char_p, *[ctypes.c_uint32] * 3, ctypes.c_void_p]
    fds: list[int] = []

    def make(key_size: int, value_size: int, max_entries: int) -> KVMap:
        fd = create(BPF_MAP_TYPE_HASH, b"kp_parity", key_size, value_size, max_entries, None)
        if fd < 0:
            raise OSError(ctypes.get_errno(), f"bpf_map_create: {os.strerror(ctypes.get_errno())}")
        fds.append(fd)
        return libbpf.MapFd(fd, "kp_parity", key_size, value_size)

    yield make
    for fd in fds:
        os.close(fd)


@pytest.mark.parametrize("case", bpf.CASES, ids=str)
def test_bpf_map_fake_agrees_with_the_kernel(
    case: Case[bpf.MapSystem], real_maps: bpf.MakeMap
) -> None:
    check_both(bpf.TABLE, case, bpf.MapSystem(real_maps), bpf.MapSystem(FakeMap))


@pytest.fixture
def netns() -> Iterator[str]:
    yield from scratch_netns("kpnfacct")


@pytest.mark.parametrize(
    ("flavor", "case"), nfacct.CASES, ids=[f"{f}-{c}" for f, c in nfacct.CASES]
)
def test_nfacct_fake_agrees_with_the_kernel(
    flavor: Flavor, case: Case[nfacct.NfacctSystem], netns: str
) -> None:
    require_tool("nfacct")
    empty_rules(netns, f"iptables-{flavor}")
    real = nfacct.NfacctSystem(
        NfacctCommand(netns), IptablesCommand(IPFamily.IPv4, flavor, netns=netns)
    )
    check_both(nfacct.TABLE, case, real, fake_nfacct(flavor))
