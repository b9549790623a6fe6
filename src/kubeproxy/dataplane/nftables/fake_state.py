"""The strict nftables fake's committed state: tables, chains and sets.

Part of the fake (:mod:`kubeproxy.dataplane.nftables.fake` maps it).
:class:`FakeTable` / :class:`FakeChain` / :class:`FakeSet` / :class:`BaseSpec`, readable by
tests as ``fake.tables[("ip", "t")].sets["s"].elements`` (canonical key -> value or
None) and ``.chains["c"].rules``. Treat them as read-only: committed objects are shared
with clones and never mutated in place; a batch changes only the copies it owns
(``owner``, the batch's token). A :class:`FakeSet` of intervals indexes its elements by
their bounds so that an overlap check stays cheap (``_overlap``).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from kubeproxy.dataplane.nftables.fake_types import (
    Bounds,
    SetType,
)

TableKey = tuple[str, str]  # (family, name)


@dataclass(frozen=True, slots=True)
class BaseSpec:
    type: str
    hook: str
    priority: int

    def __str__(self) -> str:
        return f"type {self.type} hook {self.hook} priority {self.priority}; policy accept;"


@dataclass(eq=False, slots=True)
class FakeChain:
    name: str
    base: BaseSpec | None = None
    rules: list[str] = field(default_factory=list)
    comment: str | None = None
    owner: int = 0  # token of the batch allowed to change it

    def clone(self, owner: int, *, rules: bool = True) -> FakeChain:
        kept = list(self.rules) if rules else []
        return FakeChain(self.name, self.base, kept, self.comment, owner)


@dataclass(eq=False, slots=True)
class FakeSet:
    """A set or map. ``elements`` maps canonical keys to canonical values (None in sets)."""

    name: str
    keyword: str
    type: SetType
    flags: frozenset[str] = frozenset()
    timeout: int | None = None
    comment: str | None = None
    elements: dict[str, str | None] = field(default_factory=dict)
    owner: int = 0
    # Interval sets only: bounds per element, and the elements grouped by the bounds of
    # their first component when it is a single value (None: a prefix or range), so an
    # overlap check looks at one group plus the wide elements, not at the whole set.
    bounds: dict[str, tuple[Bounds, ...]] = field(default_factory=dict)
    # Groups are tuples, replaced rather than changed, so a clone copies only the dict.
    groups: dict[Bounds | None, tuple[str, ...]] = field(default_factory=dict)
    # Element comments, by canonical key.
    comments: dict[str, str] = field(default_factory=dict)

    @property
    def interval(self) -> bool:
        return "interval" in self.flags

    @property
    def is_map(self) -> bool:
        return self.type.data is not None

    def clone(self, owner: int, *, elements: bool = True) -> FakeSet:
        return FakeSet(
            self.name,
            self.keyword,
            self.type,
            self.flags,
            self.timeout,
            self.comment,
            dict(self.elements) if elements else {},
            owner,
            dict(self.bounds) if elements else {},
            dict(self.groups) if elements else {},
            dict(self.comments) if elements else {},
        )

    def same_definition(self, other: FakeSet) -> bool:
        return (self.is_map, self.type.key, self.type.data, self.flags, self.timeout) == (
            other.is_map,
            other.type.key,
            other.type.data,
            other.flags,
            other.timeout,
        )

    def overlapping(self, bounds: tuple[Bounds, ...]) -> str | None:
        """An element sharing at least one value with ``bounds``, if any."""
        first = bounds[0]
        candidates: Iterable[str]
        if first[0] == first[1]:
            candidates = itertools.chain(self.groups.get(first, ()), self.groups.get(None, ()))
        else:
            candidates = self.bounds
        return next((other for other in candidates if _overlap(bounds, self.bounds[other])), None)

    def insert(
        self, key: str, value: str | None, bounds: tuple[Bounds, ...], comment: str | None = None
    ) -> None:
        self.elements[key] = value
        if comment is not None:
            self.comments[key] = comment
        if self.interval:
            self.bounds[key] = bounds
            group = _group(bounds)
            self.groups[group] = (*self.groups.get(group, ()), key)

    def remove(self, key: str) -> str | None:
        value = self.elements.pop(key)
        self.comments.pop(key, None)
        if self.interval:
            group = _group(self.bounds.pop(key))
            rest = tuple(k for k in self.groups[group] if k != key)
            if rest:
                self.groups[group] = rest
            else:
                del self.groups[group]
        return value

    def header(self) -> list[str]:
        spec = self.type.spec
        lines = [spec if spec.startswith("typeof ") else f"type {spec}"]
        if self.flags:
            lines.append(f"flags {','.join(sorted(self.flags))}")
        if self.timeout is not None:
            lines.append(f"timeout {self.timeout}s")
        if self.comment:
            lines.append(f'comment "{self.comment}"')
        return lines


def _overlap(a: tuple[Bounds, ...], b: tuple[Bounds, ...]) -> bool:
    return all(lo <= o_hi and o_lo <= hi for (lo, hi), (o_lo, o_hi) in zip(a, b, strict=True))


def _group(bounds: tuple[Bounds, ...]) -> Bounds | None:
    return bounds[0] if bounds[0][0] == bounds[0][1] else None


@dataclass(eq=False, slots=True)
class FakeTable:
    family: str
    name: str
    comment: str | None = None
    chains: dict[str, FakeChain] = field(default_factory=dict)
    sets: dict[str, FakeSet] = field(default_factory=dict)
    # References held by rules and verdict-map elements (chains) and by rules (sets).
    chain_refs: Counter[str] = field(default_factory=Counter)
    set_refs: Counter[str] = field(default_factory=Counter)
    owner: int = 0

    def clone(self, owner: int) -> FakeTable:
        return FakeTable(
            self.family,
            self.name,
            self.comment,
            dict(self.chains),
            dict(self.sets),
            Counter(self.chain_refs),
            Counter(self.set_refs),
            owner,
        )
