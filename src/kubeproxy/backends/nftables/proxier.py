"""The nftables backend: full and partial syncs, as named phases.

``sync`` = ``_families`` (per-family settings from config and node state) →
``_render`` (re-render only the ServicePorts that changed, per family; cached) →
``_full_transaction`` or ``_partial_transaction`` (build the whole change as data) →
``_apply`` (one atomic transaction for both families) → ``_report``.

**Full sync** (at start, after a failure, periodically, and when node-level settings
change) rewrites everything without deleting the table, so the kernel's session-affinity
sets survive::

    add table ip kube-proxy; flush table ip kube-proxy       # every rule goes
    flush map ...                                            # every map we own is emptied
    delete chain/set <anything we no longer want>            # from a terse listing
    table ip kube-proxy { ...everything... }                 # declarative re-add

This also repairs whatever someone else changed or deleted. If the kernel refuses it (say,
an object of ours was redefined by hand with another type), the table is replaced
outright (``add; delete; table {}``), losing only affinity memory.

**Partial sync** sends only what the changed ServicePorts need: element deletions and
additions worked out against what is programmed, at most a new shared chain, and the
chains/sets of changed session-affinity ServicePorts. It lists nothing. Destination
ownership (two ServicePorts claiming one address) and shared elements (hairpin pairs,
ClusterIPs) are tracked incrementally so a partial sync ends in exactly the state a full
sync of the same snapshot would produce — the tests check this against the kernel.

If a transaction fails, nothing changed (nft batches are atomic); the state is dropped
and the next sync is a full one.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from kubeproxy.backends import SyncResult
from kubeproxy.backends.nftables.render import (
    IP_BACKENDS,
    NODEPORT_BACKENDS,
    SKELETON_CHAINS,
    TABLE,
    TABLE_COMMENT,
    AffinitySet,
    ChainDef,
    Conflict,
    Destination,
    FamilyConfig,
    LBChain,
    PortRules,
    TableContents,
    Vocabulary,
    affinity_set,
    collect,
    render_service_port,
    render_table,
    static_sets,
)
from kubeproxy.backends.nftables.script import TableRef, Transaction
from kubeproxy.config import ProxyConfig
from kubeproxy.dataplane.nft import NftError, NftRunner
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import IPFamily, ServicePortName, family_of

log = logging.getLogger(__name__)

Claim = tuple[str, str]
ElementKey = tuple[str, str]  # (set or map, key)


@dataclass
class _Programmed:
    """What one family's table holds, as far as ServicePorts are concerned."""

    # Who may own each destination, and who does (the smallest name, as `collect`).
    candidates: dict[Claim, set[ServicePortName]] = field(default_factory=dict)
    owner: dict[Claim, ServicePortName] = field(default_factory=dict)
    # The elements programmed for a destination are those of its owner's cached rules;
    # during a partial sync, destinations already re-decided are overridden here (and
    # the overrides are dropped once the new rules are committed).
    claimed: dict[Claim, dict[ElementKey, str | None]] = field(default_factory=dict)
    shared: Counter[ElementKey] = field(default_factory=Counter)
    shared_values: dict[ElementKey, str | None] = field(default_factory=dict)
    chains: set[str] = field(default_factory=set)  # non-skeleton chains present
    # Shared load-balancing chains: which one each owned destination uses, and how many
    # destinations use each (a chain no destination uses any more is deleted).
    claim_chain: dict[Claim, str] = field(default_factory=dict)
    chain_refs: Counter[str] = field(default_factory=Counter)
    # Number of elements programmed (kept up to date: counting would cost O(cluster)).
    elements: int = 0

    @classmethod
    def from_rules(
        cls, rules: dict[ServicePortName, PortRules], contents: TableContents
    ) -> _Programmed:
        state = cls(chains=set(contents.chains))
        for name in sorted(rules):
            port = rules[name]
            for dest in port.destinations:
                state.candidates.setdefault(dest.claim, set()).add(name)
                if dest.claim not in state.owner:
                    state.owner[dest.claim] = name
                    state.elements += len(dest.elements)
                    if dest.chain is not None:
                        state.claim_chain[dest.claim] = dest.chain.name
                        state.chain_refs[dest.chain.name] += 1
            for m, k, v in port.shared:
                state.shared[(m, k)] += 1
                state.shared_values[(m, k)] = v
        state.elements += len(state.shared)
        return state


