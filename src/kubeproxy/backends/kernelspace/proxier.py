"""kernelspace mode's backend: the plan's ServicePorts as HNS load balancers.

Runs on the shared sync loop (:class:`~kubeproxy.backends.driver.PerFamilyDriver`, one
unit per family, as upstream runs one winkernel proxier per family): full or partial,
invalidation after a failed sync and the report of refused ServicePorts are the
driver's. This module holds, per family, the load balancers it programmed per
ServicePort (:class:`Held`, keyed by frontend VIP, protocol and external port) and
applies the difference with what :func:`~.translate.translate` wants:

* unchanged: nothing; changed: modified in place when HNS supports ModifyLoadbalancer,
  else deleted and created; gone: deleted;
* a delete HNS refuses is kept and retried at the next syncs (at most
  :data:`MAX_STALE_DELETES` a sync, as upstream bounds its stale load balancers); its
  remote endpoints stay referenced until it is gone;
* a ServicePort HNS refuses (or whose remote endpoint cannot be created) is logged with
  its namespace/name, reported in the sync's ``isolated``, and retried at the next sync,
  partial ones included; the other ServicePorts are applied;
* a partial sync touches the changed ServicePorts only;
* the first full sync adopts load balancers HNS already holds for a wanted frontend (a
  restart), and every full sync forgets held ones HNS no longer has.

Nothing here has run on Windows; it is proven against :class:`~kubeproxy.dataplane.hns.
fake.FakeHns`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from kubeproxy.backends.base import BackendError, SyncResult
from kubeproxy.backends.driver import PerFamilyDriver, Unit
from kubeproxy.backends.kernelspace.endpoints import EndpointBook
from kubeproxy.backends.kernelspace.render import contract, mirror
from kubeproxy.backends.kernelspace.translate import (
    NodeContext,
    WantedEndpoint,
    WantedLoadBalancer,
    node_context,
    service_vip_endpoint,
    translate,
)
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.hns import (
    Hns,
    HnsError,
    LoadBalancer,
    Network,
    PortMapping,
    SupportedFeatures,
)
from kubeproxy.model.plan import FamilyPlan, ServicePortPlan
from kubeproxy.model.planning import NodePlan
from kubeproxy.model.types import IPFamily, ServicePortName

log = logging.getLogger(__name__)

# Stale load balancers whose delete HNS refused, retried per sync at most.
MAX_STALE_DELETES = 20

Key = tuple[str, int, int]


@dataclass
class Held:
    """A load balancer this backend programmed: its HNS ID, what it is, and the remote
    endpoint IPs it holds a reference on."""

    id: str
    wanted: WantedLoadBalancer
    remote_ips: tuple[str, ...] = ()
    # False: made without an endpoint HNS could not resolve (programmed again next sync).
    complete: bool = True


@dataclass
class FamilyState:
    plan: FamilyPlan
    valid: bool = True
    lbs: dict[ServicePortName, dict[Key, Held]] = field(default_factory=dict)
    # Overlay: the ClusterIP remote endpoint each ServicePort holds a reference on.
    vips: dict[ServicePortName, str] = field(default_factory=dict)
    retry: dict[ServicePortName, str] = field(default_factory=dict)  # name -> why


class KernelspaceBackend(PerFamilyDriver):
    """HNS load balancers from the plan, one family at a time (see the module)."""

    mode = ProxyMode.KERNELSPACE
    # A refused ServicePort is offered again at every sync (HNS has no transaction).
    _refuser = "HNS"
    _refused_until = "until the next sync retries it"

    def __init__(
        self,
        config: ProxyConfig,
        open_hns: Callable[[], Hns],
        host_mac: str = "",
        find_mac: Callable[[str], str] | None = None,
    ) -> None:
        """``host_mac``: the MAC of the node's vNIC, else found by ``find_mac`` from the
        node IP at the first sync (on Windows: :func:`~.endpoints.interface_mac`)."""
        super().__init__(config)
        self._open_hns = open_hns
        self.host_mac = host_mac
        self._find_mac = find_mac
        self.hns: Hns | None = None
        self.network: Network | None = None
        self.features = SupportedFeatures()
        self.book: EndpointBook | None = None
        self.runners: dict[IPFamily, object] = dict.fromkeys(config.families, self)
        self._families: dict[IPFamily, FamilyState] = {}
        self._stale: list[Held] = []  # deletes HNS refused
        self._adoptable: dict[Key, str] | None = None  # HNS's LBs at the first full sync
        self._writes = 0

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        win = self.config.winkernel
        try:
            self.hns = self._open_hns()
        except HnsError as err:
            raise BackendError(
                f"kernelspace mode needs Windows' HNS ({err}); off Windows, render takes "
                "--hns-state FILE"
            ) from None
        if not win.network_name:
            raise BackendError(
                "kernelspace mode: no HNS network named (--network-name, "
                "winkernel.networkName or env KUBE_NETWORK)"
            )
        try:
            self.network = self.hns.get_network_by_name(win.network_name)
            self.features = self.hns.supported_features()
        except HnsError as err:
            raise BackendError(
                f"kernelspace mode: HNS network {win.network_name!r}: {err}"
            ) from None
        if win.enable_dsr and not self.features.dsr:
            raise BackendError("kernelspace mode: --enable-dsr, but this HNS does not support DSR")
        if self.network.is_overlay and not win.source_vip:
            raise BackendError(
                "kernelspace mode: an Overlay network needs --source-vip (winkernel.sourceVip)"
            )
        if IPFamily.IPv6 in self.config.families and not self.features.ipv6_dual_stack:
            log.warning("This HNS does not support IPv6 load balancers; serving IPv4 only")
            self.runners.pop(IPFamily.IPv6, None)
        self.book = EndpointBook(self.hns, self.network.id)

    def stop(self) -> None:
        """Load balancers stay programmed, as upstream leaves them across restarts."""

    def check(self) -> str | None:
        return None

    def counters(self) -> dict[str, int]:
        return {}

    def _hns(self) -> tuple[Hns, Network, EndpointBook]:
        if self.hns is None or self.network is None or self.book is None:
            raise BackendError("kernelspace mode: sync before start")
        return self.hns, self.network, self.book

    # ------------------------------------------------------------ the driver's parts

    def _begin(self, plan: NodePlan) -> None:
        hns, network, book = self._hns()
        self._writes = 0
        book.writes = 0
        # Upstream re-reads the network each sync: remote subnets come and go with nodes.
        self.network = hns.get_network_by_name(network.name)
        book.refresh()
        self._retry_stale(hns)
        svip = self.config.winkernel.source_vip
        if self.network.is_overlay and not self.host_mac and self._find_mac is not None:
            self._find_host_mac(plan)
        if self.network.is_overlay and svip:
            # As upstream: without it, nothing is synced (the sync fails and is retried).
            book.ensure_local(svip, self.host_mac)

    def _find_host_mac(self, plan: NodePlan) -> None:
        """Upstream's hostMac: the MAC of the interface holding the node IP."""
        assert self._find_mac is not None and self.network is not None
        ips = [ip for ip in (*(f.node_ip for f in plan.families), self.network.management_ip) if ip]
        if not ips:
            return  # no Node object yet: looked for again at the next sync
        for ip in ips:
            if mac := self._find_mac(ip):
                self.host_mac = mac
                return
        # Upstream refuses to start; here the endpoints are made without a MAC.
        log.warning("No interface holds the node IP (%s): endpoints made without MAC", ips)
        self._find_mac = None

    def _full(self, plan: NodePlan, unit: Unit, result: SyncResult) -> None:
        (fam,) = unit
        hns, _, _ = self._hns()
        state = self._families.get(fam.family)
        if state is None:
            state = self._families[fam.family] = FamilyState(fam)
        state.plan, state.valid = fam, True
        present = {lb.id: lb for lb in hns.list_load_balancers()}
        if self._adoptable is None:
            # Ours (held, or waiting for a delete HNS refused) are not adopted.
            ours = {h.id for h in self._stale} | {
                h.id
                for st in self._families.values()
                for lbs in st.lbs.values()
                for h in lbs.values()
            }
            self._adoptable = {_key_of(lb): lb.id for lb in present.values() if lb.id not in ours}
        gone: list[Held] = []  # deleted by someone else: made again
        for held in state.lbs.values():
            for key in [k for k, h in held.items() if h.id not in present]:
                gone.append(held.pop(key))
        plans = plan.service_ports(fam)
        self._apply(fam, state, {*plans, *state.lbs}, plans)
        # Released after: their remote endpoints, wanted again, are not deleted meanwhile.
        _, _, book = self._hns()
        for held_lb in gone:
            book.release(held_lb.remote_ips)

    def _partial(
        self, plan: NodePlan, unit: Unit, changed: set[ServicePortName], result: SyncResult
    ) -> None:
        (fam,) = unit
        state = self._families[fam.family]
        names = {*changed, *state.retry}
        self._apply(fam, state, names, plan.service_ports(fam, names))

    def _invalidate(self) -> None:
        super()._invalidate()
        self._adoptable = None

    def _report(self, plan: NodePlan, result: SyncResult) -> None:
        _, _, book = self._hns()
        result.elements = sum(
            len(held) for state in self._families.values() for held in state.lbs.values()
        )
        result.chains = book.remote_count
        result.operations = self._writes + book.writes

    # ------------------------------------------------------------ applying

    def _context(self, fam: FamilyPlan) -> NodeContext:
        _, network, book = self._hns()
        root = book.by_name(self.config.winkernel.root_hns_endpoint_name)
        return node_context(self.config, fam, network, root, self.host_mac)

    def _apply(
        self,
        fam: FamilyPlan,
        state: FamilyState,
        names: Iterable[ServicePortName],
        plans: dict[ServicePortName, ServicePortPlan | None],
    ) -> None:
        hns, _, _ = self._hns()
        ctx = self._context(fam)
        wanted: dict[ServicePortName, dict[Key, WantedLoadBalancer]] = {}
        for name in sorted(names):
            port_plan = plans.get(name)
            try:
                lbs = translate(port_plan, ctx) if port_plan is not None else []
            except ValueError as err:  # bad input: this Service only
                state.retry[name] = f"cannot translate: {err}"
                continue
            wanted[name] = {w.key: w for w in lbs}
            # Deletes first: a frontend one ServicePort leaves may be another's now.
            held = state.lbs.get(name, {})
            for key in [k for k in held if k not in wanted[name]]:
                self._delete(hns, held.pop(key))
        for name, by_key in wanted.items():
            port_plan = plans.get(name)
            vip = service_vip_endpoint(port_plan, ctx) if port_plan is not None else None
            why = "; ".join(
                filter(
                    None, (self._apply_vip(state, name, vip), self._apply_port(state, name, by_key))
                )
            )
            if why:
                state.retry[name] = why
            else:
                state.retry.pop(name, None)
        refused = {(fam.family, name): why for name, why in state.retry.items()}
        planned = {(fam.family, name) for name, port in plans.items() if port is not None}
        self._record_refused((fam.family,), refused, planned)

    def _apply_vip(
        self, state: FamilyState, name: ServicePortName, vip: WantedEndpoint | None
    ) -> str:
        """The ClusterIP's remote endpoint of an Overlay network; what failed."""
        _, _, book = self._hns()
        held = state.vips.get(name)
        if held == (vip.ip if vip is not None else None):
            return ""
        if vip is not None:
            try:
                book.acquire(vip)
            except HnsError as err:
                if err.incomplete:
                    raise
                return f"ClusterIP endpoint {vip.ip}: {err}"
            state.vips[name] = vip.ip
        else:
            del state.vips[name]
        if held is not None:
            book.release([held])
        return ""

    def _apply_port(
        self, state: FamilyState, name: ServicePortName, by_key: dict[Key, WantedLoadBalancer]
    ) -> str:
        """Create or update one ServicePort's load balancers (those it no longer wants
        are deleted already); what failed ("" if nothing)."""
        hns, _, _ = self._hns()
        held = state.lbs.setdefault(name, {})
        failures: list[str] = []
        for key, want in by_key.items():
            old = held.get(key)
            if old is not None and old.wanted == want and old.complete:
                continue
            try:
                failures.extend(self._program(hns, held, want))
            except HnsError as err:
                if err.incomplete:
                    raise
                failures.append(f"{want}: {err}")
            except ValueError as err:  # a document HCN's schema refuses: this one only
                failures.append(f"{want}: {err}")
        if not held:
            del state.lbs[name]
        return "; ".join(failures)

    def _program(self, hns: Hns, held: dict[Key, Held], want: WantedLoadBalancer) -> list[str]:
        """Create or update one load balancer in ``held``; the endpoints left out, as
        upstream skips one it cannot find or create. On an error nothing new stays
        referenced, and the old one stays held unless it was deleted."""
        _, _, book = self._hns()
        old = held.get(want.key)
        ids: list[str] = []
        remote: list[str] = []
        skipped: list[str] = []
        try:
            for ep in want.endpoints:
                try:
                    ep_id, is_remote = book.acquire(ep)
                except HnsError as err:
                    if err.incomplete:
                        raise
                    skipped.append(f"{want}: endpoint {ep.ip}: {err}")
                    continue
                ids.append(ep_id)
                if is_remote:
                    remote.append(ep.ip)
            if not ids:
                raise HnsError("; ".join(skipped) or "no endpoint", operation="create_endpoint")
            doc = document(want, ids)
            adopted = (self._adoptable or {}).pop(want.key, None) if old is None else None
            target = old.id if old is not None else adopted
            self._clear_stale(hns, want.key)
            self._writes += 1
            if target is not None and self.features.modify_load_balancer:
                lb = hns.modify_load_balancer(target, doc)
            else:
                if target is not None:
                    self._writes += 1
                    hns.delete_load_balancer(target)
                    if old is not None:
                        del held[want.key]
                        book.release(old.remote_ips)
                        old = None
                lb = hns.create_load_balancer(doc)
        except (HnsError, ValueError):
            book.release(remote)
            raise
        if old is not None:
            book.release(old.remote_ips)
        held[want.key] = Held(lb.id, want, tuple(remote), complete=not skipped)
        return skipped

    def _delete(self, hns: Hns, held: Held) -> None:
        _, _, book = self._hns()
        self._writes += 1
        try:
            hns.delete_load_balancer(held.id)
        except HnsError as err:
            if err.incomplete:
                raise
            if not err.not_found:
                log.warning(
                    "Deleting load balancer %s (%s) failed, retrying: %s", held.id, held.wanted, err
                )
                self._stale.append(held)
                return
        book.release(held.remote_ips)

    def _retry_stale(self, hns: Hns) -> None:
        stale, self._stale = self._stale[:MAX_STALE_DELETES], self._stale[MAX_STALE_DELETES:]
        for held in stale:
            self._delete(hns, held)

    def _clear_stale(self, hns: Hns, key: Key) -> None:
        """A stale load balancer holding ``key`` goes before its successor is created."""
        for held in [h for h in self._stale if h.wanted.key == key]:
            self._stale.remove(held)
            self._delete(hns, held)

    # ------------------------------------------------------------ render

    def render_plan(self, plan: NodePlan) -> str:
        """The HNS objects a full sync of ``plan`` creates, as JSON (:mod:`.render`):
        the sync runs against a copy of what HNS holds, so nothing is touched."""
        if self.hns is None:
            self.start()
        hns, network, _ = self._hns()
        copy = mirror(hns, network.name)
        before = {ep.id for ep in copy.list_endpoints()}
        served = replace(self.config, families=tuple(self.runners))  # start warned once
        shadow = KernelspaceBackend(served, open_hns=lambda: copy, host_mac=self.host_mac)
        shadow.start()
        result = shadow.sync_plan(plan, None)
        for item in result.isolated:
            log.warning("Not programmed: %s", item)
        return json.dumps(contract(copy, before), indent=2) + "\n"


