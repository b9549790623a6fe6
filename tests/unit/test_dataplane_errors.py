"""The data-plane tools' errors share one root, DataplaneError (issue 24), and keep the
base classes their callers catch them by."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

import kubeproxy.dataplane.ipset as ipset_module
from kubeproxy.dataplane.bpf.build import BuildError
from kubeproxy.dataplane.bpf.libbpf import BpfError
from kubeproxy.dataplane.bpf.socklb import SockLBError
from kubeproxy.dataplane.conntrack import ConntrackError
from kubeproxy.dataplane.errors import DataplaneError, DataplaneInputError
from kubeproxy.dataplane.hns import HnsError
from kubeproxy.dataplane.ipset import IpsetCommand, IpsetError
from kubeproxy.dataplane.iptables.cleanup import CleanupError
from kubeproxy.dataplane.iptables.listing import UnreadableTableError
from kubeproxy.dataplane.iptables.restore import RestoreError
from kubeproxy.dataplane.iptables.rules import RuleError
from kubeproxy.dataplane.iptables.runner import IptablesError
from kubeproxy.dataplane.ipvs import IpvsError
from kubeproxy.dataplane.nfacct import NfacctError
from kubeproxy.dataplane.nftables.runner import NftError
from kubeproxy.dataplane.nftables.transaction import ScriptError
from kubeproxy.dataplane.process import ToolError, run_tool

RUNTIME: list[DataplaneError] = [
    ToolError("x", "nft"),
    NftError("x", "script"),
    IptablesError("x"),
    CleanupError(["x"], []),
    IpsetError("x"),
    IpvsError("x"),
    ConntrackError("x"),
    NfacctError("x"),
    SockLBError("x"),
    BuildError("x"),
    BpfError(errno.ENOENT, "x"),
    UnreadableTableError("x"),
    HnsError("x"),
]
INPUT: list[DataplaneError] = [ScriptError("x"), RuleError("x"), RestoreError("x")]


@pytest.mark.parametrize("err", RUNTIME + INPUT, ids=lambda e: type(e).__name__)
def test_every_tool_error_is_a_dataplane_error_naming_its_tool(err: Exception) -> None:
    assert isinstance(err, DataplaneError)
    assert isinstance(err, RuntimeError)
    assert err.tool
    assert err.incomplete is isinstance(err, ToolError)


@pytest.mark.parametrize("err", [*INPUT, UnreadableTableError("x")], ids=lambda e: type(e).__name__)
def test_the_former_value_errors_stay_value_errors(err: Exception) -> None:
    assert isinstance(err, ValueError)
    assert isinstance(err, DataplaneInputError) is (type(err) is not UnreadableTableError)


def test_bpf_error_stays_an_os_error_with_its_errno() -> None:
    err = BpfError(errno.EEXIST, "update: the key exists")
    assert isinstance(err, OSError)
    assert err.errno == errno.EEXIST
    assert err.strerror == "update: the key exists"
    assert err.tool == "libbpf"


def test_the_attributes_of_each_tool_are_kept() -> None:
    nft = NftError("refused", "add table ip t", incomplete=True)
    assert (nft.script, nft.incomplete, nft.tool) == ("add table ip t", True, "nft")
    ipt = IptablesError("refused", "*nat", line=3, table="nat", committed=("filter",))
    assert (ipt.input, ipt.line, ipt.table, ipt.committed, ipt.incomplete) == (
        "*nat",
        3,
        "nat",
        ("filter",),
        False,
    )
    assert IpvsError("gone", errno.ESRCH).errno == errno.ESRCH
    ipset = IpsetError("refused", 7, missing=True)
    assert (ipset.line, ipset.missing, ipset.incomplete) == (7, True, False)


def test_a_missing_binary_is_an_incomplete_tool_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="not found") as caught:
        run_tool(str(tmp_path / "no-such-tool"), [], timeout=5, package="none")
    assert (caught.value.tool, caught.value.incomplete) == ("no-such-tool", True)


def test_a_tool_that_cannot_run_makes_the_wrapper_error_incomplete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing(binary: str, *args: object, **kwargs: object) -> None:
        raise ToolError(f"{binary} not found (install the ipset package)", binary)

    monkeypatch.setattr(ipset_module, "run_tool", missing)
    with pytest.raises(IpsetError, match="not found") as caught:
        IpsetCommand().version()
    assert (caught.value.missing, caught.value.incomplete) == (True, True)
