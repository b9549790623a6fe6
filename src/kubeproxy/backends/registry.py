"""Which backend serves which proxy mode, and what removes each mode's leftovers.

:data:`BACKENDS` maps each mode to its factory; :data:`CLEANUPS` maps every mode to a
function removing what that mode ever created, and :func:`cleanup_all` runs them all, as
upstream's ``kube-proxy --cleanup`` clears every mode whatever the current one.
:data:`COMPOSES` names the modes a mode runs inside itself (ebpf mode runs nftables').
:data:`INSPECTORS` maps each mode to what ``explain`` and ``list`` know of it
(:mod:`kubeproxy.backends.inspection`); :data:`NODE_INSPECTORS` the modes whose answers
also need the node (kernelspace: its HNS network). Factories import their backend when called:
importing the registry loads no backend, and no backend imports the registry.
"""

from __future__ import annotations

from collections.abc import Callable

from kubeproxy.backends.base import Backend, BackendError, PlannedBackend
from kubeproxy.backends.inspection import Inspector
from kubeproxy.backends.iptables.runners import Reopen
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.iptables.cleanup import KeepMap


def _nftables(config: ProxyConfig) -> PlannedBackend:
    from kubeproxy.backends.nftables.proxier import NftablesBackend
    from kubeproxy.dataplane.nftables.runner import open_runner

    return NftablesBackend(config, open_runner())


def _cleanup_nftables() -> list[str]:
    from kubeproxy.backends.nftables.proxier import cleanup
    from kubeproxy.dataplane.nftables.runner import open_runner

    return cleanup(open_runner())


def _ebpf(config: ProxyConfig) -> Backend:
    from kubeproxy.backends.ebpf.proxier import EbpfBackend, socket_lb_opener

    return EbpfBackend(config, _nftables(config), socket_lb_opener(config))


def _cleanup_ebpf(pin_path: str | None = None) -> list[str]:
    from pathlib import Path

    from kubeproxy.dataplane.bpf.socklb import DEFAULT_PIN_PATH, cleanup

    return cleanup(Path(pin_path) if pin_path else DEFAULT_PIN_PATH)


def _iptables(config: ProxyConfig) -> Backend:
    from kubeproxy.backends.iptables.proxier import IptablesBackend
    from kubeproxy.backends.iptables.runners import open_runners
    from kubeproxy.dataplane.nfacct import NfacctCommand
    from kubeproxy.dataplane.sysctl import HOST_PROC

    return IptablesBackend(
        config,
        open_runners(config),
        proc=HOST_PROC,
        nfacct=NfacctCommand(),
        reopen=_reopen(config),
    )


def _reopen(config: ProxyConfig) -> Reopen | None:
    """With ``--iptables-backend auto``: how to get the other flavour's runners."""
    if config.iptables_backend != "auto":
        return None
    from kubeproxy.dataplane.iptables.runner import IptablesCommand

    return lambda flavor: {f: IptablesCommand(f, flavor) for f in config.families}


def _cleanup_iptables(keep: KeepMap | None = None) -> list[str]:
    from kubeproxy.backends.iptables.proxier import cleanup

    return cleanup(keep=keep)


def _ipvs(config: ProxyConfig) -> Backend:
    from kubeproxy.backends.iptables.runners import open_runners
    from kubeproxy.backends.ipvs.proxier import IpvsBackend
    from kubeproxy.dataplane.ipset import IpsetCommand
    from kubeproxy.dataplane.ipvs.netlink import NetlinkIpvs, NetlinkLinks
    from kubeproxy.dataplane.sysctl import HOST_PROC

    return IpvsBackend(
        config,
        open_ipvs=NetlinkIpvs,
        links=NetlinkLinks(),
        ipset=IpsetCommand(),
        runners=open_runners(config),
        proc=HOST_PROC,
        reopen=_reopen(config),
    )


def _cleanup_ipvs(keep: KeepMap | None = None) -> list[str]:
    from kubeproxy.backends.ipvs.proxier import cleanup
    from kubeproxy.dataplane.ipset import IpsetCommand
    from kubeproxy.dataplane.iptables.runner import FLAVORS, IptablesCommand
    from kubeproxy.dataplane.ipvs import Ipvs, IpvsError
    from kubeproxy.dataplane.ipvs.netlink import NetlinkIpvs, NetlinkLinks
    from kubeproxy.model.types import IPFamily

    ipvs: Ipvs | None
    try:
        ipvs = NetlinkIpvs()
    except IpvsError:
        ipvs = None  # no IPVS in this kernel: nothing of it to remove
    runners = [IptablesCommand(f, flavor) for flavor in FLAVORS for f in IPFamily]
    links = NetlinkLinks()
    try:
        return cleanup(ipvs, links, IpsetCommand(), list(runners), keep)
    finally:
        links.close()
        if ipvs is not None:
            ipvs.close()


