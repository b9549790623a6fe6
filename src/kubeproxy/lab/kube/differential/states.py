"""Seeded cluster states: Services of every kind over a pool of Pods, as API objects.

:func:`generate` is pure: a seed, the lab's nodes (name, zone), the pool's slots (a
slot is a Pod's network namespace on a node, its echo server answering with the
slot's name) and an address block give one :class:`State`, the same on every machine.
A state is what one namespace holds: Pod objects over some slots (ready, not ready,
terminating while serving or not), two to four Services over them (every type,
traffic policy, family policy, ports in TCP and UDP, session affinity, external IPs,
load-balancer IPs in VIP or Proxy mode with and without source ranges, topology by
annotation or ``trafficDistribution``, the label that hands a Service to another
proxy), and sometimes a ServiceCIDR of its own with a Service placed in it.

:func:`objects` turns a state into the API objects the lab creates through the real
API server (the real allocators give ClusterIPs and NodePorts, the real EndpointSlice
controller the slices and hints); :class:`State` round-trips through JSON
(:meth:`State.to_json` / :meth:`State.from_json`) so a bench run's states can be
replayed.

Addresses a state picks itself (external IPs, load-balancer IPs, its ServiceCIDR) come
from its ``block`` (0-15), so states applied side by side never collide.
"""

from __future__ import annotations

import ipaddress
import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

Obj = dict[str, Any]

TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
# ipFamilyPolicy, with the families in order (the first is the primary one).
FAMILY_POLICIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SingleStack", ("IPv4",)),
    ("SingleStack", ("IPv4",)),
    ("SingleStack", ("IPv6",)),
    ("PreferDualStack", ("IPv4", "IPv6")),
    ("RequireDualStack", ("IPv4", "IPv6")),
    ("RequireDualStack", ("IPv6", "IPv4")),
)
# What the pool's echo servers listen on (named p8080, p8081 in the Pods' specs).
TARGET_PORTS = (8080, 8081)
SERVICE_PORTS = (80, 53, 443, 8080, 9000)
TOPOLOGY = ("annotation:Auto", "PreferClose", "PreferSameZone", "PreferSameNode")
# Where outside clients are: what loadBalancerSourceRanges may allow.
SOURCE_RANGES = (
    "172.31.0.100/32",  # the outside host
    "172.31.0.0/24",  # the nodes' network (the outside host and the nodes)
    "10.244.0.0/16",  # Pods
    "192.168.0.0/16",  # nobody in the lab
    "fd00:31::100/128",
    "fd00:31::/64",
    "fd00:10:244::/56",
)
HOLD = "kubeproxy.lab/hold"  # the finalizer that keeps a deleted Pod Terminating
PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"
TOPOLOGY_ANNOTATION = "service.kubernetes.io/topology-mode"


@dataclass(frozen=True)
class Slot:
    """A Pod's network namespace in the pool: its name (what it answers) and node."""

    name: str
    node: str


@dataclass(frozen=True)
class PodState:
    slot: str
    node: str
    labels: dict[str, str]
    ready: bool
    terminating: bool


@dataclass(frozen=True)
class PortState:
    name: str
    protocol: str
    port: int
    target: int | str


@dataclass(frozen=True)
class ServiceState:
    name: str
    type: str
    family_policy: str
    families: tuple[str, ...]
    ports: tuple[PortState, ...]
    selector: dict[str, str]
    external_traffic_policy: str | None = None
    internal_traffic_policy: str = "Cluster"
    affinity_timeout: int | None = None
    external_ips: tuple[str, ...] = ()
    lb_ips: tuple[str, ...] = ()
    lb_ip_mode: str = "VIP"
    source_ranges: tuple[str, ...] = ()
    allocate_lb_node_ports: bool = True
    publish_not_ready: bool = False
    topology: str | None = None
    proxy_name: str | None = None
    cluster_ips: tuple[str, ...] = ()
    # Given rather than allocated (change sequences: both proxies' runs must see the
    # same numbers, and a Service turning NodePort must get the same ones each time):
    # one per port, and the health check's with externalTrafficPolicy Local.
    node_ports: tuple[int, ...] = ()
    health_node_port: int | None = None

    def selects(self, pod: PodState) -> bool:
        """As the EndpointSlice controller: a Service without a selector selects none
        (its slices are written by hand)."""
        return bool(self.selector) and all(pod.labels.get(k) == v for k, v in self.selector.items())


