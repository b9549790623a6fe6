"""kernelspace mode's configuration: the ``winkernel:`` section, upstream's Windows
flags, validation (WinDSR, the source VIP), the network name from env KUBE_NETWORK,
the registry row, and the ``preserve-destination`` annotation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kubeproxy.backends.base import SYNC_LOG_WORDS
from kubeproxy.backends.registry import BACKENDS, CLEANUPS, cleanup_all
from kubeproxy.config.codec import loads
from kubeproxy.config.defaults import complete, default_config, mode_settings
from kubeproxy.config.flags import apply_flags
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ConfigError, winkernel_settings
from kubeproxy.config.validation import validate
from kubeproxy.model.parse import parse_service


def test_mode_is_accepted_and_reads_the_iptables_sections_sync_periods() -> None:
    """Upstream's v1alpha1 conversion: a mode other than ipvs/nftables syncs by the
    iptables section's periods."""
    cfg = complete(dataclasses.replace(default_config(), mode="kernelspace"))
    assert validate(cfg) == []
    assert mode_settings(cfg).sync_period == cfg.iptables.sync_period
    assert ProxyMode("kernelspace") is ProxyMode.KERNELSPACE


def test_every_mode_has_a_registry_row() -> None:
    assert set(ProxyMode) == set(BACKENDS) == set(CLEANUPS) == set(SYNC_LOG_WORDS)


def test_cleanup_on_linux_has_nothing_of_kernelspace() -> None:
    assert CLEANUPS[ProxyMode.KERNELSPACE]() == []
    assert cleanup_all({ProxyMode.KERNELSPACE: CLEANUPS[ProxyMode.KERNELSPACE]}) == []


def test_windows_flags_set_the_winkernel_section() -> None:
    """Upstream's options_windows.go names (root-hnsendpoint-name, forward-healthcheck-vip)."""
    flags: dict[str, object] = {
        "proxy-mode": "kernelspace",
        "network-name": "vxlan0",
        "source-vip": "10.244.0.2",
        "enable-dsr": True,
        "root-hnsendpoint-name": "cbr1",
        "forward-healthcheck-vip": True,
    }
    win = apply_flags(default_config(), flags).winkernel
    assert (win.network_name, win.source_vip, win.enable_dsr) == ("vxlan0", "10.244.0.2", True)
    assert (win.root_hns_endpoint_name, win.forward_health_check_vip) == ("cbr1", True)


def test_windows_flags_are_ignored_in_other_modes() -> None:
    warned: list[str] = []
    cfg = apply_flags(
        default_config(), {"proxy-mode": "nftables", "enable-dsr": True}, warn=warned.append
    )
    assert cfg.winkernel.enable_dsr is False
    assert warned == ["--enable-dsr is ignored in proxy mode 'nftables'"]


def test_the_file_section_is_read() -> None:
    text = """
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: kernelspace
winkernel:
  networkName: flannel.4096
  sourceVip: 10.244.0.2
  enableDSR: true
  rootHnsEndpointName: cbr0
  forwardHealthCheckVip: true
"""
    settings = winkernel_settings(complete(loads(text)), env={})
    assert settings.network_name == "flannel.4096"
    assert settings.enable_dsr and settings.forward_health_check_vip


def test_network_name_from_env_as_upstream() -> None:
    cfg = complete(dataclasses.replace(default_config(), mode="kernelspace"))
    assert winkernel_settings(cfg, env={"KUBE_NETWORK": "vxlan0"}).network_name == "vxlan0"
    assert winkernel_settings(cfg, env={}).network_name == ""
    assert winkernel_settings(cfg, env={}).root_hns_endpoint_name == "cbr0"  # upstream's default


def test_hns_state_only_in_kernelspace_mode() -> None:
    with pytest.raises(ConfigError, match="only with --proxy-mode kernelspace"):
        winkernel_settings(complete(default_config()), "state.json", env={})


@pytest.mark.parametrize(
    ("winkernel", "gates", "errors"),
    [
        ({"enable_dsr": True}, {}, []),  # WinDSR is on by default (beta since 1.33)
        (
            {"enable_dsr": True},
            {"WinDSR": False},
            ["winkernel.enableDSR: Invalid value: true: WinDSR feature gate must be enabled"],
        ),
        (
            {"source_vip": "10.244.0.300"},
            {},
            [
                'winkernel.sourceVip: Invalid value: "10.244.0.300": not a valid textual '
                "representation of an IP address"
            ],
        ),
    ],
)
def test_validation(winkernel: dict[str, Any], gates: dict[str, bool], errors: list[str]) -> None:
    cfg = complete(dataclasses.replace(default_config(), mode="kernelspace", feature_gates=gates))
    cfg = dataclasses.replace(cfg, winkernel=dataclasses.replace(cfg.winkernel, **winkernel))
    assert validate(cfg) == errors


def test_winkernel_is_not_validated_in_other_modes() -> None:
    cfg = complete(dataclasses.replace(default_config(), feature_gates={"WinDSR": False}))
    cfg = dataclasses.replace(cfg, winkernel=dataclasses.replace(cfg.winkernel, enable_dsr=True))
    assert validate(cfg) == []


@pytest.mark.parametrize(("value", "preserved"), [("true", True), ("false", False), (None, False)])
def test_preserve_destination_annotation(value: str | None, preserved: bool) -> None:
    meta: dict[str, Any] = {"name": "web", "namespace": "default"}
    if value is not None:
        meta["annotations"] = {"preserve-destination": value}
    svc = parse_service(
        {
            "metadata": meta,
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80, "protocol": "TCP"}]},
        }
    )
    assert svc.ports[0].preserve_destination is preserved
