"""ebpf mode's knowledge for ``explain`` and ``list``: the socket hooks, or the nftables
rules they leave a connection to (an :class:`~kubeproxy.backends.inspection.Inspector`).

ebpf mode is nftables mode plus cgroup socket hooks (docs/ebpf.md), so a packet is
first explained as nftables mode would (:func:`~kubeproxy.explain.packet.explain`),
then :func:`through_hooks` (:meth:`EbpfInspector.before_rules`) decides whether the
hooks take the connection before any packet exists. They do when the socket is on this
node (origin: this node or a local Pod) and the frontend has an entry in the hooks' map
(the entries the backend writes, from its own renderer
:func:`~kubeproxy.backends.ebpf.render.socket_entries`). The verdict is then
``SOCKET-LB``: one of the entry's endpoints, picked in ``connect()`` / ``sendmsg()``,
never masqueraded, no DNAT. Otherwise (NodePorts, from outside,
``loadBalancerSourceRanges``, SCTP, no endpoints, no Service) the nftables explanation
stands, with one more reason saying why the hooks leave it alone.

:func:`socket_objects` names the map entries (``kp_svc4`` / ``kp_svc6``: slot 0 the
count and affinity timeout, slots 1..n the endpoints) that ``--live`` compares with the
pinned map (:func:`socket_drift`); everything else is nftables mode's inspector's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from kubeproxy.backends.ebpf.render import socket_entries
from kubeproxy.backends.inspection import KernelObject, LiveKernel, RulesInspector
from kubeproxy.backends.nftables import inspect as nftables
from kubeproxy.dataplane.bpf.socklb import Backends, Target, pinned_entry, supported, unlinked_hooks
from kubeproxy.dataplane.bpf.socklb import Frontend as SocketFrontend
from kubeproxy.model.fate import (
    Candidate,
    Explanation,
    Origin,
    Outcome,
    excluded_endpoints,
    selection_reasons,
)
from kubeproxy.model.plan import FamilyPlan, Frontend, FrontendKind, ServicePortPlan
from kubeproxy.model.types import Endpoint, IPFamily, ServicePortName, TrafficPolicy

MODE = "ebpf"
TABLE = "bpf"


def socket_frontend(result: Explanation) -> SocketFrontend | None:
    """The hooks' key for the explained frontend (None: a NodePort, or no match)."""
    frontend, plan = result.frontend, result.plan
    if frontend is None or plan is None or frontend.ip is None:
        return None
    return SocketFrontend(frontend.ip, plan.service_port.port, plan.service_port.protocol)


def _left_to_nftables(result: Explanation) -> str:
    """Why the hooks do not serve this packet."""
    plan, frontend = result.plan, result.frontend
    rules = "the nftables rules decide, as in nftables mode"
    if plan is None or frontend is None:
        return f"ebpf mode: no Service frontend, so no socket-hook entry: {rules}"
    if frontend.kind is FrontendKind.NODE_PORT:
        return f"ebpf mode: NodePorts are not socket-hook frontends: {rules}"
    if result.origin is Origin.OUTSIDE:
        return (
            "ebpf mode: from outside this node, so not a socket of the hooked cgroup "
            f"(the hooks run in connect()/sendmsg() on this node): {rules}"
        )
    if not supported(plan.service_port.protocol):
        return f"ebpf mode: {plan.service_port.protocol.value} sockets are not rewritten: {rules}"
    if frontend.source_ranges:
        return (
            "ebpf mode: a load-balancer IP with loadBalancerSourceRanges has no socket-hook "
            f"entry (the source address is not known yet at connect()): {rules}"
        )
    return (
        f"ebpf mode: no endpoint for this route, so no socket-hook entry: {rules} "
        "(a socket in the hooked cgroup meets them too)"
    )