def _kernelspace(config: ProxyConfig) -> Backend:
    """HNS is opened at start: off Windows, start says kernelspace mode needs Windows.
    With ``--hns-state`` (render), the file's fake HNS stands in for the machine's."""
    from dataclasses import replace

    from kubeproxy.backends.kernelspace.endpoints import interface_mac
    from kubeproxy.backends.kernelspace.proxier import KernelspaceBackend
    from kubeproxy.dataplane.hns.fake import StateFileError, load_state
    from kubeproxy.dataplane.hns.hcn import HcnClient

    win = config.winkernel
    if not win.hns_state:
        return KernelspaceBackend(config, open_hns=HcnClient, find_mac=interface_mac)
    try:
        fake = load_state(win.hns_state, seed=0)
    except StateFileError as err:
        raise BackendError(f"--hns-state: {err}") from None
    if not win.network_name:  # the file names the network
        config = replace(config, winkernel=replace(win, network_name=fake.network.name))
    return KernelspaceBackend(config, open_hns=lambda: fake)


def _cleanup_kernelspace() -> list[str]:
    """As upstream's winkernel CleanupLeftovers: every HNS load balancer goes. Off
    Windows there is no HNS, and nothing to clean."""
    from kubeproxy.backends.kernelspace.proxier import cleanup
    from kubeproxy.dataplane.hns import HnsError
    from kubeproxy.dataplane.hns.hcn import HcnClient

    try:
        hns = HcnClient()
    except HnsError as err:
        if err.not_supported:
            return []
        raise
    return cleanup(hns)


BACKENDS: dict[ProxyMode, Callable[[ProxyConfig], Backend]] = {
    ProxyMode.NFTABLES: _nftables,
    ProxyMode.IPTABLES: _iptables,
    ProxyMode.IPVS: _ipvs,
    ProxyMode.EBPF: _ebpf,
    ProxyMode.KERNELSPACE: _kernelspace,
}

# Every mode that can leave state behind: cleanup also removes what another mode (or
# upstream kube-proxy in that mode) left.
CLEANUPS: dict[ProxyMode, Callable[[], list[str]]] = {
    ProxyMode.NFTABLES: _cleanup_nftables,
    ProxyMode.IPTABLES: _cleanup_iptables,
    ProxyMode.IPVS: _cleanup_ipvs,
    ProxyMode.EBPF: _cleanup_ebpf,
    ProxyMode.KERNELSPACE: _cleanup_kernelspace,
}

# Modes that run another mode's backend inside them: switching to such a mode keeps
# that mode's state (ebpf mode's nftables tables carry everything the hooks do not).
COMPOSES: dict[ProxyMode, tuple[ProxyMode, ...]] = {ProxyMode.EBPF: (ProxyMode.NFTABLES,)}


def _inspect_nftables() -> Inspector:
    from kubeproxy.backends.nftables.inspect import INSPECTOR

    return INSPECTOR


def _inspect_iptables() -> Inspector:
    from kubeproxy.backends.iptables.inspect import INSPECTOR

    return INSPECTOR


def _inspect_ipvs() -> Inspector:
    from kubeproxy.backends.ipvs.inspect import INSPECTOR

    return INSPECTOR


def _inspect_ebpf() -> Inspector:
    from kubeproxy.backends.ebpf.inspect import EbpfInspector
    from kubeproxy.dataplane.bpf.socklb import DEFAULT_PIN_PATH

    return EbpfInspector(DEFAULT_PIN_PATH)


def _inspect_ebpf_node(config: ProxyConfig, live: bool) -> Inspector:
    from pathlib import Path

    from kubeproxy.backends.ebpf.inspect import EbpfInspector

    return EbpfInspector(Path(config.ebpf_pin_path))


def _inspect_kernelspace() -> Inspector:
    from kubeproxy.backends.kernelspace.inspect import INSPECTOR

    return INSPECTOR


def _inspect_kernelspace_node(config: ProxyConfig, live: bool) -> Inspector:
    from kubeproxy.backends.kernelspace.inspect import for_config

    return for_config(config, live=live)


