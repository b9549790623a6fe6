"""ipvs mode's knowledge for ``explain`` and ``list`` (an
:class:`~kubeproxy.backends.inspection.Inspector`).

* :data:`RULES` -- a packet meets a virtual server, not a DNAT rule: its real servers are
  the route's endpoints (or the cluster-wide ones when a Local policy has none here,
  kubernetes#97081), its masquerading follows the ipsets named here, a port no Service
  uses on a ``kube-ipvs0`` address is rejected (``KUBE-IPVS-FILTER``, kubernetes#72236);
* :func:`kernel_objects` -- the virtual server (scheduler, flags, persistence), its real
  servers with their weights, the address on ``kube-ipvs0`` and the frontend's ipset
  members, from :func:`kubeproxy.backends.ipvs.render.contribution`;
* :func:`drift` / :func:`kernel_only` -- against this namespace's IPVS table (netlink),
  ``kube-ipvs0``'s addresses and the ipsets.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kubeproxy.backends.inspection import (
    KernelObject,
    LiveKernel,
    PacketRules,
    Reader,
    RulesInspector,
    VirtualServerNames,
    read_command,
)
from kubeproxy.backends.ipvs import names
from kubeproxy.backends.ipvs import render as ipvs
from kubeproxy.backends.ipvs.names import DUMMY_DEVICE
from kubeproxy.dataplane.ipvs import VirtualServer
from kubeproxy.model.fate import Explanation, Outcome
from kubeproxy.model.plan import FamilyPlan, Frontend, FrontendKind, ServicePortPlan


def _per_protocol(name: str) -> str:
    return name.rsplit("-", 1)[0] + "-*"


RULES = PacketRules(
    "ipvs",
    health_check_accept_chain=names.KUBE_NODE_PORT,
    virtual_servers=VirtualServerNames(
        cluster_ip_set=names.CLUSTER_IP,
        external_ip_sets=(names.EXTERNAL_IP, names.EXTERNAL_IP_LOCAL),
        load_balancer_sets=(names.LOAD_BALANCER, names.LOAD_BALANCER_LOCAL),
        node_port_sets=(
            _per_protocol(names.NODE_PORT_TCP),
            _per_protocol(names.NODE_PORT_LOCAL_TCP),
        ),
        source_ranges_firewall=names.KUBE_SOURCE_RANGES_FIREWALL,
        loop_back_set=names.LOOP_BACK,
        dummy_device=DUMMY_DEVICE,
        filter_chain=names.KUBE_IPVS_FILTER,
    ),
)


def kernel_objects(
    result: Explanation, fam: FamilyPlan, scheduler: str = "rr"
) -> tuple[KernelObject, ...]:
    plan, frontend = result.plan, result.frontend
    if plan is None or frontend is None:
        return ()
    return _frontend(result, plan, frontend, fam, scheduler)


def _frontend(
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


def _view(objects: Sequence[KernelObject], kernel: LiveKernel) -> IpvsView:
    if not kernel.whole:
        return read_ipvs(objects, kernel.read)
    return kernel.once(("ipvs",), lambda: read_ipvs(None, kernel.read))


def drift(
    result: Explanation,
    fam: FamilyPlan,
    objects: Sequence[KernelObject],
    kernel: LiveKernel,
) -> list[str]:
    return ipvs_drift(objects, _view(objects, kernel))


def kernel_only(
    families: Sequence[tuple[FamilyPlan, Sequence[ServicePortPlan]]],
    expected: Sequence[KernelObject],
    kernel: LiveKernel,
) -> list[str]:
    """Virtual servers and ``kube-ipvs0`` addresses no frontend of any family has (one
    IPVS table and one link for both families)."""
    bound = {o.name for o in expected if o.kind == "address"}
    return ipvs_kernel_only(_view((), kernel), expected, bound)


class IpvsInspector(RulesInspector):
    rules = RULES
    service_address_link = DUMMY_DEVICE

    def frontend_addresses(
        self, fam: FamilyPlan, frontend: Frontend, node_addresses: frozenset[str]
    ) -> tuple[str | None, ...]:
        if frontend.kind is FrontendKind.NODE_PORT:
            # A virtual server on each NodePort address.
            return tuple(ipvs.node_port_addresses(fam, node_addresses))
        return (None,)

    kernel_objects = staticmethod(kernel_objects)
    drift = staticmethod(drift)
    kernel_only = staticmethod(kernel_only)


INSPECTOR = IpvsInspector()
