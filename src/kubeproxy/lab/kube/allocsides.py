"""The two allocators the allocation parity check compares (see :mod:`.allocparity`):
kube-apiserver's and kubeproxy's, behind one small interface.

* :class:`Outcome` — what one create came to, on either side; :func:`reason_of` the
  category of a refusal, from either side's words.
* :class:`Side` — create, delete, and the ServiceCIDR objects.
* :class:`RealSide` — Services created through the API of a real kube-apiserver.
* :class:`OurSide` — the same requests as manifest events to kubeproxy's
  :class:`~kubeproxy.controlplane.standalone.StandaloneCluster` (ServiceCIDRs as the API
  server shows them, status and deletion included).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubeproxy.controlplane.standalone import StandaloneCluster
from kubeproxy.lab.kube.api import Api, ApiError, Obj
from kubeproxy.model.events import Event, RawObject
from kubeproxy.model.types import NamespacedName


def reason_of(message: str) -> str:
    """The category of a refusal, from either side's words ("" for none)."""
    if not message:
        return ""
    text = message.lower()
    for words, category in (
        (("already allocated",), "allocated"),
        (("not in the valid range", "does not match the current range"), "not-in-range"),
        (("range is full",), "full"),
        (("not configured",), "family"),
    ):
        if any(w in text for w in words):
            return category
    return "invalid"


@dataclass(frozen=True)
class Outcome:
    """A create's result: the allocations when accepted, the reason when refused."""

    accepted: bool
    families: tuple[str, ...] = ()
    policy: str = ""
    cluster_ips: tuple[str, ...] = ()
    node_ports: tuple[int, ...] = ()
    health_check_node_port: int = 0
    message: str = ""

    @property
    def reason(self) -> str:
        return reason_of(self.message)

    @classmethod
    def of(cls, service: Mapping[str, Any]) -> Outcome:
        spec = service.get("spec") or {}
        return cls(
            True,
            tuple(spec.get("ipFamilies") or ()),
            str(spec.get("ipFamilyPolicy") or ""),
            tuple(spec.get("clusterIPs") or ()),
            tuple(int(p.get("nodePort") or 0) for p in spec.get("ports") or ()),
            int(spec.get("healthCheckNodePort") or 0),
        )

    def brief(self) -> str:
        if not self.accepted:
            return f"refused ({self.reason}: {self.message[-160:]})"
        hc = f" hc={self.health_check_node_port}" if self.health_check_node_port else ""
        return (
            f"{'/'.join(self.families)} {self.policy} {','.join(self.cluster_ips)} "
            f"nodePorts={list(self.node_ports)}{hc}"
        )


class Side(Protocol):
    """One allocator: kube-apiserver or kubeproxy's."""

    name: str
    held: dict[str, Outcome]

    def create(self, service: Obj) -> Outcome: ...

    def delete(self, name: str) -> None: ...

    def sync_service_cidrs(self, objects: Sequence[Obj]) -> None: ...


@dataclass
class RealSide:
    """Services created through the API of a real kube-apiserver, in ``namespace``."""

    api: Api
    namespace: str
    name: str = "kube-apiserver"
    held: dict[str, Outcome] = field(default_factory=dict)

    def create(self, service: Obj) -> Outcome:
        body = {**service, "metadata": {**service["metadata"], "namespace": self.namespace}}
        try:
            outcome = Outcome.of(self.api.create(body))
        except ApiError as err:
            return Outcome(False, message=str(err))
        self.held[service["metadata"]["name"]] = outcome
        return outcome

    def delete(self, name: str) -> None:
        self.api.delete("Service", name, self.namespace)
        self.held.pop(name, None)

    def sync_service_cidrs(self, objects: Sequence[Obj]) -> None:
        pass  # the API server watches them itself


class OurSide:
    """The same requests to a :class:`StandaloneCluster`, as manifest events."""

    name = "kubeproxy"

    def __init__(self, service_cidrs: Sequence[str], node_port_range: str, seed: int) -> None:
        self.cluster = StandaloneCluster(
            service_cidrs=service_cidrs,
            node_port_range=node_port_range,
            rng=random.Random(seed),
        )
        self.namespace = "parity"
        self.held: dict[str, Outcome] = {}
        self._given: dict[NamespacedName, RawObject] = {}
        # A Pod makes the directory a cluster to complete (and to check) from the start.
        self._apply(
            RawObject(
                "Pod",
                NamespacedName(self.namespace, "backend"),
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "backend", "namespace": self.namespace},
                    "spec": {"containers": [{"name": "c"}]},
                },
            )
        )

    def _apply(self, new: RawObject | None, old: RawObject | None = None) -> None:
        if new is not None:
            event = Event.added(new) if old is None else Event.modified(old, new)
        else:
            assert old is not None
            event = Event.deleted(old)
        self.cluster.apply([event])

    def adopt(self, service: Mapping[str, Any]) -> None:
        """A Service the API server made itself (``default/kubernetes``), as it is there."""
        meta = service["metadata"]
        key = NamespacedName(meta["namespace"], meta["name"])
        spec = {k: v for k, v in service["spec"].items() if k != "clusterIPs"}
        doc = {"apiVersion": "v1", "kind": "Service", "metadata": dict(meta), "spec": spec}
        self._given[key] = RawObject("Service", key, doc)
        self._apply(self._given[key])
        error = self.cluster.errors().get(str(key))
        if error is not None:
            raise RuntimeError(f"kubeproxy refuses {key}: {error}")
        self.held[meta["name"]] = Outcome.of(doc)

    def create(self, service: Obj) -> Outcome:
        name = service["metadata"]["name"]
        key = NamespacedName(self.namespace, name)
        doc = {**service, "metadata": {**service["metadata"], "namespace": self.namespace}}
        raw = RawObject("Service", key, doc)
        self._apply(raw)
        error = self.cluster.errors().get(str(key))
        if error is not None:
            # The API server refuses the write; a manifest stays, retried with every batch:
            # take it away so both sides hold the same Services.
            self._apply(None, raw)
            return Outcome(False, message=error)
        self._given[key] = raw
        completed = next(
            o
            for o in self.cluster.objects()
            if o.get("kind") == "Service"
            and o["metadata"]["name"] == name
            and o["metadata"].get("namespace") == self.namespace
        )
        outcome = Outcome.of(completed)
        self.held[name] = outcome
        return outcome

    def delete(self, name: str) -> None:
        key = NamespacedName(self.namespace, name)
        raw = self._given.pop(key, None)
        if raw is not None:
            self._apply(None, raw)
        self.held.pop(name, None)

    def sync_service_cidrs(self, objects: Sequence[Obj]) -> None:
        wanted = {NamespacedName("", o["metadata"]["name"]): o for o in objects}
        for key in [k for k in self._given if k.namespace == "" and k not in wanted]:
            self._apply(None, self._given.pop(key))
        for key, obj in wanted.items():
            raw = RawObject("ServiceCIDR", key, obj)
            old = self._given.get(key)
            if old != raw:
                self._given[key] = raw
                self._apply(raw, old)
