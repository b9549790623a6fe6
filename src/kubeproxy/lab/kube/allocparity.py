"""ClusterIPs and NodePorts: kubeproxy's allocation against the real kube-apiserver's.

The same Services, in the same order, go to kube-apiserver (created through the API of a
control plane with small ranges, :func:`~kubeproxy.lab.kube.controlplane.lone_control_plane`)
and to kubeproxy's :class:`~kubeproxy.controlplane.standalone.StandaloneCluster` (what
``kubeproxy run --manifests`` allocates with), and their answers are compared step by step.
Dynamic addresses and ports are random on both sides, so for those the *properties* are
compared: the band (static or dynamic, KEP-3070/3668) each side took it from, that it lies
in a ready ServiceCIDR of the right family (or in the port range) and that no other live
Service holds it; everything else must be equal: accepted or refused and the reason's
category (:func:`reason_of`), families and policy, requested addresses and ports honoured,
nodePorts shared between ports of the same number, the count at which a range is full.

Map:

* :class:`Outcome` — what one create came to, on either side.
* :class:`RealSide` / :class:`OurSide` — the two allocators behind one small interface:
  create, delete, and the ServiceCIDR objects (ours get them as the API server shows them,
  status and deletion included).
* :class:`Scenario` — requests, each chosen against both sides' state (an explicit
  address "free in the dynamic band" must be free on *both* sides, whose random picks
  differ): dynamic and explicit ClusterIPs in either band, taken ones, ones outside every
  range, network/broadcast/all-ones addresses, dual-stack with one or two explicit
  addresses, headless Services, family mismatches, NodePorts (dynamic, explicit, taken,
  outside the range, shared by TCP and UDP), healthCheckNodePorts, LoadBalancers without
  nodePorts, deletions. :meth:`Scenario.tour` asks each kind once,
  :meth:`Scenario.random_step` one drawn from a seeded generator.
* :func:`run` — a scenario against a running control plane: the tour, random steps, each
  range filled until full, then a second ServiceCIDR around the first (its edges become
  ordinary addresses; both fill it) deleted while in use. Dual-stack, or single-stack
  (every IPv6 request must then be refused for the same reason).
* :func:`twin_service_cidrs_deleted` — a difference kept on purpose, shown: two
  ServiceCIDRs of one CIDR, both being deleted, still give addresses upstream.

Where upstream itself is nondeterministic (the order it tries ServiceCIDRs in, and which
family's error it reports when both fail) the scenario avoids asking or the comparison
accepts each possible answer; docs/controlplane.md lists what differs and why.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubeproxy.controlplane.ipallocator import Allocator, parse_cidr
from kubeproxy.controlplane.portallocator import (
    NodePortAllocator,
    parse_port_range,
)
from kubeproxy.controlplane.standalone import StandaloneCluster
from kubeproxy.lab.kube.api import Api, ApiError, Obj
from kubeproxy.lab.kube.cluster import wait_for
from kubeproxy.model.events import Event, RawObject
from kubeproxy.model.types import NamespacedName

#: The lone control plane's ranges: small enough to fill in seconds, each with a static band.
SERVICE_CIDRS = ("10.100.0.0/27", "fd00:100::/123")
NODE_PORT_RANGE = "30000-30019"
#: The ServiceCIDRs the last phase adds (each contains the flag's range of its family).
WIDER_CIDRS = ("10.100.0.0/26", "fd00:100::/122")
OUTSIDE = {"IPv4": "10.200.0.5", "IPv6": "fd00:200::5"}
#: The flags that give the lone control plane these ranges (besides the ClusterIP ones).
APISERVER_ARGS = {"kube-apiserver": ("--service-node-port-range", NODE_PORT_RANGE)}
FAMILIES = ("IPv4", "IPv6")


def reason_of(message: str) -> str:
    """The category of a refusal, from either side's words ("" for none)."""
    if not message:
        return ""
    text = message.lower()
    for words, category in (
        (("already allocated",), "allocated"),
        (("not in the valid range", "does not match the current range"), "not-in-range"),
        (("range is full",), "full"),
        (("not configured",), "family"),
    ):
        if any(w in text for w in words):
            return category
    return "invalid"


