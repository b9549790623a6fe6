"""The interface every proxy mode's backend implements, what a sync returns, and the
errors a backend raises. Imported by the backends themselves and by their callers (the
composition root, metrics); imports only the configuration, the model and the dataplane,
so no backend needs the registry (:mod:`kubeproxy.backends.registry`) that names them.

The interface:

* ``start`` / ``stop`` — lifecycle: check what the data plane needs (``nft`` here, IPVS
  modules, a BPF filesystem...) and acquire or release what the backend holds; ``start``
  raises :class:`BackendError` with a clear reason when the mode cannot run here.
* ``sync(snapshot, changed)`` — bring the kernel in line with the snapshot: ``changed``
  names the ServicePorts that changed since the previous successful sync, or is None for
  a full sync. Returns a :class:`SyncResult`; raises if nothing could be applied (the
  previous rules stay in place). :class:`PlannedBackend` builds the sync's
  :class:`~kubeproxy.model.planning.NodePlan` once (``plan``) and hands it to the mode's
  ``sync_plan``: no backend plans or re-decides a policy itself.
* ``check()`` — a cheap canary between syncs: None if what the backend programmed still
  looks intact, otherwise what is missing (the caller then forces a full sync).
* ``render(snapshot)`` / ``render_plan(plan)`` — what a full sync would apply, in the
  backend's own terms (an nft script, an iptables-restore input...), touching nothing.
* ``counters()`` — kernel packet counters behind metrics.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.iptables.cleanup import KeepMap
from kubeproxy.model.planning import NodePlan, plan_node
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import IPFamily, ServicePortName


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
    # Per IP family ("IPv4"/"IPv6"): ServicePorts with a Local traffic policy and no
    # local endpoint, (internal, external).
    no_local: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Where the time went: building the change (render) and the kernel calls (apply).
    render_seconds: float = 0.0
    apply_seconds: float = 0.0
    # One log line per destination two ServicePorts both claim.
    conflicts: list[str] = field(default_factory=list)
    # ServicePorts whose rules the kernel refused: left out, everything else applied.
    isolated: list[str] = field(default_factory=list)
    # Partial syncs the kernel refused, repaired by a full sync in the same call, per IP
    # family ("IPv4"/"IPv6").
    partial_failures: dict[str, int] = field(default_factory=dict)
    # Rules per (IP family, table): all that are programmed, and those written by this
    # sync (iptables).
    table_rules: dict[tuple[str, str], int] = field(default_factory=dict)
    table_rules_written: dict[tuple[str, str], int] = field(default_factory=dict)

    def partial_failed(self, families: Iterable[str], times: int = 1) -> None:
        """A partial sync of ``families`` was refused ``times`` times."""
        for family in families:
            self.partial_failures[family] = self.partial_failures.get(family, 0) + times

    def count_no_local(self, family: str, internal: int, external: int) -> None:
        """Add one family's ServicePorts without a local endpoint."""
        old_internal, old_external = self.no_local.get(family, (0, 0))
        self.no_local[family] = (old_internal + internal, old_external + external)


# What SyncResult's elements, chains and operations count in each mode, for the sync's
# log line (the fields are shared; their meaning is the mode's).
SYNC_LOG_WORDS: dict[ProxyMode, tuple[str, str, str]] = {
    ProxyMode.NFTABLES: ("elements", "shared chains", "operations"),
    ProxyMode.EBPF: ("elements", "shared chains", "operations"),
    ProxyMode.IPTABLES: ("rules", "dispatch chains", "chains written"),
    ProxyMode.IPVS: ("virtual and real servers", "chains", "netlink changes"),
    ProxyMode.KERNELSPACE: ("load balancers", "remote endpoints", "HNS changes"),
}


class Backend(Protocol):
    """What the composition root drives (every backend is a :class:`PlannedBackend`;
    the root needs only this)."""

    @property
    def mode(self) -> ProxyMode: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def sync(self, snapshot: Snapshot, changed: set[ServicePortName] | None) -> SyncResult: ...

    def check(self) -> str | None: ...

    def render(self, snapshot: Snapshot) -> str: ...

    def counters(self) -> dict[str, int]:
        """Kernel packet counters behind metrics, by name (iptables mode's nfacct)."""
        ...


class PlannedBackend(ABC):
    """What every backend shares before its own translation: the plan.

    The plan is built here, from the configuration's planning settings, and nowhere
    else; a backend translates the :class:`NodePlan` it is handed and never re-plans or
    re-decides a policy the plan states. A mode that runs another mode's backend inside
    it (ebpf runs nftables') hands that backend the same plan."""

    mode: ClassVar[ProxyMode]

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        # Families already warned about (no primary IP while NodePorts need one); None
        # after the first plan: the check scans every Service, too much for each sync.
        self._warned: set[IPFamily] | None = set()

    def plan(self, snapshot: Snapshot) -> NodePlan:
        warned, self._warned = self._warned, None
        return plan_node(self.config.planning, snapshot, warned)

    def sync(self, snapshot: Snapshot, changed: set[ServicePortName] | None) -> SyncResult:
        return self.sync_plan(self.plan(snapshot), changed)

    @abstractmethod
    def sync_plan(self, plan: NodePlan, changed: set[ServicePortName] | None) -> SyncResult: ...

    def render(self, snapshot: Snapshot) -> str:
        """What a full sync of ``snapshot`` applies, touching nothing (no warnings)."""
        return self.render_plan(plan_node(self.config.planning, snapshot))

    @abstractmethod
    def render_plan(self, plan: NodePlan) -> str: ...

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def check(self) -> str | None: ...

    @abstractmethod
    def counters(self) -> dict[str, int]: ...


@runtime_checkable
class OwnsIptables(Protocol):
    """A backend that programs iptables (iptables and ipvs modes, which share names)."""

    def owned(self) -> KeepMap: ...


def owned_by(backend: Backend) -> KeepMap:
    """What ``backend`` owns under names another mode's cleanup would remove."""
    return backend.owned() if isinstance(backend, OwnsIptables) else {}
