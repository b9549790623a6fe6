"""A strict in-memory nftables: applies transactions all or nothing, refusing what the
kernel (6.x) with nft 1.0.6 refuses, so backends can be tested without root.

After kubernetes-sigs/knftables' fake. :class:`FakeNftables` implements
:class:`~kubeproxy.dataplane.nftables.runner.NftRunner`: ``apply`` runs a
:class:`~kubeproxy.dataplane.nftables.transaction.Transaction` against a copy-on-write
view of the state and commits only if every operation succeeds; otherwise it raises
:class:`~kubeproxy.dataplane.nftables.runner.NftError` with an nft-like message and
changes nothing.

Map of the fake (this module re-exports the public names of the others):

* **Datatypes** (:mod:`.fake_types`) -- :func:`parse_set_type` turns a set's
  ``type``/``typeof`` clause into component datatypes (:class:`SetType`);
  :func:`canonical_key` / :func:`canonical_value` validate an element against them and
  give its canonical text (the form ``nft list`` prints: ``10.0.0.0/24``, ``tcp``,
  ``goto x``) and, for interval sets, its bounds. :func:`parse_priority` reads a base
  chain priority (``-110``, ``dstnat``, ``filter + 10``).
* **State** (:mod:`.fake_state`) -- :class:`FakeTable` / :class:`FakeChain` /
  :class:`FakeSet` / :class:`BaseSpec`, readable by tests as
  ``fake.tables[("ip", "t")].sets["s"].elements`` (canonical key -> value or None) and
  ``.chains["c"].rules``. Treat them as read-only: committed objects are shared with
  clones and never mutated in place.
* **Batches** (:mod:`.fake_batch`) -- ``_Batch`` applies one transaction: every object
  it changes is cloned first (owned by the batch's token), so a refused batch is simply
  dropped. Reference counts (rules and verdict-map elements -> chains, rules -> sets)
  are kept per table so busy checks are O(1). ``_Churn`` follows what a batch does to
  each set of intervals, for nft 1.0.6's bookkeeping of those.
* **Runner** (this module) -- :class:`FakeNftables`: ``apply``/``check``/
  ``list_tables``/``has_table``/``list_objects``, ``dump()`` (sorted, deterministic text), counters,
  ``clone()`` and fault injection (``fail_next``, ``refuse``).

Kernel and nft 1.0.6 facts this models (verified against kernel 6.18 in a scratch
network namespace; ``tests/kernel/test_nft_fake_vs_kernel.py`` re-checks each case):

* ``add table`` on an existing table is a no-op; a comment is only set at creation (a
  different comment later is ignored, not refused). The same holds for set and chain
  comments.
* ``flush table`` removes every rule of every chain and nothing else: chains, sets and
  set elements stay. ``delete table`` removes everything; deleting, flushing or adding to
  a missing table (or chain, set) is "No such file or directory".
* The declarative ``table f t { ... }`` form creates the table, then all its chains,
  then its sets with their elements, then appends the rules; so rules and verdict-map
  elements may refer to chains and sets declared anywhere in the block. On an existing
  table it adds what is missing, appends rules and adds elements.
* ``add chain`` on an existing chain appends its rules. Redefining a base chain with
  another type is "File exists"; with another hook or priority, or giving a regular
  chain a hook, is "Operation not supported"; ``add chain`` without a hook on a base
  chain is fine. Priorities compare by value (``dstnat`` == ``-100``).
* Jumps are checked where the rule or element is added: ``jump``/``goto`` to a chain
  missing at that point of the batch is "No such file or directory" (a chain created
  later in the same batch does not help, except inside one declarative block); to a base
  chain, "Operation not supported".
* ``delete chain`` deletes the chain's own rules with it, but is "Device or resource
  busy" while any rule (its own self-jumps included) or verdict-map element refers to it.
  References removed earlier in the same batch (``flush chain``, ``flush table``,
  ``delete chain`` of the referring chain, ``delete element``, ``flush map``,
  ``delete map``) no longer count.
* ``delete set``/``delete map`` is "Device or resource busy" while a rule refers to it
  (``@name``); the kernel does not tell sets from maps there, so ``delete map`` of a set
  works. ``flush set`` of a map (or ``flush map`` of a set) is "No such file or
  directory" (nft checks the kind).
* ``add set`` on an existing set is a no-op if key/data types and flags match (``typeof
  ip daddr`` is the same as ``type ipv4_addr``; flag order does not matter), else "File
  exists".
* Elements: adding a key that exists with the same value is accepted (also twice in one
  command); with another value, "File exists". Deleting a missing key is "No such file or
  directory", also for the second of two equal keys in one command. An element may carry
  a comment (``KEY comment "TEXT"``, at most 128 bytes, else "comment too long"); adding
  an existing key again keeps the comment it has. A value on a set
  element ("set is not a map") or a missing one on a map element ("Invalid argument") is
  refused. Prefixes and ranges need ``flags interval``; an address of the other family,
  a port over 65535, a protocol over 255 are refused by nft.
* Concatenated interval sets: the kernel refuses an element overlapping an existing one
  or one added earlier in the batch ("File exists", see below for its blind spot); an
  identical element is accepted; prefixes and ranges may be in any component.
* Interval sets without concatenation (nft 1.0.6 checks these in userspace, against the
  kernel's elements and the batch so far): any overlap is refused ("conflicting
  intervals specified" within the batch, "interval overlaps with an existing one"
  against existing elements); adjacent intervals are fine and not merged; an identical
  interval is accepted; a prefix with host bits set is masked (``10.0.0.1/24`` is
  ``10.0.0.0/24``); a delete must name an interval exactly ("element does not exist").
  Deleting an interval earlier in the batch frees its space; a batch that deletes and
  re-adds an interval once (either order) is fine. nft and the kernel lose track in
  batches that churn one span more than that, or delete elements of a set they also
  flush: see :class:`_Churn` for the rules (found by random batches against the kernel).
* nft 1.0.6 cache quirks (userspace, but they decide what our scripts may do):
  ``add chain ... { rules }`` that refer to ``@set`` only see sets declared earlier in
  the same script, unless the batch also holds an operation that makes nft load the
  kernel's sets (``table {}``, ``add``/``delete element``, ``flush``/``delete`` set,
  ``delete chain``, ``delete table``; not ``add``/``flush table``, ``add``/``flush
  chain``, ``add set``): "No such file or directory". When nft does load the kernel's
  sets, a ``typeof`` map whose data mixes ``ip``/``ip6`` with ``th`` (``ip daddr . th
  dport``) and that existed before the batch cannot be used by a new rule: "conflicting
  protocols specified: ip vs. th" (declaring it again does not help; deleting and
  re-creating it in the batch does). And when a declarative block creates a set and the
  batch flushes it later, nft drops the elements declared with it unchecked (a clash or
  a jump to a missing chain among them passes).

Where the fake is deliberately stricter than the kernel (documented, and checked as
such by the kernel tests):

* Concatenated interval sets (the kernel's pipapo backend) refuse a new element only if
  its start or its end falls inside an existing element, so a superset of an element, or
  one crossing it (``1.2.3.0/24 . 80 . 12.0.0.0/8`` against ``1.2.3.4 . 80-90 .
  12.1.0.0/16``), is accepted; and they find the element to delete by its start, so
  ``delete element ... 10.0.0.0/16`` removes ``... 10.0.0.0/8``. The fake refuses every
  overlap and deletes only exact matches: overlapping elements match unpredictably, and
  deleting what was not added is a backend bug.
* ``add set`` with another ``timeout`` is accepted by the kernel, which keeps the old
  timeout; the fake refuses it, since the new timeout would silently not apply.

Not modelled: rule syntax and typing (rules are opaque text apart from their
``jump``/``goto``/``@`` references, so a rule using a set of the wrong type passes), jump
loops (the kernel refuses only loops reachable from a base chain), object names that are
nft keywords (``delete chain ip t missing`` is a syntax error, though ``check_name``
allows it), set size limits, elements the kernel adds at runtime (dynamic sets),
service names for ports, and the rarer ways the kernel's interval tree fails a batch that
adds and deletes several overlapping intervals of one set (random batches of such churn
find about one in 2,000 refused by the kernel and accepted by the fake; the backends
refill these sets by flushing and declaring them, which agrees).
"""

