"""One ServicePort plan → its iptables rules, as upstream's iptables proxier writes them.

Per ServicePort and family (pure; see docs/iptables-layout.md):

* **entries** — the rules upstream appends to its long top-level chains, each tagged with
  the dispatch tree it goes to (:data:`TREES`) and its key (destination address, or
  protocol and port): the ClusterIP / external IP / load-balancer IP captures of nat
  ``KUBE-SERVICES``, the NodePort captures of nat ``KUBE-NODEPORTS``, the REJECT/DROP
  rules of filter ``KUBE-SERVICES`` and ``KUBE-EXTERNAL-SERVICES``, the source-range DROP
  of ``KUBE-PROXY-FIREWALL`` and the health-check ACCEPT of filter ``KUBE-NODEPORTS``;
* **chains** — the ServicePort's own nat chains, with upstream's names and rules:
  ``KUBE-SVC-`` (Cluster policy endpoints), ``KUBE-SVL-`` (Local policy endpoints),
  ``KUBE-EXT-`` (external traffic: masquerade and the Local-policy short-circuits),
  ``KUBE-FW-`` (loadBalancerSourceRanges), one ``KUBE-SEP-`` per endpoint (hairpin
  masquerade, session affinity with ``-m recent``, DNAT).

:func:`fixed_chains` gives the rest: the top-level chains (which only jump to their
trees' roots), ``KUBE-POSTROUTING``, ``KUBE-MARK-MASQ``, ``KUBE-FORWARD`` and the
localhost-NodePort firewall.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeproxy.backends.iptables.dispatch import IP4, IP6, PORTS, Args, KeySpace, ip_key, port_key
from kubeproxy.backends.iptables.names import (
    KUBE_EXTERNAL_SERVICES,
    KUBE_FIREWALL,
    KUBE_FORWARD,
    KUBE_MARK_MASQ,
    KUBE_NODEPORTS,
    KUBE_POSTROUTING,
    KUBE_PROXY_FIREWALL,
    KUBE_SERVICES,
    ServicePortChains,
)
from kubeproxy.model.plan import (
    FamilyPlan,
    FrontendKind,
    LocalTraffic,
    Masquerade,
    ServicePortPlan,
    Verdict,
)
from kubeproxy.model.types import Endpoint, IPFamily, TrafficPolicy


@dataclass(frozen=True, slots=True)
class Tree:
    """A dispatch tree: its table, the fixed chain that jumps to its root, its keys."""

    id: str
    table: str
    parent: str
    ports: bool  # keyed by protocol and port (else by address)

    def space(self, family: IPFamily) -> KeySpace:
        if self.ports:
            return PORTS
        return IP4 if family is IPFamily.IPv4 else IP6


NAT_SERVICES = Tree("nat-services", "nat", KUBE_SERVICES, False)
NAT_NODEPORTS = Tree("nat-nodeports", "nat", KUBE_NODEPORTS, True)
FILTER_SERVICES = Tree("filter-services", "filter", KUBE_SERVICES, False)
FILTER_EXTERNAL_IPS = Tree("filter-external-ips", "filter", KUBE_EXTERNAL_SERVICES, False)
FILTER_EXTERNAL_PORTS = Tree("filter-external-ports", "filter", KUBE_EXTERNAL_SERVICES, True)
FILTER_FIREWALL = Tree("filter-firewall", "filter", KUBE_PROXY_FIREWALL, False)
FILTER_NODEPORTS = Tree("filter-nodeports", "filter", KUBE_NODEPORTS, True)
TREES = (
    NAT_SERVICES,
    NAT_NODEPORTS,
    FILTER_SERVICES,
    FILTER_EXTERNAL_IPS,
    FILTER_EXTERNAL_PORTS,
    FILTER_FIREWALL,
    FILTER_NODEPORTS,
)
TREES_BY_ID = {t.id: t for t in TREES}


@dataclass(frozen=True, slots=True)
class Entry:
    tree: str
    key: int
    args: Args


@dataclass(frozen=True, slots=True)
class PortRules:
    """What one ServicePort contributes to one family's tables."""

    entries: tuple[Entry, ...] = ()
    # The ServicePort's own nat chains and their rules, in the order upstream writes them.
    chains: tuple[tuple[str, tuple[Args, ...]], ...] = ()
    no_local_internal: bool = False
    no_local_external: bool = False


