"""kubeproxy.explain.running: ``--live`` compares with the proxy mode running here."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeproxy.config.runtime import ConfigError
from kubeproxy.dataplane.bpf.socklb import map_pin
from kubeproxy.dataplane.process import ToolError
from kubeproxy.explain.running import Found, kernel_modes, proxy_mode_url, running_mode

NAT_WITH_SERVICES = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\nCOMMIT\n"
NAT_WITHOUT = "*filter\n:KUBE-SERVICES - [0:0]\nCOMMIT\n*nat\n:KUBE-MARK-DROP - [0:0]\nCOMMIT\n"


def kernel(*present: str, legacy: str = "", nft: str = ""):  # type: ignore[no-untyped-def]
    """A reader of a kernel holding ``present``: "table ip", "table ip6", "kube-ipvs0"."""

    def read(binary: str, args: list[str]) -> str:
        if binary == "nft" and f"table {args[-2]}" in present:
            return "{}"
        if binary == "ip" and "kube-ipvs0" in present:
            return "[]"
        if binary == "iptables-legacy-save":
            return legacy
        if binary == "iptables-nft-save":
            return nft
        raise ToolError(f"{binary}: no")

    return read


@pytest.mark.parametrize(
    ("held", "modes"),
    [
        (kernel("table ip"), ["nftables"]),
        (kernel("table ip6"), ["nftables"]),
        (kernel(nft=NAT_WITH_SERVICES), ["iptables"]),
        (kernel(legacy=NAT_WITH_SERVICES), ["iptables"]),
        (kernel(legacy=NAT_WITHOUT), []),  # KUBE-SERVICES of the filter table: not a proxy
        (kernel("kube-ipvs0", legacy=NAT_WITH_SERVICES), ["ipvs"]),
        (kernel("table ip", legacy=NAT_WITH_SERVICES), ["nftables", "iptables"]),
        (kernel(), []),
    ],
)
def test_the_kernel_tells_the_mode(held, modes: list[str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert kernel_modes(held, tmp_path) == modes


def test_pinned_socket_maps_make_it_ebpf_mode(tmp_path: Path) -> None:
    map_pin(tmp_path, "kp_svc4").touch()
    assert kernel_modes(kernel("table ip"), tmp_path) == ["ebpf"]


def test_the_running_proxy_is_asked_first(tmp_path: Path) -> None:
    asked: list[str] = []

    def fetch(url: str) -> str | None:
        asked.append(url)
        return "ipvs"

    found = running_mode("0.0.0.0:10249", tmp_path, read=kernel("table ip"), fetch=fetch)
    assert found == Found("ipvs", "the running proxy's http://127.0.0.1:10249/proxyMode says so")
    assert asked == ["http://127.0.0.1:10249/proxyMode"]


def test_without_a_proxy_the_kernel_decides(tmp_path: Path) -> None:
    found = running_mode("127.0.0.1:10249", tmp_path, read=kernel("table ip"), fetch=lambda _: None)
    assert found == Found("nftables", "the kernel holds that mode's rules, and no other's")


@pytest.mark.parametrize(
    ("held", "why"),
    [
        (kernel(), "the kernel holds no kubeproxy rules"),
        (
            kernel("table ip", nft=NAT_WITH_SERVICES),
            "the kernel holds the rules of nftables and iptables modes",
        ),
    ],
)
def test_no_answer_or_two_ask_for_proxy_mode(held, why: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as err:
        running_mode("127.0.0.1:10249", tmp_path, read=held, fetch=lambda _: None)
    assert str(err.value) == (
        "--live: cannot tell which proxy mode runs on this node (no proxy answers "
        f"http://127.0.0.1:10249/proxyMode; {why}): give --proxy-mode"
    )


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("127.0.0.1:10249", "http://127.0.0.1:10249/proxyMode"),
        ("[::]:10249", "http://127.0.0.1:10249/proxyMode"),  # every address: loopback too
        ("192.168.50.1:9000", "http://192.168.50.1:9000/proxyMode"),
        ("", None),
    ],
)
def test_where_the_proxy_is_asked(address: str, url: str | None) -> None:
    assert proxy_mode_url(address) == url
