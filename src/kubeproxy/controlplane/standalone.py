"""A manifest directory as a small cluster: the control plane between the files and the proxy.

When ``--manifests`` holds Pods (backends a user runs elsewhere, written as v1 Pods) or a
Service without a ``clusterIP``, kubeproxy does what kube-apiserver and
kube-controller-manager would: :class:`StandaloneCluster` takes the manifest source's
events of *raw* documents (:class:`~kubeproxy.model.events.RawObject`) and returns the
events a cluster's proxy would see — completed Services and EndpointSlices as models:

* **ClusterIPs** from the ServiceCIDRs (ServiceCIDR objects in the directory, plus the
  ``--service-cluster-ip-range`` ranges as upstream's default ServiceCIDR ``kubernetes``,
  or :data:`DEFAULT_SERVICE_CIDRS` when there are neither), with upstream's address
  families (``ipFamilies`` / ``ipFamilyPolicy``) — :mod:`.ipallocator`;
* **NodePorts** and healthCheckNodePorts from :data:`DEFAULT_NODE_PORT_RANGE` —
  :mod:`.portallocator`;
* **EndpointSlices** from the Pods a Service selects, with ``topology-mode: Auto`` hints
  from the Nodes' zones and allocatable CPU, and ``trafficDistribution`` hints —
  :mod:`.endpointslice`, :mod:`.topologycache`, :mod:`.trafficdist`.

What is given explicitly is respected: a ``clusterIP``, a ``nodePort``, and EndpointSlices
written for a Service (the Service then gets no generated ones). A requested ClusterIP
that is taken or outside every ServiceCIDR, or any other allocation failure, is one log
line for that Service (``Skipping Service ns/name: ...``), which is then absent; it is
retried with every later batch, so it appears once the address is free.

Allocations survive restarts: the caller passes the saved ones in (``remembered``) and
saves :meth:`StandaloneCluster.allocations` after each batch (:mod:`.statefile`). On the
first batch Services with a requested ClusterIP go first, then those with a remembered
one, then new ones, so a new Service never takes an address a known one had.

Without Pods and without incomplete Services the directory is a plain consumer's view
(Services with their ClusterIPs, hand-written EndpointSlices): objects are parsed and
passed through unchanged and nothing is allocated or checked, as before this layer.

Changes cost what they touch: a Pod event recomputes only the slices of the Services in
its namespace whose selector matches its old or new labels; a slice that comes out equal
emits no event. Node changes (zones, CPU) recompute every selecting Service.

Pure: no I/O, no clock; randomness is an injected :class:`random.Random`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import random
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.controlplane.endpointslice import (
    LABEL_SERVICE_NAME,
    reconcile,
    select_pods,
)
from kubeproxy.controlplane.ipallocator import (
    AllocationError,
    ClusterIPAllocator,
    ErrMismatchedNetwork,
    family_of,
    parse_ip,
    service_parent_ref,
)
from kubeproxy.controlplane.labelindex import LabelIndex, labels_of
from kubeproxy.controlplane.portallocator import (
    NodePortAllocator,
    allocate_service_node_ports,
    release_service_node_ports,
)
from kubeproxy.controlplane.shapes import checked, problem
from kubeproxy.controlplane.statefile import Allocation
from kubeproxy.controlplane.topologycache import TopologyCache
from kubeproxy.model.events import Event, Model, RawObject
from kubeproxy.model.parse import (
    InvalidObjectError,
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
    skipped_parts,
)
from kubeproxy.model.types import NamespacedName

log = logging.getLogger(__name__)

#: ClusterIP ranges when neither ServiceCIDR objects nor ``--service-cluster-ip-range``
#: are given: kubeadm's and kind's defaults (IPv4 first, so single-stack Services are IPv4).
DEFAULT_SERVICE_CIDRS = ("10.96.0.0/12", "fd00:10:96::/108")
#: kube-apiserver's ``--service-node-port-range`` default.
DEFAULT_NODE_PORT_RANGE = "30000-32767"
#: Upstream's name for the ServiceCIDR made from ``--service-cluster-ip-range``.
DEFAULT_SERVICE_CIDR_NAME = "kubernetes"

_FAMILIES = ("IPv4", "IPv6")
_DUAL_STACK_POLICIES = ("PreferDualStack", "RequireDualStack")

Obj = dict[str, Any]
_EmitKey = tuple[str, NamespacedName]


class ServiceError(Exception):
    """Why one Service cannot be completed; the message names the field, as upstream's."""


