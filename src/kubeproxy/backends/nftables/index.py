"""What one family's table holds, as a function of per-ServicePort rules (pure).

:class:`TableIndex` is the *programmed* index: the :class:`~.render.PortRules` of every
ServicePort as last committed to the kernel, plus what follows from them — which
ServicePort owns each destination (two may claim one; the smallest name wins, the others
are reported), how many ServicePorts need each shared element, how many owned
destinations use each shared chain.

A sync asks the index for a :class:`Change`: the *desired* view of everything the changed
ServicePorts touch (an overlay; the index itself is not modified), diffed against the
programmed view of the same destinations, elements, chains and sets, as nft operations
in an order the kernel accepts (objects are created before anything refers to them and
deleted after everything that referred to them is gone). :meth:`Change.commit` folds the
overlay in once the kernel has accepted the transaction; a refused transaction leaves
the index as it was.

:meth:`TableIndex.contents` gives everything at once, and :func:`full_table` the whole
table, for a full sync; :func:`split_elements` the order in which a new table can be
loaded in pieces.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kubeproxy.backends.nftables.render import (
    AffinitySet,
    ChainDef,
    Claim,
    Destination,
    PortRules,
    affinity_set,
)
from kubeproxy.backends.nftables.table import (
    ELEMENT_SETS,
    NODEPORTS_CHAIN,
    LBChain,
    commented,
    config_elements,
    dispatch_chains,
    is_entry,
    skeleton,
)
from kubeproxy.dataplane.nftables.transaction import (
    Chain,
    Element,
    Table,
    TableRef,
    Transaction,
    with_comment,
)
from kubeproxy.model.plan import FamilyPlan
from kubeproxy.model.types import IPFamily, ServicePortName

ElementKey = tuple[str, str]  # (set or map, key)
# What an element holds besides its key: its value (None in sets) and its comment.
Held = tuple[str | None, str | None]
_MISSING = object()


def owner_comment(name: ServicePortName) -> str:
    """The comment on the elements a ServicePort owns: ``namespace/name:port`` (upstream's
    ServicePortName string, without the protocol)."""
    return f"{name.service}:{name.port}" if name.port else str(name.service)


def _held(elements: Iterable[tuple[str, str, str | None]], comment: str) -> dict[ElementKey, Held]:
    return {(m, k): (v, comment if commented(m) else None) for m, k, v in elements}


@dataclass(frozen=True, slots=True)
class Conflict:
    """A destination claimed by two ServicePorts; the first (by name) keeps it."""

    claim: Claim
    owner: ServicePortName
    loser: ServicePortName

    def message(self, family: IPFamily) -> str:
        return (
            f"Service port {self.loser} also claims {self.claim[0]} destination "
            f"{self.claim[1]}, which belongs to {self.owner}; ignoring it there "
            f"({family.value})"
        )


@dataclass
class Contents:
    """Everything the table holds besides its fixed skeleton."""

    elements: dict[str, dict[str, str | None]] = field(default_factory=dict)
    # The comment of each element of the commented sets: the ServicePort that owns it.
    comments: dict[ElementKey, str] = field(default_factory=dict)
    chains: dict[str, ChainDef] = field(default_factory=dict)
    # The shared chains in use (each with its "-dests" set and dispatch rule).
    shared_chains: set[LBChain] = field(default_factory=set)
    sets: dict[str, AffinitySet] = field(default_factory=dict)


def _find(rules: PortRules, claim: Claim) -> Destination:
    for dest in rules.destinations:
        if dest.claim == claim:
            return dest
    raise KeyError(claim)


class TableIndex:
    """The programmed state of one family's table (see the module docstring)."""

    def __init__(self, fam: FamilyPlan) -> None:
        self.fam = fam
        self.rules: dict[ServicePortName, PortRules] = {}
        self.candidates: dict[Claim, set[ServicePortName]] = {}
        self.shared: Counter[ElementKey] = Counter()
        self.shared_values: dict[ElementKey, str | None] = {}
        self.chain_refs: Counter[LBChain] = Counter()
        self.elements = 0
        self.own_chains = 0  # affinity chains (the shared ones are in chain_refs)
        self.no_local_internal = 0
        self.no_local_external = 0

    @classmethod
    def build(
        cls,
        fam: FamilyPlan,
        rules: Mapping[ServicePortName, PortRules],
        contents: Contents | None = None,
    ) -> TableIndex:
        """The index of ``rules``; also fills ``contents`` (what :meth:`contents` gives)
        in the same pass when one is passed, as a full sync needs both."""
        index = cls(fam)
        elements = contents.elements if contents is not None else None
        if elements is not None:
            for set_name in ELEMENT_SETS:
                elements.setdefault(set_name, {})
        for name in sorted(rules):
            port = rules[name]
            index.rules[name] = port
            index.own_chains += len(port.chains)
            index.no_local_internal += port.no_local_internal
            index.no_local_external += port.no_local_external
            for dest in port.destinations:
                cands = index.candidates.setdefault(dest.claim, set())
                if not cands:  # names are in order: the first one owns the destination
                    index.elements += len(dest.elements)
                    if dest.chain is not None:
                        index.chain_refs[dest.chain] += 1
                    if contents is not None and elements is not None:
                        comment = owner_comment(name)
                        for set_name, key, value in dest.elements:
                            into = elements.get(set_name)
                            if into is None:
                                into = elements[set_name] = {}
                            into[key] = value
                            if commented(set_name):
                                contents.comments[(set_name, key)] = comment
                        if dest.chain is not None and dest.chain.name not in contents.chains:
                            contents.shared_chains.add(dest.chain)
                            contents.chains[dest.chain.name] = ChainDef(
                                dest.chain.name, tuple(dest.chain.rules(fam))
                            )
                cands.add(name)
            for m, k, v in port.shared:
                index.shared[(m, k)] += 1
                index.shared_values[(m, k)] = v
            if contents is not None:
                for chain in port.chains:
                    contents.chains[chain.name] = chain
                for aff in port.sets:
                    contents.sets[aff.name] = aff
        index.elements += len(index.shared)
        if elements is not None:
            for (set_name, key), value in index.shared_values.items():
                elements[set_name][key] = value
        return index

    def owner(self, claim: Claim) -> ServicePortName | None:
        cands = self.candidates.get(claim)
        return min(cands) if cands else None

    @property
    def chains(self) -> int:
        """Non-skeleton chains programmed (shared load-balancing and affinity chains)."""
        return len(self.chain_refs) + self.own_chains

    def conflicts(self) -> list[Conflict]:
        contested = [(claim, cands) for claim, cands in self.candidates.items() if len(cands) > 1]
        return [
            Conflict(claim, min(cands), loser)
            for claim, cands in sorted(contested)
            for loser in sorted(cands)[1:]
        ]

    def contents(self) -> Contents:
        """Everything the programmed rules put in the table (for a full sync)."""
        out = Contents()
        TableIndex.build(self.fam, self.rules, out)
        return out

    def change(self, updates: Mapping[ServicePortName, PortRules | None]) -> Change:
        """The desired state of what ``updates`` touch, diffed against this index."""
        return Change(self, updates)