@dataclass
class _Family:
    config: FamilyConfig
    rules: dict[ServicePortName, PortRules] = field(default_factory=dict)
    programmed: _Programmed | None = None  # None: unknown, the next sync must be full
    # ServicePorts with endpoints elsewhere but none usable here (kept up to date
    # incrementally: the metric must not cost a scan of every Service per sync).
    no_local_internal: int = 0
    no_local_external: int = 0

    def set_rules(self, name: ServicePortName, new: PortRules | None) -> None:
        old = self.rules.pop(name, None)
        if old is not None:
            self.no_local_internal -= old.no_local_internal
            self.no_local_external -= old.no_local_external
        if new is not None:
            self.rules[name] = new
            self.no_local_internal += new.no_local_internal
            self.no_local_external += new.no_local_external

    @property
    def table(self) -> TableRef:
        return TableRef(self.config.vocab.table_family, TABLE)


@dataclass
class _Plan:
    """One sync's transaction and what the state will be once it is applied."""

    tx: Transaction
    full: bool
    programmed: dict[IPFamily, _Programmed]
    conflicts: list[str]
    changed: int = 0
    # Applied before ``tx`` when not empty (see _Delta.emit_shared_chains).
    pre: Transaction | None = None


class NftablesBackend:
    """Programs the ``ip``/``ip6`` ``kube-proxy`` tables."""

    name = "nftables"

    def __init__(self, config: ProxyConfig, runner: NftRunner) -> None:
        self.config = config
        self.runner = runner
        self._families_state: dict[IPFamily, _Family] = {}
        self._warned_no_node_ip: set[IPFamily] = set()
        self.last_transaction = ""
        self._kernel_seconds = 0.0

    # ------------------------------------------------------------------ phases

    def _families(self, snapshot: Snapshot) -> list[FamilyConfig]:
        configs = []
        node = snapshot.node
        for family in self.config.families:
            primary = node.primary_ips.get(family)
            node_ports = self.config.nodeport_addresses.for_family(family, primary)
            if (
                self.config.nodeport_addresses.primary
                and primary is None
                and family not in self._warned_no_node_ip
                and family not in self._families_state  # once per start: not on the hot path
                and _has_node_ports(snapshot, family)
            ):
                self._warned_no_node_ip.add(family)
                log.warning(
                    "No %s primary IP known for node %s (no Node object with an InternalIP or "
                    "ExternalIP, and no --bind-address): NodePorts are accepted on every local "
                    "address of that family, as upstream kube-proxy does",
                    family.value,
                    node.name,
                )
            service_cidrs = tuple(
                sorted(
                    {
                        c
                        for c in (*self.config.service_cidrs, *snapshot.service_cidrs)
                        if family_of(c) is family
                    }
                )
            )
            configs.append(
                FamilyConfig(
                    family=family,
                    node=node.topology,
                    node_ports=node_ports,
                    cluster_cidrs=self.config.cluster_cidrs_of(family),
                    masquerade_all=self.config.masquerade_all,
                    masquerade_mark=self.config.masquerade_mark,
                    flags=self.config.features,
                    service_cidrs=service_cidrs,
                    node_ip=primary,
                )
            )
        return configs

    def _render(
        self,
        snapshot: Snapshot,
        changed: Iterable[ServicePortName] | None,
        configs: list[FamilyConfig],
    ) -> tuple[dict[IPFamily, dict[ServicePortName, PortRules | None]], int]:
        """New PortRules of the changed ServicePorts (all of them when ``changed`` is None).

        Returns, per family, name -> new rules (None: the ServicePort is gone), without
        touching the cache (it is only updated once the kernel accepted the change).
        """
        updates: dict[IPFamily, dict[ServicePortName, PortRules | None]] = {}
        rendered = 0
        for cfg in configs:
            fam = self._families_state.get(cfg.family)
            everything = changed is None or fam is None or fam.config != cfg
            names = snapshot.services.keys() if everything else changed
            out: dict[ServicePortName, PortRules | None] = {}
            for name in names or ():
                svc = snapshot.services.get(name)
                if svc is None:
                    out[name] = None
                    continue
                out[name] = render_service_port(svc, snapshot.endpoints.get(name, ()), cfg)
                rendered += 1
            updates[cfg.family] = out
        return updates, rendered

    def _full_transaction(
        self,
        configs: list[FamilyConfig],
        rules: dict[IPFamily, dict[ServicePortName, PortRules]],
        *,
        replace: bool,
    ) -> _Plan:
        tx = Transaction()
        programmed: dict[IPFamily, _Programmed] = {}
        conflicts: list[str] = []
        for cfg in configs:
            t = TableRef(cfg.vocab.table_family, TABLE)
            contents = collect(rules[cfg.family], cfg)
            table = render_table(cfg, contents)
            if replace:
                tx.add_table(t)
                tx.delete_table(t)
            else:
                existing = self._list(t)
                tx.add_table(t, TABLE_COMMENT)
                tx.flush_table(t)
                ours = {s.name for s in table.sets}
                for s in static_sets(cfg):
                    if s.name not in existing[s.keyword]:
                        continue
                    if s.name in (IP_BACKENDS, NODEPORT_BACKENDS):
                        # Recreated rather than flushed: nft 1.0.6 cannot rebuild their
                        # "typeof ... th dport" type from the kernel, and would refuse the
                        # rules that use them (see _Delta.emit_shared_chains). They hold
                        # no state of their own, so nothing is lost.
                        tx.delete_set(t, s.keyword, s.name)
                    else:
                        tx.flush_set(t, s.keyword, s.name)
                for keyword in ("map", "set"):
                    for name in sorted(existing[keyword] - ours):
                        tx.delete_set(t, keyword, name)
                wanted = SKELETON_CHAINS | set(contents.chains)
                for name in sorted(existing["chain"] - wanted):
                    tx.delete_chain(t, name)
            tx.define_table(table)
            programmed[cfg.family] = _Programmed.from_rules(rules[cfg.family], contents)
            conflicts.extend(_describe(c, cfg.family) for c in contents.conflicts)
        return _Plan(tx, True, programmed, conflicts)

    def _partial_transaction(
        self,
        configs: list[FamilyConfig],
        updates: dict[IPFamily, dict[ServicePortName, PortRules | None]],
    ) -> _Plan:
        pre = Transaction()
        tx = Transaction()
        programmed: dict[IPFamily, _Programmed] = {}
        conflicts: list[str] = []
        changed = 0
        for cfg in configs:
            fam = self._families_state[cfg.family]
            assert fam.programmed is not None
            # Updated in place: if the kernel refuses the transaction the whole state is
            # dropped and the next sync is a full one, so there is nothing to roll back
            # (and no O(cluster) copy on the hot path).
            state = fam.programmed
            delta = _Delta(cfg, fam.table, state)
            for name, new in updates[cfg.family].items():
                old = fam.rules.get(name)
                if old == new:
                    continue
                changed += 1
                delta.service_port(state, fam.rules, name, old, new)
            delta.emit_shared_chains(pre)
            delta.emit(tx)
            conflicts.extend(delta.conflicts)
            programmed[cfg.family] = state
        return _Plan(tx, False, programmed, conflicts, changed, pre)

    def _apply(self, plan: _Plan) -> None:
        pre = str(plan.pre) if plan.pre else ""
        script = str(plan.tx)
        self.last_transaction = pre + script
        started = time.perf_counter()
        try:
            if pre:
                self.runner.apply(pre)
            if script:
                self.runner.apply(script)
        finally:
            self._kernel_seconds += time.perf_counter() - started

    def _list(self, t: TableRef) -> dict[str, set[str]]:
        started = time.perf_counter()
        try:
            return self.runner.list_objects(t.family, t.name)
        finally:
            self._kernel_seconds += time.perf_counter() - started

    # ----------------------------------------------------------------- public

    def sync(self, snapshot: Snapshot, changed: set[ServicePortName] | None) -> SyncResult:
        """Bring the kernel in line with ``snapshot``. ``changed=None`` forces a full sync."""
        started = time.perf_counter()
        self._kernel_seconds = 0.0
        configs = self._families(snapshot)
        full = changed is None or any(
            (fam := self._families_state.get(cfg.family)) is None
            or fam.config != cfg
            or fam.programmed is None
            for cfg in configs
        )
        updates, rendered = self._render(snapshot, None if full else changed, configs)
        try:
            if full:
                plan = self._full(configs, updates)
            else:
                plan = self._partial_transaction(configs, updates)
                self._apply(plan)
        except Exception:
            # The kernel kept the previous rules; our picture of them may be stale.
            for fam in self._families_state.values():
                fam.programmed = None
            raise
        self._commit(configs, updates, plan, full)
        result = self._report(snapshot, plan, rendered)
        result.apply_seconds = self._kernel_seconds
        result.render_seconds = time.perf_counter() - started - self._kernel_seconds
        return result

    def _full(
        self,
        configs: list[FamilyConfig],
        updates: dict[IPFamily, dict[ServicePortName, PortRules | None]],
    ) -> _Plan:
        rules = {fam: {n: r for n, r in u.items() if r is not None} for fam, u in updates.items()}
        plan = self._full_transaction(configs, rules, replace=False)
        try:
            self._apply(plan)
        except NftError as err:
            log.warning(
                "Full sync refused (%s); replacing the kube-proxy tables instead "
                "(session affinity memory is lost)",
                str(err).splitlines()[0],
            )
            plan = self._full_transaction(configs, rules, replace=True)
            self._apply(plan)
        return plan

    def _commit(
        self,
        configs: list[FamilyConfig],
        updates: dict[IPFamily, dict[ServicePortName, PortRules | None]],
        plan: _Plan,
        full: bool,
    ) -> None:
        for cfg in configs:
            if full:
                fam = self._families_state[cfg.family] = _Family(cfg)
            else:
                fam = self._families_state[cfg.family]
            for name, new in updates[cfg.family].items():
                fam.set_rules(name, new)
            fam.programmed = plan.programmed[cfg.family]
            # The committed rules now say what each destination holds.
            fam.programmed.claimed.clear()

    def render(self, snapshot: Snapshot) -> str:
        """The exact script a full sync of ``snapshot`` applies to an empty kernel.

        (On a live node a full sync also flushes and deletes what is already there; the
        objects it then defines are the same.)
        """
        configs = self._families(snapshot)
        updates, _ = self._render(snapshot, None, configs)
        rules = {fam: {n: r for n, r in u.items() if r is not None} for fam, u in updates.items()}
        return str(self._full_transaction(configs, rules, replace=True).tx)

    def cleanup(self) -> list[str]:
        """Delete our tables (and nothing else); returns what was removed."""
        ours = {Vocabulary.of(f).table_family for f in IPFamily}
        present = [
            (fam, name) for fam, name in self.runner.list_tables() if name == TABLE and fam in ours
        ]
        if present:
            tx = Transaction()
            for fam, name in present:
                tx.delete_table(TableRef(fam, name))
            self.runner.apply(str(tx))
        self._families_state.clear()
        return [f"table {fam} {name}" for fam, name in present]

    def _report(self, snapshot: Snapshot, plan: _Plan, rendered: int) -> SyncResult:
        result = SyncResult(
            full=plan.full,
            service_ports=len(snapshot.services),
            rendered=rendered,
            operations=plan.tx.operations + (plan.pre.operations if plan.pre else 0),
            conflicts=plan.conflicts,
        )
        for fam in self._families_state.values():
            if fam.programmed is not None:
                result.elements += fam.programmed.elements
                result.chains += len(fam.programmed.chains)
            result.no_local_internal += fam.no_local_internal
            result.no_local_external += fam.no_local_external
        return result


