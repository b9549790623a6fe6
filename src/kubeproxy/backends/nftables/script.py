"""An nft transaction as plain data, printed as the script ``nft -f`` applies atomically.

After knftables' ``Transaction``: operations are appended in order, object names are
validated as they are added (so a bad name fails here, not half-way through the kernel
call), and ``str()`` gives the exact script. A whole table can also be written in the
declarative ``table <family> <name> { ... }`` form, which nft 1.0.6 loads without first
dumping the kernel's chains into its cache.

Element keys and values are joined from pieces the renderer builds out of validated
model data (canonical IP strings, integers, protocol enum values, our own chain names),
so no user-supplied string can reach the script.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


class ScriptError(ValueError):
    """A transaction operation that nft would reject."""


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ScriptError(f"invalid nftables object name {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class BaseChain:
    type: str
    hook: str
    priority: str


@dataclass(slots=True)
class Chain:
    name: str
    rules: list[str] = field(default_factory=list)
    base: BaseChain | None = None
    comment: str | None = None


@dataclass(slots=True)
class Set:
    """A set, or a map (``keyword="map"``, elements ``key : value``); elements as text.

    ``type`` is an nft type (``ipv4_addr . inet_service``) or a ``typeof ...`` clause.
    """

    name: str
    type: str
    flags: tuple[str, ...] = ()
    elements: list[str] = field(default_factory=list)
    comment: str | None = None
    keyword: str = "set"
    timeout: int | None = None  # seconds; dynamic sets only

    @classmethod
    def map(cls, name: str, type: str, comment: str | None = None) -> Set:
        return cls(name, type, comment=comment, keyword="map")


@dataclass(slots=True)
class Table:
    """A whole table, printed declaratively."""

    family: str
    name: str
    comment: str | None = None
    chains: list[Chain] = field(default_factory=list)
    sets: list[Set] = field(default_factory=list)

    def render(self, out: list[str]) -> None:
        out.append(f"table {self.family} {check_name(self.name)} {{")
        if self.comment:
            out.append(f'\tcomment "{_comment(self.comment)}"')
        # Sets and maps first: rules and verdict-map elements refer to them.
        for s in self.sets:
            out.append(f"\t{s.keyword} {check_name(s.name)} {{")
            out.extend(f"\t\t{line}" for line in _set_body(s))
            if s.elements:
                out.append("\t\telements = {")
                out.append(",\n".join(f"\t\t\t{e}" for e in s.elements))
                out.append("\t\t}")
            out.append("\t}")
        for c in self.chains:
            out.append(f"\tchain {check_name(c.name)} {{")
            if c.comment:
                out.append(f'\t\tcomment "{_comment(c.comment)}"')
            if c.base is not None:
                out.append(f"\t\t{_base(c.base)}")
            out.extend(f"\t\t{rule}" for rule in c.rules)
            out.append("\t}")
        out.append("}")


def _base(base: BaseChain) -> str:
    return f"type {base.type} hook {base.hook} priority {base.priority}; policy accept;"


def _set_body(s: Set) -> list[str]:
    lines = [f"type {s.type}" if not s.type.startswith("typeof ") else s.type]
    if s.flags:
        lines.append(f"flags {','.join(s.flags)}")
    if s.timeout is not None:
        lines.append(f"timeout {s.timeout}s")
    if s.comment:
        lines.append(f'comment "{_comment(s.comment)}"')
    return lines


def _comment(text: str) -> str:
    # Comments are ours (never user data), but keep the quoting honest anyway.
    if '"' in text or "\n" in text or len(text) > 128:
        raise ScriptError(f"invalid comment {text!r}")
    return text


@dataclass(frozen=True, slots=True)
class TableRef:
    family: str
    name: str

    def __str__(self) -> str:
        return f"{self.family} {check_name(self.name)}"


class Transaction:
    """An ordered list of nft commands, applied by one ``nft -f`` call (one kernel batch)."""

    def __init__(self) -> None:
        self._out: list[str] = []
        self.operations = 0

    def _emit(self, line: str) -> None:
        self._out.append(line)
        self.operations += 1

    # Tables.
    def add_table(self, t: TableRef, comment: str | None = None) -> None:
        body = f' {{ comment "{_comment(comment)}"; }}' if comment else ""
        self._emit(f"add table {t}{body}")

    def flush_table(self, t: TableRef) -> None:
        self._emit(f"flush table {t}")

    def delete_table(self, t: TableRef) -> None:
        self._emit(f"delete table {t}")

    def define_table(self, table: Table) -> None:
        """Add a table with everything in it (the declarative form: adds to what exists)."""
        table.render(self._out)
        self.operations += 1

    # Chains.
    def add_chain(self, t: TableRef, name: str, rules: Iterable[str] = ()) -> None:
        """Create the chain if missing and append ``rules``."""
        body = "".join(f" {r};" for r in rules)
        self._emit(f"add chain {t} {check_name(name)} {{{body} }}")

    def replace_chain(self, t: TableRef, name: str, rules: Iterable[str]) -> None:
        """Make the chain exist and hold exactly ``rules``."""
        self._emit(f"add chain {t} {check_name(name)}")
        self._emit(f"flush chain {t} {check_name(name)}")
        self.add_chain(t, name, rules)

    def delete_chain(self, t: TableRef, name: str) -> None:
        self._emit(f"delete chain {t} {check_name(name)}")

    # Sets and maps.
    def add_set(self, t: TableRef, s: Set) -> None:
        body = "".join(f" {line};" for line in _set_body(s))
        self._emit(f"add {s.keyword} {t} {check_name(s.name)} {{{body} }}")

    def flush_set(self, t: TableRef, keyword: str, name: str) -> None:
        self._emit(f"flush {keyword} {t} {check_name(name)}")

    def delete_set(self, t: TableRef, keyword: str, name: str) -> None:
        self._emit(f"delete {keyword} {t} {check_name(name)}")

    def add_elements(self, t: TableRef, set_name: str, elements: Iterable[str]) -> None:
        items = list(elements)
        if items:
            self._emit(f"add element {t} {check_name(set_name)} {{ {', '.join(items)} }}")

    def delete_elements(self, t: TableRef, set_name: str, keys: Iterable[str]) -> None:
        items = list(keys)
        if items:
            self._emit(f"delete element {t} {check_name(set_name)} {{ {', '.join(items)} }}")

    def __bool__(self) -> bool:
        return bool(self._out)

    def __str__(self) -> str:
        return "\n".join(self._out) + ("\n" if self._out else "")
