"""Pods and Service selectors indexed by label, for the standalone control plane
(:mod:`kubeproxy.controlplane.standalone`): which Services select a Pod, which Pods a
selector may select, without a scan of the namespace."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeproxy.model.types import NamespacedName

_Label = tuple[str, str, Any]  # namespace, label key, label value


class LabelIndex:
    """Pods and Service selectors by (namespace, label key, value): a change looks only at
    the objects sharing a label with it, not at every Pod or Service of the namespace."""

    def __init__(self) -> None:
        self.pods: dict[NamespacedName, Mapping[str, Any]] = {}
        self.selectors: dict[NamespacedName, Mapping[str, Any]] = {}
        self._pods_by_label: dict[_Label, set[NamespacedName]] = {}
        # Each selector under one of its labels (the first): a Pod it selects has it.
        self._selectors_by_label: dict[_Label, set[NamespacedName]] = {}

    def set_pod(self, key: NamespacedName, pod: Mapping[str, Any] | None) -> None:
        old = self.pods.pop(key, None)
        if old is not None:
            for label in _index_labels(key.namespace, labels_of(old)):
                _discard(self._pods_by_label, label, key)
        if pod is not None:
            self.pods[key] = pod
            for label in _index_labels(key.namespace, labels_of(pod)):
                self._pods_by_label.setdefault(label, set()).add(key)

    def set_selector(self, key: NamespacedName, selector: Mapping[str, Any] | None) -> None:
        old = self.selectors.pop(key, None)
        if old is not None:
            for label in _index_labels(key.namespace, old)[:1]:
                _discard(self._selectors_by_label, label, key)
        if selector:
            self.selectors[key] = selector
            for label in _index_labels(key.namespace, selector)[:1]:
                self._selectors_by_label.setdefault(label, set()).add(key)

    def services_selecting(self, namespace: str, labels: Mapping[str, Any]) -> set[NamespacedName]:
        return {
            service
            for label in _index_labels(namespace, labels)
            for service in self._selectors_by_label.get(label, ())
            if matches(self.selectors[service], labels)
        }

    def pods_selected(self, namespace: str, selector: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """Candidates (the Pods with the selector's rarest label); the caller matches."""
        labels = _index_labels(namespace, selector)
        if not labels or len(labels) != len(selector):
            return []
        rarest = min((self._pods_by_label.get(label, set()) for label in labels), key=len)
        return [self.pods[key] for key in sorted(rarest)]


def _index_labels(namespace: str, labels: Mapping[str, Any]) -> list[_Label]:
    """Sorted; values that cannot be label values (lists, maps) are left out."""
    return sorted(
        (namespace, str(k), v)
        for k, v in labels.items()
        if isinstance(v, str | int | float | bool) or v is None
    )


def _discard(index: dict[_Label, set[NamespacedName]], label: _Label, key: NamespacedName) -> None:
    members = index.get(label)
    if members is not None:
        members.discard(key)
        if not members:
            del index[label]


def labels_of(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's ``metadata.labels`` (empty when absent or malformed)."""
    meta = doc.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