def through_hooks(
    result: Explanation,
    fam: FamilyPlan,
    endpoints: Mapping[ServicePortName, Sequence[Endpoint]],
) -> Explanation:
    """ebpf mode's fate of the packet ``result`` explains for nftables mode."""
    plan, frontend = result.plan, result.frontend
    key = socket_frontend(result)
    entry = None if key is None or plan is None else socket_entries(plan).get(key)
    if entry is None or result.origin is Origin.OUTSIDE or plan is None or frontend is None:
        return replace(result, mode=MODE, reasons=(*result.reasons, _left_to_nftables(result)))
    reasons = list(result.reasons[:2])  # origin; the frontend matched
    if result.origin is Origin.POD:
        reasons.append(
            "the hooks see sockets of this node only: a Pod here is in the hooked cgroup "
            "(a Pod on another node is served by its own node)"
        )
    if frontend.kind is FrontendKind.CLUSTER_IP:
        route, kind = plan.internal, "internal"
        used_from = route.endpoints
        reasons.append(
            f"internalTrafficPolicy {route.policy.value}: "
            + (
                "this node's endpoints only"
                if route.policy is TrafficPolicy.LOCAL
                else "endpoints cluster-wide"
            )
        )
    else:
        external = plan.external
        assert external is not None  # an external frontend has its route
        route = external
        if route.policy is TrafficPolicy.LOCAL:
            kind, used_from = "short-circuit", route.short_circuit
            reasons.append(
                "externalTrafficPolicy Local, but a socket on this node: the endpoints "
                "cluster-wide (what nftables mode gives the node and its Pods)"
            )
        else:
            kind, used_from = "external", route.endpoints
            reasons.append("externalTrafficPolicy Cluster: endpoints cluster-wide")
    by_target = {Target(ep.ip, ep.port): ep for ep in used_from}
    used = tuple(by_target[t] for t in entry.targets)
    n = len(used)
    reasons.extend(selection_reasons(plan, fam, route, used))
    if entry.affinity:
        reasons.append(
            "ebpf mode's affinity: the client is the socket's network namespace (a Pod, or "
            "the node), remembered per frontend (kp_aff4/6)"
        )
    reasons.append(
        f"ebpf mode: the socket hook gives the connection one of {n} endpoint(s) in "
        f"connect() (TCP, connected UDP) or sendmsg() (unconnected UDP: one endpoint per "
        f"socket), each with probability 1/{n}; no packet to {result.packet.dst} leaves, "
        "no DNAT"
    )
    reasons.append("not masqueraded: the packets carry the client's own address")
    outside = f"{result.verdict.value}" + (
        f" to one of {len(result.candidates)}" if result.candidates else ""
    )
    reasons.append(
        f"a process outside the hooked cgroup (--ebpf-cgroup-path) meets the nftables "
        f"rules instead: {outside} (explain it with --proxy-mode nftables)"
    )
    local_only = route.policy is TrafficPolicy.LOCAL and kind != "short-circuit"
    want_v6 = fam.family is IPFamily.IPv6
    family_eps = [ep for ep in endpoints.get(plan.name, ()) if (":" in ep.ip) is want_v6]
    return replace(
        result,
        mode=MODE,
        verdict=Outcome.SOCKET_LB,
        reasons=tuple(reasons),
        route=kind,
        candidates=tuple(Candidate(ep, 1 / n, False) for ep in used),
        excluded=excluded_endpoints(plan, fam, family_eps, used, local_only),
        masquerade=False,
    )


# ------------------------------------------------------------- the map's entries


def map_name(family: IPFamily) -> str:
    return "kp_svc6" if family is IPFamily.IPv6 else "kp_svc4"


def _slot0(backends: Backends) -> str:
    return f"{len(backends.targets)} endpoint(s), affinity {backends.affinity}s"


def socket_objects(result: Explanation) -> tuple[KernelObject, ...]:
    """The hooks' map entries behind a ``SOCKET-LB`` verdict: slot 0, then each slot."""
    key = socket_frontend(result)
    if key is None or result.plan is None:
        return ()
    entry = expected_entry(result)
    name = map_name(key.family)
    out = [KernelObject("element", TABLE, name, f"{key} slot 0", _slot0(entry))]
    out.extend(
        KernelObject("element", TABLE, name, f"{key} slot {i}", str(target))
        for i, target in enumerate(entry.targets, 1)
    )
    return tuple(out)


