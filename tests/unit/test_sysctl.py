"""kubeproxy.dataplane.sysctl: conntrack sysctls from the config, under fake /proc and /sys.

The settings are built from v1alpha1 values by kubeproxy.config.runtime.conntrack_settings,
so these tests pin the conversion (whole seconds, truncated; 0 leaves the kernel alone) too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeproxy.config.defaults import default_config
from kubeproxy.config.duration import Duration
from kubeproxy.config.runtime import conntrack_settings
from kubeproxy.config.types import KubeProxyConntrackConfiguration
from kubeproxy.dataplane.sysctl import (
    HASHSIZE,
    NETFILTER,
    ConntrackSettings,
    SysctlResult,
    apply_conntrack_sysctls,
    conntrack_max,
    plan,
)

SECTION = default_config().conntrack
DEFAULTS = conntrack_settings(SECTION)


def ct(**changes: object) -> ConntrackSettings:
    """The defaulted ``conntrack`` section with ``changes`` (v1alpha1 values), as
    kubeproxy.cli hands it to the sysctls."""
    return conntrack_settings(KubeProxyConntrackConfiguration(**{**SECTION.__dict__, **changes}))


@pytest.mark.parametrize(
    ("max_per_core", "minimum", "cpus", "expected"),
    [
        (32768, 131072, 2, 131072),  # the floor wins on a small machine
        (32768, 131072, 8, 262144),
        (0, 131072, 64, 0),  # 0 leaves the limit (and min) alone
        (None, 131072, 64, 0),
        (1000, None, 3, 3000),
        (32768, 131072, 64, 1048576),  # upstream's cap
        (32768, 2000000, 64, 1048576),  # the cap wins over min, as in upstream's code
    ],
)
def test_conntrack_max(
    max_per_core: int | None, minimum: int | None, cpus: int, expected: int
) -> None:
    assert conntrack_max(ct(max_per_core=max_per_core, min=minimum), cpus) == expected


def test_plan_follows_upstreams_order_and_skips_unset_values() -> None:
    assert plan(DEFAULTS, 4) == [
        ("nf_conntrack_max", 131072),
        ("nf_conntrack_tcp_timeout_established", 86400),
        ("nf_conntrack_tcp_timeout_close_wait", 3600),
    ]
    everything = ct(
        tcp_be_liberal=True,
        udp_timeout=Duration.of_seconds(30),
        udp_stream_timeout=Duration.parse("2m0.9s"),  # whole seconds, truncated
    )
    assert plan(everything, 4)[3:] == [
        ("nf_conntrack_tcp_be_liberal", 1),
        ("nf_conntrack_udp_timeout", 30),
        ("nf_conntrack_udp_timeout_stream", 120),
    ]
    nothing = ct(max_per_core=0, tcp_established_timeout=Duration(0), tcp_close_wait_timeout=None)
    assert plan(nothing, 4) == []


def roots(tmp_path: Path, values: dict[str, int], hashsize: int | None) -> tuple[Path, Path]:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    (proc / NETFILTER).mkdir(parents=True)
    for name, value in values.items():
        (proc / NETFILTER / name).write_text(f"{value}\n")
    if hashsize is not None:
        (sys / HASHSIZE).parent.mkdir(parents=True)
        (sys / HASHSIZE).write_text(f"{hashsize}\n")
    return proc, sys


def value(root: Path, relative: str) -> int:
    return int((root / relative).read_text())


def test_apply_writes_changes_skips_equal_values_and_grows_the_hash_table(
    tmp_path: Path,
) -> None:
    proc, sys = roots(
        tmp_path,
        {
            "nf_conntrack_max": 65536,
            "nf_conntrack_tcp_timeout_established": 432000,
            "nf_conntrack_tcp_timeout_close_wait": 3600,
        },
        hashsize=16384,
    )
    results = apply_conntrack_sysctls(DEFAULTS, proc_root=proc, sys_root=sys, cpus=2)
    assert results == [
        SysctlResult(f"{NETFILTER}/nf_conntrack_max", 131072, "set"),
        SysctlResult(HASHSIZE, 32768, "set"),
        SysctlResult(f"{NETFILTER}/nf_conntrack_tcp_timeout_established", 86400, "set"),
        SysctlResult(f"{NETFILTER}/nf_conntrack_tcp_timeout_close_wait", 3600, "unchanged"),
    ]
    assert value(proc, f"{NETFILTER}/nf_conntrack_max") == 131072
    assert value(sys, HASHSIZE) == 32768
    # Second start: nothing to write, and a large enough hash table is left alone.
    again = apply_conntrack_sysctls(DEFAULTS, proc_root=proc, sys_root=sys, cpus=2)
    assert [r.outcome for r in again] == ["unchanged"] * 3


def test_each_failure_is_reported_and_the_rest_still_applied(tmp_path: Path) -> None:
    proc, sys = roots(tmp_path, {"nf_conntrack_tcp_timeout_established": 432000}, hashsize=4)
    # nf_conntrack_max cannot be written (here: a directory, where a netns has EACCES).
    (proc / NETFILTER / "nf_conntrack_max").mkdir()
    results = apply_conntrack_sysctls(
        ct(udp_timeout=Duration.of_seconds(45)), proc_root=proc, sys_root=sys, cpus=2
    )
    assert [(r.path.rsplit("/", 1)[-1], r.outcome) for r in results] == [
        ("nf_conntrack_max", "failed"),
        ("nf_conntrack_tcp_timeout_established", "set"),
        ("nf_conntrack_tcp_timeout_close_wait", "set"),
        ("nf_conntrack_udp_timeout", "set"),
    ]
    assert results[0].error
    # The hash table is only grown after nf_conntrack_max was set.
    assert value(sys, HASHSIZE) == 4


def test_an_unreadable_hashsize_is_reported_not_written(tmp_path: Path) -> None:
    proc, sys = roots(tmp_path, {"nf_conntrack_max": 131072}, hashsize=None)
    results = apply_conntrack_sysctls(
        ct(tcp_established_timeout=Duration(0), tcp_close_wait_timeout=Duration(0)),
        proc_root=proc,
        sys_root=sys,
        cpus=1,
    )
    assert [(r.path, r.outcome) for r in results] == [
        (f"{NETFILTER}/nf_conntrack_max", "unchanged"),
        (HASHSIZE, "failed"),
    ]
    assert not (sys / HASHSIZE).exists()


def test_a_higher_limit_in_place_is_kept(tmp_path: Path) -> None:
    """Upstream only raises nf_conntrack_max (setSysctls: ``curMax < max``): a node whose
    limit is higher keeps it, and nothing is written (in a network namespace, where the
    file is read-only, there is then nothing to fail). The hash table is still checked."""
    proc, sys = roots(tmp_path, {"nf_conntrack_max": 262144}, hashsize=16384)
    results = apply_conntrack_sysctls(
        ct(tcp_established_timeout=Duration(0), tcp_close_wait_timeout=Duration(0)),
        proc_root=proc,
        sys_root=sys,
        cpus=2,
    )
    assert results == [
        SysctlResult(f"{NETFILTER}/nf_conntrack_max", 262144, "unchanged"),
        SysctlResult(HASHSIZE, 32768, "set"),
    ]
    assert value(proc, f"{NETFILTER}/nf_conntrack_max") == 262144
