"""Service plans → the IPVS state, ipset members and iptables rules ipvs mode wants (pure).

:func:`contribution` gives one :class:`~kubeproxy.model.plan.ServicePortPlan`'s part, as
upstream's ipvs proxier walks its service map:

* one virtual server per (address, protocol, port): the ClusterIP, each external IP, each
  load-balancer IP, and the NodePort on each node address (:class:`Context`: the node's
  addresses that ``--nodeport-addresses`` selects, loopback and IPv6 link-local left
  out), with the configured scheduler, ``mh``'s source-port flag, and persistence with
  the affinity timeout for ``sessionAffinity: ClientIP``;
* its real servers, weight 1 (NAT): the route's endpoints; for a Local policy without a
  local endpoint, the cluster-wide ones (upstream's ipvs mode, kubernetes#97081: local
  Pods can still reach the Service); no endpoint at all leaves the virtual server empty,
  and the kernel answers new connections with ICMP port unreachable;
* the addresses bound to ``kube-ipvs0``: service addresses, except an external or
  load-balancer IP that is already a node address;
* the members of upstream's ipsets (:mod:`.names`).

:class:`DesiredState` sums the parts (:func:`desired_state`: every plan, by name, the
first claim of a virtual server winning) and replaces one plan's part in place, counting
the addresses and set members plans share; what a replacement touched
(:class:`Touched`) is all a partial sync's diff looks at.

:func:`iptables_rules` gives the ``iptables-restore`` input of the fixed chains, which
depend only on which sets are empty (and the load balancers the node may not reach), as
upstream's ``writeIptablesRules``.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from kubeproxy.backends.iptables.render import local_args, mark
from kubeproxy.backends.ipvs import names as n
from kubeproxy.dataplane.ipset import member
from kubeproxy.dataplane.iptables.restore import Restore
from kubeproxy.dataplane.ipvs import (
    FLAG_PERSISTENT,
    FLAG_SCHED2,
    ServiceKey,
    VirtualServer,
)
from kubeproxy.model.plan import (
    FamilyPlan,
    FrontendKind,
    Route,
    ServicePortPlan,
)
from kubeproxy.model.types import IPFamily, ServicePortName, TrafficPolicy

Args = tuple[str, ...]
Endpoints = dict[tuple[str, int], int]  # (address, port) -> weight


Claim = tuple[ServiceKey, VirtualServer, Endpoints, bool]  # ..., bind to kube-ipvs0


@dataclass
class Contribution:
    """What one ServicePort plan wants: its virtual servers (a key two plans claim goes
    to the first by name), set members and the rest. Kept per plan, so that a partial
    sync replaces only the changed plans' part of :class:`DesiredState`."""

    claims: list[Claim] = field(default_factory=list)
    members: list[tuple[str, str]] = field(default_factory=list)  # (set, member)
    lb_no_node_access: list[tuple[str, str, int]] = field(default_factory=list)
    no_local_internal: int = 0
    no_local_external: int = 0


