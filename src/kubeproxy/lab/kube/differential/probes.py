"""The probe matrix: every frontend of a state, from every origin that can reach it.

Origins (:class:`Origin`): a Pod on the node under comparison (``pod-local``), a Pod on
another node (``pod-remote``), the node itself (``node``) and the outside host
(``outside``), which reaches Service addresses through host routes via the node. What
each origin asks (:func:`matrix`):

=====================  ====================================  ==========================
kind                   address                               origins
=====================  ====================================  ==========================
``cluster-ip``         each ClusterIP                        pod-local, node, outside
``node-port``          the node's address of each family     all four
``node-port-gateway``  the node's address on the Pods' links pod-local
``node-port-loopback`` 127.0.0.1                             node
``external-ip``        each external IP                      pod-local, node, outside
``lb-ip``              each load-balancer IP (VIP or Proxy)  pod-local, node, outside
``health``             healthCheckNodePort, both node IPs    outside
``wrong-port``         a ClusterIP on a port it lacks        pod-local, node
``unallocated``        a free address of each ServiceCIDR    pod-local, node
=====================  ====================================  ==========================

A Pod on another node asks only NodePorts of this node: its ClusterIPs, external IPs and
load-balancer IPs are its own node's proxy's business.

Each probe asks several times (new connections, new source ports) and records a
:class:`~collections.Counter` of outcomes: ``<pod>@<address the Pod saw>`` for an
answer (the address tells masquerade from not), ``refused`` (a REJECT: TCP reset or
ICMP port unreachable; UDP asks on a connected socket so the ICMP error is seen),
``timeout`` (a DROP, or nothing there), another errno's name, or for health checks
``http-<status>-local=<localEndpoints>``. Asking stops when the answers stop growing
(:class:`Budget`). Probes run in parallel, one thread per probe in its origin's
namespace; those of Services with session affinity run one at a time afterwards: first
asked without interference (``... sticky``: how many distinct outcomes, 1 when the
affinity holds), then with the node's affinity memory emptied before each ask, which
shows every endpoint the proxy may choose, as for any other Service.
"""

from __future__ import annotations

import errno
import http.client
import itertools
import json
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from kubeproxy.lab.echo import tcp_ask
from kubeproxy.lab.kube.differential.states import State, cidr_ip
from kubeproxy.lab.netns import NetnsExecutor

Obj = dict[str, Any]
Record = dict[str, Counter[str]]
FAMILIES = ("IPv4", "IPv6")
LOOPBACK = "127.0.0.1"
# Addresses of the default ServiceCIDRs (kubeproxy.lab.kube.cluster.SERVICE_CIDRS) the
# allocator is unlikely to have handed out (checked against the live ones anyway).
UNALLOCATED = {"IPv4": "10.96.254.254", "IPv6": "fd00:10:96::fe:fefe"}


@dataclass(frozen=True)
class Origin:
    name: str
    netns: str
    ips: tuple[str, str]  # IPv4, IPv6


@dataclass(frozen=True)
class Budget:
    """How many times a probe asks: at least ``min_tries``; then until ``patience``
    asks in a row brought nothing new, at most ``max_tries``; a probe whose asks all
    failed alike stops after ``fail_tries``."""

    min_tries: int = 4
    patience: int = 6
    max_tries: int = 30
    # A failure can be one outcome among several (an endpoint whose answers cannot come
    # back is chosen half the time): three alike in a row miss the others 1 time in 8
    # at worst, and a disagreement then asks again with ``wider()``.
    fail_tries: int = 3
    tcp_timeout: float = 2.0
    udp_timeout: float = 1.5
    sticky_tries: int = 4

    def wider(self) -> Budget:
        """For a probe whose two records disagree: ask much longer. Failures alike stop
        it only after 16: a Pod that answers one ask in three (the others' answers cannot
        come back) was missed by 10 in a row 1.7% of the time, and a record said DROP."""
        return replace(self, min_tries=20, patience=25, max_tries=80, fail_tries=16)


