"""Chain names of iptables mode: upstream kube-proxy's, computed exactly as upstream does.

The fixed chains keep upstream's names and roles (``KUBE-SERVICES``, ``KUBE-NODEPORTS``,
``KUBE-MARK-MASQ``, ...), and a ServicePort's chains are named from the same hashes
(``KUBE-SVC-`` + base32(sha256("ns/name:port" + "tcp"))[:16], ``KUBE-SEP-`` with the
endpoint appended), so a node switched from upstream's iptables mode shows the chain
names its operators already know (``iptables-save | grep KUBE-SVC``). Names of our own
dispatch chains (``KUBE-SVC-DS-``) are hashes too: no user string is ever a chain name.
"""

from __future__ import annotations

import base64
import hashlib

from kubeproxy.model.types import ServicePortName

KUBE_SERVICES = "KUBE-SERVICES"
KUBE_EXTERNAL_SERVICES = "KUBE-EXTERNAL-SERVICES"
KUBE_NODEPORTS = "KUBE-NODEPORTS"
KUBE_POSTROUTING = "KUBE-POSTROUTING"
KUBE_MARK_MASQ = "KUBE-MARK-MASQ"
KUBE_FORWARD = "KUBE-FORWARD"
KUBE_PROXY_FIREWALL = "KUBE-PROXY-FIREWALL"
KUBE_PROXY_CANARY = "KUBE-PROXY-CANARY"
# A copy of kubelet's chain with the anti-martian rule (localhost NodePorts); upstream
# creates it but never deletes it (kubelet owns it).
KUBE_FIREWALL = "KUBE-FIREWALL"

# iptables mode's fixed chains, by table (the canary aside: ipvs mode has none).
FIXED_CHAINS: tuple[tuple[str, str], ...] = (
    ("nat", KUBE_SERVICES),
    ("nat", KUBE_NODEPORTS),
    ("nat", KUBE_POSTROUTING),
    ("nat", KUBE_MARK_MASQ),
    ("filter", KUBE_SERVICES),
    ("filter", KUBE_EXTERNAL_SERVICES),
    ("filter", KUBE_NODEPORTS),
    ("filter", KUBE_PROXY_FIREWALL),
    ("filter", KUBE_FORWARD),
)

SVC_PREFIX = "KUBE-SVC-"
SVL_PREFIX = "KUBE-SVL-"
FW_PREFIX = "KUBE-FW-"
EXT_PREFIX = "KUBE-EXT-"
SEP_PREFIX = "KUBE-SEP-"
# Our dispatch chains start with a prefix of upstream's isServiceChainName: going back
# to kube-proxy, its iptables mode flushes and deletes the nat ones as stale (it knows no
# other chains to delete), and its other modes' start-up cleanup does too; were they
# named otherwise, they would stay, and a KUBE-SVC- chain one of them jumps to could not
# be deleted (CHAIN_DEL: busy), failing that cleanup, or each of its syncs that deletes
# a stale Service chain. (A ServicePort's KUBE-SVC- hash has no "-": no clash.)
DISPATCH_PREFIX = "KUBE-SVC-DS-"
# Before the above: still ours to delete, on a node upgraded from such a version.
OLD_DISPATCH_PREFIX = "KUBE-DS-"
# Chains of one ServicePort, and of our dispatch trees: a full sync deletes those of
# them it no longer wants, and cleanup deletes them all (upstream's isServiceChainName,
# plus ours).
PER_SERVICE_PREFIXES = (SVC_PREFIX, SVL_PREFIX, FW_PREFIX, EXT_PREFIX, SEP_PREFIX)
GENERATED_PREFIXES = (*PER_SERVICE_PREFIXES, OLD_DISPATCH_PREFIX)


def is_generated(chain: str) -> bool:
    return chain.startswith(GENERATED_PREFIXES)


def upstream_name(name: ServicePortName) -> str:
    """``proxy.ServicePortName.String()``: ``ns/name`` plus ``:port`` when named."""
    return f"{name.service}:{name.port}" if name.port else str(name.service)


def _hash(text: str) -> str:
    """Upstream's ``base32(sha256(text))[:16]``. Base32 turns each 5 bytes into 8
    characters on their own, so the first 16 characters are those of the first 10 bytes
    (encoding only those is 3x faster: a full sync names every endpoint's chain)."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()[:10]).decode()


class ServicePortChains:
    """The chain names of one ServicePort (computed once per render)."""

    __slots__ = ("_seps", "base", "ext", "fw", "name", "protocol", "svc", "svl")

    def __init__(self, name: ServicePortName) -> None:
        self.name = upstream_name(name)
        self.protocol = name.protocol.value.lower()
        self.base = _hash(self.name + self.protocol)
        self.svc = SVC_PREFIX + self.base
        self.svl = SVL_PREFIX + self.base
        self.fw = FW_PREFIX + self.base
        self.ext = EXT_PREFIX + self.base
        self._seps: dict[str, str] = {}

    def sep(self, endpoint: str) -> str:
        """``endpoint`` as upstream prints it: ``ip:port`` or ``[ip]:port``. (Remembered:
        a render asks for an endpoint's chain once per rule that names it.)"""
        name = self._seps.get(endpoint)
        if name is None:
            name = self._seps[endpoint] = SEP_PREFIX + _hash(self.name + self.protocol + endpoint)
        return name


def dispatch_chain(root: str, prefix: str) -> str:
    """A node of a dispatch tree: the tree's root chain and the node's key prefix."""
    return DISPATCH_PREFIX + _hash(f"{root}|{prefix}")[:12]
