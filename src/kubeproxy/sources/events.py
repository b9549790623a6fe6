"""Source-independent events, shaped like a Kubernetes informer's callbacks.

Every source (a manifest directory today, the API server later) yields batches of
:class:`Event`: ``ADDED`` (new only), ``MODIFIED`` (old and new), ``DELETED`` (old only),
already parsed into model objects. :func:`dispatch` feeds them to a
:class:`~kubeproxy.model.state.ProxyState`. A :data:`SYNCED` marker says the source has
delivered its complete initial state, so the first sync never programs a partial view.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kubeproxy.model.state import ProxyState
from kubeproxy.model.types import EndpointSlice, NamespacedName, Node, Service, ServiceCIDR


@dataclass(frozen=True, slots=True)
class RawObject:
    """An object passed on as decoded, not parsed: for a layer that completes it first
    (:mod:`kubeproxy.controlplane.standalone`). :func:`dispatch` ignores it."""

    kind: str
    key: NamespacedName
    doc: Mapping[str, Any]

    @property
    def namespace(self) -> str:
        return self.key.namespace

    @property
    def name(self) -> str:
        return self.key.name


Model = Service | EndpointSlice | Node | ServiceCIDR | RawObject


class EventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True)
class Event:
    """One change to one object; ``old`` and ``new`` are of the same kind."""

    type: EventType
    old: Model | None
    new: Model | None

    @classmethod
    def added(cls, obj: Model) -> Event:
        return cls(EventType.ADDED, None, obj)

    @classmethod
    def modified(cls, old: Model, new: Model) -> Event:
        return cls(EventType.MODIFIED, old, new)

    @classmethod
    def deleted(cls, obj: Model) -> Event:
        return cls(EventType.DELETED, obj, None)


def dispatch(state: ProxyState, events: list[Event]) -> bool:
    """Apply a batch of events; True if anything is now waiting for a sync."""
    for event in events:
        obj = event.new if event.new is not None else event.old
        if isinstance(obj, Service):
            old_svc = event.old if isinstance(event.old, Service) else None
            new_svc = event.new if isinstance(event.new, Service) else None
            state.on_service(old_svc, new_svc)
        elif isinstance(obj, EndpointSlice):
            old = event.old
            if event.type is EventType.DELETED:
                state.on_endpoint_slice(obj, deleted=True)
                continue
            if isinstance(old, EndpointSlice) and old.service != obj.service:
                # Relabelled to another Service: it leaves the old one.
                state.on_endpoint_slice(old, deleted=True)
            state.on_endpoint_slice(obj)
        # on_node(None) means "our Node is gone": only pass it for our own node, or
        # deleting any other Node would wipe this node's zone and IPs.
        elif isinstance(obj, Node) and obj.name == state.node_name:
            state.on_node(event.new if isinstance(event.new, Node) else None)
        elif isinstance(obj, ServiceCIDR):
            state.on_service_cidr(
                event.old if isinstance(event.old, ServiceCIDR) else None,
                event.new if isinstance(event.new, ServiceCIDR) else None,
            )
    return state.pending
