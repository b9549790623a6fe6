"""The differential's configurations: every one a command line both proxies take, each
naming a flag kube-proxy v1.37 has (upstream's own binary is asked in the realk8s tier,
tests/realk8s/test_differential.py, which runs CI's configurations)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kubeproxy.lab.kube.differential.configs import (
    CI_CONFIGURATIONS,
    CONFIGURATIONS,
    DEFAULT,
    Configuration,
    named,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("config", [*CONFIGURATIONS, *CI_CONFIGURATIONS], ids=lambda c: c.name)
def test_kubeproxy_takes_every_configurations_flags(config: Configuration, tmp_path: Path) -> None:
    written = tmp_path / "config.yaml"
    mode = config.modes[0]
    command = [
        sys.executable, "-m", "kubeproxy", "run", "--manifests", str(ROOT / "examples"),
        "--proxy-mode", mode, "--write-config-to", str(written), *config.flags,
    ]  # fmt: skip
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"mode: {mode}" in written.read_text()


def test_configurations_are_found_by_name_and_unknown_names_refused() -> None:
    assert named(["defaults", "masquerade-all"])[0] is DEFAULT
    with pytest.raises(ValueError, match=r"unknown configuration\(s\) \['nope'\]"):
        named(["defaults", "nope"])
    (off,) = named(["localhost-nodeports-off"])
    assert off.applies_to("iptables") and not off.applies_to("nftables")
    assert len({c.name for c in CONFIGURATIONS}) == len(CONFIGURATIONS) >= 20
    # The issue asks for twenty configurations in each mode.
    for mode in ("nftables", "iptables", "ipvs"):
        assert sum(c.applies_to(mode) for c in CONFIGURATIONS) >= 20
