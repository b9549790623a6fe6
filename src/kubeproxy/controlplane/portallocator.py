"""NodePort allocation, as kube-apiserver does it (``pkg/registry/core/service/portallocator``).

Map of this module:

* :func:`parse_port_range` — ``--service-node-port-range`` (``"30000-32767"``, the default;
  also ``"30000+2767"`` and a single port), as apimachinery's ``ParsePortRange``.
* :func:`calculate_port_range_offset` — the static lower band of a port range (KEP-3668):
  ``min(max(16, size/32), 128)``, 0 when the range has 16 ports or fewer. For the default
  range (2,768 ports) that is 86: ports 30000-30085 are the static band.
* :class:`NodePortAllocator` — a bitmap over the range with upstream's two-band random scan.
* :func:`allocate_service_node_ports` / :func:`release_service_node_ports` — what the
  Service REST storage does on create / delete (``pkg/registry/core/service/storage/
  alloc.go``): a nodePort per port of a NodePort or LoadBalancer Service (ports that share a
  port number share one nodePort; a requested nodePort is reserved, else the next free one;
  ``allocateLoadBalancerNodePorts: false`` allocates none but keeps requested ones), and a
  ``healthCheckNodePort`` — from the same range and the same allocator — for a
  LoadBalancer Service with ``externalTrafficPolicy: Local``.

Errors are the ones of :mod:`kubeproxy.controlplane.ipallocator` (ErrFull, ErrAllocated,
ErrNotInRange), with upstream's port wording.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubeproxy.controlplane._bands import AllocationBitmap
from kubeproxy.controlplane.ipallocator import (
    AllocationError,
    ErrAllocated,
    ErrFull,
    ErrNotInRange,
)

DEFAULT_NODE_PORT_RANGE = "30000-32767"

_BAND_MIN = 16
_BAND_MAX = 128
_BAND_STEP = 32
_MAX_PORT = 65535


@dataclass(frozen=True)
class PortRange:
    base: int
    size: int

    @property
    def last(self) -> int:
        return self.base + self.size - 1

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.base <= port <= self.last

    def __str__(self) -> str:
        return f"{self.base}-{self.last}" if self.size else ""


def parse_port_range(value: str) -> PortRange:
    """``"A-B"``, ``"A+N"`` (A to A+N) or ``"A"``; ValueError otherwise."""
    text = value.strip()
    if not text:
        return PortRange(0, 0)
    try:
        if "-" in text:
            low_s, high_s = text.split("-", 1)
            low, high = int(low_s), int(high_s)
        elif "+" in text:
            low_s, offset_s = text.split("+", 1)
            low = int(low_s)
            high = low + int(offset_s)
        else:
            low = high = int(text)
    except ValueError:
        raise ValueError(f"unable to parse port range: {value}") from None
    if not (0 <= low <= _MAX_PORT and 0 <= high <= _MAX_PORT) or high < low:
        raise ValueError(f"invalid port range: {value}")
    return PortRange(low, high - low + 1)


def calculate_port_range_offset(port_range: PortRange) -> int:
    """The static lower band of a port range: ``min(max(16, size/32), 128)``, 0 if size <= 16."""
    if port_range.size <= _BAND_MIN:
        return 0
    return min(max(_BAND_MIN, port_range.size // _BAND_STEP), _BAND_MAX)


class NodePortAllocator:
    """Ports from ``--service-node-port-range`` (upstream ``PortAllocator``)."""

    def __init__(
        self,
        port_range: str | PortRange = DEFAULT_NODE_PORT_RANGE,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.port_range = (
            parse_port_range(port_range) if isinstance(port_range, str) else port_range
        )
        self.band_offset = calculate_port_range_offset(self.port_range)
        self._bitmap = AllocationBitmap(
            self.port_range.size, self.band_offset, rng if rng is not None else random.Random()
        )

    def allocate(self, port: int) -> None:
        if port not in self.port_range:
            raise ErrNotInRange(port, str(self.port_range), what="port")
        if not self._bitmap.allocate(port - self.port_range.base):
            raise ErrAllocated("provided port is already allocated")

    def allocate_next(self) -> int:
        offset = self._bitmap.allocate_next()
        if offset is None:
            raise ErrFull
        return self.port_range.base + offset

    def release(self, port: int) -> None:
        """Releasing a free or out-of-range port is a no-op, as upstream."""
        if port in self.port_range:
            self._bitmap.release(port - self.port_range.base)

    def has(self, port: int) -> bool:
        return port in self.port_range and self._bitmap.has(port - self.port_range.base)

    def used(self) -> int:
        return self._bitmap.used()

    def free(self) -> int:
        return self._bitmap.free()

    def allocated(self) -> list[int]:
        return [self.port_range.base + offset for offset in self._bitmap.taken()]

    def static_band(self) -> tuple[int, int] | None:
        if self.band_offset == 0:
            return None
        return self.port_range.base, self.port_range.base + self.band_offset - 1


def needs_health_check(service: Mapping[str, Any]) -> bool:
    """Upstream ``NeedsHealthCheck``: a LoadBalancer Service with externalTrafficPolicy Local."""
    spec = service.get("spec") or {}
    return bool(spec.get("type") == "LoadBalancer" and spec.get("externalTrafficPolicy") == "Local")


def _should_allocate_node_ports(spec: Mapping[str, Any]) -> bool:
    if spec.get("type") == "NodePort":
        return True
    # LoadBalancer: allocateLoadBalancerNodePorts defaults to true.
    return spec.get("allocateLoadBalancerNodePorts") is not False


def allocate_service_node_ports(
    service: Mapping[str, Any], allocator: NodePortAllocator
) -> dict[str, Any]:
    """The Service with its nodePorts and healthCheckNodePort filled in (a new dict).

    All or nothing: if any port cannot be had, the ones taken are released and the error
    (an :class:`AllocationError`) is raised.
    """
    result = copy.deepcopy(dict(service))
    spec = result.setdefault("spec", {})
    taken: list[int] = []

    def take(port: int | None) -> int:
        if port:
            allocator.allocate(port)
            taken.append(port)
            return port
        got = allocator.allocate_next()
        taken.append(got)
        return got

    try:
        if spec.get("type") in ("NodePort", "LoadBalancer"):
            _init_node_ports(spec, take)
        if needs_health_check(result):
            spec["healthCheckNodePort"] = take(spec.get("healthCheckNodePort") or None)
    except AllocationError:
        for port in taken:
            allocator.release(port)
        raise
    return result


def _init_node_ports(spec: dict[str, Any], take: Callable[[int | None], int]) -> None:
    """Upstream ``initNodePorts``: one nodePort per distinct port number."""
    ports: list[dict[str, Any]] = spec.get("ports") or []
    by_port: dict[int, int] = {}
    allocate_new = _should_allocate_node_ports(spec)
    for service_port in ports:
        if not service_port.get("nodePort") and not allocate_new:
            continue  # keep requested ones only
        number = int(service_port.get("port") or 0)
        already = by_port.get(number)
        if already is None:
            # A later entry with the same port number may carry the requested nodePort.
            requested = next(
                (
                    int(p["nodePort"])
                    for p in ports
                    if int(p.get("port") or 0) == number and p.get("nodePort")
                ),
                None,
            )
            got = take(requested)
            service_port["nodePort"] = got
            by_port[number] = got
        elif service_port.get("nodePort") and int(service_port["nodePort"]) != already:
            take(int(service_port["nodePort"]))
        else:
            service_port["nodePort"] = already


def release_service_node_ports(service: Mapping[str, Any], allocator: NodePortAllocator) -> None:
    """Give back a deleted Service's nodePorts and (if it needed one) healthCheckNodePort."""
    spec = service.get("spec") or {}
    for service_port in spec.get("ports") or ():
        if service_port.get("nodePort"):
            allocator.release(int(service_port["nodePort"]))
    if needs_health_check(service) and spec.get("healthCheckNodePort"):
        allocator.release(int(spec["healthCheckNodePort"]))
