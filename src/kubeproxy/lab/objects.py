"""Builders for Kubernetes-shaped Service / EndpointSlice / Node / Pod dicts.

Used by the real-kernel tests and the benchmarks to write manifest directories without
hand-writing YAML. The output is what ``kubectl get -o yaml`` would show (trimmed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Ep:
    """One endpoint of a slice."""

    ip: str
    node: str | None = None
    ready: bool | None = None
    serving: bool | None = None
    terminating: bool | None = None
    zone: str | None = None
    zone_hints: tuple[str, ...] = ()
    node_hints: tuple[str, ...] = ()
    pod: str | None = None


def service(
    name: str,
    cluster_ips: str | Sequence[str],
    ports: Iterable[dict[str, Any]] = ({"name": "http", "port": 80},),
    *,
    namespace: str = "default",
    type: str = "ClusterIP",
    **spec: Any,
) -> dict[str, Any]:
    """A Service; with no ``cluster_ips`` (``()``), one for kubeproxy to allocate."""
    ips = [cluster_ips] if isinstance(cluster_ips, str) else list(cluster_ips)
    body: dict[str, Any] = {"type": type}
    if ips:
        body["clusterIP"], body["clusterIPs"] = ips[0], ips
    body["ports"] = [dict(p) for p in ports]
    status = spec.pop("status", None)
    body.update(spec)
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }
    if status is not None:
        obj["status"] = status
    return obj


def endpoint_slice(
    service_name: str,
    endpoints: Iterable[Ep],
    ports: Iterable[dict[str, Any]] = ({"name": "http", "port": 8080},),
    *,
    name: str | None = None,
    namespace: str = "default",
    address_type: str | None = None,
) -> dict[str, Any]:
    eps = list(endpoints)
    if address_type is None:
        address_type = "IPv6" if eps and ":" in eps[0].ip else "IPv4"
    out: list[dict[str, Any]] = []
    for ep in eps:
        item: dict[str, Any] = {"addresses": [ep.ip]}
        cond = {
            k: v
            for k, v in (
                ("ready", ep.ready),
                ("serving", ep.serving),
                ("terminating", ep.terminating),
            )
            if v is not None
        }
        if cond:
            item["conditions"] = cond
        if ep.node:
            item["nodeName"] = ep.node
        if ep.zone:
            item["zone"] = ep.zone
        hints: dict[str, Any] = {}
        if ep.zone_hints:
            hints["forZones"] = [{"name": z} for z in ep.zone_hints]
        if ep.node_hints:
            hints["forNodes"] = [{"name": n} for n in ep.node_hints]
        if hints:
            item["hints"] = hints
        if ep.pod:
            item["targetRef"] = {"kind": "Pod", "namespace": namespace, "name": ep.pod}
        out.append(item)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name or f"{service_name}-{address_type.lower()}",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": address_type,
        "ports": [dict(p) for p in ports],
        "endpoints": out,
    }


def node(
    name: str,
    ips: Sequence[str] = (),
    zone: str | None = None,
    pod_cidrs: Sequence[str] = (),
    cpu: str | None = None,
) -> dict[str, Any]:
    """A Node; with ``cpu``, also Ready with that allocatable CPU (topology-mode Auto)."""
    meta: dict[str, Any] = {"name": name}
    if zone:
        meta["labels"] = {"topology.kubernetes.io/zone": zone}
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "status": {"addresses": [{"type": "InternalIP", "address": ip} for ip in ips]},
    }
    if pod_cidrs:
        obj["spec"] = {"podCIDR": pod_cidrs[0], "podCIDRs": list(pod_cidrs)}
    if cpu is not None:
        obj["status"]["allocatable"] = {"cpu": cpu}
        obj["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return obj


def pod(
    name: str,
    node_name: str,
    ips: Sequence[str],
    labels: dict[str, str],
    ports: dict[str, int] | None = None,
    *,
    namespace: str = "default",
    ready: bool = True,
) -> dict[str, Any]:
    """A Pod running elsewhere, as a standalone cluster's manifests describe one:
    its node, IPs, labels, named container ports and Ready condition."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "nodeName": node_name,
            "containers": [
                {
                    "name": "main",
                    "ports": [
                        {"name": port_name, "containerPort": number}
                        for port_name, number in (ports or {"http": 8080}).items()
                    ],
                }
            ],
        },
        "status": {
            "podIP": ips[0],
            "podIPs": [{"ip": ip} for ip in ips],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


@dataclass
class ManifestDir:
    """A directory of manifests that tests rewrite between syncs."""

    path: Path
    files: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def write(self, filename: str, *objects: dict[str, Any]) -> None:
        self.files[filename] = list(objects)
        target = self.path / filename
        tmp = target.with_name(f".{filename}.tmp")
        tmp.write_text(yaml.safe_dump_all(list(objects), sort_keys=False))
        tmp.replace(target)  # atomic: the watcher never sees half a file

    def remove(self, filename: str) -> None:
        self.files.pop(filename, None)
        (self.path / filename).unlink(missing_ok=True)

    def clear(self) -> None:
        for filename in list(self.files):
            self.remove(filename)