@dataclass
class DesiredState:
    """What one family wants in the kernel: the sum of every plan's
    :class:`Contribution` (members and addresses counted, as plans share them)."""

    services: dict[ServiceKey, VirtualServer] = field(default_factory=dict)
    dests: dict[ServiceKey, Endpoints] = field(default_factory=dict)
    bind: set[str] = field(default_factory=set)
    # set name -> members (every set of the family, empty ones included)
    members: dict[str, set[str]] = field(default_factory=dict)
    owners: dict[ServiceKey, ServicePortName] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    no_local_internal: int = 0
    no_local_external: int = 0
    dest_count: int = 0
    _ipvs_ips: str = n.IPVS_IPS  # the family's name of the set of bound addresses
    contributions: dict[ServicePortName, Contribution] = field(default_factory=dict)
    # Keys more than one plan claims: a partial sync touching one re-renders everything.
    contested: set[ServiceKey] = field(default_factory=set)
    _refs: Counter[tuple[str, str]] = field(default_factory=Counter)
    _bind_refs: Counter[str] = field(default_factory=Counter)
    _no_access: dict[ServicePortName, list[tuple[str, str, int]]] = field(default_factory=dict)

    @property
    def lb_no_node_access(self) -> list[tuple[str, str, int]]:
        """Load-balancer (ip, protocol, port) whose source ranges leave the node out."""
        return [t for name in sorted(self._no_access) for t in self._no_access[name]]

    def add(self, name: ServicePortName, part: Contribution) -> Touched:
        """Add ``name``'s part (a claimed key already owned is a conflict: the owner
        keeps it, so plans must come sorted by name)."""
        touched = Touched()
        self.contributions[name] = part
        for key, vs, dests, bind in part.claims:
            touched.keys.add(key)
            owner = self.owners.get(key)
            if owner is not None:
                self.contested.add(key)
                self.conflicts.append(f"{key}: claimed by {owner} and {name}; {owner} keeps it")
                continue
            self.owners[key] = name
            self.services[key] = vs
            self.dests[key] = dests
            self.dest_count += len(dests)
            if bind:
                self._bind_refs[key.address] += 1
                if self._bind_refs[key.address] == 1:
                    self.bind.add(key.address)
                    touched.addresses.add(key.address)
                    touched.member(self._ipvs_ips, key.address)
                    self.members[self._ipvs_ips].add(key.address)
        for item in part.members:
            self._refs[item] += 1
            if self._refs[item] == 1:
                self.members[item[0]].add(item[1])
                touched.member(*item)
        if part.lb_no_node_access:
            self._no_access[name] = part.lb_no_node_access
        self.no_local_internal += part.no_local_internal
        self.no_local_external += part.no_local_external
        return touched

    def remove(self, name: ServicePortName) -> Touched:
        """Take ``name``'s part out (it must own every key it claimed: see
        :attr:`contested`)."""
        touched = Touched()
        part = self.contributions.pop(name, None)
        if part is None:
            return touched
        for key, _, dests, bind in part.claims:
            touched.keys.add(key)
            del self.owners[key], self.services[key], self.dests[key]
            self.dest_count -= len(dests)
            if bind:
                self._bind_refs[key.address] -= 1
                if not self._bind_refs[key.address]:
                    del self._bind_refs[key.address]
                    self.bind.discard(key.address)
                    self.members[self._ipvs_ips].discard(key.address)
                    touched.addresses.add(key.address)
                    touched.member(self._ipvs_ips, key.address)
        for item in part.members:
            self._refs[item] -= 1
            if not self._refs[item]:
                del self._refs[item]
                self.members[item[0]].discard(item[1])
                touched.member(*item)
        self._no_access.pop(name, None)
        self.no_local_internal -= part.no_local_internal
        self.no_local_external -= part.no_local_external
        return touched

    def shares_keys(self, name: ServicePortName, part: Contribution | None) -> bool:
        """Whether replacing ``name``'s part touches a key another plan claims too."""
        old = self.contributions.get(name)
        if old is not None and any(key in self.contested for key, *_ in old.claims):
            return True
        return part is not None and any(
            self.owners.get(key, name) != name for key, *_ in part.claims
        )


@dataclass
class Touched:
    """What a change of contributions may have changed: the diff looks only here."""

    keys: set[ServiceKey] = field(default_factory=set)
    addresses: set[str] = field(default_factory=set)
    members: dict[str, set[str]] = field(default_factory=dict)

    def member(self, set_name: str, value: str) -> None:
        self.members.setdefault(set_name, set()).add(value)

    def update(self, other: Touched) -> None:
        self.keys |= other.keys
        self.addresses |= other.addresses
        for name, values in other.members.items():
            self.members.setdefault(name, set()).update(values)


def virtual_server(key: ServiceKey, scheduler: str, affinity: int | None) -> VirtualServer:
    flags = 0
    timeout = 0
    if affinity is not None:
        flags |= FLAG_PERSISTENT
        timeout = affinity
    if scheduler == "mh":
        # upstream's FlagSourceHash: mh hashes the source port too (mh-port).
        flags |= FLAG_SCHED2
    return VirtualServer(key, scheduler, flags, timeout)


def real_servers(route: Route) -> Endpoints:
    """The route's endpoints, or the plan's fallback for a Local policy without local
    ones (IPVS has no per-source DROP)."""
    return {(ep.ip, ep.port): 1 for ep in route.endpoints_or_fallback}


def node_port_addresses(fam: FamilyPlan, node_addresses: Iterable[str]) -> list[str]:
    """The node addresses NodePort virtual servers go on (upstream: loopback and IPv6
    link-local never; others as --nodeport-addresses selects)."""
    nets = [ipaddress.ip_network(c) for c in fam.node_ports.ranges]
    out = []
    for text in node_addresses:
        ip = ipaddress.ip_address(text)
        if (ip.version == 6) != (fam.family is IPFamily.IPv6):
            continue
        if ip.is_loopback or (ip.version == 6 and ip.is_link_local):
            continue
        if fam.node_ports.match_all or any(ip in net for net in nets):
            out.append(str(ip))
    return sorted(out)