def expected_entry(result: Explanation) -> Backends:
    """What the map should hold for the explained frontend (no targets: no entry)."""
    if result.verdict is not Outcome.SOCKET_LB or result.plan is None:
        return Backends(())
    targets = tuple(Target(c.endpoint.ip, c.endpoint.port) for c in result.candidates)
    return Backends(targets, result.plan.affinity_timeout or 0)


def socket_drift(result: Explanation, have: Backends, unlinked: Sequence[str]) -> list[str]:
    """Differences between the pinned map's entry for the explained frontend (``have``;
    no targets: none) and the plan's, and hooks without a pinned link (``unlinked``)."""
    key = socket_frontend(result)
    if key is None:
        return []
    want = expected_entry(result)
    name = map_name(key.family)
    drift: list[str] = []
    if want.targets:
        drift.extend(f"hook {hook} has no pinned link (not attached)" for hook in unlinked)
        if not have.targets:
            return [*drift, f"{name} has no entry for {key}: the hooks leave it to nftables"]
        missing = [t for t in want.targets if t not in have.targets]
        extra = [t for t in have.targets if t not in want.targets]
        drift.extend(f"missing endpoint {t} in {name} ({key})" for t in missing)
        drift.extend(f"extra endpoint {t} in {name} ({key})" for t in extra)
        if have.affinity != want.affinity:
            drift.append(
                f"{name} ({key}): affinity {have.affinity}s, the plan says {want.affinity}s"
            )
    elif have.targets:
        listed = ", ".join(str(t) for t in have.targets)
        drift.append(
            f"{name} holds {key} -> {listed}, but the plan leaves it to nftables: "
            "the hooks would rewrite it"
        )
    return drift


# ------------------------------------------------------------------- the inspector


class EbpfInspector(RulesInspector):
    """nftables mode's rules behind the socket hooks; ``pin_dir``: where the hooks'
    map is pinned (``--ebpf-pin-path``), read by ``--live``."""

    rules = nftables.RULES

    def __init__(self, pin_dir: Path) -> None:
        self.pin_dir = pin_dir

    def origins(self, frontend: Frontend) -> tuple[Origin, ...]:
        if frontend.kind is FrontendKind.NODE_PORT:
            return (Origin.OUTSIDE,)  # never a socket-hook frontend
        return (Origin.OUTSIDE, Origin.NODE)

    def before_rules(
        self,
        result: Explanation,
        fam: FamilyPlan,
        endpoints: Mapping[ServicePortName, Sequence[Endpoint]],
    ) -> Explanation:
        return through_hooks(result, fam, endpoints)

    def kernel_objects(
        self, result: Explanation, fam: FamilyPlan, scheduler: str = "rr"
    ) -> tuple[KernelObject, ...]:
        if result.verdict is Outcome.SOCKET_LB:
            return socket_objects(result)
        return nftables.kernel_objects(result, fam, scheduler)

    def drift(
        self,
        result: Explanation,
        fam: FamilyPlan,
        objects: Sequence[KernelObject],
        kernel: LiveKernel,
    ) -> list[str]:
        hooks = result.verdict is Outcome.SOCKET_LB
        drift = [] if hooks else nftables.drift(result, fam, objects, kernel)
        if hooks or result.origin is not Origin.OUTSIDE:
            drift += self._socket_drift(result)
        return drift

    def _socket_drift(self, result: Explanation) -> list[str]:
        """The pinned map's entry for the frontend against the plan's (none expected
        when the hooks leave the frontend to nftables)."""
        key = socket_frontend(result)
        if key is None:
            return []
        try:
            have = pinned_entry(self.pin_dir, key)
        except OSError as err:
            return [f"cannot read the socket hooks' map under {self.pin_dir}: {err}"]
        return socket_drift(result, have, unlinked_hooks(self.pin_dir))

    def kernel_only(
        self,
        families: Sequence[tuple[FamilyPlan, Sequence[ServicePortPlan]]],
        expected: Sequence[KernelObject],
        kernel: LiveKernel,
    ) -> list[str]:
        return nftables.kernel_only(families, expected, kernel)
