"""kubeproxy's own settings, as an optional second document of a ``--config`` file.

A config file stays a valid upstream ``KubeProxyConfiguration`` (decoded strictly by
:mod:`kubeproxy.config.codec`); what upstream has no field for lives in a separate document
of our own kind, so the upstream document never needs unknown fields::

    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    kind: KubeProxyConfiguration
    ...
    ---
    apiVersion: kubeproxy.dev/v1alpha1
    kind: KubeproxyOptions
    manifests: .                 # read objects from this directory (relative to the file)
    serviceClusterIPRanges: [10.96.0.0/12]
    iptablesBackend: auto        # iptables mode: auto (as upstream's image), nft or legacy

Flags (``--manifests``, ``--service-cluster-ip-range``, ``--iptables-backend``) win over
these fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

API_VERSION = "kubeproxy.dev/v1alpha1"
# Which iptables iptables mode drives: "auto" picks the one the node's rules use.
IPTABLES_BACKENDS = ("auto", "nft", "legacy")
KIND = "KubeproxyOptions"


class OptionsError(ValueError):
    pass


@dataclass(frozen=True)
class KubeproxyOptions:
    manifests: Path | None = None
    service_cluster_ip_ranges: tuple[str, ...] = ()
    iptables_backend: str | None = None


def split_config(text: str, source: str) -> tuple[str, KubeproxyOptions]:
    """The KubeProxyConfiguration document's text, and our options (defaults if absent)."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise OptionsError(f"{source}: failed to decode: {err}") from None
    if len(docs) <= 1:
        return text, KubeproxyOptions()
    ours = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    upstream = [d for d in docs if not (isinstance(d, dict) and d.get("kind") == KIND)]
    if len(ours) != 1 or len(upstream) != 1:
        raise OptionsError(
            f"{source}: expected one KubeProxyConfiguration document and at "
            f"most one {KIND} document"
        )
    return yaml.safe_dump(upstream[0], sort_keys=False), _options(ours[0], source)


def _options(doc: dict[str, Any], source: str) -> KubeproxyOptions:
    errors = []
    if doc.get("apiVersion") != API_VERSION:
        errors.append(f"apiVersion: must be {API_VERSION}")
    known = {"apiVersion", "kind", "manifests", "serviceClusterIPRanges", "iptablesBackend"}
    unknown = set(doc) - known
    errors.extend(f"{name}: unknown field" for name in sorted(unknown))
    manifests = doc.get("manifests")
    if manifests is not None and not isinstance(manifests, str):
        errors.append("manifests: must be a directory path")
    ranges = doc.get("serviceClusterIPRanges") or []
    if not isinstance(ranges, list) or not all(isinstance(r, str) for r in ranges):
        errors.append("serviceClusterIPRanges: must be a list of CIDRs")
    backend = doc.get("iptablesBackend")
    if backend is not None and backend not in IPTABLES_BACKENDS:
        errors.append(f"iptablesBackend: must be one of {', '.join(IPTABLES_BACKENDS)}")
    if errors:
        raise OptionsError(f"{source} ({KIND}): " + "; ".join(errors))
    base = Path(source).parent
    return KubeproxyOptions(
        manifests=(base / manifests) if isinstance(manifests, str) else None,
        service_cluster_ip_ranges=tuple(ranges),
        iptables_backend=backend,
    )
