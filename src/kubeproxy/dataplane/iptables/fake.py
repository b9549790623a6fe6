"""A strict in-memory iptables: applies restore inputs table by table, all or nothing per
table, refusing what iptables 1.8.9 (nft and legacy flavours) and the kernel refuse, so
backends can be tested without root.

:class:`FakeIptables` implements :class:`~kubeproxy.dataplane.iptables.runner.Iptables`
for one IP family. Rules are parsed by :mod:`kubeproxy.dataplane.iptables.rules`, which
also gives their canonical text, so ``save()`` prints what ``iptables-save`` prints and
``ensure_rule``/``delete_rule`` compare rules as iptables does.

Map of the module:

* **State** -- :class:`FakeTable` (``chains``, and ``refs``: how many rules jump to each
  chain) and :class:`FakeChain` (``rules``: argument tuples as given; ``parsed``: the
  same rules parsed), readable by tests as
  ``fake.tables["nat"].chains["KUBE-SERVICES"].rules``. Treat them as read-only:
  committed tables and chains are shared with clones and never changed in place.
* **Batches** -- :class:`_TableBatch` applies one table's part of a restore input (or one
  ``ensure_rule``) to a copy of the table, in the order ``iptables-restore`` reads the
  printed input (chain lines, rules, ``-X`` lines), checks what the kernel checks (the
  whole table at ``COMMIT`` for legacy; the paths through each new rule for nft, as its
  kernel does), and is dropped if anything is refused. Errors carry the line iptables
  reports, which differs between the flavours.
* **Runner** -- :class:`FakeIptables`: the interface, ``dump()`` (deterministic text of
  every table in use), counters, ``clone()``, fault injection (``fail_next``,
  ``refuse``) and ``flush_all()`` (what a firewall reload does to the tables).

Facts this models, verified with iptables 1.8.9 (nf_tables and legacy) on kernel 6.18 in
scratch network namespaces; both flavours and both families unless one is named
(``tests/kernel/test_iptables_fake_vs_kernel.py`` re-checks each case of
``tests/iptables_fake_cases.py`` against both flavours, including the line each refusal
is reported at):

* Every table of an input is committed at its ``COMMIT``. A refused table is left
  exactly as it was, but the tables before it in the same input stay committed and the
  tables after it are not attempted.
* With ``--noflush`` only the chains the input names are touched. ``:CHAIN - [0:0]``
  creates a user chain, or flushes it if it exists (also twice in one input: the second
  line flushes what was added in between). ``:BUILTIN`` flushes nothing.
* ``-A CHAIN`` needs the chain to exist at that line (a chain declared further down does
  not help). ``-j CHAIN`` needs the chain to exist (declared further down does not help
  either): legacy refuses at the rule's line ("Couldn't load target"), nft at the
  ``COMMIT`` line ("Chain 'X' does not exist"), after any later line it cannot parse.
  ``-j`` to a builtin chain is refused at the rule's line.
* ``-X CHAIN`` is refused at its line for a builtin chain, a missing chain, a chain
  holding rules (so a chain not declared, hence not flushed, in the input), and a chain
  any rule still jumps to after the input's earlier lines (rules in chains the input
  flushed no longer count; a chain declared and deleted by one input is fine).
* Chain names: at most 28 characters; ``ACCEPT``, ``DROP``, ``QUEUE``, ``RETURN`` are
  refused ("File exists"). Listings sort user chains by byte value.
* The kernel refuses: a jump loop reachable from a builtin chain (an unreachable one is
  fine); a target outside its table, reachable or not (``DNAT``/``MASQUERADE`` only in
  ``nat``, ``REJECT`` only in ``filter``; ``MARK`` anywhere); a target reachable from a
  builtin chain it may not run from (``DNAT`` from PREROUTING/OUTPUT only,
  ``MASQUERADE`` from POSTROUTING only); ``REJECT --reject-with tcp-reset`` without
  ``-p tcp``; ``recent --seconds`` with ``--set``/``--remove``; ``addrtype`` types IPv6
  lacks (BROADCAST...); an ``nfacct`` counter that does not exist; a kernel
  ``tcp``/``udp``/``sctp`` match whose rule's ``-p`` is not that protocol, or negated.
  Legacy reports all of these at the ``COMMIT`` line;
  nft at the line of the first rule after which the table is invalid (its kernel
  validates the table after each rule of the batch), so a loop or a misplaced target
  is blamed on the rule that links it to a builtin chain, or on the rule added to an
  already reachable chain.
* nft only: user chains more than 15 jumps below a builtin chain are refused ("Too many
  links", NFT_JUMP_STACK_SIZE; legacy has no limit); ``! -s 0.0.0.0/0`` (or ``::/0``) is
  refused (legacy prints it back). iptables-nft writes tcp/udp ports of a rule whose
  ``-p`` names that protocol (negated or not) as its own expressions, so there is no
  kernel match to check the protocol (``! -p tcp --dport 8`` is accepted, legacy
  refuses it), and reads them back as one match: ``-m tcp --dport 80 -m tcp --sport 5``
  is saved as ``-m tcp --sport 5 --dport 80`` (later values win). sctp stays separate.
* iptables refuses while parsing, at the line: ``-i`` in OUTPUT/POSTROUTING and ``-o``
  in PREROUTING/INPUT (by chain name), addresses of the other family (also in
  ``DNAT``), masks over 32/128, a port on ``DNAT``/``MASQUERADE`` without ``-p
  tcp|udp|sctp|dccp``, ``multiport`` without such a ``-p``, with more than 15 ports (a
  range counts twice) or a range ``a:b`` with a >= b, missing required options
  (``--probability``, ``--mode``, ``--to-destination``, one ``recent`` mode, one ``MARK``
  operation...), unknown options, matches and reject types (``icmp-*`` types are
  IPv4's, ``icmp6-*`` IPv6's), port options without ``-p``.
* Canonical forms (what ``iptables-save`` prints, and what ``-C``/``-D`` compare): ``-s
  -d -i -o -p`` first in that order, then matches in the order given (a ``-p``
  protocol's match where its first option is), then the target; ``/32`` (``/128``)
  added, host bits cleared, ``-d 0.0.0.0/0`` dropped; ``MARK`` in every spelling as
  ``--set-xmark value/mask``; probabilities as the kernel's 31-bit fraction
  (``0.1`` is ``0.10000000009``); comments quoted unless plain; conntrack states and
  address types in the kernel's order; ``recent`` with its defaults spelled out.
* ``-C``/``-D`` compare canonical forms: ``--or-mark 0x4000`` finds ``--set-xmark
  0x4000/0x4000``, and a rule differing only in its comment is another rule. ``-D`` of a
  missing rule, in a missing chain, or jumping to a missing chain fails with "not found"
  (``delete_rule`` returns False); ``-N`` of an existing chain fails ("Chain already
  exists": ``ensure_chain`` returns True).
* Outside the model the flavours differ too: only legacy takes the xtables lock
  (``-w``); legacy replaces a whole table on every commit (a small change to a big table
  costs as much as the table); listing a legacy table creates it.

Where the fake is deliberately stricter (documented; the kernel tests check that the
real thing does accept these, so each note stays true):

* A chain line for a builtin chain is refused: under ``--noflush`` it neither flushes the
  chain nor does anything else, so writing one is a bug.
* Chain names outside ``[A-Za-z0-9_][A-Za-z0-9_.-]*`` and names of the target
  extensions modelled here (``DNAT``, ``MARK``... would shadow the target) are refused.
* Rules: host names, address lists (``-d a,b`` would become two rules), dotted masks,
  port service names, abbreviated option names, and comments over 255 characters
  (iptables truncates them) are refused; so is anything outside the modelled language
  (see :mod:`kubeproxy.dataplane.iptables.rules`).

Not modelled: policies (all ACCEPT; restore inputs cannot change them here), counters,
the raw table's specifics, ``-I`` positions other than 1, concurrent writers (the xtables
lock, legacy's stale-table retry), and rules other tools wrote in syntax this fake does
not know.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from kubeproxy.dataplane.iptables.listing import parse_save
from kubeproxy.dataplane.iptables.restore import (
    BUILTIN_CHAINS,
    TABLES,
    Restore,
    RestoreError,
    TableInput,
    check_chain,
)
from kubeproxy.dataplane.iptables.rule_targets import RESERVED_CHAIN_NAMES
from kubeproxy.dataplane.iptables.rules import ParsedRule, RuleError, parse_rule
from kubeproxy.dataplane.iptables.runner import Flavor, IptablesError, version_tuple
from kubeproxy.model.types import IPFamily

T = TypeVar("T")

CHAIN_NAME_MAX = 28
# nf_tables' NFT_JUMP_STACK_SIZE: user chains may be at most 15 jumps below a builtin.
NFT_MAX_DEPTH = 15
_IN_NOT_ALLOWED = frozenset({"OUTPUT", "POSTROUTING"})
_OUT_NOT_ALLOWED = frozenset({"PREROUTING", "INPUT"})


class _RefusedError(Exception):
    """One line refused; ``line`` None for single commands (no input)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


