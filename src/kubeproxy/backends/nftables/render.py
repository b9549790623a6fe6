"""Render proxy state into the ``kube-proxy`` nftables table (pure; see docs/nftables-layout.md).

The layout keeps the number of chains independent of the number of Services: per-Service
state lives in map elements, and a handful of shared load-balancing chains do the work.

* ``service-ips`` (ClusterIP, external IP, LB IP ``. proto . port``) and
  ``service-nodeports`` (``proto . port``) are verdict maps that send a new connection to a
  shared chain chosen by traffic kind and endpoint count, e.g. ``cluster-ip-3``.
* That chain marks for masquerade when needed and DNATs with
  ``dnat to <dest> . numgen random mod N map @ip-backends``: the backends map holds, for
  each destination, endpoint *i* under index *i*. Local-policy destinations keep their
  node-local endpoints at ``LOCAL_OFFSET + i`` under the same key.
* ``no-endpoint-services`` / ``no-endpoint-nodeports`` reject (no endpoints anywhere) or
  drop (Local policy, endpoints only on other nodes) new connections in the filter hooks.
* ``hairpin`` holds ``endpoint . endpoint`` pairs so a Pod reaching itself through its
  Service is masqueraded in postrouting.
* ``firewall-ips`` / ``firewall-allow`` implement loadBalancerSourceRanges without a
  chain per Service; ``cluster-ips`` / ``service-cidrs`` reject traffic to unused ports of
  ClusterIPs and drop traffic to unallocated addresses of the service ranges.
* ServicePorts with ``sessionAffinity: ClientIP`` are the exception: they get chains of
  their own (one per endpoint, with a dynamic set remembering clients), as upstream, so
  the cost of affinity is paid by the Services that use it.

A change to one ServicePort is therefore a change to its elements (plus, at most, one new
shared chain), which is what makes partial syncs cheap.

:func:`render_service_port` turns one ServicePort (one IP family) into
:class:`PortRules`; :func:`collect` and :func:`render_table` assemble the whole table.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kubeproxy.backends.nftables.script import BaseChain, Chain, Set, Table
from kubeproxy.model.nodeports import FamilyNodePorts
from kubeproxy.model.topology import (
    EndpointSelection,
    FeatureFlags,
    NodeTopology,
    categorize_endpoints,
)
from kubeproxy.model.types import Endpoint, IPFamily, ServicePort, ServicePortName, family_of

TABLE = "kube-proxy"
TABLE_COMMENT = "rules for kube-proxy"
# Index offset of node-local endpoints in the backends maps (Local traffic policy).
LOCAL_OFFSET = 65536
DEFAULT_MASQUERADE_MARK = 0x4000

# Map and set names (stable: tests, docs and the explain tooling refer to them).
SERVICE_IPS = "service-ips"
SERVICE_NODEPORTS = "service-nodeports"
IP_BACKENDS = "ip-backends"
NODEPORT_BACKENDS = "nodeport-backends"
NO_ENDPOINT_SERVICES = "no-endpoint-services"
NO_ENDPOINT_NODEPORTS = "no-endpoint-nodeports"
HAIRPIN = "hairpin"
FIREWALL_IPS = "firewall-ips"
FIREWALL_ALLOW = "firewall-allow"
CLUSTER_IPS = "cluster-ips"
SERVICE_CIDRS = "service-cidrs"
NODEPORT_IPS = "nodeport-ips"
REJECT_CHAIN = "reject-chain"

VERDICT_REJECT = f"goto {REJECT_CHAIN}"
VERDICT_DROP = "drop"


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """How an IP family is spelled in nft."""

    table_family: str
    ip: str
    addr_type: str
    loopback: str

    @classmethod
    def of(cls, family: IPFamily) -> Vocabulary:
        if family is IPFamily.IPv4:
            return cls("ip", "ip", "ipv4_addr", "127.0.0.0/8")
        return cls("ip6", "ip6", "ipv6_addr", "::1")


@dataclass(frozen=True, slots=True)
class FamilyConfig:
    """Everything besides Services and endpoints that shapes one family's table."""

    family: IPFamily
    node: NodeTopology
    node_ports: FamilyNodePorts
    cluster_cidrs: tuple[str, ...] = ()
    masquerade_all: bool = False
    masquerade_mark: int = DEFAULT_MASQUERADE_MARK
    flags: FeatureFlags = field(default_factory=FeatureFlags)
    # --service-cluster-ip-range plus ServiceCIDR objects, of this family.
    service_cidrs: tuple[str, ...] = ()
    # This node's primary IP of this family (loadBalancerSourceRanges "allow from node").
    node_ip: str | None = None

    @property
    def vocab(self) -> Vocabulary:
        return Vocabulary.of(self.family)