def cleanup(hns: Hns) -> list[str]:
    """Delete every HNS load balancer (upstream's ``deleteAllHnsLoadBalancerPolicy``);
    what was removed. Remote endpoints stay, as upstream leaves them."""
    removed: list[str] = []
    errors: list[str] = []
    for lb in hns.list_load_balancers():
        pm = lb.port_mappings[0]
        what = f"hns load-balancer {lb.vip or '(node ports)'}:{pm.external_port} ({lb.id})"
        try:
            hns.delete_load_balancer(lb.id)
        except HnsError as err:
            if not err.not_found:
                errors.append(f"{what}: {err}")
            continue
        removed.append(what)
    if errors:
        raise BackendError("; ".join(errors))
    return removed


def document(want: WantedLoadBalancer, endpoint_ids: list[str]) -> LoadBalancer:
    """The HCN document of ``want`` with these endpoints."""
    mapping = PortMapping(
        protocol=want.protocol,
        internal_port=want.internal_port,
        external_port=want.external_port,
        distribution=want.distribution,
        flags=want.port_flags,
    )
    return LoadBalancer(
        port_mappings=(mapping,),
        frontend_vips=(want.vip,) if want.vip else (),
        endpoint_ids=tuple(endpoint_ids),
        source_vip=want.source_vip,
        flags=want.flags,
    )


def _key_of(lb: LoadBalancer) -> Key:
    pm = lb.port_mappings[0]
    return (lb.vip, pm.protocol, pm.external_port)
