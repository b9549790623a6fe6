"""``render --format json``: the service plan, the second consumer of the plan besides
the nftables backend. Both must tell the same story about every ServicePort."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubeproxy import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FLAGS = [
    "--manifests", str(EXAMPLES), "--hostname-override", "node-a", "--proxy-mode", "nftables",
]  # fmt: skip


def render(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert cli.main(["render", *FLAGS, *extra]) == 0
    return capsys.readouterr().out


def test_json_plan_and_nft_script_agree_on_every_service_port(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = json.loads(render(capsys, "--format", "json"))
    script = render(capsys)
    assert plan["mode"] == "nftables"
    assert {f["family"] for f in plan["families"]} <= {"IPv4", "IPv6"}
    assert plan["servicePorts"], "the example cluster has Services"
    for port in plan["servicePorts"]:
        cluster_ip = port["frontends"][0]
        assert cluster_ip["kind"] == "ClusterIP"
        address, _, number = cluster_ip["address"].rpartition(":")
        proto = port["servicePort"].rsplit("/", 1)[1].lower()
        # The dispatch element names its ServicePort, as upstream's: ns/name:port.
        name = port["servicePort"].rsplit("/", 1)[0]
        key = f'{address.strip("[]")} . {proto} . {number} comment "{name}"'
        verdict = port["internal"]["verdict"]
        if verdict == "DNAT":
            n = len(port["internal"]["endpoints"])
            assert sum(e["probability"] for e in port["internal"]["endpoints"]) == pytest.approx(
                1, abs=1e-5
            )
            if port["sessionAffinityTimeout"]:
                assert f"{key} : goto aff-" in script, (port["servicePort"], key)
            else:
                blocks = script.split(f"set cluster-ip-{n}-dests {{")[1:]
                dests = [b.split("\n\t}", 1)[0] for b in blocks]
                assert any(key in d for d in dests), (port["servicePort"], key)
        else:
            target = "goto reject-chain" if verdict == "REJECT" else "drop"
            assert f"{key} : {target}" in script, (port["servicePort"], key)