@dataclass(frozen=True, slots=True)
class Settings:
    """What besides the family plan shapes the rules."""

    # Upstream's largeClusterMode: over 1,000 endpoints in all, SVC/SEP rules carry no
    # comment (they are 40 % of the input).
    comments: bool = True
    random_fully: bool = True
    # The nfacct counters that exist (upstream's metrics count packets with them).
    accounting: frozenset[str] = frozenset()


# upstream's nfacct counter names (pkg/proxy/metrics), each behind one metric.
LOCALHOST_NODEPORTS_ACCEPTED = "localhost_nps_accepted_pkts"
CT_STATE_INVALID_DROPPED = "ct_state_invalid_dropped_pkts"
NFACCT_COUNTERS = (LOCALHOST_NODEPORTS_ACCEPTED, CT_STATE_INVALID_DROPPED)


def count(counter: str) -> Args:
    return ("-m", "nfacct", "--nfacct-name", counter)


def mark(fam: FamilyPlan) -> str:
    """The masquerade mark as upstream prints it (``%#08x``: ``0x004000``)."""
    return f"{fam.masquerade_mark:#08x}"


def local_args(local: LocalTraffic, *, negate: bool) -> Args:
    """upstream's LocalTrafficDetector IfLocal / IfNotLocal."""
    bang: Args = ("!",) if negate else ()
    if local.cidrs:
        # One CIDR per family (the configuration allows no more).
        return (*bang, "-s", local.cidrs[0])
    if local.interface is not None:
        return (*bang, "-i", local.interface + ("+" if local.prefix else ""))
    return ()


