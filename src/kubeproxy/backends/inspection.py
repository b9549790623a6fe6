"""What ``explain`` and ``list`` need to know of a proxy mode, as each mode states it.

Each mode's package holds its own knowledge in an ``inspect`` module (nftables,
iptables, ipvs, kernelspace) implementing :class:`Inspector`; the registry
(:func:`kubeproxy.backends.registry.inspector`; kernelspace's, which needs the node's HNS
network, :func:`~kubeproxy.backends.registry.node_inspector`) finds it. explain's engine
(:mod:`kubeproxy.explain.packet`) is mode-free: where the modes' rules treat a packet
differently (upstream's differences, not ours), it reads the mode's
:class:`PacketRules`; what implements an answer in the kernel, and what the kernel
holds now, it asks the mode's :class:`Inspector`:

* :meth:`Inspector.kernel_objects` -- the chains, elements, rules or virtual servers a
  packet's answer goes through (:class:`KernelObject`), from the mode's own render;
* :meth:`Inspector.drift` -- those objects against the kernel (``--live``);
* :meth:`Inspector.kernel_only` -- what the kernel holds that no ServicePort explains.

The kernel is read through one :class:`LiveKernel` per command: each read-only command
runs at most once, so ``list --live`` costs the same few reads whatever the number of
Services.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from kubeproxy.dataplane.process import ToolError, run_tool
from kubeproxy.model.fate import Explanation, Origin
from kubeproxy.model.plan import FamilyPlan, Frontend, ServicePortPlan
from kubeproxy.model.types import Endpoint, ServicePortName

T = TypeVar("T")


@dataclass(frozen=True, slots=True, order=True)
class KernelObject:
    """A chain, a set/map element, a rule, or an IPVS object.

    ``kind``: ``chain`` (``name`` is the chain), ``element`` (``name`` is the set or
    map, ``key`` and ``value`` the element), ``rule`` (``name`` is the chain, ``key`` the
    rule's arguments), ``virtual-server`` / ``real-server`` / ``address`` (ipvs mode),
    ``load-balancer`` / ``endpoint`` (kernelspace mode: ``name`` the frontend, ``key``
    its settings, ``value`` its endpoint IPs; an endpoint's IP, and what it is).
    ``table`` is ``ip kube-proxy``, ``nat``, ``filter``, ``ipvs``, ``ipset``, ``hns``...
    """

    kind: str
    table: str
    name: str
    key: str = ""
    value: str | None = None

    def __str__(self) -> str:
        if self.kind == "virtual-server":
            return f"ipvs: virtual server {self.name} {self.key}"
        if self.kind == "real-server":
            return f"ipvs: {self.name} -> {self.key} {self.value}"
        if self.kind == "load-balancer":
            return f"hns: load balancer {self.name} {self.key} -> {self.value}"
        if self.kind == "endpoint":
            return f"hns: endpoint {self.name} ({self.key})"
        if self.kind == "address":
            return f"{self.table}: address {self.name}"
        if self.kind == "chain":
            return f"{self.table}: chain {self.name}"
        if self.kind == "rule":
            return f"{self.table}: -A {self.name} {self.key}"
        value = f" : {self.value}" if self.value is not None else ""
        return f"{self.table}: {self.name} element {{ {self.key}{value} }}"


@dataclass(frozen=True, slots=True)
class VirtualServerNames:
    """ipvs mode: the objects its answers name (a packet meets a virtual server, and its
    masquerading follows ipsets, not a rule per ServicePort)."""

    cluster_ip_set: str
    external_ip_sets: tuple[str, str]  # Cluster policy, Local policy
    load_balancer_sets: tuple[str, str]
    node_port_sets: tuple[str, str]  # as patterns: one set per protocol
    source_ranges_firewall: str
    loop_back_set: str
    dummy_device: str
    filter_chain: str


@dataclass(frozen=True, slots=True)
class HnsLoadBalancer:
    """kernelspace mode: the HNS load balancer a frontend is, as the mode translates it."""

    name: str  # "ClusterIP 10.96.0.10:80/TCP", "NodePort (node ports):30080/TCP"
    endpoint_ips: tuple[str, ...]
    internal_port: int  # one per load balancer (HNS): the first endpoint's
    dsr: bool
    source_vip: str
    source_ip_distribution: bool  # DistributionType SourceIP (sessionAffinity ClientIP)


@dataclass(frozen=True, slots=True)
class LoadBalancerRules:
    """kernelspace mode: a packet meets an HNS load balancer, or nothing (upstream makes
    none for a frontend without endpoints). ``find``: the one of a frontend in a family
    (None: none is made), from the mode's own translation; ``network``: what the reasons
    call the node's HNS network."""

    find: Callable[[ServicePortPlan, Frontend, FamilyPlan], HnsLoadBalancer | None]
    network: str


@dataclass(frozen=True, slots=True)
class PacketRules:
    """How a mode's rules treat packets where the modes differ, and the names explain
    quotes for it. Every difference here is upstream's: each field says which."""

    mode: str
    # A load balancer's loadBalancerSourceRanges are enforced even while the Service has
    # no endpoint (nftables: its firewall set is not tied to the endpoints).
    firewall_without_endpoints: bool = False
    # A connection DNATed back to its own client is masqueraded whatever the endpoint's
    # hairpin listing (iptables: every KUBE-SEP chain masquerades ``-s`` its endpoint).
    masquerade_every_self_dnat: bool = False
    # The chain that drops or rejects external frontends without endpoints, when it is
    # not on the OUTPUT path (iptables: KUBE-EXTERNAL-SERVICES hooks INPUT and FORWARD).
    external_rejects_off_output: str | None = None
    # The chain rejecting an allocated ClusterIP's other ports (nftables only).
    reject_other_cluster_ip_ports: str | None = None
    # A service-CIDR address allocated to nothing is dropped (nftables only).
    drop_unallocated_service_ips: bool = False
    # The filter chain accepting healthCheckNodePorts (iptables and ipvs; nftables needs
    # no rule).
    health_check_accept_chain: str | None = None
    # ipvs: virtual servers and real servers instead of DNAT rules.
    virtual_servers: VirtualServerNames | None = None
    # kernelspace: HNS load balancers instead of rules (Windows).
    load_balancers: LoadBalancerRules | None = None


# ------------------------------------------------------------------- reading the kernel

TIMEOUT = 30.0

# A runner of read-only commands: (binary, args) -> stdout, or raises ToolError.
Reader = Callable[[str, list[str]], str]

_PACKAGES = {"ip": "iproute2", "nft": "nftables"}


def read_command(binary: str, args: list[str]) -> str:
    proc = run_tool(binary, args, timeout=TIMEOUT, package=_PACKAGES.get(binary, binary))
    if proc.returncode != 0:
        raise ToolError(
            f"{binary} {' '.join(args)}: {proc.stderr.strip() or proc.returncode}",
            binary,
            incomplete=False,  # it answered: a refusal
        )
    return proc.stdout


class KernelReader:
    """A :data:`Reader` that runs each distinct command once and remembers its answer
    (or its failure): ``list --live`` checks every frontend against the same sets."""

    def __init__(self, read: Reader = read_command) -> None:
        self._read = read
        self._answers: dict[tuple[str, tuple[str, ...]], str | ToolError] = {}

    def __call__(self, binary: str, args: list[str]) -> str:
        key = (binary, tuple(args))
        if key not in self._answers:
            try:
                self._answers[key] = self._read(binary, args)
            except ToolError as err:
                self._answers[key] = err
        answer = self._answers[key]
        if isinstance(answer, ToolError):
            raise answer
        return answer


def node_addresses(read: Reader = read_command, skip: str | None = None) -> frozenset[str]:
    """Every address of this network namespace (``ip -j addr``; on Windows, which has no
    ``ip``, the interfaces' as psutil reads them), but ``skip``'s (a link holding Service
    addresses, not the node's: ipvs mode's ``kube-ipvs0``)."""
    if sys.platform == "win32":
        import psutil

        return frozenset(
            a.address.split("%", 1)[0]
            for nic in psutil.net_if_addrs().values()
            for a in nic
            if a.family in (socket.AF_INET, socket.AF_INET6)
        )
    out: set[str] = set()
    for link in json.loads(read("ip", ["-j", "addr"]) or "[]"):
        if skip is not None and link.get("ifname") == skip:
            continue
        for info in link.get("addr_info", []):
            local = info.get("local")
            if isinstance(local, str):
                out.add(local.split("%", 1)[0])
    return frozenset(out)


class LiveKernel:
    """The kernel's answers for one ``explain --live`` or ``list --live``: commands
    through :attr:`read`, anything else through :meth:`once`, each asked at most once.
    ``whole``: read whole tables at once (``list --live``) rather than only what one
    answer names; ``iptables_backend``: ``--iptables-backend``."""

    def __init__(
        self, iptables_backend: str = "auto", *, whole: bool = False, read: Reader = read_command
    ) -> None:
        self.iptables_backend = iptables_backend
        self.whole = whole
        self.read = KernelReader(read)
        self._answers: dict[Hashable, object] = {}

    def once(self, key: Hashable, fetch: Callable[[], T]) -> T:
        """``fetch()``'s answer the first time ``key`` is asked; that answer, or its
        failure raised again, after."""
        if key not in self._answers:
            try:
                self._answers[key] = fetch()
            except RuntimeError as err:  # every dataplane tool's error is one
                self._answers[key] = err
        answer = self._answers[key]
        if isinstance(answer, RuntimeError):
            raise answer
        return answer  # type: ignore[return-value]


class Inspector(Protocol):
    """One mode's knowledge for ``explain`` and ``list`` (see the module docstring)."""

    @property
    def rules(self) -> PacketRules: ...

    @property
    def service_address_link(self) -> str | None:
        """A link whose addresses are Service addresses, not the node's."""
        ...

    def frontend_addresses(
        self, fam: FamilyPlan, frontend: Frontend, node_addresses: frozenset[str]
    ) -> tuple[str | None, ...]:
        """The addresses ``list --live`` checks ``frontend`` on (None: the frontend's
        own; ipvs mode has a virtual server per NodePort address)."""
        ...

    def origins(self, frontend: Frontend) -> tuple[Origin, ...]:
        """Where ``list --live`` checks ``frontend`` from: outside, and for ebpf mode
        also this node (its socket hooks serve the node's own connections)."""
        ...

    def before_rules(
        self,
        result: Explanation,
        fam: FamilyPlan,
        endpoints: Mapping[ServicePortName, Sequence[Endpoint]],
    ) -> Explanation:
        """What the mode does before a packet meets its rules: ``result`` (the rules'
        answer) as the mode's answer (ebpf mode: its socket hooks may take the
        connection in ``connect()``)."""
        ...

    def kernel_objects(
        self, result: Explanation, fam: FamilyPlan, scheduler: str = "rr"
    ) -> tuple[KernelObject, ...]:
        """What implements ``result`` in the mode's kernel objects (empty when nothing
        does); ``scheduler``: ipvs mode's."""
        ...

    def drift(
        self,
        result: Explanation,
        fam: FamilyPlan,
        objects: Sequence[KernelObject],
        kernel: LiveKernel,
    ) -> list[str]:
        """``objects`` against what the kernel holds, as readable lines (none: equal)."""
        ...

    def kernel_only(
        self,
        families: Sequence[tuple[FamilyPlan, Sequence[ServicePortPlan]]],
        expected: Sequence[KernelObject],
        kernel: LiveKernel,
    ) -> list[str]:
        """What the kernel holds for a ServicePort that no plan has (``expected``: every
        frontend's :meth:`kernel_objects`)."""
        ...


class RulesInspector:
    """The defaults of a mode whose packets meet its rules and nothing else, checked on
    the frontend's own address from outside (every mode but ebpf's hooks and ipvs's
    per-address NodePorts)."""

    service_address_link: str | None = None

    def frontend_addresses(
        self, fam: FamilyPlan, frontend: Frontend, node_addresses: frozenset[str]
    ) -> tuple[str | None, ...]:
        return (None,)

    def origins(self, frontend: Frontend) -> tuple[Origin, ...]:
        return (Origin.OUTSIDE,)

    def before_rules(
        self,
        result: Explanation,
        fam: FamilyPlan,
        endpoints: Mapping[ServicePortName, Sequence[Endpoint]],
    ) -> Explanation:
        return result