# --------------------------------------------------------------- traffic policies


def _cidr_match(cfg: FamilyConfig) -> str:
    if not cfg.cluster_cidrs:
        return ""
    if len(cfg.cluster_cidrs) == 1:
        return cfg.cluster_cidrs[0]
    return "{ " + ", ".join(cfg.cluster_cidrs) + " }"


def policy_rules(
    kind: str, cfg: FamilyConfig, to_cluster: str | None, to_local: str | None = None
) -> list[str]:
    """The masquerade and short-circuit logic of one traffic kind.

    ``to_cluster`` / ``to_local`` are the final statements sending the connection to the
    cluster-wide / node-local endpoints (a DNAT from a backends map, or a ``goto`` to a
    session-affinity chain). Kinds:

    * ``cluster-ip``: traffic to a ClusterIP. Masquerade when the source is outside
      ``--cluster-cidr`` (replies must come back through this node), or always with
      ``--masquerade-all``.
    * ``external``: external IP / LB IP / NodePort with externalTrafficPolicy Cluster:
      always masquerade (the endpoint may be on another node).
    * ``local``: the same with externalTrafficPolicy Local: Pods are short-circuited to
      the cluster endpoints (as if they had gone out to the load balancer and back), the
      node itself too (masqueraded: its source address is local), everyone else goes to
      this node's endpoints with the client address kept.
    """
    v = cfg.vocab
    mark = f"meta mark set meta mark | {cfg.masquerade_mark:#010x}"
    pods = _cidr_match(cfg)
    rules: list[str] = []
    if kind == "cluster-ip":
        if cfg.masquerade_all:
            rules.append(mark)
        elif pods:
            rules.append(f"{v.ip} saddr != {pods} {mark}")
        if to_cluster:
            rules.append(to_cluster)
        return rules
    if kind == "external":
        return [mark, to_cluster] if to_cluster else []
    if to_cluster:
        if pods:
            rules.append(f"{v.ip} saddr {pods} {to_cluster}")
        rules.append(f"fib saddr type local {mark}")
        rules.append(f"fib saddr type local {to_cluster}")
    if to_local:
        rules.append(to_local)
    return rules


@dataclass(frozen=True, slots=True, order=True)
class LBChain:
    """A shared load-balancing chain.

    ``kind`` is ``cluster-ip``, ``external-ip``/``external-np`` (externalTrafficPolicy
    Cluster) or ``local-ip``/``local-np`` (Local); ``-ip`` chains read the backends keyed
    by destination address, ``-np`` chains those keyed by NodePort.
    """

    kind: str
    cluster: int
    local: int = 0

    @property
    def name(self) -> str:
        if self.kind.startswith("local-"):
            return f"{self.kind}-{self.cluster}-{self.local}"
        return f"{self.kind}-{self.cluster}"

    @property
    def goto(self) -> str:
        return f"goto {self.name}"

    def rules(self, cfg: FamilyConfig) -> list[str]:
        v = cfg.vocab
        by_node_port = self.kind.endswith("-np")
        key = "meta l4proto . th dport"
        if not by_node_port:
            key = f"{v.ip} daddr . {key}"
        backends = NODEPORT_BACKENDS if by_node_port else IP_BACKENDS

        def dnat(n: int, offset: int = 0) -> str | None:
            if not n:
                return None
            off = f" offset {offset}" if offset else ""
            return f"dnat {v.ip} to {key} . numgen random mod {n}{off} map @{backends}"

        policy = self.kind.split("-")[0]
        if policy == "cluster":
            policy = "cluster-ip"
        return policy_rules(policy, cfg, dnat(self.cluster), dnat(self.local, LOCAL_OFFSET))

    def definition(self, cfg: FamilyConfig) -> ChainDef:
        return ChainDef(self.name, tuple(self.rules(cfg)))


