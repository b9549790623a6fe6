"""The iptables backend: translate the service plan into upstream's iptables layout.

``sync`` runs named phases, per IP family (iptables and ip6tables are separate):

1. ``_plan`` / ``_render`` — family plans and ServicePort plans (shared with every
   backend), each plan to its :class:`~.render.PortRules` (pure);
2. ``_full`` or ``_partial`` — build one ``iptables-restore --noflush`` input
   (:class:`~kubeproxy.dataplane.iptables.restore.Restore`) and apply it;
3. commit what is programmed, and ``_report``.

**Full sync** (at start, after a failure, about hourly, when node-level settings change):
make sure the jump rules from the built-in chains and the canary chains exist (one
``iptables -C``/``-I`` per rule, as upstream, since a restore cannot "ensure" a rule in a
chain it does not own), then one restore that declares (so flushes) and fills the chains
of ours that differ from what the kernel holds (``iptables-save``, compared in its
canonical form by :mod:`.diff`; every chain when the table holds none of our generated
chains yet), rewrites the fixed chains (``KUBE-SERVICES``...) and deletes the generated
chains no longer wanted (``KUBE-SVC-``, ``KUBE-SEP-``...). So a restart over an intact
table writes a few dozen rules, and a chain changed by hand is found and rewritten.
The ServicePorts' rules are rendered twice: once for the dispatch trees and for what is
kept between syncs (:class:`_Held`: per chain only its rule count and a hash), then again
while the restore input is streamed to iptables-restore (which parses as it reads, on
the other CPU), so the 300,000 rules of 10,000 Services x 10 endpoints are never all
held.

**Partial sync**: only the changed ServicePorts' own chains, and the dispatch-tree chains
on the paths of the destinations they added or removed (:mod:`.dispatch`), are declared
and refilled (those whose new rules hash as the kept ones are left alone); chains
nothing uses any more are deleted. Upstream rewrites the whole of
``KUBE-SERVICES`` on every sync; here a change costs O(its own rules + tree depth x 16).

A refused restore changes nothing in the table that failed (iptables-restore commits a
table at a time); our picture of the kernel may be stale, so the next sync is full. The
canary check between changes looks for ``KUBE-PROXY-CANARY`` in mangle, nat and filter.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kubeproxy.backends.base import BackendError, SyncResult
from kubeproxy.backends.driver import PerFamilyDriver, Unit
from kubeproxy.backends.iptables.diff import Canonical, differing, rule_text
from kubeproxy.backends.iptables.dispatch import Args, DispatchTree, EntryId
from kubeproxy.backends.iptables.names import (
    FIXED_CHAINS,
    KUBE_FIREWALL,
    KUBE_PROXY_CANARY,
    is_generated,
)
from kubeproxy.backends.iptables.render import (
    JUMPS,
    KUBELET_JUMPS,
    NFACCT_COUNTERS,
    TREES,
    Entry,
    FixedChains,
    PortRules,
    Settings,
    fixed_chains,
    jump_args,
    render_service_port,
)
from kubeproxy.backends.iptables.runners import Reopen, working_runners
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.iptables.cleanup import NOTHING, Keep, KeepMap, cleanup_chains
from kubeproxy.dataplane.iptables.listing import UnreadableTableError
from kubeproxy.dataplane.iptables.restore import Restore
from kubeproxy.dataplane.iptables.rules import RuleError, canonical_text
from kubeproxy.dataplane.iptables.runner import (
    FLAVORS,
    Iptables,
    IptablesCommand,
    IptablesError,
)
from kubeproxy.dataplane.nfacct import Nfacct, NfacctError
from kubeproxy.model.plan import FamilyPlan
from kubeproxy.model.planning import NodePlan
from kubeproxy.model.types import IPFamily, ServicePortName

log = logging.getLogger(__name__)

# Upstream's largeClusterEndpointsThreshold: above it, SVC/SEP rules lose their comments.
LARGE_CLUSTER_ENDPOINTS = 1000
CANARY_TABLES = ("mangle", "nat", "filter")
# A full sync tries again at most this many times, each time without one more refused
# ServicePort (each try is a whole restore).
MAX_ISOLATED = 8

# ``last_restore`` keeps at most this much text, and only of restores this small.
LAST_RESTORE_LIMIT = 64 * 1024
LAST_RESTORE_RULES = 2000
Updates = dict[ServicePortName, PortRules | None]
Chains = dict[str, dict[str, tuple[Args, ...]]]  # table -> chain -> rules
OwnChains = Iterator[tuple[str, tuple[Args, ...]]]


@dataclass(frozen=True, slots=True)
class _Held:
    """What is kept of a programmed ServicePort's rules (:class:`PortRules`) between
    syncs: its dispatch entries whole (the trees rewrite their neighbours' rules), its
    own chains only as (name, rule count, hash of the rules). At 10,000 Services x 10
    endpoints the rules themselves are 300,000 tuples, over 100 MB; a partial sync
    compares a new rendering with the hashes. The hashes are Python's, of tuples of
    strings: two different renderings of a chain colliding is a 2**-64 chance.
    """

    entries: tuple[Entry, ...]
    chains: tuple[tuple[str, int, int], ...]
    no_local_internal: bool
    no_local_external: bool

    @classmethod
    def of(cls, port: PortRules) -> _Held:
        return cls(
            port.entries,
            tuple((chain, len(rules), hash(rules)) for chain, rules in port.chains),
            port.no_local_internal,
            port.no_local_external,
        )


@dataclass
class _Desired:
    """The chains a family's full sync wants, per table, in the order they were built;
    ``fixed``: the non-generated ones, rewritten at every full sync. The ServicePorts'
    own nat chains are not held: ``own`` renders them again (the same rules each time)
    when the restore input is printed, and ``own_counts`` says how many rules each has.
    """

    chains: Chains = field(default_factory=lambda: {"filter": {}, "nat": {}})
    fixed: dict[str, set[str]] = field(default_factory=lambda: {"filter": set(), "nat": set()})
    own: Callable[[], OwnChains] = lambda: iter(())
    own_counts: dict[str, int] = field(default_factory=dict)

    def restore(self, only: Mapping[str, set[str]] | None = None) -> Restore:
        """Declare and fill every chain (or those in ``only``, per table)."""
        restore = Restore()
        for table, chains in self.chains.items():
            for chain, rules in chains.items():
                if only is None or chain in only[table]:
                    restore.chain(table, chain)
                    restore.rules(table, chain, rules)
        own = [c for c in self.own_counts if only is None or c in only["nat"]]
        for chain in own:
            restore.chain("nat", chain)
        if own:
            wanted = None if only is None else set(own)
            restore.lazy_rules(
                "nat",
                sum(self.own_counts[c] for c in own),
                lambda: (
                    (chain, args)
                    for chain, rules in self.own()
                    if wanted is None or chain in wanted
                    for args in rules
                ),
            )
        return restore


@dataclass
class _Family:
    """What one family's tables hold, as far as ServicePorts are concerned."""

    plan: FamilyPlan
    settings: Settings
    rules: dict[ServicePortName, _Held] = field(default_factory=dict)
    trees: dict[str, DispatchTree] = field(default_factory=dict)
    valid: bool = True  # False: unknown (a restore failed), the next sync must be full
    fixed_rules: dict[str, int] = field(default_factory=dict)  # per table
    own_rules: int = 0  # the ServicePorts' own (nat) chains

    @property
    def rules_per_table(self) -> dict[str, int]:
        counts = dict(self.fixed_rules)
        counts["nat"] = counts.get("nat", 0) + self.own_rules
        for tree in TREES:
            counts[tree.table] = counts.get(tree.table, 0) + self.trees[tree.id].rule_count
        return counts

    no_local_internal: int = 0
    no_local_external: int = 0


class IptablesBackend(PerFamilyDriver):
    """Programs upstream's iptables layout (``KUBE-SERVICES``, ``KUBE-SVC-...``) per family."""

    mode = ProxyMode.IPTABLES
    _refuser = "iptables"

    def __init__(
        self,
        config: ProxyConfig,
        runners: Mapping[IPFamily, Iptables],
        *,
        proc: Path,
        tcp_be_liberal: bool = False,
        nfacct: Nfacct | None = None,
        reopen: Reopen | None = None,
    ) -> None:
        """``proc``: the /proc of the node's network namespace, which :func:`init_node`
        writes (no default: only the production entry point names the host's).
        ``reopen``: with ``--iptables-backend auto``, the other flavour's runners, in
        case the detected one does not work here (see :func:`working_runners`)."""
        super().__init__(config)
        self.runners: dict[IPFamily, Iptables] = dict(runners)
        self.reopen = reopen
        self.tcp_be_liberal = tcp_be_liberal
        self.nfacct = nfacct
        # The nfacct counters that exist: only those are named in rules.
        self.accounting: frozenset[str] = frozenset()
        self.proc = proc
        self._families: dict[IPFamily, _Family] = {}
        self.last_restore = ""
        self._written: dict[tuple[str, str], int] = {}
        # iptables-nft-restore keeps every chain name its input mentions in a sorted list
        # it walks from the smallest name for each command (quadratic in chains); one
        # command naming no chain (``-S``) makes it fetch the whole table instead and
        # skip that list. Into a table holding none of our chains (nothing big to fetch
        # or list: the listing is discarded anyway) that is faster (bench/RESULTS.md);
        # over one of ours, fetching it all is slower than the few chains a diff writes.
        self.list_first = True

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        for family, runner in self.runners.items():
            reason = runner.available()
            if reason is not None:
                raise BackendError(f"iptables mode cannot run ({family.value}): {reason}")
        self.runners = working_runners(self.runners, self.reopen)
        # As upstream: with nf_conntrack_tcp_be_liberal set, no DROP of INVALID packets.
        liberal = self.proc / "sys/net/netfilter/nf_conntrack_tcp_be_liberal"
        with contextlib.suppress(OSError, ValueError):
            self.tcp_be_liberal = self.tcp_be_liberal or int(liberal.read_text()) != 0
        if IPFamily.IPv4 in self.runners:
            init_node(self.config, self.proc)
        self.accounting = self._ensure_counters()

    def _ensure_counters(self) -> frozenset[str]:
        """Create upstream's nfacct counters, as it does at start: all or none."""
        if self.nfacct is None:
            return frozenset()
        try:
            for name in NFACCT_COUNTERS:
                self.nfacct.ensure(name)
        except NfacctError as err:
            log.warning(
                "nfacct counters unavailable (%s): the metrics counting localhost NodePort "
                "and INVALID conntrack packets are not reported",
                err,
            )
            return frozenset()
        return frozenset(NFACCT_COUNTERS)

    def counters(self) -> dict[str, int]:
        """Packets counted by each nfacct counter the rules feed (read at scrape time)."""
        if self.nfacct is None or not self.accounting:
            return {}
        try:
            counted = self.nfacct.packets()
        except NfacctError:
            return {}
        return {name: n for name, n in counted.items() if name in self.accounting}

    def stop(self) -> None:
        """Nothing to release: the rules stay, so traffic flows across a restart."""

    def owned(self) -> KeepMap:
        """The chains and jumps this backend owns, per flavour and family it drives."""
        mine = owned()
        return {(runner.flavor, family): mine for family, runner in self.runners.items()}

    # ----------------------------------------------------------------- phases

    def _render(
        self,
        node_plan: NodePlan,
        fam: FamilyPlan,
        settings: Settings,
        names: Iterable[ServicePortName] | None,
    ) -> Updates:
        return {
            name: render_service_port(plan, fam, settings) if plan is not None else None
            for name, plan in node_plan.service_ports(fam, names).items()
        }

    def _settings(self, node_plan: NodePlan, fam: FamilyPlan) -> Settings:
        endpoints = sum(len(eps) for eps in node_plan.snapshot.endpoints.values())
        runner = self.runners[fam.family]
        return Settings(
            comments=endpoints <= LARGE_CLUSTER_ENDPOINTS,
            random_fully=runner.has_random_fully,
            accounting=self.accounting,
        )

    def _apply(self, runner: Iptables, restore: Restore) -> None:
        for table, part in restore:
            key = (runner.family, table)
            self._written[key] = self._written.get(key, 0) + part.rule_count
        declare_largest_first(restore)
        # For tests and debugging: what a sync applied, unless it is big (printing the
        # input of a large full sync twice would cost a second, and as much memory).
        if len(self.last_restore) < LAST_RESTORE_LIMIT:
            if restore.rule_count <= LAST_RESTORE_RULES:
                self.last_restore += str(restore)[:LAST_RESTORE_LIMIT]
            else:
                tables = ", ".join(table for table, _ in restore)
                self.last_restore += f"# a restore of {restore.rule_count} rules ({tables})\n"
        started = time.perf_counter()
        try:
            runner.restore(restore)
        finally:
            self._kernel_seconds += time.perf_counter() - started

    # ------------------------------------------------------------- full sync

    def _ensure_jumps(self, runner: Iptables, fam: FamilyPlan) -> None:
        started = time.perf_counter()
        try:
            for table in CANARY_TABLES:
                runner.ensure_chain(table, KUBE_PROXY_CANARY)
            # As upstream, kubelet's KUBE-FIREWALL and its jumps exist in every family,
            # whether or not its rule is written (IPv4 with localhost NodePorts only).
            for table, builtin, chain, comment, extra in (*JUMPS, *KUBELET_JUMPS):
                runner.ensure_chain(table, chain)
                runner.ensure_rule(table, builtin, jump_args(comment, extra, chain))
        finally:
            self._kernel_seconds += time.perf_counter() - started

    def _build(
        self,
        node_plan: NodePlan,
        fam: FamilyPlan,
        leave_out: Mapping[ServicePortName, str] | None = None,
    ) -> tuple[_Family, _Desired]:
        """Everything of one family: its state and its chains (without the ServicePorts
        in ``leave_out``). The ServicePorts' rules are rendered here for the state and
        the trees, then dropped, and rendered again as the restore input is printed
        (pass 2, :attr:`_Desired.own`): so they are never all held, and in a full load
        the second rendering runs while iptables-restore parses (a pipe; on 2 CPUs)."""
        settings = self._settings(node_plan, fam)
        plans = {
            n: p
            for n, p in node_plan.service_ports(fam, None).items()
            if p is not None and not (leave_out and n in leave_out)
        }
        state = _Family(fam, settings)
        desired = _Desired()
        per_tree: dict[str, list[tuple[int, EntryId, Args]]] = {t.id: [] for t in TREES}
        for name, plan in plans.items():
            held = _Held.of(render_service_port(plan, fam, settings))
            state.rules[name] = held
            state.no_local_internal += held.no_local_internal
            state.no_local_external += held.no_local_external
            for i, entry in enumerate(held.entries):
                per_tree[entry.tree].append((entry.key, (name, i), entry.args))
            for chain, count, _ in held.chains:
                desired.own_counts[chain] = count
                state.own_rules += count

        def own() -> OwnChains:
            for plan in plans.values():
                yield from render_service_port(plan, fam, settings).chains

        desired.own = own

        def fill(table: str, chain: str, chain_rules: Iterable[Args]) -> None:
            desired.chains[table][chain] = tuple(chain_rules)

        for tree in TREES:
            dt = DispatchTree(tree.id, tree.space(fam.family))
            state.trees[tree.id] = dt
            for chain, chain_rules in dt.build(per_tree[tree.id]).items():
                fill(tree.table, chain, chain_rules)
        fixed = self._fixed(fam, settings, state)
        for table, chains in (("filter", fixed.filter), ("nat", fixed.nat)):
            for chain, chain_rules in chains.items():
                fill(table, chain, chain_rules)
                desired.fixed[table].add(chain)
        state.fixed_rules = {
            "filter": sum(len(r) for r in fixed.filter.values()),
            "nat": sum(len(r) for r in fixed.nat.values()),
        }
        return state, desired

    def _full_family(self, node_plan: NodePlan, fam: FamilyPlan) -> _Family:
        """A full sync; a ServicePort whose rules iptables refuses is left out (logged
        once with iptables' reason) and everything else applied. The culprit is found
        from the line iptables reports; when the line names no ServicePort (legacy
        iptables reports kernel refusals at COMMIT), the sync fails and the previous rules
        stay."""
        runner = self.runners[fam.family]
        isolated: dict[ServicePortName, str] = {}
        self._ensure_jumps(runner, fam)
        while True:
            state, desired = self._build(node_plan, fam, isolated)
            restore = self._difference(runner, state.settings, desired)
            try:
                self._apply(runner, restore)
            except IptablesError as err:
                culprit = _culprit(err, state.rules)
                if culprit is None or culprit in isolated or len(isolated) >= MAX_ISOLATED:
                    raise
                isolated[culprit] = str(err).splitlines()[0]
                continue
            refused = {(fam.family, name): reason for name, reason in isolated.items()}
            planned = {(fam.family, name) for name in state.rules}
            self._record_refused((fam.family,), refused, planned)
            return state

    def _fixed(self, fam: FamilyPlan, settings: Settings, state: _Family) -> FixedChains:
        roots = {tree_id: dt.root_chain for tree_id, dt in state.trees.items()}
        return fixed_chains(fam, settings, roots, tcp_be_liberal=self.tcp_be_liberal)

    def _difference(self, runner: Iptables, settings: Settings, desired: _Desired) -> Restore:
        """What a full sync writes: the chains missing from the kernel or differing from
        it, the fixed chains, and the deletion of generated chains nothing wants."""
        canonical = _canonical(runner, settings)
        write: dict[str, set[str]] = {}
        stale: dict[str, list[str]] = {}
        fresh: list[str] = []
        for table, chains in desired.chains.items():
            own = desired.own_counts if table == "nat" else {}
            present, listed = self._listing(runner, table)
            if listed is None:
                write[table] = set(chains) | set(own)
                fresh.append(table)
            else:
                write[table] = desired.fixed[table] | differing(chains.items(), listed, canonical)
                if own:
                    write[table] |= differing(desired.own(), listed, canonical)
            stale[table] = sorted(
                c for c in present - chains.keys() - own.keys() if is_generated(c)
            )
        restore = desired.restore(write)
        if self.list_first and runner.flavor == "nft":
            for table in fresh:
                restore.table(table).list_first = True
        for table, names in stale.items():
            for chain in names:
                restore.delete(table, chain)
        return restore

    def _listing(
        self, runner: Iptables, table: str
    ) -> tuple[set[str], dict[str, list[str]] | None]:
        """The chains of ``table``, and their rules unless it holds none of our generated
        chains (then everything is written anyway, and listing the rules is skipped: in
        the nft flavour the names alone cost 35 ms where listing the rules costs seconds
        at 200,000 rules) or iptables cannot list them."""
        started = time.perf_counter()
        try:
            present = runner.chains(table)
            if not any(is_generated(c) for c in present):
                return present, None
            listed = runner.rules(table, present)
        except UnreadableTableError as err:
            log.warning(
                "Cannot compare the %s table with what we want (%s): rewriting it", table, err
            )
            return present, None
        finally:
            self._kernel_seconds += time.perf_counter() - started
        return set(listed), listed

    # ---------------------------------------------------------- partial sync

    def _apply_changes(self, state: _Family, updates: Updates) -> int:
        restore = Restore()
        removed: dict[str, list[tuple[int, EntryId]]] = {t.id: [] for t in TREES}
        added: dict[str, list[tuple[int, EntryId, Args]]] = {t.id: [] for t in TREES}
        write: dict[str, tuple[Args, ...]] = {}
        delete: set[str] = set()
        own_delta = 0
        held = {name: _Held.of(new) for name, new in updates.items() if new is not None}
        for name, new in updates.items():
            old = state.rules.get(name)
            if old == held.get(name):
                continue
            old_entries = old.entries if old is not None else ()
            new_entries = new.entries if new is not None else ()
            for i in range(max(len(old_entries), len(new_entries))):
                before = old_entries[i] if i < len(old_entries) else None
                after = new_entries[i] if i < len(new_entries) else None
                if before == after:
                    continue
                if before is not None:
                    removed[before.tree].append((before.key, (name, i)))
                if after is not None:
                    added[after.tree].append((after.key, (name, i), after.args))
            old_chains = {c: (n, h) for c, n, h in old.chains} if old is not None else {}
            new_chains = dict(new.chains) if new is not None else {}
            for chain, chain_rules in new_chains.items():
                if old_chains.get(chain) != (len(chain_rules), hash(chain_rules)):
                    write[chain] = chain_rules
            delete.update(old_chains.keys() - new_chains.keys())
            own_delta += sum(len(r) for r in new_chains.values())
            own_delta -= sum(n for n, _ in old_chains.values())
        for chain, chain_rules in write.items():
            restore.chain("nat", chain)
            restore.rules("nat", chain, chain_rules)
        for chain in sorted(delete - write.keys()):
            restore.delete("nat", chain)
        for tree in TREES:
            change = state.trees[tree.id].update(removed[tree.id], added[tree.id])
            for chain, chain_rules in change.write.items():
                restore.chain(tree.table, chain)
                restore.rules(tree.table, chain, chain_rules)
            for chain in change.delete:
                restore.delete(tree.table, chain)
        if restore:
            self._apply(self.runners[state.plan.family], restore)
        state.own_rules += own_delta
        for name in updates:
            old = state.rules.pop(name, None)
            if old is not None:
                state.no_local_internal -= old.no_local_internal
                state.no_local_external -= old.no_local_external
            now = held.get(name)
            if now is not None:
                state.rules[name] = now
                state.no_local_internal += now.no_local_internal
                state.no_local_external += now.no_local_external
        return restore.rule_count

    # ----------------------------------------------------------------- public

    def _begin(self, node_plan: NodePlan) -> None:
        self.last_restore = ""
        self._written = {
            (family, table): 0 for family in self.runners for table in ("filter", "nat")
        }

    def _partial(
        self, node_plan: NodePlan, unit: Unit, changed: set[ServicePortName], result: SyncResult
    ) -> None:
        (fam,) = unit
        state = self._families[fam.family]
        updates = self._render(node_plan, fam, state.settings, changed)
        result.rendered += sum(r is not None for r in updates.values())
        result.operations += self._apply_changes(state, updates)

    def _full(self, node_plan: NodePlan, unit: Unit, result: SyncResult) -> None:
        (fam,) = unit
        state = self._families[fam.family] = self._full_family(node_plan, fam)
        result.rendered += len(state.rules)

    def _report(self, node_plan: NodePlan, result: SyncResult) -> None:
        for family, state in self._families.items():
            for table, count in state.rules_per_table.items():
                result.table_rules[family, table] = count
            result.elements += sum(state.rules_per_table.values())
            result.chains += sum(len(t.nodes) for t in state.trees.values())
            result.count_no_local(family, state.no_local_internal, state.no_local_external)
        result.table_rules_written = dict(self._written)

    def check(self) -> str | None:
        """The canary: ``KUBE-PROXY-CANARY`` still exists in mangle, nat and filter."""
        for family, runner in self.runners.items():
            if family not in self._families:
                continue
            for table in CANARY_TABLES:
                try:
                    present = runner.chain_exists(table, KUBE_PROXY_CANARY)
                except IptablesError as err:
                    return str(err).splitlines()[0]
                if not present:
                    return f"{family.value} {table} table lost {KUBE_PROXY_CANARY}"
        return None

    def render_plan(self, node_plan: NodePlan) -> str:
        """The ``iptables-restore`` input a full sync applies, per family."""
        out: list[str] = []
        for fam in self._fams(node_plan):
            _, desired = self._build(node_plan, fam)
            restore = desired.restore()
            declare_largest_first(restore)
            tool = "iptables-restore" if fam.family is IPFamily.IPv4 else "ip6tables-restore"
            out.append(f"# {tool} --noflush ({fam.family.value})\n{restore}")
        return "".join(out)


def _culprit(err: IptablesError, rules: Mapping[ServicePortName, _Held]) -> ServicePortName | None:
    """The ServicePort owning the rule at the line iptables reported, if any."""
    if err.line is None or not err.input:
        return None
    lines = err.input.splitlines()
    if not 0 < err.line <= len(lines):
        return None
    words = lines[err.line - 1].split()
    if len(words) < 2 or words[0] not in ("-A", ":"):
        return None
    chain = words[1]
    for name, port in rules.items():
        if any(own == chain for own, _, _ in port.chains):
            return name
        if any(rule_text(e.args) in lines[err.line - 1] for e in port.entries):
            return name
    return None


def _canonical(runner: Iptables, settings: Settings) -> Canonical:
    """What ``runner``'s iptables-save prints for a rule (None: iptables refuses it)."""
    nft = runner.flavor == "nft"

    def canonical(args: Args) -> str | None:
        try:
            return canonical_text(args, runner.family, nft=nft, random_fully=settings.random_fully)
        except RuleError:
            return None

    return canonical


def declare_largest_first(restore: Restore) -> None:
    """Put the chain lines of each table in descending order of name.

    Both flavours of iptables-restore (1.8.x) keep a table's chains in a list sorted by
    name, and find the place of each chain they create by walking that list from (about)
    the smallest name: iptables-nft in its chain cache and in its cache request,
    iptables-legacy in libiptc's chain list. Declared in any other order, a full sync
    costs time quadratic in the number of chains; largest first, each one goes to the
    head of the list. At 10,000 Services x 10 endpoints (110,000 chains) the legacy
    restore takes 4.7 s instead of 8.7 s. Chain lines mean the same wherever they stand
    in their table's part (all come before its rules), so the input does not change.
    """
    for _, part in restore:
        part.chains.sort(reverse=True)


def init_node(config: ProxyConfig, proc: Path) -> None:
    """The node settings iptables mode needs (also what ``--init-only`` does for it):
    NodePorts on 127.0.0.1 need route_localnet; upstream sets it, and fails to start
    when it cannot. Whether the plan serves them is decided there
    (:attr:`~kubeproxy.model.planning.PlanSettings.route_localnet`): with
    ``--nodeport-addresses`` excluding loopback, nothing is written. ``proc``: the
    /proc of the node's network namespace (the production entry point's ``/proc``).
    Raises BackendError."""
    if not config.planning.route_localnet:
        return
    log.info(
        "Setting route_localnet=1 to allow NodePorts on localhost; to change this "
        "set iptables.localhostNodePorts to false or --nodeport-addresses to "
        "exclude loopback"
    )
    path = proc / "sys/net/ipv4/conf/all/route_localnet"
    try:
        # Written only when needed: a container's /proc/sys is read-only (--init-only,
        # run privileged, sets it first).
        if path.read_text().strip() != "1":
            path.write_text("1")
    except OSError as err:
        raise BackendError(f"cannot set {path}: {err.strerror or err}") from None


def owned() -> Keep:
    """iptables mode's fixed chains and jumps: what a cleanup of ipvs mode (which uses
    some of the same names) leaves while iptables mode runs."""
    return Keep(
        chains=frozenset(FIXED_CHAINS),
        jumps=frozenset(
            (table, builtin, jump_args(comment, extra, chain))
            for table, builtin, chain, comment, extra in JUMPS
        ),
    )


def cleanup(netns: str | None = None, keep: KeepMap | None = None) -> list[str]:
    """Remove what iptables mode (ours, or upstream kube-proxy's) created, in both
    flavours and both families, but what ``keep`` names per (flavour, family): the
    running mode's (ipvs mode shares some names); kubelet's chains stay, as upstream."""
    removed: list[str] = []
    errors: list[str] = []
    jumps = [
        (table, builtin, jump_args(comment, extra, chain))
        for table, builtin, chain, comment, extra in JUMPS
    ]
    for flavor in FLAVORS:
        for family in IPFamily:
            runner = IptablesCommand(family, flavor, netns=netns)
            if runner.available() is not None:
                continue
            mine = (keep or {}).get((flavor, family), NOTHING)
            try:
                found = cleanup_chains(runner, cleanup_is_ours, jumps, mine)
            except IptablesError as err:
                errors.append(f"{runner}: {err}")
                continue
            removed.extend(f"{runner}: {item}" for item in found)
    if errors:
        raise IptablesError("; ".join(errors), "")
    return removed


def cleanup_is_ours(chain: str) -> bool:
    """Chains iptables mode creates (``kubeproxy cleanup`` deletes them; not kubelet's
    KUBE-FIREWALL, as upstream)."""
    return chain != KUBE_FIREWALL and (
        is_generated(chain)
        or chain
        in {
            "KUBE-SERVICES",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-NODEPORTS",
            "KUBE-POSTROUTING",
            "KUBE-MARK-MASQ",
            "KUBE-FORWARD",
            "KUBE-PROXY-FIREWALL",
            "KUBE-PROXY-CANARY",
        }
    )
