"""The kernel objects that implement one explained packet's fate (pure).

Computed by the backends' own renderers from the same plan (never re-derived here), so
the names are exactly those a sync programs:

* nftables: the table, the frontend's element in the ``-dests`` set of its shared
  chain (with session affinity: in ``service-ips`` / ``service-nodeports``), its
  endpoints in that chain's ``-backends`` map by index, that shared chain,
  ``no-endpoint-*`` and firewall elements, and session-affinity chains;
* iptables: upstream's chains of the ServicePort (``KUBE-SVC-``, ``KUBE-SVL-``,
  ``KUBE-EXT-``, ``KUBE-FW-``, one ``KUBE-SEP-`` per candidate endpoint) and the
  frontend's entries in the top-level chains;
* ipvs: the virtual server the packet hits (scheduler, flags, persistence), its real
  servers with their weights, the address on ``kube-ipvs0`` and the frontend's ipset
  members, from :func:`kubeproxy.backends.ipvs.render.contribution`.

:class:`KernelObject` is what ``--live`` looks up (:mod:`kubeproxy.explain.live`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from kubeproxy.backends.iptables import render as ipt
from kubeproxy.backends.iptables.names import ServicePortChains
from kubeproxy.backends.ipvs import render as ipvs
from kubeproxy.backends.nftables import render as nft
from kubeproxy.backends.nftables.table import (
    CLUSTER_IPS,
    REJECT_CHAIN,
    SERVICE_CIDRS,
    TABLE,
    Vocabulary,
)
from kubeproxy.config.modes import ProxyMode
from kubeproxy.dataplane.ipvs import VirtualServer
from kubeproxy.explain.packet import Explanation, Outcome
from kubeproxy.model.plan import FamilyPlan, Frontend, FrontendKind, ServicePortPlan


@dataclass(frozen=True, slots=True, order=True)
class KernelObject:
    """A chain, a set/map element or a rule.

    ``kind``: ``chain`` (``name`` is the chain), ``element`` (``name`` is the set or
    map, ``key`` and ``value`` the element), ``rule`` (``name`` is the chain, ``key`` the
    rule's arguments). ``table`` is ``ip kube-proxy``, ``nat``, ``filter``...
    """

    kind: str
    table: str
    name: str
    key: str = ""
    value: str | None = None

    def __str__(self) -> str:
        if self.kind == "virtual-server":
            return f"ipvs: virtual server {self.name} {self.key}"
        if self.kind == "real-server":
            return f"ipvs: {self.name} -> {self.key} {self.value}"
        if self.kind == "address":
            return f"{self.table}: address {self.name}"
        if self.kind == "chain":
            return f"{self.table}: chain {self.name}"
        if self.kind == "rule":
            return f"{self.table}: -A {self.name} {self.key}"
        value = f" : {self.value}" if self.value is not None else ""
        return f"{self.table}: {self.name} element {{ {self.key}{value} }}"


def nft_table(fam: FamilyPlan) -> str:
    return f"{Vocabulary.of(fam.family).table_family} {TABLE}"


# Modes whose packets meet nftables mode's rules (ebpf mode: whatever its socket hooks
# leave alone; their own entries are in kubeproxy.explain.socket_hooks).
NFT_RULES = ("nftables", "ebpf")


def kernel_objects(
    result: Explanation, fam: FamilyPlan, scheduler: str = "rr"
) -> tuple[KernelObject, ...]:
    """What implements ``result`` in its proxy mode's rules (empty when nothing does);
    ``scheduler``: ipvs mode's."""
    plan, frontend = result.plan, result.frontend
    if plan is None or frontend is None:
        return _unmatched(result, fam)
    if result.mode in NFT_RULES:
        return _nft(plan, frontend, fam)
    if result.mode == ProxyMode.IPVS:
        return _ipvs(result, plan, frontend, fam, scheduler)
    return _iptables(result, plan, frontend, fam)


def _unmatched(result: Explanation, fam: FamilyPlan) -> tuple[KernelObject, ...]:
    if result.mode not in NFT_RULES or result.verdict is Outcome.NONE:
        return ()
    table = nft_table(fam)
    if result.verdict is Outcome.REJECT:
        return (
            KernelObject("element", table, CLUSTER_IPS, result.packet.dst),
            KernelObject("chain", table, "cluster-ips-check"),
        )
    return (
        KernelObject("chain", table, "cluster-ips-check"),
        KernelObject("element", table, SERVICE_CIDRS, "*"),
    )


def nft_claim(plan: ServicePortPlan, frontend: Frontend) -> tuple[str, str]:
    """The destination key of a frontend, as the nftables renderer claims it."""
    proto = plan.service_port.protocol.nft
    if frontend.kind is FrontendKind.NODE_PORT:
        return ("nodeport", f"{proto} . {frontend.port}")
    return ("ip", f"{frontend.ip} . {proto} . {frontend.port}")


def _nft(plan: ServicePortPlan, frontend: Frontend, fam: FamilyPlan) -> tuple[KernelObject, ...]:
    table = nft_table(fam)
    rules = nft.render_service_port(plan, fam)
    claim = nft_claim(plan, frontend)
    out: list[KernelObject] = []
    for dest in rules.destinations:
        if dest.claim != claim:
            continue
        for name, key, value in dest.elements:
            out.append(KernelObject("element", table, name, key, value))
            if value is not None and value.startswith("goto "):
                out.append(KernelObject("chain", table, value.removeprefix("goto ")))
            elif dest.chain is not None and name == dest.chain.dests:
                out.append(KernelObject("chain", table, dest.chain.name))
        if dest.chain is not None and not any(o.name == dest.chain.name for o in out):
            out.append(KernelObject("chain", table, dest.chain.name))
    for chain in rules.chains:
        out.append(KernelObject("chain", table, chain.name))
    if any(o.value == f"goto {REJECT_CHAIN}" for o in out):
        out.append(KernelObject("chain", table, REJECT_CHAIN))
    return tuple(dict.fromkeys(out))


def _iptables(
    result: Explanation, plan: ServicePortPlan, frontend: Frontend, fam: FamilyPlan
) -> tuple[KernelObject, ...]:
    rules = ipt.render_service_port(plan, fam, ipt.Settings())
    names = ServicePortChains(plan.name)
    out: list[KernelObject] = []
    for entry in rules.entries:
        tree = ipt.TREES_BY_ID[entry.tree]
        if frontend.kind is FrontendKind.NODE_PORT:
            relevant = tree.ports and f"--dport {frontend.port}" in " ".join(entry.args)
        else:
            relevant = not tree.ports and frontend.ip in entry.args
            relevant = relevant and str(frontend.port) in entry.args
        if relevant:
            out.append(KernelObject("rule", tree.table, tree.parent, shlex.join(entry.args)))
    programmed = {name for name, _ in rules.chains}
    path: list[str] = []
    if result.route == "internal":
        path.append(names.svl if plan.internal.policy.value == "Local" else names.svc)
    elif result.frontend is not None:
        if frontend.kind is FrontendKind.LOAD_BALANCER:
            path.append(names.fw)
        path.append(names.ext)
        ext = plan.external
        local = ext is not None and ext.policy.value == "Local" and result.route != "short-circuit"
        path.append(names.svl if local else names.svc)
    path.extend(names.sep(str(c.endpoint)) for c in result.candidates)
    out.extend(KernelObject("chain", "nat", c) for c in dict.fromkeys(path) if c in programmed)
    return tuple(out)


def _ipvs(
    result: Explanation, plan: ServicePortPlan, frontend: Frontend, fam: FamilyPlan, scheduler: str
) -> tuple[KernelObject, ...]:
    if result.verdict is Outcome.DROP:  # a source-range firewall, before IPVS
        return ()
    node_port = frontend.kind is FrontendKind.NODE_PORT
    ip = result.packet.dst if node_port else frontend.ip
    assert ip is not None
    # Only the frontend's own claim matters; a NodePort is claimed on the packet's address.
    ctx = ipvs.Context(fam, scheduler, frozenset(), (ip,) if node_port else ())
    part = ipvs.contribution(ctx, plan)
    proto = plan.service_port.protocol.value.lower()
    entry = f"{ip},{proto}:{frontend.port}"
    out: list[KernelObject] = []
    for key, vs, dests, bind in part.claims:
        if key.address != ip or key.port != frontend.port:
            continue
        out.append(KernelObject("virtual-server", "ipvs", str(key), _describe(vs)))
        out.extend(
            KernelObject("real-server", "ipvs", str(key), _host_port(a, port), f"weight {w}")
            for (a, port), w in sorted(dests.items())
        )
        if bind:
            out.append(KernelObject("address", "kube-ipvs0", ip))
    for set_name, member in part.members:
        if member.startswith(entry) or (node_port and member == str(frontend.port)):
            out.append(KernelObject("element", "ipset", set_name, member))
    return tuple(out)


def _describe(vs: VirtualServer) -> str:
    """The scheduler, flags and persistence as the ``virtual-server`` object's key."""
    return str(vs).removeprefix(f"{vs.key} ")


def _host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