class _Delta:
    """Works out one family's partial-sync operations, updating the state as it goes.

    For every element touched it remembers the value the kernel held before this sync
    (or that it held none) and the value wanted after; ``emit`` turns each difference
    into a delete and/or an add. A key touched several times (two changed ServicePorts
    contesting one address) still yields one correct operation.
    """

    def __init__(self, cfg: FamilyConfig, table: TableRef, state: _Programmed) -> None:
        self.cfg = cfg
        self.t = table
        self.state = state
        self.before: dict[ElementKey, object] = {}
        self.after: dict[ElementKey, object] = {}
        self.chains: dict[str, ChainDef] = {}  # to (re)define, in dependency order
        self.delete_chains: set[str] = set()
        self.sets: dict[str, AffinitySet] = {}
        self.delete_sets: set[str] = set()
        self.conflicts: list[str] = []
        # Shared chains whose use count changed (definition known when one gained a user).
        self.shared_chains: dict[str, LBChain | None] = {}

    def _touch(self, key: ElementKey, before: object, after: object) -> None:
        self.before.setdefault(key, before)
        self.after[key] = after

    def service_port(
        self,
        state: _Programmed,
        rules: dict[ServicePortName, PortRules],
        name: ServicePortName,
        old: PortRules | None,
        new: PortRules | None,
    ) -> None:
        old_dests = {d.claim for d in old.destinations} if old else set()
        new_dests = {d.claim for d in new.destinations} if new else set()
        for claim in old_dests - new_dests:
            state.candidates[claim].discard(name)
        for claim in new_dests:
            state.candidates.setdefault(claim, set()).add(name)
        # Ownership is decided with this ServicePort's new rules in view.
        view = _RulesView(rules, name, new)
        for claim in sorted(old_dests | new_dests):
            self._reclaim(state, view, claim)
        self._shared(state, old, new)
        self._own_objects(state, old, new)

    def _reclaim(self, state: _Programmed, view: _RulesView, claim: Claim) -> None:
        cands = state.candidates.get(claim, set())
        current = state.claimed.get(claim)
        if current is None:
            owner_now = state.owner.get(claim)
            current = {}
            if owner_now is not None:
                current = {(m, k): v for m, k, v in view.old_destination(owner_now, claim).elements}
        desired: dict[ElementKey, str | None] = {}
        old_chain = state.claim_chain.pop(claim, None)
        new_chain: LBChain | None = None
        if cands:
            owner = min(cands)
            dest = view.destination(owner, claim)
            desired = {(m, k): v for m, k, v in dest.elements}
            new_chain = dest.chain
            self.conflicts.extend(
                _describe(Conflict(claim, owner, loser), self.cfg.family)
                for loser in sorted(cands - {owner})
            )
            state.owner[claim] = owner
            state.claimed[claim] = desired
        else:
            state.candidates.pop(claim, None)
            state.owner.pop(claim, None)
            state.claimed[claim] = {}
        if old_chain is not None:
            state.chain_refs[old_chain] -= 1
            self.shared_chains.setdefault(old_chain, None)
        if new_chain is not None:
            state.claim_chain[claim] = new_chain.name
            state.chain_refs[new_chain.name] += 1
            self.shared_chains[new_chain.name] = new_chain
        state.elements += len(desired) - len(current)
        for key in current.keys() | desired.keys():
            self._touch(key, current.get(key, _MISSING), desired.get(key, _MISSING))

    def _shared(self, state: _Programmed, old: PortRules | None, new: PortRules | None) -> None:
        """Reference-counted elements several ServicePorts may need (hairpin, ClusterIPs)."""
        delta: Counter[ElementKey] = Counter()
        values: dict[ElementKey, str | None] = {}
        for m, k, _ in old.shared if old else ():
            delta[(m, k)] -= 1
        for m, k, v in new.shared if new else ():
            delta[(m, k)] += 1
            values[(m, k)] = v
        for key, d in delta.items():
            if d == 0:
                continue
            count = state.shared[key]
            before = state.shared_values.get(key) if count > 0 else _MISSING
            state.elements += (count + d > 0) - (count > 0)
            if count + d > 0:
                state.shared[key] = count + d
                state.shared_values[key] = values.get(key, state.shared_values.get(key))
                self._touch(key, before, state.shared_values[key])
            else:
                del state.shared[key]
                state.shared_values.pop(key, None)
                self._touch(key, before, _MISSING)

    def _own_objects(
        self, state: _Programmed, old: PortRules | None, new: PortRules | None
    ) -> None:
        """Session affinity: the chains and sets that belong to this ServicePort alone."""
        old_chains = {c.name: c for c in old.chains} if old else {}
        new_chains = {c.name: c for c in new.chains} if new else {}
        for chain in new_chains.values():
            if old_chains.get(chain.name) != chain:
                self.chains[chain.name] = chain
            state.chains.add(chain.name)
        for gone in old_chains.keys() - new_chains.keys():
            self.delete_chains.add(gone)
            state.chains.discard(gone)
        old_sets = {a.name: a for a in old.sets} if old else {}
        new_sets = {a.name: a for a in new.sets} if new else {}
        for added in new_sets.keys() - old_sets.keys():
            self.sets[added] = new_sets[added]
        self.delete_sets |= old_sets.keys() - new_sets.keys()

    def emit_shared_chains(self, tx: Transaction) -> None:
        """New shared load-balancing chains, in a transaction of their own.

        nft 1.0.6 cannot rebuild a ``typeof ... th dport`` map type from the kernel
        ("conflicting protocols specified: ip vs. th"): a batch that both refers to the
        backends maps in a new rule and adds or deletes elements (which makes nft load the
        kernel's set definitions) is refused. So new shared chains go first, with the
        unchanged maps declared again so nft takes their type from the script. The
        chains are unreferenced until the main transaction, so applying them early is
        harmless, and ``replace_chain`` makes a retry idempotent.
        """
        state = self.state
        new: list[LBChain] = []
        for name, chain in self.shared_chains.items():
            if state.chain_refs[name] > 0 and name not in state.chains:
                assert chain is not None  # a chain gaining a user comes with its definition
                new.append(chain)
                state.chains.add(name)
            elif state.chain_refs[name] <= 0:
                del state.chain_refs[name]
                if name in state.chains:
                    # Deleted in the main transaction, after the elements that used it.
                    self.delete_chains.add(name)
                    state.chains.discard(name)
        if not new:
            return
        for s in static_sets(self.cfg):
            if s.name in (IP_BACKENDS, NODEPORT_BACKENDS):
                tx.add_set(self.t, s)
        for chain in new:
            tx.replace_chain(self.t, chain.name, chain.rules(self.cfg))

    def emit(self, tx: Transaction) -> None:
        t = self.t
        for aff in sorted(self.sets.values()):
            tx.add_set(t, affinity_set(self.cfg.vocab, aff))
        for chain in self.chains.values():
            tx.replace_chain(t, chain.name, chain.rules)
        deletes: dict[str, list[str]] = {}
        adds: dict[str, list[str]] = {}
        for key, after in sorted(self.after.items(), key=lambda kv: kv[0]):
            before = self.before[key]
            if after == before:
                continue
            set_name, element = key
            if before is not _MISSING:
                deletes.setdefault(set_name, []).append(element)
            if after is not _MISSING:
                value = after if isinstance(after, str) else None
                adds.setdefault(set_name, []).append(
                    element if value is None else f"{element} : {value}"
                )
        for set_name, keys in deletes.items():
            tx.delete_elements(t, set_name, keys)
        for set_name, items in adds.items():
            tx.add_elements(t, set_name, items)
        for name in sorted(self.delete_chains - set(self.chains)):
            tx.delete_chain(t, name)
        for name in sorted(self.delete_sets - set(self.sets)):
            tx.delete_set(t, "set", name)


