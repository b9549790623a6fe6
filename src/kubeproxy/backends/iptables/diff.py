"""A full sync's comparison with the kernel: which of the chains it wants differ from
what ``iptables-save`` lists.

A chain is the same when the kernel holds it with as many rules, each printing (after
``-A CHAIN``) what iptables-save prints for ours: the canonical form
(:func:`~kubeproxy.dataplane.iptables.rules.parse_rule`), which the caller supplies per
flavour. Every rule is parsed: the renderer writes upstream's argument order
(``-m comment ... -m tcp -p tcp -d 10.96.0.1 --dport 80``), never the canonical one
(``-d 10.96.0.1/32 -p tcp -m comment ... -m tcp --dport 80``), so comparing the written
words first would only cost a join per rule (measured: it never matched).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from kubeproxy.backends.iptables.dispatch import Args
from kubeproxy.dataplane.iptables.restore import quote

# Args -> what iptables-save prints for them; None if iptables would refuse them.
Canonical = Callable[[Args], str | None]


def rule_text(args: Args) -> str:
    """The arguments as a restore input (and a listing) writes them."""
    return " ".join(quote(a) for a in args)


def same_rules(wanted: Sequence[Args], listed: Sequence[str], canonical: Canonical) -> bool:
    return len(wanted) == len(listed) and all(
        canonical(args) == text for args, text in zip(wanted, listed, strict=True)
    )


def differing(
    wanted: Iterable[tuple[str, Sequence[Args]]],
    listed: Mapping[str, Sequence[str]],
    canonical: Canonical,
) -> set[str]:
    """The chains of ``wanted`` (chain, rules) missing from ``listed`` or holding other
    rules there."""
    out: set[str] = set()
    for chain, rules in wanted:
        have = listed.get(chain)
        if have is None or not same_rules(rules, have, canonical):
            out.add(chain)
    return out
