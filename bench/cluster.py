"""Synthetic clusters for the benchmarks: N Services x E endpoints as API-shaped objects.

Every Service gets a unique ClusterIP in 10.96.0.0/12 and E endpoints with unique Pod IPs
in 10.128.0.0/9, spread over 4 nodes (a quarter on this node), one EndpointSlice per
Service — the shape of a large cluster as the API server would hand it over.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kubeproxy.lab.objects import Ep, endpoint_slice, service

NODES = ("node-a", "node-b", "node-c", "node-d")


def cluster_ip(i: int) -> str:
    return f"10.{96 + i // 65536}.{(i // 256) % 256}.{i % 256}"


def pod_ip(k: int) -> str:
    return f"10.{128 + k // 65536}.{(k // 256) % 256}.{k % 256}"


def service_objects(
    i: int, endpoints: int, *, first_endpoint: int | None = None, port: int = 80
) -> list[dict[str, Any]]:
    """Service number ``i`` and its EndpointSlice."""
    base = i * endpoints if first_endpoint is None else first_endpoint
    name = f"svc-{i}"
    eps = [Ep(pod_ip(base + j), node=NODES[(base + j) % len(NODES)]) for j in range(endpoints)]
    return [
        service(name, cluster_ip(i), [{"name": "http", "port": port}], namespace="bench"),
        endpoint_slice(name, eps, namespace="bench"),
    ]


def cluster(services: int, endpoints: int) -> Iterator[dict[str, Any]]:
    """The objects one at a time, as a paginated list or a watch delivers them."""
    for i in range(services):
        yield from service_objects(i, endpoints)
