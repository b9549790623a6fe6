"""``kubeproxy render --proxy-mode kernelspace --hns-state FILE -o json``: issue 26's
contract (the HNS objects a full sync creates, HCN's numeric flags) on a small fixture,
and the errors around it. Nothing here runs on Windows."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kubeproxy import cli

DATA = Path(__file__).parent / "data" / "kernelspace"
FLAGS = [
    "--proxy-mode", "kernelspace", "--manifests", str(DATA / "manifests"),
    "--hostname-override", "win-a", "--hns-state", str(DATA / "hns-state.json"),
]  # fmt: skip
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def render(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert cli.main(["render", *FLAGS, *extra]) == 0, capsys.readouterr().err
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def failed(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(["render", *argv]) == 1
    return capsys.readouterr().err


def by_vip(out: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {
        ((lb["frontendVIPs"] or [""])[0], lb["portMappings"][0]["externalPort"]): lb
        for lb in out["loadBalancers"]
    }


def test_contract_shape_and_values(capsys: pytest.CaptureFixture[str]) -> None:
    out = render(capsys, "--source-vip", "10.244.1.2", "--enable-dsr", "-o", "json")
    assert set(out) == {"endpoints", "loadBalancers"}
    for ep in out["endpoints"]:
        assert set(ep) == {"id", "ipAddress", "isRemote", "providerAddress"}
        assert UUID.match(ep["id"])
    for lb in out["loadBalancers"]:
        assert set(lb) == {
            "id", "frontendVIPs", "portMappings", "flags", "sourceVIP", "endpointIPs",
        }  # fmt: skip
        for pm in lb["portMappings"]:
            assert set(pm) == {
                "protocol", "internalPort", "externalPort", "distributionType", "flags",
            }  # fmt: skip
    endpoints = {ep["ipAddress"]: ep for ep in out["endpoints"]}
    # The source VIP endpoint (local), the ClusterIPs' and the remote Pods' (Overlay).
    assert endpoints["10.244.1.2"]["isRemote"] is False
    assert endpoints["10.96.0.10"]["providerAddress"] == "192.168.0.11"
    assert endpoints["10.244.2.7"] == {
        "id": endpoints["10.244.2.7"]["id"],
        "ipAddress": "10.244.2.7",
        "isRemote": True,
        "providerAddress": "192.168.0.12",
    }
    assert "10.244.1.5" not in endpoints  # the Pod's own endpoint: the CNI's, not created
    lbs = by_vip(out)
    assert set(lbs) == {("10.96.0.10", 80), ("", 30080), ("5.6.7.8", 80), ("10.96.0.53", 53)}
    # ClusterIP with --enable-dsr: DSR (1), every endpoint, no port-mapping flag.
    cluster = lbs[("10.96.0.10", 80)]
    assert (cluster["flags"], cluster["portMappings"][0]["flags"]) == (1, 0)
    assert cluster["endpointIPs"] == ["10.244.1.5", "10.244.2.7"]
    assert cluster["sourceVIP"] == "10.244.1.2"
    assert cluster["portMappings"][0]["internalPort"] == 8080
    # externalTrafficPolicy Local + DSR: the node's endpoint only; NodePort is
    # VipExternalIP (16) | LocalRoutedVIP (2), the ingress VipExternalIP.
    node_port = lbs[("", 30080)]
    assert (node_port["flags"], node_port["portMappings"][0]["flags"]) == (1, 18)
    assert node_port["endpointIPs"] == ["10.244.1.5"]
    ingress = lbs[("5.6.7.8", 80)]
    assert (ingress["flags"], ingress["portMappings"][0]["flags"]) == (1, 16)
    # UDP (17), ClientIP affinity: DistributionType SourceIP (2).
    dns = lbs[("10.96.0.53", 53)]["portMappings"][0]
    assert (dns["protocol"], dns["distributionType"]) == (17, 2)


def test_without_dsr(capsys: pytest.CaptureFixture[str]) -> None:
    lbs = by_vip(render(capsys, "--source-vip", "10.244.1.2", "-o", "json"))
    assert {lb["flags"] for lb in lbs.values()} == {0}
    # Local policy still: the plan's Local route.
    assert lbs[("", 30080)]["endpointIPs"] == ["10.244.1.5"]


def test_render_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    first = render(capsys, "--source-vip", "10.244.1.2", "-o", "json")
    assert render(capsys, "--source-vip", "10.244.1.2", "--format", "json") == first
    assert render(capsys, "--source-vip", "10.244.1.2") == first  # JSON is its only form


def test_l2bridge_state(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    state = json.loads((DATA / "hns-state.json").read_text())
    state["network"] = {"name": "cbr0", "id": "net-2", "type": "L2Bridge"}
    path = tmp_path / "l2bridge.json"
    path.write_text(json.dumps(state))
    argv = [*FLAGS[:-1], str(path)]
    assert cli.main(["render", *argv, "--source-vip", "192.168.0.11", "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # No source VIP or ClusterIP endpoints; remote Pods without a provider address.
    assert {ep["ipAddress"]: ep["providerAddress"] for ep in out["endpoints"]} == {
        "10.244.2.7": "",
        "10.244.2.9": "",
    }
    assert {lb["sourceVIP"] for lb in out["loadBalancers"]} == {"192.168.0.11"}


def test_hns_state_is_refused_in_other_modes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*FLAGS[2:], "--proxy-mode", "nftables"]
    assert "--hns-state: only with --proxy-mode kernelspace" in failed(capsys, *argv)


def test_without_hns_state_off_windows(capsys: pytest.CaptureFixture[str]) -> None:
    err = failed(capsys, *FLAGS[:-2], "--source-vip", "10.244.1.2")
    assert "needs Windows" in err and "--hns-state" in err


def test_overlay_needs_a_source_vip(capsys: pytest.CaptureFixture[str]) -> None:
    assert "needs --source-vip" in failed(capsys, *FLAGS)


def test_bad_state_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"network": {"name": "n", "id": "i", "type": "Bridge"}}')
    err = failed(capsys, *FLAGS[:-1], str(path), "--source-vip", "10.244.1.2")
    assert "network.type" in err


def test_enable_dsr_needs_the_feature_gate(capsys: pytest.CaptureFixture[str]) -> None:
    err = failed(capsys, *FLAGS, "--enable-dsr", "--feature-gates", "WinDSR=false")
    assert "winkernel.enableDSR: Invalid value: true: WinDSR feature gate must be enabled" in err


def test_kernelspace_flags_are_ignored_in_other_modes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*FLAGS[2:-2], "--proxy-mode", "nftables", "--enable-dsr", "--format", "json"]
    assert cli.main(["render", *argv]) == 0
    assert "--enable-dsr is ignored in proxy mode 'nftables'" in capsys.readouterr().err


def test_list_serves_kernelspace(capsys: pytest.CaptureFixture[str]) -> None:
    """list (without --live) reads the plan only, the same in every mode."""
    assert cli.main(["list", *FLAGS[:-2], "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"10.96.0.10:80", "5.6.7.8:80"} <= {row["frontend"] for row in rows}
