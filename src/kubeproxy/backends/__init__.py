"""Proxy backends (one per proxy mode) behind one small interface, and their registries.

Every backend consumes the same service plan (:mod:`kubeproxy.backends.planning`,
:mod:`kubeproxy.model.plan`) and only translates it into its data plane. The interface:

* ``start`` / ``stop`` — lifecycle: check what the data plane needs (``nft`` here, IPVS
  modules, a BPF filesystem...) and acquire or release what the backend holds; ``start``
  raises :class:`BackendError` with a clear reason when the mode cannot run here.
* ``sync(snapshot, changed)`` — bring the kernel in line with the snapshot: ``changed``
  names the ServicePorts that changed since the previous successful sync, or is None for
  a full sync. Returns a :class:`SyncResult`; raises if nothing could be applied (the
  previous rules stay in place).
* ``check()`` — a cheap canary between syncs: None if what the backend programmed still
  looks intact, otherwise what is missing (the caller then forces a full sync).
* ``render(snapshot)`` — what a full sync would apply, in the backend's own terms (an nft
  script, an iptables-restore input...), touching nothing.

:data:`BACKENDS` maps each mode to its factory; :data:`CLEANUPS` maps every mode to a
function removing what that mode ever created, and :func:`cleanup_all` runs them all, as
upstream's ``kube-proxy --cleanup`` clears every mode whatever the current one.
:data:`COMPOSES` names the modes a mode runs inside itself (ebpf mode runs nftables').
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.iptables.cleanup import KeepMap

if TYPE_CHECKING:
    from kubeproxy.backends.iptables.proxier import Reopen
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import ServicePortName


class BackendError(RuntimeError):
    """A proxy mode cannot run on this machine; the message says why."""


@dataclass
class SyncResult:
    """What one sync did, for logs and metrics (the same fields in every mode)."""

    full: bool
    service_ports: int = 0
    rendered: int = 0
    # Kernel objects programmed besides the fixed skeleton: map and set elements in
    # nftables mode; chains beyond the fixed ones.
    elements: int = 0
    chains: int = 0
    operations: int = 0
    no_local_internal: int = 0
    no_local_external: int = 0
    # Where the time went: building the change (render) and the kernel calls (apply).
    render_seconds: float = 0.0
    apply_seconds: float = 0.0
    # One log line per destination two ServicePorts both claim.
    conflicts: list[str] = field(default_factory=list)
    # ServicePorts whose rules the kernel refused: left out, everything else applied.
    isolated: list[str] = field(default_factory=list)
    # A partial sync the kernel refused, repaired by a full sync in the same call.
    partial_failures: int = 0
    # Rules per table: all that are programmed, and those written by this sync (iptables).
    table_rules: dict[str, int] = field(default_factory=dict)
    table_rules_written: dict[str, int] = field(default_factory=dict)


# What SyncResult's elements, chains and operations count in each mode, for the sync's
# log line (the fields are shared; their meaning is the mode's).
SYNC_LOG_WORDS: dict[str, tuple[str, str, str]] = {
    "nftables": ("elements", "shared chains", "operations"),
    "ebpf": ("elements", "shared chains", "operations"),
    "iptables": ("rules", "dispatch chains", "chains written"),
    "ipvs": ("virtual and real servers", "chains", "netlink changes"),
}


class Backend(Protocol):
    mode: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def sync(self, snapshot: Snapshot, changed: set[ServicePortName] | None) -> SyncResult: ...

    def check(self) -> str | None: ...

    def render(self, snapshot: Snapshot) -> str: ...

    def counters(self) -> dict[str, int]:
        """Kernel packet counters behind metrics, by name (iptables mode's nfacct)."""
        ...


def _nftables(config: ProxyConfig) -> Backend:
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
    from kubeproxy.backends.iptables.proxier import IptablesBackend, open_runners
    from kubeproxy.dataplane.nfacct import NfacctCommand

    return IptablesBackend(
        config, open_runners(config), nfacct=NfacctCommand(), reopen=_reopen(config)
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
    from kubeproxy.backends.iptables.proxier import open_runners
    from kubeproxy.backends.ipvs.proxier import IpvsBackend
    from kubeproxy.dataplane.ipset import IpsetCommand
    from kubeproxy.dataplane.ipvs.netlink import NetlinkIpvs, NetlinkLinks

    return IpvsBackend(
        config,
        open_ipvs=NetlinkIpvs,
        links=NetlinkLinks(),
        ipset=IpsetCommand(),
        runners=open_runners(config),
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


BACKENDS: dict[str, Callable[[ProxyConfig], Backend]] = {
    "nftables": _nftables,
    "iptables": _iptables,
    "ipvs": _ipvs,
    "ebpf": _ebpf,
}

# Every mode that can leave state behind: cleanup also removes what another mode (or
# upstream kube-proxy in that mode) left.
CLEANUPS: dict[str, Callable[[], list[str]]] = {
    "nftables": _cleanup_nftables,
    "iptables": _cleanup_iptables,
    "ipvs": _cleanup_ipvs,
    "ebpf": _cleanup_ebpf,
}

# Modes that run another mode's backend inside them: switching to such a mode keeps
# that mode's state (ebpf mode's nftables tables carry everything the hooks do not).
COMPOSES: dict[str, tuple[str, ...]] = {"ebpf": ("nftables",)}


def cleanups(
    *, ebpf_pin_path: str | None = None, keep: KeepMap | None = None
) -> dict[str, Callable[[], list[str]]]:
    """:data:`CLEANUPS`, with ebpf mode's pins looked for under ``ebpf_pin_path``, and
    what ``keep`` names (a running mode's iptables chains and jumps) left alone."""
    out = dict(CLEANUPS)
    if ebpf_pin_path:
        out["ebpf"] = lambda: _cleanup_ebpf(ebpf_pin_path)
    if keep:
        out["iptables"] = lambda: _cleanup_iptables(keep)
        out["ipvs"] = lambda: _cleanup_ipvs(keep)
    return out


@runtime_checkable
class OwnsIptables(Protocol):
    """A backend that programs iptables (iptables and ipvs modes, which share names)."""

    def owned(self) -> KeepMap: ...


def owned_by(backend: Backend) -> KeepMap:
    """What ``backend`` owns under names another mode's cleanup would remove."""
    return backend.owned() if isinstance(backend, OwnsIptables) else {}


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


def cleanup_all(cleanups: dict[str, Callable[[], list[str]]] | None = None) -> list[str]:
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