@dataclass(frozen=True)
class SliceEndpointState:
    """An endpoint of a hand-written slice: a slot's address of the slice's family (its
    node the endpoint's ``nodeName``), with conditions and topology as written."""

    slot: str
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    zone: str | None = None
    zone_hints: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SliceState:
    """A hand-written EndpointSlice of a selector-less Service: shapes the EndpointSlice
    controller never makes (an address in two slices, a port 0, odd zones, labels)."""

    name: str
    service: str
    family: str
    ports: tuple[tuple[str, str, int], ...]  # (name, protocol, port), port 0 allowed
    endpoints: tuple[SliceEndpointState, ...]
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class State:
    seed: int
    block: int
    node: str  # the node whose proxy is compared
    pods: tuple[PodState, ...]
    services: tuple[ServiceState, ...]
    service_cidrs: tuple[str, ...] = field(default=())
    # Hand-written slices (pinned states only): their Services select nothing.
    slices: tuple[SliceState, ...] = field(default=())

    def to_json(self) -> Obj:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Obj) -> State:
        pods = tuple(PodState(**p) for p in data["pods"])
        services = tuple(
            ServiceState(
                **{
                    **s,
                    "families": tuple(s["families"]),
                    "ports": tuple(PortState(**p) for p in s["ports"]),
                    "external_ips": tuple(s["external_ips"]),
                    "lb_ips": tuple(s["lb_ips"]),
                    "source_ranges": tuple(s["source_ranges"]),
                    "cluster_ips": tuple(s["cluster_ips"]),
                    "node_ports": tuple(s.get("node_ports", ())),
                }
            )
            for s in data["services"]
        )
        slices = tuple(
            SliceState(
                **{
                    **s,
                    "ports": tuple(tuple(p) for p in s["ports"]),
                    "endpoints": tuple(
                        SliceEndpointState(
                            **{
                                **e,
                                "zone_hints": None
                                if e["zone_hints"] is None
                                else tuple(e["zone_hints"]),
                            }
                        )
                        for e in s["endpoints"]
                    ),
                }
            )
            for s in data.get("slices", ())
        )
        return cls(
            seed=data["seed"],
            block=data["block"],
            node=data["node"],
            pods=pods,
            services=services,
            service_cidrs=tuple(data["service_cidrs"]),
            slices=slices,
        )

    def describe(self) -> str:
        """One line per Service and per Pod, for a failure message."""
        lines = [f"seed {self.seed} (block {self.block}, node {self.node})"]
        lines += [f"  cidr {c}" for c in self.service_cidrs]
        for s in self.services:
            ports = ",".join(f"{p.port}/{p.protocol}->{p.target}" for p in s.ports)
            extras = {
                f.name: getattr(s, f.name)
                for f in fields(s)
                if f.name not in ("name", "type", "ports", "family_policy", "families")
                and getattr(s, f.name) != f.default
            }
            families = "/".join(s.families)
            lines.append(f"  svc {s.name} {s.type} {s.family_policy}:{families} {ports} {extras}")
        for p in self.pods:
            how = ("ready" if p.ready else "not-ready") + (" terminating" if p.terminating else "")
            lines.append(f"  pod {p.slot}@{p.node} {how} {sorted(p.labels)}")
        for es in self.slices:
            lines.append(f"  slice {es.name} of {es.service} {es.family} {es.ports} {es.labels}")
            lines += [f"    {e}" for e in es.endpoints]
        return "\n".join(lines)


def external_ip(block: int, i: int, family: str) -> str:
    return f"192.0.2.{16 * block + i}" if family == "IPv4" else f"2001:db8:e:{block:x}::{i:x}"