_MISSING = object()


class _RulesView:
    """The cached rules with one ServicePort's new version overlaid."""

    def __init__(
        self, rules: dict[ServicePortName, PortRules], name: ServicePortName, new: PortRules | None
    ) -> None:
        self.rules = rules
        self.name = name
        self.new = new

    def destination(self, owner: ServicePortName, claim: Claim) -> Destination:
        """The destination as ``owner`` wants it now."""
        rules = self.new if owner == self.name else self.rules[owner]
        assert rules is not None
        return _find(rules, claim)

    def old_destination(self, owner: ServicePortName, claim: Claim) -> Destination:
        """The destination as the committed rules (what the kernel holds) have it."""
        return _find(self.rules[owner], claim)


def _find(rules: PortRules, claim: Claim) -> Destination:
    for dest in rules.destinations:
        if dest.claim == claim:
            return dest
    raise KeyError(claim)


def _describe(c: Conflict, family: IPFamily) -> str:
    return (
        f"Service port {c.loser} also claims {c.claim[0]} destination {c.claim[1]}, "
        f"which belongs to {c.owner}; ignoring it there ({family.value})"
    )


def _has_node_ports(snapshot: Snapshot, family: IPFamily) -> bool:
    return any(svc.node_port and svc.cluster_ip(family) for svc in snapshot.services.values())
