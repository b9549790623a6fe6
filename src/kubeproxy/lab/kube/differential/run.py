"""One differential run: states applied, upstream then kubeproxy on one node, compared.

:class:`Differential` holds what the runs share: a pool of Pods (network namespaces
with echo servers on 8080 and 8081, a few per node) whose Pod objects each state
re-creates in its own namespace, the origins, the node under comparison and its
baseline. :meth:`Differential.run` takes a batch of seeds and the modes:

1. each seed's :class:`~.states.State` is applied in a namespace of its own (states of
   one batch use different address blocks, so they never collide), and the lab waits
   until every Service's EndpointSlices hold its Pods; the outside host gets host routes
   through the node to every address it will ask;
2. per mode: the node is reset (:meth:`~.proxies.Node.reset`), upstream kube-proxy runs
   and every probe asks; it stops, the node is cleaned (kubeproxy's cleanup first, then
   its own) and reset; kubeproxy runs and the same probes ask; the probes whose outcome
   sets differ ask again, longer, while kubeproxy still runs, and those still differing
   are asked again of a fresh upstream run; what differs after that is a
   :class:`~.compare.Difference`, as is any difference in what the two runs set or left
   on the node (:meth:`Differential._facts`);
3. the API objects must not have changed during the runs (their resourceVersions are
   compared), so both proxies saw the same cluster; the states are deleted.

Why one node and not twin nodes: twins would need twin Pods (a Pod is on one node), so
node-local endpoints, topology and hairpin traffic would not be the same for both;
one node with a reset in between compares exactly the same kernel, Pods and objects.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubeproxy.lab.kube.api import Api, ApiError, Obj
from kubeproxy.lab.kube.cluster import (
    OUTSIDE_IP,
    OUTSIDE_IP6,
    KubeLab,
    KubePod,
    pod_status,
    wait_for,
)
from kubeproxy.lab.kube.differential import states as st
from kubeproxy.lab.kube.differential.compare import (
    Difference,
    compare,
    compare_facts,
    disputed,
    explain,
)
from kubeproxy.lab.kube.differential.configs import DEFAULT, Configuration
from kubeproxy.lab.kube.differential.probes import (
    Budget,
    Geometry,
    Origin,
    Probe,
    Prober,
    Record,
    matrix,
    outside_routes,
)
from kubeproxy.lab.kube.differential.proxies import (
    ICMP_UNLIMITED,
    OURS,
    PROXIES,
    UPSTREAM,
    Node,
    ProxyKind,
    leftovers,
)
from kubeproxy.lab.netns import sh

SETTLE_TIMEOUT = 60.0
STICKY = " sticky"


@dataclass
class ModeResult:
    """One mode over one batch of states, under one configuration."""

    mode: str
    seeds: list[int]
    upstream: dict[str, dict[str, int]]  # probe -> outcome -> how many asks gave it
    ours: dict[str, dict[str, int]]
    facts: dict[str, dict[str, str]]
    differences: list[Difference]
    asked_again: int = 0
    upstream_again: int = 0
    unstable: list[str] = field(default_factory=list)
    config: str = DEFAULT.name

    def unexplained(self) -> list[Difference]:
        return [d for d in self.differences if d.known is None]

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "config": self.config,
            "seeds": self.seeds,
            "probes": len(self.upstream),
            "asked_again": self.asked_again,
            "upstream_again": self.upstream_again,
            "unstable": self.unstable,
            "facts": self.facts,
            "differences": [d.__dict__ for d in self.differences],
            "records": {UPSTREAM: self.upstream, OURS: self.ours},
        }


def _condensed(names: list[str]) -> str:
    """Leftover object names with their per-Service hashes folded, for a fact."""
    folded = sorted({re.sub(r"\b(KUBE-(?:[A-Z]+-)+)[A-Z0-9]{12,16}\b", r"\1*", n) for n in names})
    return ", ".join(folded) or "nothing"


class Differential:
    def __init__(
        self,
        kube: KubeLab,
        node: str,
        prefix: str,
        workdir: Path,
        *,
        budget: Budget | None = None,
        pool_namespace: str | None = None,
        per_node: int = 3,
    ) -> None:
        self.kube = kube
        self.node = Node(kube, node)
        self.prefix = prefix
        self.workdir = workdir
        self.budget = budget or Budget()
        self.pool_namespace = pool_namespace or prefix
        self.per_node = per_node
        self.slots: list[st.Slot] = []
        self.pods: dict[str, KubePod] = {}
        self.prober: Prober | None = None
        self._icmp_before: dict[str, str] = {}
        self._runs = 0
        # Where a run's time went, by run (its log's name): for the bench and slow tests.
        self.seconds: dict[str, dict[str, float]] = {}
        workdir.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ set-up

    @property
    def api(self) -> Api:
        return self.kube.api()

    def setup(self) -> None:
        """The pool's Pods, the origins, and the node's baseline (no rules at all)."""
        self._namespace(self.pool_namespace)
        for name in sorted(self.kube.nodes):
            for i in range(self.per_node):
                slot = st.Slot(f"{self.prefix}-{name[-1]}{i}", name)
                self.pods[slot.name] = self.kube.add_pod(
                    slot.name, name, namespace=self.pool_namespace, ports=st.TARGET_PORTS
                )
                self.slots.append(slot)
        node = self.kube.nodes[self.node.name]
        local = self.pods[f"{self.prefix}-{self.node.name[-1]}0"]
        remote_node = next(
            n for n in sorted(self.kube.nodes.values(), key=lambda n: n.name) if n.zone != node.zone
        )
        remote = self.pods[f"{self.prefix}-{remote_node.name[-1]}0"]
        origins = [
            Origin("pod-local", local.netns, (local.ips[0], local.ips[1])),
            Origin("pod-remote", remote.netns, (remote.ips[0], remote.ips[1])),
            Origin("node", node.netns, (node.ip, node.ip6)),
            Origin("outside", self.kube.outside_ns, (OUTSIDE_IP, OUTSIDE_IP6)),
        ]
        self.prober = Prober(origins)
        self.geometry = Geometry((node.ip, node.ip6), node.gateways)
        self._icmp_before = self.node.swap_sysctls(ICMP_UNLIMITED)
        self.node.reset()

    def close(self) -> None:
        if self.prober is not None:
            self.prober.close()
        if self._icmp_before:
            self.node.swap_sysctls(self._icmp_before)

    # ------------------------------------------------------------------ states

    def namespace(self, seed: int) -> str:
        return f"{self.prefix}-s{seed}"

    def generate(self, seeds: Sequence[int], first_block: int = 0) -> list[st.State]:
        """The states of ``seeds``, in address blocks ``first_block``, ``first_block``
        + 1... (a batch's states must use different blocks)."""
        nodes = [(n.name, n.zone) for n in self.kube.nodes.values()]
        return [
            st.generate(seed, nodes, self.slots, self.node.name, block)
            for block, seed in enumerate(seeds, start=first_block)
        ]

    def apply(self, state: st.State) -> None:
        api, ns = self.api, self.namespace(state.seed)
        self._namespace(ns)
        if state.service_cidrs:
            name = f"{ns}-cidr"
            api.create(st.service_cidr_object(state, name))
            wait_for(
                lambda: _condition(api.get("ServiceCIDR", name), "Ready"), what=f"{name} ready"
            )
        for pod in state.pods:
            self.create_pod(ns, pod)
        for svc in state.services:
            api.create(st.service_object(svc, ns))
            if svc.lb_ips:
                api.patch_status("Service", svc.name, st.lb_status(svc), ns)
        where = {slot: (p.node.name, p.ips[0], p.ips[1]) for slot, p in self.pods.items()}
        for es in state.slices:
            api.create(st.slice_object(es, ns, where))

    def create_pod(self, ns: str, pod: st.PodState) -> None:
        """The Pod object over its slot, its status as a kubelet writes it; a
        terminating one deleted (its finalizer holds it)."""
        self.api.create(st.pod_object(pod, ns))
        self.api.patch_status("Pod", pod.slot, pod_status(self.pods[pod.slot], pod.ready), ns)
        if pod.terminating:
            self.terminate_pod(ns, pod.slot)

    def terminate_pod(self, ns: str, slot: str) -> None:
        """Delete with a grace period: a Pod whose finalizer holds it stays Terminating."""
        self.api.request(
            "DELETE",
            f"/api/v1/namespaces/{ns}/pods/{slot}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 30},
        )

    def remove_pod(self, ns: str, pod: st.PodState) -> None:
        """Gone at once (finalizer dropped, no grace), if it is there at all."""
        api = self.api
        try:
            if pod.terminating:
                api.patch("Pod", pod.slot, {"metadata": {"finalizers": None}}, ns)
            api.request(
                "DELETE",
                f"/api/v1/namespaces/{ns}/pods/{pod.slot}",
                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
            )
        except ApiError as err:
            if err.code != 404:
                raise

    def _namespace(self, name: str) -> None:
        """``name`` exists (made here if not), with the default ServiceAccount the
        admission plugin wants before any Pod."""
        api = self.api
        try:
            api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        except ApiError as err:
            if err.code != 409:
                raise
        wait_for(
            lambda: api.get("ServiceAccount", "default", name), what=f"{name}'s ServiceAccount"
        )

    def settled(self, state: st.State) -> bool:
        """Every Service's EndpointSlices hold exactly its Pods (terminating ones marked)."""
        ns = self.namespace(state.seed)
        slices = self.api.list_of("EndpointSlice", ns)
        for svc in state.services:
            if not svc.selector:
                continue  # its slices are the state's own, created as they are
            want = {
                (ip, pod.terminating)
                for pod in state.pods
                if svc.selects(pod)
                for ip in self.pods[pod.slot].ips
                if ("IPv6" if ":" in ip else "IPv4") in svc.families
            }
            got = {
                (address, bool(ep.get("conditions", {}).get("terminating")))
                for s in slices
                if s["metadata"].get("labels", {}).get("kubernetes.io/service-name") == svc.name
                for ep in s.get("endpoints") or []
                for address in ep["addresses"]
            }
            if got != want:
                return False
        return True

    def delete(self, state: st.State) -> None:
        api, ns = self.api, self.namespace(state.seed)
        for pod in state.pods:
            self.remove_pod(ns, pod)
        api.delete("Namespace", ns)
        if state.service_cidrs:
            api.delete("ServiceCIDR", f"{ns}-cidr")
        # The namespace controller deletes the objects in the background: the next batch's
        # proxies must not see them go while their probes run (their rules would change).
        # (A ServiceCIDR is not waited for: one stayed past a minute in a bench run.)
        wait_for(
            lambda: not any(api.list_of(kind, ns) for kind in ("Service", "EndpointSlice")),
            timeout=SETTLE_TIMEOUT,
            what=f"the Services of seed {state.seed} gone",
        )

    def live(self, state: st.State) -> dict[str, Obj]:
        ns = self.namespace(state.seed)
        return {s["metadata"]["name"]: s for s in self.api.list_of("Service", ns)}

    def fingerprint(self, states: Sequence[st.State]) -> dict[str, str]:
        """Every object's resourceVersion: unchanged means both proxies saw the same."""
        out = {}
        for state in states:
            ns = self.namespace(state.seed)
            for kind in ("Service", "EndpointSlice", "Pod"):
                for obj in self.api.list_of(kind, ns):
                    meta = obj["metadata"]
                    out[f"{kind} {ns}/{meta['name']}"] = meta["resourceVersion"]
        return out

    @contextmanager
    def applied(self, states: Sequence[st.State]) -> Iterator[list[Probe]]:
        """The states in the API and settled, the outside host's routes in; the probes."""
        routes: set[tuple[str, str]] = set()
        try:
            for state in states:
                self.apply(state)
            for state in states:
                wait_for(
                    lambda s=state: self.settled(s),
                    timeout=SETTLE_TIMEOUT,
                    what=f"the EndpointSlices of seed {state.seed}",
                )
            allocated = {
                ip
                for state in states
                for svc in self.live(state).values()
                for ip in svc["spec"].get("clusterIPs", [])
            } | {a["metadata"]["name"] for a in self.api.list_of("IPAddress")}
            probes = [
                p
                for state in states
                for p in matrix(state, self.live(state), self.geometry, allocated)
            ]
            routes = outside_routes(probes, self.geometry)
            for ip, via in sorted(routes):
                sh("ip", "-n", self.kube.outside_ns, "route", "replace", ip, "via", via)
            yield probes
        finally:
            for ip, _ in sorted(routes):
                sh("ip", "-n", self.kube.outside_ns, "route", "del", ip, check=False)
            for state in states:
                self.delete(state)

    # -------------------------------------------------------------------- runs

    def run(
        self,
        states: Sequence[st.State],
        modes: Sequence[str],
        configs: Sequence[Configuration] = (DEFAULT,),
        config_seeds: Collection[int] | None = None,
    ) -> list[ModeResult]:
        """``states`` (in different address blocks, different seeds) side by side, each
        configuration in each mode it applies to in turn; with ``config_seeds``, a
        configuration other than the defaults asks only the probes of those seeds'
        states (CI: the small pinned state)."""
        seeds = [s.seed for s in states]
        assert len({s.block for s in states}) == len(states) == len(set(seeds))
        (self.workdir / f"states-{seeds[0]}.json").write_text(st.dumps(states))
        results = []
        with self.applied(states) as probes:
            before = self.fingerprint(states)
            for config in configs:
                asked = probes
                if config != DEFAULT and config_seeds is not None:
                    asked = [p for p in probes if p.seed in config_seeds]
                for mode in (m for m in modes if config.applies_to(m)):
                    result = self.run_mode(mode, asked, config)
                    result.seeds = list(seeds)
                    after = self.fingerprint(states)
                    result.unstable = sorted(
                        k for k in set(before) | set(after) if before.get(k) != after.get(k)
                    )
                    results.append(result)
        return results

    def run_mode(
        self, mode: str, probes: Sequence[Probe], config: Configuration = DEFAULT
    ) -> ModeResult:
        by_key = {p.key: p for p in probes}

        def again(keys: Sequence[str]) -> list[Probe]:
            return sorted({by_key[k.removesuffix(STICKY)] for k in keys})

        up, up_facts = self._run(PROXIES[UPSTREAM], mode, probes, self.budget, config=config)
        asked_again: list[str] = []

        def resolve(ours: Record) -> None:
            # Still running: the probes whose outcomes differ ask again, longer.
            keys = disputed(up, ours)
            asked_again.extend(keys)
            if keys:
                ours.update(self.ask(again(keys), self.budget.wider()))

        ours, ours_facts = self._run(
            PROXIES[OURS], mode, probes, self.budget, resolve, config=config
        )
        still = disputed(up, ours)
        if still:
            up_again, _ = self._run(
                PROXIES[UPSTREAM], mode, again(still), self.budget.wider(), config=config
            )
            up.update(up_again)
        differences = compare(mode, up, ours) + compare_facts(mode, up_facts, ours_facts)
        return ModeResult(
            mode=mode,
            seeds=[],
            upstream={k: dict(v) for k, v in sorted(up.items())},
            ours={k: dict(v) for k, v in sorted(ours.items())},
            facts={UPSTREAM: up_facts, OURS: ours_facts},
            differences=[explain(d) for d in differences],
            asked_again=len(asked_again),
            upstream_again=len(still),
            config=config.name,
        )

    def ask(self, probes: Sequence[Probe], budget: Budget) -> Record:
        assert self.prober is not None, "setup() first"
        forget = self.node.affinity_forgetter() if any(p.affinity for p in probes) else None
        return self.prober.run(probes, budget, forget)

    def _run(
        self,
        proxy: ProxyKind,
        mode: str,
        probes: Sequence[Probe],
        budget: Budget,
        then: Any = None,
        *,
        config: Configuration = DEFAULT,
    ) -> tuple[dict[str, Counter[str]], dict[str, str]]:
        """``proxy`` in ``mode`` from a clean node: the probes' record, and the facts of
        the run (what it set, its /healthz and /livez answers, which iptables it used,
        what the other's cleanup left)."""
        node = self.node
        node.reset()
        if not node.clean():
            raise RuntimeError(
                f"{node.name} is not clean before {proxy.name}: {leftovers(node.footprint())}"
            )
        self._runs += 1
        name = f"{self._runs:03d}-{proxy.name}-{mode}"
        if config != DEFAULT:
            name += f"-{config.name}"
        log = self.workdir / f"{name}.log"
        started = time.monotonic()
        with proxy.running(node, mode, log, config):
            ready = time.monotonic()
            sysctls = node.sysctls()
            rules = node.rules()
            record = self.ask(probes, budget)
            health = node.health()
            asked = time.monotonic()
            if then is not None:
                then(record)
            if node.rules() != rules:
                raise RuntimeError(f"{proxy.name}'s rules changed while probes ran (see {log})")
            again = time.monotonic()
        self.seconds[name] = {
            "start": round(ready - started, 1),
            "probes": round(asked - ready, 1),
            "asked again": round(again - asked, 1),
        }
        facts = {
            f"sysctl {k}": v
            for k, v in sysctls.items()
            if node.baseline_sysctls is not None and node.baseline_sysctls.get(k) != v
        }
        facts |= {f"GET {path}": answer for path, answer in health.items()}
        if mode == "iptables":
            legacy = any(k.startswith("legacy ") for k in rules)
            facts["iptables"] = "legacy" if legacy else "nft"
        other = PROXIES[OURS if proxy.name == UPSTREAM else UPSTREAM]
        done = other.cleanup(node)
        facts["the other's cleanup"] = f"exit {done.returncode}, left " + _condensed(
            leftovers(node.footprint())
        )
        own = proxy.cleanup(node)
        facts["both cleanups"] = f"exit {own.returncode}, left " + _condensed(
            leftovers(node.footprint())
        )
        node.reset()
        return record, facts


def _condition(obj: Obj, kind: str) -> bool:
    conditions = obj.get("status", {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def results_json(results: Sequence[ModeResult]) -> str:
    return json.dumps([r.to_json() for r in results], indent=1)
