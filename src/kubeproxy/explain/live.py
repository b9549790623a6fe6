"""``explain --live``: what the kernel has now, against what the plan says (the edge).

Reads, never writes: the node's addresses (``ip -j addr``), and in nftables mode the
table's chains and the elements of the maps and sets the explanation names (``nft list
map|set``), in iptables mode ``iptables-save`` of the nat table, in ipvs mode the virtual
server and its real servers (netlink), ``kube-ipvs0``'s addresses and the ipsets
(``ipset save``). The comparison itself is pure (:func:`nft_drift`,
:func:`iptables_drift`, :func:`ipvs_drift`) and unit-tested:

* every expected chain exists;
* every expected element exists with the expected value;
* the endpoints the kernel would DNAT this frontend to are exactly the plan's: an
  element of the backends map under the frontend's key that the plan does not have is an
  extra endpoint (nftables); the ``KUBE-SEP-`` chains the Service chain jumps to and their
  ``--to-destination`` are compared with the candidates (iptables); the virtual
  server's real servers and weights with the plan's (ipvs).

``list --live`` asks the same questions for every frontend, through one
:class:`KernelReader` (each command's output read once: the nftables layout has a fixed
number of sets, whatever the number of Services), and then what the kernel holds that
no frontend of the plan explains (:func:`nft_kernel_only`, :func:`iptables_kernel_only`,
:func:`ipvs_kernel_only`): a Service deleted while its rules stayed behind.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from kubeproxy.backends.iptables import names
from kubeproxy.backends.iptables.names import DISPATCH_PREFIX
from kubeproxy.backends.nftables.table import (
    DESTS_SUFFIX,
    ELEMENT_SETS,
    FIREWALL_ALLOW,
    LOCAL_OFFSET,
    is_backends,
    static_sets,
)
from kubeproxy.dataplane.process import ToolError, run_tool
from kubeproxy.explain.objects import KernelObject, nft_claim, nft_table
from kubeproxy.explain.packet import Explanation, Outcome
from kubeproxy.model.plan import FamilyPlan

TIMEOUT = 30.0

# A runner of read-only commands: (binary, args) -> stdout, or raises ToolError.
Reader = Callable[[str, list[str]], str]


def read_command(binary: str, args: list[str]) -> str:
    proc = run_tool(binary, args, timeout=TIMEOUT, package=_PACKAGES.get(binary, binary))
    if proc.returncode != 0:
        raise ToolError(
            f"{binary} {' '.join(args)}: {proc.stderr.strip() or proc.returncode}",
            binary,
            incomplete=False,  # it answered: a refusal
        )
    return proc.stdout


_PACKAGES = {"ip": "iproute2", "nft": "nftables"}


class KernelReader:
    """A :data:`Reader` that runs each distinct command once and remembers its answer
    (or its failure): ``list --live`` checks every frontend against the same sets."""

    def __init__(self, read: Reader = read_command) -> None:
        self._read = read
        self._answers: dict[tuple[str, tuple[str, ...]], str | ToolError] = {}

    def __call__(self, binary: str, args: list[str]) -> str:
        key = (binary, tuple(args))
        if key not in self._answers:
            try:
                self._answers[key] = self._read(binary, args)
            except ToolError as err:
                self._answers[key] = err
        answer = self._answers[key]
        if isinstance(answer, ToolError):
            raise answer
        return answer


def node_addresses(read: Reader = read_command, skip: str | None = None) -> frozenset[str]:
    """Every address of this network namespace (``ip -j addr``), but ``skip``'s (ipvs
    mode's ``kube-ipvs0`` holds Service addresses, not the node's)."""
    out: set[str] = set()
    for link in json.loads(read("ip", ["-j", "addr"]) or "[]"):
        if skip is not None and link.get("ifname") == skip:
            continue
        for info in link.get("addr_info", []):
            local = info.get("local")
            if isinstance(local, str):
                out.add(local.split("%", 1)[0])
    return frozenset(out)


# ----------------------------------------------------------------------- nftables


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


# ----------------------------------------------------------------------- iptables


def parse_save(text: str) -> tuple[set[str], dict[str, list[list[str]]]]:
    """``iptables-save`` of one table: its chains, and each chain's rules as arguments."""
    chains: set[str] = set()
    rules: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        if line.startswith(":"):
            chains.add(line[1:].split()[0])
        elif line.startswith("-A "):
            args = shlex.split(line)
            rules.setdefault(args[1], []).append(args[2:])
    return chains, rules


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def iptables_drift(result: Explanation, objects: Sequence[KernelObject], save: str) -> list[str]:
    chains, rules = parse_save(save)
    drift = [f"missing {o}" for o in objects if o.kind == "chain" and o.name not in chains]
    route = [
        o.name
        for o in objects
        if o.kind == "chain" and o.name.startswith((names.SVC_PREFIX, names.SVL_PREFIX))
    ]
    if result.verdict is not Outcome.DNAT or not route or route[-1] not in chains:
        return drift
    kernel: set[str] = set()
    for args in rules.get(route[-1], []):
        sep = _arg(args, "-j")
        if sep is None or not sep.startswith(names.SEP_PREFIX):
            continue
        for sep_args in rules.get(sep, []):
            to = _arg(sep_args, "--to-destination")
            if to is not None:
                kernel.add(to)
    expected = set(result.endpoints)
    drift.extend(f"missing endpoint {e} in {route[-1]}" for e in sorted(expected - kernel))
    drift.extend(f"extra endpoint {e} in {route[-1]}" for e in sorted(kernel - expected))
    return drift