def render_service_port(plan: ServicePortPlan, fam: FamilyPlan, settings: Settings) -> PortRules:
    svc = plan.service_port
    names = ServicePortChains(plan.name)
    proto = names.protocol
    name = names.name
    port = str(svc.port)
    sel = plan.selection
    has_endpoints = sel.has_any
    internal = plan.internal
    external = plan.external
    has_internal = internal.verdict is Verdict.DNAT
    has_external = external is not None and external.verdict is Verdict.DNAT
    internal_chain = names.svl if internal.policy is TrafficPolicy.LOCAL else names.svc
    external_policy_local = external is not None and external.policy is TrafficPolicy.LOCAL
    external_policy_chain = names.svl if external_policy_local else names.svc
    lb_frontends = [f for f in plan.frontends if f.kind is FrontendKind.LOAD_BALANCER]
    sources = sorted({r for f in lb_frontends for r in f.source_ranges})
    uses_fw = has_endpoints and bool(lb_frontends) and bool(sources)
    uses_ext = has_endpoints and external is not None
    lb_target = names.fw if uses_fw else names.ext

    # No endpoint anywhere: REJECT; endpoints elsewhere only (Local policy): DROP.
    unreachable = (
        (f"{name} has no local endpoints", "DROP")
        if has_endpoints
        else (f"{name} has no endpoints", "REJECT")
    )

    def match(dest: str) -> Args:
        return ("-m", proto, "-p", proto, "-d", dest, "--dport", port)

    entries: list[Entry] = []
    cluster_ip = plan.cluster_ip
    if has_internal:
        entries.append(
            Entry(
                NAT_SERVICES.id,
                ip_key(cluster_ip),
                ("-m", "comment", "--comment", f"{name} cluster IP", *match(cluster_ip),
                 "-j", internal_chain),
            )
        )  # fmt: skip
    else:
        comment, target = unreachable
        entries.append(
            Entry(
                FILTER_SERVICES.id,
                ip_key(cluster_ip),
                ("-m", "comment", "--comment", comment, *match(cluster_ip), "-j", target),
            )
        )
    ext_comment, ext_target = unreachable
    for frontend in plan.external_frontends:
        if frontend.kind is FrontendKind.NODE_PORT:
            continue
        assert frontend.ip is not None
        key = ip_key(frontend.ip)
        if frontend.kind is FrontendKind.EXTERNAL_IP:
            if has_endpoints:
                entries.append(
                    Entry(
                        NAT_SERVICES.id,
                        key,
                        ("-m", "comment", "--comment", f"{name} external IP",
                         *match(frontend.ip), "-j", names.ext),
                    )
                )  # fmt: skip
        else:
            if has_endpoints:
                entries.append(
                    Entry(
                        NAT_SERVICES.id,
                        key,
                        ("-m", "comment", "--comment", f"{name} loadbalancer IP",
                         *match(frontend.ip), "-j", lb_target),
                    )
                )  # fmt: skip
            if uses_fw:
                entries.append(
                    Entry(
                        FILTER_FIREWALL.id,
                        key,
                        ("-m", "comment", "--comment",
                         f"{name} traffic not accepted by {names.fw}",
                         *match(frontend.ip), "-j", "DROP"),
                    )
                )  # fmt: skip
        if not has_external:
            entries.append(
                Entry(
                    FILTER_EXTERNAL_IPS.id,
                    key,
                    ("-m", "comment", "--comment", ext_comment, *match(frontend.ip),
                     "-j", ext_target),
                )
            )  # fmt: skip
    node_port = next(
        (f.port for f in plan.external_frontends if f.kind is FrontendKind.NODE_PORT), 0
    )
    if node_port:
        key = port_key(proto, node_port)
        if has_endpoints:
            if LOCALHOST_NODEPORTS_ACCEPTED in settings.accounting and (
                fam.localhost_nodeports and fam.family is IPFamily.IPv4
            ):
                # As upstream: the same capture for 127.0.0.0/8 first, only to count it.
                entries.append(
                    Entry(
                        NAT_NODEPORTS.id,
                        key,
                        ("-d", "127.0.0.0/8", "-m", "comment", "--comment", name,
                         "-m", proto, "-p", proto, "--dport", str(node_port),
                         *count(LOCALHOST_NODEPORTS_ACCEPTED), "-j", names.ext),
                    )
                )  # fmt: skip
            entries.append(
                Entry(
                    NAT_NODEPORTS.id,
                    key,
                    ("-m", "comment", "--comment", name, "-m", proto, "-p", proto,
                     "--dport", str(node_port), "-j", names.ext),
                )
            )  # fmt: skip
        if not has_external:
            entries.append(
                Entry(
                    FILTER_EXTERNAL_PORTS.id,
                    key,
                    ("-m", "comment", "--comment", ext_comment,
                     "-m", "addrtype", "--dst-type", "LOCAL", "-m", proto, "-p", proto,
                     "--dport", str(node_port), "-j", ext_target),
                )
            )  # fmt: skip
    if svc.health_check_node_port:
        hc = svc.health_check_node_port
        entries.append(
            Entry(
                FILTER_NODEPORTS.id,
                port_key("tcp", hc),
                ("-m", "comment", "--comment", f"{name} health check node port",
                 "-m", "tcp", "-p", "tcp", "--dport", str(hc), "-j", "ACCEPT"),
            )
        )  # fmt: skip

    chains: dict[str, list[Args]] = {}
    if has_internal:
        masq: Args = ()
        if internal.masquerade is Masquerade.ALWAYS:
            masq = ("-j", KUBE_MARK_MASQ)
        elif internal.masquerade is Masquerade.UNLESS_LOCAL:
            masq = (*local_args(fam.local, negate=True), "-j", KUBE_MARK_MASQ)
        if masq:
            chains.setdefault(internal_chain, []).append(
                ("-m", "comment", "--comment", f"{name} cluster IP", *match(cluster_ip), *masq)
            )
    if uses_ext:
        ext = chains.setdefault(names.ext, [])
        if not external_policy_local:
            ext.append(
                ("-m", "comment", "--comment",
                 f"masquerade traffic for {name} external destinations", "-j", KUBE_MARK_MASQ)
            )  # fmt: skip
        else:
            if fam.local.implemented:
                ext.append(
                    ("-m", "comment", "--comment", f"pod traffic for {name} external destinations",
                     *local_args(fam.local, negate=False), "-j", names.svc)
                )  # fmt: skip
            ext.append(
                ("-m", "comment", "--comment",
                 f"masquerade LOCAL traffic for {name} external destinations",
                 "-m", "addrtype", "--src-type", "LOCAL", "-j", KUBE_MARK_MASQ)
            )  # fmt: skip
            ext.append(
                ("-m", "comment", "--comment",
                 f"route LOCAL traffic for {name} external destinations",
                 "-m", "addrtype", "--src-type", "LOCAL", "-j", names.svc)
            )  # fmt: skip
        if has_external:
            ext.append(("-j", external_policy_chain))
    if uses_fw:
        fw = chains.setdefault(names.fw, [])
        fw.extend(
            ("-m", "comment", "--comment", f"{name} loadbalancer IP", "-s", cidr, "-j", names.ext)
            for cidr in sources
        )
        fw.append(
            ("-m", "comment", "--comment",
             f"other traffic to {name} will be dropped by KUBE-PROXY-FIREWALL")
        )  # fmt: skip
    affinity = svc.affinity_timeout
    if sel.cluster:
        chains.setdefault(names.svc, []).extend(
            _to_endpoints(names, sel.cluster, affinity, settings)
        )
    if sel.local:
        chains.setdefault(names.svl, []).extend(_to_endpoints(names, sel.local, affinity, settings))
    sep_comment: Args = ("-m", "comment", "--comment", name) if settings.comments else ()
    for ep in sel.all_reachable:
        sep = names.sep(str(ep))
        remember: Args = ("-m", "recent", "--name", sep, "--set") if affinity is not None else ()
        chains[sep] = [
            (*sep_comment, "-s", ep.ip, "-j", KUBE_MARK_MASQ),
            (*sep_comment, *remember, "-m", proto, "-p", proto,
             "-j", "DNAT", "--to-destination", str(ep)),
        ]  # fmt: skip
    return PortRules(
        entries=tuple(entries),
        chains=tuple((c, tuple(rules)) for c, rules in chains.items()),
        no_local_internal=plan.no_local_internal,
        no_local_external=plan.no_local_external,
    )


