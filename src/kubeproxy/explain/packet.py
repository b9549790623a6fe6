"""One packet's fate, decided from the service plan the proxy programs (pure).

:func:`explain` takes a :class:`Packet` (source, destination, port, protocol, optionally
the interface it arrives on), the :class:`~kubeproxy.model.plan.FamilyPlan` of its
family and the :class:`~kubeproxy.model.plan.ServicePortPlan` of every ServicePort, and
walks the same decisions the rules make, in the same order:

1. **Origin** — this node, a local Pod or outside, as the rules tell them apart: "local
   Pod" is the family's local-traffic detector (``--detect-local-mode``; tested first,
   as the rules do), "this node" a source among the node's addresses (the rules' ``fib
   saddr type local`` / ``--src-type LOCAL``). ``origin=`` overrides the inference.
2. **Firewall** — a load-balancer IP with ``loadBalancerSourceRanges`` drops other
   sources before anything else.
3. **Frontend** — a ClusterIP / external IP / load-balancer IP (address, protocol and
   port), else a NodePort on one of the node's NodePort addresses.
4. **Route** — the plan's internal (ClusterIP) or external route: traffic policy, the
   Local-policy short-circuit of local Pods and the node, the endpoints with their
   probabilities, masquerading (per endpoint: a Pod reaching itself is masqueraded), or
   DROP / REJECT and why.
5. **Nothing matched** — why not (a near miss: other port, not a NodePort address...),
   and in nftables mode the ClusterIP and service-range checks (REJECT / DROP).

Where the proxy modes differ (``mode``: ``nftables``, ``iptables``, ``ipvs`` or
``kernelspace``), the difference is upstream's, the reason says so, and the mode states
it in its :class:`~kubeproxy.backends.inspection.PacketRules` (this module compares no
mode name). ipvs mode (:func:`_decide_virtual_server`) has no short-circuit and no DROP for
Local policies: a virtual server's real servers are the route's endpoints, or the
cluster-wide ones when a Local policy has none on this node (kubernetes#97081); without
any it refuses; its masquerading follows its ipsets. kernelspace mode
(:func:`_decide_load_balancer`, Windows' HNS) meets the load balancer the mode's own
translation makes for the frontend (``PacketRules.load_balancers``), or none: upstream
makes none without endpoints, so HNS leaves the packet alone (``NONE``).

The result is an :class:`Explanation`: data for
the text and JSON printers (:mod:`kubeproxy.explain.output`) and for the mode's kernel
objects (its :class:`~kubeproxy.backends.inspection.Inspector`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from kubeproxy.backends.inspection import (
    HnsLoadBalancer,
    PacketRules,
    VirtualServerNames,
)
from kubeproxy.backends.registry import inspector
from kubeproxy.model.fate import (
    Candidate,
    Explanation,
    NodeAddresses,
    Origin,
    Outcome,
    Packet,
    excluded_endpoints,
    selection_reasons,
)
from kubeproxy.model.plan import (
    FamilyPlan,
    Frontend,
    FrontendKind,
    Masquerade,
    Route,
    ServicePortPlan,
    Verdict,
)
from kubeproxy.model.types import (
    Endpoint,
    IPFamily,
    L4Protocol,
    ServicePortName,
    TrafficPolicy,
    family_of,
)

# ---------------------------------------------------------------------- origin


@dataclass(frozen=True, slots=True)
class _Source:
    origin: Origin
    pod_rule: bool  # the local-traffic detector matches
    node_rule: bool  # the source is a local address
    reason: str


def _in_cidrs(ip: str, cidrs: Iterable[str]) -> bool:
    addr = ipaddress.ip_address(ip)
    return any(addr in ipaddress.ip_network(c) for c in cidrs)


def _classify(
    packet: Packet, fam: FamilyPlan, node: NodeAddresses, override: Origin | None
) -> _Source:
    local = fam.local
    if override is not None:
        pod = override is Origin.POD and local.implemented
        why = f"origin {override.value} (given)"
        if override is Origin.POD and not local.implemented:
            why += (
                f"; but local Pod traffic is {local.describe()}, so the rules treat it as "
                "coming from outside"
            )
        return _Source(override, pod, override is Origin.NODE, why)
    if local.cidrs and _in_cidrs(packet.src, local.cidrs):
        return _Source(
            Origin.POD, True, node.owns(packet.src), f"from a local Pod: {local.describe()}"
        )
    if local.interface is not None and packet.in_interface is not None:
        name = packet.in_interface
        hit = name.startswith(local.interface) if local.prefix else name == local.interface
        if hit:
            return _Source(
                Origin.POD, True, node.owns(packet.src), f"from a local Pod: {local.describe()}"
            )
    if node.owns(packet.src):
        return _Source(Origin.NODE, False, True, f"from this node: {packet.src} is a node address")
    why = (
        f"from outside: {packet.src} is not a node address, and local Pods are told by "
        f"{local.describe()}"
    )
    if local.interface is not None and packet.in_interface is None:
        why += " (give --in-interface, or --origin pod)"
    return _Source(Origin.OUTSIDE, False, False, why)


# ------------------------------------------------------------------- frontends


def _nodeport_address(dst: str, fam: FamilyPlan, node: NodeAddresses) -> tuple[bool, str]:
    """Whether the rules treat ``dst`` as a NodePort address, and why (not)."""
    ports = fam.node_ports
    if not ports.enabled:
        return False, f"NodePorts are not served in {fam.family.value}"
    if ipaddress.ip_address(dst).is_loopback:
        if fam.localhost_nodeports:
            return True, f"{dst} is loopback and localhost NodePorts are on (iptables mode)"
        return False, (
            f"{dst} is loopback: NodePorts are never served there in nftables or ipvs mode, "
            "nor in iptables mode with --iptables-localhost-nodeports=false or IPv6"
        )
    if ports.match_all:
        if node.owns(dst):
            return True, f"{dst} is a node address and NodePorts are served on every one"
        known = "the node's addresses" if node.complete else "the Node object's primary IPs"
        return False, f"{dst} is not one of {known} ({', '.join(sorted(node.addresses)) or 'none'})"
    if not _in_cidrs(dst, ports.ranges):
        return False, f"{dst} is not in --nodeport-addresses ({', '.join(ports.ranges)})"
    if node.complete and dst not in node.addresses:
        return False, f"{dst} is in --nodeport-addresses but is not an address of this node"
    return True, f"{dst} is in --nodeport-addresses ({', '.join(ports.ranges)})"


def _matches(
    packet: Packet, plans: Sequence[ServicePortPlan], nodeport_ok: bool
) -> list[tuple[ServicePortPlan, Frontend]]:
    """Frontends capturing the packet, service IPs before NodePorts (as the rules)."""
    by_ip: list[tuple[ServicePortPlan, Frontend]] = []
    by_port: list[tuple[ServicePortPlan, Frontend]] = []
    for plan in plans:
        if plan.service_port.protocol is not packet.protocol:
            continue
        for f in plan.frontends:
            if f.port != packet.port:
                continue
            if f.kind is FrontendKind.NODE_PORT:
                if nodeport_ok:
                    by_port.append((plan, f))
            elif f.ip == packet.dst:
                by_ip.append((plan, f))
    return by_ip + by_port


# ----------------------------------------------------------------------- routes


def _unreachable(route: Route, what: str) -> tuple[Outcome, str]:
    if route.verdict is Verdict.DROP:
        return Outcome.DROP, (
            f"{what}: endpoints exist, but none on this node for {route.policy.value} "
            "traffic policy: DROP"
        )
    return Outcome.REJECT, f"{what}: no usable endpoint anywhere: REJECT"


@dataclass(frozen=True, slots=True)
class _Context:
    packet: Packet
    fam: FamilyPlan
    rules: PacketRules
    src: _Source
    node: NodeAddresses
    scheduler: str = "rr"


def _decide(
    ctx: _Context, plan: ServicePortPlan, frontend: Frontend, family_eps: Sequence[Endpoint]
) -> Explanation:
    packet, fam, rules, src, node = ctx.packet, ctx.fam, ctx.rules, ctx.src, ctx.node
    mode = rules.mode
    reasons = [src.reason]
    name = plan.name
    reasons.append(f"matches {frontend.kind.value} {frontend} of {name}")
    if frontend.kind is FrontendKind.LOAD_BALANCER and frontend.source_ranges:
        allowed = _in_cidrs(packet.src, frontend.source_ranges)
        applies = rules.firewall_without_endpoints or plan.selection.has_any
        ranges = ", ".join(frontend.source_ranges)
        if not allowed and applies:
            reasons.append(f"loadBalancerSourceRanges ({ranges}) do not include {packet.src}: DROP")
            return Explanation(
                packet, mode, src.origin, Outcome.DROP, tuple(reasons), plan, frontend, "external"
            )
        if allowed:
            reasons.append(f"{packet.src} is in loadBalancerSourceRanges ({ranges})")

    masq_why = ""
    if frontend.kind is FrontendKind.CLUSTER_IP:
        route = plan.internal
        kind = "internal"
        what = f"internalTrafficPolicy {route.policy.value}"
        used = route.endpoints
        reasons.append(
            f"{what}: "
            + (
                "this node's endpoints only"
                if route.policy is TrafficPolicy.LOCAL
                else "endpoints cluster-wide"
            )
        )
        if route.masquerade is Masquerade.ALWAYS:
            masq, masq_why = True, "masqueraded: --masquerade-all"
        elif route.masquerade is Masquerade.UNLESS_LOCAL:
            masq = not src.pod_rule
            masq_why = (
                "not masqueraded: from a local Pod"
                if not masq
                else "masqueraded: not from a local Pod (replies must come back through this node)"
            )
        else:
            masq, masq_why = False, f"not masqueraded: local Pod traffic is {fam.local.describe()}"
    else:
        ext = plan.external
        assert ext is not None
        route = ext
        what = f"externalTrafficPolicy {route.policy.value}"
        if route.policy is TrafficPolicy.CLUSTER:
            kind, used, masq = "external", route.endpoints, True
            reasons.append(f"{what}: endpoints cluster-wide")
            masq_why = (
                "masqueraded: external traffic with Cluster policy "
                "(the endpoint may be on another node)"
            )
        elif src.pod_rule and route.short_circuit:
            kind, used, masq = "short-circuit", route.short_circuit, False
            reasons.append(
                f"{what}, but from a local Pod: short-circuited to the endpoints cluster-wide, "
                "as if it had gone out to the load balancer and back"
            )
            masq_why = "not masqueraded: from a local Pod"
        elif src.node_rule and route.short_circuit:
            kind, used, masq = "short-circuit", route.short_circuit, True
            reasons.append(
                f"{what}, but from this node: short-circuited to the endpoints cluster-wide"
            )
            masq_why = "masqueraded: the node's own connection (its source is a local address)"
        else:
            kind, used, masq = "external", route.endpoints, False
            reasons.append(f"{what}: this node's endpoints only")
            masq_why = "not masqueraded: the client's address is kept (Local policy)"

    reasons.extend(selection_reasons(plan, fam, route, used))
    local_only = route.policy is TrafficPolicy.LOCAL and kind != "short-circuit"
    excluded = excluded_endpoints(plan, fam, family_eps, used, local_only)
    if not used:
        verdict, why = _unreachable(route, what)
        if (
            rules.external_rejects_off_output is not None
            and frontend.kind is not FrontendKind.CLUSTER_IP
            and frontend.kind is not FrontendKind.NODE_PORT
            and src.node_rule
            and not node.owns(packet.dst)
        ):
            verdict = Outcome.NONE
            why += (
                f" -- except for the node's own connections in {mode} mode "
                f"({rules.external_rejects_off_output} is not on the OUTPUT path, as "
                "upstream): not touched"
            )
        reasons.append(why)
        return Explanation(
            packet, mode, src.origin, verdict, tuple(reasons), plan, frontend, kind, (), excluded
        )

    hairpin = set(plan.hairpin)
    candidates = []
    for ep in used:
        self_ = packet.src == ep.ip and (rules.masquerade_every_self_dnat or ep.ip in hairpin)
        candidates.append(Candidate(ep, 1 / len(used), masq or self_))
    reasons.append(f"DNAT to one of {len(used)} endpoint(s), each with probability 1/{len(used)}")
    reasons.append(masq_why)
    if any(c.masquerade and not masq for c in candidates):
        reasons.append(f"masqueraded when DNATed to {packet.src} itself (hairpin)")
    return Explanation(
        packet,
        mode,
        src.origin,
        Outcome.DNAT,
        tuple(reasons),
        plan,
        frontend,
        kind,
        tuple(candidates),
        excluded,
        all(c.masquerade for c in candidates),
    )


def _ipvs_masquerade(
    ctx: _Context, names: VirtualServerNames, plan: ServicePortPlan, frontend: Frontend
) -> tuple[bool, str]:
    """ipvs mode's masquerade decision, as its ipsets make it (before hairpin)."""
    fam, src = ctx.fam, ctx.src
    if frontend.kind is FrontendKind.CLUSTER_IP:
        if fam.masquerade_all:
            return True, f"masqueraded: --masquerade-all ({names.cluster_ip_set})"
        if fam.local.implemented:
            if src.pod_rule:
                return False, "not masqueraded: from a local Pod"
            return True, f"masqueraded: not from a local Pod ({names.cluster_ip_set})"
        if src.node_rule:
            return True, (
                "masqueraded: the node's own connection (without a local-traffic detector "
                f"{names.cluster_ip_set} matches src,dst: its source is the Service IP)"
            )
        return False, f"not masqueraded: local Pod traffic is {fam.local.describe()}"
    ext = plan.external
    assert ext is not None
    sets = {
        FrontendKind.EXTERNAL_IP: names.external_ip_sets,
        FrontendKind.LOAD_BALANCER: names.load_balancer_sets,
        FrontendKind.NODE_PORT: names.node_port_sets,
    }[frontend.kind]
    if ext.policy is TrafficPolicy.LOCAL:
        return False, f"not masqueraded: the client's address is kept ({sets[1]}, Local policy)"
    return True, f"masqueraded: external traffic with Cluster policy ({sets[0]})"


