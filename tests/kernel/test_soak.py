"""Churn soak (issue 12 part 4), short: :mod:`bench.soak` for 24 s at a small scale.

Endpoints and Services keep changing through the API stand-in; afterwards the node's
tables must equal a fresh full sync of the final objects (no leaked chain, set, map,
element or rule) and no UDP conntrack entry may point at a removed endpoint. The
10-minute run (`python -m bench.soak`) and its memory and latency figures are in
RELIABILITY.md.
"""

from __future__ import annotations

from bench.soak import soak


def test_churn_leaves_no_leaks() -> None:
    figures = soak(60, 10, 24.0, tick=3.0, turnover=3, say=lambda _: None)
    assert figures["leaks"] == []
    # The conntrack check saw entries: it is not vacuous.
    assert figures["udp_conntrack_entries"] > 0
    assert figures["sync_failures"] == 0
    assert figures["sync_seconds_logged"]["partial"]["count"] >= figures["ticks"] // 2
    # Every churned slice's trigger time reached the programming-latency metric.
    assert figures["network_programming_seconds"]["count"] > 0
