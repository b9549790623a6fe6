"""What the guest's kernel offers the iptables side of ipvs mode, checked once.

The IPVS tests depend on these facts (docs/kernel-requirements.md): ipsets with the
types upstream's ipvs mode uses, matched from iptables-legacy rules; no nf_tables ip
family (so nothing may use ``nft`` or ``iptables-nft`` in the guest).
"""

from __future__ import annotations

import pytest

from kubeproxy.lab.netns import LabError, ns_exec
from tests.ipvs.conftest import IPTABLES

SET_TYPES = ("hash:ip,port", "hash:ip,port,ip", "hash:ip,port,net", "hash:net", "bitmap:port")


def test_ipsets_matched_from_iptables_legacy(netns: str) -> None:
    ns = netns
    script = "".join(
        f"create KP-TEST-{i} {kind}{' range 0-65535' if kind == 'bitmap:port' else ''}\n"
        for i, kind in enumerate(SET_TYPES)
    )
    ns_exec(ns, "ipset", "restore", input=script + "add KP-TEST-0 10.96.0.10,tcp:80\n")
    ns_exec(
        ns,
        IPTABLES,
        *("-t", "nat", "-A", "OUTPUT", "-m", "set", "--match-set", "KP-TEST-0", "dst,dst"),
        *("-j", "ACCEPT"),
    )
    assert "KP-TEST-0 dst,dst" in ns_exec(ns, f"{IPTABLES}-save", "-t", "nat")


def test_no_nftables_ip_family(netns: str) -> None:
    with pytest.raises(LabError, match=r"Operation not supported|No such file"):
        ns_exec(netns, "nft", "add", "table", "ip", "kp-test")
