"""Change sequences run on one node: upstream, then kubeproxy, each through the same
changes while it runs, probed after each change (:mod:`.changes` makes the sequences).

For each configuration and mode, each implementation in turn (from a node reset to
no rules, as a :class:`~.run.Differential` run):

1. the sequences' start states are created in the API server and settle, and the proxy
   starts and syncs;
2. the probes of every sequence ask; then each sequence's next change is made through
   the API server (objects updated in place; Pods made terminating, replaced, created
   or deleted; a Service deleted and created again), the EndpointSlices settle, the
   proxy syncs (a new sync in its log, then rules steady) and the probes ask again, up
   to the last change;
3. the proxy stops, both cleanups run, the objects are deleted.

A probe's key carries the change it follows (``... after c0 type NodePort``), so the
records of the two implementations compare as those of one state do
(:func:`~.compare.compare`). While kubeproxy runs, a probe whose outcomes differ from
upstream's at that step asks again, longer, before the next change. The given
addresses and ports of the sequences (:mod:`.changes`) make both runs' frontends the
same.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from kubeproxy.lab.kube.api import ApiError
from kubeproxy.lab.kube.cluster import pod_status, wait_for
from kubeproxy.lab.kube.differential import states as st
from kubeproxy.lab.kube.differential.changes import ChangeSequence
from kubeproxy.lab.kube.differential.compare import compare, disputed, explain
from kubeproxy.lab.kube.differential.configs import DEFAULT, Configuration
from kubeproxy.lab.kube.differential.probes import Budget, Probe, matrix, outside_routes
from kubeproxy.lab.kube.differential.proxies import OURS, PROXIES, UPSTREAM, ProxyKind, steady
from kubeproxy.lab.kube.differential.run import SETTLE_TIMEOUT, Differential, ModeResult
from kubeproxy.lab.netns import sh

Records = dict[str, Counter[str]]
# How long a change may take to reach the proxy's log as a sync (both sync at most once
# a second by default, and not at all for a change that changes no endpoint).
SYNC_WAIT = 4.0


def run_changes(
    diff: Differential,
    sequences: Sequence[ChangeSequence],
    modes: Sequence[str],
    configs: Sequence[Configuration] = (DEFAULT,),
) -> list[ModeResult]:
    seeds = [s.seed for s in sequences]
    assert len({s.start.block for s in sequences}) == len(sequences) == len(set(seeds))
    steps = {len(s.steps) for s in sequences}
    assert len(steps) == 1, "the sequences of a batch change in step"
    results = []
    for config in configs:
        for mode in (m for m in modes if config.applies_to(m)):
            up = _run(diff, PROXIES[UPSTREAM], mode, sequences, config)
            ours = _run(diff, PROXIES[OURS], mode, sequences, config, reference=up)
            # What still differs is asked again of upstream, longer, at the same step of
            # a fresh run through the same changes (as a state's disputes are).
            still = [set(disputed(u, o)) for u, o in zip(up, ours, strict=True)]
            if any(still):
                again = _run(
                    diff, PROXIES[UPSTREAM], mode, sequences, config, reference=ours, only=still
                )
                for step, records in zip(up, again, strict=True):
                    for key, counts in records.items():
                        step[key] = step.get(key, Counter()) + counts
            up_all = {k: v for step in up for k, v in step.items()}
            ours_all = {k: v for step in ours for k, v in step.items()}
            results.append(
                ModeResult(
                    mode=mode,
                    seeds=seeds,
                    upstream={k: dict(v) for k, v in sorted(up_all.items())},
                    ours={k: dict(v) for k, v in sorted(ours_all.items())},
                    facts={},
                    differences=[explain(d) for d in compare(mode, up_all, ours_all)],
                    asked_again=sum(len(s) for s in still),
                    config=config.name,
                )
            )
    return results


def _run(
    diff: Differential,
    proxy: ProxyKind,
    mode: str,
    sequences: Sequence[ChangeSequence],
    config: Configuration,
    *,
    reference: list[Records] | None = None,
    only: list[set[str]] | None = None,
) -> list[Records]:
    """One run through the sequences: each step's records. ``reference`` (upstream's,
    while kubeproxy runs): a probe differing from it asks again, longer, at once.
    ``only``: each step's probes to ask (longer), the others not asked at all."""
    node = diff.node
    node.reset()
    name = f"changes-{sequences[0].seed}-{proxy.name}-{mode}"
    if config != DEFAULT:
        name += f"-{config.name}"
    if only is not None:
        name += "-again"
    log = diff.workdir / f"{name}.log"
    records: list[Records] = []
    routes: set[tuple[str, str]] = set()
    states = [s.start for s in sequences]
    try:
        for state in states:
            diff.apply(state)
        _settle(diff, states)
        with proxy.running(node, mode, log, config):
            for k in range(len(sequences[0].steps) + 1):
                if k:
                    synced = proxy.syncs(log.read_text(errors="replace"))
                    for seq in sequences:
                        before, step = seq.states()[k - 1][1], seq.steps[k - 1]
                        reconcile(diff, before, step.state, step.recreated)
                    states = [seq.steps[k - 1].state for seq in sequences]
                    _settle(diff, states)
                    _synced(proxy, log, synced)
                    steady(node)
                probes = _probes(diff, states)
                new_routes = outside_routes(probes, diff.geometry) - routes
                for ip, via in sorted(new_routes):
                    sh("ip", "-n", diff.kube.outside_ns, "route", "replace", ip, "via", via)
                routes |= new_routes
                after = {seq.seed: seq.states()[k][0] for seq in sequences}
                by_key = {f"{p.key} after {after[p.seed]}": p for p in probes}
                if only is not None:
                    asked = [by_key[key] for key in sorted(only[k]) if key in by_key]
                    keyed = _ask(diff, asked, after, wider=True)
                else:
                    keyed = _ask(diff, probes, after, wider=False)
                if reference is not None:
                    _resolve(diff, reference[k], keyed, by_key, after)
                records.append(keyed)
        proxy.cleanup(node)
        PROXIES[OURS if proxy.name == UPSTREAM else UPSTREAM].cleanup(node)
    finally:
        for ip, _ in sorted(routes):
            sh("ip", "-n", diff.kube.outside_ns, "route", "del", ip, check=False)
        for state in states:
            diff.delete(state)
        node.reset()
    return records