def lb_ip(block: int, i: int, family: str) -> str:
    return f"198.51.100.{16 * block + i}" if family == "IPv4" else f"2001:db8:b:{block:x}::{i:x}"


def service_cidrs(block: int) -> tuple[str, str]:
    # Canonical: the API server refuses a ServiceCIDR spelled otherwise (block 0's
    # "fd00:10:97:0::/112" stopped a bench run).
    return f"10.97.{block}.0/24", str(ipaddress.ip_network(f"fd00:10:97:{block:x}::/112"))


def cidr_ip(block: int, i: int, family: str) -> str:
    if family == "IPv4":
        return f"10.97.{block}.{i}"
    return str(ipaddress.ip_address(f"fd00:10:97:{block:x}::{i:x}"))


def generate(
    seed: int, nodes: Sequence[tuple[str, str]], slots: Sequence[Slot], node: str, block: int = 0
) -> State:
    """The state of ``seed``: Pods over ``slots``, Services over them, seen from ``node``."""
    assert 0 <= block < 16, "16 blocks of addresses"
    rng = random.Random(seed)
    n_services = rng.randint(2, 4)
    names = [f"svc-{i}" for i in range(n_services)]
    used = rng.sample(list(slots), rng.randint(2, min(7, len(slots))))
    pods = []
    for slot in used:
        # Every Service gets some Pods, some none; a Pod may back several.
        labels = {name: "y" for name in names if rng.random() < 0.45}
        kind = rng.choices(("ready", "not-ready", "serving", "stopping"), (6, 1, 1.5, 1))[0]
        pods.append(
            PodState(
                slot=slot.name,
                node=slot.node,
                labels=labels,
                ready=kind in ("ready", "serving"),
                terminating=kind in ("serving", "stopping"),
            )
        )
    cidrs = service_cidrs(block) if rng.random() < 0.2 else ()
    services = [_service(rng, name, block, i, bool(cidrs)) for i, name in enumerate(names)]
    return State(seed, block, node, tuple(pods), tuple(services), cidrs)


def _service(rng: random.Random, name: str, block: int, index: int, own_cidr: bool) -> ServiceState:
    kind = rng.choices(TYPES, (4, 3, 3))[0]
    policy, families = rng.choice(FAMILY_POLICIES)
    ports = _ports(rng)
    etp = rng.choice(("Cluster", "Local")) if kind != "ClusterIP" else None
    itp = rng.choices(("Cluster", "Local"), (3, 1))[0]
    affinity = rng.choice((10800, 600, 60)) if rng.random() < 0.2 else None
    # Each Service's addresses: 3 per family from the state's block.
    first = 1 + 3 * index
    external = tuple(
        external_ip(block, first + k, f)
        for k, f in enumerate(families)
        if rng.random() < (0.35 if kind == "ClusterIP" else 0.2)
    )
    lb: tuple[str, ...] = ()
    ranges: tuple[str, ...] = ()
    mode, allocate = "VIP", True
    if kind == "LoadBalancer":
        lb = tuple(lb_ip(block, first + k, f) for k, f in enumerate(families))
        mode = "Proxy" if rng.random() < 0.15 else "VIP"
        if rng.random() < 0.4:
            # Either family's ranges, whatever the Service's families (a family with
            # none of its own is one of the cases compared).
            ranges = tuple(rng.sample(SOURCE_RANGES, rng.randint(1, 3)))
        allocate = rng.random() < 0.85
    topology = rng.choice(TOPOLOGY) if rng.random() < 0.3 else None
    cluster_ips: tuple[str, ...] = ()
    if own_cidr and index == 0:
        cluster_ips = tuple(cidr_ip(block, 10, f) for f in families)
    return ServiceState(
        name=name,
        type=kind,
        family_policy=policy,
        families=families,
        ports=ports,
        # One in ten selects nothing: a Service without endpoints.
        selector={name: "y"} if rng.random() < 0.9 else {f"{name}-nobody": "y"},
        external_traffic_policy=etp,
        internal_traffic_policy=itp,
        affinity_timeout=affinity,
        external_ips=external,
        lb_ips=lb,
        lb_ip_mode=mode,
        source_ranges=ranges,
        allocate_lb_node_ports=allocate,
        publish_not_ready=rng.random() < 0.1,
        topology=topology,
        proxy_name="someone-else" if rng.random() < 0.05 else None,
        cluster_ips=cluster_ips,
    )


