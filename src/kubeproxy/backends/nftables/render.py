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

A change to one ServicePort is therefore a change to its elements (plus, at most, one new
shared chain), which is what makes partial syncs cheap.

:func:`render_service_port` turns one ServicePort (one IP family) into
:class:`PortRules`; :func:`render_table` assembles the whole table from those.
"""

from __future__ import annotations

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
from kubeproxy.model.types import Endpoint, IPFamily, ServicePort, ServicePortName

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

    @property
    def vocab(self) -> Vocabulary:
        return Vocabulary.of(self.family)


# --------------------------------------------------------------------- shared chains


@dataclass(frozen=True, slots=True, order=True)
class LBChain:
    """A shared load-balancing chain.

    ``kind`` is one of:
      * ``cluster-ip``: ClusterIP traffic, ``cluster`` endpoints under the dest key;
      * ``external-ip`` / ``external-np``: external IP / LB IP or NodePort traffic with
        externalTrafficPolicy Cluster (always masqueraded);
      * ``local-ip`` / ``local-np``: the same with externalTrafficPolicy Local: Pods and the
        node itself are short-circuited to the ``cluster`` endpoints, everything else goes
        to the ``local`` endpoints with its source address kept.
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
        mark = f"meta mark set meta mark | {cfg.masquerade_mark:#010x}"

        def dnat(n: int, offset: int = 0) -> str:
            off = f" offset {offset}" if offset else ""
            return f"dnat {v.ip} to {key} . numgen random mod {n}{off} map @{backends}"

        pods = _cidr_match(cfg)
        if self.kind == "cluster-ip":
            rules = []
            if cfg.masquerade_all:
                rules.append(mark)
            elif pods:
                # Off-cluster clients reaching a ClusterIP (e.g. via a static route to the
                # service range) must be masqueraded so replies come back through this node.
                rules.append(f"{v.ip} saddr != {pods} {mark}")
            rules.append(dnat(self.cluster))
            return rules
        if self.kind in ("external-ip", "external-np"):
            return [mark, dnat(self.cluster)]
        rules = []
        if self.cluster:
            if pods:
                rules.append(f"{v.ip} saddr {pods} {dnat(self.cluster)}")
            # The node itself: its source address is local, replies must come back here.
            rules.append(f"fib saddr type local {mark}")
            rules.append(f"fib saddr type local {dnat(self.cluster)}")
        if self.local:
            rules.append(dnat(self.local, LOCAL_OFFSET))
        return rules


def _cidr_match(cfg: FamilyConfig) -> str:
    if not cfg.cluster_cidrs:
        return ""
    if len(cfg.cluster_cidrs) == 1:
        return cfg.cluster_cidrs[0]
    return "{ " + ", ".join(cfg.cluster_cidrs) + " }"


# ------------------------------------------------------------------ per-ServicePort