def _scheduling(scheduler: str, count: int) -> str:
    if scheduler in ("rr", "wrr"):
        return f"IPVS {scheduler}: the {count} real server(s) in turn (weight 1 each)"
    if scheduler in ("sh", "mh"):
        what = "source address" if scheduler == "sh" else "source address and port (mh-port)"
        return f"IPVS {scheduler}: one of {count} real server(s) by a hash of the {what}"
    return f"IPVS {scheduler}: one of {count} real server(s) by its connection counts"


def _decide_virtual_server(
    ctx: _Context, plan: ServicePortPlan, frontend: Frontend, family_eps: Sequence[Endpoint]
) -> Explanation:
    """ipvs mode: the virtual server ``frontend`` is, and its real servers."""
    packet, fam, src = ctx.packet, ctx.fam, ctx.src
    names = ctx.rules.virtual_servers
    assert names is not None
    reasons = [src.reason, f"matches virtual server {frontend} of {plan.name}"]
    if frontend.kind is FrontendKind.LOAD_BALANCER and frontend.source_ranges:
        ranges = ", ".join(frontend.source_ranges)
        if not _in_cidrs(packet.src, frontend.source_ranges):
            reasons.append(
                f"loadBalancerSourceRanges ({ranges}) do not include {packet.src}: DROP "
                f"({names.source_ranges_firewall})"
            )
            return Explanation(
                packet, ctx.rules.mode, src.origin, Outcome.DROP, tuple(reasons), plan, frontend,
                "external",
            )  # fmt: skip
        reasons.append(f"{packet.src} is in loadBalancerSourceRanges ({ranges})")
    internal = frontend.kind is FrontendKind.CLUSTER_IP
    route = plan.internal if internal else plan.external
    assert route is not None
    kind = "internal" if internal else "external"
    what = f"{'internal' if internal else 'external'}TrafficPolicy {route.policy.value}"
    used = route.endpoints
    local_only = route.policy is TrafficPolicy.LOCAL
    if local_only and used:
        reasons.append(f"{what}: this node's endpoints only")
    elif local_only:
        used, local_only = route.fallback, False
        reasons.append(
            f"{what}, but no endpoint on this node: the endpoints cluster-wide, as "
            "upstream's ipvs mode (kubernetes#97081)"
            + ("" if used else "; this Service uses none (a ClusterIP-only Local policy)")
        )
    else:
        reasons.append(f"{what}: endpoints cluster-wide")
    reasons.extend(selection_reasons(plan, fam, route, used))
    excluded = excluded_endpoints(plan, fam, family_eps, used, local_only)
    if not used:
        reasons.append(
            "the virtual server has no real server: IPVS answers a new connection with "
            "ICMP port unreachable: REJECT"
        )
        return Explanation(
            packet, ctx.rules.mode, src.origin, Outcome.REJECT, tuple(reasons), plan, frontend,
            kind, (), excluded,
        )  # fmt: skip
    masq, masq_why = _ipvs_masquerade(ctx, names, plan, frontend)
    hairpin = set(plan.hairpin)
    candidates = tuple(
        Candidate(ep, 1 / len(used), masq or (packet.src == ep.ip and ep.ip in hairpin))
        for ep in used
    )
    reasons.append(_scheduling(ctx.scheduler, len(used)))
    reasons.append(masq_why)
    if any(c.masquerade and not masq for c in candidates):
        reasons.append(
            f"masqueraded when sent to {packet.src} itself (hairpin: {names.loop_back_set})"
        )
    return Explanation(
        packet, ctx.rules.mode, src.origin, Outcome.DNAT, tuple(reasons), plan, frontend, kind,
        candidates, excluded, all(c.masquerade for c in candidates),
    )  # fmt: skip