@dataclass
class _Generated:
    """The EndpointSlices this layer computed for one Service, by name."""

    slices: dict[str, Obj] = field(default_factory=dict)
    errors: tuple[str, ...] = ()


@dataclass
class _Batch:
    """What the events folded in since the last :meth:`StandaloneCluster.finish` left to do."""

    out: list[Event] = field(default_factory=list)
    dirty: set[NamespacedName] = field(default_factory=set)  # Services
    slices_dirty: set[NamespacedName] = field(default_factory=set)
    nodes_changed: bool = False
    cidrs_changed: bool = False


class StandaloneCluster:
    """Raw manifest events in, completed Service / EndpointSlice events out."""

    def __init__(
        self,
        *,
        service_cidrs: Sequence[str] = (),
        remembered: Mapping[str, Allocation] | None = None,
        node_port_range: str = DEFAULT_NODE_PORT_RANGE,
        rng: random.Random | None = None,
    ) -> None:
        """``service_cidrs``: ``--service-cluster-ip-range``; ``remembered``: saved allocations."""
        rng = rng if rng is not None else random.Random()
        self._flag_cidrs = tuple(service_cidrs)
        self._remembered: dict[str, Allocation] = dict(remembered or {})
        self._ips = ClusterIPAllocator(rng=rng)
        self._ports = NodePortAllocator(node_port_range, rng=rng)
        self._topology = TopologyCache()
        # Both compact between batches (see RawObject).
        self._services: dict[NamespacedName, RawObject] = {}
        self._completed: dict[NamespacedName, RawObject] = {}
        self._allocations: dict[NamespacedName, Allocation] = {}
        self._errors: dict[NamespacedName, str] = {}
        self._incomplete: set[NamespacedName] = set()
        self._labels = LabelIndex()
        self._nodes: dict[str, Mapping[str, Any]] = {}
        self._service_cidrs: dict[str, Mapping[str, Any]] = {}
        self._explicit: dict[NamespacedName, RawObject] = {}
        self._explicit_by_service: dict[NamespacedName, set[str]] = {}
        self._generated: dict[NamespacedName, _Generated] = {}
        self._generated_names: set[NamespacedName] = set()  # every generated slice
        self._emitted: dict[_EmitKey, Model] = {}
        self._active = False
        self._started = False
        self._batch = _Batch()  # what fold() took in, for finish()

    # ----------------------------------------------------------------------- events

    @property
    def active(self) -> bool:
        """Whether the directory is a cluster to complete (it holds Pods or incomplete
        Services) rather than a finished view to pass through."""
        return self._active

    def apply(self, events: Iterable[Event]) -> list[Event]:
        """Fold one batch of raw events in; the model events the proxy should see."""
        self.fold(events)
        return self.finish()

    def fold(self, events: Iterable[Event]) -> None:
        """Take in part of a batch: what each event needs by itself (checks, parsing the
        EndpointSlices, the indexes) is done now, the rest at :meth:`finish`. A first
        load folds files in as they are read, beside the processes still reading."""
        batch = self._batch
        out, dirty, slices_dirty = batch.out, batch.dirty, batch.slices_dirty
        for event in events:
            obj = event.new if event.new is not None else event.old
            if not isinstance(obj, RawObject):
                out.append(event)  # already a model: nothing to complete
                continue
            old = event.old.doc if isinstance(event.old, RawObject) else None
            # Decoded once here (RawObject), for the whole batch.
            raw = event.new.decoded() if isinstance(event.new, RawObject) else None
            new = raw.doc if raw is not None else None
            # An unreadable version was absent when it came (and logged then).
            if old is not None and problem(obj.kind, old) is not None:
                old = None
            if obj.kind == "EndpointSlice":
                # Parsed once: parsing is the check (and most of a cold start's work).
                slice_model, new = _parse_slice(new)
            else:
                new = checked(obj.kind, new)
            if obj.kind == "Service":
                self._on_service(obj.key, raw if new is not None else None)
                dirty.add(obj.key)
            elif obj.kind == "Pod":
                slices_dirty |= self._on_pod(obj.key, old, new)
            elif obj.kind == "Node":
                _store(self._nodes, obj.key.name, new)
                batch.nodes_changed = True
                out += self._pass_through("Node", obj.key, new)
            elif obj.kind == "ServiceCIDR":
                _store(self._service_cidrs, obj.key.name, new)
                batch.cidrs_changed = True
                out += self._pass_through("ServiceCIDR", obj.key, new)
            elif obj.kind == "EndpointSlice":
                slices_dirty |= self._on_explicit_slice(obj.key, old, new)
                if isinstance(event.new, RawObject) and new is not None:
                    self._explicit[obj.key] = event.new.compact()
                out += self._emit("EndpointSlice", obj.key, slice_model)

    def finish(self) -> list[Event]:
        """End the batch :meth:`fold` began: complete the Services, compute the
        EndpointSlices; every model event of the batch."""
        batch, self._batch = self._batch, _Batch()
        out, dirty, slices_dirty = batch.out, batch.dirty, batch.slices_dirty
        active = bool(self._labels.pods) or bool(self._incomplete)
        if active != self._active:
            self._active = active
            dirty |= self._services.keys() | self._completed.keys()
            if active:
                log.info(
                    "The manifests hold Pods or Services without a clusterIP: kubeproxy "
                    "allocates ClusterIPs and NodePorts and computes EndpointSlices"
                )
        if batch.cidrs_changed or not self._started:
            self._ips.sync_service_cidrs(self.service_cidr_objects())
        if batch.nodes_changed:
            self._topology.set_nodes(self._nodes.values())
            slices_dirty |= self._labels.selectors.keys()
        # A Service that failed may succeed now (its address was released, a CIDR added).
        dirty |= self._errors.keys()

        for key in sorted(dirty, key=self._allocation_order):
            out += self._complete(key)
        if not self._started:
            # Saved allocations of Services that are gone now are forgotten.
            self._remembered.clear()
            self._started = True
        for key in sorted(dirty | slices_dirty):
            out += self._reconcile_slices(key)
        # Kept compact from here on (see RawObject): decoded again only when it changes.
        for key in dirty:
            for table in (self._services, self._completed):
                if (kept := table.get(key)) is not None:
                    table[key] = kept.compact()
        return out

    def _on_service(self, key: NamespacedName, raw: RawObject | None) -> None:
        _store(self._services, key, raw)
        self._incomplete.discard(key)
        self._labels.set_selector(key, None)
        if raw is None:
            return
        spec = _spec(raw.doc)
        if spec.get("type") != "ExternalName" and not _requested_ips(spec):
            self._incomplete.add(key)
        selector = spec.get("selector")
        if isinstance(selector, Mapping) and selector:
            self._labels.set_selector(key, selector)

    def _on_pod(
        self, key: NamespacedName, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> set[NamespacedName]:
        self._labels.set_pod(key, _namespaced(new, key.namespace) if new is not None else None)
        touched: set[NamespacedName] = set()
        for doc in (old, new):
            if doc is not None:
                touched |= self._labels.services_selecting(key.namespace, labels_of(doc))
        return touched

    def _on_explicit_slice(
        self, key: NamespacedName, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> set[NamespacedName]:
        if new is None:
            self._explicit.pop(key, None)
        touched: set[NamespacedName] = set()
        for doc, add in ((old, False), (new, True)):
            service = labels_of(doc).get(LABEL_SERVICE_NAME) if doc is not None else None
            if not isinstance(service, str) or not service:
                continue
            owner = NamespacedName(key.namespace, service)
            names = self._explicit_by_service.setdefault(owner, set())
            if add:
                names.add(key.name)
            else:
                names.discard(key.name)
            if not names:
                del self._explicit_by_service[owner]
            touched.add(owner)
        return touched

    def _pass_through(
        self, kind: str, key: NamespacedName, doc: Mapping[str, Any] | None
    ) -> list[Event]:
        model: Model | None = None
        if doc is not None:
            try:
                model = _PARSERS[kind](doc)
            except InvalidObjectError as err:
                log.error("%s", err)
        return self._emit(kind, key, model)

    def _emit(self, kind: str, key: NamespacedName, model: Model | None) -> list[Event]:
        """The event (if any) that turns what the proxy saw into ``model``."""
        slot = (kind, key)
        before = self._emitted.get(slot)
        if model is None:
            if before is None:
                return []
            del self._emitted[slot]
            return [Event.deleted(before)]
        self._emitted[slot] = model
        if before is None:
            return [Event.added(model)]
        return [Event.modified(before, model)] if before != model else []

    # --------------------------------------------------------------------- Services

    def service_cidr_objects(self) -> list[Mapping[str, Any]]:
        """The ServiceCIDRs ClusterIPs come from: the flag's (or the default) first."""
        given = [self._service_cidrs[name] for name in sorted(self._service_cidrs)]
        cidrs = self._flag_cidrs or (() if given else DEFAULT_SERVICE_CIDRS)
        if cidrs:
            default = {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "ServiceCIDR",
                "metadata": {"name": DEFAULT_SERVICE_CIDR_NAME},
                "spec": {"cidrs": list(cidrs)},
            }
            given = [default, *(g for g in given if _name(g) != DEFAULT_SERVICE_CIDR_NAME)]
        return given

    def _allocation_order(self, key: NamespacedName) -> tuple[int, NamespacedName]:
        raw = self._services.get(key)
        if raw is None:
            return (0, key)  # deletions first: they free addresses
        if _requested_ips(_spec(raw.doc)):
            return (1, key)
        remembered = str(key) in self._remembered or key in self._allocations
        return (2 if remembered else 3, key)

    def _complete(self, key: NamespacedName) -> list[Event]:
        raw = self._services.get(key)
        previous = self._release(key)
        self._completed.pop(key, None)
        if raw is None:
            self._errors.pop(key, None)
            return self._emit("Service", key, None)
        completed = raw  # passed through as given, unless this layer completes it
        if self._active:
            try:
                doc, allocation = self._allocate(key, raw.doc, previous)
            except ServiceError as err:
                return self._fail(key, str(err))
            self._allocations[key] = allocation
            completed = RawObject("Service", key, doc)
        try:
            model = parse_service(completed.doc)
        except InvalidObjectError as err:
            self._completed[key] = completed  # what _release gives the ports back from
            self._release(key)
            self._completed.pop(key)
            return self._fail(key, err.reason, logged=str(err))
        self._errors.pop(key, None)
        self._completed[key] = completed
        return self._emit("Service", key, model)

    def _fail(self, key: NamespacedName, reason: str, *, logged: str | None = None) -> list[Event]:
        if self._errors.get(key) != reason:
            log.error("%s", logged or f"Skipping Service {key}: {reason}")
        self._errors[key] = reason
        return self._emit("Service", key, None)

    def _release(self, key: NamespacedName) -> Allocation | None:
        """Give back a Service's addresses and ports; what it had (to keep them if it can)."""
        allocation = self._allocations.pop(key, None)
        if allocation is None:
            return self._remembered.get(str(key))
        for ip in allocation["clusterIPs"]:
            # Fails only when its ServiceCIDR is gone, and the address with it.
            with contextlib.suppress(AllocationError):
                self._ips.release(ip)
        completed = self._completed.get(key)
        if completed is not None:
            release_service_node_ports(completed.doc, self._ports)
        return allocation

    def _allocate(
        self, key: NamespacedName, doc: Mapping[str, Any], previous: Allocation | None
    ) -> tuple[Obj, Allocation]:
        completed = copy.deepcopy(dict(doc))
        meta = completed.setdefault("metadata", {})
        meta.setdefault("namespace", key.namespace)
        # Stable across restarts, so slices' owner references do not change.
        meta.setdefault("uid", str(uuid.uuid5(uuid.NAMESPACE_URL, f"kubeproxy:service:{key}")))
        spec = completed.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        empty: Allocation = {"clusterIPs": [], "nodePorts": {}, "healthCheckNodePort": 0}
        if spec["type"] == "ExternalName":
            return completed, empty
        requested = _requested_ips(spec)
        headless = requested[:1] == ["None"]
        families, policy = self._families(spec, [] if headless else requested, headless)
        spec["ipFamilies"], spec["ipFamilyPolicy"] = families, policy
        if headless:
            spec["clusterIPs"] = ["None"]
            return completed, empty  # nothing to allocate; its slices follow the families
        ips = self._cluster_ips(key, families, requested, previous)
        spec["clusterIP"], spec["clusterIPs"] = ips[0], ips
        try:
            completed = self._node_ports(completed, previous)
        except ServiceError:
            for ip in ips:
                self._ips.release(ip)
            raise
        cspec = completed["spec"]
        return completed, {
            "clusterIPs": ips,
            "nodePorts": {
                str(p["port"]): p["nodePort"]
                for p in cspec.get("ports") or ()
                if isinstance(p, Mapping) and p.get("nodePort")
            },
            "healthCheckNodePort": cspec.get("healthCheckNodePort") or 0,
        }

    def _configured(self) -> list[str]:
        """Families with a ServiceCIDR, the primary (the first range's family) first."""
        order: list[str] = []
        for service_cidr in self.service_cidr_objects():
            for cidr in _spec(service_cidr).get("cidrs") or ():
                try:
                    family = family_of(parse_ip(str(cidr).split("/")[0]))
                except ValueError:
                    continue
                if family not in order:
                    order.append(family)
        return order

    def _families(
        self, spec: Mapping[str, Any], requested: list[str], headless: bool
    ) -> tuple[list[str], str]:
        """Upstream's ``initIPFamilyFields``, for what a manifest can say: the families
        and the policy (``requested``: the ClusterIPs asked for, none for headless)."""
        configured = self._configured()
        wanted = spec.get("ipFamilies") or []
        if not isinstance(wanted, list):
            raise ServiceError(f"spec.ipFamilies: Invalid value: {wanted!r}: must be a list")
        for i, family in enumerate(wanted):
            if family not in _FAMILIES:
                raise ServiceError(
                    f"spec.ipFamilies[{i}]: Unsupported value: {family!r}: "
                    'supported values: "IPv4", "IPv6"'
                )
        # Headless without a selector defaults to both families, whatever is configured.
        selectorless = headless and not spec.get("selector")
        policy = spec.get("ipFamilyPolicy") or (
            "RequireDualStack" if selectorless else "SingleStack"
        )
        if policy not in ("SingleStack", *_DUAL_STACK_POLICIES):
            raise ServiceError(
                f"spec.ipFamilyPolicy: Unsupported value: {policy!r}: supported values: "
                '"PreferDualStack", "RequireDualStack", "SingleStack"'
            )
        if policy == "SingleStack" and (len(wanted) > 1 or len(requested) > 1):
            raise ServiceError(
                "spec.ipFamilyPolicy: Invalid value: SingleStack: "
                "two IP families need PreferDualStack or RequireDualStack"
            )
        from_ips: list[str] = []
        for i, ip in enumerate(requested):
            try:
                from_ips.append(family_of(parse_ip(ip)))
            except ValueError:
                raise ServiceError(
                    f"spec.clusterIPs[{i}]: Invalid value: {ip!r}: must be a valid IP address"
                ) from None
        if from_ips and wanted and from_ips != wanted[: len(from_ips)]:
            raise ServiceError(
                f"spec.ipFamilies: Invalid value: {wanted}: does not match the families "
                f"of spec.clusterIPs {requested}"
            )
        for i, family in enumerate(from_ips[len(wanted) :]):
            if family not in configured:
                raise ServiceError(
                    f"spec.clusterIPs[{len(wanted) + i}]: Invalid value: "
                    f"{json.dumps(requested)}: {family} is not configured on this cluster"
                )
        families = list(wanted or from_ips)
        if selectorless:
            families = families or (configured[:1] or ["IPv4"])
            if len(families) == 1 and policy != "SingleStack":
                families.append(_other(families[0]))
            return families, policy
        for i, family in enumerate(wanted):
            if family not in configured:
                raise ServiceError(
                    f"spec.ipFamilies[{i}]: Invalid value: {family!r}: "
                    "not configured on this cluster (no ServiceCIDR of that family)"
                )
        families = families or configured[:1]
        if not families:
            raise ServiceError("spec.clusterIP: no ServiceCIDR to allocate from")
        if policy in _DUAL_STACK_POLICIES and len(families) == 1:
            if _other(families[0]) in configured:
                families.append(_other(families[0]))
            elif policy == "RequireDualStack":
                raise ServiceError(
                    "spec.ipFamilyPolicy: Invalid value: RequireDualStack: "
                    "this cluster is not configured for dual-stack Services"
                )
        return families, policy

    def _cluster_ips(
        self,
        key: NamespacedName,
        families: list[str],
        requested: list[str],
        previous: Allocation | None,
    ) -> list[str]:
        parent = service_parent_ref(key.namespace, key.name)
        if not requested and previous is not None:
            kept = {family_of(parse_ip(ip)): ip for ip in previous["clusterIPs"]}
            again = [kept.get(family, "") for family in families]
            if any(again):
                try:
                    return self._ips.allocate_cluster_ips(families, again, parent)
                except AllocationError as err:
                    log.warning(
                        "Service %s cannot keep ClusterIPs %s (%s): allocating new ones",
                        key,
                        ",".join(ip for ip in again if ip),
                        err,
                    )
        try:
            return self._ips.allocate_cluster_ips(families, requested, parent)
        except AllocationError as err:
            if not requested:
                raise ServiceError(
                    f"spec.clusterIPs: failed to allocate a ClusterIP: {err}"
                ) from None
            # Upstream's words, then what they leave out: who holds it, which ranges.
            detail = self._holders(requested)
            if isinstance(err, ErrMismatchedNetwork):
                detail = f" (ServiceCIDRs: {err.valid_range})"
            raise ServiceError(
                f"spec.clusterIPs: Invalid value: {json.dumps(requested)}: failed to allocate IP "
                f"{','.join(requested)}: {err}{detail}"
            ) from None

    def _holders(self, ips: Iterable[str]) -> str:
        owners = sorted(
            str(key)
            for key, allocation in self._allocations.items()
            if set(allocation["clusterIPs"]) & set(ips)
        )
        return f" (by Service {', '.join(owners)})" if owners else ""

    def _node_ports(self, completed: Obj, previous: Allocation | None) -> Obj:
        spec = completed["spec"]
        if spec.get("type") not in ("NodePort", "LoadBalancer"):
            return completed
        if previous is not None:
            candidate = copy.deepcopy(completed)
            for port in candidate["spec"].get("ports") or ():
                if isinstance(port, dict) and not port.get("nodePort"):
                    kept = previous["nodePorts"].get(str(port.get("port")))
                    if kept:
                        port["nodePort"] = kept
            if previous.get("healthCheckNodePort") and not spec.get("healthCheckNodePort"):
                candidate["spec"]["healthCheckNodePort"] = previous["healthCheckNodePort"]
            try:
                return allocate_service_node_ports(candidate, self._ports)
            except AllocationError:
                pass  # a kept port is taken now: allocate as for a new Service
            except (TypeError, ValueError) as err:
                raise ServiceError(f"spec.ports: {err}") from None
        try:
            return allocate_service_node_ports(completed, self._ports)
        except AllocationError as err:
            raise ServiceError(f"spec.ports[*].nodePort: failed to allocate: {err}") from None
        except (TypeError, ValueError) as err:
            raise ServiceError(f"spec.ports: {err}") from None

    # ----------------------------------------------------------------- EndpointSlices

    def _reconcile_slices(self, key: NamespacedName) -> list[Event]:
        generated = self._generated.setdefault(key, _Generated())
        raw = self._completed.get(key)
        service = None
        pods = None
        if self._active and raw is not None and key not in self._explicit_by_service:
            service = raw.doc
            selector = self._labels.selectors.get(key, {})
            pods = select_pods(service, self._labels.pods_selected(key.namespace, selector))
        out: list[Event] = []
        if pods is None:
            # Not ours to manage (gone, failed, no selector, or slices written by hand).
            for address_type in _FAMILIES:
                self._topology.remove_hints(str(key), address_type)
            for name in sorted(generated.slices):
                self._generated_names.discard(NamespacedName(key.namespace, name))
                out += self._emit("EndpointSlice", NamespacedName(key.namespace, name), None)
            del self._generated[key]
            return out
        assert service is not None
        result = reconcile(
            service,
            pods,
            list(generated.slices.values()),
            self._nodes,
            topology_cache=self._topology,
        )
        for event in result.events:
            log.info("Service %s: %s: %s", key, event["reason"], event["message"])
        errors = tuple(result.errors)
        for error in sorted(set(errors) - set(generated.errors)):
            log.error("Service %s: %s", key, error)
        generated.errors = errors
        for endpoint_slice in result.to_delete:
            name = _name(endpoint_slice)
            generated.slices.pop(name, None)
            self._generated_names.discard(NamespacedName(key.namespace, name))
            out += self._emit("EndpointSlice", NamespacedName(key.namespace, name), None)
        for endpoint_slice in [*result.to_update, *result.to_create]:
            name = _name(endpoint_slice) or self._new_slice_name(key, endpoint_slice)
            endpoint_slice["metadata"] = {**endpoint_slice["metadata"], "name": name}
            endpoint_slice["metadata"].pop("generateName", None)
            generated.slices[name] = endpoint_slice
            self._generated_names.add(NamespacedName(key.namespace, name))
            out += self._slice_event(key.namespace, name, endpoint_slice)
        return out

    def _slice_event(self, namespace: str, name: str, endpoint_slice: Obj) -> list[Event]:
        model, _ = _parse_slice(endpoint_slice)  # a Pod with an invalid IP, say
        return self._emit("EndpointSlice", NamespacedName(namespace, name), model)

    def _new_slice_name(self, key: NamespacedName, endpoint_slice: Mapping[str, Any]) -> str:
        """Upstream's API server appends 5 random characters; here a hash, so names are
        the same on every run. Never a name another slice of the namespace has."""
        prefix = str(endpoint_slice["metadata"].get("generateName") or f"{key.name}-")
        for i in range(1_000_000):
            digest = hashlib.sha256(f"{key}/{endpoint_slice.get('addressType')}/{i}".encode())
            name = prefix + digest.hexdigest()[:5]
            slot = NamespacedName(key.namespace, name)
            if slot not in self._explicit and slot not in self._generated_names:
                return name
        raise RuntimeError("no free EndpointSlice name")  # pragma: no cover

    # ------------------------------------------------------------------------ output

    def errors(self) -> dict[str, str]:
        """Why each Service that could not be completed is absent, by ``namespace/name``
        (the reason its log line gave)."""
        return {str(key): reason for key, reason in self._errors.items()}

    def allocations(self) -> dict[str, Allocation]:
        """What to save (by ``namespace/name``), so a restart gives the same addresses."""
        saved = dict(self._remembered)
        saved.update({str(key): value for key, value in self._allocations.items()})
        return saved

    def objects(self) -> list[Obj]:
        """The completed Services, then every EndpointSlice (generated and given), as dicts."""
        services = [dict(self._completed[key].doc) for key in sorted(self._completed)]
        slices: list[tuple[NamespacedName, Mapping[str, Any]]] = [
            (NamespacedName(key.namespace, name), s)
            for key, generated in self._generated.items()
            for name, s in generated.slices.items()
        ]
        slices += [(key, raw.doc) for key, raw in self._explicit.items()]
        return [*services, *(dict(s) for _, s in sorted(slices, key=lambda item: item[0]))]


_PARSERS: dict[str, Any] = {
    "Node": parse_node,
    "ServiceCIDR": parse_service_cidr,
    "EndpointSlice": parse_endpoint_slice,
}


def _parse_slice(doc: Mapping[str, Any] | None) -> tuple[Model | None, Mapping[str, Any] | None]:
    """An EndpointSlice's model and its document; both None (logged) if it is invalid.
    The model is None too for a valid slice a proxy ignores (FQDN)."""
    if doc is None:
        return None, None
    try:
        model = parse_endpoint_slice(doc)
    except InvalidObjectError as err:
        log.error("%s", err)
        return None, None
    partly = model and skipped_parts(model)
    if partly:
        log.error("%s", partly)
    return model, doc


def _store(table: dict[Any, Any], key: Any, value: Any) -> None:
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


def _spec(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = doc.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""


def _namespaced(doc: Mapping[str, Any], namespace: str) -> Mapping[str, Any]:
    """The Pod with its namespace filled in (the controller matches Pods by namespace)."""
    meta = doc.get("metadata")
    if isinstance(meta, Mapping) and meta.get("namespace") == namespace:
        return doc
    return {
        **doc,
        "metadata": {**(meta if isinstance(meta, Mapping) else {}), "namespace": namespace},
    }


def _other(family: str) -> str:
    return "IPv6" if family == "IPv4" else "IPv4"


def _requested_ips(spec: Mapping[str, Any]) -> list[str]:
    """``spec.clusterIPs``, else ``spec.clusterIP``, as a list (empty: allocate)."""
    ips = spec.get("clusterIPs")
    if isinstance(ips, list) and ips:
        return [str(ip) for ip in ips]
    single = spec.get("clusterIP")
    return [str(single)] if single not in (None, "") else []
