"""Two records of the same probes, upstream's and kubeproxy's: where they differ.

A probe's outcome is the *set* of what its asks gave (which Pods answered, each with the
source address it saw; refused; timeout...), never the counts: endpoints are chosen at
random. Counts are compared only loosely (:func:`distribution_differs`: two records of
the same probe with many answers each should not look like different distributions).
For session affinity the ``... sticky`` pseudo-probe holds how many distinct Pods
answered asks in a row.

Differences upstream shows and kubeproxy does on purpose are listed in
:data:`KNOWN` (each with its id in docs/differences-from-upstream.md, and the test that
pins it); :func:`explain` tags a difference with the id that accounts for it.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kubeproxy.backends.iptables.names import DISPATCH_PREFIX

Record = Mapping[str, Counter[str]]


@dataclass(frozen=True)
class Difference:
    mode: str
    where: str  # a probe's key, or "fact: ..." for what a run left or set on the node
    upstream: str
    ours: str
    known: str | None = None

    def line(self) -> str:
        tag = f" [known: {self.known}]" if self.known else ""
        return (
            f"{self.mode}: {self.where}\n"
            f"    upstream: {self.upstream}\n    ours:     {self.ours}{tag}"
        )


def outcomes(counts: Counter[str] | None) -> frozenset[str]:
    return frozenset(counts or ())


def disputed(upstream: Record, ours: Record) -> list[str]:
    """The probes whose outcome sets differ."""
    return sorted(
        k for k in set(upstream) | set(ours) if outcomes(upstream.get(k)) != outcomes(ours.get(k))
    )


def distribution_differs(a: Counter[str], b: Counter[str], per_answer: int = 10) -> bool:
    """Two samples of the same choice among the same answers that look like different
    distributions: total variation distance above 1/2, judged only when each side has
    at least ``per_answer`` asks per answer."""
    keys = {k for k in a if "@" in k}
    if not keys or keys != {k for k in b if "@" in k} or len(keys) < 2:
        return False
    na, nb = sum(a[k] for k in keys), sum(b[k] for k in keys)
    if min(na, nb) < per_answer * len(keys):
        return False
    return sum(abs(a[k] / na - b[k] / nb) for k in keys) / 2 > 0.5


def summary(counts: Counter[str] | None) -> str:
    if counts is None:
        return "(not asked)"
    return " ".join(f"{o} x{n}" for o, n in sorted(counts.items()))


def compare(mode: str, upstream: Record, ours: Record) -> list[Difference]:
    out = [
        Difference(mode, key, summary(upstream.get(key)), summary(ours.get(key)))
        for key in disputed(upstream, ours)
    ]
    for key in sorted(set(upstream) & set(ours)):
        if outcomes(upstream[key]) == outcomes(ours[key]) and distribution_differs(
            upstream[key], ours[key]
        ):
            out.append(
                Difference(
                    mode, f"{key} (distribution)", summary(upstream[key]), summary(ours[key])
                )
            )
    return out


def compare_facts(
    mode: str, upstream: Mapping[str, str], ours: Mapping[str, str]
) -> list[Difference]:
    """What each run set or left on the node (sysctls, leftovers after the other's
    cleanup, which iptables it used)."""
    return [
        Difference(mode, f"fact: {key}", upstream.get(key, "(none)"), ours.get(key, "(none)"))
        for key in sorted(set(upstream) | set(ours))
        if upstream.get(key) != ours.get(key)
    ]


@dataclass(frozen=True)
class Known:
    """A difference kept on purpose (docs/differences-from-upstream.md, by ``id``)."""

    id: str
    matches: Callable[[Difference], bool]


def left_behind(fact: str) -> tuple[str, frozenset[str]]:
    """A cleanup fact (``exit N, left A, B``): the exit and what was left."""
    head, _, left = fact.partition(", left ")
    return head, frozenset() if left in ("", "nothing") else frozenset(left.split(", "))


# What kube-proxy --cleanup leaves of kubeproxy's iptables mode beyond what kubeproxy's
# cleanup leaves of upstream's: the filter table's dispatch trees, unreferenced.
FILTER_TREES = frozenset(
    f"{what} {family} filter {DISPATCH_PREFIX}*"
    for what in ("chain", "rules")
    for family in ("ip", "ip6")
)


def _filter_trees_stay(diff: Difference) -> bool:
    if diff.mode != "iptables" or diff.where != "fact: the other's cleanup":
        return False
    (up_exit, up_left), (our_exit, our_left) = left_behind(diff.upstream), left_behind(diff.ours)
    return up_exit == our_exit and up_left <= our_left and our_left - up_left <= FILTER_TREES


def _ipv6_sets_stay(diff: Difference) -> bool:
    """ipvs mode: kube-proxy --cleanup destroys its ipsets by their IPv4 names only, so
    the ``KUBE-6-`` ones stay, whoever made them (upstream's own run's too: kubeproxy's
    cleanup runs first there and removes them)."""
    if diff.mode != "ipvs" or diff.where != "fact: the other's cleanup":
        return False
    (up_exit, up_left), (our_exit, our_left) = left_behind(diff.upstream), left_behind(diff.ours)
    extra = our_left - up_left
    return (
        up_exit == our_exit
        and up_left <= our_left
        and all(name.startswith("ipset KUBE-6-") for name in extra)
    )


def _new_service_cidr_dropped_at_once(diff: Difference) -> bool:
    """nftables mode, change sequences: upstream writes its "drop traffic to unallocated
    ClusterIPs" rule on full syncs only (an hour apart), so a free address of a
    ServiceCIDR created while it runs is not dropped (it goes wherever the node routes
    it); kubeproxy drops it from its next sync. Such a probe exists only after a
    ServiceCIDR was added (not at the start)."""
    where = diff.where
    return (
        diff.mode == "nftables"
        and " -: unallocated " in where
        and " after " in where
        and not where.endswith(" after start")
        and set(diff.ours.split()[::2]) == {"timeout"}
        and "timeout" not in diff.upstream.split()[::2]
    )


KNOWN: tuple[Known, ...] = (
    Known("filter-trees-outlive-upstream-cleanup", _filter_trees_stay),
    Known("ipv6-ipsets-outlive-upstream-cleanup", _ipv6_sets_stay),
    Known("new-service-cidr-dropped-at-once", _new_service_cidr_dropped_at_once),
)


def explain(diff: Difference) -> Difference:
    for known in KNOWN:
        if known.matches(diff):
            return Difference(diff.mode, diff.where, diff.upstream, diff.ours, known.id)
    return diff


def _address(token: str) -> bool:
    """``10.0.0.1``, ``10.0.0.1:80``, ``[fd00::1]:80`` or ``fd00::1``."""
    host = token.rsplit(":", 1)[0] if token.count(":") == 1 else token
    host = host.split("]")[0].lstrip("[")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _network(ip: str) -> str:
    """Which of the lab's networks a source address is on (kubeproxy.lab.kube.cluster)."""
    if ip in ("172.31.0.100", "fd00:31::100"):
        return "outside"
    if ip.startswith(("172.31.0.", "fd00:31::")):
        return "node-ip"
    if ip.startswith(("10.244.", "fd00:10:244:")):
        return "pod-network"
    return ip


def signature(diff: Difference) -> str:
    """The kind of a difference, without its seed, Service, Pods and addresses: what
    many states' differences are grouped by."""
    where = re.sub(r"^s\d+ \S+ ", "", diff.where)
    where = " ".join("ADDR" if _address(t) else t for t in where.split())

    def outcome(text: str) -> str:
        words = {
            "pod@" + _network(w.split("@")[1]) if "@" in w else w
            for w in text.split()
            if not re.fullmatch(r"x\d+", w)
        }
        return " ".join(sorted(words))

    return f"{where}: upstream {{{outcome(diff.upstream)}}} ours {{{outcome(diff.ours)}}}"