def _hns_delivery(lb: HnsLoadBalancer, used: Sequence[Endpoint]) -> list[str]:
    """How the load balancer hands the connection over: distribution, port, DSR or the
    source VIP (as upstream's flags ask HNS; HNS's own choice is not modelled)."""
    out = [
        f"DNAT to one of {len(used)} endpoint(s) by HNS, each shown with probability "
        f"1/{len(used)} (HNS's spread of connections is its own: approximate)"
    ]
    if lb.source_ip_distribution:
        out.append(
            "sessionAffinity ClientIP: DistributionType SourceIP, a client's connections "
            "go to the same endpoint (HNS takes no timeout: upstream passes none)"
        )
    if any(ep.port != lb.internal_port for ep in used):
        out.append(
            f"HNS delivers to port {lb.internal_port} on every endpoint (one internal port "
            "per load balancer: the first endpoint's, as upstream)"
        )
    if lb.dsr:
        out.append(
            "DSR: the endpoint answers the client directly; the client's address is kept "
            "(not source-NATed)"
        )
    else:
        out.append(
            f"no DSR: the connection is source-NATed to the load balancer's source VIP "
            f"{lb.source_vip} so that replies come back through it (approximate: which "
            "connections HNS NATs is HNS's)"
        )
    return out


def _decide_load_balancer(
    ctx: _Context, plan: ServicePortPlan, frontend: Frontend, family_eps: Sequence[Endpoint]
) -> Explanation:
    """kernelspace mode: the HNS load balancer ``frontend`` is (the mode's translation
    says which, and its endpoints), or none: upstream makes none without endpoints, and
    HNS leaves the packet alone. No short-circuit, no DROP or REJECT, no source-range
    filter (upstream's winkernel programs none)."""
    packet, fam, src = ctx.packet, ctx.fam, ctx.src
    hns = ctx.rules.load_balancers
    assert hns is not None
    mode = ctx.rules.mode
    reasons = [src.reason, f"matches {frontend.kind.value} {frontend} of {plan.name}"]
    if frontend.kind is FrontendKind.LOAD_BALANCER and frontend.source_ranges:
        reasons.append(
            f"loadBalancerSourceRanges ({', '.join(frontend.source_ranges)}) are not "
            f"enforced: an HNS load balancer has no source filter (upstream's winkernel "
            "programs none)"
        )
    internal = frontend.kind is FrontendKind.CLUSTER_IP
    route = plan.internal if internal else plan.external
    assert route is not None
    kind = "internal" if internal else "external"
    what = f"{kind}TrafficPolicy {route.policy.value}"
    lb = hns.find(plan, frontend, fam)
    if lb is None:
        reasons.append(
            f"{what} leaves it no endpoint, and upstream creates no HNS load balancer "
            "without endpoints ('not applying any policy'): HNS does not touch the packet, "
            f"which goes on to {packet.dst} as addressed"
        )
        excluded = excluded_endpoints(
            plan, fam, family_eps, (), route.policy is TrafficPolicy.LOCAL
        )
        return Explanation(
            packet, mode, src.origin, Outcome.NONE, tuple(reasons), plan, frontend, kind,
            (), excluded,
        )  # fmt: skip
    reasons[1] += f": HNS load balancer {lb.name} ({hns.network})"
    ips = set(lb.endpoint_ips)
    used = tuple(ep for ep in route.endpoints if ep.ip in ips)
    local_only = route.policy is TrafficPolicy.LOCAL or len(used) < len(route.endpoints)
    scope = "this node's endpoints only" if local_only else "endpoints cluster-wide"
    reasons.append(f"{what}: {scope}")
    if len(used) < len(route.endpoints):
        reasons.append("preserve-destination: the load balancer keeps this node's endpoints")
    reasons.extend(selection_reasons(plan, fam, route, used, affinity=False))
    reasons.extend(_hns_delivery(lb, used))
    excluded = excluded_endpoints(plan, fam, family_eps, used, local_only)
    masq = not lb.dsr
    candidates = tuple(Candidate(ep, 1 / len(used), masq) for ep in used)
    return Explanation(
        packet, mode, src.origin, Outcome.DNAT, tuple(reasons), plan, frontend, kind,
        candidates, excluded, masq,
    )  # fmt: skip


