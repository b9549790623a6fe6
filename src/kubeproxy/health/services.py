"""Per-Service health checks: one HTTP listener per ``spec.healthCheckNodePort``.

A LoadBalancer Service with ``externalTrafficPolicy: Local`` gets a health-check node
port; the cloud load balancer probes it on every node and sends traffic only to nodes
that answer 200 (upstream ``pkg/proxy/healthcheck/service_health.go``):

* 200 when the node has at least one *ready* local endpoint (terminating ones do not
  count, so the node drains) and the proxy itself is healthy; 503 otherwise;
* any path and method; header ``X-Load-Balancing-Endpoint-Weight`` carries the count;
* the body is upstream's tab-indented JSON
  ``{"service": {"namespace", "name"}, "localEndpoints": N, "serviceProxyHealthy": b}``.

:meth:`ServiceHealthServers.sync` opens listeners for new Services, closes those of
Services that went away, and reopens on a port change. A port that cannot be bound is
logged once and returned as a :class:`BindFailure` (for an event or metric); binding is
retried on every later sync, like upstream, and the other listeners keep working.

Where they listen is upstream's ``nodePortAddresses.GetNodeIPs``, for each IP family the
Service has (upstream runs one health server per family, and a Service is in a family's
only when it has a ClusterIP of that family: an IPv6-only Service's health check does
not answer on IPv4; the differential test against upstream found it): per IP family, when
``--nodeport-addresses`` matches every address of the family (no CIDR of that family,
``0.0.0.0/0``, or ``primary`` with no known primary IP) the wildcard address; otherwise one
bind per local interface address inside the family's CIDRs (``primary``: the node's
primary IP, if it is local). When every family matches everything, one wildcard bind
serves both families, as Go's ``:port``. :func:`health_check_hosts` decides, purely, from
the local addresses; :func:`local_addresses` lists those (psutil's ``net_if_addrs``,
i.e. getifaddrs(3)) and is injectable. Unlike upstream, which lists the addresses once at
start-up, the hosts are worked out again on every sync that has health checks, so a node
IP that appears or changes later is picked up (the listeners move with it). When no local
address matches, nothing listens, as upstream, and a warning says so.

:func:`health_check_node_ports`, :func:`local_ready_endpoints` and
:func:`health_check_families` compute ``sync``'s arguments from a snapshot's maps
(upstream ``HealthCheckNodePorts``, ``LocalReadyEndpoints``, and which family's proxier
has the Service).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import psutil
from aiohttp import web

from kubeproxy.health.listener import HttpListener, json_response
from kubeproxy.logs import V2
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.types import (
    Endpoint,
    IPFamily,
    NamespacedName,
    ServicePort,
    ServicePortName,
    TrafficPolicy,
    family_of,
)

log = logging.getLogger(__name__)

# Event reason upstream records on the Service when its health check cannot listen.
EVENT_REASON_FAILED = "FailedToStartServiceHealthcheck"


def health_check_node_ports(
    services: Mapping[ServicePortName, ServicePort],
) -> dict[NamespacedName, int]:
    """The health-check port of every Service that needs one."""
    return {
        name.service: sp.health_check_node_port
        for name, sp in services.items()
        if sp.health_check_node_port and sp.external_traffic_policy is TrafficPolicy.LOCAL
    }


def health_check_families(
    services: Mapping[ServicePortName, ServicePort],
) -> dict[NamespacedName, frozenset[IPFamily]]:
    """The IP families of every Service that needs a health check (of its ClusterIPs)."""
    out: dict[NamespacedName, frozenset[IPFamily]] = {}
    for name, sp in services.items():
        if sp.health_check_node_port and sp.external_traffic_policy is TrafficPolicy.LOCAL:
            families = frozenset(family_of(ip) for ip in sp.cluster_ips)
            out[name.service] = out.get(name.service, frozenset()) | families
    return out


def hosts_of_families(
    hosts: tuple[str | None, ...], families: Collection[IPFamily]
) -> tuple[str | None, ...]:
    """The ``hosts`` (see :func:`health_check_hosts`) of ``families`` only: upstream's
    health server of one family listens on that family's addresses (its wildcard is
    ``tcp4`` 0.0.0.0 or ``tcp6`` [::])."""
    if set(families) >= {IPFamily.IPv4, IPFamily.IPv6}:
        return hosts
    out: list[str | None] = []
    for host in hosts:
        if host is None:
            out += [
                "0.0.0.0" if f is IPFamily.IPv4 else "::"
                for f in (IPFamily.IPv4, IPFamily.IPv6)
                if f in families
            ]
        elif family_of(host.partition("%")[0]) in families:
            out.append(host)
    return tuple(out)


def local_ready_endpoints(
    endpoints: Mapping[ServicePortName, Sequence[Endpoint]], node_name: str
) -> dict[NamespacedName, int]:
    """Per Service, how many ready endpoints run on this node.

    Counted by IP, not IP:port: a pod serving two ports of a Service is one endpoint. A
    dual-stack pod has one IP per family; upstream's per-family proxiers each count one
    family, so the larger family count is the number of pods.
    """
    ips: dict[NamespacedName, dict[IPFamily, set[str]]] = {}
    for name, eps in endpoints.items():
        for ep in eps:
            if ep.ready and ep.is_local(node_name):
                ips.setdefault(name.service, {}).setdefault(ep.family, set()).add(ep.ip)
    return {svc: max(map(len, by_family.values())) for svc, by_family in ips.items()}


def local_addresses() -> list[str]:
    """Every IPv4 and IPv6 address of every local interface (IPv6 link-local ones with
    their ``%zone``, which binding them needs)."""
    return [
        addr.address
        for addrs in psutil.net_if_addrs().values()
        for addr in addrs
        if addr.family in (socket.AF_INET, socket.AF_INET6)
    ]


def health_check_hosts(
    node_ports: NodePortAddresses,
    families: Iterable[IPFamily],
    primary_ips: Mapping[IPFamily, str],
    addresses: Iterable[str],
) -> tuple[str | None, ...]:
    """The hosts health checks bind: None is every address of both families, ``0.0.0.0``
    / ``::`` every address of one family, anything else one local address."""
    selected = {f: node_ports.for_family(f, primary_ips.get(f)) for f in families}
    if all(s.match_all for s in selected.values()):
        return (None,)
    local = [(ipaddress.ip_address(a.partition("%")[0]), a) for a in addresses]
    hosts: list[str | None] = []
    for family, sel in selected.items():
        if sel.match_all:
            hosts.append("0.0.0.0" if family is IPFamily.IPv4 else "::")
            continue
        networks = [ipaddress.ip_network(r) for r in sel.ranges]
        matched = {(ip, text) for ip, text in local if any(ip in net for net in networks)}
        hosts += [text for _, text in sorted(matched)]
    return tuple(hosts)


@dataclass(frozen=True, slots=True)
class BindFailure:
    service: NamespacedName
    port: int
    message: str


@dataclass
class _Instance:
    port: int
    hosts: tuple[str | None, ...]
    # None when no local address matches: nothing listens (upstream: no nodeIPs).
    listener: HttpListener | None
    endpoints: int = 0


class ServiceHealthServers:
    def __init__(
        self,
        proxy_healthy: Callable[[], bool],
        hostname: str = "",
        *,
        node_ports: NodePortAddresses | None = None,
        families: Sequence[IPFamily] = (IPFamily.IPv4, IPFamily.IPv6),
        list_addresses: Callable[[], Iterable[str]] = local_addresses,
    ) -> None:
        """``proxy_healthy``: e.g. :meth:`ProxyHealth.is_healthy`; ``hostname`` for
        messages; ``node_ports`` (``--nodeport-addresses``, default ``primary``) and the
        proxy's ``families`` choose the addresses, among ``list_addresses()``."""
        self._proxy_healthy = proxy_healthy
        self._hostname = hostname
        self._node_ports = node_ports or NodePortAddresses()
        self._families = tuple(families)
        self._list_addresses = list_addresses
        self._hosts: tuple[str | None, ...] | None = None
        self._instances: dict[NamespacedName, _Instance] = {}
        self._failures: dict[NamespacedName, BindFailure] = {}

    @property
    def ports(self) -> dict[NamespacedName, int]:
        """The port each open health check is bound to."""
        return {
            nsn: inst.listener.port
            for nsn, inst in self._instances.items()
            if inst.listener is not None
        }

    @property
    def hosts(self) -> tuple[str | None, ...] | None:
        """Where health checks listen since the last sync that had any (None: not yet)."""
        return self._hosts

    def _resolve_hosts(self, primary_ips: Mapping[IPFamily, str]) -> tuple[str | None, ...]:
        hosts = health_check_hosts(
            self._node_ports, self._families, primary_ips, self._list_addresses()
        )
        if hosts != self._hosts:
            if hosts:
                shown = ", ".join("all addresses" if h is None else h for h in hosts)
                log.log(V2, "Service health checks listen on %s", shown)
            else:
                log.warning(
                    "No local address matches --nodeport-addresses %s (primary IPs: %s): "
                    "Service health checks listen nowhere",
                    self._node_ports,
                    ", ".join(primary_ips.values()) or "none known",
                )
            self._hosts = hosts
        return hosts

    @property
    def failures(self) -> dict[NamespacedName, BindFailure]:
        """Health checks that currently cannot listen."""
        return dict(self._failures)

    async def sync(
        self,
        desired: Mapping[NamespacedName, int],
        local_endpoints: Mapping[NamespacedName, int],
        primary_ips: Mapping[IPFamily, str] | None = None,
        families: Mapping[NamespacedName, Collection[IPFamily]] | None = None,
    ) -> list[BindFailure]:
        """Make ``desired`` (Service -> port) the open set; returns the *new* bind failures.

        ``local_endpoints`` counts are kept for open Services only; a Service missing
        from it has none. ``primary_ips``: the node's, for ``--nodeport-addresses
        primary``. ``families``: each Service's IP families (its health check listens on
        those families' addresses only; a Service not in it, or no ``families``: every
        family). Port 0 binds an ephemeral port (tests).
        """
        # Only look at the interfaces when there is something to serve.
        every = self._resolve_hosts(primary_ips or {}) if desired else ()

        def hosts_for(nsn: NamespacedName) -> tuple[str | None, ...]:
            wanted = (families or {}).get(nsn)
            if wanted is None:
                return every
            return hosts_of_families(every, set(wanted) & set(self._families))

        for nsn, inst in list(self._instances.items()):
            if desired.get(nsn) != inst.port or inst.hosts != hosts_for(nsn):
                log.log(V2, "Closing healthcheck for %s on port %d", nsn, inst.port)
                del self._instances[nsn]
                if inst.listener is not None:
                    await inst.listener.stop()
        self._failures = {
            nsn: failure
            for nsn, failure in self._failures.items()
            if desired.get(nsn) == failure.port
        }
        new_failures: list[BindFailure] = []
        # Sorted, so when two Services claim one port the same one wins every time.
        for nsn, port in sorted(desired.items()):
            if nsn in self._instances:
                continue
            hosts = hosts_for(nsn)
            if not hosts:
                self._instances[nsn] = _Instance(port, hosts, None)
                continue
            listener = HttpListener(web.Server(self._handler(nsn), access_log=None), hosts, port)
            try:
                await listener.start()
            except OSError as err:
                if nsn not in self._failures:
                    failure = BindFailure(
                        nsn,
                        port,
                        f'node {self._hostname} failed to start healthcheck "{nsn}" '
                        f"on port {port}: {err}",
                    )
                    self._failures[nsn] = failure
                    new_failures.append(failure)
                    log.error("%s", failure.message)
                continue
            if self._failures.pop(nsn, None) is not None:
                log.info("Healthcheck for %s is listening on port %d now", nsn, port)
            log.log(V2, "Opening healthcheck for %s on port %d", nsn, port)
            self._instances[nsn] = _Instance(port, hosts, listener, local_endpoints.get(nsn, 0))
        for nsn, inst in self._instances.items():
            inst.endpoints = local_endpoints.get(nsn, 0)
        return new_failures

    async def close(self) -> None:
        instances, self._instances = self._instances, {}
        self._failures = {}
        for inst in instances.values():
            if inst.listener is not None:
                await inst.listener.stop()

    def _handler(
        self, nsn: NamespacedName
    ) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
        async def handle(_: web.BaseRequest) -> web.StreamResponse:
            inst = self._instances.get(nsn)
            # A request racing the listener's close: upstream answers an empty 200, but
            # "not here" is the safer answer for a load balancer.
            count = inst.endpoints if inst is not None else 0
            healthy = self._proxy_healthy()
            body = {
                "service": {"namespace": nsn.namespace, "name": nsn.name},
                "localEndpoints": count,
                "serviceProxyHealthy": healthy,
            }
            return json_response(
                200 if count and healthy else 503,
                body,
                indent="\t",
                headers={"X-Load-Balancing-Endpoint-Weight": str(count)},
            )

        return handle