class Change:
    """One family's partial update: the operations, and the index once committed."""

    def __init__(
        self, index: TableIndex, updates: Mapping[ServicePortName, PortRules | None]
    ) -> None:
        self.index = index
        self.updates = {name: new for name, new in updates.items() if index.rules.get(name) != new}
        self.conflicts: list[Conflict] = []
        # Element diffs: what the kernel holds (a Held, or _MISSING) and what is wanted.
        self.before: dict[ElementKey, object] = {}
        self.after: dict[ElementKey, object] = {}
        self.candidates: dict[Claim, set[ServicePortName]] = {}
        self.shared_delta: Counter[ElementKey] = Counter()
        self.shared_new_values: dict[ElementKey, str | None] = {}
        self.chain_delta: Counter[LBChain] = Counter()
        self.element_delta = 0
        self._destinations()
        self._shared()

    def _rules(self, name: ServicePortName) -> PortRules | None:
        if name in self.updates:
            return self.updates[name]
        return self.index.rules.get(name)

    def _destinations(self) -> None:
        index = self.index
        affected: dict[Claim, set[ServicePortName]] = {}
        for name, new in self.updates.items():
            old = index.rules.get(name)
            old_claims = {d.claim for d in old.destinations} if old else set()
            new_claims = {d.claim for d in new.destinations} if new else set()
            for claim in old_claims | new_claims:
                cands = affected.get(claim)
                if cands is None:
                    cands = affected[claim] = set(index.candidates.get(claim, ()))
                if claim in new_claims:
                    cands.add(name)
                else:
                    cands.discard(name)
        for claim in sorted(affected):
            cands = affected[claim]
            self.candidates[claim] = cands
            old_owner = index.owner(claim)
            old_dest = _find(index.rules[old_owner], claim) if old_owner is not None else None
            new_owner = min(cands) if cands else None
            new_rules = self._rules(new_owner) if new_owner is not None else None
            new_dest = _find(new_rules, claim) if new_rules is not None else None
            if new_owner is not None:
                self.conflicts.extend(
                    Conflict(claim, new_owner, n) for n in sorted(cands - {new_owner})
                )
            before: dict[ElementKey, Held] = {}
            after: dict[ElementKey, Held] = {}
            if old_dest is not None and old_owner is not None:
                before = _held(old_dest.elements, owner_comment(old_owner))
            if new_dest is not None and new_owner is not None:
                after = _held(new_dest.elements, owner_comment(new_owner))
            self.element_delta += len(after) - len(before)
            for key in before.keys() | after.keys():
                self._touch(key, before.get(key, _MISSING), after.get(key, _MISSING))
            if old_dest is not None and old_dest.chain is not None:
                self.chain_delta[old_dest.chain] -= 1
            if new_dest is not None and new_dest.chain is not None:
                self.chain_delta[new_dest.chain] += 1

    def _shared(self) -> None:
        """Reference-counted elements several ServicePorts may need (hairpin, ClusterIPs)."""
        index = self.index
        for name, new in self.updates.items():
            old = index.rules.get(name)
            for m, k, _ in old.shared if old else ():
                self.shared_delta[(m, k)] -= 1
            for m, k, v in new.shared if new else ():
                self.shared_delta[(m, k)] += 1
                self.shared_new_values[(m, k)] = v
        for key, delta in self.shared_delta.items():
            count = index.shared[key]
            before: object = (index.shared_values.get(key), None) if count > 0 else _MISSING
            after: object = _MISSING
            if count + delta > 0:
                after = (self.shared_new_values.get(key, index.shared_values.get(key)), None)
            self.element_delta += (count + delta > 0) - (count > 0)
            self._touch(key, before, after)

    def _touch(self, key: ElementKey, before: object, after: object) -> None:
        self.before.setdefault(key, before)
        self.after[key] = after

    # ------------------------------------------------------------------ output

    def new_shared_chains(self) -> list[LBChain]:
        """Shared chains that gain their first user."""
        refs = self.index.chain_refs
        return [
            chain
            for chain, delta in sorted(self.chain_delta.items())
            if delta > 0 and refs[chain] == 0
        ]

    def _gone_shared_chains(self) -> list[LBChain]:
        refs = self.index.chain_refs
        return [
            chain
            for chain, delta in sorted(self.chain_delta.items())
            if delta < 0 and refs[chain] > 0 and refs[chain] + delta <= 0
        ]

    def _dispatch(self, tx: Transaction, table: TableRef) -> None:
        """New shared chains' ``-dests`` sets, and the dispatch chains rewritten when the
        shared chains in use change (only then: a rule with a goto makes the kernel
        re-validate the jump graph, which no longer holds a verdict per Service)."""
        new = self.new_shared_chains()
        gone = self._gone_shared_chains()
        if not new and not gone:
            return
        fam = self.index.fam
        for chain in new:
            tx.add_set(table, chain.dests_set(fam.family))
        in_use = (set(self.index.chain_refs) | set(new)) - set(gone)
        before = dispatch_chains(fam, self.index.chain_refs)
        after = dispatch_chains(fam, in_use)
        # (The sets the rewritten rules name need no declaring again: a destination
        # moves to or from these chains in the same batch, and its element changes make
        # nft load the kernel's sets.)
        for name in ("services", NODEPORTS_CHAIN):
            if before[name] != after[name]:
                tx.replace_chain(table, name, after[name])

    def emit_shared_chains(self, tx: Transaction, table: TableRef) -> None:
        """New shared load-balancing chains with their backends maps, for a transaction
        of their own.

        nft 1.0.6 cannot rebuild a ``typeof ... th dport`` map type from the kernel
        ("conflicting protocols specified: ip vs. th"): a batch that both refers to a
        backends map in a new rule and adds or deletes elements (which makes nft load the
        kernel's set definitions) is refused. So new shared chains go first, each with its
        new (empty) map declared in the same script, so nft takes the type from it. The
        chains are unreferenced until the main transaction, so applying them early is
        harmless, and ``add map`` / ``replace_chain`` make a retry idempotent.
        """
        new = self.new_shared_chains()
        if not new:
            return
        family = self.index.fam.family
        for chain in new:
            tx.add_set(table, chain.backends_map(family))
        for chain in new:
            tx.replace_chain(table, chain.name, chain.rules(self.index.fam))

    def emit(self, tx: Transaction, table: TableRef) -> None:
        """Everything else, in an order the kernel accepts."""
        old_chains: dict[str, ChainDef] = {}
        new_chains: dict[str, ChainDef] = {}
        old_sets: dict[str, AffinitySet] = {}
        new_sets: dict[str, AffinitySet] = {}
        for name, new in self.updates.items():
            old = self.index.rules.get(name)
            for c in old.chains if old else ():
                old_chains[c.name] = c
            for c in new.chains if new else ():
                new_chains[c.name] = c
            for a in old.sets if old else ():
                old_sets[a.name] = a
            for a in new.sets if new else ():
                new_sets[a.name] = a
        # 1. New sets, then new or changed chains (a ServicePort lists its chains with
        #    callees first, so each one exists before a rule jumps to it).
        replaced = [c for c in new_chains.values() if old_chains.get(c.name) != c]
        # Existing sets are declared again (a no-op for the kernel) when chains using
        # them are rewritten: nft 1.0.6 resolves "@set" in "add chain" rules only from
        # sets earlier in the script unless something else makes it load the kernel's.
        declare = new_sets.keys() if replaced else new_sets.keys() - old_sets.keys()
        for set_name in sorted(declare):
            tx.add_set(table, affinity_set(self.index.fam.family, new_sets[set_name]))
        for chain in replaced:
            tx.replace_chain(table, chain.name, chain.rules)
        self._dispatch(tx, table)
        # 2. Elements: deletions first (a map key whose value changes is deleted and
        #    added again: nft refuses to add a key that exists with another value; the
        #    same for a new comment, which adding an existing key would not change).
        deletes: dict[str, list[str]] = {}
        adds: dict[str, list[tuple[str, str | None]]] = {}
        for key in sorted(self.after):
            after = self.after[key]
            before = self.before[key]
            if after == before:
                continue
            set_name, element = key
            if before is not _MISSING:
                deletes.setdefault(set_name, []).append(element)
            if after is not _MISSING:
                assert isinstance(after, tuple)
                value, comment = after
                text = element if comment is None else with_comment(element, comment)
                adds.setdefault(set_name, []).append((text, value))
        for set_name, keys in deletes.items():
            tx.delete_elements(table, set_name, keys)
        for set_name, items in adds.items():
            tx.add_elements(table, set_name, items)
        # 3. Chains nothing refers to any more, referrers before the chains they jump to.
        gone = {n: old_chains[n].rules for n in old_chains.keys() - new_chains.keys()}
        gone_shared = self._gone_shared_chains()
        gone.update((c.name, ()) for c in gone_shared)
        for chain_name in deletion_order(gone):
            tx.delete_chain(table, chain_name)
        # 4. Sets, once the chains (and dispatch rules) that used them are gone.
        for set_name in sorted(old_sets.keys() - new_sets.keys()):
            tx.delete_set(table, "set", set_name)
        for shared in gone_shared:
            tx.delete_set(table, "set", shared.dests)
            tx.delete_set(table, "map", shared.backends)

    def commit(self) -> None:
        """The kernel accepted the transaction: the overlay becomes the programmed state."""
        index = self.index
        for name, new in self.updates.items():
            old = index.rules.pop(name, None)
            if old is not None:
                index.own_chains -= len(old.chains)
                index.no_local_internal -= old.no_local_internal
                index.no_local_external -= old.no_local_external
            if new is not None:
                index.rules[name] = new
                index.own_chains += len(new.chains)
                index.no_local_internal += new.no_local_internal
                index.no_local_external += new.no_local_external
        for claim, cands in self.candidates.items():
            if cands:
                index.candidates[claim] = cands
            else:
                index.candidates.pop(claim, None)
        for key, delta in self.shared_delta.items():
            count = index.shared[key] + delta
            if count > 0:
                index.shared[key] = count
                index.shared_values[key] = self.shared_new_values.get(
                    key, index.shared_values.get(key)
                )
            else:
                del index.shared[key]
                index.shared_values.pop(key, None)
        for chain, delta in self.chain_delta.items():
            index.chain_refs[chain] += delta
            if index.chain_refs[chain] <= 0:
                del index.chain_refs[chain]
        index.elements += self.element_delta


