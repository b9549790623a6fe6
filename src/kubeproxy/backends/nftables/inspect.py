"""nftables mode's knowledge for ``explain`` and ``list`` (an
:class:`~kubeproxy.backends.inspection.Inspector`; ebpf mode's packets meet these rules too).

* :data:`RULES` -- where nftables mode treats packets unlike the others: a ClusterIP's
  other ports are rejected (``cluster-ips-check``), a service-CIDR address allocated to
  nothing is dropped, a load balancer's source ranges hold without endpoints;
* :func:`kernel_objects` -- from :func:`kubeproxy.backends.nftables.render.render_service_port`:
  the frontend's element in the ``-dests`` set of its shared chain (with session
  affinity: in ``service-ips`` / ``service-nodeports``), its endpoints in that chain's
  ``-backends`` map by index, that shared chain, ``no-endpoint-*`` and firewall
  elements, and session-affinity chains;
* :func:`any_index` -- a backends map's elements as two kernels holding the same
  endpoints at other indexes compare equal (:mod:`kubeproxy.lab.rulestate`);
* :func:`drift` / :func:`kernel_only` -- the table's chains and the elements of the sets
  and maps named (``nft -j list table``, ``nft list set|map``), compared with them. The
  frontend's endpoints are compared as a set: a partial sync keeps each endpoint at its
  index, so the kernel's order may differ from a fresh render's with no difference for
  a packet.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kubeproxy.backends.inspection import (
    KernelObject,
    LiveKernel,
    PacketRules,
    Reader,
    RulesInspector,
    read_command,
)
from kubeproxy.backends.nftables import render as nft
from kubeproxy.backends.nftables.table import (
    CLUSTER_IPS,
    DESTS_SUFFIX,
    ELEMENT_SETS,
    FIREWALL_ALLOW,
    LOCAL_OFFSET,
    REJECT_CHAIN,
    SERVICE_CIDRS,
    TABLE,
    Vocabulary,
    is_backends,
    static_sets,
)
from kubeproxy.dataplane.process import ToolError
from kubeproxy.model.fate import Explanation, Outcome
from kubeproxy.model.plan import FamilyPlan, Frontend, FrontendKind, ServicePortPlan

CLUSTER_IPS_CHECK = "cluster-ips-check"

# The tables of nftables mode, (family, name).
KUBE_PROXY_TABLES = (("ip", TABLE), ("ip6", TABLE))

RULES = PacketRules(
    "nftables",
    firewall_without_endpoints=True,
    reject_other_cluster_ip_ports=CLUSTER_IPS_CHECK,
    drop_unallocated_service_ips=True,
)


def nft_table(fam: FamilyPlan) -> str:
    return f"{Vocabulary.of(fam.family).table_family} {TABLE}"


def kernel_objects(
    result: Explanation, fam: FamilyPlan, scheduler: str = "rr"
) -> tuple[KernelObject, ...]:
    plan, frontend = result.plan, result.frontend
    if plan is None or frontend is None:
        return _unmatched(result, fam)
    return _frontend(plan, frontend, fam)


def _unmatched(result: Explanation, fam: FamilyPlan) -> tuple[KernelObject, ...]:
    if result.verdict is Outcome.NONE:
        return ()
    table = nft_table(fam)
    if result.verdict is Outcome.REJECT:
        return (
            KernelObject("element", table, CLUSTER_IPS, result.packet.dst),
            KernelObject("chain", table, CLUSTER_IPS_CHECK),
        )
    return (
        KernelObject("chain", table, CLUSTER_IPS_CHECK),
        KernelObject("element", table, SERVICE_CIDRS, "*"),
    )


def nft_claim(plan: ServicePortPlan, frontend: Frontend) -> tuple[str, str]:
    """The destination key of a frontend, as the nftables renderer claims it."""
    proto = plan.service_port.protocol.nft
    if frontend.kind is FrontendKind.NODE_PORT:
        return ("nodeport", f"{proto} . {frontend.port}")
    return ("ip", f"{frontend.ip} . {proto} . {frontend.port}")


def _frontend(
    plan: ServicePortPlan, frontend: Frontend, fam: FamilyPlan
) -> tuple[KernelObject, ...]:
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


# An element's comment (the ServicePort it belongs to): never part of the key. Comments
# we write hold no comma, quote or brace (transaction.element_comment).
_COMMENT = re.compile(r' comment "[^"]*"$')


def parse_elements(text: str) -> dict[str, str | None]:
    """Elements of one ``nft list map|set`` output: key -> value (None for sets)."""
    match = re.search(r"elements = \{(.*?)\}", text, re.DOTALL)
    if match is None:
        return {}
    out: dict[str, str | None] = {}
    for raw in match.group(1).split(","):
        item = " ".join(raw.split())
        if not item:
            continue
        key, sep, value = item.partition(" : ")
        out[_COMMENT.sub("", key)] = value if sep else None
    return out


def nft_drift(
    result: Explanation,
    fam: FamilyPlan,
    objects: Sequence[KernelObject],
    chains: Iterable[str],
    elements: Mapping[str, Mapping[str, str | None]],
) -> list[str]:
    """Differences between ``objects`` and the kernel's ``chains`` / ``elements`` (by
    set or map name), as readable lines.

    The frontend's endpoints are compared as a set, not index by index: a partial sync
    keeps each endpoint at the index it had, so the kernel's order may differ from a
    fresh rendering's without any difference for a packet."""
    have = set(chains)
    drift: list[str] = []
    mapname = _backends_map(objects)
    for obj in objects:
        if obj.kind == "chain" and obj.name not in have:
            drift.append(f"missing {obj}")
        elif obj.kind == "element" and obj.key != "*" and obj.name != mapname:
            held = elements.get(obj.name, {})
            if obj.key not in held:
                drift.append(f"missing {obj}")
            elif held[obj.key] != obj.value:
                drift.append(f"{obj}: the kernel has {held[obj.key]!r}")
    if result.plan is not None and result.frontend is not None and mapname is not None:
        prefix = nft_claim(result.plan, result.frontend)[1] + " . "
        expected = {
            (o.key.removeprefix(prefix), o.value)
            for o in objects
            if o.kind == "element" and o.name == mapname
        }
        kernel = {
            (key.removeprefix(prefix), value)
            for key, value in elements.get(mapname, {}).items()
            if key.startswith(prefix)
        }
        want = Counter((_local(i), v) for i, v in expected)
        got = Counter((_local(i), v) for i, v in kernel)
        for (local, value), _ in sorted((want - got).items()):
            drift.append(f"missing endpoint {_endpoint(value)}{local} in {mapname}")
        # An endpoint the kernel has once too often is reported at an index the plan
        # does not use, if it has one there (out of range: numgen never picks it).
        surplus = got - want
        used = {i for i, _ in expected}
        for index, value in sorted(kernel, key=lambda e: (e[0] in used, int(e[0]))):
            if surplus[(_local(index), value)] > 0:
                surplus[(_local(index), value)] -= 1
                drift.append(
                    f"extra endpoint {_endpoint(value)}{_local(index)} in {mapname} (index {index})"
                )
    return drift


