"""Removing a proxy mode's iptables chains, as upstream's ``CleanupLeftovers`` does.

:func:`cleanup_chains` lists each table's chains, deletes the jump rules the mode put
into builtin chains (each copy of each, when the chain it jumps to exists), then flushes
and deletes, in one ``iptables-restore`` per table, every chain of ``filter``, ``nat``
and ``mangle`` that the caller recognises as its own. The caller (a backend) knows the
names: upstream's fixed chains and ``KUBE-SVC-``/``KUBE-SEP-``... prefixes.

One table failing does not stop the others: the error, raised at the end, lists every
failure and what was removed anyway. A table's restore fails as a whole when some chain
that is not ours still jumps to one of ours (iptables refuses to delete a chain in use):
as upstream, such a rule is left alone rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kubeproxy.dataplane.iptables.restore import BUILTIN_CHAINS, Restore
from kubeproxy.dataplane.iptables.runner import Iptables, IptablesError
from kubeproxy.model.types import IPFamily

CLEANUP_TABLES = ("filter", "nat", "mangle")
# A jump rule duplicated (say, by two kube-proxies racing) must go entirely, or the chain
# it jumps to cannot be deleted; bounded so a misbehaving runner cannot spin forever.
MAX_COPIES = 100


class CleanupError(IptablesError):
    """Some of the cleanup failed; ``removed`` is what was removed nonetheless."""

    def __init__(self, errors: list[str], removed: list[str]) -> None:
        super().__init__("iptables cleanup failed: " + "; ".join(errors))
        self.errors = errors
        self.removed = removed


Jump = tuple[str, str, tuple[str, ...]]  # (table, builtin chain, rule arguments)


@dataclass(frozen=True)
class Keep:
    """Chains ((table, chain)) and jumps the running proxy mode owns in one iptables
    flavour and family, which a cleanup of another mode must leave."""

    chains: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    jumps: frozenset[Jump] = field(default_factory=frozenset)


NOTHING = Keep()
# What the running mode keeps, per iptables flavour ("nft"/"legacy") and IP family.
KeepMap = Mapping[tuple[str, IPFamily], Keep]


def cleanup_chains(
    ipt: Iptables,
    is_ours: Callable[[str], bool],
    jumps: Iterable[tuple[str, str, Sequence[str]]],
    keep: Keep = NOTHING,
) -> list[str]:
    """Remove ``jumps`` ((table, chain, rule arguments)) and every chain ``is_ours``
    recognises, but what ``keep`` names; returns what was removed (``rule TABLE CHAIN
    ARGS...`` and ``chain TABLE CHAIN``), or raises :class:`CleanupError` after trying
    everything."""
    removed: list[str] = []
    errors: list[str] = []
    present: dict[str, set[str]] = {}
    for table in CLEANUP_TABLES:
        try:
            present[table] = ipt.chains(table)
        except IptablesError as err:
            errors.append(str(err))
    for table, chain, args in jumps:
        if (table, chain, tuple(args)) in keep.jumps:
            continue
        # A rule can only jump to a chain that exists: most cleanups find none of the
        # mode's chains, and skip one iptables process per jump (per flavour, family).
        target = args[args.index("-j") + 1] if "-j" in args else None
        if table in present and target is not None and target not in present[table]:
            continue
        try:
            for _ in range(MAX_COPIES):
                if not ipt.delete_rule(table, chain, args):
                    break
                removed.append(f"rule {table} {chain} {' '.join(args)}")
        except IptablesError as err:
            errors.append(str(err))
    for table in CLEANUP_TABLES:
        if table not in present:
            continue
        ours = sorted(
            c
            for c in present[table]
            if c not in BUILTIN_CHAINS[table] and is_ours(c) and (table, c) not in keep.chains
        )
        if not ours:
            continue
        data = Restore()
        for chain in ours:
            data.delete(table, chain)
        try:
            ipt.restore(data)
        except IptablesError as err:
            errors.append(str(err))
            continue
        removed.extend(f"chain {table} {chain}" for chain in ours)
    if errors:
        raise CleanupError(errors, removed)
    return removed