@dataclass(frozen=True)
class Outcome:
    """A create's result: the allocations when accepted, the reason when refused."""

    accepted: bool
    families: tuple[str, ...] = ()
    policy: str = ""
    cluster_ips: tuple[str, ...] = ()
    node_ports: tuple[int, ...] = ()
    health_check_node_port: int = 0
    message: str = ""

    @property
    def reason(self) -> str:
        return reason_of(self.message)

    @classmethod
    def of(cls, service: Mapping[str, Any]) -> Outcome:
        spec = service.get("spec") or {}
        return cls(
            True,
            tuple(spec.get("ipFamilies") or ()),
            str(spec.get("ipFamilyPolicy") or ""),
            tuple(spec.get("clusterIPs") or ()),
            tuple(int(p.get("nodePort") or 0) for p in spec.get("ports") or ()),
            int(spec.get("healthCheckNodePort") or 0),
        )

    def brief(self) -> str:
        if not self.accepted:
            return f"refused ({self.reason}: {self.message[-160:]})"
        hc = f" hc={self.health_check_node_port}" if self.health_check_node_port else ""
        return (
            f"{'/'.join(self.families)} {self.policy} {','.join(self.cluster_ips)} "
            f"nodePorts={list(self.node_ports)}{hc}"
        )


class Side(Protocol):
    """One allocator: kube-apiserver or kubeproxy's."""

    name: str
    held: dict[str, Outcome]

    def create(self, service: Obj) -> Outcome: ...

    def delete(self, name: str) -> None: ...

    def sync_service_cidrs(self, objects: Sequence[Obj]) -> None: ...


@dataclass
class RealSide:
    """Services created through the API of a real kube-apiserver, in ``namespace``."""

    api: Api
    namespace: str
    name: str = "kube-apiserver"
    held: dict[str, Outcome] = field(default_factory=dict)

    def create(self, service: Obj) -> Outcome:
        body = {**service, "metadata": {**service["metadata"], "namespace": self.namespace}}
        try:
            outcome = Outcome.of(self.api.create(body))
        except ApiError as err:
            return Outcome(False, message=str(err))
        self.held[service["metadata"]["name"]] = outcome
        return outcome

    def delete(self, name: str) -> None:
        self.api.delete("Service", name, self.namespace)
        self.held.pop(name, None)

    def sync_service_cidrs(self, objects: Sequence[Obj]) -> None:
        pass  # the API server watches them itself


class OurSide:
    """The same requests to a :class:`StandaloneCluster`, as manifest events."""

    name = "kubeproxy"

    def __init__(self, service_cidrs: Sequence[str], node_port_range: str, seed: int) -> None:
        self.cluster = StandaloneCluster(
            service_cidrs=service_cidrs,
            node_port_range=node_port_range,
            rng=random.Random(seed),
        )
        self.namespace = "parity"
        self.held: dict[str, Outcome] = {}
        self._given: dict[NamespacedName, RawObject] = {}
        # A Pod makes the directory a cluster to complete (and to check) from the start.
        self._apply(
            RawObject(
                "Pod",
                NamespacedName(self.namespace, "backend"),
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "backend", "namespace": self.namespace},
                    "spec": {"containers": [{"name": "c"}]},
                },
            )
        )

    def _apply(self, new: RawObject | None, old: RawObject | None = None) -> None:
        if new is not None:
            event = Event.added(new) if old is None else Event.modified(old, new)
        else:
            assert old is not None
            event = Event.deleted(old)
        self.cluster.apply([event])

    def adopt(self, service: Mapping[str, Any]) -> None:
        """A Service the API server made itself (``default/kubernetes``), as it is there."""
        meta = service["metadata"]
        key = NamespacedName(meta["namespace"], meta["name"])
        spec = {k: v for k, v in service["spec"].items() if k != "clusterIPs"}
        doc = {"apiVersion": "v1", "kind": "Service", "metadata": dict(meta), "spec": spec}
        self._given[key] = RawObject("Service", key, doc)
        self._apply(self._given[key])
        error = self.cluster.errors().get(str(key))
        if error is not None:
            raise RuntimeError(f"kubeproxy refuses {key}: {error}")
        self.held[meta["name"]] = Outcome.of(doc)

    def create(self, service: Obj) -> Outcome:
        name = service["metadata"]["name"]
        key = NamespacedName(self.namespace, name)
        doc = {**service, "metadata": {**service["metadata"], "namespace": self.namespace}}
        raw = RawObject("Service", key, doc)
        self._apply(raw)
        error = self.cluster.errors().get(str(key))
        if error is not None:
            # The API server refuses the write; a manifest stays, retried with every batch:
            # take it away so both sides hold the same Services.
            self._apply(None, raw)
            return Outcome(False, message=error)
        self._given[key] = raw
        completed = next(
            o
            for o in self.cluster.objects()
            if o.get("kind") == "Service"
            and o["metadata"]["name"] == name
            and o["metadata"].get("namespace") == self.namespace
        )
        outcome = Outcome.of(completed)
        self.held[name] = outcome
        return outcome

    def delete(self, name: str) -> None:
        key = NamespacedName(self.namespace, name)
        raw = self._given.pop(key, None)
        if raw is not None:
            self._apply(None, raw)
        self.held.pop(name, None)

    def sync_service_cidrs(self, objects: Sequence[Obj]) -> None:
        wanted = {NamespacedName("", o["metadata"]["name"]): o for o in objects}
        for key in [k for k in self._given if k.namespace == "" and k not in wanted]:
            self._apply(None, self._given.pop(key))
        for key, obj in wanted.items():
            raw = RawObject("ServiceCIDR", key, obj)
            old = self._given.get(key)
            if old != raw:
                self._given[key] = raw
                self._apply(raw, old)