def _local(index: str) -> str:
    """How an index of the backends maps is reported: node-local endpoints (Local traffic
    policy) are at ``LOCAL_OFFSET`` and up."""
    return " (node-local)" if int(index) >= LOCAL_OFFSET else ""


def _backends_map(objects: Sequence[KernelObject]) -> str | None:
    """The backends map of the frontend's shared chain (none with session affinity or
    without endpoints)."""
    for obj in objects:
        if obj.kind == "element" and is_backends(obj.name):
            return obj.name
    return None


def _endpoint(value: str | None) -> str:
    """``ip . port`` (a backends map value) as ``ip:port`` / ``[ip]:port``."""
    ip, _, port = (value or "").partition(" . ")
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def read_nft(
    result: Explanation,
    fam: FamilyPlan,
    objects: Sequence[KernelObject],
    read: Reader = read_command,
) -> tuple[set[str], dict[str, dict[str, str | None]]]:
    """The table's chains and the elements of the sets/maps ``objects`` name (and of the
    frontend's backends map)."""
    table = nft_table(fam)
    family, name = table.split()
    try:
        listing = json.loads(read("nft", ["-j", "-t", "list", "table", family, name]))
    except ToolError:
        return set(), {}
    chains = {
        item["chain"]["name"]
        for item in listing.get("nftables", [])
        if isinstance(item.get("chain"), dict)
    }
    keyword = {s.name: s.keyword for s in static_sets(fam)}
    elements: dict[str, dict[str, str | None]] = {}
    wanted = {o.name for o in objects if o.kind == "element"}
    for set_name in sorted(wanted):
        kind = keyword.get(set_name)
        if set_name.endswith(DESTS_SUFFIX):
            kind = "set"
        elif is_backends(set_name):
            kind = "map"
        if kind is None:
            continue
        try:
            text = read("nft", ["list", kind, family, name, set_name])
        except ToolError:
            text = ""
        elements[set_name] = parse_elements(text)
    return chains, elements


