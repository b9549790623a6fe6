"""Copy-on-write helpers for EndpointSlice dicts, shared by the reconciler and both hint stages.

The library promises never to mutate what it is given. Copying whole slices with
``copy.deepcopy`` would cost most of the controller's time, so a slice is copied one
level down instead: its metadata (with labels and annotations) and its endpoint *list*
are new, while each endpoint dict is shared until it must change, and then it is
replaced by a new dict (:func:`with_hints`), never edited.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]


def copy_slice(endpoint_slice: Mapping[str, Any]) -> Obj:
    copied = dict(endpoint_slice)
    meta = dict(endpoint_slice.get("metadata") or {})
    for key in ("labels", "annotations"):
        if key in meta:
            meta[key] = dict(meta[key])
    copied["metadata"] = meta
    copied["endpoints"] = list(endpoint_slice.get("endpoints") or ())
    return copied


def endpoint_ready(endpoint: Mapping[str, Any]) -> bool:
    """Upstream ``EndpointReady``: the Ready condition is set and true."""
    return (endpoint.get("conditions") or {}).get("ready") is True


def with_hints(endpoint: Mapping[str, Any], hints: Obj | None) -> Obj:
    """A new endpoint dict with ``hints`` set, or removed when ``hints`` is None."""
    copied = dict(endpoint)
    if hints is None:
        copied.pop("hints", None)
    else:
        copied["hints"] = hints
    return copied


def zone_hint(zone: str) -> Obj:
    return {"forZones": [{"name": zone}]}
