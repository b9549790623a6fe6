"""Change sequences: a state, then changes applied through the API server while a proxy
runs, the node probed after each one (issue 42: a node lives in change, and partial
syncs are the code it runs most of its life).

:func:`generate` is pure, like :func:`~.states.generate`: a seed gives a
:class:`ChangeSequence`, a small start state (one or two Services) and its
:class:`Step` s, each the whole state after one change:

* endpoints: a Pod not ready and back, terminating (serving or not), replaced by a new
  one, an endpoint added or removed, the Service scaled to none and back;
* the Service: its type (ClusterIP, NodePort, LoadBalancer and back), a port's number
  or target, either traffic policy, session affinity, source ranges, topology
  (``trafficDistribution``), deleted and created again with the same ClusterIP;
* the cluster: a ServiceCIDR added.

Addresses and ports a Service keeps through its changes are given, not allocated:
ClusterIPs from the service range's static band (below its first 256 addresses, where
the allocator hands out nothing dynamic), NodePorts and the health-check port from the
NodePort range's static band. So the upstream run and the kubeproxy run of a
sequence, each from the start state created afresh, see the same frontends, and their
probes have the same keys.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kubeproxy.lab.kube.differential.states import (
    SOURCE_RANGES,
    TARGET_PORTS,
    PodState,
    PortState,
    ServiceState,
    Slot,
    State,
    lb_ip,
    service_cidrs,
)

# Sequences use seeds from here on (generated states' seeds are below; pinned above).
FIRST_SEED = 500000
STEPS = 6


@dataclass(frozen=True)
class Step:
    name: str  # what changed: "svc-0 type NodePort", "pod df-a1 not ready"
    state: State
    # Services deleted and created again in this step (same ClusterIPs and ports).
    recreated: tuple[str, ...] = ()
    kind: str = ""  # its key in CHANGES


@dataclass(frozen=True)
class ChangeSequence:
    seed: int
    start: State
    steps: tuple[Step, ...]

    def states(self) -> list[tuple[str, State]]:
        """(step name, state) from the start ("start") to the last step."""
        return [("start", self.start), *((s.name, s.state) for s in self.steps)]


def cluster_ip(block: int, index: int, family: str) -> str:
    """A given ClusterIP: the service range's static band (10.96.0.0/16's first 256
    addresses; 10.96.0.1 is the kubernetes Service's)."""
    n = 16 * block + 2 + index
    return f"10.96.0.{n}" if family == "IPv4" else f"fd00:10:96::{n:x}"


def node_port(block: int, index: int) -> int:
    """A given NodePort: the static band of the default range (30000-30085): five per
    block (two Services' ports and health checks)."""
    return 30000 + 5 * block + index


def generate(
    seed: int,
    slots: Sequence[Slot],
    node: str,
    block: int,
    steps: int = STEPS,
) -> ChangeSequence:
    rng = random.Random(seed)
    used = rng.sample(list(slots), rng.randint(3, min(6, len(slots))))
    names = [f"c{i}" for i in range(rng.choice((1, 1, 2)))]
    pods = tuple(
        PodState(
            slot.name,
            slot.node,
            {name: "y" for name in names if rng.random() < 0.6},
            ready=rng.random() < 0.85,
            terminating=False,
        )
        for slot in used
    )
    services = tuple(_service(rng, name, block, i) for i, name in enumerate(names))
    start = State(seed, block, node, pods, services)
    out: list[Step] = []
    state = start
    for _ in range(steps):
        step = _change(rng, state, slots, block)
        out.append(step)
        state = step.state
    return ChangeSequence(seed, start, tuple(out))


def _service(rng: random.Random, name: str, block: int, index: int) -> ServiceState:
    families = rng.choice((("IPv4",), ("IPv4",), ("IPv6",), ("IPv4", "IPv6")))
    policy = "SingleStack" if len(families) == 1 else "RequireDualStack"
    protocol = rng.choice(("TCP", "TCP", "UDP"))
    kind = rng.choice(("ClusterIP", "NodePort", "LoadBalancer"))
    lbs = tuple(lb_ip(block, 1 + index, f) for f in families) if kind == "LoadBalancer" else ()
    return ServiceState(
        name=name,
        type=kind,
        family_policy=policy,
        families=families,
        ports=(PortState("p0", protocol, 80, rng.choice(TARGET_PORTS)),),
        selector={name: "y"},
        external_traffic_policy=None if kind == "ClusterIP" else "Cluster",
        lb_ips=lbs,
        cluster_ips=tuple(cluster_ip(block, index, f) for f in families),
        node_ports=(node_port(block, 2 * index),),
        health_node_port=node_port(block, 2 * index + 1),
    )


