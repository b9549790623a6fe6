"""The ebpf backend: socket load-balancing for ClusterIPs, nftables for everything else.

Composition, not a copy: every sync programs the BPF service map from the service plans
(:mod:`.render`), then runs the nftables backend of the same process on the same
snapshot (so NodePorts, external traffic, REJECT/DROP, session affinity and the
ClusterIP rules for sockets outside the cgroup all work as in nftables mode). The map
goes first: a map write takes effect in microseconds, an nft transaction in
milliseconds, and a failing nftables sync must not hold the sockets' endpoints back.

* **full sync** (at start, when nftables does one, after a failure): the wanted entries
  of every ServicePort against what the map holds — our record of it, or after a
  restart what the pinned map itself holds (read back once), so a restart rewrites
  nothing that is already right and connections never see an empty map;
* **partial sync**: only the entries of the changed ServicePorts.

After a restart with a new map layout, the first sync fills the new maps before the
hooks are pointed at the new programs (:meth:`SockLB.attach`; otherwise they are
attached at start, so a refusal stops the start). After each map write, connected UDP
sockets the hooks had sent to an endpoint no longer in their frontend's list are
destroyed (``SOCK_DESTROY``), where nftables mode deletes their conntrack entries, by a
worker thread (:mod:`.teardown`: the walk over the cgroup's processes costs
milliseconds, the sync does not wait for it); TCP connections stay, as in nftables mode
(upstream clears UDP entries only).

When the node cannot run the hooks, start-up fails with the reason, unless the operator
chose ``--ebpf-fallback nftables`` (ours): then the reason is logged, hooks left by an
earlier run are removed (their maps would go stale) and the backend is nftables mode.

Two ServicePorts claiming one frontend: the first by name keeps it (nftables reports the
conflict). A failure leaves our record unknown; the next (full) sync reads the map again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from kubeproxy.backends.base import BackendError, PlannedBackend, SyncResult
from kubeproxy.backends.driver import SyncDriver, Unit
from kubeproxy.backends.ebpf.render import Entries, socket_entries
from kubeproxy.backends.ebpf.teardown import SocketTeardown
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.bpf.build import BuildError, build
from kubeproxy.dataplane.bpf.libbpf import BpfError
from kubeproxy.dataplane.bpf.socklb import (
    NONE,
    Backends,
    Frontend,
    ServiceTable,
    SockLB,
    SockLBError,
    Target,
    cgroup2_root,
    cleanup,
)
from kubeproxy.model.planning import NodePlan
from kubeproxy.model.types import L4Protocol, ServicePortName

log = logging.getLogger(__name__)


class SocketLB(Protocol):
    """What the backend needs of the loaded hooks (:class:`SockLB`, or a fake)."""

    services: ServiceTable

    def attach(self) -> None: ...

    def destroy_stale(self, stale: Iterable[tuple[Frontend, Target]]) -> int: ...

    def check(self) -> str | None: ...

    def close(self) -> None: ...


def socket_lb_opener(config: ProxyConfig) -> Callable[[], SocketLB]:
    """Build (if needed), load, attach and pin the hooks as ``config`` says."""

    def open_lb() -> SocketLB:
        cgroup = Path(config.ebpf_cgroup_path) if config.ebpf_cgroup_path else cgroup2_root()
        if cgroup is None:
            raise SockLBError("no cgroup v2 hierarchy is mounted (give --ebpf-cgroup-path)")
        return SockLB.open(build(Path(config.bpf_cache)), Path(config.ebpf_pin_path), cgroup)

    return open_lb


class EbpfBackend(SyncDriver):
    """The socket map is this mode's one unit on the shared sync loop (both families in
    one map); the nftables backend it runs is the other mode's loop, on the same plan."""

    mode = ProxyMode.EBPF

    def __init__(
        self, config: ProxyConfig, nftables: PlannedBackend, open_lb: Callable[[], SocketLB]
    ) -> None:
        super().__init__(config)
        self.nftables = nftables
        self._open_lb = open_lb
        self._lb: SocketLB | None = None
        # What the map holds, frontend -> endpoints (None: unknown, read it back).
        self._programmed: Entries | None = None
        # Its slots (a count slot and one per endpoint, each entry), kept as it changes:
        # counting them afresh walks every entry, 1-2 ms at 10,000 Services.
        self._slots = 0
        self._wanted: dict[ServicePortName, Entries] = {}
        self._owner: dict[Frontend, ServicePortName] = {}
        # How long the last sync took to bring the map in line (its change-to-effect),
        # and the CPU time this thread spent on it (the rest: waiting to be scheduled).
        self.map_seconds = 0.0
        self.map_cpu_seconds = 0.0
        # Running as nftables mode (--ebpf-fallback nftables, the hooks could not load).
        self.fallback = False
        # This sync's map writes: UDP targets a frontend lost, what each frontend has now.
        self._stale: list[tuple[Frontend, Target]] = []
        self._written: dict[Frontend, tuple[Target, ...]] = {}
        self.teardown = SocketTeardown(self.destroy_stale)

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.nftables.start()
        try:
            self._lb = self._open_lb()
        except (SockLBError, BuildError, BpfError) as err:
            if self.config.ebpf_fallback != "nftables":
                raise BackendError(
                    f"ebpf mode cannot run: {err} (--ebpf-fallback nftables runs nftables "
                    "mode instead)"
                ) from None
            log.error("ebpf mode cannot run, running as nftables mode (--ebpf-fallback): %s", err)
            self.fallback = True
            self._remove_stale_hooks()

    def _remove_stale_hooks(self) -> None:
        try:
            removed = cleanup(Path(self.config.ebpf_pin_path))
        except OSError as err:
            log.warning("ebpf mode: cannot remove the hooks of an earlier run: %s", err)
            return
        for what in removed:
            log.info("ebpf mode: removed %s (an earlier run's)", what)

    def stop(self) -> None:
        """Programs, links and maps stay pinned: sockets are served across a restart."""
        self.nftables.stop()
        self.teardown.close()
        if self._lb is not None:
            self._lb.close()
            self._lb = None

    @property
    def socket_lb(self) -> SocketLB:
        """The loaded hooks (after :meth:`start`)."""
        if self._lb is None:
            raise BackendError("ebpf mode: not started")
        return self._lb

    # ------------------------------------------------------------------ sync

    def sync_plan(self, plan: NodePlan, changed: set[ServicePortName] | None) -> SyncResult:
        """The socket map through the driver (full or partial, invalidated on failure),
        then nftables mode's sync of the same plan."""
        if self.fallback:
            return self.nftables.sync_plan(plan, changed)
        started, cpu = time.perf_counter(), time.thread_time()
        self._stale, self._written = [], {}
        maps = super().sync_plan(plan, changed)
        self.map_seconds = time.perf_counter() - started
        self.map_cpu_seconds = time.thread_time() - cpu
        if self._written:
            self.teardown.submit(self._stale, self._written)
        result = self.nftables.sync_plan(plan, changed)
        result.full = result.full or maps.full
        result.operations += maps.operations
        result.elements += self._slots
        for family, times in maps.partial_failures.items():
            result.partial_failed((family,), times)
        result.apply_seconds += self.map_seconds
        return result

    # ---------------------------------------------------- the driver's unit: the map

    def _units(self, plan: NodePlan) -> list[Unit]:
        return [tuple(plan.families)]

    def _holds(self, unit: Unit) -> bool:
        return self._programmed is not None

    def _partial(
        self, plan: NodePlan, unit: Unit, changed: set[ServicePortName], result: SyncResult
    ) -> None:
        self._sync_map(plan, changed, result)

    def _full(self, plan: NodePlan, unit: Unit, result: SyncResult) -> None:
        self._sync_map(plan, None, result)

    def _invalidate(self) -> None:
        self._programmed = None

    def _sync_map(
        self, plan: NodePlan, names: set[ServicePortName] | None, result: SyncResult
    ) -> None:
        """Bring the map's entries of ``names`` (all when None) in line with the plan.
        Map writes are one entry at a time, not a transaction: after a failure the map
        is read back before the next write (our record of it is unknown)."""
        lb = self.socket_lb
        try:
            if self._programmed is None:
                self._programmed = lb.services.dump()
                self._slots = sum(_slots(b) for b in self._programmed.values())
            touched = self._want(plan, names)
            result.operations += self._write(
                lb.services, self._programmed, touched, self._stale, self._written
            )
            lb.attach()
        except Exception:
            self._programmed = None
            raise

    def _want(self, plan: NodePlan, names: Iterable[ServicePortName] | None) -> set[Frontend]:
        """Update the wanted entries of ``names`` (all when None); the frontends touched."""
        plans: dict[ServicePortName, Entries] = {}
        for fam in plan.families:
            for name, port in plan.service_ports(fam, names).items():
                entries = plans.setdefault(name, {})
                if port is not None:
                    entries.update(socket_entries(port))
        if names is None:
            touched = set(self._owner) | set(self._programmed or ())
            self._wanted, self._owner = {}, {}
        else:
            touched = set()
            for name in plans:
                for frontend in self._wanted.pop(name, {}):
                    touched.add(frontend)
                    if self._owner.get(frontend) == name:
                        del self._owner[frontend]
        for name, entries in sorted(plans.items()):
            if entries:
                self._wanted[name] = entries
            for frontend in entries:
                touched.add(frontend)
                owner = self._owner.get(frontend)
                if owner is None or owner > name:
                    self._owner[frontend] = name
        return touched

    def _write(
        self,
        table: ServiceTable,
        programmed: Entries,
        touched: set[Frontend],
        stale: list[tuple[Frontend, Target]],
        written: dict[Frontend, tuple[Target, ...]],
    ) -> int:
        """Bring ``touched`` frontends in line; add to ``stale`` the targets UDP frontends
        lost, to ``written`` what each frontend written now has."""
        operations = 0
        for frontend in sorted(touched):
            owner = self._owner.get(frontend)
            want: Backends = self._wanted[owner][frontend] if owner else NONE
            have = programmed.get(frontend, NONE)
            if want == have:
                continue
            operations += table.write(frontend, want, before=have)
            self._slots += _slots(want) - _slots(have)
            written[frontend] = want.targets
            if frontend.protocol is L4Protocol.UDP:  # TCP connections stay, as upstream's
                kept = set(want.targets)
                stale.extend((frontend, t) for t in have.targets if t not in kept and t.ip)
            if want.targets:
                programmed[frontend] = want
            else:
                programmed.pop(frontend, None)
        return operations

    def destroy_stale(self, stale: list[tuple[Frontend, Target]]) -> int:
        """(On the teardown worker.) Sockets to removed endpoints, destroyed."""
        lb = self._lb
        return 0 if lb is None else lb.destroy_stale(stale)

    # ---------------------------------------------------------------- others

    def check(self) -> str | None:
        problem = self.nftables.check()
        if problem is None and self._lb is not None:
            problem = self._lb.check()
        return problem

    def render_plan(self, plan: NodePlan) -> str:
        """The nftables script, then the socket map's entries as nft comments."""
        lines = ["", "# ebpf mode: socket load-balancing (kp_svc4), frontend -> endpoints"]
        for fam in plan.families:
            for _, port in sorted(plan.service_ports(fam).items()):
                if port is None:
                    continue
                for frontend, backends in socket_entries(port).items():
                    to = ", ".join(str(t) for t in backends.targets)
                    affinity = f" (ClientIP affinity {backends.affinity}s)" * bool(
                        backends.affinity
                    )
                    lines.append(f"# {frontend} -> {to}{affinity}")
        return self.nftables.render_plan(plan) + "\n".join(lines) + "\n"

    def counters(self) -> dict[str, int]:
        """nftables mode's, and the socket teardown's (metrics read them at scrape time)."""
        out = dict(self.nftables.counters())
        if not self.fallback:
            stats = self.teardown.stats
            out["ebpf_sockets_destroyed"] = stats.destroyed
            out["ebpf_socket_teardown_failures"] = stats.failures
            out["ebpf_socket_teardown_dropped"] = stats.dropped
        return out


def _slots(entry: Backends) -> int:
    """The map slots an entry takes (none without endpoints: no entry)."""
    return 1 + len(entry.targets) if entry.targets else 0