# -------------------------------------------------------------------- no match


def _no_match(
    ctx: _Context, plans: Sequence[ServicePortPlan], nodeport: tuple[bool, str]
) -> Explanation:
    packet, fam, rules, src = ctx.packet, ctx.fam, ctx.rules, ctx.src
    mode = rules.mode
    reasons = [src.reason]
    proto, port, dst = packet.protocol, packet.port, packet.dst
    owners = [p for p in plans if dst in {f.ip for f in p.frontends}]
    if owners:
        have = sorted({f"{p.service_port.port}/{p.service_port.protocol.value}" for p in owners})
        names = sorted({str(p.name.service) for p in owners})
        reasons.append(
            f"{dst} belongs to {', '.join(names)}, which has no port {port}/{proto.value} "
            f"(ports: {', '.join(have)})"
        )
    same_port = [p for p in plans if p.service_port.node_port == port]
    if same_port:
        p = same_port[0]
        if p.service_port.protocol is not proto:
            reasons.append(
                f"{port} is the NodePort of {p.name}, but for {p.service_port.protocol.value}"
            )
        elif not nodeport[0]:
            reasons.append(f"{port} is the NodePort of {p.name}, but {nodeport[1]}")
        elif not any(f.kind is FrontendKind.NODE_PORT for f in p.frontends):
            reasons.append(f"{port} is the NodePort of {p.name}, not served in {fam.family.value}")
    if not owners and not same_port:
        reasons.append(f"no Service has {dst}:{port}/{proto.value} (nor a NodePort {port})")

    cluster_ips = {p.cluster_ip for p in plans}
    verdict = Outcome.NONE
    health = [p for p in plans if p.service_port.health_check_node_port == port]
    bound = {
        f.ip
        for p in plans
        for f in p.frontends
        if f.kind is not FrontendKind.NODE_PORT and f.ip and not ctx.node.owns(f.ip)
    }
    vs = rules.virtual_servers
    if vs is not None and dst in bound and not (health and nodeport[0]):
        verdict = Outcome.REJECT
        reasons.append(
            f"{dst} is on {vs.dummy_device}: new connections to a port no Service uses "
            f"are rejected ({vs.filter_chain}, kubernetes#72236): REJECT"
        )
    elif health and proto is L4Protocol.TCP and nodeport[0]:
        reasons.append(f"{port} is the healthCheckNodePort of {health[0].name.service}")
        if rules.health_check_accept_chain is not None:
            verdict = Outcome.ACCEPT
            reasons.append(
                "accepted for kubeproxy's health server "
                f"(filter {rules.health_check_accept_chain}): ACCEPT"
            )
        else:
            reasons.append("kubeproxy's health server answers it; no rule is needed")
    elif dst in cluster_ips:
        if rules.reject_other_cluster_ip_ports is not None:
            verdict = Outcome.REJECT
            reasons.append(
                f"{dst} is an allocated ClusterIP: other ports are rejected "
                f"({rules.reject_other_cluster_ip_ports}): REJECT"
            )
        else:
            reasons.append(
                f"{dst} is an allocated ClusterIP, but {mode} mode (as upstream) leaves "
                "other ports alone: not touched"
            )
    elif fam.service_cidrs and _in_cidrs(dst, fam.service_cidrs):
        if rules.drop_unallocated_service_ips:
            verdict = Outcome.DROP
            reasons.append(
                f"{dst} is in a service IP range ({', '.join(fam.service_cidrs)}) but "
                "allocated to nothing: DROP"
            )
        else:
            reasons.append(
                f"{dst} is in a service IP range, but {mode} mode (as upstream) leaves it "
                "alone: not touched"
            )
    else:
        reasons.append("kubeproxy's rules do not touch it")
    return Explanation(packet, mode, src.origin, verdict, tuple(reasons))