@dataclass(frozen=True)
class Context:
    """What every plan's contribution depends on besides the plan: one per sync."""

    fam: FamilyPlan
    scheduler: str
    local_addrs: frozenset[str]
    node_ips: tuple[str, ...]

    @classmethod
    def of(cls, fam: FamilyPlan, scheduler: str, node_addresses: Iterable[str]) -> Context:
        """``node_addresses``: every local address not on ``kube-ipvs0``."""
        local = frozenset(str(ipaddress.ip_address(a)) for a in node_addresses)
        node_ips = node_port_addresses(fam, local) if fam.node_ports.enabled else []
        return cls(fam, scheduler, local, tuple(node_ips))


def empty_state(fam: FamilyPlan) -> DesiredState:
    sets = n.FamilySets(fam.family is IPFamily.IPv6)
    members: dict[str, set[str]] = {spec.name: set() for spec in sets.specs()}
    return DesiredState(members=members, _ipvs_ips=sets.name(n.IPVS_IPS))


def desired_state(
    fam: FamilyPlan,
    plans: Iterable[ServicePortPlan],
    *,
    scheduler: str,
    node_addresses: Iterable[str],
) -> DesiredState:
    """``node_addresses``: every local address not on ``kube-ipvs0``."""
    ctx = Context.of(fam, scheduler, node_addresses)
    out = empty_state(fam)
    for plan in sorted(plans, key=lambda p: p.name):
        out.add(plan.name, contribution(ctx, plan))
    return out


def contribution(ctx: Context, plan: ServicePortPlan) -> Contribution:
    """One plan's virtual servers, real servers, addresses and set members."""
    fam = ctx.fam
    v6 = fam.family is IPFamily.IPv6
    sets = n.FamilySets(v6)
    out = Contribution(
        no_local_internal=plan.no_local_internal, no_local_external=plan.no_local_external
    )
    scheduler = ctx.scheduler

    def add(name: str, value: str) -> None:
        out.members.append((sets.name(name), value))

    def claim(key: ServiceKey, dests: Endpoints, bind: bool) -> None:
        vs = virtual_server(key, scheduler, plan.affinity_timeout)
        out.claims.append((key, vs, dests, bind))

    svc = plan.service_port
    proto = svc.protocol.value.upper()
    lower = proto.lower()
    sel = plan.selection

    for ep in sel.all_reachable:
        # upstream: endpoints on this node (one without a nodeName is not).
        if ep.is_local(fam.node.name):
            add(n.LOOP_BACK, member(ep.ip, ep.port, ep.ip, protocol=lower))
    cluster_ip = plan.cluster_ip
    add(n.CLUSTER_IP, member(cluster_ip, svc.port, protocol=lower))
    internal = real_servers(plan.internal)
    claim(ServiceKey(cluster_ip, proto, svc.port), internal, True)

    external: Endpoints = {}
    local_policy = False
    if plan.external is not None:
        external = real_servers(plan.external)
        local_policy = plan.external.policy is TrafficPolicy.LOCAL
    local_addrs = ctx.local_addrs
    for frontend in plan.external_frontends:
        if frontend.kind is FrontendKind.EXTERNAL_IP:
            assert frontend.ip is not None
            ip = str(ipaddress.ip_address(frontend.ip))
            entry = member(ip, svc.port, protocol=lower)
            add(n.EXTERNAL_IP_LOCAL if local_policy else n.EXTERNAL_IP, entry)
            claim(ServiceKey(ip, proto, svc.port), external, ip not in local_addrs)
        elif frontend.kind is FrontendKind.LOAD_BALANCER:
            assert frontend.ip is not None
            ip = str(ipaddress.ip_address(frontend.ip))
            entry = member(ip, svc.port, protocol=lower)
            add(n.LOAD_BALANCER, entry)
            if local_policy:
                add(n.LOAD_BALANCER_LOCAL, entry)
            if frontend.declared_ranges:
                add(n.LOAD_BALANCER_FW, entry)
                for cidr in frontend.declared_ranges:
                    net = ipaddress.ip_network(cidr, strict=False)
                    add(n.LOAD_BALANCER_SOURCE_CIDR, member(ip, svc.port, str(net), protocol=lower))
                if frontend.allow_from_node:
                    add(n.LOAD_BALANCER_SOURCE_IP, member(ip, svc.port, ip, protocol=lower))
                else:
                    out.lb_no_node_access.append((ip, lower, svc.port))
            claim(ServiceKey(ip, proto, svc.port), external, ip not in local_addrs)
        elif frontend.kind is FrontendKind.NODE_PORT and ctx.node_ips:
            port = frontend.port
            if proto == "SCTP":
                base = n.NODE_PORT_LOCAL_SCTP if local_policy else None
                for ip in ctx.node_ips:
                    add(n.NODE_PORT_SCTP, member(ip, port, protocol="sctp"))
                    if base:
                        add(base, member(ip, port, protocol="sctp"))
            else:
                add(n.NODE_PORT_TCP if proto == "TCP" else n.NODE_PORT_UDP, str(port))
                if local_policy:
                    local = n.NODE_PORT_LOCAL_TCP if proto == "TCP" else n.NODE_PORT_LOCAL_UDP
                    add(local, str(port))
            for ip in ctx.node_ips:
                claim(ServiceKey(ip, proto, port), dict(external), False)
    if svc.health_check_node_port:
        add(n.HEALTH_CHECK_NODE_PORT, str(svc.health_check_node_port))
    return out