def _to_endpoints(
    names: ServicePortChains,
    endpoints: tuple[Endpoint, ...],
    affinity: int | None,
    settings: Settings,
) -> list[Args]:
    """upstream's writeServiceToEndpointRules: affinity checks, then random choice."""
    rules: list[Args] = []
    if affinity is not None:
        for ep in endpoints:
            sep = names.sep(str(ep))
            comment: Args = (
                ("-m", "comment", "--comment", f"{names.name} -> {ep}") if settings.comments else ()
            )
            rules.append(
                (*comment, "-m", "recent", "--name", sep, "--rcheck", "--seconds", str(affinity),
                 "--reap", "-j", sep)
            )  # fmt: skip
    n = len(endpoints)
    for i, ep in enumerate(endpoints):
        comment = (
            ("-m", "comment", "--comment", f"{names.name} -> {ep}") if settings.comments else ()
        )
        chance: Args = ()
        if i < n - 1:
            chance = (
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                f"{1 / (n - i):0.10f}",
            )
        rules.append((*comment, *chance, "-j", names.sep(str(ep))))
    return rules


# ------------------------------------------------------------------ fixed chains


@dataclass(frozen=True, slots=True)
class FixedChains:
    """The non-per-Service chains of one family, per table, with their rules."""

    filter: dict[str, tuple[Args, ...]]
    nat: dict[str, tuple[Args, ...]]