def _ask(
    diff: Differential,
    probes: Sequence[Probe],
    after: dict[int, str],
    *,
    wider: bool = False,
    budget: Budget | None = None,
) -> Records:
    """The probes' records, keyed with the change each one's sequence last made."""
    budget = budget or (diff.budget.wider() if wider else diff.budget)
    record = diff.ask(probes, budget) if probes else {}
    return {f"{key} after {after[int(key.split()[0][1:])]}": c for key, c in record.items()}


# A missing outcome means something once it would have been seen with at least this
# probability were the two sides the same (each ask independent)...
CONFIDENCE = 0.999
# ...and asking stops here whatever (an outcome seen once in 40 would need 273 asks).
MOST_ASKS = 150


def shortfall(want: Counter[str], have: Counter[str]) -> int:
    """How many more asks ``have`` needs before its lacking one of ``want``'s outcomes
    says the two differ: each outcome ``want`` saw with frequency f, and ``have`` did
    not, is missed by n asks with probability (1 - f)^n if both are the same."""
    total, asked = sum(want.values()), sum(have.values())
    needed = 0
    for outcome, count in want.items():
        if outcome in have or count == total:
            continue  # present; or the only outcome there, and another one here
        n = math.ceil(math.log(1 - CONFIDENCE) / math.log(1 - count / total))
        needed = max(needed, min(n, MOST_ASKS))
    return max(0, needed - asked)


def _resolve(
    diff: Differential,
    reference: Records,
    keyed: Records,
    by_key: dict[str, Probe],
    after: dict[int, str],
) -> None:
    """The probes whose outcomes differ from ``reference``'s ask again, longer, the new
    asks added to the first (an outcome seen once is kept); those still short of what
    tells a difference from chance (:func:`shortfall`), as many more as that takes.
    Only the probes ``keyed`` holds are looked at (a run asking some only)."""
    reference = {k: v for k, v in reference.items() if k in keyed}
    again = [by_key[k] for k in disputed(reference, keyed) if k in by_key]
    for key, counts in _ask(diff, again, after, wider=True).items():
        keyed[key] = keyed.get(key, Counter()) + counts
    for key in disputed(reference, keyed):
        short = shortfall(reference.get(key, Counter()), keyed.get(key, Counter()))
        if short and key in by_key:
            exact = replace(diff.budget, min_tries=short, patience=short, max_tries=short)
            for k, counts in _ask(diff, [by_key[key]], after, budget=exact).items():
                keyed[k] = keyed.get(k, Counter()) + counts