# ------------------------------------------------------------------------------ bands


@dataclass(frozen=True)
class IPBands:
    """One CIDR's static and dynamic bands, as addresses."""

    cidr: str

    def _allocator(self) -> Allocator:
        return Allocator(self.cidr)

    def addresses(self, band: str) -> list[str]:
        a = self._allocator()
        edges = a.static_band() if band == "static" else a.dynamic_band()
        if edges is None:
            return []
        first, last = (ipaddress.ip_address(e) for e in edges)
        return [str(first + i) for i in range(int(last) - int(first) + 1)]

    def band(self, ip: str) -> str:
        """ "static", "dynamic", or "outside" (not an allocatable address of the CIDR)."""
        for name in ("static", "dynamic"):
            if ip in self.addresses(name):
                return name
        return "outside"


@dataclass(frozen=True)
class PortBands:
    port_range: str

    def ports(self, band: str) -> list[int]:
        allocator = NodePortAllocator(self.port_range)
        edges = allocator.static_band()
        pr = parse_port_range(self.port_range)
        first_dynamic = edges[1] + 1 if edges else pr.base
        if band == "static":
            return list(range(pr.base, first_dynamic))
        return list(range(first_dynamic, pr.last + 1))

    def band(self, port: int) -> str:
        for name in ("static", "dynamic"):
            if port in self.ports(name):
                return name
        return "outside"


# ---------------------------------------------------------------------------- scenario


def service(name: str, *, ports: list[Obj] | None = None, **spec: Any) -> Obj:
    """A Service as a user writes it (no selector unless given: no EndpointSlices)."""
    body: Obj = {"ports": ports or [{"name": "http", "port": 80, "targetPort": 8080}], **spec}
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": body}


@dataclass
class Step:
    what: str
    request: Obj
    real: Outcome
    ours: Outcome
    differences: list[str]
    #: The real side's allocation as compared (see Scenario.shape); () when refused.
    real_shape: tuple[Any, ...] = ()

    def bands(self) -> set[str]:
        """The bands kube-apiserver took this request's random values from."""
        flat: list[Any] = []
        for part in self.real_shape:
            flat += list(part) if isinstance(part, tuple) else [part]
        return {str(p).split(" ")[0] for p in flat if str(p).startswith(("static", "dynamic"))}

    def line(self) -> str:
        mark = "DIFF " if self.differences else ""
        text = f"{mark}{self.request['metadata']['name']} {self.what}: "
        text += f"real {self.real.brief()} | ours {self.ours.brief()}"
        return text + "".join(f"\n    - {d}" for d in self.differences)


