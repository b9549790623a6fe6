"""Names of ipvs mode: upstream kube-proxy's ipsets, chains and dummy link.

Sets keep upstream's names, types and comments (``pkg/proxy/ipvs``), so a node switched
from upstream's ipvs mode shows the sets its operators know. IPv6 sets are named as
upstream names them: ``KUBE-`` becomes ``KUBE-6-``, cut to ipset's 31 characters.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeproxy.dataplane.ipset import NAME_MAX, SetSpec

DUMMY_DEVICE = "kube-ipvs0"

# nat
KUBE_SERVICES = "KUBE-SERVICES"
KUBE_POSTROUTING = "KUBE-POSTROUTING"
KUBE_MARK_MASQ = "KUBE-MARK-MASQ"
KUBE_NODE_PORT = "KUBE-NODE-PORT"
KUBE_LOAD_BALANCER = "KUBE-LOAD-BALANCER"
# filter
KUBE_FORWARD = "KUBE-FORWARD"
KUBE_PROXY_FIREWALL = "KUBE-PROXY-FIREWALL"
KUBE_SOURCE_RANGES_FIREWALL = "KUBE-SOURCE-RANGES-FIREWALL"
KUBE_IPVS_FILTER = "KUBE-IPVS-FILTER"
KUBE_IPVS_OUT_FILTER = "KUBE-IPVS-OUT-FILTER"

NAT_CHAINS = (KUBE_SERVICES, KUBE_POSTROUTING, KUBE_NODE_PORT, KUBE_LOAD_BALANCER, KUBE_MARK_MASQ)
FILTER_CHAINS = (
    KUBE_FORWARD,
    KUBE_NODE_PORT,
    KUBE_PROXY_FIREWALL,
    KUBE_SOURCE_RANGES_FIREWALL,
    KUBE_IPVS_FILTER,
    KUBE_IPVS_OUT_FILTER,
)

# (table, builtin chain, our chain, comment): upstream's iptablesJumpChain, in its order.
JUMPS: tuple[tuple[str, str, str, str], ...] = (
    ("nat", "OUTPUT", KUBE_SERVICES, "kubernetes service portals"),
    ("nat", "PREROUTING", KUBE_SERVICES, "kubernetes service portals"),
    ("nat", "POSTROUTING", KUBE_POSTROUTING, "kubernetes postrouting rules"),
    ("filter", "FORWARD", KUBE_FORWARD, "kubernetes forwarding rules"),
    ("filter", "INPUT", KUBE_NODE_PORT, "kubernetes health check rules"),
    ("filter", "INPUT", KUBE_PROXY_FIREWALL, "kube-proxy firewall rules"),
    ("filter", "FORWARD", KUBE_PROXY_FIREWALL, "kube-proxy firewall rules"),
    ("filter", "INPUT", KUBE_IPVS_FILTER, "kubernetes ipvs access filter"),
    ("filter", "OUTPUT", KUBE_IPVS_OUT_FILTER, "kubernetes ipvs access filter"),
)

# (base name, type, comment): upstream's ipsetInfo.
LOOP_BACK = "KUBE-LOOP-BACK"
CLUSTER_IP = "KUBE-CLUSTER-IP"
EXTERNAL_IP = "KUBE-EXTERNAL-IP"
EXTERNAL_IP_LOCAL = "KUBE-EXTERNAL-IP-LOCAL"
LOAD_BALANCER = "KUBE-LOAD-BALANCER"
LOAD_BALANCER_FW = "KUBE-LOAD-BALANCER-FW"
LOAD_BALANCER_LOCAL = "KUBE-LOAD-BALANCER-LOCAL"
LOAD_BALANCER_SOURCE_IP = "KUBE-LOAD-BALANCER-SOURCE-IP"
LOAD_BALANCER_SOURCE_CIDR = "KUBE-LOAD-BALANCER-SOURCE-CIDR"
NODE_PORT_TCP = "KUBE-NODE-PORT-TCP"
NODE_PORT_LOCAL_TCP = "KUBE-NODE-PORT-LOCAL-TCP"
NODE_PORT_UDP = "KUBE-NODE-PORT-UDP"
NODE_PORT_LOCAL_UDP = "KUBE-NODE-PORT-LOCAL-UDP"
NODE_PORT_SCTP = "KUBE-NODE-PORT-SCTP-HASH"
NODE_PORT_LOCAL_SCTP = "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
HEALTH_CHECK_NODE_PORT = "KUBE-HEALTH-CHECK-NODE-PORT"
IPVS_IPS = "KUBE-IPVS-IPS"

SETS: tuple[tuple[str, str, str], ...] = (
    (LOOP_BACK, "hash:ip,port,ip",
     "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"),
    (CLUSTER_IP, "hash:ip,port", "Kubernetes service cluster ip + port for masquerade purpose"),
    (EXTERNAL_IP, "hash:ip,port",
     "Kubernetes service external ip + port for masquerade and filter purpose"),
    (EXTERNAL_IP_LOCAL, "hash:ip,port",
     "Kubernetes service external ip + port with externalTrafficPolicy=local"),
    (LOAD_BALANCER, "hash:ip,port", "Kubernetes service lb portal"),
    (LOAD_BALANCER_FW, "hash:ip,port",
     "Kubernetes service load balancer ip + port for load balancer with sourceRange"),
    (LOAD_BALANCER_LOCAL, "hash:ip,port",
     "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"),
    (LOAD_BALANCER_SOURCE_IP, "hash:ip,port,ip",
     "Kubernetes service load balancer ip + port + source IP for packet filter purpose"),
    (LOAD_BALANCER_SOURCE_CIDR, "hash:ip,port,net",
     "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"),
    (NODE_PORT_TCP, "bitmap:port", "Kubernetes nodeport TCP port for masquerade purpose"),
    (NODE_PORT_LOCAL_TCP, "bitmap:port",
     "Kubernetes nodeport TCP port with externalTrafficPolicy=local"),
    (NODE_PORT_UDP, "bitmap:port", "Kubernetes nodeport UDP port for masquerade purpose"),
    (NODE_PORT_LOCAL_UDP, "bitmap:port",
     "Kubernetes nodeport UDP port with externalTrafficPolicy=local"),
    (NODE_PORT_SCTP, "hash:ip,port",
     "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"),
    (NODE_PORT_LOCAL_SCTP, "hash:ip,port",
     "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"),
    (HEALTH_CHECK_NODE_PORT, "bitmap:port", "Kubernetes health check node port"),
    (IPVS_IPS, "hash:ip", "Addresses on the ipvs interface"),
)  # fmt: skip


def set_name(base: str, v6: bool) -> str:
    if not v6:
        return base
    return ("KUBE-6-" + base[len("KUBE-") :])[:NAME_MAX]


@dataclass(frozen=True)
class FamilySets:
    """The sets of one family, by upstream base name."""

    v6: bool

    def name(self, base: str) -> str:
        return set_name(base, self.v6)

    def spec(self, base: str) -> SetSpec:
        for name, set_type, comment in SETS:
            if name == base:
                # A port bitmap has no family; upstream creates one per family too.
                return SetSpec(self.name(base), set_type, self.v6, comment)
        raise KeyError(base)

    def specs(self) -> list[SetSpec]:
        return [self.spec(base) for base, _, _ in SETS]

    def comment(self, base: str) -> str:
        return self.spec(base).comment


def all_set_names() -> set[str]:
    """Every set either family of ipvs mode creates (what cleanup destroys)."""
    return {set_name(base, v6) for base, _, _ in SETS for v6 in (False, True)}