_REFERENCE = re.compile(r"\b(?:goto|jump)\s+([A-Za-z_][A-Za-z0-9_.-]*)")


def deletion_order(chains: Mapping[str, Iterable[str]]) -> list[str]:
    """Chain names ordered so that no chain is deleted while another one still to be
    deleted jumps to it (the kernel refuses that: "Device or resource busy")."""
    refs = {
        name: {m for rule in rules for m in _REFERENCE.findall(rule) if m in chains}
        for name, rules in chains.items()
    }
    referrers: Counter[str] = Counter(t for targets in refs.values() for t in targets)
    ready = sorted(n for n in chains if referrers[n] == 0)
    order: list[str] = []
    while ready:
        name = ready.pop(0)
        order.append(name)
        for target in sorted(refs[name]):
            referrers[target] -= 1
            if referrers[target] == 0:
                ready.append(target)
    # A cycle cannot come from our rules; keep whatever is left rather than lose it.
    order.extend(sorted(set(chains) - set(order)))
    return order


def full_table(fam: FamilyPlan, contents: Contents) -> Table:
    """The complete table for one family."""
    table = skeleton(fam, contents.shared_chains)
    configured = config_elements(fam)
    for s in table.sets:
        elems = contents.elements.get(s.name)
        if elems and commented(s.name):
            comments = contents.comments
            s.elements = [
                (with_comment(k, comments[(s.name, k)]) if (s.name, k) in comments else k, v)
                for k, v in elems.items()
            ]
        elif elems:
            s.elements = list(elems.items())
        elif s.name in configured:
            s.elements = [(e, None) for e in configured[s.name]]
    table.sets.extend(affinity_set(fam.family, aff) for aff in sorted(contents.sets.values()))
    table.chains.extend(Chain(c.name, list(c.rules)) for c in contents.chains.values())
    return table


def split_elements(
    table: Table, piece: int
) -> tuple[list[tuple[str, list[Element]]], list[tuple[str, list[Element]]]]:
    """Take the elements out of ``table`` that can be added after it, in pieces of at
    most ``piece`` elements, in two groups to add in order: every big set's and map's
    first, the entry sets' (the ``-dests`` sets, ``service-ips``, ``service-nodeports``)
    after all of those (the pieces within a group may go in any order),
    so a ServicePort becomes reachable only once its backends, firewall and hairpin
    elements are there (the same all-or-nothing a ServicePort gets from one
    transaction). Interval sets keep their elements (hold configuration, and nft
    merges intervals per batch)."""
    early: list[tuple[str, list[Element]]] = []
    late: list[tuple[str, list[Element]]] = []
    for s in table.sets:
        entry = is_entry(s.name)
        if "interval" in s.flags or not (entry or len(s.elements) > piece):
            continue
        out = late if entry else early
        out.extend((s.name, s.elements[i : i + piece]) for i in range(0, len(s.elements), piece))
        s.elements = []
    return early, late