# ------------------------------------------------------------------- iptables


@dataclass(frozen=True)
class RuleSettings:
    random_fully: bool = True


def _set_match(name: str, flags: str) -> Args:
    return ("-m", "set", "--match-set", name, flags)


# upstream's ipsetWithIptablesChain: (set, table, chain, target, match flags, protocol)
_SET_RULES: tuple[tuple[str, str, str, str, str, str], ...] = (
    (n.LOOP_BACK, "nat", n.KUBE_POSTROUTING, "MASQUERADE", "dst,dst,src", ""),
    (n.LOAD_BALANCER, "nat", n.KUBE_SERVICES, n.KUBE_LOAD_BALANCER, "dst,dst", ""),
    (n.LOAD_BALANCER_LOCAL, "nat", n.KUBE_LOAD_BALANCER, "RETURN", "dst,dst", ""),
    (n.NODE_PORT_LOCAL_TCP, "nat", n.KUBE_NODE_PORT, "RETURN", "dst", "tcp"),
    (n.NODE_PORT_TCP, "nat", n.KUBE_NODE_PORT, n.KUBE_MARK_MASQ, "dst", "tcp"),
    (n.NODE_PORT_LOCAL_UDP, "nat", n.KUBE_NODE_PORT, "RETURN", "dst", "udp"),
    (n.NODE_PORT_UDP, "nat", n.KUBE_NODE_PORT, n.KUBE_MARK_MASQ, "dst", "udp"),
    (n.NODE_PORT_LOCAL_SCTP, "nat", n.KUBE_NODE_PORT, "RETURN", "dst,dst", "sctp"),
    (n.NODE_PORT_SCTP, "nat", n.KUBE_NODE_PORT, n.KUBE_MARK_MASQ, "dst,dst", "sctp"),
    (n.LOAD_BALANCER_FW, "filter", n.KUBE_PROXY_FIREWALL, n.KUBE_SOURCE_RANGES_FIREWALL,
     "dst,dst", ""),
    (n.LOAD_BALANCER_SOURCE_CIDR, "filter", n.KUBE_SOURCE_RANGES_FIREWALL, "RETURN",
     "dst,dst,src", ""),
    (n.LOAD_BALANCER_SOURCE_IP, "filter", n.KUBE_SOURCE_RANGES_FIREWALL, "RETURN",
     "dst,dst,src", ""),
)  # fmt: skip


