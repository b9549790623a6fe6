"""The fixed part of the ``kube-proxy`` nftables table (pure; see docs/nftables-layout.md).

* names of the table, maps, sets and skeleton chains (stable: tests, docs and
  ``explain`` refer to them) and :class:`Vocabulary` (how a family is spelled in nft);
* :func:`local_match` — the family's local-traffic detector as an nft match;
* :func:`policy_rules` and :class:`LBChain` — the shared load-balancing chains, whose
  rules depend only on the family plan, a traffic kind and endpoint counts;
* :func:`static_sets` and :func:`skeleton` — base chains, dispatch chains, maps and sets.

Destinations reach their shared chain through *sets*, one per chain (``<chain>-dests``),
tested by one rule each in the dispatch chains, not through per-destination verdict-map
elements: the kernel re-validates the table's whole jump graph — every jump/goto element
of every verdict map — for any batch that adds a jump or goto, so with one verdict per
Service, adding a Service or changing its endpoint count cost O(Services). With sets, both
are element updates only (see docs/nftables-layout.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from kubeproxy.dataplane.nftables.transaction import BaseChain, Chain, ScriptError, Set, Table
from kubeproxy.model.plan import FamilyPlan, LocalTraffic
from kubeproxy.model.types import IPFamily

TABLE = "kube-proxy"
TABLE_COMMENT = "rules for kube-proxy"
# Index offset of node-local endpoints in the backends maps (Local traffic policy).
LOCAL_OFFSET = 65536

SERVICE_IPS = "service-ips"
SERVICE_NODEPORTS = "service-nodeports"
NO_ENDPOINT_SERVICES = "no-endpoint-services"
NO_ENDPOINT_NODEPORTS = "no-endpoint-nodeports"
HAIRPIN = "hairpin"
# Names upstream's nftables mode also uses are for objects of its definition: going back
# to it, its first sync adds its sets and maps over whatever holds those names, and a
# set of another type or flags where it wants a map (its firewall-ips) or a plain set
# (its nodeport-ips) fails that sync, and every one after it.
FIREWALL_IPS = "firewalled-ips"
FIREWALL_ALLOW = "firewall-allow"
CLUSTER_IPS = "cluster-ips"
SERVICE_CIDRS = "service-cidrs"
NODEPORT_IPS = "nodeport-addresses"
REJECT_CHAIN = "reject-chain"

VERDICT_REJECT = f"goto {REJECT_CHAIN}"
VERDICT_DROP = "drop"

NODEPORTS_CHAIN = "nodeports"
# Sets of the destinations that use one shared chain: "<chain name>-dests"; and the
# map of their endpoints by index: "<chain name>-backends".
DESTS_SUFFIX = "-dests"
BACKENDS_SUFFIX = "-backends"

# Sets and maps whose elements come from ServicePorts (the others hold configuration;
# the "-dests" sets and "-backends" maps of the shared chains come and go with their
# chains).
ELEMENT_SETS = (
    SERVICE_IPS,
    SERVICE_NODEPORTS,
    NO_ENDPOINT_SERVICES,
    NO_ENDPOINT_NODEPORTS,
    HAIRPIN,
    FIREWALL_IPS,
    FIREWALL_ALLOW,
    CLUSTER_IPS,
)
# Maps and sets whose elements say which ServicePort they belong to (a comment
# ``namespace/name:port``, as upstream's): one element per destination, the one an
# operator meets first. The backends maps' elements (one per endpoint) carry none: their
# key starts with the destination's, which names the ServicePort in the maps above.
COMMENTED_SETS = frozenset(
    {SERVICE_IPS, SERVICE_NODEPORTS, NO_ENDPOINT_SERVICES, NO_ENDPOINT_NODEPORTS, FIREWALL_IPS}
)


def commented(set_name: str) -> bool:
    """Whether the elements of ``set_name`` name their ServicePort (the fixed maps above,
    and every shared chain's ``-dests`` set: one element per destination)."""
    return set_name in COMMENTED_SETS or set_name.endswith(DESTS_SUFFIX)


def is_entry(set_name: str) -> bool:
    """Whether an element of ``set_name`` makes a destination reachable (the dispatch
    maps and the ``-dests`` sets): a new table is loaded with these last."""
    return set_name in (SERVICE_IPS, SERVICE_NODEPORTS) or set_name.endswith(DESTS_SUFFIX)


def is_backends(set_name: str) -> bool:
    """Whether ``set_name`` is a shared chain's backends map. nft 1.0.6 cannot rebuild
    their ``typeof ... th dport`` type from the kernel; see the proxier for what that
    costs."""
    return set_name.endswith(BACKENDS_SUFFIX)


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


# Linux interface names: at most 15 bytes; this subset needs no escaping inside quotes.
_IFNAME = re.compile(r"^[A-Za-z0-9_.+@-]{1,15}$")


def local_match(local: LocalTraffic, v: Vocabulary, *, negate: bool = False) -> str:
    """The nft match for "from a local Pod" (or its negation); "" when not implemented."""
    op = "!= " if negate else ""
    if local.cidrs:
        cidrs = local.cidrs[0] if len(local.cidrs) == 1 else "{ " + ", ".join(local.cidrs) + " }"
        return f"{v.ip} saddr {op}{cidrs}"
    if local.interface is not None:
        if not _IFNAME.match(local.interface):
            raise ScriptError(f"invalid interface name {local.interface!r}")
        return f'iifname {op}"{local.interface}{"*" if local.prefix else ""}"'
    return ""


def policy_rules(
    kind: str, fam: FamilyPlan, to_cluster: str | None, to_local: str | None = None
) -> list[str]:
    """The masquerade and short-circuit logic of one traffic kind.

    ``to_cluster`` / ``to_local`` are the final statements sending the connection to the
    cluster-wide / node-local endpoints (a DNAT from a backends map, or a ``goto`` to a
    session-affinity chain). Kinds:

    * ``cluster-ip``: traffic to a ClusterIP. Masquerade unless it comes from a local
      Pod (the replies must come back through this node), or always with
      ``--masquerade-all`` (the plan's :class:`~kubeproxy.model.plan.Masquerade`).
    * ``external``: external IP / LB IP / NodePort with externalTrafficPolicy Cluster:
      always masquerade (the endpoint may be on another node).
    * ``local``: the same with externalTrafficPolicy Local: local Pods are
      short-circuited to the cluster endpoints (as if they had gone out to the load
      balancer and back), the node itself too (masqueraded: its source address is
      local), everyone else goes to this node's endpoints with the client address kept.
    """
    v = Vocabulary.of(fam.family)
    mark = f"meta mark set meta mark | {fam.masquerade_mark:#010x}"
    rules: list[str] = []
    if kind == "cluster-ip":
        if fam.masquerade_all:
            rules.append(mark)
        elif fam.local.implemented:
            rules.append(f"{local_match(fam.local, v, negate=True)} {mark}")
        if to_cluster:
            rules.append(to_cluster)
        return rules
    if kind == "external":
        return [mark, to_cluster] if to_cluster else []
    if to_cluster:
        if fam.local.implemented:
            rules.append(f"{local_match(fam.local, v)} {to_cluster}")
        rules.append(f"fib saddr type local {mark}")
        rules.append(f"fib saddr type local {to_cluster}")
    if to_local:
        rules.append(to_local)
    return rules


@dataclass(frozen=True, slots=True, order=True)
class LBChain:
    """A shared load-balancing chain.

    ``kind`` is ``cluster-ip``, ``external-ip``/``external-np`` (externalTrafficPolicy
    Cluster) or ``local-ip``/``local-np`` (Local); ``-ip`` chains key their destinations
    by address, protocol and port, ``-np`` chains by NodePort.

    Each has its own backends map (not one map for every chain): the kernel checks
    every element of a map when a new rule binds it (``nf_tables_bind_set``), so with a
    shared map, a new chain — a Service taking an endpoint count no other Service has —
    cost O(endpoints of the table); with its own, the new chain binds an empty map.
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

    @property
    def by_node_port(self) -> bool:
        return self.kind.endswith("-np")

    @property
    def dests(self) -> str:
        """The set of the destinations that use this chain."""
        return f"{self.name}{DESTS_SUFFIX}"

    def dests_set(self, family: IPFamily) -> Set:
        v = Vocabulary.of(family)
        key = "inet_proto . inet_service"
        if not self.by_node_port:
            key = f"{v.addr_type} . {key}"
        return Set(self.dests, key, comment=f"destinations that use chain {self.name}")

    @property
    def backends(self) -> str:
        """The map of this chain's endpoints: destination and index -> endpoint.
        Node-local endpoints (Local traffic policy) are at ``LOCAL_OFFSET + i``."""
        return f"{self.name}{BACKENDS_SUFFIX}"

    def backends_map(self, family: IPFamily) -> Set:
        ip = Vocabulary.of(family).ip
        key = "meta l4proto . th dport . numgen random mod 1"
        if not self.by_node_port:
            key = f"{ip} daddr . {key}"
        return Set.map(
            self.backends,
            f"typeof {key} : {ip} daddr . th dport",
            comment=f"endpoints of chain {self.name} by index",
        )

    def dispatch_rule(self, family: IPFamily) -> str:
        """Its rule in ``services`` (``nodeports`` for a NodePort chain)."""
        key = "meta l4proto . th dport"
        if not self.by_node_port:
            key = f"{Vocabulary.of(family).ip} daddr . {key}"
        return f"{key} @{self.dests} {self.goto}"

    def rules(self, fam: FamilyPlan) -> list[str]:
        v = Vocabulary.of(fam.family)
        by_node_port = self.by_node_port
        key = "meta l4proto . th dport"
        if not by_node_port:
            key = f"{v.ip} daddr . {key}"
        backends = self.backends

        def dnat(n: int, offset: int = 0) -> str | None:
            if not n:
                return None
            off = f" offset {offset}" if offset else ""
            return f"dnat {v.ip} to {key} . numgen random mod {n}{off} map @{backends}"

        policy = self.kind.split("-")[0]
        if policy == "cluster":
            policy = "cluster-ip"
        return policy_rules(policy, fam, dnat(self.cluster), dnat(self.local, LOCAL_OFFSET))


def static_sets(fam: FamilyPlan) -> list[Set]:
    """The table's sets and maps (empty; elements are added by the proxier). Those upstream
    has too carry its definitions and comments (see FIREWALL_IPS): a node going from one
    proxy to the other keeps each as the running one writes it."""
    v = Vocabulary.of(fam.family)
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
            NO_ENDPOINT_SERVICES,
            f"{addr} . inet_proto . inet_service : verdict",
            comment="vmap to drop or reject packets to services with no endpoints",
        ),
        Set.map(
            NO_ENDPOINT_NODEPORTS,
            "inet_proto . inet_service : verdict",
            comment="vmap to drop or reject packets to service nodeports with no endpoints",
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
        Set(CLUSTER_IPS, addr, comment="Active ClusterIPs"),
        Set(SERVICE_CIDRS, addr, ("interval",), comment="service IP ranges"),
    ]
    if fam.node_ports.enabled and not fam.node_ports.match_all:
        sets.append(
            Set(NODEPORT_IPS, addr, ("interval",), comment="addresses that accept NodePort traffic")
        )
    return sets


def config_elements(fam: FamilyPlan) -> dict[str, list[str]]:
    """Elements of the sets that hold configuration rather than ServicePorts (merged
    CIDRs: an interval set refuses overlapping elements)."""
    out = {SERVICE_CIDRS: list(fam.service_cidrs)}
    if fam.node_ports.enabled and not fam.node_ports.match_all:
        out[NODEPORT_IPS] = list(fam.node_ports.ranges)
    return out


def _nodeport_match(fam: FamilyPlan) -> str:
    if not fam.node_ports.enabled:
        return ""
    v = Vocabulary.of(fam.family)
    match = f"fib daddr type local {v.ip} daddr != {v.loopback} "
    if not fam.node_ports.match_all:
        match += f"{v.ip} daddr @{NODEPORT_IPS} "
    return match


def dispatch_chains(fam: FamilyPlan, classes: Iterable[LBChain]) -> dict[str, list[str]]:
    """The rules of ``services`` and ``nodeports``: the session-affinity verdict maps,
    then one rule per shared chain in use (its ``-dests`` set), in name order."""
    v = Vocabulary.of(fam.family)
    chains = sorted(classes)
    services = [f"{v.ip} daddr . meta l4proto . th dport vmap @{SERVICE_IPS}"]
    services += [c.dispatch_rule(fam.family) for c in chains if not c.by_node_port]
    nodeport_match = _nodeport_match(fam)
    if nodeport_match:
        services.append(f"{nodeport_match}goto {NODEPORTS_CHAIN}")
    nodeports = [f"meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"]
    nodeports += [c.dispatch_rule(fam.family) for c in chains if c.by_node_port]
    return {"services": services, NODEPORTS_CHAIN: nodeports}


def skeleton(fam: FamilyPlan, classes: Iterable[LBChain] = ()) -> Table:
    """The fixed part of the table: base chains, dispatch chains (with a rule for each
    shared chain in ``classes``), maps and sets."""
    classes = sorted(classes)
    v = Vocabulary.of(fam.family)
    mark = f"{fam.masquerade_mark:#010x}"
    table = Table(v.table_family, TABLE, TABLE_COMMENT)
    dispatch = f"{v.ip} daddr . meta l4proto . th dport"
    table.sets = static_sets(fam)
    for s in table.sets:
        s.elements = [(e, None) for e in config_elements(fam).get(s.name, ())]
    for c in classes:
        table.sets.extend((c.dests_set(fam.family), c.backends_map(fam.family)))

    nodeport_match = _nodeport_match(fam)
    dispatching = dispatch_chains(fam, classes)
    endpoints_check = [f"{dispatch} vmap @{NO_ENDPOINT_SERVICES}"]
    # As upstream, NodePorts without endpoints are refused on the input path only: the
    # node's own connection to one leaves through output and is refused on arrival
    # (ECONNREFUSED), not dropped on its way out (EPERM from connect() or send()).
    nodeport_endpoints_check = (
        [f"{nodeport_match}meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"]
        if nodeport_match
        else []
    )
    cluster_ips_check = [f"{v.ip} daddr @{CLUSTER_IPS} reject"]
    if fam.service_cidrs:
        cluster_ips_check.append(f"{v.ip} daddr @{SERVICE_CIDRS} drop")

    # Numeric priorities: nft 1.0.6 only accepts the names (dstnat, srcnat) on some hooks.
    # dstnat is -100, srcnat 100. The no-endpoint and ClusterIP checks must see traffic
    # after DNAT on every path, so that short-circuited traffic (a local Pod's or this
    # node's own connection to an externalTrafficPolicy: Local destination without local
    # endpoints), once DNATed, no longer matches the no-endpoint maps (upstream #132456):
    # input/forward run after prerouting's DNAT anyway; on the output path they run at
    # dstnat + 10. The firewall check must see the destination before DNAT: dstnat - 10.
    # The base chains have upstream's names (v1.37): going back to kube-proxy's nftables
    # mode, it deletes and recreates its base chains by name, and one of ours under
    # another name would stay hooked in beside its rules with what we last wrote.
    pre, post = "-110", "-90"
    new = "ct state new"
    table.chains = [
        Chain(
            "filter-prerouting-pre-dnat",
            [f"{new} jump firewall-check"],
            BaseChain("filter", "prerouting", pre),
        ),
        Chain(
            "filter-input",
            [f"{new} jump endpoints-check", f"{new} jump nodeport-endpoints-check"],
            BaseChain("filter", "input", pre),
        ),
        Chain(
            "filter-forward",
            [f"{new} jump endpoints-check", f"{new} jump cluster-ips-check"],
            BaseChain("filter", "forward", pre),
        ),
        Chain(
            "filter-output-pre-dnat",
            [f"{new} jump firewall-check"],
            BaseChain("filter", "output", pre),
        ),
        Chain(
            "filter-output",
            [f"{new} jump endpoints-check", f"{new} jump cluster-ips-check"],
            BaseChain("filter", "output", post),
        ),
        Chain("nat-prerouting", ["jump services"], BaseChain("nat", "prerouting", "-100")),
        Chain("nat-output", ["jump services"], BaseChain("nat", "output", "-100")),
        Chain("nat-postrouting", ["jump masquerading"], BaseChain("nat", "postrouting", "100")),
        Chain("services", dispatching["services"]),
        Chain(NODEPORTS_CHAIN, dispatching[NODEPORTS_CHAIN]),
        Chain("endpoints-check", endpoints_check),
        Chain("nodeport-endpoints-check", nodeport_endpoints_check),
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


# Chains the skeleton always has (the canary check looks for the base chains).
SKELETON_CHAINS = frozenset(
    {
        "filter-prerouting-pre-dnat",
        "filter-input",
        "filter-forward",
        "filter-output-pre-dnat",
        "filter-output",
        "nat-prerouting",
        "nat-output",
        "nat-postrouting",
        "services",
        NODEPORTS_CHAIN,
        "endpoints-check",
        "nodeport-endpoints-check",
        "firewall-check",
        "cluster-ips-check",
        REJECT_CHAIN,
        "masquerading",
    }
)