# Sets and maps whose elements each belong to one ServicePort (firewall-allow is an
# interval set, which the kernel prints merged: not comparable element by element).
_SERVICE_SETS = frozenset(ELEMENT_SETS) - {FIREWALL_ALLOW}


def read_nft_service_elements(
    fam: FamilyPlan, read: Reader = read_command
) -> dict[str, dict[str, str | None]]:
    """The elements of every set and map of the table that holds ServicePorts' elements
    (``service-ips``, ``no-endpoint-services``, ``cluster-ips``..., and each shared chain's
    ``-dests`` set); empty when there is no table."""
    family, name = nft_table(fam).split()
    try:
        listing = json.loads(read("nft", ["-j", "-t", "list", "table", family, name]))
    except ToolError:
        return {}
    out: dict[str, dict[str, str | None]] = {}
    for item in listing.get("nftables", []):
        for kind in ("set", "map"):
            obj = item.get(kind)
            set_name = str(obj.get("name")) if isinstance(obj, dict) else ""
            if set_name in _SERVICE_SETS or set_name.endswith(DESTS_SUFFIX):
                try:
                    text = read("nft", ["list", kind, family, name, set_name])
                except ToolError:
                    text = ""
                out[set_name] = parse_elements(text)
    return out


def nft_kernel_only(
    table: str,
    kernel: Mapping[str, Mapping[str, str | None]],
    expected: Iterable[tuple[str, str]],
) -> list[str]:
    """Elements of ``kernel`` (by set) that no ServicePort renders (``expected``: every
    ServicePort's (set, key) pairs)."""
    want = set(expected)
    return [
        f"{table}: {set_name} element {{ {key} }}: no Service has it (stale)"
        for set_name, elements in sorted(kernel.items())
        for key in sorted(elements)
        if (set_name, key) not in want
    ]


def drift(
    result: Explanation,
    fam: FamilyPlan,
    objects: Sequence[KernelObject],
    kernel: LiveKernel,
) -> list[str]:
    chains, elements = read_nft(result, fam, objects, kernel.read)
    if not chains:
        return [f"no table {fam.family.value} kube-proxy: kubeproxy has not synced here"]
    return nft_drift(result, fam, objects, chains, elements)


def kernel_only(
    families: Sequence[tuple[FamilyPlan, Sequence[ServicePortPlan]]],
    expected: Sequence[KernelObject],
    kernel: LiveKernel,
) -> list[str]:
    """Elements no ServicePort of the plan renders (rendered again here, as a sync would)."""
    out: list[str] = []
    for fam, plans in families:
        want = [
            (set_name, key)
            for rules in (nft.render_service_port(plan, fam) for plan in plans)
            for elements in (*(d.elements for d in rules.destinations), rules.shared)
            for set_name, key, _ in elements
        ]
        have = read_nft_service_elements(fam, kernel.read)
        out += nft_kernel_only(nft_table(fam), have, want)
    return out


class NftablesInspector(RulesInspector):
    rules = RULES

    kernel_objects = staticmethod(kernel_objects)
    drift = staticmethod(drift)
    kernel_only = staticmethod(kernel_only)


INSPECTOR = NftablesInspector()


# ------------------------------------------------------- two kernels compared


def any_index(elements: list[Any]) -> list[str]:
    """A backends map's elements (``destination . index : endpoint``) with each
    destination's endpoints sorted and indexed from 0 (node-local ones, at
    ``LOCAL_OFFSET`` and up, from ``LOCAL_OFFSET``): equal for the same endpoints at any
    indexes."""
    groups: dict[str, list[str]] = {}
    for key, value in elements:
        *destination, index = key["concat"]
        group = json.dumps([destination, index >= LOCAL_OFFSET])
        groups.setdefault(group, []).append(json.dumps(value, sort_keys=True))
    out: list[str] = []
    for group, values in groups.items():
        destination, local = json.loads(group)
        first = LOCAL_OFFSET if local else 0
        for i, value in enumerate(sorted(values)):
            key = {"concat": [*destination, first + i]}
            out.append(json.dumps([key, json.loads(value)], sort_keys=True))
    return sorted(out)
