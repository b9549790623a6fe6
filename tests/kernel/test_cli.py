"""The command line against the real kernel: render, cleanup, and the README demo."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kubeproxy.lab.cluster import NODE, Lab
from kubeproxy.lab.netns import add_netns, delete_netns, list_netns, ns_exec
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, service

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def kubeproxy(
    *args: str, ns: str | None = None, unprivileged: bool = False, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kubeproxy", *args]
    if args[:1] == ("run",) and "--manifests" in args:
        # No parse cache: the machine's /var/cache is not the suite's to fill.
        cmd += ["--manifests-cache-dir", ""]
    if unprivileged:
        # Same uid (so the checkout stays readable wherever CI put it) but no capability
        # at all: no CAP_NET_ADMIN, so any attempt to touch nftables would fail.
        cmd = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", *cmd]
    if ns is not None:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run(
        cmd, capture_output=True, text=True, input=input, env=env, check=False, cwd=ROOT
    )


def ruleset(ns: str) -> str:
    return ns_exec(ns, "nft", "list", "ruleset")


def test_render_examples_is_accepted_by_nft_check(lab: Lab) -> None:
    # The acceptance check; render runs without privileges and touches nothing.
    rendered = kubeproxy(
        "render", "--proxy-mode", "nftables", "--manifests", str(EXAMPLES),
        "--hostname-override", NODE, unprivileged=True,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout.startswith("add table ip kube-proxy\n")
    before = ruleset(lab.node_ns)
    check = subprocess.run(
        ["ip", "netns", "exec", lab.node_ns, "nft", "-c", "-f", "-"],
        input=rendered.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    assert ruleset(lab.node_ns) == before  # nft -c applies nothing


def test_render_is_exactly_what_run_applies(lab: Lab, manifests: ManifestDir) -> None:
    manifests.write(
        "svc.yaml",
        service(
            "web",
            "10.96.9.1",
            [{"name": "http", "port": 80, "nodePort": 30900}],
            type="NodePort",
            externalTrafficPolicy="Local",
        ),
        endpoint_slice("web", [Ep("10.244.1.10", node=NODE), Ep("10.244.2.10", node="node-b")]),
    )
    flags = [
        "--proxy-mode",
        "nftables",
        "--manifests",
        str(manifests.path),
        "--hostname-override",
        NODE,
        "--cluster-cidr",
        "10.244.0.0/16",
    ]
    applied = kubeproxy("run", "--once", *flags, ns=lab.node_ns)
    assert applied.returncode == 0, applied.stderr
    rendered = kubeproxy("render", *flags, ns=lab.node_ns)
    assert rendered.returncode == 0, rendered.stderr

    scratch = f"{lab.prefix}-scratch"
    add_netns(scratch)
    try:
        ns_exec(scratch, "nft", "-f", "-", input=rendered.stdout)
        assert ruleset(scratch) == ruleset(lab.node_ns)
    finally:
        delete_netns(scratch)
    assert scratch not in list_netns()


def test_cleanup_removes_kubeproxy_tables_and_nothing_else(
    lab: Lab, manifests: ManifestDir
) -> None:
    ns = lab.node_ns
    ns_exec(
        ns,
        "nft",
        "-f",
        "-",
        input=(
            "table ip other { chain c { type filter hook input priority 0; }; }\n"
            "table inet filter { set s { type ipv4_addr; elements = { 10.0.0.1 }; }; }\n"
            # A table with our name in another family is not ours either.
            "table inet kube-proxy { }\n"
        ),
    )
    try:
        assert (
            kubeproxy(
                "run",
                "--once",
                "--proxy-mode",
                "nftables",
                "--manifests",
                str(manifests.path),
                "--hostname-override",
                NODE,
                ns=ns,
            ).returncode
            == 0
        )
        tables = ns_exec(ns, "nft", "list", "tables")
        assert "table ip kube-proxy" in tables
        assert "table ip6 kube-proxy" in tables

        result = kubeproxy("cleanup", ns=ns)
        assert result.returncode == 0, result.stderr
        left = ns_exec(ns, "nft", "list", "tables").splitlines()
        assert sorted(left) == ["table inet filter", "table inet kube-proxy", "table ip other"]
        assert "10.0.0.1" in ns_exec(ns, "nft", "list", "set", "inet", "filter", "s")

        # Idempotent, and upstream's spelling works too.
        again = kubeproxy("run", "--cleanup", "--manifests", str(manifests.path), ns=ns)
        assert again.returncode == 0, again.stderr
        assert "nothing" in again.stderr
    finally:
        for table in ("ip other", "inet filter", "inet kube-proxy"):
            ns_exec(ns, "nft", "delete", "table", *table.split(), check=False)


@pytest.mark.parametrize("flavor", ["nft", "legacy"])
def test_switching_modes_removes_what_the_other_mode_left(
    lab: Lab, manifests: ManifestDir, flavor: str
) -> None:
    # As upstream's platformCleanup at start. The cleanup runs in a thread while the
    # source lists; the first sync waits for it.
    ns = lab.node_ns
    manifests.write(
        "web.yaml", service("web", "10.96.0.10"), endpoint_slice("web", [Ep("10.244.1.10")])
    )
    common = ["--once", "--manifests", str(manifests.path), "--hostname-override", NODE]
    save = f"iptables-{flavor}-save"
    try:
        iptables = kubeproxy(
            "run", "--proxy-mode", "iptables", "--iptables-backend", flavor, *common, ns=ns
        )
        assert iptables.returncode == 0, iptables.stderr
        assert "KUBE-SERVICES" in ns_exec(ns, save)

        nftables = kubeproxy("run", "--proxy-mode", "nftables", *common, ns=ns)
        assert nftables.returncode == 0, nftables.stderr
        assert "Removed what other proxy modes left" in nftables.stderr
        left = ns_exec(ns, save)
        # Only kubelet's KUBE-FIREWALL stays, as upstream's cleanup leaves it.
        assert set(re.findall(r"KUBE-[A-Z0-9-]+", left)) == {"KUBE-FIREWALL"}
        assert "table ip kube-proxy" in ns_exec(ns, "nft", "list", "tables")

        back = kubeproxy(
            "run", "--proxy-mode", "iptables", "--iptables-backend", flavor, *common, ns=ns
        )
        assert back.returncode == 0, back.stderr
        assert "kube-proxy" not in ns_exec(ns, "nft", "list", "tables")
        assert "KUBE-SERVICES" in ns_exec(ns, save)
    finally:
        kubeproxy("cleanup", ns=ns)


def test_readme_demo_shows_the_expected_pods() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "kubeproxy.lab.demo", str(EXAMPLES)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
    ) as demo:
        stdout, stderr = demo.communicate(timeout=120)
    result = subprocess.CompletedProcess(demo.args, demo.returncode, stdout, stderr)
    assert result.returncode == 0, result.stderr + result.stdout
    lines = {line.split(":")[0].strip(): line for line in result.stdout.splitlines()}
    out = result.stdout
    assert "connection refused x12" in out  # scaled-to-zero
    web_local = [ln for ln in out.splitlines() if "web-local" in ln and "NodePort" in ln]
    assert web_local and "shop-1 x12" in web_local[0] and "192.168.60.2" in web_local[0]
    cache = [ln for ln in out.splitlines() if "node-cache" in ln]
    assert len(cache) == 2 and all("cache-node-a x12" in ln for ln in cache)
    web = [ln for ln in out.splitlines() if "demo/web:http" in ln]
    assert len(web) == 2 and all("web-1" in ln or "web-2" in ln or "web-3" in ln for ln in web)
    assert lines  # parsed
    # Only this demo's own namespaces (named after its pid, as kubeproxy.lab.demo does):
    # another test run's demo may come and go meanwhile.
    mine = f"kpdemo{demo.pid % 100000}-"
    left = [ns for ns in list_netns() if ns.startswith(mine)]
    assert not left, f"the demo left namespaces behind: {left}"


@pytest.mark.parametrize("command", [["--help"], ["run", "--help"], ["render", "--help"]])
def test_help(command: list[str]) -> None:
    result = kubeproxy(*command)
    assert result.returncode == 0
    assert "--hostname-override" in result.stdout or "run" in result.stdout


def test_version_and_the_v_shorthand() -> None:
    for args in (["--version"], ["run", "--version"]):
        result = kubeproxy(*args)
        assert result.returncode == 0 and result.stdout.startswith("kubeproxy v"), result
    result = kubeproxy(
        "run", "-v", "2", "--manifests", str(EXAMPLES), "--write-config-to", "/dev/stdout"
    )
    assert result.returncode == 0 and "verbosity: 2" in result.stdout


@pytest.mark.parametrize(
    ("mode", "flags", "route_localnet"),
    [
        ("iptables", (), "1"),
        ("iptables", ("--nodeport-addresses", "127.0.0.0/8,10.0.0.0/8"), "1"),
        # CVE-2020-8558: never without a loopback NodePort address (as upstream).
        ("iptables", ("--nodeport-addresses", "10.0.0.0/8"), "0"),
        ("iptables", ("--nodeport-addresses", "primary"), "0"),
        ("iptables", ("--nodeport-addresses", "primary,10.0.0.0/8"), "0"),
        # v1.37's keywords: localhost is 127.0.0.0/8 and ::1/128, all is 0.0.0.0/0 and ::/0.
        ("iptables", ("--nodeport-addresses", "primary,localhost"), "1"),
        ("iptables", ("--nodeport-addresses", "all"), "1"),
        ("iptables", ("--nodeport-addresses", "fd00::/8"), "1"),  # no IPv4 CIDR: all of it
        ("iptables", ("--iptables-localhost-nodeports=false",), "0"),
        ("nftables", (), "0"),
        ("nftables", ("--nodeport-addresses", "0.0.0.0/0"), "0"),
        ("nftables", ("--nodeport-addresses", "localhost"), "0"),
    ],
)
def test_init_only_sets_the_node_up_and_programs_nothing(
    mode: str, flags: tuple[str, ...], route_localnet: str
) -> None:
    """route_localnet=1 only where NodePorts on 127.0.0.1 are served: iptables mode,
    ``iptables.localhostNodePorts`` on, and IPv4 NodePort addresses taking in loopback."""
    ns = f"kpinit{os.getpid()}"
    delete_netns(ns)
    add_netns(ns)
    try:
        result = kubeproxy(
            "run", "--init-only", "--proxy-mode", mode, "--manifests", str(EXAMPLES),
            "--hostname-override", NODE, *flags, ns=ns,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "System initialized and --init-only specified" in result.stderr
        assert (
            ns_exec(ns, "cat", "/proc/sys/net/ipv4/conf/all/route_localnet").strip()
            == route_localnet
        )
        assert "KUBE-" not in ns_exec(ns, "iptables-save") + ns_exec(ns, "nft", "list", "ruleset")
    finally:
        delete_netns(ns)


def test_ipvs_mode_on_a_kernel_without_ipvs_says_so_and_exits(tmp_path: Path) -> None:
    """This host's kernel has no IPVS: upstream refuses to run the ipvs proxier there, and
    so do we (no fallback to another mode). In a namespace of its own."""
    if Path("/proc/net/ip_vs").exists():
        pytest.skip("this kernel has IPVS")
    ns = f"kpnoipvs{os.getpid() % 100000}"
    add_netns(ns)
    try:
        (tmp_path / "m").mkdir()
        result = kubeproxy(
            "run", "--proxy-mode", "ipvs", "--manifests", str(tmp_path / "m"),
            "--hostname-override", NODE, "--once", ns=ns,
        )  # fmt: skip
        assert result.returncode == 1
        assert "can't use the IPVS proxier: the kernel has no IPVS" in result.stderr
        assert "kube-ipvs0" not in ns_exec(ns, "ip", "-o", "link")
    finally:
        delete_netns(ns)
