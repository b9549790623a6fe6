"""The nftables backend: translate the service plan into the ``kube-proxy`` tables.

The sync loop is :class:`~kubeproxy.backends.driver.SyncDriver`'s (full or partial, a
refused partial sync redone in full, invalidation after a failure, timing); both
families are one unit, applied in one transaction. The phases here:

1. ``_render`` — the plans of the ServicePorts this sync needs (all of them for a full
   sync, the changed ones otherwise) to their :class:`~.render.PortRules` (pure);
2. ``_full`` or ``_partial`` — build the whole transaction as data
   (:class:`~kubeproxy.dataplane.nftables.transaction.Transaction`) from the index and
   apply it once, atomically, for both families;
3. ``_isolate`` — only if the kernel refused a full sync: find the ServicePorts whose
   rules it refuses (by checking subsets), leave them out, apply the rest;
4. commit the index, and ``_report``.

**Full sync** (at start, after a failure, about hourly, and when node-level settings
change) rewrites everything without deleting the table, so the kernel's session-affinity
sets survive::

    add table ip kube-proxy; flush table ip kube-proxy       # every rule goes
    flush map ...                                            # every map we own is emptied
    delete chain/set <anything we no longer want>            # from a terse listing
    table ip kube-proxy { ...everything... }                 # declarative re-add

This also repairs whatever someone else changed or deleted. If the kernel refuses it (say,
an object of ours was redefined by hand with another type), the table is replaced
outright (``add; delete; table {}``), losing only affinity memory.

**Partial sync** sends only what the changed ServicePorts need: the diff between the
desired state of what they touch and the programmed index
(:mod:`~kubeproxy.backends.nftables.index`). It lists nothing.

**No single ServicePort can stop the sync of the others**: if the kernel refuses a
partial sync, a full sync follows at once (our picture of the kernel may be stale, or a
changed ServicePort is at fault). If it refuses a full sync, subsets of the table are
checked (``nft -c`` on a fresh table, so the result does not depend on what the kernel
holds) to find the ServicePorts it refuses; those are logged once with their name and
the kernel's reason, left out of the table (as if they did not exist), and retried when
they change and at every full sync; everything else is applied. If the kernel refuses
even the bare skeleton, the sync fails and the previous rules stay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kubeproxy.backends.base import BackendError, SyncResult
from kubeproxy.backends.driver import SyncDriver, Unit, first_line
from kubeproxy.backends.nftables.index import (
    Change,
    Contents,
    TableIndex,
    full_table,
    split_elements,
)
from kubeproxy.backends.nftables.render import PortRules, render_service_port
from kubeproxy.backends.nftables.table import (
    SKELETON_CHAINS,
    TABLE,
    TABLE_COMMENT,
    Vocabulary,
    static_sets,
)
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.kernel import dotted, kernel_version
from kubeproxy.dataplane.nftables.runner import NftError, NftRunner
from kubeproxy.dataplane.nftables.transaction import TableRef, Transaction
from kubeproxy.model.plan import FamilyPlan
from kubeproxy.model.planning import NodePlan
from kubeproxy.model.types import IPFamily, ServicePortName

log = logging.getLogger(__name__)

Key = tuple[IPFamily, ServicePortName]
LAST_TRANSACTION_LIMIT = 64 * 1024
# Elements in flight (in nft processes at once) when a new table is loaded in pieces
# (see _new_table_pieces).
NEW_TABLE_PIECE = 10_000
Updates = dict[IPFamily, dict[ServicePortName, PortRules | None]]


# A full sync's index and the table contents it was built with (one pass for both).
_Built = tuple[TableIndex, Contents]


def _build(fam: FamilyPlan, rules: Mapping[ServicePortName, PortRules]) -> _Built:
    contents = Contents()
    return TableIndex.build(fam, rules, contents), contents


def table_ref(family: IPFamily) -> TableRef:
    return TableRef(Vocabulary.of(family).table_family, TABLE)


@dataclass
class _Family:
    plan: FamilyPlan
    index: TableIndex | None  # None: unknown, the next sync must be full


# Upstream's NFTablesKubeProxyKernelVersion: older kernels lack what its rules use.
MIN_KERNEL = (5, 13)


class NftablesBackend(SyncDriver):
    """Programs the ``ip``/``ip6`` ``kube-proxy`` tables."""

    mode = ProxyMode.NFTABLES
    # A refused ServicePort's rules are not offered again until they change.
    _refused_until = "until it changes"

    def __init__(
        self, config: ProxyConfig, runner: NftRunner, *, release: str | None = None
    ) -> None:
        """``release``: the kernel's (``uname -r`` when None)."""
        super().__init__(config)
        self.runner = runner
        self.release = release
        self._families: dict[IPFamily, _Family] = {}
        # The rules the kernel refused, of each ServicePort the driver holds as refused.
        self._refused_rules: dict[Key, PortRules] = {}
        self.last_transaction = ""
        self.new_table_piece = NEW_TABLE_PIECE

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Refuses (BackendError, nothing touched) a kernel older than upstream's minimum
        for this mode, or an nft that cannot run."""
        kernel = kernel_version(self.release)
        if kernel < MIN_KERNEL:
            raise BackendError(
                f"nftables mode cannot run: it needs kernel {dotted(MIN_KERNEL)} or later "
                f"(this one is {dotted(kernel)}); use --proxy-mode iptables"
            )
        available: Callable[[], str | None] | None = getattr(self.runner, "available", None)
        reason = available() if available is not None else None
        if reason is not None:
            raise BackendError(f"nftables mode cannot run: {reason}")

    def stop(self) -> None:
        """Nothing to release: the tables stay, so traffic flows across a restart."""

    # ----------------------------------------------------------------- phases

    def _render(
        self, plan: NodePlan, names: Iterable[ServicePortName] | None
    ) -> tuple[Updates, int]:
        """New rules of ``names`` (every ServicePort when None), per family; None for a
        ServicePort that is gone from that family, or left out (isolated, unchanged).

        For a partial sync, endpoints keep their indexes in the backends maps (each
        ServicePort is rendered with its programmed rules); a full sync rewrites every
        element anyway and indexes them afresh, as a restarted proxy would."""
        updates: Updates = {}
        rendered = 0
        partial = names is not None
        for fam in plan.families:
            out: dict[ServicePortName, PortRules | None] = {}
            state = self._families.get(fam.family) if names is not None else None
            programmed = state.index.rules if state is not None and state.index else {}
            for name, port in plan.service_ports(fam, names).items():
                rules = (
                    render_service_port(port, fam, programmed.get(name))
                    if port is not None
                    else None
                )
                rendered += port is not None
                if partial and self._is_refused(key := (fam.family, name)):
                    # A full sync retries everything (and records what is refused).
                    if rules is not None and rules == self._refused_rules.get(key):
                        rules = None  # still what the kernel refused
                    else:
                        # Gone, or changed: retried now (a refusal means a full sync,
                        # which records it again).
                        self._forget_refused(key)
                        self._refused_rules.pop(key, None)
                out[name] = rules
            updates[fam.family] = out
        return updates, rendered

    def _full_tx(
        self,
        built: Mapping[IPFamily, _Built],
        existing: Mapping[IPFamily, dict[str, set[str]]] | None,
    ) -> Transaction:
        """The full sync over the ``existing`` objects of each table; replacing the
        tables outright when None."""
        tx = Transaction()
        for family, (index, contents) in built.items():
            t = table_ref(family)
            table = full_table(index.fam, contents)
            if existing is None:
                tx.add_table(t)
                tx.delete_table(t)
            else:
                ours = {s.name for s in table.sets}
                tx.add_table(t, TABLE_COMMENT)
                tx.flush_table(t)
                # Base chains are recreated, as upstream does on its first sync: the hook
                # or priority of an existing one cannot change (upstream's filter-output
                # runs at priority filter, ours at dstnat + 10), and nothing refers to
                # a base chain, so deleting it within the transaction costs nothing.
                bases = {c.name for c in table.chains if c.base is not None}
                for name in sorted(existing[family]["chain"] & bases):
                    tx.delete_chain(t, name)
                for s in static_sets(index.fam):
                    if s.name in existing[family][s.keyword]:
                        tx.flush_set(t, s.keyword, s.name)
                for chain in sorted(contents.shared_chains):
                    if chain.dests in existing[family]["set"]:
                        tx.flush_set(t, "set", chain.dests)
                    if chain.backends in existing[family]["map"]:
                        # Recreated rather than flushed: nft 1.0.6 cannot rebuild their
                        # "typeof ... th dport" type from the kernel, and would refuse the
                        # rules that use them (see Change.emit_shared_chains). They hold
                        # no state of their own, so nothing is lost.
                        tx.delete_set(t, "map", chain.backends)
                for keyword in ("map", "set"):
                    for name in sorted(existing[family][keyword] - ours):
                        tx.delete_set(t, keyword, name)
                wanted = SKELETON_CHAINS | set(contents.chains)
                for name in sorted(existing[family]["chain"] - wanted):
                    tx.delete_chain(t, name)
            tx.define_table(table)
        return tx

    def _apply(self, *txs: Transaction) -> None:
        self._record(txs)
        started = time.perf_counter()
        try:
            for tx in txs:
                if tx:
                    self.runner.apply(tx)
        finally:
            self._kernel_seconds += time.perf_counter() - started

    def _record(self, txs: Iterable[Transaction]) -> None:
        # What a sync applied (several transactions when a partial sync adds a shared
        # chain, or when the kernel refused one), for tests and debugging; only the
        # start of a big one (a full sync of a large cluster is tens of MB of text).
        for tx in txs:
            if len(self.last_transaction) >= LAST_TRANSACTION_LIMIT:
                break
            text = self.last_transaction + str(tx)
            if len(text) > LAST_TRANSACTION_LIMIT:
                text = text[:LAST_TRANSACTION_LIMIT] + f"\n... ({len(text)} bytes in all)\n"
            self.last_transaction = text

    def _check(self, tx: Transaction) -> str | None:
        started = time.perf_counter()
        try:
            self.runner.check(tx)
        except NftError as err:
            return first_line(err)
        finally:
            self._kernel_seconds += time.perf_counter() - started
        return None

    def _list(self, t: TableRef) -> dict[str, set[str]]:
        started = time.perf_counter()
        try:
            return self.runner.list_objects(t.family, t.name)
        finally:
            self._kernel_seconds += time.perf_counter() - started

    # ------------------------------------------------------------- full sync

    def _apply_everything(
        self, fams: Iterable[FamilyPlan], updates: Updates
    ) -> tuple[dict[IPFamily, TableIndex], int]:
        rules = {
            fam: {n: r for n, r in by_name.items() if r is not None}
            for fam, by_name in updates.items()
        }
        by_family = {f.family: f for f in fams}

        def build(keep: Callable[[Key], bool]) -> dict[IPFamily, _Built]:
            return {
                family: _build(
                    by_family[family], {n: r for n, r in rs.items() if keep((family, n))}
                )
                for family, rs in rules.items()
            }

        built = build(lambda _: True)
        try:
            operations = self._apply_full(built)
        except NftError as err:
            if err.incomplete:
                raise  # nft never answered: no ServicePort to blame, fail the sync
            refused = err
        else:
            self._record_isolated({}, rules)
            return {family: index for family, (index, _) in built.items()}, operations
        candidates = [(family, n) for family, rs in rules.items() for n in sorted(rs)]

        def refusal(keys: list[Key]) -> str | None:
            chosen = set(keys)
            return self._check(self._full_tx(build(chosen.__contains__), None))

        if refusal([]) is not None:
            raise refused  # not a ServicePort's fault: keep the previous rules
        bad = _isolate(candidates, refusal, first_line(refused))
        built = build(lambda key: key not in bad)
        operations = self._apply_full(built)
        self._record_isolated(bad, rules)
        return {family: index for family, (index, _) in built.items()}, operations

    def _apply_full(self, built: dict[IPFamily, _Built]) -> int:
        """Apply a full sync (flush and re-add; replace if refused); the operation count."""
        existing = {family: self._list(table_ref(family)) for family in built}
        try:
            stages = self._new_table_pieces(built, existing)
            if stages:
                self._apply_stages(stages)
                return sum(len(tx) for stage in stages for tx in stage)
            tx = self._full_tx(built, existing)
            self._apply(tx)
        except NftError as err:
            if err.incomplete:
                raise
            log.warning(
                "Full sync refused (%s); replacing the kube-proxy tables instead "
                "(session affinity memory is lost)",
                first_line(err),
            )
            tx = self._full_tx(built, None)
            self._apply(tx)
        return len(tx)

    def _new_table_pieces(
        self, built: Mapping[IPFamily, _Built], existing: Mapping[IPFamily, dict[str, set[str]]]
    ) -> list[list[Transaction]]:
        """A full sync into tables that do not exist yet, as several transactions when
        it is big, in stages to apply one after the other (the transactions of a stage
        in any order, or at once): empty if it is not big.

        ``nft`` holds its whole input's parse (and the kernel batch) at once: 285 MB for
        10,000 Services in one piece, about 30 MB per piece of 10,000 elements. Pieces
        are only safe when nothing exists yet: a ServicePort then goes from absent to
        complete in the transaction that adds its entry elements (the last stage: see
        split_elements), exactly as in one transaction, while an existing table must
        change atomically. If a piece is refused, the caller replaces the tables in one
        transaction, as for any refused full sync.
        """
        if any(objects["chain"] for objects in existing.values()):
            return []
        tables = [full_table(index.fam, contents) for index, contents in built.values()]
        if sum(len(s.elements) for table in tables for s in table.sets) <= self.new_table_piece:
            return []
        # new_table_piece elements in flight at most, however many nft processes.
        piece = max(1, self.new_table_piece // getattr(self.runner, "concurrent_applies", 1))
        first = Transaction()
        early: list[Transaction] = []
        late: list[Transaction] = []
        for table in tables:
            before, after = split_elements(table, piece)
            first.add_table(table.ref, TABLE_COMMENT)
            first.define_table(table)
            for stage, split in ((early, before), (late, after)):
                for name, elements in split:
                    stage.append(Transaction())
                    stage[-1].add_elements(table.ref, name, elements)
        # The entry pieces one at a time, in order: Services become reachable in the
        # order of their names, the last one last (one at a time costs little: there
        # are few of them, and they are small).
        return [stage for stage in ([first], early, *([tx] for tx in late)) if stage]

    def _apply_stages(self, stages: list[list[Transaction]]) -> None:
        """Each stage's transactions, ``concurrent_applies`` at a time where the runner
        allows it (``nft`` processes: most of a piece's time is nft parsing it, so two
        at once halve the load of a new table on a 2-CPU node, for a second piece's
        memory); a stage starts when the previous one is committed. Every piece goes
        to the runner's ``apply_separately`` where it has one (an ``nft`` process,
        however small the piece). The first refusal is raised once the stage's others
        have finished."""
        workers = getattr(self.runner, "concurrent_applies", 1)
        apply = getattr(self.runner, "apply_separately", self.runner.apply)
        for stage in stages:
            self._record(stage)
            started = time.perf_counter()
            try:
                if workers < 2 or len(stage) < 2:
                    for tx in stage:
                        apply(tx)
                    continue
                with ThreadPoolExecutor(min(workers, len(stage)), "nft-piece") as pool:
                    done = [pool.submit(apply, tx) for tx in stage]
            finally:
                self._kernel_seconds += time.perf_counter() - started
            for future in done:
                future.result()

    # ---------------------------------------------------------- partial sync

    def _changes(self, updates: Updates) -> tuple[dict[IPFamily, Change], Transaction, Transaction]:
        changes: dict[IPFamily, Change] = {}
        pre = Transaction()
        main = Transaction()
        for family, by_name in updates.items():
            index = self._families[family].index
            assert index is not None
            change = changes[family] = index.change(by_name)
            change.emit_shared_chains(pre, table_ref(family))
            change.emit(main, table_ref(family))
        return changes, pre, main

    def _partial(
        self, plan: NodePlan, unit: Unit, changed: set[ServicePortName], result: SyncResult
    ) -> None:
        """Only what the changed ServicePorts need, diffed against the index; an
        NftError if the kernel refused it (nothing changed)."""
        updates, rendered = self._render(plan, changed)
        result.rendered += rendered
        changes, pre, main = self._changes(updates)
        # New shared chains first, in a transaction of their own (unreferenced until the
        # main one commits; see Change.emit_shared_chains).
        self._apply(pre)
        self._apply(main)
        result.operations += len(pre) + len(main)
        for family, change in changes.items():
            change.commit()
            result.conflicts.extend(c.message(family) for c in change.conflicts)

    def _record_isolated(
        self, bad: Mapping[Key, str], rules: Mapping[IPFamily, Mapping[ServicePortName, PortRules]]
    ) -> None:
        """After a full sync: exactly ``bad`` is left out now, with the rules refused."""
        planned = {(family, name) for family, names in rules.items() for name in names}
        self._record_refused(rules, bad, planned)
        self._refused_rules = {key: rules[key[0]][key[1]] for key in bad}

    # ----------------------------------------------------------------- public

    def _units(self, plan: NodePlan) -> list[Unit]:
        """Both families in one unit: one transaction programs them together."""
        return [plan.families]

    def _holds(self, unit: Unit) -> bool:
        return all(
            (state := self._families.get(fam.family)) is not None
            and state.plan == fam
            and state.index is not None
            for fam in unit
        )

    def _begin(self, plan: NodePlan) -> None:
        self.last_transaction = ""

    def _full(self, plan: NodePlan, unit: Unit, result: SyncResult) -> None:
        updates, rendered = self._render(plan, None)
        result.rendered += rendered
        indexes, operations = self._apply_everything(unit, updates)
        result.operations += operations
        self._families = {i.fam.family: _Family(i.fam, i) for i in indexes.values()}
        result.conflicts.extend(
            c.message(family) for family, index in indexes.items() for c in index.conflicts()
        )

    def _invalidate(self) -> None:
        for state in self._families.values():
            state.index = None

    def counters(self) -> dict[str, int]:
        """None: upstream's nftables mode has no counter-based metrics either."""
        return {}

    def check(self) -> str | None:
        """The canary: our tables and their base chains and maps still exist."""
        for family, state in self._families.items():
            t = table_ref(family)
            try:
                objects = self._list(t)
            except NftError as err:
                return first_line(err)
            missing = sorted(SKELETON_CHAINS - objects["chain"])
            missing += sorted(
                s.name for s in static_sets(state.plan) if s.name not in objects[s.keyword]
            )
            if missing:
                return f"table {t}: missing {', '.join(missing)}"
        return None

    def render_plan(self, plan: NodePlan) -> str:
        """The exact script a full sync of ``plan`` applies to an empty kernel.

        (On a live node a full sync also flushes and deletes what is already there; the
        objects it then defines are the same.)
        """
        updates, _ = self._render(plan, None)
        by_family = {f.family: f for f in plan.families}
        built = {
            family: _build(by_family[family], {n: r for n, r in by_name.items() if r is not None})
            for family, by_name in updates.items()
        }
        return str(self._full_tx(built, None))

    def _report(self, plan: NodePlan, result: SyncResult) -> None:
        for family, state in self._families.items():
            if state.index is not None:
                result.elements += state.index.elements
                result.chains += state.index.chains
                result.count_no_local(
                    family, state.index.no_local_internal, state.index.no_local_external
                )


