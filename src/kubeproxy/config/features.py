"""Feature gates (``featureGates``): the ones kube-proxy reads, their defaults and stages.

Upstream keeps them in ``pkg/features``. :data:`KNOWN_FEATURE_GATES` (defaults) and
:data:`FEATURE_GATE_STAGES` (for the ``kubernetes_feature_enabled`` metric, through
:func:`feature_states`); :func:`effective_feature_gates` is the file and flags over those
defaults; :func:`feature_flags` the gates the pure core reads; :func:`feature_gate_warnings`
the names kubeproxy does not know (warned about, not refused).
"""

from __future__ import annotations

from collections.abc import Mapping

from kubeproxy.config.types import KubeProxyConfiguration
from kubeproxy.model.topology import FeatureFlags

# Gates that change kube-proxy behaviour (upstream names and defaults); any name upstream
# knows is accepted by upstream, so other names only warn (see feature_gate_warnings).
KNOWN_FEATURE_GATES: Mapping[str, bool] = {
    "AllAlpha": False,
    "AllBeta": False,
    "ContextualLogging": True,
    "KubeProxyDrainingTerminatingNodes": True,
    "LoadBalancerIPMode": True,
    "LoggingAlphaOptions": False,
    "LoggingBetaOptions": True,
    "MultiCIDRServiceAllocator": True,
    "NFTablesProxyMode": True,
    "PreferSameTrafficDistribution": True,
    "ServiceTrafficDistribution": True,
    "TopologyAwareHints": True,
    # kernelspace mode: winkernel.enableDSR needs it (beta, on by default since 1.33).
    "WinDSR": True,
}


# Each known gate's stage, as component-base's featuregate labels kubernetes_feature_enabled
# (its PreRelease: "ALPHA", "BETA", "" for GA, "DEPRECATED"), at the release whose defaults
# KNOWN_FEATURE_GATES has (1.34).
FEATURE_GATE_STAGES: Mapping[str, str] = {
    "AllAlpha": "ALPHA",
    "AllBeta": "BETA",
    "ContextualLogging": "BETA",
    "KubeProxyDrainingTerminatingNodes": "",
    "LoadBalancerIPMode": "",
    "LoggingAlphaOptions": "ALPHA",
    "LoggingBetaOptions": "BETA",
    "MultiCIDRServiceAllocator": "",
    "NFTablesProxyMode": "",
    "PreferSameTrafficDistribution": "BETA",
    "ServiceTrafficDistribution": "",
    "TopologyAwareHints": "",
    "WinDSR": "BETA",
}


def feature_states(cfg: KubeProxyConfiguration) -> list[tuple[str, str, bool]]:
    """(name, stage, enabled) of every gate kubeproxy knows, for kubernetes_feature_enabled."""
    gates = effective_feature_gates(cfg)
    return [(name, FEATURE_GATE_STAGES[name], gates[name]) for name in sorted(KNOWN_FEATURE_GATES)]


def effective_feature_gates(cfg: KubeProxyConfiguration) -> dict[str, bool]:
    gates = dict(KNOWN_FEATURE_GATES)
    gates.update(cfg.feature_gates)
    return gates


def feature_flags(cfg: KubeProxyConfiguration) -> FeatureFlags:
    """The gates the pure core reads, as :class:`~kubeproxy.model.topology.FeatureFlags`."""
    gates = effective_feature_gates(cfg)
    return FeatureFlags(prefer_same_traffic_distribution=gates["PreferSameTrafficDistribution"])


def feature_gate_warnings(cfg: KubeProxyConfiguration) -> list[str]:
    """Gates this kubeproxy does not know. Upstream rejects names missing from its own
    (complete) registry; kubeproxy knows only the proxy's gates, so it warns instead of
    refusing a file upstream accepts."""
    return [
        f"featureGates.{name}: unrecognized feature gate, ignored"
        for name in sorted(cfg.feature_gates)
        if name not in KNOWN_FEATURE_GATES
    ]
