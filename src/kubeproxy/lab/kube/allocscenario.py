"""The requests of the allocation parity check (see :mod:`.allocparity`), each chosen
against both sides' state and compared as it goes.

* The lone control plane's small ranges (:data:`SERVICE_CIDRS`, :data:`NODE_PORT_RANGE`)
  and what the requests use of them.
* :class:`IPBands` / :class:`PortBands` — a CIDR's or port range's static and dynamic
  bands (KEP-3070/3668), to compare random picks by the band they came from.
* :class:`Step` — one request and both answers, with their differences.
* :class:`Scenario` — requests from a seeded generator (an explicit address "free in the
  dynamic band" must be free on *both* sides, whose random picks differ): dynamic and
  explicit ClusterIPs in either band, taken ones, ones outside every range, edge
  addresses, dual-stack, headless Services, family mismatches, NodePorts of every kind,
  healthCheckNodePorts, LoadBalancers, deletions. :meth:`Scenario.tour` asks each kind
  once, :meth:`Scenario.random_step` one drawn at random; :meth:`Scenario.compare` says
  how two answers differ.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubeproxy.controlplane.ipallocator import Allocator, parse_cidr
from kubeproxy.controlplane.portallocator import (
    NodePortAllocator,
    parse_port_range,
)
from kubeproxy.lab.kube.allocsides import (
    OurSide,
    Outcome,
    RealSide,
    Side,
)
from kubeproxy.lab.kube.api import Obj

#: The lone control plane's ranges: small enough to fill in seconds, each with a static band.
SERVICE_CIDRS = ("10.100.0.0/27", "fd00:100::/123")
NODE_PORT_RANGE = "30000-30019"
OUTSIDE = {"IPv4": "10.200.0.5", "IPv6": "fd00:200::5"}
FAMILIES = ("IPv4", "IPv6")


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
        self.configured = [cidr_family(c) for c in service_cidrs]
        # A family the cluster lacks keeps the dual-stack range as a source of requests
        # (which both sides must then refuse).
        self.cidrs = {cidr_family(c): IPBands(c) for c in (*SERVICE_CIDRS, *service_cidrs)}
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


def cidr_family(cidr: str) -> str:
    return "IPv6" if ":" in cidr else "IPv4"


def _family_of_ip(ip: str) -> str:
    return "IPv6" if ":" in ip else "IPv4"