# CI's: fewer asks. The waits stay: with one second, IPv6 REJECTs came back as
# timeouts or refusals by chance under both proxies (the first SYN's ICMP error was
# lost now and then, probably while the node resolved the client's address; the SYN
# sent again after a second is refused), and the records disagreed.
CI_BUDGET = Budget(min_tries=3, patience=4, max_tries=16, sticky_tries=3)


@dataclass(frozen=True, order=True)
class Probe:
    seed: int
    service: str
    port: str
    kind: str
    origin: str
    protocol: str  # TCP, UDP or HTTP
    ip: str
    number: int
    affinity: bool = False

    @property
    def key(self) -> str:
        where = f"[{self.ip}]" if ":" in self.ip else self.ip
        return (
            f"s{self.seed} {self.service}:{self.port} {self.kind} "
            f"{self.protocol} {where}:{self.number} from {self.origin}"
        )

    @property
    def family(self) -> str:
        return "IPv6" if ":" in self.ip else "IPv4"


def answers(counts: Counter[str]) -> set[str]:
    """The Pods that answered (without the address they saw)."""
    return {o.split("@")[0] for o in counts if "@" in o}


# ------------------------------------------------------------------------- one ask


# UDP asks take their source ports in turn from this range, never a port an earlier ask
# of the run had (until the range wraps, long after its conntrack entries timed out). A
# port the kernel picks at random can repeat an earlier ask's within its entry's 30 s,
# and that ask then follows the old entry: a NodePort's flows outlive a change that
# leaves no serving endpoint, in both proxies (upstream's conntrack reconciler leaves
# them on purpose), so which proxy's probe hit one was chance, not a difference.
UDP_SOURCE_PORTS = range(20000, 60000)
_udp_source_ports = itertools.cycle(UDP_SOURCE_PORTS)
_udp_source_lock = threading.Lock()


def _next_udp_source_port() -> int:
    with _udp_source_lock:
        return next(_udp_source_ports)


