"""One ServicePort plan → what it adds to its family's ``kube-proxy`` table (pure).

See docs/nftables-layout.md for the layout. The number of chains does not grow with the
number of Services: per-Service state lives in map elements, and a handful of shared
load-balancing chains (:class:`~kubeproxy.backends.nftables.table.LBChain`) do the work.

* Each frontend of the plan is a :class:`Destination`: the elements it adds (its
  element in the ``-dests`` set of the shared chain it uses — or, with session affinity,
  its ``service-ips`` / ``service-nodeports`` verdict —, its endpoints in that chain's
  backends map by index, a no-endpoint DROP/REJECT, firewall elements) and that shared chain.
  Destinations are claimed: two ServicePorts must not both own one (the index decides).
* ClusterIPs and hairpin pairs are *shared* elements several ServicePorts may add.
* ServicePorts with ``sessionAffinity: ClientIP`` are the exception: they get chains of
  their own (one per endpoint, with a dynamic set remembering clients), as upstream, so
  the cost of affinity is paid by the Services that use it.

:func:`render_service_port` returns a :class:`PortRules`; the index
(:mod:`kubeproxy.backends.nftables.index`) assembles them into a table and into partial
changes.
"""

from __future__ import annotations

import base64
import hashlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from kubeproxy.backends.nftables.table import (
    CLUSTER_IPS,
    FIREWALL_ALLOW,
    FIREWALL_IPS,
    HAIRPIN,
    LOCAL_OFFSET,
    NO_ENDPOINT_NODEPORTS,
    NO_ENDPOINT_SERVICES,
    SERVICE_IPS,
    SERVICE_NODEPORTS,
    VERDICT_DROP,
    VERDICT_REJECT,
    LBChain,
    Vocabulary,
    policy_rules,
)
from kubeproxy.dataplane.nftables.transaction import Set
from kubeproxy.model.plan import (
    FamilyPlan,
    Frontend,
    FrontendKind,
    Route,
    ServicePortPlan,
    Verdict,
)
from kubeproxy.model.types import Endpoint, IPFamily, TrafficPolicy

# (set or map name, key, value or None for sets)
Element = tuple[str, str, str | None]
# Which destination an element group belongs to: ("ip", "addr . proto . port") or
# ("nodeport", "proto . port").
Claim = tuple[str, str]


@dataclass(frozen=True, slots=True)
class ChainDef:
    name: str
    rules: tuple[str, ...]


@dataclass(frozen=True, slots=True, order=True)
class AffinitySet:
    """A dynamic set of clients stuck to one endpoint (timeout in the name: a new
    timeout is a new set, so an existing set is never redefined)."""

    name: str
    timeout: int


@dataclass(frozen=True, slots=True)
class Destination:
    """One address a ServicePort captures, with all the elements it adds."""

    claim: Claim
    elements: tuple[Element, ...]
    chain: LBChain | None = None


@dataclass(frozen=True, slots=True)
class PortRules:
    """What one ServicePort contributes to one family's table."""

    destinations: tuple[Destination, ...] = ()
    # Elements several ServicePorts may share (hairpin pairs, ClusterIPs): reference
    # counted, so one is removed only when no ServicePort needs it any more.
    shared: tuple[Element, ...] = ()
    # Session affinity only: this ServicePort's own chains (in dependency order: a chain
    # comes after the chains it jumps to) and sets.
    chains: tuple[ChainDef, ...] = ()
    sets: tuple[AffinitySet, ...] = ()
    no_local_internal: bool = False
    no_local_external: bool = False


def affinity_set(family: IPFamily, aff: AffinitySet) -> Set:
    """The nft set behind an :class:`AffinitySet`."""
    v = Vocabulary.of(family)
    return Set(aff.name, v.addr_type, ("dynamic", "timeout"), timeout=aff.timeout)


def _unreachable(route: Route) -> str:
    return VERDICT_DROP if route.verdict is Verdict.DROP else VERDICT_REJECT


