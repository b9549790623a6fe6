"""The data planes the benchmarks measure, and what differs between them.

A :class:`Mode` is named like the lab's modes (``kubeproxy.lab.cluster.MODE_FLAGS``):
``nftables``, ``iptables-nft`` or ``iptables-legacy``. It builds the backend the way
``kubeproxy run`` would (IPv4 only), and says how the kernel tool alone loads the input
of a full sync (the floor a cold sync is compared with): ``nft -f`` of the nftables
script, or ``iptables-<flavour>-restore --noflush`` of the IPv4 part of
``IptablesBackend.render``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from kubeproxy.backends.base import Backend
from kubeproxy.backends.iptables.proxier import IptablesBackend
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.iptables.runner import Flavor, IptablesCommand, command_names
from kubeproxy.dataplane.nftables.runner import NftCommand, open_runner
from kubeproxy.dataplane.sysctl import HOST_PROC
from kubeproxy.lab.netns import sh
from kubeproxy.model.types import IPFamily

MODES = ("nftables", "iptables-nft", "iptables-legacy")
# A full sync of a large cluster in the nft flavour takes minutes (see bench/RESULTS.md).
RESTORE_TIMEOUT = 3600.0


@dataclass(frozen=True)
class Mode:
    name: str

    def __post_init__(self) -> None:
        if self.name not in MODES:
            raise ValueError(f"unknown mode {self.name!r} (one of {', '.join(MODES)})")

    @property
    def flavor(self) -> Flavor | None:
        if self.name == "nftables":
            return None
        return "legacy" if self.name == "iptables-legacy" else "nft"

    @property
    def floor_label(self) -> str:
        """The kernel tool alone, as the tables name it."""
        if self.flavor is None:
            return "`nft -f` alone"
        return f"`iptables-{self.flavor}-restore --noflush` alone"

    def config(self, hostname: str, cluster_cidrs: tuple[str, ...]) -> ProxyConfig:
        config = ProxyConfig(
            hostname=hostname, cluster_cidrs=cluster_cidrs, families=(IPFamily.IPv4,)
        )
        if self.flavor is None:
            return config
        return replace(config, mode=ProxyMode.IPTABLES, iptables_backend=self.flavor)

    def backend(self, config: ProxyConfig, netns: str | None = None) -> Backend:
        """The backend in this process; ``netns``: the kernel it programs (default: ours)."""
        if self.flavor is None:
            return NftablesBackend(
                config, open_runner() if netns is None else NftCommand(netns=netns)
            )
        runner = IptablesCommand(IPFamily.IPv4, self.flavor, netns=netns, timeout=RESTORE_TIMEOUT)
        # In the namespace it programs (bench.sync_worker runs there), this process's
        # /proc is the node's; programming another namespace, its /proc is out of reach
        # (and start(), which would write it, refuses).
        proc = HOST_PROC if netns is None else Path("/nonexistent")
        return IptablesBackend(config, {IPFamily.IPv4: runner}, proc=proc)

    def floor_command(self, script: str, path: Path) -> tuple[list[str], Path | None]:
        """Write what the kernel tool alone loads (from ``backend.render``) to ``path``;
        the command and the file to give it on standard input (None: none)."""
        if self.flavor is None:
            path.write_text(script)
            return ["nft", "-f", str(path)], None
        path.write_text(ipv4_part(script))
        restore = command_names(IPFamily.IPv4, self.flavor)[2]
        return [restore, "--noflush"], path

    def version(self) -> str:
        if self.flavor is None:
            return sh("nft", "--version").strip()
        return sh(command_names(IPFamily.IPv4, self.flavor)[0], "--version").strip()


def ipv4_part(rendered: str) -> str:
    """The IPv4 part of ``IptablesBackend.render``, which prints one part per family,
    each after a ``# iptables-restore ...`` (or ``# ip6tables-restore ...``) line."""
    out: list[str] = []
    inside = False
    for line in rendered.splitlines(keepends=True):
        if line.startswith(("# iptables-restore", "# ip6tables-restore")):
            inside = line.startswith("# iptables-restore")
        if inside:
            out.append(line)
    if not out:
        raise ValueError("no iptables-restore part in the rendered input")
    return "".join(out)