# --------------------------------------------------------------------------- state


@dataclass
class FakeChain:
    name: str
    policy: str | None  # "ACCEPT" for builtin chains, None for user chains
    rules: list[tuple[str, ...]] = field(default_factory=list)
    parsed: list[ParsedRule] = field(default_factory=list)

    @property
    def builtin(self) -> bool:
        return self.policy is not None

    def copy(self) -> FakeChain:
        return FakeChain(self.name, self.policy, list(self.rules), list(self.parsed))


@dataclass
class FakeTable:
    name: str
    chains: dict[str, FakeChain]
    refs: Counter[str] = field(default_factory=Counter)  # rules jumping to each chain

    @classmethod
    def empty(cls, name: str) -> FakeTable:
        return cls(name, {c: FakeChain(c, "ACCEPT") for c in BUILTIN_CHAINS[name]})

    @property
    def in_use(self) -> bool:
        """Whether it holds anything besides empty builtin chains."""
        return any(not c.builtin or c.rules for c in self.chains.values())

    def ordered(self) -> Iterator[FakeChain]:
        """Builtin chains in their fixed order, then user chains by byte value (as
        iptables-save lists them)."""
        for name in BUILTIN_CHAINS[self.name]:
            yield self.chains[name]
        for name in sorted(c for c, chain in self.chains.items() if not chain.builtin):
            yield self.chains[name]

    def save(self) -> str:
        chains = list(self.ordered())
        out = [f"*{self.name}"]
        out.extend(f":{c.name} {c.policy or '-'} [0:0]" for c in chains)
        for c in chains:
            out.extend(f"-A {c.name} {p.text}" if p.text else f"-A {c.name}" for p in c.parsed)
        out.append("COMMIT")
        return "\n".join(out) + "\n"


