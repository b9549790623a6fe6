"""The one sync loop every proxy mode runs: what a sync does besides translating.

:class:`SyncDriver` owns, once for every mode:

* **full or partial**: a sync is full when the caller asks (``changed`` is None), or
  when the mode does not hold a valid picture of a unit (after a failure, at the first
  sync, or when the unit's node-level plan changed); otherwise only the changed
  ServicePorts are translated and applied;
* **a refused partial sync** becomes a full sync in the same call (the mode's picture of
  the kernel may be stale, or a changed ServicePort is refused: a full sync settles both
  and isolates what the kernel refuses), counted in ``partial_failures``; a tool that hung
  or vanished (``incomplete``) fails the sync instead, as a full sync would only wait
  again;
* **a failed sync** leaves the kernel's previous rules (the modes apply atomically) and
  marks everything the mode holds invalid, so the retry (the runner's) is full;
* **refused ServicePorts**: how a refusal is pinned on a ServicePort is the tool's
  (nftables mode checks halves with ``nft -c``, iptables mode reads the refused line);
  what follows is the driver's: the mode hands the ServicePorts it left out of a full
  sync to :meth:`_record_refused`, which keeps them, logs each newly refused one once
  (and each accepted again), and names them in every sync's result (``isolated``);
* **timing**: ``apply_seconds`` is the time in kernel calls the mode measured
  (``_kernel_seconds``), ``render_seconds`` the rest.

A mode implements the translation in units: the families it applies together
(nftables mode programs both families in one transaction; iptables, ipvs and
kernelspace modes one family at a time; ebpf mode's socket map holds both), and for a
unit ``_holds``, ``_partial`` and ``_full``; plus ``_invalidate`` and ``_report``.
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol

from kubeproxy.backends.base import PlannedBackend, SyncResult
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.errors import DataplaneError, DataplaneInputError
from kubeproxy.model.plan import FamilyPlan
from kubeproxy.model.planning import NodePlan
from kubeproxy.model.types import IPFamily, ServicePortName

log = logging.getLogger(__name__)

Unit = tuple[FamilyPlan, ...]
Key = tuple[IPFamily, ServicePortName]
Isolated = Mapping[Key, str]


class SyncDriver(PlannedBackend):
    """:meth:`sync_plan` for every mode; the mode fills in the translation."""

    # Seconds spent in kernel calls during the current sync (the mode adds to it).
    _kernel_seconds: float = 0.0
    # For the log line of a refused ServicePort: who refused, and how long it stays out.
    _refuser = "the kernel"
    _refused_until = "until the next full sync"

    def __init__(self, config: ProxyConfig) -> None:
        super().__init__(config)
        self._refused: dict[Key, str] = {}

    def sync_plan(self, plan: NodePlan, changed: set[ServicePortName] | None) -> SyncResult:
        """Bring the kernel in line with ``plan``. ``changed=None`` forces a full sync."""
        started = time.perf_counter()
        self._kernel_seconds = 0.0
        result = SyncResult(full=False, service_ports=len(plan.snapshot.services))
        try:
            self._begin(plan)
            for unit in self._units(plan):
                if changed is not None and self._holds(unit):
                    try:
                        self._partial(plan, unit, changed, result)
                        continue
                    except DataplaneError as err:
                        if err.incomplete or isinstance(err, DataplaneInputError):
                            raise  # hung or missing, or our own bug: a full sync won't help
                        log.warning("Partial sync refused (%s); doing a full sync", first_line(err))
                        result.partial_failed(fam.family for fam in unit)
                self._full(plan, unit, result)
                result.full = True
        except Exception:
            # The kernel kept the previous rules; our picture of them may be stale.
            self._invalidate()
            raise
        self._report(plan, result)
        result.isolated = sorted(
            f"{name} ({family.value}): {reason}" for (family, name), reason in self._refused.items()
        )
        result.apply_seconds = self._kernel_seconds
        result.render_seconds = time.perf_counter() - started - self._kernel_seconds
        return result

    # ------------------------------------------------------------ the mode's part

    def _begin(self, plan: NodePlan) -> None:
        """Before the units (node-level preparation); nothing by default."""

    @abstractmethod
    def _units(self, plan: NodePlan) -> Sequence[Unit]:
        """The families this mode serves, grouped as it applies them."""

    @abstractmethod
    def _holds(self, unit: Unit) -> bool:
        """Whether the mode holds a valid picture of ``unit`` as planned now (if not,
        the unit's sync is full)."""

    @abstractmethod
    def _partial(
        self, plan: NodePlan, unit: Unit, changed: set[ServicePortName], result: SyncResult
    ) -> None:
        """Translate and apply the ``changed`` ServicePorts of ``unit``; a
        :class:`DataplaneError` if the kernel refused (nothing applied)."""

    @abstractmethod
    def _full(self, plan: NodePlan, unit: Unit, result: SyncResult) -> None:
        """Translate and apply everything of ``unit``, leaving out (and reporting in
        :meth:`_record_refused`) what the kernel refuses; raises if nothing could be applied."""

    @abstractmethod
    def _invalidate(self) -> None:
        """After a failed sync: nothing held is trusted (the next sync is full)."""

    def _report(self, plan: NodePlan, result: SyncResult) -> None:
        """Fill in the mode's counts after a successful sync; nothing by default."""

    # ----------------------------------------------------- the driver's, for the mode

    def _record_refused(
        self,
        families: Iterable[IPFamily],
        refused: Isolated,
        planned: Collection[Key],
    ) -> None:
        """After a full sync of ``families``: exactly ``refused`` (ServicePort -> the
        tool's reason) is left out of them now. A newly refused ServicePort, or one
        refused for another reason, is logged once; one no longer refused and still
        ``planned`` is logged as accepted again."""
        scope = set(families)
        before = {k: r for k, r in self._refused.items() if k[0] in scope}
        for key, reason in sorted(refused.items()):
            if before.get(key) != reason:
                log.error(
                    "Service port %s (%s): %s refused its rules (%s); leaving it out %s, "
                    "every other Service port is programmed",
                    key[1], key[0].value, self._refuser, reason, self._refused_until,
                )  # fmt: skip
        for key in sorted(before.keys() - refused.keys()):
            if key in planned:
                log.info("Service port %s (%s) is accepted again", key[1], key[0].value)
        self._refused = {
            **{k: r for k, r in self._refused.items() if k[0] not in scope},
            **refused,
        }

    def _is_refused(self, key: Key) -> bool:
        return key in self._refused

    def _forget_refused(self, key: Key) -> None:
        """``key`` changed since it was refused: it is offered to the kernel again."""
        self._refused.pop(key, None)


class HeldFamily(Protocol):
    """What a per-family mode holds of a family between syncs."""

    plan: FamilyPlan
    valid: bool  # False: the kernel may differ from what is held (the next sync is full)


class PerFamilyDriver(SyncDriver):
    """A mode applied one family at a time (iptables, ipvs): one unit per family it has
    runners for, held valid while its node-level plan is unchanged."""

    runners: Mapping[IPFamily, object]
    _families: Mapping[IPFamily, HeldFamily]

    def _fams(self, plan: NodePlan) -> list[FamilyPlan]:
        """The families this backend has runners for."""
        return [f for f in plan.families if f.family in self.runners]

    def _units(self, plan: NodePlan) -> list[Unit]:
        return [(fam,) for fam in self._fams(plan)]

    def _holds(self, unit: Unit) -> bool:
        (fam,) = unit
        state = self._families.get(fam.family)
        return state is not None and state.valid and state.plan == fam

    def _invalidate(self) -> None:
        for state in self._families.values():
            state.valid = False


def first_line(err: Exception) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
