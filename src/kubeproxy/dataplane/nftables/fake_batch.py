"""The strict nftables fake's batches: one transaction applied all or nothing.

Part of the fake (:mod:`kubeproxy.dataplane.nftables.fake` maps it and lists the kernel
and nft facts enforced here). :class:`_Batch` applies one transaction to a copy-on-write
view of the committed tables: every object it changes is cloned first (owned by the
batch's token), so a refused batch is simply dropped. Reference counts (rules and
verdict-map elements -> chains, rules -> sets) are kept per table so busy checks are
O(1). :class:`_Churn` follows what a batch does to each set of intervals, for nft
1.0.6's bookkeeping of those. A refusal is a ``_RefusedError`` from the operation that
caused it.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from kubeproxy.dataplane.nftables.fake_state import (
    BaseSpec,
    FakeChain,
    FakeSet,
    FakeTable,
    TableKey,
    _overlap,
)
from kubeproxy.dataplane.nftables.fake_types import (
    CHAIN_TYPES,
    EBUSY,
    EEXIST,
    EINVAL,
    ENOENT,
    EOPNOTSUPP,
    FAMILIES,
    HOOKS,
    SET_FLAGS,
    Bounds,
    _kernel,
    _nft,
    _RefusedError,
    _verdict,
    canonical_key,
    canonical_value,
    parse_priority,
    parse_set_type,
    rule_references,
    split_comment,
)
from kubeproxy.dataplane.nftables.transaction import (
    AddChain,
    AddElements,
    AddSet,
    AddTable,
    BaseChain,
    DefineTable,
    DeleteChain,
    DeleteElements,
    DeleteSet,
    DeleteTable,
    FlushChain,
    FlushSet,
    FlushTable,
    Operation,
    Set,
    Table,
    TableRef,
    Transaction,
)

# Operations that make nft 1.0.6 load the kernel's sets into its cache (see the module
# docstring); without one, rules in "add chain" see only sets the script declares.
_LOADS_SETS = (
    DefineTable,
    AddElements,
    DeleteElements,
    FlushSet,
    DeleteSet,
    DeleteChain,
    DeleteTable,
)
_tokens = itertools.count(1)


@dataclass(slots=True)
class _Churn:
    """One batch's changes to one set of intervals without concatenation.

    nft 1.0.6 keeps its own picture of these sets, and it and the kernel lose track in
    some batches that add and delete the same span several times. Found by random batches
    against the kernel (``tests/nft_fake_cases.py`` has a case of each):

    * nft counts an interval once per ``add``, so after re-adding an existing interval
      and deleting it, nft still believes in it and refuses an overlapping add
      ("interval overlaps with an existing one").
    * Deleting an interval twice (re-added in between) is refused by the kernel ("No
      such file or directory"); in a set created by the batch, adding an interval that
      overlaps one the batch added and deleted is refused too ("File exists").
    * When the batch flushes the set (anywhere in it) nft loads none of its elements: it
      deletes only what the batch added since the last flush ("element does not exist";
      the kernel still refuses overlaps), and an interval added after a flush cannot be
      deleted if the set held it before the batch, or the batch added an overlapping one
      before that flush ("No such file or directory").
    """

    before: Collection[str]  # the set's keys before the batch
    new_set: bool
    flushing: bool  # the batch flushes this set somewhere
    count: Counter[str] = field(default_factory=Counter)  # adds minus deletes, as nft counts
    ghosts: dict[str, tuple[Bounds, ...]] = field(default_factory=dict)  # deleted, believed
    added: dict[str, tuple[Bounds, ...]] = field(default_factory=dict)  # since the last flush
    deleted: set[str] = field(default_factory=set)  # since the last flush
    before_flush: dict[str, tuple[Bounds, ...]] = field(default_factory=dict)
    after_flush: dict[str, tuple[Bounds, ...]] = field(default_factory=dict)
    flushed: bool = False

    def _believed(self, key: str) -> int:
        held = not self.flushing and key in self.before
        return held + self.count[key]

    def add(self, key: str, bounds: tuple[Bounds, ...]) -> None:
        for other, b in self.ghosts.items():
            if other != key and _overlap(bounds, b):
                raise _nft(
                    f"interval overlaps with an existing one ({key} vs {other}: nft 1.0.6 "
                    "still counts an interval this batch added twice and deleted once)"
                )
        if self.new_set:
            for other in self.deleted:
                if other != key and other in self.added and _overlap(bounds, self.added[other]):
                    raise _kernel(EEXIST, f"{key} overlaps {other}, added and deleted")
        self.count[key] += 1
        self.ghosts.pop(key, None)
        self.added[key] = bounds
        if self.flushed:
            self.after_flush[key] = bounds
        elif self.flushing:
            self.before_flush[key] = bounds

    def delete(self, key: str, bounds: tuple[Bounds, ...]) -> None:
        if self.flushing and self._believed(key) <= 0:
            raise _nft(
                f"element does not exist ({key}: nft 1.0.6 loads no elements of a set the "
                "batch flushes)"
            )
        if key in self.deleted or (
            key in self.after_flush
            and (key in self.before or any(_overlap(bounds, b) for b in self.before_flush.values()))
        ):
            raise _kernel(ENOENT, f"{key}: nft 1.0.6 loses track of intervals a batch churns")
        self.count[key] -= 1
        if self._believed(key) > 0:
            self.ghosts[key] = bounds
        self.deleted.add(key)

    def flush(self) -> None:
        self.flushed = True
        self.count.clear()
        self.ghosts.clear()
        self.added.clear()
        self.deleted.clear()
        self.before_flush.update(self.after_flush)
        self.after_flush.clear()


class _Batch:
    """One transaction applied to a copy-on-write view of committed state."""

    def __init__(self, committed: dict[TableKey, FakeTable], tx: Transaction) -> None:
        self.committed = committed
        self.tables = dict(committed)
        self.token = next(_tokens)
        self.sets_loaded = any(isinstance(op, _LOADS_SETS) for op in tx.ops)
        # Sets the script has declared so far, and sets created by this batch.
        self.declared: set[tuple[TableKey, str]] = set()
        self.created: set[tuple[TableKey, str]] = set()
        self.churn: dict[tuple[TableKey, str], _Churn] = {}
        # Where each set is flushed last, and where the batch is now.
        self.last_flush = {
            ((op.table.family, op.table.name), op.name): i
            for i, op in enumerate(tx.ops)
            if isinstance(op, FlushSet)
        }
        self.flushing = self.last_flush.keys()
        self.position = 0

    # Copy-on-write access.

    def _table(self, ref: TableRef) -> FakeTable:
        key = (ref.family, ref.name)
        table = self.tables.get(key)
        if table is None:
            raise _kernel(ENOENT, f"no table {ref}")
        if table.owner != self.token:
            table = self.tables[key] = table.clone(self.token)
        return table

    def _chain(self, table: FakeTable, name: str, *, writable: bool = True) -> FakeChain:
        chain = table.chains.get(name)
        if chain is None:
            raise _kernel(ENOENT, f"no chain {name} in table {table.family} {table.name}")
        if writable and chain.owner != self.token:
            chain = table.chains[name] = chain.clone(self.token)
        return chain

    def _set(
        self, table: FakeTable, name: str, keyword: str | None = None, *, writable: bool = True
    ) -> FakeSet:
        s = table.sets.get(name)
        if s is None or (keyword is not None and s.keyword != keyword):
            raise _kernel(
                ENOENT, f"no {keyword or 'set or map'} {name} in table {table.family} {table.name}"
            )
        if writable and s.owner != self.token:
            s = table.sets[name] = s.clone(self.token)
        return s

    # Operations.

    def apply(self, op: Operation) -> None:
        match op:
            case AddTable():
                self._add_table(op.table, op.comment)
            case FlushTable():
                table = self._table(op.table)
                for chain in list(table.chains.values()):
                    if chain.rules:
                        self._flush_chain(table, chain)
            case DeleteTable():
                if self.tables.pop((op.table.family, op.table.name), None) is None:
                    raise _kernel(ENOENT, f"no table {op.table}")
            case DefineTable():
                self._define_table(op.definition)
            case AddChain():
                table = self._table(op.table)
                self._ensure_chain(table, op.name, op.base, None)
                for rule in op.rules:
                    self._add_rule(table, op.name, rule)
            case FlushChain():
                table = self._table(op.table)
                self._flush_chain(table, self._chain(table, op.name, writable=False))
            case DeleteChain():
                self._delete_chain(self._table(op.table), op.name)
            case AddSet():
                self._ensure_set(self._table(op.table), op.set)
            case FlushSet():
                table = self._table(op.table)
                s = self._set(table, op.name, op.keyword, writable=False)
                churn = self._churn(table, s)
                if churn is not None:
                    churn.flush()
                self._release_elements(table, s)
                # A new empty set rather than a copy emptied: flushing a big map is cheap.
                table.sets[op.name] = s.clone(self.token, elements=False)
            case DeleteSet():
                self._delete_set(self._table(op.table), op.name)
            case AddElements():
                table = self._table(op.table)
                s = self._set(table, op.set_name)
                for key, value in op.elements:
                    self._add_element(table, s, key, value)
            case DeleteElements():
                table = self._table(op.table)
                s = self._set(table, op.set_name)
                for key in op.keys:
                    self._delete_element(table, s, key)

    def _add_table(self, ref: TableRef, comment: str | None) -> FakeTable:
        key = (ref.family, ref.name)
        if key not in self.tables:
            if ref.family not in FAMILIES:
                raise _nft(f"unknown table family {ref.family!r}")
            self.tables[key] = FakeTable(ref.family, ref.name, comment, owner=self.token)
        return self._table(ref)

    def _define_table(self, definition: Table) -> None:
        # nft expands the block into: table, chains, sets with their elements, rules.
        table = self._add_table(definition.ref, definition.comment)
        for chain in definition.chains:
            self._ensure_chain(table, chain.name, chain.base, chain.comment)
        for s in definition.sets:
            new = s.name not in table.sets
            self._ensure_set(table, s)
            if (
                new
                and self.last_flush.get(((table.family, table.name), s.name), -1) > self.position
            ):
                # nft 1.0.6 drops the elements declared with a set it creates when the
                # batch flushes that set later on, unchecked (a clash, a missing chain).
                continue
            if s.elements:
                fake_set = self._set(table, s.name)
                for key, value in s.elements:
                    self._add_element(table, fake_set, key, value)
        for chain in definition.chains:
            for rule in chain.rules:
                self._add_rule(table, chain.name, rule)

    def _ensure_chain(
        self, table: FakeTable, name: str, base: BaseChain | None, comment: str | None
    ) -> None:
        spec = _base_spec(base) if base is not None else None
        existing = table.chains.get(name)
        if existing is None:
            table.chains[name] = FakeChain(name, spec, comment=comment, owner=self.token)
            return
        if spec is None or spec == existing.base:
            return
        if existing.base is None:
            raise _kernel(EOPNOTSUPP, f"chain {name} exists without a hook")
        if existing.base.type != spec.type:
            raise _kernel(EEXIST, f"chain {name} exists with type {existing.base.type}")
        raise _kernel(EOPNOTSUPP, f"chain {name} exists as {existing.base}")

    def _add_rule(self, table: FakeTable, chain_name: str, rule: str) -> None:
        refs = rule_references(rule)
        for target in refs.chains:
            self._check_jump(table, target)
        tkey = (table.family, table.name)
        for name in refs.sets:
            if not self.sets_loaded and (tkey, name) not in self.declared:
                raise _nft(
                    f"{ENOENT} (@{name}: nft 1.0.6 loads no sets from the kernel for this "
                    "batch, and the script has not declared it)"
                )
            s = table.sets.get(name)
            if s is None:
                raise _nft(f"{ENOENT} (no set or map {name} for @{name})")
            if self.sets_loaded and s.type.unreadable_typeof and (tkey, name) not in self.created:
                raise _nft(
                    "conflicting protocols specified: ip vs. th "
                    f"(nft 1.0.6 cannot read back the type of {s.keyword} {name})"
                )
        self._chain(table, chain_name).rules.append(rule)
        table.chain_refs.update(refs.chains)
        table.set_refs.update(refs.sets)

    def _check_jump(self, table: FakeTable, target: str) -> None:
        chain = table.chains.get(target)
        if chain is None:
            raise _kernel(ENOENT, f"jump/goto to missing chain {target}")
        if chain.base is not None:
            raise _kernel(EOPNOTSUPP, f"jump/goto to base chain {target}")

    def _release_rules(self, table: FakeTable, chain: FakeChain) -> None:
        for rule in chain.rules:
            refs = rule_references(rule)
            table.chain_refs.subtract(refs.chains)
            table.set_refs.subtract(refs.sets)

    def _flush_chain(self, table: FakeTable, chain: FakeChain) -> None:
        self._release_rules(table, chain)
        table.chains[chain.name] = chain.clone(self.token, rules=False)

    def _delete_chain(self, table: FakeTable, name: str) -> None:
        chain = self._chain(table, name, writable=False)
        # Self-jumps count: the kernel drops the chain's own rules but not their hold on it.
        if table.chain_refs[name] > 0:
            raise _kernel(
                EBUSY, f"chain {name} is still referred to {table.chain_refs[name]} times"
            )
        self._release_rules(table, chain)
        del table.chains[name]

    def _ensure_set(self, table: FakeTable, s: Set) -> None:
        tkey = (table.family, table.name)
        flags = frozenset(s.flags)
        if not flags <= SET_FLAGS:
            raise _nft(f"unknown set flags {sorted(flags - SET_FLAGS)}")
        wanted = FakeSet(
            s.name,
            s.keyword,
            parse_set_type(s.type, s.keyword),
            flags,
            s.timeout,
            s.comment,
            owner=self.token,
        )
        self.declared.add((tkey, s.name))
        existing = table.sets.get(s.name)
        if existing is None:
            table.sets[s.name] = wanted
            self.created.add((tkey, s.name))
        elif not existing.same_definition(wanted):
            raise _kernel(
                EEXIST,
                f"{existing.keyword} {s.name} exists as {'; '.join(existing.header())}",
            )

    def _churn(self, table: FakeTable, s: FakeSet) -> _Churn | None:
        """The batch's record of ``s`` if it is a set of intervals without concatenation."""
        if not s.interval or len(s.type.key) > 1:
            return None
        key = ((table.family, table.name), s.name)
        churn = self.churn.get(key)
        if churn is None:
            new = key in self.created
            old = None if new else self.committed[key[0]].sets.get(s.name)
            churn = self.churn[key] = _Churn(
                old.elements if old is not None else {}, new, key in self.flushing
            )
        return churn

    def _release_elements(self, table: FakeTable, s: FakeSet) -> None:
        if s.type.is_verdict_map:
            table.chain_refs.subtract(_jump_targets(s.elements.values()))

    def _delete_set(self, table: FakeTable, name: str) -> None:
        # The kernel does not tell sets from maps here: "delete map" removes a set too.
        s = self._set(table, name, writable=False)
        if table.set_refs[name] > 0:
            raise _kernel(EBUSY, f"{s.keyword} {name} is used by {table.set_refs[name]} rules")
        self._release_elements(table, s)
        del table.sets[name]
        self.churn.pop(((table.family, table.name), name), None)

    def _add_element(self, table: FakeTable, s: FakeSet, key: str, value: str | None) -> None:
        if value is not None and not s.is_map:
            raise _nft(f"set is not a map ({s.name}: {key} : {value})")
        if value is None and s.is_map:
            raise _kernel(EINVAL, f"map element {key} has no value")
        key, comment = split_comment(key)
        ckey, bounds = canonical_key(s.type, key, s.interval)
        target = None
        if value is not None:
            if s.type.is_verdict_map:
                value, target = _verdict(value)
                if target is not None:
                    self._check_jump(table, target)
            else:
                value = canonical_value(s.type, value)
        churn = self._churn(table, s)
        if ckey in s.elements:
            if s.elements[ckey] != value:
                raise _kernel(
                    EEXIST, f"{s.name}: {ckey} is mapped to {s.elements[ckey]}, not {value}"
                )
            if churn is not None:
                churn.add(ckey, bounds)
            return
        if s.interval:
            clash = s.overlapping(bounds)
            if clash is not None:
                raise self._overlap_error(table, s, ckey, clash)
        if churn is not None:
            churn.add(ckey, bounds)
        s.insert(ckey, value, bounds, comment)
        if target is not None:
            table.chain_refs[target] += 1

    def _overlap_error(self, table: FakeTable, s: FakeSet, key: str, clash: str) -> _RefusedError:
        if len(s.type.key) > 1:  # the kernel's pipapo check
            return _kernel(EEXIST, f"{s.name}: {key} overlaps {clash}")
        before = self.committed.get((table.family, table.name))
        old = before.sets.get(s.name) if before is not None else None
        if old is not None and clash in old.elements:
            return _nft(f"interval overlaps with an existing one ({s.name}: {key} vs {clash})")
        return _nft(f"conflicting intervals specified ({s.name}: {key} vs {clash})")

    def _delete_element(self, table: FakeTable, s: FakeSet, key: str) -> None:
        # A comment in a delete is accepted and ignored: elements are matched by key.
        ckey, bounds = canonical_key(s.type, split_comment(key)[0], s.interval)
        if ckey not in s.elements:
            if s.interval and len(s.type.key) == 1:
                raise _nft(f"element does not exist ({s.name}: {ckey})")
            raise _kernel(ENOENT, f"{s.name} has no element {ckey}")
        churn = self._churn(table, s)
        if churn is not None:
            churn.delete(ckey, bounds)
        value = s.remove(ckey)
        if s.type.is_verdict_map and value is not None:
            target = _verdict(value)[1]
            if target is not None:
                table.chain_refs[target] -= 1


def _base_spec(base: BaseChain) -> BaseSpec:
    if base.type not in CHAIN_TYPES:
        raise _nft(f"unknown chain type {base.type!r}")
    if base.hook not in HOOKS:
        raise _nft(f"unknown chain hook {base.hook!r}")
    return BaseSpec(base.type, base.hook, parse_priority(base.priority))


def _jump_targets(values: Iterable[str | None]) -> Iterator[str]:
    for value in values:
        if value is not None:
            target = _verdict(value)[1]
            if target is not None:
                yield target