def _probes(diff: Differential, states: Sequence[st.State]) -> list[Probe]:
    allocated = {
        ip
        for state in states
        for svc in diff.live(state).values()
        for ip in svc["spec"].get("clusterIPs", [])
    } | {a["metadata"]["name"] for a in diff.api.list_of("IPAddress")}
    return [
        p for state in states for p in matrix(state, diff.live(state), diff.geometry, allocated)
    ]


def _settle(diff: Differential, states: Sequence[st.State]) -> None:
    for state in states:
        wait_for(
            lambda s=state: diff.settled(s),
            timeout=SETTLE_TIMEOUT,
            what=f"the EndpointSlices of sequence {state.seed}",
        )


def _synced(proxy: ProxyKind, log: Path, before: int) -> None:
    """Wait (a little) for a sync after the change: a change that changes no endpoint
    starts none, so this is no error."""
    deadline = time.monotonic() + SYNC_WAIT
    while time.monotonic() < deadline:
        if proxy.syncs(log.read_text(errors="replace")) > before:
            return
        time.sleep(0.1)


# ------------------------------------------------------------------ reconcile


def reconcile(
    diff: Differential, old: st.State, new: st.State, recreated: Sequence[str] = ()
) -> None:
    """Make the API objects of ``old`` (its namespace) those of ``new``."""
    api, ns = diff.api, diff.namespace(new.seed)
    if new.service_cidrs and not old.service_cidrs:
        name = f"{ns}-cidr"
        api.create(st.service_cidr_object(new, name))
    olds = {p.slot: p for p in old.pods}
    news = {p.slot: p for p in new.pods}
    for slot, pod in olds.items():
        now = news.get(slot)
        if now is None or (pod.terminating and not now.terminating):
            diff.remove_pod(ns, pod)
            wait_for(lambda p=pod: _gone(diff, "Pod", p.slot, ns), what=f"{ns}/{pod.slot} deleted")
    for slot, pod in news.items():
        was = olds.get(slot)
        if was is None or (was.terminating and not pod.terminating):
            diff.create_pod(ns, pod)
            continue
        if was.labels != pod.labels:
            labels = {k: pod.labels.get(k) for k in was.labels.keys() | pod.labels.keys()}
            api.patch("Pod", slot, {"metadata": {"labels": labels}}, ns)
        if was.ready != pod.ready:
            api.patch_status("Pod", slot, pod_status(diff.pods[slot], pod.ready), ns)
        if pod.terminating and not was.terminating:
            api.patch("Pod", slot, {"metadata": {"finalizers": [st.HOLD]}}, ns)
            diff.terminate_pod(ns, slot)
    old_services = {s.name: s for s in old.services}
    for svc in new.services:
        if svc.name in recreated:
            api.delete("Service", svc.name, ns)
            wait_for(
                lambda s=svc: _gone(diff, "Service", s.name, ns) and _released(diff, s),
                what=f"{ns}/{svc.name} deleted",
            )
            api.create(st.service_object(svc, ns))
        elif old_services.get(svc.name) != svc:
            current = api.get("Service", svc.name, ns)
            wanted = st.service_object(svc, ns)
            wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            api.request("PUT", f"/api/v1/namespaces/{ns}/services/{svc.name}", wanted)
        else:
            continue
        ingress = [{"ip": ip, "ipMode": svc.lb_ip_mode} for ip in svc.lb_ips]
        status = {"status": {"loadBalancer": {"ingress": ingress or None}}}
        api.patch_status("Service", svc.name, status, ns)


def _gone(diff: Differential, kind: str, name: str, ns: str) -> bool:
    try:
        diff.api.get(kind, name, ns)
    except ApiError as err:
        if err.code == 404:
            return True
        raise
    return False


def _released(diff: Differential, svc: st.ServiceState) -> bool:
    """The Service's ClusterIPs free again (their IPAddress objects gone)."""
    taken = {a["metadata"]["name"] for a in diff.api.list_of("IPAddress")}
    return not taken & set(svc.cluster_ips)


def describe(seq: ChangeSequence) -> str:
    """The start state and each change, for a failure message."""
    lines = [seq.start.describe()]
    lines += [f"  then: {s.name}" for s in seq.steps]
    return "\n".join(lines)