def iptables_rules(fam: FamilyPlan, state: DesiredState, settings: RuleSettings) -> Restore:
    """Every chain of ipvs mode, declared (so flushed) and filled."""
    v6 = fam.family is IPFamily.IPv6
    sets = n.FamilySets(v6)
    nonempty = {name for name, members in state.members.items() if members}
    restore = Restore()
    for chain in n.NAT_CHAINS:
        restore.chain("nat", chain)
    for chain in n.FILTER_CHAINS:
        restore.chain("filter", chain)

    def comment(base: str) -> Args:
        return ("-m", "comment", "--comment", sets.comment(base))

    def has(base: str) -> bool:
        return sets.name(base) in nonempty

    nat = n.KUBE_SERVICES
    restore.rule("nat", nat, "-s", "::1/128" if v6 else "127.0.0.0/8", "-j", "RETURN")
    for base, table, chain, target, flags, proto in _SET_RULES:
        if has(base):
            match_proto: Args = ("-p", proto) if proto else ()
            restore.rule(
                table, chain, *match_proto, *comment(base),
                *_set_match(sets.name(base), flags), "-j", target,
            )  # fmt: skip
    if has(n.CLUSTER_IP):
        cluster = (*comment(n.CLUSTER_IP), "-m", "set", "--match-set", sets.name(n.CLUSTER_IP))
        if fam.masquerade_all:
            restore.rule("nat", nat, *cluster, "dst,dst", "-j", n.KUBE_MARK_MASQ)
        elif fam.local.implemented:
            restore.rule(
                "nat",
                nat,
                *cluster,
                "dst,dst",
                *local_args(fam.local, negate=True),
                "-j",
                n.KUBE_MARK_MASQ,
            )
        else:
            # Node-originated traffic picks a VIP of kube-ipvs0 as its source.
            restore.rule("nat", nat, *cluster, "src,dst", "-j", n.KUBE_MARK_MASQ)
    for base, masquerade in ((n.EXTERNAL_IP, True), (n.EXTERNAL_IP_LOCAL, False)):
        if not has(base):
            continue
        args = (*comment(base), *_set_match(sets.name(base), "dst,dst"))
        if masquerade:
            restore.rule("nat", nat, *args, "-j", n.KUBE_MARK_MASQ)
        restore.rule(
            "nat", nat, *args, "-m", "physdev", "!", "--physdev-is-in",
            "-m", "addrtype", "!", "--src-type", "LOCAL", "-j", "ACCEPT",
        )  # fmt: skip
        restore.rule("nat", nat, *args, "-m", "addrtype", "--dst-type", "LOCAL", "-j", "ACCEPT")
    restore.rule("nat", nat, "-m", "addrtype", "--dst-type", "LOCAL", "-j", n.KUBE_NODE_PORT)
    restore.rule("nat", n.KUBE_LOAD_BALANCER, "-j", n.KUBE_MARK_MASQ)
    restore.rule("filter", n.KUBE_SOURCE_RANGES_FIREWALL, "-j", "DROP")
    for ip, proto, port in state.lb_no_node_access:
        restore.rule(
            "filter", n.KUBE_IPVS_OUT_FILTER, "-s", ip, "-m", "ipvs", "--vaddr", ip,
            "--vproto", proto, "--vport", str(port), "-j", "DROP",
        )  # fmt: skip
    for base in (n.CLUSTER_IP, n.LOAD_BALANCER):
        if has(base):
            restore.rule("nat", nat, *_set_match(sets.name(base), "dst,dst"), "-j", "ACCEPT")
    m = mark(fam)
    restore.rule(
        "filter", n.KUBE_FORWARD, "-m", "comment", "--comment", "kubernetes forwarding rules",
        "-m", "mark", "--mark", f"{m}/{m}", "-j", "ACCEPT",
    )  # fmt: skip
    restore.rule(
        "filter", n.KUBE_FORWARD, "-m", "comment", "--comment",
        "kubernetes forwarding conntrack rule", "-m", "conntrack", "--ctstate",
        "RELATED,ESTABLISHED", "-j", "ACCEPT",
    )  # fmt: skip
    hc = sets.name(n.HEALTH_CHECK_NODE_PORT)
    restore.rule(
        "filter", n.KUBE_NODE_PORT, *comment(n.HEALTH_CHECK_NODE_PORT),
        *_set_match(hc, "dst"), "-j", "ACCEPT",
    )  # fmt: skip
    for base in (n.LOAD_BALANCER, n.CLUSTER_IP, n.EXTERNAL_IP, n.EXTERNAL_IP_LOCAL):
        restore.rule(
            "filter", n.KUBE_IPVS_FILTER, *_set_match(sets.name(base), "dst,dst"), "-j", "RETURN"
        )
    restore.rule("filter", n.KUBE_IPVS_FILTER, *_set_match(hc, "dst"), "-j", "RETURN")
    restore.rule(
        "filter", n.KUBE_IPVS_FILTER, "-m", "conntrack", "--ctstate", "NEW",
        *_set_match(sets.name(n.IPVS_IPS), "dst"), "-j", "REJECT",
    )  # fmt: skip
    restore.rule("nat", n.KUBE_POSTROUTING, "-m", "mark", "!", "--mark", f"{m}/{m}", "-j", "RETURN")
    restore.rule("nat", n.KUBE_POSTROUTING, "-j", "MARK", "--xor-mark", m)
    restore.rule(
        "nat", n.KUBE_POSTROUTING, "-m", "comment", "--comment",
        "kubernetes service traffic requiring SNAT", "-j", "MASQUERADE",
        *(("--random-fully",) if settings.random_fully else ()),
    )  # fmt: skip
    restore.rule("nat", n.KUBE_MARK_MASQ, "-j", "MARK", "--or-mark", m)
    return restore