def udp_ask_connected(ip: str, port: int, timeout: float) -> bytes:
    """One datagram on a connected socket, so that an ICMP error comes back as one, from
    a source port no earlier ask of the run used (:data:`UDP_SOURCE_PORTS`)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        for _ in range(64):
            try:
                s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", _next_udp_source_port()))
                break
            except OSError as err:
                if err.errno != errno.EADDRINUSE:
                    raise
        s.connect((ip, port))
        s.send(b"?")
        return s.recv(256)


def health_ask(ip: str, port: int, timeout: float) -> str:
    conn = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        body = response.read().decode(errors="replace")
    finally:
        conn.close()
    try:
        local = json.loads(body).get("localEndpoints")
    except ValueError:
        local = "?"
    return f"http-{response.status}-local={local}"


def ask(protocol: str, ip: str, port: int, budget: Budget) -> str:
    """One new connection (or datagram); its outcome as a word."""
    try:
        if protocol == "TCP":
            reply = tcp_ask(ip, port, budget.tcp_timeout)
            return f"{reply.pod}@{reply.client_ip}" if reply.pod else "closed"
        if protocol == "UDP":
            pod, _, client = udp_ask_connected(ip, port, budget.udp_timeout).decode().partition(" ")
            return f"{pod}@{client.strip()}"
        return health_ask(ip, port, budget.tcp_timeout)
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as err:
        return errno.errorcode.get(err.errno or 0, f"errno{err.errno}")
    except http.client.HTTPException as err:
        return f"http-error {type(err).__name__}"


def probe_counts(
    probe: Probe, budget: Budget, before_each: Callable[[], None] | None = None
) -> Counter[str]:
    """Ask until the answers stop growing (run in the origin's namespace)."""
    counts: Counter[str] = Counter()
    quiet = 0
    for i in range(budget.max_tries):
        if before_each is not None:
            before_each()
        outcome = ask(probe.protocol, probe.ip, probe.number, budget)
        quiet = quiet + 1 if outcome in counts else 0
        counts[outcome] += 1
        tries = i + 1
        if len(counts) == 1 and "@" not in outcome and tries >= budget.fail_tries:
            break  # the same failure every time: a DROP or a REJECT
        if tries >= budget.min_tries and quiet >= budget.patience:
            break
    return counts


def sticky_counts(probe: Probe, budget: Budget) -> Counter[str]:
    """Asks in a row without forgetting: ``distinct=N``, how many different outcomes
    they gave (1 when the affinity holds: the same Pod every time, or the same failure
    when the first choice was an endpoint whose answers cannot come back)."""
    seen: Counter[str] = Counter()
    for _ in range(budget.sticky_tries):
        seen[ask(probe.protocol, probe.ip, probe.number, budget)] += 1
        if len(seen) == 1 and not answers(seen) and seen.total() >= budget.fail_tries:
            break
    return Counter({f"distinct={len(seen)}": seen.total()})


def _sticky_one_by_one(probes: Sequence[Probe], budget: Budget) -> dict[str, Counter[str]]:
    return {f"{p.key} sticky": sticky_counts(p, budget) for p in probes}


def _one_by_one(
    probes: Sequence[Probe], budget: Budget, forget: Callable[[], None]
) -> dict[str, Counter[str]]:
    return {p.key: probe_counts(p, budget, forget) for p in probes}


# ------------------------------------------------------------------------- running


class Prober:
    """Runs probes from the origins' namespaces (a few threads in each).

    Probes run in parallel. Session affinity is remembered per Service port and client
    address, so probes of one Service port from one origin are the only ones that can
    see each other's affinity: they form a group. First every probe runs, those with
    affinity only as ``... sticky`` (no one forgets anything yet, so what sticks shows),
    a group's one after the other; then the groups run in parallel, each group's probes
    one after the other, forgetting before every ask (another group's forgetting only
    makes choices fresher).
    """

    # Most of a probe's time is a wait (for a timeout, or for the echo server): threads
    # in plenty keep the two CPUs busy without the waits adding up.
    def __init__(self, origins: Sequence[Origin], workers: int = 12) -> None:
        self.origins = {o.name: o for o in origins}
        self._executors = {o.name: NetnsExecutor(o.netns, workers) for o in origins}

    def run(
        self,
        probes: Iterable[Probe],
        budget: Budget,
        forget_affinity: Callable[[], None] | None,
    ) -> Record:
        probes = sorted(probes)
        futures: dict[str, Future[Counter[str]]] = {}
        groups: dict[tuple[int, str, str, str], list[Probe]] = {}
        for p in probes:
            if p.affinity:
                groups.setdefault((p.seed, p.service, p.port, p.origin), []).append(p)
            else:
                futures[p.key] = self._executors[p.origin].submit(probe_counts, p, budget)
        # A group's sticky asks one probe after the other: its frontends share the
        # affinity memory, and two first asks at once (a ClusterIP's and an
        # externalTrafficPolicy: Local load-balancer IP's) put the client in two
        # endpoints' sets, so the ClusterIP's next asks went to the other one.
        sticky = [
            self._executors[origin].submit(_sticky_one_by_one, group, budget)
            for (_, _, _, origin), group in sorted(groups.items())
        ]
        record: Record = {key: future.result(timeout=900) for key, future in futures.items()}
        for future in sticky:
            record.update(future.result(timeout=900))
        # Without a way to forget (ipvs mode), the sticky asks are the whole record.
        if groups and forget_affinity is not None:
            forget_affinity()
            pending = [
                self._executors[origin].submit(_one_by_one, group, budget, forget_affinity)
                for (_, _, _, origin), group in sorted(groups.items())
            ]
            for future in pending:
                record.update(future.result(timeout=900))
        return record

    def close(self) -> None:
        for executor in self._executors.values():
            executor.shutdown()


# -------------------------------------------------------------------------- matrix


@dataclass(frozen=True)
class Geometry:
    """Where the node under comparison is: its addresses, the ones on its Pods' links."""

    node_ips: tuple[str, str]
    gateways: tuple[str, str]


def _by_family(ips: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {f: [] for f in FAMILIES}
    for ip in ips:
        out["IPv6" if ":" in ip else "IPv4"].append(ip)
    return out


# Who asks each kind of frontend (see the module's table).
ORIGINS: dict[str, tuple[str, ...]] = {
    "cluster-ip": ("pod-local", "node", "outside"),
    "node-port": ("pod-local", "pod-remote", "node", "outside"),
    "node-port-gateway": ("pod-local",),
    "node-port-loopback": ("node",),
    "external-ip": ("pod-local", "node", "outside"),
    "lb-ip": ("pod-local", "node", "outside"),
    "health": ("outside",),
    "wrong-port": ("pod-local", "node"),
    "unallocated": ("pod-local", "node"),
}


@dataclass(frozen=True)
class Frontend:
    """Something to ask: ``kind`` as in :data:`ORIGINS`, of a Service's port."""

    kind: str
    service: str
    port: str
    protocol: str
    ip: str
    number: int
    affinity: bool = False


def frontends(state: State, live: Mapping[str, Obj], geometry: Geometry) -> Iterator[Frontend]:
    """Every frontend of ``state``'s Services (``live``: as the API server has them)."""
    for svc in state.services:
        obj = live[svc.name]
        spec, status = obj["spec"], obj.get("status", {})
        affinity = spec.get("sessionAffinity") == "ClientIP"
        cluster_ips = _by_family(ip for ip in spec.get("clusterIPs", []) if ip != "None")
        external = _by_family(spec.get("externalIPs", []))
        # An ingress by hostname only has no address to ask (and neither proxy has one).
        ingress = status.get("loadBalancer", {}).get("ingress", [])
        lbs = _by_family(i["ip"] for i in ingress if i.get("ip"))
        for port in spec["ports"]:
            name, proto, number = port.get("name", ""), port["protocol"], port["port"]

            one = partial(Frontend, service=svc.name, port=name, protocol=proto, affinity=affinity)

            for k, family in enumerate(FAMILIES):
                if not cluster_ips[family]:
                    continue
                yield from (
                    one(kind="cluster-ip", ip=ip, number=number) for ip in cluster_ips[family]
                )
                node_port = port.get("nodePort")
                if node_port:
                    yield one(kind="node-port", ip=geometry.node_ips[k], number=node_port)
                    yield one(kind="node-port-gateway", ip=geometry.gateways[k], number=node_port)
                    if family == "IPv4":
                        yield one(kind="node-port-loopback", ip=LOOPBACK, number=node_port)
                yield from (
                    one(kind="external-ip", ip=ip, number=number) for ip in external[family]
                )
                yield from (one(kind="lb-ip", ip=ip, number=number) for ip in lbs[family])
        health = spec.get("healthCheckNodePort")
        if health:
            for ip in geometry.node_ips:
                yield Frontend("health", svc.name, "", "HTTP", ip, health)


def matrix(
    state: State,
    live: Mapping[str, Obj],
    geometry: Geometry,
    allocated: set[str],
    origins: Sequence[str] = ("pod-local", "pod-remote", "node", "outside"),
) -> list[Probe]:
    """Every probe of ``state``: its frontends, a ClusterIP on a port it lacks, free
    addresses of the ServiceCIDRs (not in ``allocated``), from each origin of their kind."""
    found = list(frontends(state, live, geometry))
    if state.services:
        first = live[state.services[0].name]["spec"]
        ips = [ip for ip in first.get("clusterIPs", []) if ip != "None"]
        if ips and 1 not in {p["port"] for p in first["ports"]}:
            found.append(Frontend("wrong-port", state.services[0].name, "", "TCP", ips[0], 1))
    for family in FAMILIES:
        free = [UNALLOCATED[family]]
        if state.service_cidrs:
            free.append(cidr_ip(state.block, 250, family))
        found += [
            Frontend("unallocated", "-", "", "TCP", ip, 80) for ip in free if ip not in allocated
        ]
    return [
        Probe(state.seed, f.service, f.port, f.kind, origin, f.protocol, f.ip, f.number, f.affinity)
        for f in found
        for origin in ORIGINS[f.kind]
        if origin in origins
    ]


def outside_routes(probes: Iterable[Probe], geometry: Geometry) -> set[tuple[str, str]]:
    """(address, via) host routes the outside host needs: each Service address it asks,
    through the node."""
    out = set()
    for p in probes:
        if p.origin == "outside" and p.ip not in geometry.node_ips:
            via = geometry.node_ips[1] if ":" in p.ip else geometry.node_ips[0]
            out.add((p.ip, via))
    return out