from __future__ import annotations

from collections.abc import Callable

from kubeproxy.dataplane.nftables.fake_batch import _Batch
from kubeproxy.dataplane.nftables.fake_state import (
    BaseSpec,
    FakeChain,
    FakeSet,
    FakeTable,
    TableKey,
)
from kubeproxy.dataplane.nftables.fake_types import (
    RuleRefs,
    SetType,
    _RefusedError,
    canonical_key,
    canonical_value,
    parse_priority,
    parse_set_type,
    rule_references,
)
from kubeproxy.dataplane.nftables.runner import NftError
from kubeproxy.dataplane.nftables.transaction import Operation, Transaction


class FakeNftables:
    """An :class:`~kubeproxy.dataplane.nftables.runner.NftRunner` with in-memory state.

    ``fail_next``: the next non-empty ``apply`` raises it (and changes nothing).
    ``refuse``: called with every non-empty transaction given to ``apply``/``check``; a
    returned message refuses it, as the kernel would.
    """

    def __init__(self) -> None:
        self.tables: dict[TableKey, FakeTable] = {}
        self.fail_next: NftError | None = None
        self.refuse: Callable[[Transaction], str | None] | None = None
        self.applied = 0  # transactions committed
        self.refused = 0  # transactions refused by apply (injected failures included)
        self.checked = 0  # check() calls that passed
        self.last_error: NftError | None = None

    def clone(self) -> FakeNftables:
        """An independent fake with the same state (cheap: state is copy-on-write)."""
        other = FakeNftables()
        other.tables = dict(self.tables)
        return other

    # NftRunner.

    def apply(self, tx: Transaction) -> None:
        if not tx:
            return  # as the real runners: nothing is sent
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            self._refuse(err)
        self.tables = self._run(tx, counting=True)
        self.applied += 1

    def check(self, tx: Transaction) -> None:
        if tx:
            self._run(tx, counting=False)
            self.checked += 1

    def list_tables(self) -> list[tuple[str, str]]:
        return sorted(self.tables)

    def has_table(self, family: str, table: str) -> bool:
        return (family, table) in self.tables

    def list_objects(self, family: str, table: str) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {"chain": set(), "set": set(), "map": set()}
        t = self.tables.get((family, table))
        if t is not None:
            found["chain"].update(t.chains)
            for s in t.sets.values():
                found[s.keyword].add(s.name)
        return found

    # Inspection.

    def dump(self) -> str:
        """The whole state as nft-like text: everything sorted, rules in order."""
        out: list[str] = []
        for key in sorted(self.tables):
            t = self.tables[key]
            out.append(f"table {t.family} {t.name} {{")
            if t.comment:
                out.append(f'\tcomment "{t.comment}"')
            for name in sorted(t.chains):
                c = t.chains[name]
                out.append(f"\tchain {name} {{")
                if c.comment:
                    out.append(f'\t\tcomment "{c.comment}"')
                if c.base is not None:
                    out.append(f"\t\t{c.base}")
                out.extend(f"\t\t{rule}" for rule in c.rules)
                out.append("\t}")
            for name in sorted(t.sets):
                s = t.sets[name]
                out.append(f"\t{s.keyword} {name} {{")
                out.extend(f"\t\t{line}" for line in s.header())
                if s.elements:
                    out.append("\t\telements = {")
                    for k in sorted(s.elements):
                        v = s.elements[k]
                        note = s.comments.get(k)
                        item = k if note is None else f'{k} comment "{note}"'
                        out.append(f"\t\t\t{item}" if v is None else f"\t\t\t{item} : {v}")
                    out.append("\t\t}")
                out.append("\t}")
            out.append("}")
        return "\n".join(out) + ("\n" if out else "")

    # Internals.

    def _run(self, tx: Transaction, *, counting: bool) -> dict[TableKey, FakeTable]:
        if self.refuse is not None:
            message = self.refuse(tx)
            if message is not None:
                self._refuse(NftError(message, str(tx)), counting)
        batch = _Batch(self.tables, tx)
        for batch.position, op in enumerate(tx.ops):
            try:
                batch.apply(op)
            except _RefusedError as err:
                self._refuse(NftError(f"nft: {err}\n{_describe(op)}", str(tx)), counting)
        return batch.tables

    def _refuse(self, err: NftError, counting: bool = True) -> None:
        if counting:
            self.refused += 1
        self.last_error = err
        raise err


def _describe(op: Operation) -> str:
    """The first line of the operation's script text, shortened."""
    out: list[str] = []
    op.render(out)
    line = out[0].splitlines()[0] if out else type(op).__name__
    return line if len(line) <= 200 else line[:197] + "..."


__all__ = [
    "BaseSpec",
    "FakeChain",
    "FakeNftables",
    "FakeSet",
    "FakeTable",
    "RuleRefs",
    "SetType",
    "canonical_key",
    "canonical_value",
    "parse_priority",
    "parse_set_type",
    "rule_references",
]
