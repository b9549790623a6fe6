"""An ``iptables-restore`` input as plain data, printed as the text the command reads.

One :class:`Restore` holds, per table (``filter``, ``nat``, ``mangle``), in the order
iptables-restore applies them:

* chain lines (``:KUBE-SVC-X - [0:0]``): create the chain, or flush it if it exists
  (with ``--noflush``, only the chains named here are touched);
* rules (``-A CHAIN args...``), appended in order;
* deletions (``-X CHAIN``) of chains that must go (declared above first, so flushed).

Rules may also come from a *source* (:meth:`Restore.lazy_rules`): a function producing
them when the input is printed, so a full sync's 300,000 rules are rendered while
iptables-restore parses the ones before them (:meth:`Restore.chunks`) and are never all
held at once.

Each table ends with ``COMMIT``: iptables-restore applies a table's part atomically
(legacy: one table blob; nft: one transaction). Rules are tuples of arguments written by
the backends from validated model data and our own chain names; :func:`quote` makes an
argument with spaces (a comment) one word for the restore parser, and refuses what could
break out of it.

What that order means for an input (verified in both flavours; the fake,
:mod:`kubeproxy.dataplane.iptables.fake`, enforces it):

* Tables are committed one by one, in the order above: if ``nat`` is refused, an earlier
  ``filter`` in the same input stays committed. Write what must not go live without the
  rest into the same table, or apply the tables in separate calls.
* Every chain a rule is added to, and every chain a rule jumps to, must exist or be
  declared in the same table part; since all chain lines come first, any order of
  :meth:`Restore.chain` and :meth:`Restore.rule` calls works.
* A chain line flushes an existing chain, so a rewritten chain gets exactly the rules
  added to it here. :meth:`Restore.delete` declares the chain too, so the chain is empty
  when its ``-X`` runs; the ``-X`` is still refused while a rule in a chain this input
  does not flush jumps to it (flush or rewrite that chain in the same input). Chains the
  input does not name keep their rules.
* A chain line for a builtin chain (``:PREROUTING``) does nothing under ``--noflush``; to
  change a builtin chain's rules use the runner's ``ensure_rule``/``delete_rule``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from kubeproxy.dataplane.errors import DataplaneInputError

# iptables' limit is 28 characters (XT_EXTENSION_MAXNAMELEN - 1); names are ours.
_CHAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,27}$")
TABLES = ("raw", "mangle", "filter", "nat")
BUILTIN_CHAINS = {
    "raw": ("PREROUTING", "OUTPUT"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
}


class RestoreError(DataplaneInputError):
    """Something iptables-restore would refuse, found while building the input."""

    tool = "iptables-restore"


def check_chain(name: str) -> str:
    if not _CHAIN.match(name):
        raise RestoreError(f"invalid iptables chain name {name!r}")
    return name


# Regular expressions rather than per-character loops: a full sync prints ~10^6 words.
_UNSAFE = re.compile(r'["\\\n\r]')
_SPACE = re.compile(r"\s")


def quote(arg: str) -> str:
    """One restore-input word: quoted when it holds spaces (comments are the only such
    arguments we write); quotes, backslashes and newlines are refused outright."""
    if _UNSAFE.search(arg):
        raise RestoreError(f"argument cannot be written safely: {arg!r}")
    if not arg:
        return '""'
    return f'"{arg}"' if _SPACE.search(arg) else arg


Rule = tuple[str, tuple[str, ...]]  # (chain, arguments after "-A chain")
# Called each time the input is printed; must give the same rules every time.
RuleSource = Callable[[], Iterable[Rule]]
# About this much text per chunk handed to the tool's stdin.
CHUNK = 1 << 16


@dataclass
class TableInput:
    """One table's part of a restore input."""

    chains: list[str] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    # Rules produced when printed, after ``rules``, with how many each gives.
    sources: list[tuple[int, RuleSource]] = field(default_factory=list)
    # A chain-less ``-S`` first (it lists the table as it was; the output is discarded):
    # see the backend's use of it for why.
    list_first: bool = False

    def __bool__(self) -> bool:
        return bool(self.chains or self.rules or self.deletes or self.sources)

    @property
    def rule_count(self) -> int:
        return len(self.rules) + sum(n for n, _ in self.sources)

    def all_rules(self) -> Iterator[Rule]:
        """``rules``, then what the sources produce, in input order."""
        yield from self.rules
        for _, source in self.sources:
            yield from source()


class Restore:
    """A whole ``iptables-restore --noflush`` input, built table by table."""

    def __init__(self) -> None:
        self.tables: dict[str, TableInput] = {}

    def table(self, name: str) -> TableInput:
        if name not in TABLES:
            raise RestoreError(f"unknown table {name!r}")
        return self.tables.setdefault(name, TableInput())

    def chain(self, table: str, name: str) -> None:
        """Declare ``name``: created if missing, flushed if it exists."""
        self.table(table).chains.append(check_chain(name))

    def rule(self, table: str, chain: str, *args: str) -> None:
        self.table(table).rules.append((check_chain(chain), args))

    def rules(self, table: str, chain: str, rules: Iterable[tuple[str, ...]]) -> None:
        t = self.table(table)
        check_chain(chain)
        t.rules.extend((chain, args) for args in rules)

    def lazy_rules(self, table: str, count: int, source: RuleSource) -> None:
        """``count`` rules that ``source`` produces when the input is printed; their
        chains must be declared here (checked as they are printed)."""
        self.table(table).sources.append((count, source))

    def delete(self, table: str, name: str) -> None:
        """Delete ``name`` (declared first, so it is flushed before it goes)."""
        t = self.table(table)
        t.chains.append(check_chain(name))
        t.deletes.append(name)

    def __iter__(self) -> Iterator[tuple[str, TableInput]]:
        for name in TABLES:
            t = self.tables.get(name)
            if t:
                yield name, t

    def __bool__(self) -> bool:
        return any(self.tables.values())

    @property
    def rule_count(self) -> int:
        return sum(t.rule_count for t in self.tables.values())

    def lines(self) -> Iterator[str]:
        """The input, one line (without its newline) at a time."""
        for name, t in self:
            yield f"*{name}"
            if t.list_first:
                yield "-S"
            for c in dict.fromkeys(t.chains):
                yield f":{c} - [0:0]"
            plain = len(t.rules)
            for i, (chain, args) in enumerate(t.all_rules()):
                if i >= plain:
                    check_chain(chain)
                yield f"-A {chain} {' '.join(quote(a) for a in args)}" if args else f"-A {chain}"
            for c in t.deletes:
                yield f"-X {c}"
            yield "COMMIT"

    def chunks(self, size: int = CHUNK) -> Iterator[str]:
        """The input in pieces of about ``size`` characters, whole lines each."""
        batch: list[str] = []
        held = 0
        for line in self.lines():
            batch.append(line)
            held += len(line) + 1
            if held >= size:
                yield "\n".join(batch) + "\n"
                batch, held = [], 0
        if batch:
            yield "\n".join(batch) + "\n"

    def __str__(self) -> str:
        return "".join(self.chunks())
