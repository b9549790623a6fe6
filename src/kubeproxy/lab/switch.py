"""A node changing proxy modes under traffic, as an operator does it: stop one proxy
(SIGTERM, a DaemonSet rollout), start the next in another mode, repeat.

:func:`switch_modes` runs node-a of a :class:`~kubeproxy.lab.cluster.Lab` through a
sequence of modes (``iptables-nft`` -> ``nftables`` -> ``iptables-nft``...) while
:class:`~kubeproxy.lab.connects.ConnectProbe` clients open a connection every 10 ms: a
local Pod to a ClusterIP, and the outside client to a NodePort. Each proxy after the
first runs until it logs that it removed what the previous mode left (which it does
only after its own first sync), so every handover is complete before the next starts.
The result lists every failed connect: a hitless switch has none.

Used by ``tests/kernel/test_takeover.py`` (a few switches) and ``python -m
bench.mode_switch`` (the issue's 20 runs per flavour).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from kubeproxy.lab.cluster import NODE, NODE_IP, Lab, stop_process
from kubeproxy.lab.connects import Attempt, ConnectProbe
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, service

CLUSTER_IP = "10.96.30.10"
NODE_PORT = 30910
# Each proxy's handover: the log line that ends it, and how long it may take.
FIRST_SYNC = "Synced full rules"
CLEANED = "Removed what other proxy modes left"
HANDOVER_TIMEOUT = 60.0


@dataclass
class SwitchResult:
    modes: list[str]
    attempts: list[Attempt] = field(default_factory=list)
    # Seconds from each start to its handover line.
    handovers: list[float] = field(default_factory=list)

    def failures(self) -> list[Attempt]:
        return [a for a in self.attempts if not a.ok]


def write_service(manifests: ManifestDir, pods: dict[str, str]) -> None:
    """A NodePort Service (ClusterIP :data:`CLUSTER_IP`) whose endpoints are ``pods``
    (name -> IPv4 on node-a)."""
    manifests.write(
        "switch.yaml",
        service(
            "switch",
            CLUSTER_IP,
            [{"name": "http", "port": 80, "nodePort": NODE_PORT}],
            type="NodePort",
        ),
        endpoint_slice("switch", [Ep(ip, node=NODE, pod=name) for name, ip in pods.items()]),
    )


def proxy_command(lab: Lab, manifests: Path, mode: str) -> list[str]:
    return lab.kubeproxy_command("run", *lab.proxy_flags(manifests, mode))


def wait_for_line(log: Path, line: str, timeout: float = HANDOVER_TIMEOUT) -> float:
    """Seconds until ``line`` appears in ``log``; TimeoutError (with the log) if not."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if line in log.read_text(errors="replace"):
            return time.monotonic() - started
        time.sleep(0.05)
    raise TimeoutError(f"no {line!r} in {timeout}s:\n{log.read_text(errors='replace')[-3000:]}")


def switch_modes(
    lab: Lab,
    manifests: ManifestDir,
    modes: list[str],
    *,
    pod_client: str,
    workdir: Path,
    settle: float = 0.3,
) -> SwitchResult:
    """Run ``modes`` in turn on node-a under traffic (see the module docstring).
    ``pod_client``: the namespace of a Pod on node-a that connects to the ClusterIP."""
    result = SwitchResult(list(modes))
    probes = [
        ConnectProbe(pod_client, CLUSTER_IP, 80),
        ConnectProbe(lab.client_ns, NODE_IP, NODE_PORT),
    ]
    proc = None
    try:
        for i, mode in enumerate(modes):
            if proc is not None:
                stop_process(proc)  # as a rollout: the old Pod goes, its rules stay
            log = workdir / f"proxy-{i}-{mode}.log"
            proc = lab.spawn(proxy_command(lab, manifests.path, mode), log=log)
            result.handovers.append(wait_for_line(log, CLEANED if i else FIRST_SYNC))
            if i == 0:
                for probe in probes:
                    probe.start()
            time.sleep(settle)  # traffic through this mode alone for a while
    finally:
        for probe in probes:
            result.attempts += probe.stop()
        if proc is not None:
            stop_process(proc)
    result.attempts.sort(key=lambda a: a.at)
    return result