Decide = Callable[[_Context, ServicePortPlan, Frontend, Sequence[Endpoint]], Explanation]


def _decider(rules: PacketRules) -> Decide:
    if rules.load_balancers is not None:
        return _decide_load_balancer
    return _decide if rules.virtual_servers is None else _decide_virtual_server


# ---------------------------------------------------------------- one frontend


# A client with nothing to do with the node (documentation ranges, RFC 5737 / 3849).
_OUTSIDE_CLIENT = {IPFamily.IPv4: "203.0.113.1", IPFamily.IPv6: "2001:db8::1"}


def explain_frontend(
    plan: ServicePortPlan,
    frontend: Frontend,
    fam: FamilyPlan,
    endpoints: Mapping[ServicePortName, Sequence[Endpoint]],
    *,
    mode: str = "nftables",
    origin: Origin = Origin.OUTSIDE,
    node_ip: str | None = None,
    scheduler: str = "rr",
    rules: PacketRules | None = None,
) -> Explanation:
    """A new connection to ``frontend`` of ``plan`` from ``origin`` (``list --live``: what
    each frontend's rules are, without a packet to match). The client is allowed by the
    frontend's source ranges; a NodePort is reached on ``node_ip`` (ipvs mode has one
    virtual server per node address). ``rules``: the mode's, as its inspector has them
    for this node (default: ``mode``'s)."""
    src = _OUTSIDE_CLIENT[fam.family]
    if frontend.source_ranges:
        net = ipaddress.ip_network(frontend.source_ranges[0])
        src = str(net.network_address if net.num_addresses == 1 else net[1])
    dst = frontend.ip or node_ip or _OUTSIDE_CLIENT[fam.family]
    packet = Packet(src, dst, frontend.port, plan.service_port.protocol)
    node = NodeAddresses(frozenset({node_ip} if node_ip else ()))
    rules = rules or inspector(mode).rules
    ctx = _Context(packet, fam, rules, _classify(packet, fam, node, origin), node, scheduler)
    want_v6 = fam.family is IPFamily.IPv6
    family_eps = [ep for ep in endpoints.get(plan.name, ()) if (":" in ep.ip) is want_v6]
    return _decider(rules)(ctx, plan, frontend, family_eps)