def _ports(rng: random.Random) -> tuple[PortState, ...]:
    out: list[PortState] = []
    for i in range(rng.choices((1, 2, 3), (5, 3, 1))[0]):
        protocol = rng.choices(("TCP", "UDP"), (3, 2))[0]
        port = rng.choice(SERVICE_PORTS)
        if any(p.port == port and p.protocol == protocol for p in out):
            continue
        target_port = rng.choice(TARGET_PORTS)
        target: int | str = target_port if rng.random() < 0.8 else f"p{target_port}"
        out.append(PortState(f"p{i}", protocol, port, target))
    # The DNS shape: the same port in both protocols.
    if out and rng.random() < 0.15:
        first = out[0]
        other = "UDP" if first.protocol == "TCP" else "TCP"
        if not any(p.port == first.port and p.protocol == other for p in out):
            # A port skipped above leaves a gap in the names: p0, p2 and not p2 again.
            taken = {p.name for p in out}
            name = next(f"p{k}" for k in range(len(out), 2 * len(out) + 2) if f"p{k}" not in taken)
            out.append(PortState(name, other, first.port, first.target))
    return tuple(out)


def features(state: State) -> set[str]:
    """What a state exercises, in words (CI's fixed seeds must cover :data:`FEATURES`)."""
    out = set()
    for svc in state.services:
        out |= {svc.type, f"{svc.family_policy}:{svc.families[0]}"}
        out |= {p.protocol for p in svc.ports}
        flags = {
            "etp-local": svc.external_traffic_policy == "Local",
            "itp-local": svc.internal_traffic_policy == "Local",
            "affinity": svc.affinity_timeout is not None,
            "external-ips": bool(svc.external_ips),
            "source-ranges": bool(svc.source_ranges),
            "ipmode-proxy": bool(svc.lb_ips) and svc.lb_ip_mode == "Proxy",
            "no-lb-nodeports": svc.type == "LoadBalancer" and not svc.allocate_lb_node_ports,
            "proxy-name": svc.proxy_name is not None,
            "publish-not-ready": svc.publish_not_ready,
            "own-cidr-ip": bool(svc.cluster_ips),
            "selects-nobody": any(k.endswith("-nobody") for k in svc.selector),
            "named-port": any(isinstance(p.target, str) for p in svc.ports),
        }
        out |= {name for name, on in flags.items() if on}
        if svc.topology:
            out.add(f"topology:{svc.topology}")
    for pod in state.pods:
        if pod.terminating:
            out.add("terminating-serving" if pod.ready else "terminating-not-serving")
        elif not pod.ready:
            out.add("not-ready")
    return out


FEATURES = frozenset(
    {*TYPES, "TCP", "UDP", "SingleStack:IPv4", "SingleStack:IPv6", "PreferDualStack:IPv4",
     "RequireDualStack:IPv4", "RequireDualStack:IPv6", "etp-local", "itp-local", "affinity",
     "external-ips", "source-ranges", "ipmode-proxy", "no-lb-nodeports", "proxy-name",
     "publish-not-ready", "own-cidr-ip", "selects-nobody", "named-port",
     *(f"topology:{t}" for t in TOPOLOGY), "terminating-serving", "terminating-not-serving",
     "not-ready"}
)  # fmt: skip


# --------------------------------------------------------------------------- objects


