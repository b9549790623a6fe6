"""SIGKILL during syncs (issue 12 part 3): a few kills of :mod:`bench.crash` per mode.

Each kill: the restarted proxy's rules converge to exactly a fresh full sync's (in an
empty namespace), its log holds no traceback, and an established TCP connection through
a ClusterIP carries data while the proxy is dead and after (a cold start opens a new
one). The long run (`python -m bench.crash`, 100+ kills) is in RELIABILITY.md.
"""

from __future__ import annotations

import pytest
from bench.crash import crash

# Small clusters: nftables mode's full sync then fits in-process, so its kills are at
# random points; iptables mode aims at iptables-restore (kill the proxy, or the tool).
PLANS = {
    "nftables": [("restart", "random"), ("partial", "random")],
    "iptables-nft": [("cold", "proxy"), ("partial", "child")],
    "iptables-legacy": [("restart", "child")],
}


@pytest.mark.parametrize("mode", PLANS)
def test_a_killed_proxy_converges_and_keeps_connections(mode: str) -> None:
    kills = crash({mode: PLANS[mode]}, services=40, say=lambda _: None)
    assert [(k.kind, k.target) for k in kills] == PLANS[mode]
    assert all(k.outage_round_trips > 0 for k in kills if k.kind != "cold")