def render_service_port(
    plan: ServicePortPlan, fam: FamilyPlan, previous: PortRules | None = None
) -> PortRules:
    """The elements (and affinity chains) one ServicePort plan needs in its table.

    ``previous``: the ServicePort's rules as programmed, if any. An endpoint that stays
    keeps its index in the backends map, and a new endpoint takes a free one (see
    :func:`_indexed`); without it, endpoints are indexed in the plan's order.
    """
    proto = plan.service_port.protocol.nft
    affinity = _Affinity(plan, fam) if plan.affinity_timeout is not None else None
    before = _Before(previous)
    dests: list[Destination] = []

    # ClusterIP: internal traffic.
    internal = plan.internal
    key = f"{plan.cluster_ip} . {proto} . {plan.service_port.port}"
    if internal.endpoints:
        if affinity is not None:
            dests.append(Destination(("ip", key), ((SERVICE_IPS, key, affinity.goto("ci")),)))
        else:
            chain = LBChain("cluster-ip", len(internal.endpoints))
            old = before.backends(("ip", key), chain)
            elements = (
                (chain.dests, key, None),
                *_indexed(chain.backends, key, internal.endpoints, old),
            )
            dests.append(Destination(("ip", key), elements, chain))
    else:
        dests.append(
            Destination(("ip", key), ((NO_ENDPOINT_SERVICES, key, _unreachable(internal)),))
        )

    # External destinations: external IPs, load-balancer IPs, the NodePort.
    external = plan.external
    by_claim: dict[Claim, int] = {}
    for frontend in plan.external_frontends:
        assert external is not None
        dest = _external(frontend, external, proto, affinity, before)
        first = by_claim.setdefault(dest.claim, len(dests))
        if first == len(dests):
            dests.append(dest)
        else:
            # The same address as an external IP and a load-balancer IP: one destination
            # (the same route), with the firewall of either (upstream's firewall-ips
            # holds the load-balancer IP's, and so catches the external IP's packets).
            merged = dict.fromkeys((*dests[first].elements, *dest.elements))
            dests[first] = replace(dests[first], elements=tuple(merged))

    shared: list[Element] = [(CLUSTER_IPS, plan.cluster_ip, None)]
    shared.extend((HAIRPIN, f"{h} . {h}", None) for h in plan.hairpin)
    return PortRules(
        destinations=tuple(dests),
        shared=tuple(shared),
        chains=affinity.chains() if affinity is not None else (),
        sets=affinity.sets() if affinity is not None else (),
        no_local_internal=plan.no_local_internal,
        no_local_external=plan.no_local_external,
    )


def _external(
    frontend: Frontend,
    route: Route,
    proto: str,
    affinity: _Affinity | None,
    before: _Before,
) -> Destination:
    by_ip = frontend.kind is not FrontendKind.NODE_PORT
    key = f"{frontend.ip} . {proto} . {frontend.port}" if by_ip else f"{proto} . {frontend.port}"
    dispatch = SERVICE_IPS if by_ip else SERVICE_NODEPORTS
    local = route.policy is TrafficPolicy.LOCAL
    claim: Claim = ("ip", key) if by_ip else ("nodeport", key)
    elements: list[Element] = []
    chain: LBChain | None = None
    # Local policy with no local endpoint still short-circuits local Pods and the node.
    if route.endpoints or route.short_circuit:
        if affinity is not None:
            elements.append((dispatch, key, affinity.goto("xl" if local else "x")))
        elif local:
            chain = LBChain(
                "local-ip" if by_ip else "local-np",
                len(route.short_circuit),
                len(route.endpoints),
            )
            old = before.backends(claim, chain)
            elements.append((chain.dests, key, None))
            elements.extend(_indexed(chain.backends, key, route.short_circuit, old))
            elements.extend(_indexed(chain.backends, key, route.endpoints, old, LOCAL_OFFSET))
        else:
            chain = LBChain("external-ip" if by_ip else "external-np", len(route.endpoints))
            old = before.backends(claim, chain)
            elements.append((chain.dests, key, None))
            elements.extend(_indexed(chain.backends, key, route.endpoints, old))
    if not route.endpoints:
        # No endpoints at all (reject), or none on this node for Local policy (drop
        # whatever the chain above did not short-circuit).
        no_endpoints = NO_ENDPOINT_SERVICES if by_ip else NO_ENDPOINT_NODEPORTS
        elements.append((no_endpoints, key, _unreachable(route)))
    if frontend.source_ranges:
        elements.append((FIREWALL_IPS, key, None))
        elements.extend((FIREWALL_ALLOW, f"{key} . {r}", None) for r in frontend.source_ranges)
    return Destination(claim, tuple(elements), chain)


class _Before:
    """The backends elements a ServicePort's destinations had, as programmed."""

    def __init__(self, previous: PortRules | None) -> None:
        self.destinations = (
            {d.claim: d for d in previous.destinations} if previous is not None else {}
        )

    def backends(self, claim: Claim, chain: LBChain) -> dict[str, str]:
        """Key -> endpoint of the destination's elements in ``chain``'s backends map
        (none if it used another chain: another map, whose indexes mean nothing here)."""
        dest = self.destinations.get(claim)
        if dest is None or dest.chain != chain:
            return {}
        return {k: v for m, k, v in dest.elements if m == chain.backends and v is not None}


