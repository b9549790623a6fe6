"""Proxy-mode switches under traffic, many times (issue 22: "a mode switch under traffic,
iptables -> nftables -> iptables, both iptables flavours, loses no connect in 20 runs").

    python -m bench.mode_switch [--runs 20] [--flavors nft,legacy]

(root.) One lab (:mod:`kubeproxy.lab.cluster`) per flavour; each run is
:func:`kubeproxy.lab.switch.switch_modes` over ``iptables-FLAVOR -> nftables ->
iptables-FLAVOR``: a proxy per mode started as a DaemonSet's new Pod would be (the
previous one SIGTERMed first), each after the first running until it has removed what
the previous mode left. Meanwhile a local Pod connects to the ClusterIP and the outside
client to the NodePort, each every 10 ms. Prints one line per run (the
connects, the failures, each handover's time) and a summary; exits 1 if any connect
failed. CI runs two switches per flavour (tests/kernel/test_takeover.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from kubeproxy.lab.cluster import NODE, NODE_IP, NODE_IP6, Lab
from kubeproxy.lab.objects import ManifestDir, node
from kubeproxy.lab.switch import switch_modes, write_service

PODS = {"local-1": "10.244.1.10", "local-2": "10.244.1.11"}
CLIENT_POD = ("client", "10.244.1.100")


def run_flavor(flavor: str, runs: int) -> tuple[int, int]:
    """(connects, failures) over ``runs`` runs in a lab of its own."""
    total = failed = 0
    prefix = f"kpms{os.getpid() % 100000}{flavor[0]}"
    with Lab(prefix) as lab, tempfile.TemporaryDirectory() as tmp:
        for name, ip in PODS.items():
            lab.add_pod(name, NODE, [ip])
        client = lab.add_pod(CLIENT_POD[0], NODE, [CLIENT_POD[1]])
        manifests = ManifestDir(Path(tmp) / "manifests")
        manifests.path.mkdir()
        manifests.write("node.yaml", node(NODE, [NODE_IP, NODE_IP6], zone="zone-a"))
        write_service(manifests, PODS)
        iptables = f"iptables-{flavor}"
        handovers: list[float] = []
        for run in range(runs):
            workdir = Path(tmp) / f"run-{run}"
            workdir.mkdir()
            result = switch_modes(
                lab,
                manifests,
                [iptables, "nftables", iptables],
                pod_client=client.netns,
                workdir=workdir,
            )
            lab.run(lab.kubeproxy_command("cleanup"))
            bad = result.failures()
            total += len(result.attempts)
            failed += len(bad)
            handovers += result.handovers[1:]
            steps = ", ".join(f"{s:.2f}s" for s in result.handovers)
            print(
                f"{iptables} run {run + 1}/{runs}: {len(result.attempts)} connects, "
                f"{len(bad)} failed; handovers {steps}"
                + (f"; first failure: {bad[0].outcome}" if bad else ""),
                flush=True,
            )
        print(
            f"{iptables}: {runs} runs, {2 * runs} switches, {total} connects, {failed} failed; "
            f"handover (start -> other mode's rules removed) median "
            f"{statistics.median(handovers):.2f}s, max {max(handovers):.2f}s",
            flush=True,
        )
    return total, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--flavors", default="nft,legacy")
    args = parser.parse_args()
    failed = 0
    for flavor in args.flavors.split(","):
        failed += run_flavor(flavor, args.runs)[1]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
