"""Per-Service chain names are upstream's: ``base32(sha256(...))[:16]`` after a prefix."""

from __future__ import annotations

import base64
import hashlib

from hypothesis import given
from hypothesis import strategies as st

from kubeproxy.backends.iptables.names import ServicePortChains, _hash
from kubeproxy.model.types import L4Protocol, NamespacedName, ServicePortName


def upstream_hash(text: str) -> str:
    """As upstream computes it (servicePortChainName, servicePortEndpointChainName)."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]


@given(st.text())
def test_the_short_encoding_is_upstreams(text: str) -> None:
    assert _hash(text) == upstream_hash(text)


def test_upstream_golden_names_and_remembered_endpoint_chains() -> None:
    names = ServicePortChains(ServicePortName(NamespacedName("ns1", "svc1"), "p80", L4Protocol.TCP))
    # upstream kube-proxy's own test value for ns1/svc1:p80
    assert names.svc == "KUBE-SVC-XPGD46QRK7WJZT7O"
    sep = names.sep("10.180.0.1:80")
    assert sep == "KUBE-SEP-" + upstream_hash("ns1/svc1:p80tcp10.180.0.1:80")
    assert names.sep("10.180.0.1:80") is sep
    assert names.sep("10.180.0.2:80") != sep