Element = tuple[str, str, str | None]  # (set or map name, key, value or None for sets)


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
    hairpin: tuple[str, ...] = ()
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
    family_eps = [ep for ep in endpoints if ep.family is cfg.family]
    sel = categorize_endpoints(family_eps, svc, cfg.node, cfg.flags)
    proto = svc.protocol.nft
    internal = sel.internal(svc)
    external = sel.external(svc)
    dests: list[Destination] = []

    def unreachable_verdict() -> str:
        return VERDICT_DROP if sel.has_any else VERDICT_REJECT

    # ClusterIP.
    key = f"{cluster_ip} . {proto} . {svc.port}"
    if internal:
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
        verdict = unreachable_verdict()
        dests.append(Destination(("ip", key), ((NO_ENDPOINT_SERVICES, key, verdict),)))

    # External destinations: external IPs, load-balancer IPs, the NodePort.
    external_keys = [
        ("ip", f"{ip} . {proto} . {svc.port}")
        for ip in (*svc.external_ips_of(cfg.family), *svc.load_balancer_ips_of(cfg.family))
    ]
    if svc.node_port and cfg.node_ports.enabled:
        external_keys.append(("nodeport", f"{proto} . {svc.node_port}"))
    for kind, ext_key in external_keys:
        by_ip = kind == "ip"
        backends_map = IP_BACKENDS if by_ip else NODEPORT_BACKENDS
        elements: list[Element] = []
        chain_or_none: LBChain | None = None
        if sel.has_any:
            if svc.external_policy_local:
                chain_or_none = LBChain(
                    "local-ip" if by_ip else "local-np", len(sel.cluster), len(sel.local)
                )
                elements.extend(_backends(backends_map, ext_key, sel.cluster))
                elements.extend(_backends(backends_map, ext_key, sel.local, LOCAL_OFFSET))
            else:
                chain_or_none = LBChain("external-ip" if by_ip else "external-np", len(external))
                elements.extend(_backends(backends_map, ext_key, external))
            elements.insert(
                0, (SERVICE_IPS if by_ip else SERVICE_NODEPORTS, ext_key, chain_or_none.goto)
            )
        if not external:
            # No endpoints at all (reject), or none on this node for Local policy (drop
            # whatever the chain above did not short-circuit).
            elements.append(
                (
                    NO_ENDPOINT_SERVICES if by_ip else NO_ENDPOINT_NODEPORTS,
                    ext_key,
                    unreachable_verdict(),
                )
            )
        dests.append(Destination((kind, ext_key), tuple(elements), chain_or_none))

    hairpin = tuple(
        f"{ep.ip} . {ep.ip}"
        for ep in sel.all_reachable
        if ep.node_name is None or ep.node_name == cfg.node.name
    )
    return PortRules(
        destinations=tuple(dests),
        hairpin=hairpin,
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
    chains: set[LBChain] = field(default_factory=set)
    conflicts: list[Conflict] = field(default_factory=list)

    def element_count(self) -> int:
        return sum(len(v) for v in self.elements.values())


def collect(rules: Mapping[ServicePortName, PortRules]) -> TableContents:
    """Merge per-ServicePort rules, resolving destination conflicts deterministically."""
    out = TableContents(elements={name: {} for name in ALL_MAPS})
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
            if dest.chain is not None:
                out.chains.add(dest.chain)
        hairpin = out.elements[HAIRPIN]
        for pair in port_rules.hairpin:
            hairpin[pair] = None
    return out


ALL_MAPS = (
    SERVICE_IPS,
    SERVICE_NODEPORTS,
    IP_BACKENDS,
    NODEPORT_BACKENDS,
    NO_ENDPOINT_SERVICES,
    NO_ENDPOINT_NODEPORTS,
    HAIRPIN,
)


def skeleton(cfg: FamilyConfig) -> Table:
    """The fixed part of the table: base chains, dispatch chains, empty maps and sets."""
    v = cfg.vocab
    mark = f"{cfg.masquerade_mark:#010x}"
    table = Table(v.table_family, TABLE, TABLE_COMMENT)
    dispatch = f"{v.ip} daddr . meta l4proto . th dport"

    table.sets = [
        Set.map(
            SERVICE_IPS,
            f"{v.addr_type} . inet_proto . inet_service : verdict",
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
            f"{v.addr_type} . inet_proto . inet_service : verdict",
            comment="drop or reject traffic to services with no usable endpoints",
        ),
        Set.map(
            NO_ENDPOINT_NODEPORTS,
            "inet_proto . inet_service : verdict",
            comment="drop or reject traffic to nodeports with no usable endpoints",
        ),
        Set(
            HAIRPIN,
            f"{v.addr_type} . {v.addr_type}",
            comment="endpoint pairs that must be masqueraded when a pod reaches itself",
        ),
    ]

    nodeport_match = ""
    if cfg.node_ports.enabled:
        nodeport_match = f"fib daddr type local {v.ip} daddr != {v.loopback} "
        if not cfg.node_ports.match_all:
            table.sets.append(
                Set(
                    NODEPORT_IPS,
                    v.addr_type,
                    ("interval",),
                    list(cfg.node_ports.ranges),
                    comment="addresses that accept NodePort traffic",
                )
            )
            nodeport_match += f"{v.ip} daddr @{NODEPORT_IPS} "

    services = [f"{dispatch} vmap @{SERVICE_IPS}"]
    endpoints_check = [f"{dispatch} vmap @{NO_ENDPOINT_SERVICES}"]
    if nodeport_match:
        services.append(f"{nodeport_match}meta l4proto . th dport vmap @{SERVICE_NODEPORTS}")
        endpoints_check.append(
            f"{nodeport_match}meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"
        )

    # Numeric priorities: nft 1.0.6 only accepts the names (dstnat, srcnat) on some hooks.
    # dstnat is -100, srcnat 100. Filter chains run at dstnat - 10: before DNAT on the
    # output path, and after it on input/forward (prerouting has DNATed by then), so
    # short-circuited traffic that was DNATed no longer matches the no-endpoint maps.
    filter_prio = "-110"
    table.chains = [
        Chain(
            "filter-input",
            ["ct state new jump endpoints-check"],
            BaseChain("filter", "input", filter_prio),
        ),
        Chain(
            "filter-forward",
            ["ct state new jump endpoints-check"],
            BaseChain("filter", "forward", filter_prio),
        ),
        Chain(
            "filter-output",
            ["ct state new jump endpoints-check"],
            BaseChain("filter", "output", filter_prio),
        ),
        Chain("nat-prerouting", ["jump services"], BaseChain("nat", "prerouting", "-100")),
        Chain("nat-output", ["jump services"], BaseChain("nat", "output", "-100")),
        Chain("nat-postrouting", ["jump masquerading"], BaseChain("nat", "postrouting", "100")),
        Chain("services", services),
        Chain("endpoints-check", endpoints_check),
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
    table.chains.extend(Chain(c.name, c.rules(cfg)) for c in sorted(contents.chains))
    return table
