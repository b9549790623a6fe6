"""Source-independent events, shaped like a Kubernetes informer's callbacks.

Every source (:mod:`kubeproxy.sources`: a manifest directory, the API server) yields batches of
:class:`Event`: ``ADDED`` (new only), ``MODIFIED`` (old and new), ``DELETED`` (old only),
already parsed into model objects. :func:`dispatch` feeds them to a
:class:`~kubeproxy.model.state.ProxyState`. A :data:`SYNCED` marker says the source has
delivered its complete initial state, so the first sync never programs a partial view.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kubeproxy.model.state import ProxyState
from kubeproxy.model.types import EndpointSlice, NamespacedName, Node, Service, ServiceCIDR


class RawObject:
    """An object passed on as decoded, not parsed: for a layer that completes it first
    (:mod:`kubeproxy.controlplane.standalone`). :func:`dispatch` ignores it.

    Held long (a manifest directory's every object, for diffing and completing), the
    document would cost ~10x its text in Python objects (~110 MB at 10,000 Services with
    10 endpoints), so it is also kept pickled: :meth:`compact` gives the same object
    without the decoded document, which ``doc`` then decodes on each use (changes only).
    Pickle, because it round-trips exactly every type a YAML or JSON load gives (dates,
    sets, bytes, non-string keys), at C speed; only this process's own objects are
    ever unpickled. Two objects are equal when their documents are.
    """

    __slots__ = ("_doc", "_packed", "key", "kind")

    def __init__(self, kind: str, key: NamespacedName, doc: Mapping[str, Any]) -> None:
        self.kind = kind
        self.key = key
        self._doc: Mapping[str, Any] | None = doc
        # Raises RecursionError for a document nested too deeply to pickle.
        self._packed = pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def from_packed(cls, kind: str, key: NamespacedName, packed: bytes) -> RawObject:
        """A compact object from its pickled document (as :attr:`packed_doc` gave it)."""
        if not isinstance(packed, bytes):
            raise TypeError("a pickled document is bytes")
        obj = object.__new__(cls)
        obj.kind, obj.key, obj._doc, obj._packed = kind, key, None, packed
        return obj

    @property
    def packed_doc(self) -> bytes:
        """The pickled document."""
        return self._packed

    @property
    def doc(self) -> Mapping[str, Any]:
        if self._doc is not None:
            return self._doc
        doc: Mapping[str, Any] = pickle.loads(self._packed)
        return doc

    def compact(self) -> RawObject:
        """The same object holding only the pickled document."""
        return self if self._doc is None else self._copy(None)

    def is_compact(self) -> bool:
        return self._doc is None

    def decoded(self) -> RawObject:
        """The same object holding its decoded document too (for repeated use)."""
        return self if self._doc is not None else self._copy(self.doc)

    def _copy(self, doc: Mapping[str, Any] | None) -> RawObject:
        copy = object.__new__(RawObject)
        copy.kind, copy.key, copy._doc, copy._packed = self.kind, self.key, doc, self._packed
        return copy

    @property
    def namespace(self) -> str:
        return self.key.namespace

    @property
    def name(self) -> str:
        return self.key.name

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RawObject):
            return NotImplemented
        if (self.kind, self.key) != (other.kind, other.key):
            return False
        # Equal pickles are equal documents; different ones may still be (key order).
        return self._packed == other._packed or self.doc == other.doc

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RawObject({self.kind!r}, {self.key!r}, {self.doc!r})"


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