class Scenario:
    """Requests chosen from a seeded generator against both sides, compared as they go."""

    def __init__(
        self,
        seed: int,
        real: RealSide,
        ours: OurSide,
        *,
        service_cidrs: Sequence[str] = SERVICE_CIDRS,
        node_port_range: str = NODE_PORT_RANGE,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.real, self.ours = real, ours
        self.sides: tuple[Side, Side] = (real, ours)
        self.configured = [_family(c) for c in service_cidrs]
        # A family the cluster lacks keeps the dual-stack range as a source of requests
        # (which both sides must then refuse).
        self.cidrs = {_family(c): IPBands(c) for c in (*SERVICE_CIDRS, *service_cidrs)}
        self.extra_cidrs: dict[str, list[str]] = {f: [] for f in FAMILIES}
        self.ports = PortBands(node_port_range)
        self.steps: list[Step] = []
        self._names = 0
        self.multi_cidr = False

    # ------------------------------------------------------------------ bookkeeping

    def _name(self) -> str:
        self._names += 1
        return f"s{self.seed}-{self._names}"

    @property
    def differences(self) -> list[str]:
        return [
            f"{s.request['metadata']['name']} {s.what}: {d}"
            for s in self.steps
            for d in s.differences
        ]

    def held_ips(self, side: Side) -> set[str]:
        return {ip for o in side.held.values() for ip in o.cluster_ips if ip != "None"}

    def held_ports(self, side: Side) -> set[int]:
        return {
            p for o in side.held.values() for p in (*o.node_ports, o.health_check_node_port) if p
        }

    def free_ips(self, family: str, band: str) -> list[str]:
        taken = self.held_ips(self.real) | self.held_ips(self.ours)
        return [ip for ip in self.cidrs[family].addresses(band) if ip not in taken]

    def free_ports(self, band: str) -> list[int]:
        taken = self.held_ports(self.real) | self.held_ports(self.ours)
        return [p for p in self.ports.ports(band) if p not in taken]

    def held_by_both_ips(self) -> list[str]:
        return sorted(self.held_ips(self.real) & self.held_ips(self.ours))

    def held_by_both_ports(self) -> list[int]:
        return sorted(self.held_ports(self.real) & self.held_ports(self.ours))

    # ------------------------------------------------------------------- one request

    def ask(self, what: str, request: Obj) -> Step:
        """Create ``request`` on both sides and compare; a Service only one side accepted
        is deleted there, so both hold the same Services afterwards."""
        before = {side.name: (self.held_ips(side), self.held_ports(side)) for side in self.sides}
        real = self.real.create(request)
        ours = self.ours.create(request)
        differences = self.compare(request, real, ours, before)
        name = request["metadata"]["name"]
        if real.accepted != ours.accepted:
            for side in self.sides:
                if name in side.held:
                    side.delete(name)
        shape = self.shape(request, real, *before[self.real.name]) if real.accepted else ()
        step = Step(what, request, real, ours, differences, shape)
        self.steps.append(step)
        return step

    def compare(
        self,
        request: Obj,
        real: Outcome,
        ours: Outcome,
        before: Mapping[str, tuple[set[str], set[int]]],
    ) -> list[str]:
        out: list[str] = []
        if real.accepted != ours.accepted:
            return [f"real {real.brief()}, ours {ours.brief()}"]
        if not real.accepted:
            if real.reason != ours.reason:
                out.append(f"refused for different reasons: real {real.reason}, ours {ours.reason}")
            return out
        for attr in ("families", "policy"):
            if getattr(real, attr) != getattr(ours, attr):
                out.append(f"{attr}: real {getattr(real, attr)}, ours {getattr(ours, attr)}")
        if out:
            return out
        shapes = {}
        for side, outcome in ((self.real, real), (self.ours, ours)):
            ips, ports = before[side.name]
            shapes[side.name] = self.shape(request, outcome, ips, ports)
        if shapes[self.real.name] != shapes[self.ours.name]:
            out.append(
                f"allocations differ: real {shapes[self.real.name]}, ours {shapes[self.ours.name]}"
            )
        return out

    def shape(
        self, request: Obj, outcome: Outcome, held_ips: set[str], held_ports: set[int]
    ) -> tuple[Any, ...]:
        """What must be equal on both sides: requested values as they are, random ones as
        their band, and any rule broken (a value held already, outside every range, the
        static band used while the dynamic one had room)."""
        spec = request["spec"]
        requested = list(
            spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
        )
        ips: list[Any] = []
        for i, ip in enumerate(outcome.cluster_ips):
            if ip == "None" or (i < len(requested) and requested[i] == ip):
                ips.append(ip)
                continue
            family = outcome.families[i] if i < len(outcome.families) else ""
            ips.append(self._dynamic_ip(ip, family, held_ips))
        numbers = [int(p.get("port") or 0) for p in spec.get("ports") or ()]
        # Ports with one number share one nodePort: the first one any of them asked for.
        wanted: dict[int, int] = {}
        for number, service_port in zip(numbers, spec.get("ports") or (), strict=True):
            if service_port.get("nodePort"):
                wanted.setdefault(number, int(service_port["nodePort"]))
        ports: list[Any] = []
        for i, port in enumerate(outcome.node_ports):
            first = numbers.index(numbers[i])
            if not port:
                ports.append(0)
            elif wanted.get(numbers[i]) == port:
                ports.append(port)
            elif first != i and outcome.node_ports[first] == port:
                ports.append(f"same as [{first}]")
            else:
                ports.append(self._dynamic_port(port, held_ports))
                held_ports = held_ports | {port}
        hc: Any = outcome.health_check_node_port
        if hc and hc != int(spec.get("healthCheckNodePort") or 0):
            hc = self._dynamic_port(hc, held_ports)
        return (tuple(ips), tuple(ports), hc)

    def _dynamic_ip(self, ip: str, family: str, held: set[str]) -> str:
        problems = []
        if ip in held:
            problems.append("held already")
        if _family_of_ip(ip) != family:
            problems.append("wrong family")
        bands = self.cidrs[family]
        band = bands.band(ip)
        if self.multi_cidr:
            inside = band != "outside" or any(
                ipaddress.ip_address(ip) in parse_cidr(c) for c in self.extra_cidrs[family]
            )
            return (
                "dynamic" + (f" ({', '.join(problems)})" if problems else "")
                if inside
                else "outside"
            )
        if band == "static" and any(a not in held for a in bands.addresses("dynamic")):
            problems.append("static band while the dynamic one had room")
        return band + (f" ({', '.join(problems)})" if problems else "")

    def _dynamic_port(self, port: int, held: set[int]) -> str:
        problems = []
        if port in held:
            problems.append("held already")
        band = self.ports.band(port)
        if band == "static" and any(p not in held for p in self.ports.ports("dynamic")):
            problems.append("static band while the dynamic one had room")
        return band + (f" ({', '.join(problems)})" if problems else "")

    def delete(self, name: str) -> None:
        for side in self.sides:
            side.delete(name)

    # -------------------------------------------------------------------- generators

    def tour(self) -> None:
        """Every kind of request once, in a fixed order."""
        for kind, _ in self._kinds():
            kind()

    def random_step(self) -> Step | None:
        kinds = self._kinds()
        choose = self.rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        return choose()

    def _kinds(self) -> list[tuple[Callable[[], Step | None], int]]:
        """Each kind of request with its weight in :meth:`random_step`."""
        return [
            (self.dynamic, 6),
            (lambda: self.explicit("static"), 2),
            (lambda: self.explicit("dynamic"), 2),
            (self.explicit_taken, 1),
            (self.explicit_outside, 1),
            (self.explicit_edge, 1),
            (self.dual_with_explicit, 1),
            (self.headless, 1),
            (self.family_mismatch, 1),
            (self.node_port, 3),
            (lambda: self.node_port_explicit(self.rng.choice(["static", "dynamic"])), 2),
            (self.node_port_taken, 1),
            (self.node_port_outside, 1),
            (self.node_port_shared, 1),
            (self.load_balancer_local, 1),
            (self.load_balancer_without_node_ports, 1),
            (self.delete_one, 3),
        ]

    def families_spec(self) -> tuple[str, Obj]:
        options: list[tuple[str, Obj]] = [
            ("default", {}),
            ("IPv6", {"ipFamilies": ["IPv6"]}),
            ("PreferDualStack", {"ipFamilyPolicy": "PreferDualStack"}),
            ("RequireDualStack", {"ipFamilyPolicy": "RequireDualStack"}),
            (
                "RequireDualStack IPv6 first",
                {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]},
            ),
            (
                "SingleStack with two families",
                {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4", "IPv6"]},
            ),
        ]
        return self.rng.choice(options)

    def dynamic(self) -> Step:
        what, spec = self.families_spec()
        return self.ask(f"dynamic {what}", service(self._name(), **spec))

    def explicit(self, band: str) -> Step | None:
        family = self.rng.choice(FAMILIES)
        free = self.free_ips(family, band)
        if not free:
            return None
        ip = self.rng.choice(free)
        return self.ask(f"explicit {family} {band} band", service(self._name(), clusterIP=ip))

    def explicit_taken(self) -> Step | None:
        held = self.held_by_both_ips()
        if not held:
            return None
        return self.ask(
            "explicit, held already", service(self._name(), clusterIP=self.rng.choice(held))
        )

    def explicit_outside(self) -> Step:
        family = self.rng.choice(FAMILIES)
        return self.ask(
            f"explicit {family} outside every range",
            service(self._name(), clusterIP=OUTSIDE[family]),
        )

    def explicit_edge(self) -> Step:
        family = self.rng.choice(FAMILIES)
        net = parse_cidr(self.cidrs[family].cidr)
        which = self.rng.choice(["network", "last"])
        ip = str(net.network_address if which == "network" else net.broadcast_address)
        taken = self.held_ips(self.real) | self.held_ips(self.ours)
        if ip in taken:
            which = "network"
            ip = str(net.network_address)
        return self.ask(f"explicit {family} {which} address", service(self._name(), clusterIP=ip))

    def dual_with_explicit(self) -> Step | None:
        first = self.rng.choice(FAMILIES)
        second = "IPv6" if first == "IPv4" else "IPv4"
        free = self.free_ips(first, self.rng.choice(["static", "dynamic"]))
        if not free:
            return None
        ip = self.rng.choice(free)
        spec: Obj = {"ipFamilyPolicy": "RequireDualStack", "clusterIP": ip}
        what = f"RequireDualStack, {first} explicit"
        other = self.free_ips(second, "static")
        if self.rng.random() < 0.5 and other:
            spec["clusterIPs"] = [ip, self.rng.choice(other)]
            what += f", {second} explicit"
        return self.ask(what, service(self._name(), **spec))

    def headless(self) -> Step:
        spec: Obj = {"clusterIP": "None"}
        what = "headless"
        if self.rng.random() < 0.5:
            spec["selector"] = {"app": "x"}
            what += " with a selector"
        if self.rng.random() < 0.3:
            spec["ipFamilyPolicy"] = self.rng.choice(["PreferDualStack", "SingleStack"])
            what += f" {spec['ipFamilyPolicy']}"
        return self.ask(what, service(self._name(), **spec))

    def family_mismatch(self) -> Step | None:
        free = self.free_ips("IPv4", "static")
        if not free:
            return None
        return self.ask(
            "IPv4 clusterIP with ipFamilies IPv6",
            service(self._name(), clusterIP=free[0], ipFamilies=["IPv6"]),
        )

    def _node_port_service(self, ports: list[Obj], **spec: Any) -> Obj:
        family = self.rng.choice([{}, {"ipFamilies": ["IPv6"]}])
        return service(self._name(), ports=ports, **{"type": "NodePort", **family, **spec})

    def node_port(self) -> Step:
        count = self.rng.choice([1, 1, 2])
        ports = [{"name": f"p{i}", "port": 80 + i, "targetPort": 8080} for i in range(count)]
        return self.ask(f"NodePort, {count} port(s)", self._node_port_service(ports))

    def node_port_explicit(self, band: str) -> Step | None:
        free = self.free_ports(band)
        if not free:
            return None
        ports = [{"name": "http", "port": 80, "nodePort": self.rng.choice(free)}]
        return self.ask(f"NodePort explicit, {band} band", self._node_port_service(ports))

    def node_port_taken(self) -> Step | None:
        held = self.held_by_both_ports()
        if not held:
            return None
        ports = [{"name": "http", "port": 80, "nodePort": self.rng.choice(held)}]
        return self.ask("NodePort explicit, held already", self._node_port_service(ports))

    def node_port_outside(self) -> Step:
        pr = parse_port_range(self.ports.port_range)
        port = self.rng.choice([pr.base - 1, pr.last + 1, 31500])
        ports = [{"name": "http", "port": 80, "nodePort": port}]
        return self.ask("NodePort outside the range", self._node_port_service(ports))

    def node_port_shared(self) -> Step:
        ports: list[Obj] = [
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            {"name": "dns-udp", "port": 53, "protocol": "UDP"},
        ]
        free = self.free_ports("static")
        what = "NodePort, TCP and UDP 53"
        if free and self.rng.random() < 0.5:
            ports[1]["nodePort"] = free[0]
            what += ", UDP's nodePort given"
        return self.ask(what, self._node_port_service(ports))

    def load_balancer_local(self) -> Step:
        spec: Obj = {"type": "LoadBalancer", "externalTrafficPolicy": "Local"}
        what = "LoadBalancer, externalTrafficPolicy Local"
        choice = self.rng.choice(["dynamic", "free", "held", "outside"])
        held, free = self.held_by_both_ports(), self.free_ports("static")
        if choice == "free" and free:
            spec["healthCheckNodePort"] = free[-1]
        elif choice == "held" and held:
            spec["healthCheckNodePort"] = held[0]
        elif choice == "outside":
            spec["healthCheckNodePort"] = 31999
        if "healthCheckNodePort" in spec:
            what += f", healthCheckNodePort {choice}"
        return self.ask(what, service(self._name(), **spec))

    def load_balancer_without_node_ports(self) -> Step:
        ports: list[Obj] = [{"name": "a", "port": 80}, {"name": "b", "port": 81}]
        free = self.free_ports("dynamic")
        if free:
            ports[1]["nodePort"] = free[0]
        spec = {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": False}
        return self.ask(
            "LoadBalancer without nodePorts", service(self._name(), ports=ports, **spec)
        )

    def delete_one(self) -> None:
        names = sorted(n for n in set(self.real.held) & set(self.ours.held) if self._mine(n))
        if names:
            self.delete(self.rng.choice(names))

    def fill(self, what: str, make: Callable[[str], Obj], limit: int = 200) -> Step:
        """Create ``make(name)`` until a side refuses; the last step (both must refuse
        with "full" at the same request)."""
        for _ in range(limit):
            step = self.ask(what, make(self._name()))
            if not (step.real.accepted and step.ours.accepted):
                return step
        raise RuntimeError(f"{what}: not full after {limit} Services")

    def clear(self) -> None:
        for name in sorted(set(self.real.held) | set(self.ours.held)):
            if self._mine(name):
                self.delete(name)

    def _mine(self, name: str) -> bool:
        return name.startswith(f"s{self.seed}-")


def _family(cidr: str) -> str:
    return "IPv6" if ":" in cidr else "IPv4"


def _family_of_ip(ip: str) -> str:
    return "IPv6" if ":" in ip else "IPv4"


# ------------------------------------------------------------------------------- run


def service_cidr_objects(api: Api) -> list[Obj]:
    return [
        {k: v for k, v in o.items() if k in ("apiVersion", "kind", "metadata", "spec", "status")}
        for o in api.list_of("ServiceCIDR")
    ]


def run(
    api: Api,
    seed: int,
    *,
    steps: int = 60,
    namespace: str | None = None,
    service_cidrs: Sequence[str] = SERVICE_CIDRS,
    settle: bool = True,
) -> Scenario:
    """One scenario against the control plane behind ``api``, started with
    ``service_cidrs`` (:data:`SERVICE_CIDRS`, or its IPv4 range alone for a single-stack
    cluster) and :data:`APISERVER_ARGS`; everything it creates is deleted, and (``settle``)
    gone before it returns, as the next scenario needs."""
    namespace = namespace or f"alloc-{seed}"
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    real = RealSide(api, namespace)
    ours = OurSide(service_cidrs, NODE_PORT_RANGE, seed)
    kubernetes = api.get("Service", "kubernetes", "default")
    # The API server's own Service holds the first address of the primary range.
    real.held["kubernetes"] = Outcome.of(kubernetes)
    ours.adopt(kubernetes)
    ours.sync_service_cidrs(service_cidr_objects(api))
    scenario = Scenario(seed, real, ours, service_cidrs=service_cidrs)
    np_families = [scenario.configured[-1]]
    try:
        scenario.tour()
        for _ in range(steps):
            scenario.random_step()
        # Each range until full: IPv4, IPv6, then the nodePorts (on the last family's
        # addresses, free again).
        scenario.fill("fill IPv4", service)
        scenario.fill("fill IPv6", lambda n: service(n, ipFamilies=["IPv6"]))
        scenario.clear()
        scenario.fill(
            "fill nodePorts", lambda n: service(n, type="NodePort", ipFamilies=np_families)
        )
        scenario.clear()
        wider_cidrs(scenario, api)
    finally:
        scenario.clear()
        for name in [n for n in real.held if n != "kubernetes"]:
            real.delete(name)
        cleanup_service_cidrs(api, wait=settle)
        api.delete("Namespace", namespace)
    return scenario


def wider_cidrs(scenario: Scenario, api: Api) -> None:
    """A second ServiceCIDR containing the first: addresses that were its network or
    broadcast address are hosts now; both fill it; then it is deleted while in use."""
    api.create(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": {"name": "wider"},
            "spec": {"cidrs": [c for c in WIDER_CIDRS if _family(c) in scenario.configured]},
        }
    )
    probe_ip = str(parse_cidr(WIDER_CIDRS[0]).network_address + 40)
    _wait_allocatable(api, scenario.real.namespace, probe_ip, True)
    scenario.ours.sync_service_cidrs(service_cidr_objects(api))
    scenario.multi_cidr = True
    for cidr in WIDER_CIDRS:
        scenario.extra_cidrs[_family(cidr)].append(cidr)
    v4 = parse_cidr(SERVICE_CIDRS[0])
    scenario.ask(
        "explicit: the first range's broadcast address",
        service(scenario._name(), clusterIP=str(v4.broadcast_address)),
    )
    scenario.ask(
        "explicit: only in the wider range",
        service(scenario._name(), clusterIP=str(v4.broadcast_address + 2)),
    )
    scenario.fill("fill IPv4 over both ranges", service)
    # Deleted while in use: it stays (a finalizer) until its addresses are released, and
    # takes no new ones meanwhile.
    api.delete("ServiceCIDR", "wider")
    _wait_allocatable(api, scenario.real.namespace, str(v4.broadcast_address + 20), False)
    scenario.ours.sync_service_cidrs(service_cidr_objects(api))
    scenario.clear()
    scenario.ours.sync_service_cidrs(service_cidr_objects(api))
    scenario.multi_cidr = False
    scenario.ask(
        "explicit: only in the deleted range",
        service(scenario._name(), clusterIP=str(v4.broadcast_address + 3)),
    )


def _wait_allocatable(api: Api, namespace: str, ip: str, want: bool) -> None:
    """Until the API server's allocator does (or no longer does) take ``ip`` (it learns of
    ServiceCIDR changes from a watch); a probe Service that got it is deleted at once."""

    def probe() -> bool:
        name = "probe"
        try:
            api.create(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"clusterIP": ip, "ports": [{"port": 80}]},
                }
            )
        except ApiError:
            return not want
        api.delete("Service", name, namespace)
        return want

    wait_for(probe, timeout=30, what=f"the API server {'taking' if want else 'refusing'} {ip}")