# ------------------------------------------------------------------------ entry


_UNKNOWN_NODE = NodeAddresses()


def explain(
    packet: Packet,
    fam: FamilyPlan,
    plans: Iterable[ServicePortPlan],
    endpoints: Mapping[ServicePortName, Sequence[Endpoint]],
    *,
    mode: str = "nftables",
    node: NodeAddresses = _UNKNOWN_NODE,
    origin: Origin | None = None,
    scheduler: str = "rr",
    rules: PacketRules | None = None,
) -> Explanation:
    """The fate of ``packet``. ``plans``: every ServicePort's plan in ``fam.family``;
    ``scheduler``: ipvs mode's ``--ipvs-scheduler``; ``rules``: the mode's, as its
    inspector has them for this node (kernelspace: its HNS network; default:
    ``mode``'s)."""
    rules = rules or inspector(mode).rules
    if family_of(packet.src) is not packet.family or fam.family is not packet.family:
        raise ValueError(f"{packet.src} and {packet.dst} must both be {fam.family.value}")
    ordered = sorted(plans, key=lambda p: p.name)
    src = _classify(packet, fam, node, origin)
    nodeport = _nodeport_address(packet.dst, fam, node)
    matches = _matches(packet, ordered, nodeport[0])
    ctx = _Context(packet, fam, rules, src, node, scheduler)
    if not matches:
        return _no_match(ctx, ordered, nodeport)
    plan, frontend = matches[0]
    want_v6 = fam.family is IPFamily.IPv6
    family_eps = [ep for ep in endpoints.get(plan.name, ()) if (":" in ep.ip) is want_v6]
    result = _decider(rules)(ctx, plan, frontend, family_eps)
    extra: list[str] = []
    if frontend.kind is FrontendKind.NODE_PORT:
        extra.append(nodeport[1])
    others = [str(p.name) for p, f in matches[1:] if f.kind is frontend.kind]
    if others:
        extra.append(f"also claimed by {', '.join(others)} (a conflict: only one is programmed)")
    if extra:
        result = replace(result, reasons=(*result.reasons[:2], *extra, *result.reasons[2:]))
    return result
