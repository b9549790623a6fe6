"""An nft transaction as plain data, printed as the script ``nft -f`` applies atomically.

After knftables' ``Transaction``: a transaction is an ordered list of operation objects
(:data:`Operation`), each validated as it is added (so a bad name fails here, not half-way
through the kernel call). ``str()`` gives the exact script; the strict fake
(:mod:`kubeproxy.dataplane.nftables.fake`) applies the same objects to an in-memory
ruleset, all or nothing, refusing what the kernel refuses.

A whole table can also be written in the declarative ``table <family> <name> { ... }``
form (:class:`DefineTable`), which nft 1.0.6 loads without first dumping the kernel's
chains into its cache, and which *adds to* what exists: missing chains and sets are
created, rules are appended, elements added.

Element keys and values are joined from pieces the backends build out of validated model
data (canonical IP strings, integers, protocol names, our own chain names), so no
user-supplied string can reach the script — except an element's comment (the
``namespace/name:port`` it belongs to, :func:`with_comment`), which is reduced to
characters that need no quoting rules and cut to nft's limit. Rules are nft rule text written by the
backends; the fake reads their ``jump``/``goto``/``@set`` references.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kubeproxy.dataplane.errors import DataplaneInputError

# nft's own grammar for an unquoted name (its scanner's ``string``: a letter, ``_`` or
# ``.``, then letters, digits and ``/-_.``; nft 1.0.6 takes no quoted names), up to the
# kernel's 255 bytes. Upstream kube-proxy's nftables mode names chains and sets
# ``service-HASH-ns/name/tcp/port``: a table it wrote holds such names, and taking it over
# means deleting them.
NAME_PATTERN = r"[A-Za-z_.][A-Za-z0-9/_.-]{0,254}"
_NAME = re.compile(rf"^{NAME_PATTERN}$")


class ScriptError(DataplaneInputError):
    """A transaction operation that nft would reject."""

    tool = "nft"


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ScriptError(f"invalid nftables object name {name!r}")
    return name


# An element of a set (value None) or a map (key : value).
Element = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class TableRef:
    family: str
    name: str

    def __str__(self) -> str:
        return f"{self.family} {check_name(self.name)}"


@dataclass(frozen=True, slots=True)
class BaseChain:
    type: str
    hook: str
    priority: str

    def __str__(self) -> str:
        return f"type {self.type} hook {self.hook} priority {self.priority}; policy accept;"


@dataclass(slots=True)
class Chain:
    name: str
    rules: list[str] = field(default_factory=list)
    base: BaseChain | None = None
    comment: str | None = None


@dataclass(slots=True)
class Set:
    """A set, or a map (``keyword="map"``, elements ``key : value``).

    ``type`` is an nft type (``ipv4_addr . inet_service``) or a ``typeof ...`` clause.
    """

    name: str
    type: str
    flags: tuple[str, ...] = ()
    elements: list[Element] = field(default_factory=list)
    comment: str | None = None
    keyword: str = "set"
    timeout: int | None = None  # seconds; dynamic sets only

    @classmethod
    def map(cls, name: str, type: str, comment: str | None = None) -> Set:
        return cls(name, type, comment=comment, keyword="map")

    def header(self) -> list[str]:
        """The definition lines (type, flags, timeout, comment), without elements."""
        lines = [f"type {self.type}" if not self.type.startswith("typeof ") else self.type]
        if self.flags:
            lines.append(f"flags {','.join(self.flags)}")
        if self.timeout is not None:
            lines.append(f"timeout {self.timeout}s")
        if self.comment:
            lines.append(f'comment "{_comment(self.comment)}"')
        return lines

    def same_definition(self, other: Set) -> bool:
        return (self.keyword, self.type, self.flags, self.timeout) == (
            other.keyword,
            other.type,
            other.flags,
            other.timeout,
        )


@dataclass(slots=True)
class Table:
    """A whole table, printed declaratively."""

    family: str
    name: str
    comment: str | None = None
    chains: list[Chain] = field(default_factory=list)
    sets: list[Set] = field(default_factory=list)

    @property
    def ref(self) -> TableRef:
        return TableRef(self.family, self.name)

    def render(self, out: list[str]) -> None:
        out.append(f"table {self.family} {check_name(self.name)} {{")
        if self.comment:
            out.append(f'\tcomment "{_comment(self.comment)}"')
        # Sets and maps first: rules and verdict-map elements refer to them.
        for s in self.sets:
            out.append(f"\t{s.keyword} {check_name(s.name)} {{")
            out.extend(f"\t\t{line}" for line in s.header())
            if s.elements:
                out.append("\t\telements = {")
                out.append(",\n".join(f"\t\t\t{_element(e)}" for e in s.elements))
                out.append("\t\t}")
            out.append("\t}")
        for c in self.chains:
            out.append(f"\tchain {check_name(c.name)} {{")
            if c.comment:
                out.append(f'\t\tcomment "{_comment(c.comment)}"')
            if c.base is not None:
                out.append(f"\t\t{c.base}")
            out.extend(f"\t\t{rule}" for rule in c.rules)
            out.append("\t}")
        out.append("}")


def _element(e: Element) -> str:
    return e[0] if e[1] is None else f"{e[0]} : {e[1]}"


# nft's limit on a comment, in bytes ("comment too long, 128 characters maximum").
COMMENT_MAX = 128
# What a comment keeps as is: every character of a valid namespace, name or port name,
# and the separators. nft 1.0.6's quoted strings have no escapes (a backslash is kept
# literally, a double quote ends the string), so anything else becomes "_".
_UNSAFE = re.compile(r"[^A-Za-z0-9._/:-]")


def element_comment(text: str) -> str:
    """``text`` as an element comment that cannot break the script: unsafe characters
    replaced, cut to :data:`COMMENT_MAX` bytes (ASCII by then) with ``...`` marking a cut."""
    safe = _UNSAFE.sub("_", text)
    if len(safe) > COMMENT_MAX:
        safe = safe[: COMMENT_MAX - 3] + "..."
    return safe


def with_comment(key: str, text: str) -> str:
    """An element key carrying a comment (``KEY comment "TEXT"``), for adding it."""
    return f'{key} comment "{element_comment(text)}"'


def _comment(text: str) -> str:
    # Comments are ours (never user data), but keep the quoting honest anyway.
    if '"' in text or "\n" in text or len(text) > 128:
        raise ScriptError(f"invalid comment {text!r}")
    return text


# --------------------------------------------------------------------- operations


@dataclass(frozen=True, slots=True)
class AddTable:
    table: TableRef
    comment: str | None = None

    def render(self, out: list[str]) -> None:
        body = f' {{ comment "{_comment(self.comment)}"; }}' if self.comment else ""
        out.append(f"add table {self.table}{body}")


@dataclass(frozen=True, slots=True)
class FlushTable:
    table: TableRef

    def render(self, out: list[str]) -> None:
        out.append(f"flush table {self.table}")


@dataclass(frozen=True, slots=True)
class DeleteTable:
    table: TableRef

    def render(self, out: list[str]) -> None:
        out.append(f"delete table {self.table}")


@dataclass(frozen=True, slots=True)
class DefineTable:
    """The declarative form: adds the table, its sets (with elements) and chains (rules
    appended) to whatever exists."""

    definition: Table

    @property
    def table(self) -> TableRef:
        return self.definition.ref

    def render(self, out: list[str]) -> None:
        self.definition.render(out)


@dataclass(frozen=True, slots=True)
class AddChain:
    """Create the chain if missing, then append ``rules``."""

    table: TableRef
    name: str
    rules: tuple[str, ...] = ()
    base: BaseChain | None = None

    def render(self, out: list[str]) -> None:
        parts = [f" {self.base}"] if self.base is not None else []
        parts.extend(f" {r};" for r in self.rules)
        out.append(f"add chain {self.table} {self.name} {{{''.join(parts)} }}")


@dataclass(frozen=True, slots=True)
class FlushChain:
    table: TableRef
    name: str

    def render(self, out: list[str]) -> None:
        out.append(f"flush chain {self.table} {self.name}")


@dataclass(frozen=True, slots=True)
class DeleteChain:
    table: TableRef
    name: str

    def render(self, out: list[str]) -> None:
        out.append(f"delete chain {self.table} {self.name}")


@dataclass(frozen=True, slots=True)
class AddSet:
    """Create the set or map if missing (its definition must match if it exists)."""

    table: TableRef
    set: Set

    def render(self, out: list[str]) -> None:
        body = "".join(f" {line};" for line in self.set.header())
        out.append(f"add {self.set.keyword} {self.table} {self.set.name} {{{body} }}")


@dataclass(frozen=True, slots=True)
class FlushSet:
    table: TableRef
    keyword: str
    name: str

    def render(self, out: list[str]) -> None:
        out.append(f"flush {self.keyword} {self.table} {self.name}")


@dataclass(frozen=True, slots=True)
class DeleteSet:
    table: TableRef
    keyword: str
    name: str

    def render(self, out: list[str]) -> None:
        out.append(f"delete {self.keyword} {self.table} {self.name}")


@dataclass(frozen=True, slots=True)
class AddElements:
    table: TableRef
    set_name: str
    elements: tuple[Element, ...]

    def render(self, out: list[str]) -> None:
        items = ", ".join(_element(e) for e in self.elements)
        out.append(f"add element {self.table} {self.set_name} {{ {items} }}")


@dataclass(frozen=True, slots=True)
class DeleteElements:
    table: TableRef
    set_name: str
    keys: tuple[str, ...]

    def render(self, out: list[str]) -> None:
        out.append(f"delete element {self.table} {self.set_name} {{ {', '.join(self.keys)} }}")


Operation = (
    AddTable
    | FlushTable
    | DeleteTable
    | DefineTable
    | AddChain
    | FlushChain
    | DeleteChain
    | AddSet
    | FlushSet
    | DeleteSet
    | AddElements
    | DeleteElements
)


class Transaction:
    """An ordered list of operations, applied by one ``nft -f`` call (one kernel batch)."""

    def __init__(self) -> None:
        self.ops: list[Operation] = []
        # The printed script, and how many operations it covers (printing a full sync of
        # a large cluster costs ~0.1 s; the runner and the caller's log both want it).
        self._text = ("", 0)

    def __iter__(self) -> Iterator[Operation]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def operations(self) -> int:
        return len(self.ops)

    def extend(self, other: Transaction) -> None:
        self.ops.extend(other.ops)

    # Tables.
    def add_table(self, t: TableRef, comment: str | None = None) -> None:
        if comment is not None:
            _comment(comment)
        self.ops.append(AddTable(t, comment))

    def flush_table(self, t: TableRef) -> None:
        self.ops.append(FlushTable(t))

    def delete_table(self, t: TableRef) -> None:
        self.ops.append(DeleteTable(t))

    def define_table(self, table: Table) -> None:
        self.ops.append(DefineTable(table))

    # Chains.
    def add_chain(
        self, t: TableRef, name: str, rules: Iterable[str] = (), base: BaseChain | None = None
    ) -> None:
        """Create the chain if missing and append ``rules``."""
        self.ops.append(AddChain(t, check_name(name), tuple(rules), base))

    def replace_chain(self, t: TableRef, name: str, rules: Iterable[str]) -> None:
        """Make the chain exist and hold exactly ``rules``."""
        self.add_chain(t, name)
        self.ops.append(FlushChain(t, name))
        self.add_chain(t, name, rules)

    def flush_chain(self, t: TableRef, name: str) -> None:
        self.ops.append(FlushChain(t, check_name(name)))

    def delete_chain(self, t: TableRef, name: str) -> None:
        self.ops.append(DeleteChain(t, check_name(name)))

    # Sets and maps.
    def add_set(self, t: TableRef, s: Set) -> None:
        check_name(s.name)
        if s.elements:
            raise ScriptError("add_set: add elements with add_elements")
        self.ops.append(AddSet(t, s))

    def flush_set(self, t: TableRef, keyword: str, name: str) -> None:
        self.ops.append(FlushSet(t, keyword, check_name(name)))

    def delete_set(self, t: TableRef, keyword: str, name: str) -> None:
        self.ops.append(DeleteSet(t, keyword, check_name(name)))

    def add_elements(self, t: TableRef, set_name: str, elements: Iterable[Element]) -> None:
        items = tuple(elements)
        if items:
            self.ops.append(AddElements(t, check_name(set_name), items))

    def delete_elements(self, t: TableRef, set_name: str, keys: Iterable[str]) -> None:
        items = tuple(keys)
        if items:
            self.ops.append(DeleteElements(t, check_name(set_name), items))

    def __bool__(self) -> bool:
        return bool(self.ops)

    def __str__(self) -> str:
        text, covered = self._text
        if covered != len(self.ops) or not covered:
            out: list[str] = []
            for op in self.ops:
                op.render(out)
            text = "\n".join(out) + ("\n" if out else "")
            self._text = (text, len(self.ops))
        return text