def _indexed(
    map_name: str,
    key: str,
    endpoints: tuple[Endpoint, ...],
    before: Mapping[str, str],
    offset: int = 0,
) -> list[Element]:
    """The endpoints at indexes ``offset`` .. ``offset + len(endpoints) - 1``.

    An endpoint keeps the index it had in ``before`` (the programmed elements) while
    that index is still in range, and the others fill the free indexes in the plan's
    order: a changed endpoint costs one element, where indexing in address order would
    shift every endpoint after it (and rewrite about half of a Service's elements).
    Which index holds which endpoint does not change what a packet meets: the index is
    ``numgen random mod N``.
    """
    values = [f"{ep.ip} . {ep.port}" for ep in endpoints]
    if not before:
        return [(map_name, f"{key} . {offset + i}", v) for i, v in enumerate(values)]
    wanted = Counter(values)
    slots: list[str | None] = [None] * len(values)
    for i in range(len(values)):
        old = before.get(f"{key} . {offset + i}")
        if old is not None and wanted[old] > 0:
            slots[i] = old
            wanted[old] -= 1
    newcomers: list[str] = []
    for v in values:
        if wanted[v] > 0:
            newcomers.append(v)
            wanted[v] -= 1
    free = iter(newcomers)
    return [
        (map_name, f"{key} . {offset + i}", v if v is not None else next(free))
        for i, v in enumerate(slots)
    ]


def _short_hash(text: str, size: int = 12) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return base64.b32encode(digest).decode()[:size].lower()


class _Affinity:
    """Chains and sets of one ServicePort with sessionAffinity ClientIP (as upstream).

    Each usable endpoint gets a chain that remembers the client in a dynamic set with the
    affinity timeout and DNATs to the endpoint; a "pick" chain per endpoint set sends a
    client found in one of those sets back to its endpoint, anyone else to a random one.
    Affinity is per client and ServicePort, whichever of its addresses the client used.
    Names are hashes of the ServicePort (and endpoint): no user string reaches the script.
    """

    def __init__(self, plan: ServicePortPlan, fam: FamilyPlan) -> None:
        self.plan = plan
        self.fam = fam
        self.timeout = plan.affinity_timeout or 0
        self.id = _short_hash(str(plan.name))
        sel = plan.selection
        self.cluster = sel.cluster
        self.local = sel.local

    def _ep_id(self, ep: Endpoint) -> str:
        return _short_hash(f"{self.plan.name}|{ep}")

    def goto(self, front: str) -> str:
        return f"goto aff-{self.id}-{front}"

    def sets(self) -> tuple[AffinitySet, ...]:
        return tuple(
            AffinitySet(f"affset-{self._ep_id(ep)}-{self.timeout}", self.timeout)
            for ep in self.plan.selection.all_reachable
        )

    def chains(self) -> tuple[ChainDef, ...]:
        v = Vocabulary.of(self.fam.family)
        proto = self.plan.service_port.protocol.nft
        out: list[ChainDef] = []
        for ep in self.plan.selection.all_reachable:
            eid = self._ep_id(ep)
            out.append(
                ChainDef(
                    f"affep-{eid}",
                    (
                        f"update @affset-{eid}-{self.timeout} {{ {v.ip} saddr }}",
                        f"meta l4proto {proto} dnat {v.ip} to {ep}",
                    ),
                )
            )
        picks = {"c": self.cluster, "l": self.local}
        for suffix, eps in picks.items():
            if not eps:
                continue
            rules = [
                f"{v.ip} saddr @affset-{self._ep_id(ep)}-{self.timeout} "
                f"goto affep-{self._ep_id(ep)}"
                for ep in eps
            ]
            vmap = ", ".join(f"{i} : goto affep-{self._ep_id(ep)}" for i, ep in enumerate(eps))
            rules.append(f"numgen random mod {len(eps)} vmap {{ {vmap} }}")
            out.append(ChainDef(f"aff-{self.id}-{suffix}", tuple(rules)))
        to_cluster = f"goto aff-{self.id}-c" if self.cluster else None
        to_local = f"goto aff-{self.id}-l" if self.local else None
        # Front chains: the traffic-policy logic of each kind of destination this
        # ServicePort has (only those it has, so no chain is left unreferenced).
        plan = self.plan
        internal = to_local if plan.internal.policy is TrafficPolicy.LOCAL else to_cluster
        fronts: dict[str, list[str]] = {}
        if internal and plan.internal.endpoints:
            fronts["ci"] = policy_rules("cluster-ip", self.fam, internal)
        ext = plan.external
        if ext is not None and (ext.endpoints or ext.short_circuit):
            if ext.policy is TrafficPolicy.LOCAL:
                fronts["xl"] = policy_rules("local", self.fam, to_cluster, to_local)
            else:
                fronts["x"] = policy_rules("external", self.fam, to_cluster)
        out.extend(
            ChainDef(f"aff-{self.id}-{name}", tuple(rules)) for name, rules in fronts.items()
        )
        return tuple(out)