def fixed_chains(
    fam: FamilyPlan,
    settings: Settings,
    roots: dict[str, str],
    *,
    tcp_be_liberal: bool,
) -> FixedChains:
    """``roots``: each tree's root chain, by tree id."""
    m = mark(fam)
    v6 = fam.family is IPFamily.IPv6
    nat: dict[str, list[Args]] = {
        KUBE_SERVICES: [("-j", roots[NAT_SERVICES.id])],
        KUBE_NODEPORTS: [("-j", roots[NAT_NODEPORTS.id])],
        KUBE_POSTROUTING: [
            ("-m", "mark", "!", "--mark", f"{m}/{m}", "-j", "RETURN"),
            ("-j", "MARK", "--xor-mark", m),
            (
                "-m", "comment", "--comment", "kubernetes service traffic requiring SNAT",
                "-j", "MASQUERADE", *(("--random-fully",) if settings.random_fully else ()),
            ),
        ],
        KUBE_MARK_MASQ: [("-j", "MARK", "--or-mark", m)],
    }  # fmt: skip
    nodeports_comment = (
        "-m", "comment", "--comment",
        "kubernetes service nodeports; NOTE: this must be the last rule in this chain",
    )  # fmt: skip
    if fam.node_ports.match_all:
        exclude: Args = ()
        if v6:
            exclude = ("!", "-d", "::1/128")
        elif not fam.localhost_nodeports:
            exclude = ("!", "-d", "127.0.0.0/8")
        nat[KUBE_SERVICES].append(
            (*nodeports_comment, "-m", "addrtype", "--dst-type", "LOCAL", *exclude,
             "-j", KUBE_NODEPORTS)
        )  # fmt: skip
    else:
        # Upstream lists the node's addresses in the CIDRs at sync time; matching the
        # CIDRs of local addresses is the same set, and follows address changes.
        for cidr in fam.node_ports.ranges:
            loopback = cidr.startswith(("127.", "::1/"))
            if loopback and (v6 or not fam.localhost_nodeports):
                continue
            nat[KUBE_SERVICES].append(
                (*nodeports_comment, "-d", cidr, "-m", "addrtype", "--dst-type", "LOCAL",
                 "-j", KUBE_NODEPORTS)
            )  # fmt: skip
    filter_: dict[str, list[Args]] = {
        KUBE_SERVICES: [("-j", roots[FILTER_SERVICES.id])],
        KUBE_EXTERNAL_SERVICES: [
            ("-j", roots[FILTER_EXTERNAL_IPS.id]),
            ("-j", roots[FILTER_EXTERNAL_PORTS.id]),
        ],
        KUBE_NODEPORTS: [("-j", roots[FILTER_NODEPORTS.id])],
        KUBE_PROXY_FIREWALL: [("-j", roots[FILTER_FIREWALL.id])],
        KUBE_FORWARD: [],
    }
    if not tcp_be_liberal:
        invalid = (
            count(CT_STATE_INVALID_DROPPED)
            if CT_STATE_INVALID_DROPPED in settings.accounting
            else ()
        )
        filter_[KUBE_FORWARD].append(
            ("-m", "conntrack", "--ctstate", "INVALID", *invalid, "-j", "DROP")
        )
    filter_[KUBE_FORWARD].extend(
        [
            ("-m", "comment", "--comment", "kubernetes forwarding rules",
             "-m", "mark", "--mark", f"{m}/{m}", "-j", "ACCEPT"),
            ("-m", "comment", "--comment", "kubernetes forwarding conntrack rule",
             "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"),
        ]
    )  # fmt: skip
    if not v6 and fam.localhost_nodeports:
        filter_[KUBE_FIREWALL] = [
            ("-m", "comment", "--comment", "block incoming localnet connections",
             "-d", "127.0.0.0/8", "!", "-s", "127.0.0.0/8",
             "-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT", "-j", "DROP"),
        ]  # fmt: skip
    return FixedChains(
        filter={c: tuple(r) for c, r in filter_.items()},
        nat={c: tuple(r) for c, r in nat.items()},
    )


# (table, builtin chain, our chain, comment, extra match) as upstream's iptablesJumpChains.
JUMPS: tuple[tuple[str, str, str, str, Args], ...] = (
    ("filter", "INPUT", KUBE_EXTERNAL_SERVICES, "kubernetes externally-visible service portals",
     ("-m", "conntrack", "--ctstate", "NEW")),
    ("filter", "FORWARD", KUBE_EXTERNAL_SERVICES, "kubernetes externally-visible service portals",
     ("-m", "conntrack", "--ctstate", "NEW")),
    ("filter", "INPUT", KUBE_NODEPORTS, "kubernetes health check service ports", ()),
    ("filter", "FORWARD", KUBE_SERVICES, "kubernetes service portals",
     ("-m", "conntrack", "--ctstate", "NEW")),
    ("filter", "OUTPUT", KUBE_SERVICES, "kubernetes service portals",
     ("-m", "conntrack", "--ctstate", "NEW")),
    ("filter", "FORWARD", KUBE_FORWARD, "kubernetes forwarding rules", ()),
    ("filter", "INPUT", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall",
     ("-m", "conntrack", "--ctstate", "NEW")),
    ("filter", "OUTPUT", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall",
     ("-m", "conntrack", "--ctstate", "NEW")),
    ("filter", "FORWARD", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall",
     ("-m", "conntrack", "--ctstate", "NEW")),
    ("nat", "OUTPUT", KUBE_SERVICES, "kubernetes service portals", ()),
    ("nat", "PREROUTING", KUBE_SERVICES, "kubernetes service portals", ()),
    ("nat", "POSTROUTING", KUBE_POSTROUTING, "kubernetes postrouting rules", ()),
)  # fmt: skip
# kubelet's copies (upstream creates them, and leaves them at cleanup: kubelet owns them).
KUBELET_JUMPS: tuple[tuple[str, str, str, str, Args], ...] = (
    ("filter", "INPUT", KUBE_FIREWALL, "", ()),
    ("filter", "OUTPUT", KUBE_FIREWALL, "", ()),
)


def jump_args(comment: str, extra: Args, target: str) -> Args:
    return (*extra, *(("-m", "comment", "--comment", comment) if comment else ()), "-j", target)
