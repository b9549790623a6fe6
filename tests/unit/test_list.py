"""``kubeproxy list``: rows per frontend, and the two commands on the example cluster."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kubeproxy import cli
from kubeproxy.explain.command import node_warnings
from kubeproxy.explain.listing import drift_report, rows, table
from kubeproxy.model.plan import plan_service_port
from kubeproxy.model.state import NodeState
from kubeproxy.model.types import IPFamily, TrafficPolicy
from tests.unit.conftest import endpoint, service_port
from tests.unit.test_explain import family

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FLAGS = [
    "--manifests", str(EXAMPLES), "--hostname-override", "node-a", "--proxy-mode", "nftables",
]  # fmt: skip


def test_one_row_per_frontend_with_counts() -> None:
    svc = service_port(node_port=30080, etp=TrafficPolicy.LOCAL, external_ips=("203.0.113.1",))
    eps = (
        endpoint("10.244.1.10", node="node-a"),
        endpoint("10.244.1.11", node="node-a", ready=False, serving=True, terminating=True),
        endpoint("10.244.2.10", node="node-b"),
    )
    plan = plan_service_port(svc, eps, family())
    assert plan is not None
    listed = rows([plan], {svc.name: eps}, "node-a")
    assert [(r.kind, r.frontend, r.policy) for r in listed] == [
        ("ClusterIP", "10.96.0.10:80", "Cluster"),
        ("ExternalIP", "203.0.113.1:80", "Local"),
        ("NodePort", "*:30080", "Local"),
    ]
    assert {(r.ready, r.local, r.terminating) for r in listed} == {(2, 1, 1)}
    assert [r.verdict for r in listed] == ["DNAT(2)", "DNAT(1)", "DNAT(1)"]
    text = table(listed, wide=True)
    assert text.splitlines()[0].split() == [
        "FRONTEND", "TYPE", "SERVICE", "PORT", "POLICY", "READY", "LOCAL", "TERMINATING",
        "VERDICT", "AFFINITY", "TOPOLOGY", "SOURCE-RANGES", "ENDPOINTS",
    ]  # fmt: skip
    assert "default/web" in text and "http/TCP" in text


def test_every_endpoint_is_named_with_its_state() -> None:
    svc = service_port(node_port=30080, etp=TrafficPolicy.LOCAL)
    eps = (
        endpoint("10.244.1.10", node="node-a", zone="zone-a"),
        endpoint("10.244.1.11", node="node-a", ready=False, serving=True, terminating=True),
        endpoint("10.244.2.10", node="node-b", zone="zone-b"),
        endpoint("10.244.2.11", node="node-b", ready=False, serving=False, terminating=True),
        endpoint("10.244.2.12", node="node-b", ready=False, serving=False),
    )
    plan = plan_service_port(svc, eps, family())
    assert plan is not None
    cluster_ip, node_port = rows([plan], {svc.name: eps}, "node-a")
    assert [str(e) for e in node_port.endpoint_list] == [
        "10.244.1.10:8080 (node-a, zone-a, ready, local)",
        "10.244.1.11:8080 (node-a, -, serving-terminating, local, unused)",
        "10.244.2.10:8080 (node-b, zone-b, ready, unused)",  # Local policy: not this node
        "10.244.2.11:8080 (node-b, -, terminating, unused)",
        "10.244.2.12:8080 (node-b, -, not-ready, unused)",
    ]
    assert [e.used for e in cluster_ip.endpoint_list] == [True, False, True, False, False]
    assert node_port.as_dict()["endpointList"][1] == {
        "address": "10.244.1.11:8080",
        "node": "node-a",
        "zone": None,
        "ready": False,
        "serving": True,
        "terminating": True,
        "local": True,
        "used": False,
    }
    # -o wide: the first endpoint on the row's line, the others below it in that column.
    lines = table([node_port], wide=True).splitlines()
    column = lines[0].index("ENDPOINTS")
    assert lines[1][column:] == "10.244.1.10:8080 (node-a, zone-a, ready, local)"
    assert [line[column:] for line in lines[2:]] == [str(e) for e in node_port.endpoint_list[1:]]
    assert all(not line[:column].strip() for line in lines[2:])


def test_local_policy_without_local_endpoints_shows_the_short_circuit() -> None:
    svc = service_port(node_port=30080, etp=TrafficPolicy.LOCAL)
    eps = (endpoint("10.244.2.10", node="node-b"),)
    plan = plan_service_port(svc, eps, family())
    assert plan is not None
    listed = rows([plan], {svc.name: eps}, "node-a")
    assert listed[-1].verdict == "DROP, pods/node: DNAT(1)"


def test_list_on_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", *FLAGS, "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    by_frontend = {(r["frontend"], r["protocol"]): r for r in listed}
    web = by_frontend[("10.96.0.10:80", "TCP")]
    assert web["service"] == "demo/web"
    assert web["endpoints"] == {"ready": 3, "local": 1, "terminating": 0, "used": 3}
    assert by_frontend[("10.96.0.99:80", "TCP")]["verdict"] == "REJECT"
    assert by_frontend[("*:30081", "TCP")]["policy"] == "Local"
    assert cli.main(["list", *FLAGS]) == 0
    assert capsys.readouterr().out.startswith("FRONTEND")


def test_list_by_namespace_and_name(capsys: pytest.CaptureFixture[str]) -> None:
    def services(*argv: str) -> set[str]:
        assert cli.main(["list", *FLAGS, "-o", "json", *argv]) == 0
        return {r["service"] for r in json.loads(capsys.readouterr().out)}

    everything = services()
    assert len(everything) > 2
    assert services("-n", "demo") == {s for s in everything if s.startswith("demo/")}
    assert services("-n", "demo", "web", "web-local") == {"demo/web", "demo/web-local"}
    assert services("web") == {"demo/web"}
    assert services("-n", "nowhere") == set()
    web = json.loads(_run(capsys, "list", *FLAGS, "-o", "json", "-n", "demo", "web"))[0]
    assert [e["address"] for e in web["endpointList"]] == [
        "10.244.1.10:8080",
        "10.244.2.10:8080",
        "10.244.2.11:8080",
    ]
    assert [e["local"] for e in web["endpointList"]] == [True, False, False]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def test_explain_on_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["explain", *FLAGS, "--cluster-cidr", "10.244.0.0/16"]
    packet = ["--src", "192.168.60.2", "--dst", "192.168.50.1", "--port", "30081"]
    assert cli.main([*args, *packet, "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "DNAT"
    assert out["endpoints"] == ["10.244.1.20:8080"]
    assert out["masquerade"] is False
    assert out["servicePort"] == "demo/web-local:http/TCP"
    assert any("externalTrafficPolicy Local" in r for r in out["reasons"])
    assert any("local-np-" in o and "-backends element" in o for o in out["kernelObjects"])
    # The same flags as run: --proxy-mode iptables names upstream's chains.
    assert cli.main([*args, *packet, "--proxy-mode", "iptables"]) == 0
    text = capsys.readouterr().out
    assert "Verdict:     DNAT" in text and "KUBE-SVL-" in text and "KUBE-SEP-" in text
    # IPv6, and a packet nothing handles.
    v6 = ["--src", "fd00:10:244:1::5", "--dst", "fd00:10:96::10", "--port", "80"]
    assert cli.main([*args, *v6, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["endpoints"][0].startswith("[fd00:10:244:")
    assert cli.main([*args, "--src", "10.244.1.5", "--dst", "1.1.1.1", "--port", "80"]) == 0
    assert "Verdict:     NONE" in capsys.readouterr().out


@pytest.mark.parametrize(
    "packet",
    [
        ["--src", "10.0.0.1", "--dst", "fd00::1", "--port", "80"],
        ["--src", "nope", "--dst", "10.96.0.10", "--port", "80"],
        ["--src", "10.0.0.1", "--dst", "10.96.0.10", "--port", "70000"],
    ],
)
def test_explain_refuses_bad_packets(capsys: pytest.CaptureFixture[str], packet: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["explain", *FLAGS, *packet])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_readme_shows_real_output(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's explain/list example: every line it shows is what the commands print."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    block = readme.split("```console\n", 1)[1].split("```", 1)[0]
    commands = block.replace("\\\n", " ").split("$ kubeproxy ")[1:]
    assert [c.split()[0] for c in commands] == ["list", "explain"]
    for command in commands:
        line, *shown = command.splitlines()
        args = [a.replace("examples/", str(EXAMPLES)) for a in line.split()]
        assert cli.main(args) == 0
        printed = capsys.readouterr().out.splitlines()
        for expected in shown:
            if expected.strip() and expected.strip() != "...":
                assert expected in printed, expected


def test_explain_in_ebpf_mode_says_what_the_socket_hooks_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    packet = ["--src", "10.244.1.100", "--origin", "node", "--dst", "10.96.0.10", "--port", "80"]
    assert cli.main(["explain", *FLAGS, "--proxy-mode", "ebpf", *packet, "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["mode"], out["verdict"], out["masquerade"]) == ("ebpf", "SOCKET-LB", False)
    assert out["kernelObjects"][0].startswith("bpf: kp_svc4 element { 10.96.0.10:80/TCP slot 0")


def test_warnings_when_the_node_is_not_known() -> None:
    node = NodeState("node-x")
    assert node_warnings(node, True, guessed=False) == [
        "Node 'node-x' has no InternalIP or ExternalIP address: 'this node' is loopback "
        "only and its NodePort addresses are not known"
    ]
    # --live reads the addresses from the kernel: only a missing object matters then.
    assert node_warnings(node, True, guessed=False, live=True) == []
    missing = node_warnings(node, False, guessed=True)
    assert missing[0].startswith("No --hostname-override (hostnameOverride): this machine's")
    assert missing[1].startswith("No Node object named 'node-x': its addresses, zone and")
    known = NodeState("node-a", primary_ips={IPFamily.IPv4: "192.168.50.1"})
    assert node_warnings(known, True, guessed=False) == []


@pytest.mark.parametrize("command", ["list", "explain", "render"])
def test_the_commands_warn_about_a_node_without_a_node_object(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    packet = ["--src", "10.0.0.1", "--dst", "10.96.0.10", "--port", "80"]
    argv = [command, "--manifests", str(EXAMPLES), "--hostname-override", "node-x"]
    assert cli.main(argv + (packet if command == "explain" else [])) == 0
    err = capsys.readouterr().err
    assert "No Node object named 'node-x'" in err
    assert "No --hostname-override" not in err
    # The examples have node-a: no warning.
    assert cli.main([command, *FLAGS] + (packet if command == "explain" else [])) == 0
    assert "No Node object" not in capsys.readouterr().err


def test_live_rows_show_their_drift() -> None:
    svc = service_port(node_port=30080)
    eps = (endpoint("10.244.1.10", node="node-a"),)
    plan = plan_service_port(svc, eps, family())
    assert plan is not None
    cluster_ip, node_port = rows([plan], {svc.name: eps}, "node-a")
    checked = [
        replace(cluster_ip, drift=("missing endpoint 10.244.1.10:8080 in cluster-ip-1-backends",)),
        replace(node_port, drift=()),
    ]
    lines = table(checked).splitlines()
    assert lines[0].split()[-1] == "LIVE"
    assert [line.split()[-1] for line in lines[1:]] == ["DRIFT(1)", "ok"]
    assert drift_report(
        checked, ["ip kube-proxy: cluster-ips element { 10.96.0.99 }: ..."], "nftables"
    ) == (
        "Drift (nftables mode: the kernel differs from the plan):\n"
        "  ! 10.96.0.10:80 default/web:http: missing endpoint 10.244.1.10:8080 in "
        "cluster-ip-1-backends\n"
        "  ! ip kube-proxy: cluster-ips element { 10.96.0.99 }: ...\n"
    )
    assert drift_report([checked[1]], [], "iptables") == (
        "Live (iptables mode): the kernel holds exactly what the plan says.\n"
    )
    assert checked[0].as_dict()["drift"] == list(checked[0].drift or ())
    assert "drift" not in cluster_ip.as_dict()
