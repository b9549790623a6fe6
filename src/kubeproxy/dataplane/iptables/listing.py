"""``iptables-save -t TABLE`` (or ``iptables -S``) output read back: each chain's
rules, as the text iptables-save prints after ``-A CHAIN`` (the canonical form
:func:`~kubeproxy.dataplane.iptables.rules.parse_rule` computes), in order.

A full sync compares these with the chains it wants (:mod:`kubeproxy.backends.iptables.diff`)
and rewrites only those that differ.
"""

from __future__ import annotations

from kubeproxy.dataplane.errors import DataplaneError

# iptables-nft-save's line for a table holding rules it cannot express as iptables rules
# (something else wrote them with nft): its rules cannot be compared.
_INCOMPATIBLE = "# Table `"


class UnreadableTableError(DataplaneError, ValueError):
    """iptables-save could not list the table's rules as iptables rules.

    Also a ValueError, as it always was: it is raised while parsing the listing.
    """

    tool = "iptables-save"


def parse_save(text: str) -> dict[str, list[str]]:
    """Every chain of the (single) table in ``text``, builtin ones included, with the text
    of its rules after ``-A CHAIN``; counters, comments and ``COMMIT`` are ignored.
    Chains are declared by ``:CHAIN POLICY [p:b]`` lines (iptables-save) or by ``-N
    CHAIN`` / ``-P CHAIN POLICY`` lines (``-S``)."""
    chains: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("-A "):
            chain, _, rule = line[3:].partition(" ")
            rules = chains.get(chain)
            if rules is None:
                raise UnreadableTableError(f"rule of undeclared chain {chain!r}: {line!r}")
            rules.append(rule)
        elif line.startswith(":"):
            chains.setdefault(line[1:].split(" ", 1)[0], [])
        elif line.startswith(("-N ", "-P ")):
            chains.setdefault(line[3:].split(" ", 1)[0], [])
        elif line.startswith(_INCOMPATIBLE) and "incompatible" in line:
            raise UnreadableTableError(line[2:])
    return chains
