"""kernelspace mode's knowledge for ``explain`` and ``list`` (an
:class:`~kubeproxy.backends.inspection.Inspector`).

A packet meets an HNS load balancer, or nothing: which one a frontend is, with its
endpoints, DSR, source VIP and distribution, is :func:`~.translate.translate`'s answer
for the ServicePort (never re-derived here), so it needs the node's HNS network (type,
remote subnets, the root endpoint): an :class:`HnsNode`, from the ``--hns-state`` file
or, on Windows, from HNS itself (:func:`for_config`).

* :data:`RULES` -- the mode's :class:`~kubeproxy.backends.inspection.PacketRules`;
  :attr:`KernelspaceInspector.rules` adds the node's
  :class:`~kubeproxy.backends.inspection.LoadBalancerRules` (the engine's
  ``_decide_load_balancer`` strategy);
* :meth:`KernelspaceInspector.kernel_objects` -- the load balancer (its frontend, flags,
  port mapping, source VIP as render prints them, and endpoint IPs) and the HNS
  endpoints it uses (this node's, the CNI's; remote ones kube-proxy creates; on an
  Overlay network the ClusterIP's);
* :meth:`KernelspaceInspector.drift` / :meth:`KernelspaceInspector.kernel_only` --
  against the load balancers and endpoints HNS holds (``--live``: Windows only).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from kubeproxy.backends.inspection import (
    HnsLoadBalancer,
    KernelObject,
    LiveKernel,
    LoadBalancerRules,
    PacketRules,
    RulesInspector,
)
from kubeproxy.backends.kernelspace.proxier import document
from kubeproxy.backends.kernelspace.translate import (
    NodeContext,
    WantedLoadBalancer,
    node_context,
    service_vip_endpoint,
    translate,
)
from kubeproxy.config.runtime import ConfigError, ProxyConfig
from kubeproxy.dataplane.hns import PROTOCOLS, Hns, HnsError, LoadBalancer, Network
from kubeproxy.dataplane.hns import Endpoint as HnsEndpoint
from kubeproxy.dataplane.hns.schema import Distribution, LoadBalancerFlags
from kubeproxy.model.fate import Explanation
from kubeproxy.model.plan import FamilyPlan, Frontend, FrontendKind, ServicePortPlan

_PROTOCOL_NAMES = {number: name for name, number in PROTOCOLS.items()}
_NO_NETWORK = (
    "kernelspace mode: which HNS load balancer a packet meets depends on the node's HNS "
    "network: give --hns-state FILE (off Windows)"
)


def _missing(*_: object) -> HnsLoadBalancer | None:
    raise ValueError(_NO_NETWORK)


# Without a node's network (the registry's inspector): every question about a load
# balancer says what is missing rather than guess.
RULES = PacketRules("kernelspace", load_balancers=LoadBalancerRules(_missing, "no network"))


@dataclass(frozen=True)
class HnsNode:
    """What explain needs of the node's HNS: its network, the root namespace's endpoint
    (``--root-hnsendpoint-name``, for health-check load balancers), and for ``--live``
    the HNS to read back."""

    config: ProxyConfig
    network: Network
    root: HnsEndpoint | None = None
    hns: Hns | None = None


def load_balancer_object(lb: LoadBalancer, ips: Mapping[str, str]) -> KernelObject:
    """A load balancer as a :class:`KernelObject`, wanted or read back alike: named by
    what HNS keeps unique (frontend VIP, protocol, external port), its settings with
    HCN's numbers as ``render`` prints them, its endpoint IPs (``ips``: by endpoint ID)
    sorted."""
    pm = lb.port_mappings[0]
    proto = _PROTOCOL_NAMES.get(pm.protocol, str(pm.protocol))
    name = f"{lb.vip or '(node ports)'}:{pm.external_port}/{proto}"
    settings = (
        f"internalPort {pm.internal_port} flags {int(lb.flags)} portFlags {int(pm.flags)} "
        f"distribution {int(pm.distribution)} sourceVIP {lb.source_vip or '-'}"
    )
    endpoints = ",".join(sorted(ips.get(i, i) for i in lb.endpoint_ids))
    return KernelObject("load-balancer", "hns", name, settings, endpoints)


def _wanted_object(w: WantedLoadBalancer) -> KernelObject:
    # Its document as the sync sends it, with the endpoints named by IP.
    return load_balancer_object(document(w, [ep.ip for ep in w.endpoints]), {})


class KernelspaceInspector(RulesInspector):
    """kernelspace mode's :class:`~kubeproxy.backends.inspection.Inspector` for one
    node's HNS network (None: the registry's, which can answer nothing about a load
    balancer)."""

    def __init__(self, node: HnsNode | None = None) -> None:
        self.node = node

    @property
    def rules(self) -> PacketRules:
        if self.node is None:
            return RULES
        net = self.node.network
        what = f"{net.type.value} network {net.name}"
        return replace(RULES, load_balancers=LoadBalancerRules(self.find, what))

    def _context(self, fam: FamilyPlan) -> NodeContext:
        if self.node is None:
            raise ValueError(_NO_NETWORK)
        node = self.node
        return node_context(node.config, fam, node.network, node.root)

    def wanted(
        self, plan: ServicePortPlan, frontend: Frontend, fam: FamilyPlan
    ) -> WantedLoadBalancer | None:
        """The load balancer the backend makes for ``frontend`` (None: none, as upstream
        makes none without endpoints)."""
        key = (frontend.ip or "", PROTOCOLS[plan.service_port.protocol.value], frontend.port)
        return next((w for w in translate(plan, self._context(fam)) if w.key == key), None)

    def find(
        self, plan: ServicePortPlan, frontend: Frontend, fam: FamilyPlan
    ) -> HnsLoadBalancer | None:
        w = self.wanted(plan, frontend, fam)
        if w is None:
            return None
        return HnsLoadBalancer(
            name=f"{w.kind} {_wanted_object(w).name}",
            endpoint_ips=tuple(ep.ip for ep in w.endpoints),
            internal_port=w.internal_port,
            dsr=bool(w.flags & LoadBalancerFlags.DSR),
            source_vip=w.source_vip,
            source_ip_distribution=w.distribution is Distribution.SOURCE_IP,
        )

    def frontend_addresses(
        self, fam: FamilyPlan, frontend: Frontend, node_addresses: frozenset[str]
    ) -> tuple[str | None, ...]:
        return (None,)  # one NodePort load balancer, without a VIP, for every address

    def kernel_objects(
        self, result: Explanation, fam: FamilyPlan, scheduler: str = "rr"
    ) -> tuple[KernelObject, ...]:
        plan, frontend = result.plan, result.frontend
        if plan is None or frontend is None:
            return ()
        w = self.wanted(plan, frontend, fam)
        if w is None:
            return ()
        out = [_wanted_object(w)]
        for ep in w.endpoints:
            if ep.local:
                what = "local: the CNI's"
            else:
                pa = f", provider address {ep.provider_address}" if ep.provider_address else ""
                what = f"remote{pa}"
            out.append(KernelObject("endpoint", "hns", ep.ip, what))
        vip = service_vip_endpoint(plan, self._context(fam))
        if vip is not None and frontend.kind is FrontendKind.CLUSTER_IP:
            what = f"remote, provider address {vip.provider_address}: the ClusterIP's"
            out.append(KernelObject("endpoint", "hns", vip.ip, what))
        return tuple(out)

    # ------------------------------------------------------------ --live (Windows)

    def _view(self, kernel: LiveKernel) -> HnsView:
        node = self.node
        if node is None or node.hns is None:
            raise HnsError("no HNS to read (--live runs on the Windows node)")
        hns, network_id = node.hns, node.network.id
        return kernel.once(("hns",), lambda: read_hns(hns, network_id))

    def drift(
        self,
        result: Explanation,
        fam: FamilyPlan,
        objects: Sequence[KernelObject],
        kernel: LiveKernel,
    ) -> list[str]:
        return hns_drift(objects, self._view(kernel))

    def kernel_only(
        self,
        families: Sequence[tuple[FamilyPlan, Sequence[ServicePortPlan]]],
        expected: Sequence[KernelObject],
        kernel: LiveKernel,
    ) -> list[str]:
        """Load balancers HNS holds that no ServicePort wants (health-check load
        balancers included: every load balancer of every plan is wanted)."""
        view = self._view(kernel)
        wanted = {
            _wanted_object(w).name
            for fam, plans in families
            for plan in plans
            for w in translate(plan, self._context(fam))
        }
        return [
            f"{obj}: no Service has it (stale)"
            for name, obj in sorted(view.load_balancers.items())
            if name not in wanted
        ]


@dataclass(frozen=True)
class HnsView:
    """What HNS holds: load balancers by name (as :func:`load_balancer_object` names
    them), and the network's endpoints by IP (remote or not)."""

    load_balancers: dict[str, KernelObject]
    endpoints: dict[str, bool]  # IP -> remote