Change = Callable[[random.Random, State, Sequence[Slot], int], Step | None]


def _change(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step:
    """One change that applies to ``state`` (every kind is tried, in a random order)."""
    kinds = list(CHANGES)
    rng.shuffle(kinds)
    for kind in kinds:
        step = CHANGES[kind](rng, state, slots, block)
        if step is not None:
            return replace(step, kind=kind)
    raise AssertionError("no change applies")  # endpoint-added always does


# ------------------------------------------------------------------ endpoints


def _pods(state: State, fn: Callable[[PodState], bool]) -> list[PodState]:
    return [p for p in state.pods if fn(p)]


def _with_pod(state: State, old: PodState | None, new: PodState | None) -> State:
    pods = [p for p in state.pods if old is None or p.slot != old.slot]
    if new is not None:
        pods.append(new)
    return replace(state, pods=tuple(sorted(pods, key=lambda p: p.slot)))


def _not_ready(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step | None:
    pods = _pods(state, lambda p: p.ready and not p.terminating)
    if not pods:
        return None
    pod = rng.choice(pods)
    return Step(f"pod {pod.slot} not ready", _with_pod(state, pod, replace(pod, ready=False)))


def _ready(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step | None:
    pods = _pods(state, lambda p: not p.ready and not p.terminating)
    if not pods:
        return None
    pod = rng.choice(pods)
    return Step(f"pod {pod.slot} ready", _with_pod(state, pod, replace(pod, ready=True)))


def _terminating(
    rng: random.Random, state: State, slots: Sequence[Slot], block: int
) -> Step | None:
    pods = _pods(state, lambda p: not p.terminating)
    if not pods:
        return None
    pod = rng.choice(pods)
    serving = rng.random() < 0.5 and pod.ready
    new = replace(pod, terminating=True, ready=serving)
    how = "serving" if serving else "not serving"
    return Step(f"pod {pod.slot} terminating ({how})", _with_pod(state, pod, new))


def _replaced(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step | None:
    """A terminating Pod gone, and a new one in its place (same address, ready)."""
    pods = _pods(state, lambda p: p.terminating)
    if not pods:
        return None
    pod = rng.choice(pods)
    new = replace(pod, ready=True, terminating=False)
    return Step(f"pod {pod.slot} replaced", _with_pod(state, pod, new))


def _added(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step:
    svc = rng.choice(state.services)
    candidates = [p for p in state.pods if not p.terminating and not svc.selects(p)]
    free = [s for s in slots if s.name not in {p.slot for p in state.pods}]
    if candidates and (not free or rng.random() < 0.5):
        pod = rng.choice(candidates)
        new = replace(pod, labels={**pod.labels, **svc.selector})
        return Step(f"pod {pod.slot} joins {svc.name}", _with_pod(state, pod, new))
    slot = rng.choice(free)
    new = PodState(slot.name, slot.node, dict(svc.selector), ready=True, terminating=False)
    return Step(f"pod {slot.name} created for {svc.name}", _with_pod(state, None, new))


def _removed(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step | None:
    pods = [p for p in state.pods if not p.terminating and p.labels]
    if not pods:
        return None
    pod = rng.choice(pods)
    if rng.random() < 0.5:
        return Step(f"pod {pod.slot} deleted", _with_pod(state, pod, None))
    label = rng.choice(sorted(pod.labels))
    new = replace(pod, labels={k: v for k, v in pod.labels.items() if k != label})
    return Step(f"pod {pod.slot} leaves {label}", _with_pod(state, pod, new))


def _scaled(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step | None:
    """To no endpoint at all, or back from there."""
    svc = rng.choice(state.services)
    selected = [p for p in state.pods if svc.selects(p)]
    if selected:
        pods = tuple(
            replace(p, labels={k: v for k, v in p.labels.items() if k != svc.name})
            if svc.selects(p)
            else p
            for p in state.pods
        )
        return Step(f"{svc.name} scaled to zero", replace(state, pods=pods))
    live = [p for p in state.pods if not p.terminating]
    if not live:
        return None
    chosen = rng.sample(live, min(len(live), rng.randint(1, 3)))
    pods = tuple(
        replace(p, labels={**p.labels, **svc.selector}) if p in chosen else p for p in state.pods
    )
    return Step(f"{svc.name} scaled back to {len(chosen)}", replace(state, pods=pods))


# -------------------------------------------------------------------- Services


def _with_service(state: State, new: ServiceState) -> State:
    return replace(state, services=tuple(new if s.name == new.name else s for s in state.services))


def _type(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step:
    svc = rng.choice(state.services)
    index = state.services.index(svc)
    kind = {"ClusterIP": "NodePort", "NodePort": "LoadBalancer", "LoadBalancer": "ClusterIP"}[
        svc.type
    ]
    new = replace(
        svc,
        type=kind,
        external_traffic_policy=None
        if kind == "ClusterIP"
        else svc.external_traffic_policy or "Cluster",
        lb_ips=tuple(lb_ip(block, 1 + index, f) for f in svc.families)
        if kind == "LoadBalancer"
        else (),
        source_ranges=svc.source_ranges if kind == "LoadBalancer" else (),
    )
    return Step(f"{svc.name} type {kind}", _with_service(state, new))


def _port(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step:
    svc = rng.choice(state.services)
    (port,) = svc.ports
    if rng.random() < 0.5:
        new_port = replace(port, port=8080 if port.port == 80 else 80)
        what = f"port {new_port.port}"
    else:
        number = port.target if isinstance(port.target, int) else int(port.target[1:])
        other = TARGET_PORTS[1 - TARGET_PORTS.index(number)]
        target: int | str = other if rng.random() < 0.7 else f"p{other}"
        new_port = replace(port, target=target)
        what = f"targetPort {target}"
    return Step(f"{svc.name} {what}", _with_service(state, replace(svc, ports=(new_port,))))


def _etp(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step | None:
    external = [s for s in state.services if s.type != "ClusterIP"]
    if not external:
        return None
    svc = rng.choice(external)
    policy = "Local" if svc.external_traffic_policy != "Local" else "Cluster"
    new = replace(svc, external_traffic_policy=policy)
    return Step(f"{svc.name} externalTrafficPolicy {policy}", _with_service(state, new))


def _itp(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step:
    svc = rng.choice(state.services)
    policy = "Local" if svc.internal_traffic_policy != "Local" else "Cluster"
    new = replace(svc, internal_traffic_policy=policy)
    return Step(f"{svc.name} internalTrafficPolicy {policy}", _with_service(state, new))


def _affinity(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step:
    svc = rng.choice(state.services)
    timeout = None if svc.affinity_timeout is not None else rng.choice((60, 10800))
    new = replace(svc, affinity_timeout=timeout)
    what = "off" if timeout is None else f"{timeout}s"
    return Step(f"{svc.name} session affinity {what}", _with_service(state, new))


def _ranges(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step | None:
    balanced = [s for s in state.services if s.type == "LoadBalancer"]
    if not balanced:
        return None
    svc = rng.choice(balanced)
    ranges = () if svc.source_ranges else tuple(rng.sample(SOURCE_RANGES, rng.randint(1, 2)))
    new = replace(svc, source_ranges=ranges)
    return Step(f"{svc.name} source ranges {list(ranges)}", _with_service(state, new))


def _topology(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step:
    svc = rng.choice(state.services)
    topology = None if svc.topology else rng.choice(("PreferClose", "PreferSameNode"))
    new = replace(svc, topology=topology)
    return Step(f"{svc.name} trafficDistribution {topology}", _with_service(state, new))


def _recreated(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step:
    svc = rng.choice(state.services)
    return Step(f"{svc.name} deleted and created again", state, recreated=(svc.name,))


def _cidr(rng: random.Random, state: State, slots: Sequence[Slot], block: int) -> Step | None:
    if state.service_cidrs:
        return None
    return Step("a ServiceCIDR added", replace(state, service_cidrs=service_cidrs(block)))


CHANGES: dict[str, Change] = {
    "not-ready": _not_ready,
    "ready": _ready,
    "terminating": _terminating,
    "replaced": _replaced,
    "added": _added,
    "removed": _removed,
    "scaled": _scaled,
    "type": _type,
    "port": _port,
    "etp": _etp,
    "itp": _itp,
    "affinity": _affinity,
    "ranges": _ranges,
    "topology": _topology,
    "recreated": _recreated,
    "cidr": _cidr,
}
