"""The differential comparison's known differences (docs/differences-from-upstream.md)
match exactly what they document and nothing more."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kubeproxy.lab.kube.differential.compare import Difference, explain

CLEANUP = "fact: the other's cleanup"


@pytest.mark.parametrize(
    ("upstream", "ours", "known"),
    [
        # kube-proxy --cleanup destroys its sets by IPv4 names only.
        ("exit 1, left nothing", "exit 1, left ipset KUBE-6-CLUSTER-IP, ipset KUBE-6-LOOP-BACK",
         "ipv6-ipsets-outlive-upstream-cleanup"),
        # An IPv4 set left behind is not that.
        ("exit 1, left nothing", "exit 1, left ipset KUBE-CLUSTER-IP", None),
        # Nor is another exit status, or a rule left behind.
        ("exit 0, left nothing", "exit 1, left ipset KUBE-6-CLUSTER-IP", None),
        ("exit 1, left nothing", "exit 1, left ipset KUBE-6-CLUSTER-IP, legacy ip nat", None),
    ],
)  # fmt: skip
def test_ipvs_cleanup_leftovers(upstream: str, ours: str, known: str | None) -> None:
    assert explain(Difference("ipvs", CLEANUP, upstream, ours)).known == known


def test_the_ipv6_sets_are_known_in_ipvs_mode_only() -> None:
    diff = Difference("iptables", CLEANUP, "exit 0, left nothing", "exit 0, left ipset KUBE-6-X")
    assert explain(diff).known is None


def test_health_answers_are_compared_without_their_times() -> None:
    from kubeproxy.lab.kube.differential.proxies import health_answer

    headers = {"Content-Type": "application/json", "X-Content-Type-Options": "nosniff"}
    first = health_answer(
        200,
        headers,
        b'{"lastUpdated":"2026-12-07T23:00:00Z","currentTime":"2026-12-07T23:00:01Z",'
        b'"nodeEligible":true,"healthy":true,'
        b'"status":{"IPv4":{"lastUpdated":"2026-12-07T23:00:00Z","healthy":true}}}',
    )
    later = health_answer(
        200,
        headers,
        b'{"healthy":true,"currentTime":"2026-12-07T23:05:00Z","nodeEligible":true,'
        b'"status":{"IPv4":{"healthy":true,"lastUpdated":"2026-12-07T23:04:00Z"}},'
        b'"lastUpdated":"2026-12-07T23:04:00Z"}',
    )
    assert first == later
    assert first == (
        '200 (application/json; nosniff) {"currentTime":"T","healthy":true,'
        '"lastUpdated":"T","nodeEligible":true,"status":{"IPv4":{"healthy":true,'
        '"lastUpdated":"T"}}}'
    )
    # A missing field, another status, or a body that is not JSON all show.
    assert health_answer(503, headers, b'{"healthy":true}') != first
    assert "b'ok'" in health_answer(200, {}, b"ok")


def test_a_new_service_cidrs_free_address_dropped_at_once_is_known() -> None:
    where = "s506002 -: unallocated TCP [fd00:10:97:2::fa]:80 from node after {}"
    seen = Difference(
        "nftables", where.format("a ServiceCIDR added"), "ENETUNREACH x35", "timeout x19"
    )
    assert explain(seen).known == "new-service-cidr-dropped-at-once"
    # Not in another mode, not at the start, not when kubeproxy does anything but drop.
    assert explain(replace(seen, mode="iptables")).known is None
    assert explain(replace(seen, where=where.format("start"))).known is None
    assert explain(replace(seen, ours="ENETUNREACH x3 timeout x2")).known is None
    assert explain(replace(seen, upstream="timeout x3 refused x1")).known is None