# Chains of one ServicePort (or endpoint) in upstream's iptables layout.
SERVICE_CHAIN_PREFIXES = (
    names.SVC_PREFIX,
    names.SVL_PREFIX,
    names.EXT_PREFIX,
    names.FW_PREFIX,
    names.SEP_PREFIX,
)


def iptables_kernel_only(save: str, expected_chains: Iterable[str]) -> list[str]:
    """ServicePort and endpoint chains in the nat table that no Service has."""
    chains, _ = parse_save(save)
    want = set(expected_chains)
    return [
        f"nat: chain {chain}: no Service has it (stale)"
        for chain in sorted(chains)
        if chain.startswith(SERVICE_CHAIN_PREFIXES)
        and not chain.startswith(DISPATCH_PREFIX)  # the trees, not a ServicePort's
        and chain not in want
    ]


# --------------------------------------------------------------------------- ipvs


@dataclass(frozen=True)
class IpvsView:
    """What the kernel has for one explained packet (ipvs mode)."""

    services: Mapping[str, str]  # virtual server (str of its key) -> scheduler, flags...
    real_servers: Mapping[str, Mapping[str, str]]  # virtual server -> ip:port -> weight
    addresses: frozenset[str]  # on kube-ipvs0
    members: Mapping[str, frozenset[str]]  # set -> members


def ipvs_drift(objects: Sequence[KernelObject], view: IpvsView) -> list[str]:
    """Missing or different objects, and real servers the plan does not have."""
    drift: list[str] = []
    for obj in objects:
        if obj.kind == "virtual-server":
            have = view.services.get(obj.name)
            if have is None:
                drift.append(f"missing {obj}")
            elif have != obj.key:
                drift.append(f"{obj}: the kernel has {have!r}")
        elif obj.kind == "real-server":
            weight = view.real_servers.get(obj.name, {}).get(obj.key)
            if weight is None and obj.name in view.services:
                drift.append(f"missing {obj}")
            elif weight is not None and weight != obj.value:
                drift.append(f"{obj}: the kernel has {weight}")
        elif (obj.kind == "address" and obj.name not in view.addresses) or (
            obj.kind == "element" and obj.key not in view.members.get(obj.name, frozenset())
        ):
            drift.append(f"missing {obj}")
    expected = {(o.name, o.key) for o in objects if o.kind == "real-server"}
    for vs in sorted({o.name for o in objects if o.kind == "virtual-server"}):
        for endpoint, weight in sorted(view.real_servers.get(vs, {}).items()):
            if (vs, endpoint) not in expected:
                drift.append(f"extra real server {endpoint} ({weight}) of {vs}")
    return drift


def ipvs_kernel_only(
    view: IpvsView, expected: Iterable[KernelObject], addresses: Iterable[str]
) -> list[str]:
    """Virtual servers on ``kube-ipvs0``'s addresses that no frontend has, and addresses
    on it no frontend needs (``addresses``: those the plan binds)."""
    want = {o.name for o in expected if o.kind == "virtual-server"}
    bound = set(addresses)
    out = [
        f"ipvs: virtual server {name} {how}: no Service has this frontend (stale)"
        for name, how in sorted(view.services.items())
        if name not in want and _vs_address(name) in view.addresses
    ]
    out.extend(
        f"kube-ipvs0: address {a}: no Service has it (stale)"
        for a in sorted(view.addresses - bound)
    )
    return out


def _vs_address(name: str) -> str:
    """The address of a virtual server named as :class:`ServiceKey` prints it."""
    return name.partition("/")[2].rpartition(":")[0].strip("[]")


def read_ipvs(objects: Sequence[KernelObject] | None, read: Reader = read_command) -> IpvsView:
    """The kernel's side of ``objects`` (None: everything): this namespace's IPVS table
    over netlink, ``kube-ipvs0``'s addresses and the ipsets."""
    from kubeproxy.backends.ipvs.names import DUMMY_DEVICE
    from kubeproxy.dataplane.ipset import IpsetCommand
    from kubeproxy.dataplane.ipvs.netlink import NetlinkIpvs

    wanted = None if objects is None else {o.name for o in objects if o.kind == "virtual-server"}
    services: dict[str, str] = {}
    real: dict[str, dict[str, str]] = {}
    ipvs = NetlinkIpvs()
    try:
        for vs in ipvs.services():
            name = str(vs.key)
            if wanted is not None and name not in wanted:
                continue
            services[name] = str(vs).removeprefix(f"{name} ")
            real[name] = {
                (f"[{d.address}]:{d.port}" if ":" in d.address else f"{d.address}:{d.port}"): (
                    f"weight {d.weight}"
                )
                for d in ipvs.destinations(vs.key)
            }
    finally:
        ipvs.close()
    addresses: set[str] = set()
    for link in json.loads(read("ip", ["-j", "addr", "show", "dev", DUMMY_DEVICE]) or "[]"):
        addresses.update(str(i.get("local")) for i in link.get("addr_info", []))
    sets = None if objects is None else {o.name for o in objects if o.kind == "element"}
    members = {
        name: frozenset(state.members)
        for name, state in IpsetCommand().sets().items()
        if sets is None or name in sets
    }
    return IpvsView(services, real, frozenset(addresses), members)