# ------------------------------------------------------------------------- batches


class _TableBatch:
    """Changes to one table, applied to a copy; ``table`` is the result.

    Errors iptables finds while reading a line raise at once. What is found later waits
    for :meth:`commit`: in the legacy flavour the kernel's checks (reported at the
    ``COMMIT`` line); in the nft flavour jumps to chains that do not exist (reported at
    ``COMMIT``: iptables-nft resolves them when it builds the batch) and the kernel's
    checks, reported at the line of the first rule the kernel refuses. The nft kernel
    validates the table after every rule it adds (:meth:`_nft_validate`), so that rule
    is the first one after which some path from a builtin chain loops, runs deeper than
    :data:`NFT_MAX_DEPTH` chains, or reaches a target from a chain it may not run from.
    """

    def __init__(self, fake: FakeIptables, table: FakeTable) -> None:
        self.fake = fake
        self.nft = fake.flavor == "nft"
        self.table = FakeTable(table.name, dict(table.chains), Counter(table.refs))
        self.owned: set[str] = set()  # chains copied by this batch (safe to change)
        self.kernel_errors: list[tuple[int | None, str]] = []  # (line, why), in order
        self.missing: list[str] = []  # nft: jumps to chains that do not exist
        # nft: the builtin chains each reachable chain is reached from, and its deepest
        # level (builtin chains are level 0); computed on the first rule added.
        self.hooks: dict[str, set[str]] | None = None
        self.level: dict[str, int] = {}

    def _writable(self, name: str) -> FakeChain:
        chain = self.table.chains[name]
        if name not in self.owned:
            chain = self.table.chains[name] = chain.copy()
            self.owned.add(name)
        return chain

    def _release(self, chain: FakeChain) -> None:
        for p in chain.parsed:
            if p.jump is not None:
                self.table.refs[p.jump] -= 1

    def check_name(self, name: str) -> None:
        if len(name) > CHAIN_NAME_MAX:
            raise _RefusedError(f"Invalid chain name `{name}' ({CHAIN_NAME_MAX} chars max)")
        if name in ("ACCEPT", "DROP", "QUEUE", "RETURN"):
            raise _RefusedError(f"error creating chain '{name}':File exists")
        if name in RESERVED_CHAIN_NAMES:
            raise _RefusedError(f"chain {name} would shadow the {name} target (fake: refused)")
        try:
            check_chain(name)
        except RestoreError:
            raise _RefusedError(f"chain name {name!r} is not modelled (fake: refused)") from None

    def declare(self, name: str) -> None:
        """``:NAME - [0:0]``: create, or flush if it exists."""
        existing = self.table.chains.get(name)
        if existing is not None and existing.builtin:
            raise _RefusedError(
                f":{name} names a builtin chain, which --noflush neither flushes nor "
                "changes (fake: refused)"
            )
        self.check_name(name)
        if existing is not None:
            self._release(existing)
        self.table.chains[name] = FakeChain(name, None)
        self.owned.add(name)

    def parse(self, chain: str, args: Sequence[str]) -> ParsedRule:
        try:
            parsed = parse_rule(
                args, self.fake.family, nft=self.nft, random_fully=self.fake.has_random_fully
            )
        except RuleError as err:
            raise _RefusedError(str(err)) from None
        if parsed.in_iface and chain in _IN_NOT_ALLOWED:
            raise _RefusedError(f"Can't use -i with {chain}")
        if parsed.out_iface and chain in _OUT_NOT_ALLOWED:
            raise _RefusedError(f"Can't use -o with {chain}")
        return parsed

    def add_rule(
        self, chain: str, args: Sequence[str], *, line: int | None = None, prepend: bool = False
    ) -> None:
        if chain not in self.table.chains:
            raise _RefusedError(f"chain {chain} does not exist (declare it first)")
        parsed = self.parse(chain, args)
        jump = parsed.jump
        if jump is not None:
            target = self.table.chains.get(jump)
            if target is None:
                if not self.nft:
                    raise _RefusedError(
                        f"Couldn't load target `{jump}':No such file or directory "
                        f"(jump to missing chain {jump})"
                    )
                self.missing.append(jump)
                jump = None  # nothing to validate or count: the batch fails anyway
            elif target.builtin:
                raise _RefusedError(f"cannot jump to builtin chain {jump}")
        problems = list(parsed.kernel_errors)
        if parsed.table is not None and parsed.table != self.table.name:
            problems.insert(0, f"{parsed.target} is only valid in the {parsed.table} table")
        if parsed.nfacct is not None and parsed.nfacct not in self.fake.nfacct_counters:
            problems.append(f"nfacct counter {parsed.nfacct!r} does not exist")
        for problem in problems:
            self.kernel_errors.append((line, problem))
        c = self._writable(chain)
        if prepend:
            c.rules.insert(0, tuple(args))
            c.parsed.insert(0, parsed)
        else:
            c.rules.append(tuple(args))
            c.parsed.append(parsed)
        if jump is not None:
            self.table.refs[jump] += 1
        if self.nft and not self.kernel_errors and not self.missing:
            try:
                self._nft_validate(chain, parsed, jump)
            except _RefusedError as err:
                self.kernel_errors.append((line, str(err)))

    def delete_chain(self, name: str) -> None:
        """``-X NAME``."""
        chain = self.table.chains.get(name)
        if chain is None:
            raise _RefusedError(f"chain {name} does not exist")
        if chain.builtin:
            raise _RefusedError(f"cannot delete builtin chain {name}")
        if chain.rules:
            raise _RefusedError(f"chain {name} is not empty ({len(chain.rules)} rules)")
        if self.table.refs[name] > 0:
            raise _RefusedError(f"chain {name} is still jumped to by {self.table.refs[name]} rules")
        del self.table.chains[name]
        del self.table.refs[name]
        if self.hooks is not None:
            self.hooks.pop(name, None)
            self.level.pop(name, None)

    def delete_rule(self, chain: str, args: Sequence[str]) -> bool:
        c = self.table.chains.get(chain)
        if c is None:
            return False
        try:
            parsed = self.parse(chain, args)
        except _RefusedError as err:
            if str(err).startswith("Couldn't load"):
                return False  # iptables' "No such file or directory": not found
            raise
        for i, p in enumerate(c.parsed):
            if p.text == parsed.text:
                w = self._writable(chain)
                del w.rules[i], w.parsed[i]
                if p.jump is not None:
                    self.table.refs[p.jump] -= 1
                return True
        return False

    def find(self, chain: str, args: Sequence[str]) -> bool:
        """Whether an equal rule exists (``-C``); the chain must exist."""
        c = self.table.chains.get(chain)
        if c is None:
            raise _RefusedError(f"Chain '{chain}' does not exist")
        parsed = self.parse(chain, args)
        if parsed.jump is not None and parsed.jump not in self.table.chains:
            raise _RefusedError(
                f"Couldn't load target `{parsed.jump}':No such file or directory "
                f"(jump to missing chain {parsed.jump})"
            )
        return any(p.text == parsed.text for p in c.parsed)

    def commit(self, line: int | None = None) -> None:
        """What is checked when the table is committed (``line``: the COMMIT line)."""
        if self.nft:
            if self.missing:
                name = self.missing[0]
                raise _RefusedError(
                    f"Chain '{name}' does not exist (jump to missing chain {name})", line
                )
            if self.kernel_errors:
                at, why = self.kernel_errors[0]
                raise _RefusedError(f"RULE_APPEND failed: {why}", at)
            return
        if self.kernel_errors:
            raise _RefusedError(self.kernel_errors[0][1], line)
        try:
            self._legacy_validate()
        except _RefusedError as err:
            raise _RefusedError(str(err), line) from None

    # Validation of the paths from builtin chains.

    def _legacy_validate(self) -> None:
        """The legacy kernel checks the whole table when it is replaced: loops reachable
        from a builtin chain, and each target against the builtin chains reaching it."""
        chains = self.table.chains
        edges = {
            name: sorted({p.jump for p in c.parsed if p.jump is not None})
            for name, c in chains.items()
        }
        reach: dict[str, set[str]] = {}
        for hook in BUILTIN_CHAINS[self.table.name]:
            # Depth-first, iteratively: chains on the current path are "open".
            reach.setdefault(hook, set()).add(hook)
            stack: list[tuple[str, Iterator[str]]] = [(hook, iter(edges[hook]))]
            open_ = {hook}
            seen = {hook}
            while stack:
                node, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    stack.pop()
                    open_.discard(node)
                    continue
                if nxt in open_:
                    raise _RefusedError(f"jump loop through chain {nxt}, reachable from {hook}")
                reach.setdefault(nxt, set()).add(hook)
                if nxt not in seen:
                    seen.add(nxt)
                    open_.add(nxt)
                    stack.append((nxt, iter(edges[nxt])))
        for name, hooks in reach.items():
            for p in chains[name].parsed:
                _check_hooks(name, p, hooks)

    def _nft_validate(self, chain: str, rule: ParsedRule, jump: str | None) -> None:
        """The nft kernel's validation after adding ``rule`` to ``chain``: only paths
        through the new rule are new, so only they are walked."""
        if self.hooks is None:
            self.hooks, self.level = {}, {}
            for hook in BUILTIN_CHAINS[self.table.name]:
                self._nft_walk(hook, 0, {hook})
        hooks = self.hooks.get(chain)
        if hooks is None:
            return  # not reachable from a builtin chain: not validated
        _check_hooks(chain, rule, hooks)
        if jump is not None:
            self._nft_walk(jump, self.level[chain] + 1, set(hooks))

    def _nft_walk(self, name: str, level: int, hooks: set[str]) -> None:
        assert self.hooks is not None
        if level > NFT_MAX_DEPTH:
            # A loop is a path of unbounded depth: the same error.
            raise _RefusedError(
                f"Too many links: chain {name} is more than {NFT_MAX_DEPTH} jumps from a "
                "builtin chain (or in a loop)"
            )
        known = self.hooks.get(name)
        if known is not None and hooks <= known and self.level[name] >= level:
            return  # validated already, at least as deep and from these chains
        merged = self.hooks[name] = (known or set()) | hooks
        self.level[name] = max(self.level.get(name, 0), level)
        for p in self.table.chains[name].parsed:
            _check_hooks(name, p, merged)
            if p.jump is not None:
                self._nft_walk(p.jump, level + 1, hooks)


