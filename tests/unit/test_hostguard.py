"""tests/hostguard.py: the suite's guard fails a run that changes the host, says after
which module, and puts the host back. Driven on a /proc/sys/net of its own (a directory):
this test changes nothing of the machine's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.hostguard import HostGuard, differences


def proc_net(root: Path) -> Path:
    for relative, value in (
        ("ipv4/conf/all/route_localnet", "0"),
        ("ipv4/ip_forward", "0"),
        ("netfilter/nf_conntrack_tcp_be_liberal", "0"),
        ("netfilter/nf_conntrack_count", "12"),
    ):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    return root


def test_a_changed_sysctl_fails_the_run_names_the_module_and_is_put_back(
    tmp_path: Path,
) -> None:
    root = proc_net(tmp_path)
    guard = HostGuard(proc_net=root)
    session = SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    guard.pytest_sessionstart(session)  # type: ignore[arg-type]
    guard.check("tests/unit/test_quiet.py")
    assert guard.changes == {}
    (root / "ipv4/conf/all/route_localnet").write_text("1")
    (root / "netfilter/nf_conntrack_count").write_text("99")  # moves by itself: not a change
    guard.check("tests/kernel/test_noisy.py")
    assert guard.changes == {
        "tests/kernel/test_noisy.py": ["net.ipv4.conf.all.route_localnet: '0' -> '1'"]
    }
    assert (root / "ipv4/conf/all/route_localnet").read_text() == "0"
    guard.check("tests/kernel/test_after.py")  # restored: nothing more to say
    assert list(guard.changes) == ["tests/kernel/test_noisy.py"]
    guard.pytest_sessionfinish(session)  # type: ignore[arg-type]
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED


def test_a_ruleset_difference_names_the_lines() -> None:
    before = {"rules nftables": "table inet mine {\n}", "x": "1"}
    after = {"rules nftables": "table inet mine {\n}\ntable ip kube-proxy {\n}", "x": "1"}
    assert differences(before, after) == ["rules nftables changed: + table ip kube-proxy {"]
    assert differences(before, before) == []


def test_a_list_of_names_difference_names_what_came_and_went() -> None:
    key = "/var/cache/kubeproxy/manifests"
    before = {key: "a.cache b.cache", "links": "eth0 lo"}
    after = {key: "b.cache c.cache", "links": "eth0 lo vp0"}
    assert differences(before, after) == [
        f"{key} changed: + c.cache; - a.cache",
        "links changed: + vp0",
    ]


def test_a_mount_a_pin_or_a_run_entry_left_behind_is_named_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import hostguard

    before = {"mounts": "/ /proc", "/sys/fs/bpf": "", "/run/kubeproxy*": ""}
    after = {
        "mounts": "/ /proc /tmp/kpt1/bpf",
        "/sys/fs/bpf": "/sys/fs/bpf/kubeproxy",
        "/run/kubeproxy*": "kubeproxy-legacy",
    }
    assert differences(before, after) == [
        "/run/kubeproxy* changed: + kubeproxy-legacy",
        "/sys/fs/bpf changed: + /sys/fs/bpf/kubeproxy",
        "mounts changed: + /tmp/kpt1/bpf",
    ]
    calls: list[list[str]] = []
    pin = tmp_path / "bpf" / "kubeproxy"
    pin.parent.mkdir()
    pin.write_text("")
    run = tmp_path / "run"
    (run / "kubeproxy-legacy").mkdir(parents=True)
    after["/sys/fs/bpf"] = str(pin)
    monkeypatch.setattr(hostguard, "_run", lambda command, stdin=None: calls.append(command))
    monkeypatch.setattr(hostguard, "RUN", run)
    hostguard.restore(before, after, {}, tmp_path)
    assert calls == [["umount", "--lazy", "/tmp/kpt1/bpf"]]
    assert not pin.exists() and not (run / "kubeproxy-legacy").exists()