# ------------------------------------------------------------------ per-ServicePort


Element = tuple[str, str, str | None]  # (set or map name, key, value or None for sets)


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
    """One address a ServicePort captures, with all the elements it adds.

    ``claim`` identifies the destination across Services (``("ip", key)`` or
    ``("nodeport", key)``): two ServicePorts must not both own one.
    """

    claim: tuple[str, str]
    elements: tuple[Element, ...]
    chain: LBChain | None = None


@dataclass(frozen=True, slots=True)
class PortRules:
    """What one ServicePort contributes to one family's table."""

    destinations: tuple[Destination, ...] = ()
    # Elements several ServicePorts may share (hairpin pairs, ClusterIPs): reference
    # counted, so one is removed only when no ServicePort needs it any more.
    shared: tuple[Element, ...] = ()
    # Session affinity only: this ServicePort's own chains (in dependency order) and sets.
    chains: tuple[ChainDef, ...] = ()
    sets: tuple[AffinitySet, ...] = ()
    no_local_internal: bool = False
    no_local_external: bool = False
    selection: EndpointSelection | None = field(default=None, compare=False)


def render_service_port(
    svc: ServicePort, endpoints: Iterable[Endpoint], cfg: FamilyConfig
) -> PortRules:
    """The elements one ServicePort needs in ``cfg.family``'s table (pure)."""
    cluster_ip = svc.cluster_ip(cfg.family)
    if cluster_ip is None:
        return PortRules()
    want_v6 = cfg.family is IPFamily.IPv6
    family_eps = [ep for ep in endpoints if (":" in ep.ip) is want_v6]
    sel = categorize_endpoints(family_eps, svc, cfg.node, cfg.flags)
    affinity = _Affinity(svc, sel, cfg) if svc.affinity_timeout is not None else None
    proto = svc.protocol.nft
    internal = sel.internal(svc)
    external = sel.external(svc)
    unreachable = VERDICT_DROP if sel.has_any else VERDICT_REJECT
    dests: list[Destination] = []

    # ClusterIP: internal traffic.
    key = f"{cluster_ip} . {proto} . {svc.port}"
    if internal:
        if affinity is not None:
            dests.append(Destination(("ip", key), ((SERVICE_IPS, key, affinity.goto("ci")),)))
        else:
            chain = LBChain("cluster-ip", len(internal))
            dests.append(
                Destination(
                    ("ip", key),
                    (
                        (SERVICE_IPS, key, chain.goto),
                        *_backends(IP_BACKENDS, key, internal),
                    ),
                    chain,
                )
            )
    else:
        dests.append(Destination(("ip", key), ((NO_ENDPOINT_SERVICES, key, unreachable),)))

    # External destinations: external IPs, load-balancer IPs, the NodePort.
    lb_ips = set(svc.load_balancer_ips_of(cfg.family))
    targets = [("ip", ip) for ip in (*svc.external_ips_of(cfg.family), *sorted(lb_ips))]
    if svc.node_port and cfg.node_ports.enabled:
        targets.append(("nodeport", ""))
    for kind, ip in targets:
        by_ip = kind == "ip"
        ext_key = f"{ip} . {proto} . {svc.port}" if by_ip else f"{proto} . {svc.node_port}"
        dispatch = SERVICE_IPS if by_ip else SERVICE_NODEPORTS
        elements: list[Element] = []
        chain_or_none: LBChain | None = None
        if sel.has_any:
            if affinity is not None:
                elements.append(
                    (dispatch, ext_key, affinity.goto("xl" if svc.external_policy_local else "x"))
                )
            elif svc.external_policy_local:
                chain_or_none = LBChain(
                    "local-ip" if by_ip else "local-np", len(sel.cluster), len(sel.local)
                )
                backends_map = IP_BACKENDS if by_ip else NODEPORT_BACKENDS
                elements.append((dispatch, ext_key, chain_or_none.goto))
                elements.extend(_backends(backends_map, ext_key, sel.cluster))
                elements.extend(_backends(backends_map, ext_key, sel.local, LOCAL_OFFSET))
            else:
                chain_or_none = LBChain("external-ip" if by_ip else "external-np", len(external))
                backends_map = IP_BACKENDS if by_ip else NODEPORT_BACKENDS
                elements.append((dispatch, ext_key, chain_or_none.goto))
                elements.extend(_backends(backends_map, ext_key, external))
        if not external:
            # No endpoints at all (reject), or none on this node for Local policy (drop
            # whatever the chain above did not short-circuit).
            elements.append(
                (NO_ENDPOINT_SERVICES if by_ip else NO_ENDPOINT_NODEPORTS, ext_key, unreachable)
            )
        if ip in lb_ips and svc.load_balancer_source_ranges:
            elements.extend(_firewall(ext_key, ip, svc, cfg))
        dests.append(Destination((kind, ext_key), tuple(elements), chain_or_none))

    # Hairpin: only endpoints on this node (or without a nodeName) can be the client.
    here = cfg.node.name
    hairpin = {ep.ip for ep in sel.cluster if ep.node_name is None or ep.node_name == here}
    hairpin.update(ep.ip for ep in sel.local)
    shared: list[Element] = [(CLUSTER_IPS, cluster_ip, None)]
    shared.extend((HAIRPIN, f"{h} . {h}", None) for h in sorted(hairpin))
    return PortRules(
        destinations=tuple(dests),
        shared=tuple(shared),
        chains=affinity.chains() if affinity is not None else (),
        sets=affinity.sets() if affinity is not None else (),
        no_local_internal=sel.has_any and not internal,
        no_local_external=sel.has_any and svc.externally_accessible and not external,
        selection=sel,
    )