def _check_hooks(chain: str, rule: ParsedRule, hooks: set[str] | frozenset[str]) -> None:
    if rule.hooks is not None and not hooks <= rule.hooks:
        bad = ", ".join(sorted(hooks - rule.hooks))
        raise _RefusedError(
            f"Invalid argument: {rule.target} in chain {chain} is reached from {bad}, "
            "where it is not allowed"
        )


# ---------------------------------------------------------------------------- runner


class FakeIptables:
    """An :class:`~kubeproxy.dataplane.iptables.runner.Iptables` with in-memory state.

    ``flavor`` picks the behaviour where the flavours differ (see the module
    docstring); ``version`` is what it reports; ``has_random_fully=False`` makes
    ``MASQUERADE --random-fully`` an unknown option, as on iptables before 1.6.2.
    ``unavailable``: what ``available()`` reports; ``broken``: what ``works()`` reports
    (a kernel this flavour cannot program).

    ``fail_next``: the next non-empty ``restore`` raises it (and changes nothing).
    ``refuse``: called with each table's name and part of every restore input, in order;
    a returned message refuses that table (the earlier ones stay committed), as the
    kernel would.
    """

    def __init__(
        self,
        family: IPFamily = IPFamily.IPv4,
        flavor: Flavor = "nft",
        *,
        version: str = "1.8.9",
        has_random_fully: bool | None = None,
        unavailable: str | None = None,
        broken: str | None = None,
    ) -> None:
        self._family = family
        self._flavor: Flavor = flavor
        self._version = version
        self._random_fully = (
            version_tuple(version) >= (1, 6, 2) if has_random_fully is None else has_random_fully
        )
        self.unavailable = unavailable
        self.broken = broken
        self.tables: dict[str, FakeTable] = {name: FakeTable.empty(name) for name in TABLES}
        self.fail_next: IptablesError | None = None
        self.refuse: Callable[[str, TableInput], str | None] | None = None
        self.restores = 0  # restore calls fully committed
        self.refused = 0  # restore calls refused (injected failures included)
        self.calls: Counter[str] = Counter()  # every interface call, by method name
        self.last_error: IptablesError | None = None
        # The nfacct counters that exist (a FakeNfacct's ``counters`` can be shared).
        self.nfacct_counters: Container[str] = ()

    def clone(self) -> FakeIptables:
        """An independent fake with the same state (cheap: state is copy-on-write)."""
        other = FakeIptables(
            self._family,
            self._flavor,
            version=self._version,
            has_random_fully=self._random_fully,
            unavailable=self.unavailable,
            broken=self.broken,
        )
        other.tables = dict(self.tables)
        other.nfacct_counters = self.nfacct_counters
        return other

    # Iptables.

    @property
    def family(self) -> IPFamily:
        return self._family

    @property
    def flavor(self) -> Flavor:
        return self._flavor

    @property
    def version(self) -> str:
        return self._version

    @property
    def has_random_fully(self) -> bool:
        return self._random_fully

    @property
    def _program(self) -> str:
        return "ip6tables" if self._family is IPFamily.IPv6 else "iptables"

    def available(self) -> str | None:
        self.calls["available"] += 1
        return self.unavailable

    def works(self) -> str | None:
        self.calls["works"] += 1
        return self.unavailable or self.broken

    def restore(self, data: Restore) -> None:
        self.calls["restore"] += 1
        if not data:
            return  # as the real runner: nothing is run
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            self._refuse(err)
        committed: list[str] = []
        line = 0
        for name, part in data:
            line += 1  # *table
            start = line
            line += part.list_first  # -S: lists, changes nothing
            try:
                batch = _TableBatch(self, self.tables[name])
                if self.refuse is not None:
                    message = self.refuse(name, part)
                    if message is not None:
                        raise _RefusedError(message, start)
                for chain in dict.fromkeys(part.chains):
                    line += 1
                    batch.declare(chain)
                for chain, args in part.all_rules():
                    line += 1
                    batch.add_rule(chain, args, line=line)
                for chain in part.deletes:
                    line += 1
                    batch.delete_chain(chain)
                line += 1  # COMMIT
                batch.commit(line)
            except _RefusedError as err:
                at = err.line if err.line is not None else line
                self._refuse(
                    IptablesError(
                        f"{self._program}-restore: line {at} failed: {err} (table {name}"
                        + (f"; {', '.join(committed)} committed)" if committed else ")"),
                        str(data),
                        line=at,
                        table=name,
                        committed=tuple(committed),
                    )
                )
            self.tables[name] = batch.table
            committed.append(name)
        self.restores += 1

    def save(self, table: str) -> str:
        self.calls["save"] += 1
        return self._table(table).save()

    def chains(self, table: str) -> set[str]:
        self.calls["chains"] += 1
        return set(self._table(table).chains)

    def rules(self, table: str, chains: set[str]) -> dict[str, list[str]]:
        self.calls["rules"] += 1
        return parse_save(self._table(table).save())

    def chain_exists(self, table: str, chain: str) -> bool:
        self.calls["chain_exists"] += 1
        return chain in self._table(table).chains

    def ensure_chain(self, table: str, chain: str) -> bool:
        self.calls["ensure_chain"] += 1
        t = self._table(table)
        if chain in t.chains:
            return True
        batch = _TableBatch(self, t)
        self._single(batch, f"-N {chain}", lambda: batch.declare(chain))
        return False

    def ensure_rule(
        self, table: str, chain: str, args: Sequence[str], *, prepend: bool = True
    ) -> bool:
        self.calls["ensure_rule"] += 1
        batch = _TableBatch(self, self._table(table))
        joined = " ".join(args)
        if self._single(batch, f"-C {chain} {joined}", lambda: batch.find(chain, args), False):
            return True

        def insert() -> None:
            batch.add_rule(chain, args, prepend=prepend)
            batch.commit()

        self._single(batch, f"-{'I' if prepend else 'A'} {chain} {joined}", insert)
        return False

    def delete_rule(self, table: str, chain: str, args: Sequence[str]) -> bool:
        self.calls["delete_rule"] += 1
        batch = _TableBatch(self, self._table(table))
        return self._single(
            batch, f"-D {chain} {' '.join(args)}", lambda: batch.delete_rule(chain, args)
        )

    # Inspection and scenarios.

    def dump(self) -> str:
        """Every table in use (holding more than empty builtin chains), as iptables-save
        prints it without counters, in a fixed table order."""
        return "".join(t.save() for t in (self.tables[n] for n in TABLES) if t.in_use)

    def flush_all(self) -> None:
        """Flush every chain and delete every user chain of every table, as a firewall
        reload (or ``iptables -F; iptables -X``) does behind kube-proxy's back."""
        self.tables = {name: FakeTable.empty(name) for name in TABLES}

    # Internals.

    def _table(self, name: str) -> FakeTable:
        t = self.tables.get(name)
        if t is None:
            raise IptablesError(
                f"{self._program}: can't initialize {self._program} table `{name}': "
                "Table does not exist"
            )
        return t

    def _single(
        self, batch: _TableBatch, command: str, action: Callable[[], T], commit: bool = True
    ) -> T:
        """One iptables command: all or nothing (``commit=False``: a read)."""
        try:
            result = action()
        except _RefusedError as err:
            name = batch.table.name
            error = IptablesError(f"{self._program} -t {name} {command}: {err}", command)
            self.last_error = error
            raise error from None
        if commit:
            self.tables[batch.table.name] = batch.table
        return result

    def _refuse(self, err: IptablesError) -> None:
        self.refused += 1
        self.last_error = err
        raise err


__all__ = ["FakeChain", "FakeIptables", "FakeTable"]