def read_hns(hns: Hns, network_id: str) -> HnsView:
    endpoints = hns.list_endpoints(network_id)
    ips = {ep.id: ep.ip_address for ep in endpoints}
    lbs = (load_balancer_object(lb, ips) for lb in hns.list_load_balancers())
    return HnsView(
        {o.name: o for o in lbs},
        {ip: ep.is_remote for ep in endpoints for ip in ep.ip_addresses},
    )


def hns_drift(objects: Sequence[KernelObject], view: HnsView) -> list[str]:
    """Missing or different load balancers (settings, endpoints), missing endpoints."""
    out: list[str] = []
    for obj in objects:
        if obj.kind == "endpoint":
            remote = view.endpoints.get(obj.name)
            if remote is None:
                out.append(f"missing {obj}")
            elif remote is obj.key.startswith("local"):
                out.append(f"{obj}: HNS has it as {'remote' if remote else 'local'}")
            continue
        have = view.load_balancers.get(obj.name)
        if have is None:
            out.append(f"missing {obj}")
            continue
        if have.key != obj.key:
            out.append(f"{obj}: HNS has {have.key}")
        want_ips = set((obj.value or "").split(",")) - {""}
        have_ips = set((have.value or "").split(",")) - {""}
        out.extend(f"missing endpoint {ip} in {obj.name}" for ip in sorted(want_ips - have_ips))
        out.extend(f"extra endpoint {ip} in {obj.name}" for ip in sorted(have_ips - want_ips))
    return out