def pod_object(pod: PodState, namespace: str) -> Obj:
    """The Pod (its status is written separately, as a kubelet would)."""
    meta: Obj = {"name": pod.slot, "namespace": namespace, "labels": dict(pod.labels)}
    if pod.terminating:
        meta["finalizers"] = [HOLD]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": pod.node,
            "containers": [
                {
                    "name": "echo",
                    "image": "kubeproxy-lab/echo",
                    "ports": [{"containerPort": p, "name": f"p{p}"} for p in TARGET_PORTS],
                }
            ],
        },
    }


def service_object(svc: ServiceState, namespace: str) -> Obj:
    meta: Obj = {"name": svc.name, "namespace": namespace}
    if svc.proxy_name:
        meta["labels"] = {PROXY_NAME_LABEL: svc.proxy_name}
    if svc.topology == "annotation:Auto":
        meta["annotations"] = {TOPOLOGY_ANNOTATION: "Auto"}
    spec: Obj = {
        "type": svc.type,
        "ipFamilyPolicy": svc.family_policy,
        "ipFamilies": list(svc.families),
        "ports": [
            {"name": p.name, "protocol": p.protocol, "port": p.port, "targetPort": p.target}
            for p in svc.ports
        ],
        "internalTrafficPolicy": svc.internal_traffic_policy,
        "publishNotReadyAddresses": svc.publish_not_ready,
    }
    if svc.selector:  # none: a selector-less Service, its slices written by hand
        spec["selector"] = dict(svc.selector)
    if svc.cluster_ips:
        spec["clusterIP"] = svc.cluster_ips[0]
        spec["clusterIPs"] = list(svc.cluster_ips)
    if svc.node_ports and svc.type != "ClusterIP":
        for port, node_port in zip(spec["ports"], svc.node_ports, strict=True):
            port["nodePort"] = node_port
    if svc.external_traffic_policy:
        spec["externalTrafficPolicy"] = svc.external_traffic_policy
        if svc.health_node_port and svc.external_traffic_policy == "Local":
            spec["healthCheckNodePort"] = svc.health_node_port
    if svc.affinity_timeout is not None:
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": svc.affinity_timeout}}
    if svc.external_ips:
        spec["externalIPs"] = list(svc.external_ips)
    if svc.type == "LoadBalancer":
        spec["allocateLoadBalancerNodePorts"] = svc.allocate_lb_node_ports
        if svc.source_ranges:
            spec["loadBalancerSourceRanges"] = list(svc.source_ranges)
    if svc.topology and svc.topology != "annotation:Auto":
        spec["trafficDistribution"] = svc.topology
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def slice_object(es: SliceState, namespace: str, pods: dict[str, tuple[str, str, str]]) -> Obj:
    """A hand-written EndpointSlice; ``pods``: slot -> (node, IPv4, IPv6)."""
    endpoints = []
    for e in es.endpoints:
        node, ip4, ip6 = pods[e.slot]
        ep: Obj = {
            "addresses": [ip4 if es.family == "IPv4" else ip6],
            "nodeName": node,
            "conditions": {"ready": e.ready, "serving": e.serving, "terminating": e.terminating},
        }
        if e.zone is not None:
            ep["zone"] = e.zone
        if e.zone_hints is not None:
            ep["hints"] = {"forZones": [{"name": z} for z in e.zone_hints]}
        endpoints.append(ep)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": es.name,
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": es.service, **es.labels},
        },
        "addressType": es.family,
        "ports": [{"name": n, "protocol": p, "port": number} for n, p, number in es.ports],
        "endpoints": endpoints,
    }


def lb_status(svc: ServiceState) -> Obj:
    """The status a cloud controller would write: one ingress per load-balancer IP."""
    return {
        "status": {
            "loadBalancer": {"ingress": [{"ip": ip, "ipMode": svc.lb_ip_mode} for ip in svc.lb_ips]}
        }
    }


def service_cidr_object(state: State, name: str) -> Obj:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "spec": {"cidrs": list(state.service_cidrs)},
    }


def dumps(states: Sequence[State]) -> str:
    return json.dumps([s.to_json() for s in states], indent=1)