def _backends(
    map_name: str, key: str, endpoints: tuple[Endpoint, ...], offset: int = 0
) -> list[Element]:
    return [
        (map_name, f"{key} . {offset + i}", f"{ep.ip} . {ep.port}")
        for i, ep in enumerate(endpoints)
    ]


def _firewall(dest_key: str, lb_ip: str, svc: ServicePort, cfg: FamilyConfig) -> list[Element]:
    """loadBalancerSourceRanges for one LB IP: the destination is filtered, these pass."""
    ranges = [
        ipaddress.ip_network(r)
        for r in svc.load_balancer_source_ranges
        if family_of(r) is cfg.family
    ]
    # Overlapping ranges would be refused by an interval set: merge them first.
    allowed = [str(n) for n in ipaddress.collapse_addresses(ranges)]  # type: ignore[type-var]
    node_ip = ipaddress.ip_address(cfg.node_ip) if cfg.node_ip else None
    if node_ip is not None and any(node_ip in n for n in ranges):
        # As upstream: a VIP-style load balancer that is also a local address makes
        # node-to-VIP traffic loop back with the VIP as its source; let it through.
        allowed.append(lb_ip)
    return [
        (FIREWALL_IPS, dest_key, None),
        *((FIREWALL_ALLOW, f"{dest_key} . {r}", None) for r in allowed),
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

    def __init__(self, svc: ServicePort, sel: EndpointSelection, cfg: FamilyConfig) -> None:
        self.svc = svc
        self.sel = sel
        self.cfg = cfg
        self.timeout = svc.affinity_timeout or 0
        self.id = _short_hash(str(svc.name))

    def _ep_id(self, ep: Endpoint) -> str:
        return _short_hash(f"{self.svc.name}|{ep}")

    def goto(self, front: str) -> str:
        return f"goto aff-{self.id}-{front}"

    def sets(self) -> tuple[AffinitySet, ...]:
        return tuple(
            AffinitySet(f"affset-{self._ep_id(ep)}-{self.timeout}", self.timeout)
            for ep in self.sel.all_reachable
        )

    def chains(self) -> tuple[ChainDef, ...]:
        v = self.cfg.vocab
        proto = self.svc.protocol.nft
        out: list[ChainDef] = []
        for ep in self.sel.all_reachable:
            eid = self._ep_id(ep)
            target = f"[{ep.ip}]:{ep.port}" if ":" in ep.ip else f"{ep.ip}:{ep.port}"
            out.append(
                ChainDef(
                    f"affep-{eid}",
                    (
                        f"update @affset-{eid}-{self.timeout} {{ {v.ip} saddr }}",
                        f"meta l4proto {proto} dnat {v.ip} to {target}",
                    ),
                )
            )
        picks = {"c": self.sel.cluster, "l": self.sel.local}
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
        to_cluster = f"goto aff-{self.id}-c" if self.sel.cluster else None
        to_local = f"goto aff-{self.id}-l" if self.sel.local else None
        # Front chains: the traffic-policy logic of each kind of destination this
        # ServicePort has (only those it has, so no chain is left unreferenced).
        internal = to_local if self.svc.internal_policy_local else to_cluster
        fronts: dict[str, list[str]] = {}
        if internal:
            fronts["ci"] = policy_rules("cluster-ip", self.cfg, internal)
        if self.svc.externally_accessible and self.sel.has_any:
            if self.svc.external_policy_local:
                fronts["xl"] = policy_rules("local", self.cfg, to_cluster, to_local)
            else:
                fronts["x"] = policy_rules("external", self.cfg, to_cluster)
        out.extend(
            ChainDef(f"aff-{self.id}-{name}", tuple(rules)) for name, rules in fronts.items()
        )
        return tuple(out)


# ------------------------------------------------------------------- whole table


@dataclass(frozen=True, slots=True)
class Conflict:
    """A destination claimed by two ServicePorts; the first (by name) keeps it."""

    claim: tuple[str, str]
    owner: ServicePortName
    loser: ServicePortName


@dataclass
class TableContents:
    """Everything the table holds besides its fixed skeleton."""

    elements: dict[str, dict[str, str | None]] = field(default_factory=dict)
    chains: dict[str, ChainDef] = field(default_factory=dict)
    sets: dict[str, AffinitySet] = field(default_factory=dict)
    conflicts: list[Conflict] = field(default_factory=list)


ELEMENT_SETS = (
    SERVICE_IPS,
    SERVICE_NODEPORTS,
    IP_BACKENDS,
    NODEPORT_BACKENDS,
    NO_ENDPOINT_SERVICES,
    NO_ENDPOINT_NODEPORTS,
    HAIRPIN,
    FIREWALL_IPS,
    FIREWALL_ALLOW,
    CLUSTER_IPS,
)


def collect(rules: Mapping[ServicePortName, PortRules], cfg: FamilyConfig) -> TableContents:
    """Merge per-ServicePort rules, resolving destination conflicts deterministically."""
    out = TableContents(elements={name: {} for name in ELEMENT_SETS})
    owners: dict[tuple[str, str], ServicePortName] = {}
    for name in sorted(rules):
        port_rules = rules[name]
        for dest in port_rules.destinations:
            owner = owners.get(dest.claim)
            if owner is not None:
                out.conflicts.append(Conflict(dest.claim, owner, name))
                continue
            owners[dest.claim] = name
            for set_name, key, value in dest.elements:
                out.elements[set_name][key] = value
            if dest.chain is not None and dest.chain.name not in out.chains:
                out.chains[dest.chain.name] = dest.chain.definition(cfg)
        for set_name, key, value in port_rules.shared:
            out.elements[set_name][key] = value
        for chain in port_rules.chains:
            out.chains[chain.name] = chain
        for aff in port_rules.sets:
            out.sets[aff.name] = aff
    return out


def static_sets(cfg: FamilyConfig) -> list[Set]:
    """The table's sets and maps whose elements kubeproxy owns (flushed on a full sync)."""
    v = cfg.vocab
    addr = v.addr_type
    sets = [
        Set.map(
            SERVICE_IPS,
            f"{addr} . inet_proto . inet_service : verdict",
            comment="ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        Set.map(
            SERVICE_NODEPORTS, "inet_proto . inet_service : verdict", comment="NodePort traffic"
        ),
        Set.map(
            IP_BACKENDS,
            f"typeof {v.ip} daddr . meta l4proto . th dport . numgen random mod 1 : "
            f"{v.ip} daddr . th dport",
            comment="endpoints of each service IP destination, by index",
        ),
        Set.map(
            NODEPORT_BACKENDS,
            f"typeof meta l4proto . th dport . numgen random mod 1 : {v.ip} daddr . th dport",
            comment="endpoints of each NodePort, by index",
        ),
        Set.map(
            NO_ENDPOINT_SERVICES,
            f"{addr} . inet_proto . inet_service : verdict",
            comment="drop or reject traffic to services with no usable endpoints",
        ),
        Set.map(
            NO_ENDPOINT_NODEPORTS,
            "inet_proto . inet_service : verdict",
            comment="drop or reject traffic to nodeports with no usable endpoints",
        ),
        Set(
            HAIRPIN,
            f"{addr} . {addr}",
            comment="endpoint pairs that must be masqueraded when a pod reaches itself",
        ),
        Set(
            FIREWALL_IPS,
            f"{addr} . inet_proto . inet_service",
            comment="load balancer destinations with loadBalancerSourceRanges",
        ),
        Set(
            FIREWALL_ALLOW,
            f"{addr} . inet_proto . inet_service . {addr}",
            ("interval",),
            comment="sources allowed to each firewalled destination",
        ),
        Set(CLUSTER_IPS, addr, comment="allocated ClusterIPs"),
        Set(
            SERVICE_CIDRS, addr, ("interval",), list(cfg.service_cidrs), comment="service IP ranges"
        ),
    ]
    if cfg.node_ports.enabled and not cfg.node_ports.match_all:
        sets.append(
            Set(
                NODEPORT_IPS,
                addr,
                ("interval",),
                list(cfg.node_ports.ranges),
                comment="addresses that accept NodePort traffic",
            )
        )
    return sets


def skeleton(cfg: FamilyConfig) -> Table:
    """The fixed part of the table: base chains, dispatch chains, empty maps and sets."""
    v = cfg.vocab
    mark = f"{cfg.masquerade_mark:#010x}"
    table = Table(v.table_family, TABLE, TABLE_COMMENT)
    dispatch = f"{v.ip} daddr . meta l4proto . th dport"
    table.sets = static_sets(cfg)

    nodeport_match = ""
    if cfg.node_ports.enabled:
        nodeport_match = f"fib daddr type local {v.ip} daddr != {v.loopback} "
        if not cfg.node_ports.match_all:
            nodeport_match += f"{v.ip} daddr @{NODEPORT_IPS} "

    services = [f"{dispatch} vmap @{SERVICE_IPS}"]
    endpoints_check = [f"{dispatch} vmap @{NO_ENDPOINT_SERVICES}"]
    if nodeport_match:
        services.append(f"{nodeport_match}meta l4proto . th dport vmap @{SERVICE_NODEPORTS}")
        endpoints_check.append(
            f"{nodeport_match}meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"
        )
    cluster_ips_check = [f"{v.ip} daddr @{CLUSTER_IPS} reject"]
    if cfg.service_cidrs:
        cluster_ips_check.append(f"{v.ip} daddr @{SERVICE_CIDRS} drop")

    # Numeric priorities: nft 1.0.6 only accepts the names (dstnat, srcnat) on some hooks.
    # dstnat is -100, srcnat 100. Filter chains run at dstnat - 10: before DNAT on the
    # output path, and after it on input/forward (prerouting has DNATed by then), so
    # short-circuited traffic that was DNATed no longer matches the no-endpoint maps.
    # The ClusterIP check must see traffic after DNAT on every path: forward, and output
    # at dstnat + 10.
    pre, post = "-110", "-90"
    new = "ct state new"
    table.chains = [
        Chain(
            "filter-prerouting",
            [f"{new} jump firewall-check"],
            BaseChain("filter", "prerouting", pre),
        ),
        Chain("filter-input", [f"{new} jump endpoints-check"], BaseChain("filter", "input", pre)),
        Chain(
            "filter-forward",
            [f"{new} jump endpoints-check", f"{new} jump cluster-ips-check"],
            BaseChain("filter", "forward", pre),
        ),
        Chain(
            "filter-output",
            [f"{new} jump endpoints-check", f"{new} jump firewall-check"],
            BaseChain("filter", "output", pre),
        ),
        Chain(
            "filter-output-post-dnat",
            [f"{new} jump cluster-ips-check"],
            BaseChain("filter", "output", post),
        ),
        Chain("nat-prerouting", ["jump services"], BaseChain("nat", "prerouting", "-100")),
        Chain("nat-output", ["jump services"], BaseChain("nat", "output", "-100")),
        Chain("nat-postrouting", ["jump masquerading"], BaseChain("nat", "postrouting", "100")),
        Chain("services", services),
        Chain("endpoints-check", endpoints_check),
        Chain(
            "firewall-check",
            [f"{dispatch} @{FIREWALL_IPS} {dispatch} . {v.ip} saddr != @{FIREWALL_ALLOW} drop"],
        ),
        Chain("cluster-ips-check", cluster_ips_check),
        Chain(REJECT_CHAIN, ["reject"]),
        Chain(
            "masquerading",
            [
                f"ct status dnat {v.ip} saddr . {v.ip} daddr @{HAIRPIN} "
                f"meta mark set meta mark | {mark}",
                f"meta mark & {mark} == 0 return",
                f"meta mark set meta mark ^ {mark}",
                "masquerade fully-random",
            ],
        ),
    ]
    return table


SKELETON_CHAINS = frozenset(
    {
        "filter-prerouting",
        "filter-input",
        "filter-forward",
        "filter-output",
        "filter-output-post-dnat",
        "nat-prerouting",
        "nat-output",
        "nat-postrouting",
        "services",
        "endpoints-check",
        "firewall-check",
        "cluster-ips-check",
        REJECT_CHAIN,
        "masquerading",
    }
)


def render_table(cfg: FamilyConfig, contents: TableContents) -> Table:
    """The complete table for one family."""
    table = skeleton(cfg)
    for s in table.sets:
        elems = contents.elements.get(s.name)
        if not elems:
            continue
        if s.keyword == "map":
            s.elements = [f"{k} : {val}" for k, val in elems.items()]
        else:
            s.elements = list(elems)
    v = cfg.vocab
    table.sets.extend(affinity_set(v, aff) for aff in sorted(contents.sets.values()))
    table.chains.extend(Chain(c.name, list(c.rules)) for c in contents.chains.values())
    return table


def affinity_set(v: Vocabulary, aff: AffinitySet) -> Set:
    return Set(aff.name, v.addr_type, ("dynamic", "timeout"), timeout=aff.timeout)
