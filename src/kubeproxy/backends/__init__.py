"""Proxy backends (one per proxy mode) behind one small interface, and their registry.

A backend turns a :class:`~kubeproxy.model.state.Snapshot` into kernel state. ``sync``
receives the ServicePorts that changed since the previous successful sync, or None for a
full sync; ``render`` returns what a full sync would apply without touching anything;
``cleanup`` removes everything the backend ever created and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from kubeproxy.config import ProxyConfig
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import ServicePortName


@dataclass
class SyncResult:
    """What one sync did, for logs and metrics."""

    full: bool
    service_ports: int = 0
    rendered: int = 0
    elements: int = 0
    chains: int = 0
    operations: int = 0
    no_local_internal: int = 0
    no_local_external: int = 0
    # Where the time went: building the change (render) and the kernel calls (apply).
    render_seconds: float = 0.0
    apply_seconds: float = 0.0
    # One log line per destination two ServicePorts both claim.
    conflicts: list[str] = field(default_factory=list)


class Backend(Protocol):
    name: str

    def sync(self, snapshot: Snapshot, changed: set[ServicePortName] | None) -> SyncResult: ...

    def render(self, snapshot: Snapshot) -> str: ...

    def cleanup(self) -> list[str]: ...


def _nftables(config: ProxyConfig) -> Backend:
    from kubeproxy.backends.nftables.proxier import NftablesBackend
    from kubeproxy.dataplane.nft import open_runner

    return NftablesBackend(config, open_runner())


BACKENDS: dict[str, Callable[[ProxyConfig], Backend]] = {
    "nftables": _nftables,
}


def create_backend(config: ProxyConfig) -> Backend:
    try:
        factory = BACKENDS[config.mode]
    except KeyError:
        raise ValueError(
            f"--proxy-mode: unsupported mode {config.mode!r} (supported: {', '.join(BACKENDS)})"
        ) from None
    return factory(config)