def for_config(config: ProxyConfig, *, live: bool = False) -> KernelspaceInspector:
    """The inspector of the node ``config`` describes: its network from the
    ``--hns-state`` file, else (on Windows) from HNS; ``live``: HNS itself, read back.
    Raises :class:`ConfigError` when neither is at hand, in one line saying why."""
    win = config.winkernel
    if live and sys.platform != "win32":
        raise ConfigError(
            f"--live: kernelspace mode reads back Windows' HNS, and this machine "
            f"({sys.platform}) has none; without --live, explain and list answer from "
            "--hns-state FILE"
        )
    if live and win.hns_state:
        raise ConfigError("--live: reads the network from HNS itself: drop --hns-state")
    hns: Hns
    if win.hns_state:
        from kubeproxy.dataplane.hns.fake import StateFileError, load_state

        try:
            fake = load_state(win.hns_state, seed=0)
        except StateFileError as err:
            raise ConfigError(f"--hns-state: {err}") from None
        hns, name = fake, win.network_name or fake.network.name
    else:
        from kubeproxy.dataplane.hns.hcn import HcnClient

        try:
            hns = HcnClient()
        except HnsError as err:
            raise ConfigError(f"{_NO_NETWORK}; HNS: {err}") from None
        name = win.network_name
        if not name:
            raise ConfigError(
                "kernelspace mode: no HNS network named (--network-name, "
                "winkernel.networkName or env KUBE_NETWORK)"
            )
    try:
        network = hns.get_network_by_name(name)
        root = next(
            (e for e in hns.list_endpoints(network.id) if e.name == win.root_hns_endpoint_name),
            None,
        )
    except HnsError as err:
        raise ConfigError(f"kernelspace mode: HNS network {name!r}: {err}") from None
    if network.is_overlay and not win.source_vip:
        # As the backend's start: the proxy would program nothing to explain.
        raise ConfigError(
            "kernelspace mode: an Overlay network needs --source-vip (winkernel.sourceVip)"
        )
    return KernelspaceInspector(HnsNode(config, network, root, hns if live else None))


INSPECTOR = KernelspaceInspector()
