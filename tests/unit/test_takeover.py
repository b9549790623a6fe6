"""Start-up safety (issue 22), without root: what a mode checks before it touches the
node, what a cleanup of the other modes leaves to the running one, and how long the
lines about it are. The kernel side (real traffic through such starts) is
tests/kernel/test_takeover.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kubeproxy.backends.base import BackendError
from kubeproxy.backends.iptables.proxier import IptablesBackend
from kubeproxy.backends.iptables.proxier import owned as iptables_owned
from kubeproxy.backends.iptables.runners import working_runners
from kubeproxy.backends.ipvs.proxier import owned as ipvs_owned
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.backends.registry import removal_summary
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.bpf.socklb import SockLBError, _pin_dir_ready
from kubeproxy.dataplane.iptables.cleanup import cleanup_chains
from kubeproxy.dataplane.iptables.fake import FakeIptables
from kubeproxy.dataplane.iptables.runner import Flavor, Iptables
from kubeproxy.dataplane.nftables.fake import FakeNftables
from kubeproxy.logs import KlogFormatter, bounded
from kubeproxy.model.types import IPFamily
from tests.iptables_fake_cases import restore

V4 = IPFamily.IPv4


def test_nftables_mode_refuses_a_kernel_older_than_5_13() -> None:
    # Upstream's NFTablesKubeProxyKernelVersion: refused before anything is touched.
    old = NftablesBackend(ProxyConfig("node-a"), FakeNftables(), release="5.10.0-28-amd64")
    with pytest.raises(BackendError, match=r"needs kernel 5\.13 or later \(this one is 5\.10\.0\)"):
        old.start()
    NftablesBackend(ProxyConfig("node-a"), FakeNftables(), release="5.13.0").start()


# ----------------------------------------------------------- iptables flavour


def _runners(flavor: Flavor, broken: str | None = None) -> dict[IPFamily, Iptables]:
    return {f: FakeIptables(f, flavor, broken=broken) for f in (V4, IPFamily.IPv6)}


def test_auto_keeps_a_detected_flavour_that_works() -> None:
    runners = _runners("nft")
    assert working_runners(runners, _runners) == runners


def test_auto_switches_to_the_other_flavour_when_the_detected_one_cannot_write(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The user-mode-Linux guest: nf_tables without the ip family. iptables-nft lists
    # fine, then every write says "TABLE_ADD failed (Operation not supported)".
    broken = "iptables-nft-restore: TABLE_ADD failed (Operation not supported): table nat"
    with caplog.at_level(logging.WARNING):
        chosen = working_runners(_runners("nft", broken), _runners)
    assert {r.flavor for r in chosen.values()} == {"legacy"}
    assert "using iptables-legacy" in caplog.text and "TABLE_ADD failed" in caplog.text


def test_auto_with_neither_flavour_working_refuses_with_both_reasons() -> None:
    with pytest.raises(BackendError, match=r"nft: no nft.*legacy: no legacy"):
        working_runners(_runners("nft", "no nft"), lambda flavor: _runners(flavor, f"no {flavor}"))


def test_an_explicit_flavour_is_not_second_guessed() -> None:
    # --iptables-backend nft: no reopen; start() then fails on the broken kernel itself.
    runners = _runners("nft", "broken")
    assert working_runners(runners, None) == runners


def test_iptables_mode_start_uses_the_working_flavour(tmp_path: Path) -> None:
    backend = IptablesBackend(
        ProxyConfig("node-a", mode=ProxyMode.IPTABLES, localhost_nodeports=False),
        _runners("nft", "broken"),
        reopen=_runners,
        proc=tmp_path,
    )
    backend.start()
    assert {r.flavor for r in backend.runners.values()} == {"legacy"}


# ------------------------------------------- cleanup of the other modes' rules


def _ipvs_mode_left() -> FakeIptables:
    """What ipvs mode leaves in iptables (its chain names, shared or not)."""
    fake = FakeIptables()
    portals = '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES'
    fake.restore(
        restore(
            nat=[
                ":KUBE-SERVICES",
                ":KUBE-POSTROUTING",
                ":KUBE-MARK-MASQ",
                ":KUBE-NODE-PORT",
                ":KUBE-LOAD-BALANCER",
                "-A KUBE-SERVICES -j KUBE-NODE-PORT",
                f"-A PREROUTING {portals}",
                f"-A OUTPUT {portals}",
            ],
            filter=[
                ":KUBE-FORWARD",
                ":KUBE-IPVS-FILTER",
                '-A INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER',
            ],
        )
    )
    return fake


def test_a_cleanup_after_the_first_sync_leaves_what_the_running_mode_shares() -> None:
    # Running iptables mode: ipvs mode's leftovers go, but not nat KUBE-SERVICES and its
    # jumps (same names, now iptables mode's rules), or the cleanup would cut the node.
    from kubeproxy.backends.ipvs.proxier import _jumps, cleanup_is_ours

    fake = _ipvs_mode_left()
    # The running mode's sync rewrote the shared chain (no jump to ipvs's chains left).
    fake.restore(restore(nat=[":KUBE-SERVICES", "-A KUBE-SERVICES -j RETURN"]))
    removed = cleanup_chains(fake, cleanup_is_ours, _jumps(), iptables_owned())
    assert "chain nat KUBE-NODE-PORT" in removed
    assert "chain filter KUBE-IPVS-FILTER" in removed
    assert not any("KUBE-SERVICES" in item for item in removed), removed
    left = fake.chains("nat")
    assert {"KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"} <= left
    assert "KUBE-NODE-PORT" not in left and "KUBE-LOAD-BALANCER" not in left
    assert "KUBE-FORWARD" in fake.chains("filter")
    nat = fake.save("nat")
    assert nat.count("-j KUBE-SERVICES") == 2  # both portal jumps stay


def test_without_a_running_mode_everything_goes() -> None:
    from kubeproxy.backends.ipvs.proxier import _jumps, cleanup_is_ours

    fake = _ipvs_mode_left()
    cleanup_chains(fake, cleanup_is_ours, _jumps())
    assert not {c for c in fake.chains("nat") if c.startswith("KUBE-")}


def test_each_mode_owns_its_fixed_chains_and_jumps() -> None:
    # The chains both modes have by name: each mode's "keep" holds them.
    both = {("nat", "KUBE-SERVICES"), ("nat", "KUBE-POSTROUTING"), ("filter", "KUBE-FORWARD")}
    assert both <= iptables_owned().chains
    assert both <= ipvs_owned().chains
    assert ("filter", "KUBE-SERVICES") in iptables_owned().chains  # iptables mode's only
    assert ("filter", "KUBE-SERVICES") not in ipvs_owned().chains
    shared_jumps = iptables_owned().jumps & ipvs_owned().jumps
    assert ("nat", "PREROUTING") in {(t, c) for t, c, _ in shared_jumps}


# ---------------------------------------------------------------- log lines


def test_a_cleanup_of_5000_services_is_one_short_line() -> None:
    # Before: the whole list of Python reprs, 2 MB at 5,000 Services.
    removed = [f"IptablesCommand(IPv4, nft): chain nat KUBE-SVC-{i:016d}" for i in range(5000)]
    removed += [
        f"IptablesCommand(IPv4, nft): rule nat OUTPUT -j KUBE-SERVICES #{i}" for i in (1, 2)
    ]
    removed.append("table ip kube-proxy")
    line = removal_summary(removed)
    assert len(line) < 1024
    assert line.startswith("5,003 removed: 5,000 chains, 2 rules, 1 table (")
    assert "KUBE-SVC-0000000000000000" in line and line.endswith(", ...)")


def test_no_log_line_exceeds_4_kib() -> None:
    # Container runtimes split lines over 16 KiB; shippers cut them: whatever a message
    # holds, the line stays short and says how much it left out.
    record = logging.LogRecord("kubeproxy", logging.ERROR, "x.py", 1, "%s", ("y" * 100_000,), None)
    line = KlogFormatter().format(record)
    assert len(line.encode()) < 4096
    assert line.endswith("... [97000 more characters]")
    assert bounded("short") == "short"


# ------------------------------------------------------------ BPF filesystem


def test_no_bpf_filesystem_is_mounted_on_an_empty_parent(tmp_path: Path) -> None:
    # As Cilium: /sys/fs/bpf exists but nothing is mounted there.
    root = tmp_path / "bpf"
    root.mkdir()
    mounted: list[Path] = []
    _pin_dir_ready(root / "kubeproxy", mount=mounted.append)
    assert mounted == [root]
    assert (root / "kubeproxy").is_dir()


def test_a_parent_with_files_is_never_mounted_over(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("")
    mounted: list[Path] = []
    with pytest.raises(SockLBError, match="not on a BPF filesystem"):
        _pin_dir_ready(tmp_path / "kubeproxy", mount=mounted.append)
    assert mounted == []


def test_a_failed_mount_says_why(tmp_path: Path) -> None:
    def refuse(path: Path) -> None:
        raise PermissionError(1, "Operation not permitted")

    with pytest.raises(SockLBError, match=r"mounting one on .* failed: Operation not permitted"):
        _pin_dir_ready(tmp_path / "kubeproxy", mount=refuse)