def cleanup_service_cidrs(api: Api, *, wait: bool = True) -> None:
    """Every ServiceCIDR but the API server's own deleted, and (``wait``) gone:
    kube-controller-manager lifts the finalizer of one being deleted some seconds after
    no Service holds its addresses any more."""

    def others() -> list[str]:
        return [
            n for o in api.list_of("ServiceCIDR") if (n := o["metadata"]["name"]) != "kubernetes"
        ]

    for name in others():
        api.delete("ServiceCIDR", name)
    if wait:
        wait_for(lambda: not others(), timeout=60, what="the added ServiceCIDRs gone")


def summarize(scenarios: Iterable[Scenario]) -> str:
    lines = []
    for s in scenarios:
        lines.append(f"seed {s.seed}: {len(s.steps)} requests, {len(s.differences)} differences")
        lines += [f"  {d}" for d in s.differences]
    return "\n".join(lines)


# A difference kept on purpose: two ServiceCIDRs of one CIDR, both being deleted.
TWIN_CIDR = "10.100.1.0/28"
SENTINEL_CIDR = "10.100.2.0/28"


def twin_service_cidrs_deleted(
    api: Api, service_cidrs: Sequence[str] = SERVICE_CIDRS, namespace: str = "twins"
) -> tuple[Outcome, Outcome]:
    """Two ServiceCIDRs naming one CIDR, both deleted while one of its addresses is in
    use; then a request for another address of it: kube-apiserver's answer and ours.

    Upstream's allocator for a CIDR turns not-ready only when the ServiceCIDR being
    deleted is the one ServiceCIDR it knows by name, and forgets a name only when its
    object is gone: with two, the CIDR keeps taking new addresses while both are being
    deleted. Ours stops, as for one (docs/controlplane.md says why).
    """
    twin, sentinel = parse_cidr(TWIN_CIDR), parse_cidr(SENTINEL_CIDR)
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    real = RealSide(api, namespace)
    try:
        for name, cidr in (
            ("twin-a", TWIN_CIDR),
            ("twin-b", TWIN_CIDR),
            ("sentinel", SENTINEL_CIDR),
        ):
            api.create(
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "ServiceCIDR",
                    "metadata": {"name": name},
                    "spec": {"cidrs": [cidr]},
                }
            )
        for net in (twin, sentinel):
            _wait_allocatable(api, namespace, str(net.network_address + 5), True)
            # Held: the ServiceCIDRs cannot finish deleting.
            real.create(
                service(f"holder-{net.network_address}", clusterIP=str(net.network_address + 2))
            )
        for name in ("twin-a", "twin-b", "sentinel"):
            api.delete("ServiceCIDR", name)
        # The API server learns of ServiceCIDRs from one watch, in order: once it refuses
        # the sentinel's addresses it has seen both twins being deleted too.
        _wait_allocatable(api, namespace, str(sentinel.network_address + 6), False)
        request = service("after", clusterIP=str(twin.network_address + 7))
        ours = OurSide(service_cidrs, NODE_PORT_RANGE, 0)
        ours.sync_service_cidrs(service_cidr_objects(api))
        return real.create(request), ours.create(request)
    finally:
        for name in list(real.held):
            real.delete(name)
        cleanup_service_cidrs(api, wait=False)
        api.delete("Namespace", namespace)