# What explain and list know of each mode (ebpf mode: its socket hooks, then nftables
# mode's rules for what they leave alone).
INSPECTORS: dict[ProxyMode, Callable[[], Inspector]] = {
    ProxyMode.NFTABLES: _inspect_nftables,
    ProxyMode.IPTABLES: _inspect_iptables,
    ProxyMode.IPVS: _inspect_ipvs,
    ProxyMode.EBPF: _inspect_ebpf,
    ProxyMode.KERNELSPACE: _inspect_kernelspace,
}

# Modes whose answers depend on the node beyond the plan (kernelspace: its HNS network;
# ebpf: where its hooks' map is pinned), made per command from the configuration (and
# ``--live``).
NODE_INSPECTORS: dict[ProxyMode, Callable[[ProxyConfig, bool], Inspector]] = {
    ProxyMode.EBPF: _inspect_ebpf_node,
    ProxyMode.KERNELSPACE: _inspect_kernelspace_node,
}


def inspector(mode: str) -> Inspector:
    """The :class:`~kubeproxy.backends.inspection.Inspector` of ``mode``."""
    try:
        return INSPECTORS[ProxyMode(mode)]()
    except (KeyError, ValueError):
        raise ValueError(f"unknown proxy mode {mode!r} (known: {', '.join(INSPECTORS)})") from None


def node_inspector(mode: str, config: ProxyConfig, *, live: bool = False) -> Inspector:
    """The inspector of ``mode`` for the node ``config`` describes (:data:`NODE_INSPECTORS`;
    every other mode's answers need nothing of the node: :func:`inspector`)."""
    try:
        made = NODE_INSPECTORS.get(ProxyMode(mode))
    except ValueError:
        made = None
    return made(config, live) if made is not None else inspector(mode)


def cleanups(
    *, ebpf_pin_path: str | None = None, keep: KeepMap | None = None
) -> dict[ProxyMode, Callable[[], list[str]]]:
    """:data:`CLEANUPS`, with ebpf mode's pins looked for under ``ebpf_pin_path``, and
    what ``keep`` names (a running mode's iptables chains and jumps) left alone."""
    out = dict(CLEANUPS)
    if ebpf_pin_path:
        out[ProxyMode.EBPF] = lambda: _cleanup_ebpf(ebpf_pin_path)
    if keep:
        out[ProxyMode.IPTABLES] = lambda: _cleanup_iptables(keep)
        out[ProxyMode.IPVS] = lambda: _cleanup_ipvs(keep)
    return out


def create_backend(config: ProxyConfig) -> Backend:
    try:
        factory = BACKENDS[config.mode]
    except KeyError:
        raise ValueError(
            f"--proxy-mode: unsupported mode {config.mode!r} (supported: {', '.join(BACKENDS)})"
        ) from None
    return factory(config)


# A cleanup's log line names this many of what it removed; the rest are counted.
NAMED_REMOVALS = 5


def removal_summary(removed: list[str], named: int = NAMED_REMOVALS) -> str:
    """One short line for a cleanup's log: counts by kind, then the first few items
    (``"1,203 removed: 1,180 chains, 21 rules, 2 tables (e.g. table ip kube-proxy, ...)"``).

    An item is ``"[WHERE: ]KIND ..."`` (``"IptablesCommand(IPv4, nft): chain nat
    KUBE-SVC-..."``, ``"table ip kube-proxy"``, ``"ipvs service TCP/10.96.0.1:80"``)."""
    if not removed:
        return "nothing"
    kinds: dict[str, int] = {}
    for item in removed:
        what = item.rsplit("): ", 1)[-1]
        kind = what.split(" ", 2)
        key = " ".join(kind[:2]) if kind[0] in ("ipvs", "bpf") else kind[0]
        kinds[key] = kinds.get(key, 0) + 1
    counts = ", ".join(f"{n:,} {kind}{'s' if n > 1 else ''}" for kind, n in kinds.items())
    shown = ", ".join(item[:200] for item in removed[:named])
    more = ", ..." if len(removed) > named else ""
    return f"{len(removed):,} removed: {counts} ({shown}{more})"


def cleanup_all(cleanups: dict[ProxyMode, Callable[[], list[str]]] | None = None) -> list[str]:
    """Run every mode's cleanup; returns what was removed. A mode whose cleanup fails
    does not stop the others; the failures are raised together at the end."""
    removed: list[str] = []
    errors: list[str] = []
    for mode, fn in (cleanups or CLEANUPS).items():
        try:
            removed.extend(fn())
        except Exception as err:
            errors.append(f"{mode}: {err}")
    if errors:
        raise BackendError("cleanup failed: " + "; ".join(errors))
    return removed