def _isolate(
    candidates: list[Key], refusal: Callable[[list[Key]], str | None], reason: str
) -> dict[Key, str]:
    """The candidates the kernel refuses (with its reason), found by checking subsets.

    ``reason`` is why all of them together were refused. Each candidate is tried
    together with those already accepted, so a ServicePort that is only refused next to
    another one is found too. ``refusal`` returns the kernel's reason, or None if it
    accepts. O(k log n) checks for k refused among n.
    """
    bad: dict[Key, str] = {}

    def search(accepted: list[Key], group: list[Key], known: str | None) -> list[Key]:
        if not group:
            return []
        why = known if known is not None else refusal(accepted + group)
        if why is None:
            return group
        if len(group) == 1:
            bad[group[0]] = why
            return []
        half = len(group) // 2
        good = search(accepted, group[:half], None)
        return good + search(accepted + good, group[half:], None)

    search([], candidates, reason)
    return bad


def cleanup(runner: NftRunner) -> list[str]:
    """Delete our tables (and nothing else; upstream's nftables mode uses the same
    names, so its leftovers go too); returns what was removed."""
    ours = {Vocabulary.of(f).table_family for f in IPFamily}
    # Each table by name: listing every table would fetch the whole ruleset (iptables-nft
    # mode's rules too), again and again while a running proxy changes it.
    present = [(fam, TABLE) for fam in sorted(ours) if runner.has_table(fam, TABLE)]
    if present:
        tx = Transaction()
        for fam, name in present:
            tx.delete_table(TableRef(fam, name))
        runner.apply(tx)
    return [f"table {fam} {name}" for fam, name in present]
