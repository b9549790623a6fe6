"""Stale conntrack entries: deciding what to clear after a sync, and clearing it.

Why: NAT is decided on a flow's first packet only; later packets follow the conntrack
entry. For TCP a removed endpoint resets its connections, but a UDP client that keeps
sending from the same port keeps reaching a removed endpoint (or a black hole) for as long
as it sends, unless the entry is deleted. The module has three parts:

* :class:`Filter` — one deletion: protocol and family plus any of original destination
  IP and port and reply source address and port (the endpoint a flow was DNATed to).
* What is stale is what upstream v1.37's reconciler (``pkg/proxy/conntrack``
  ``CleanStaleEntries``) deletes: a UDP flow to a frontend of an existing UDP
  ServicePort (its ClusterIP, external and load-balancer IPs at its port; any address at
  its NodePort, only while it has a serving endpoint) that does not go to one of its
  serving endpoints. Flows of deleted Services and ports are left to their timeouts.
  Upstream lists the whole table whenever a UDP ServicePort's endpoints change;
  here :func:`stale_conntrack_filters` (pure) derives the same deletions from one sync's
  changes (the trackers' :class:`~kubeproxy.model.tracker.ServiceUpdate` /
  :class:`~kubeproxy.model.tracker.EndpointsUpdate`), and :func:`reconcile` (pure) reads
  the whole listed table once, at the first sync, for what went stale while no proxy
  ran.
* :class:`Conntrack` — the side effect, a one-method Protocol: :class:`ConntrackCommand`
  runs the ``conntrack`` tool (conntrack-tools); :class:`FakeConntrack` is a table in
  memory with the same matching. :func:`apply` runs filters, logging a failure and going
  on with the rest.

The ``conntrack`` tool rather than netlink from Python: it is already a dependency (the
bootstrap installs it, as for upstream's exec-based versions) and needs no new Python
package. A cleanup lists the table once per family and protocol, then runs one process
per filter that matches an entry (a few ms each): filters are many under churn, flows to
removed endpoints few. ``--reply-src`` is used
rather than ``--dst-nat IP``: it is what upstream's netlink filters match, and it also
matches flows whose NAT status bits are not set.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from subprocess import CompletedProcess
from typing import Protocol

from kubeproxy.dataplane.errors import DataplaneError
from kubeproxy.dataplane.process import ToolError, run_tool
from kubeproxy.model.tracker import EndpointsUpdate, ServiceUpdate
from kubeproxy.model.types import (
    PLAIN_IPV4,
    Endpoint,
    IPFamily,
    L4Protocol,
    ServicePort,
    ServicePortName,
    family_of,
)

log = logging.getLogger(__name__)


class ConntrackError(DataplaneError):
    """A deletion the kernel or the tool refused (``incomplete``: the tool did not run
    to completion)."""

    tool = "conntrack"


@dataclass(frozen=True, order=True)
class Filter:
    """Delete the ``protocol`` entries of ``family`` matching every field that is set."""

    family: IPFamily
    protocol: L4Protocol
    orig_dst: str | None = None
    orig_dst_port: int | None = None
    reply_src: str | None = None
    # The endpoint's port (upstream's reconciler matches the endpoint by address and
    # port: a flow to an endpoint whose port changed is stale too).
    reply_src_port: int | None = None
    reason: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.orig_dst is None and self.orig_dst_port is None and self.reply_src is None:
            # Would delete every entry of the protocol: never what a proxy means.
            raise ValueError("a conntrack filter needs an address or a port")
        for ip in (self.orig_dst, self.reply_src):
            if ip is None:
                continue
            # A churn makes thousands of filters per sync: plain IPv4 needs no ipaddress.
            plain = PLAIN_IPV4.fullmatch(ip) is not None
            if (IPFamily.IPv4 if plain else family_of(str(ipaddress.ip_address(ip)))) is not (
                self.family
            ):
                raise ValueError(f"{ip} is not an {self.family.value} address")
        for port in (self.orig_dst_port, self.reply_src_port):
            if port is not None and not 0 < port < 65536:
                raise ValueError(f"invalid port {port}")

    @classmethod
    def for_ip(
        cls, ip: str, protocol: L4Protocol, port: int | None = None, reason: str = ""
    ) -> Filter:
        """Flows sent to a Service IP (optionally one port of it)."""
        return cls(family_of(ip), protocol, orig_dst=ip, orig_dst_port=port, reason=reason)

    @classmethod
    def for_port(
        cls, port: int, family: IPFamily, protocol: L4Protocol, reason: str = ""
    ) -> Filter:
        """Flows sent to a NodePort on any address of ``family``."""
        return cls(family, protocol, orig_dst_port=port, reason=reason)

    @classmethod
    def for_nat(
        cls,
        ip: str,
        endpoint_ip: str,
        protocol: L4Protocol,
        port: int | None = None,
        *,
        reason: str = "",
        endpoint_port: int | None = None,
    ) -> Filter:
        """Flows sent to a Service IP (and port) and NATed to ``endpoint_ip`` (and
        ``endpoint_port``); with ``endpoint_ip`` the Service IP itself, the flows that
        were not NATed at all."""
        return cls(
            family_of(ip),
            protocol,
            orig_dst=ip,
            orig_dst_port=port,
            reply_src=endpoint_ip,
            reply_src_port=endpoint_port,
            reason=reason,
        )

    @classmethod
    def for_port_nat(
        cls,
        port: int,
        endpoint_ip: str,
        protocol: L4Protocol,
        reason: str = "",
        endpoint_port: int | None = None,
    ) -> Filter:
        """Flows sent to a NodePort and NATed to ``endpoint_ip`` (and ``endpoint_port``)."""
        return cls(
            family_of(endpoint_ip),
            protocol,
            orig_dst_port=port,
            reply_src=endpoint_ip,
            reply_src_port=endpoint_port,
            reason=reason,
        )

    @classmethod
    def for_entry(cls, entry: Entry, reason: str = "") -> Filter:
        """The flows to the same frontend through the same endpoint as ``entry`` (what a
        reconcile deletes: the clients' addresses do not matter)."""
        return cls(
            entry.family,
            entry.protocol,
            orig_dst=entry.orig_dst,
            orig_dst_port=entry.orig_dst_port,
            reply_src=entry.reply_src,
            reply_src_port=entry.reply_src_port,
            reason=reason,
        )

    def args(self) -> list[str]:
        """The ``conntrack`` arguments deleting these entries."""
        out = ["-D", "-f", "ipv6" if self.family is IPFamily.IPv6 else "ipv4"]
        out += ["-p", self.protocol.nft]
        if self.orig_dst is not None:
            out += ["--orig-dst", self.orig_dst]
        if self.orig_dst_port is not None:
            out += ["--orig-port-dst", str(self.orig_dst_port)]
        if self.reply_src is not None:
            out += ["--reply-src", self.reply_src]
        if self.reply_src_port is not None:
            out += ["--reply-port-src", str(self.reply_src_port)]
        return out

    def __str__(self) -> str:
        parts = [self.protocol.nft, self.family.value]
        if self.orig_dst is not None:
            parts.append(f"orig-dst={self.orig_dst}")
        if self.orig_dst_port is not None:
            parts.append(f"orig-port-dst={self.orig_dst_port}")
        if self.reply_src is not None:
            parts.append(f"reply-src={self.reply_src}")
        if self.reply_src_port is not None:
            parts.append(f"reply-port-src={self.reply_src_port}")
        return " ".join(parts)


# -------------------------------------------------------------------- what to clear


def _service_ips(port: ServicePort, family: IPFamily) -> list[str]:
    """Every address the ServicePort is reached on in ``family``: ClusterIP, external IPs,
    load-balancer IPs."""
    cluster_ip = port.cluster_ip(family)
    ips = [cluster_ip] if cluster_ip is not None else []
    return ips + list(port.external_ips_of(family)) + list(port.load_balancer_ips_of(family))


def _serving(endpoints: Iterable[Endpoint], family: IPFamily) -> set[tuple[str, int]]:
    """Upstream's reconciler keeps flows to a serving endpoint, whatever the traffic
    policies, topology or terminating state: changes to a Service do not break them."""
    return {(ep.ip, ep.port) for ep in endpoints if ep.serving and ep.family is family}


def stale_conntrack_filters(
    services: Mapping[ServicePortName, ServicePort],
    endpoints: Mapping[ServicePortName, tuple[Endpoint, ...]],
    svc_update: ServiceUpdate,
    ep_update: EndpointsUpdate,
    family: IPFamily,
) -> list[Filter]:
    """The filters one sync calls for in ``family``, deduplicated, in a stable order:
    what upstream's reconciler (``CleanStaleEntries``) deletes, for the UDP ServicePorts
    the sync changed (upstream rescans every one; the others had nothing stale left).

    ``services`` and ``endpoints`` are the maps after the sync's changes. A flow is stale
    when it goes to a frontend of an existing UDP ServicePort (ClusterIP, external and
    load-balancer IPs at its port; any address at its NodePort) and not to one of its
    serving endpoints:

    * (a) flows NATed to an endpoint that stopped serving (matched by its address and
      port) — at the NodePort only while the ServicePort keeps a serving endpoint: with
      none, upstream leaves NodePort flows alone (matched by port only, they could be
      anybody's);
    * (b) flows not NATed at all (the Service IP answers itself) to a ServicePort that
      got its first serving endpoint or whose Service changed (a new address), and at a
      NodePort, every flow once the ServicePort serves again (those left while it had
      none are NATed to endpoints that stopped serving then).

    A deleted Service or port is not looked at, as upstream: its flows are left to
    their timeouts.
    """
    filters: dict[Filter, None] = {}
    udp = L4Protocol.UDP

    def add(flt: Filter) -> None:
        filters.setdefault(flt, None)

    for name, endpoint in sorted(
        ep_update.deleted_udp_endpoints, key=lambda item: (item[0], item[1].ip, item[1].port)
    ):
        port = services.get(name)
        if port is None or endpoint.family is not family:
            continue
        reason = f"{name} lost endpoint {endpoint}"
        if port.node_port and _serving(endpoints.get(name, ()), family):
            add(
                Filter.for_port_nat(
                    port.node_port, endpoint.ip, udp, reason=reason, endpoint_port=endpoint.port
                )
            )
        for ip in _service_ips(port, family):
            add(
                Filter.for_nat(
                    ip, endpoint.ip, udp, port.port, reason=reason, endpoint_port=endpoint.port
                )
            )

    changed = {n for n in svc_update.changed if n.protocol is udp}
    for name in sorted(changed | ep_update.newly_active_udp):
        port = services.get(name)
        if port is None:
            continue
        reason = f"{name} changed: flows not NATed"
        for ip in _service_ips(port, family):
            add(Filter.for_nat(ip, ip, udp, port.port, reason=reason))
        if port.node_port and name in ep_update.newly_active_udp:
            add(Filter.for_port(port.node_port, family, udp, reason=f"{name} serves again"))

    return list(filters)


def reconcile(
    services: Mapping[ServicePortName, ServicePort],
    endpoints: Mapping[ServicePortName, tuple[Endpoint, ...]],
    family: IPFamily,
    entries: Iterable[Entry],
) -> list[Filter]:
    """Upstream's reconciler over the whole table (at start-up: what changed while no
    proxy ran is not in any change): the listed UDP ``entries`` to a frontend of a UDP
    ServicePort and not to one of its serving endpoints, as one filter per frontend and
    endpoint (the clients' addresses do not matter)."""
    by_ip: dict[tuple[str, int], set[tuple[str, int]]] = {}
    by_node_port: dict[int, set[tuple[str, int]]] = {}
    for name, port in services.items():
        if name.protocol is not L4Protocol.UDP:
            continue
        serving = _serving(endpoints.get(name, ()), family)
        for ip in _service_ips(port, family):
            by_ip[(ip, port.port)] = serving
        if port.node_port and serving:
            by_node_port[port.node_port] = serving
    filters: dict[Filter, None] = {}
    for entry in entries:
        if entry.protocol is not L4Protocol.UDP or entry.family is not family:
            continue
        served = by_ip.get((_canonical_ip(entry.orig_dst), entry.orig_dst_port))
        if served is None:
            served = by_node_port.get(entry.orig_dst_port)
        if served is not None and (entry.reply_src, entry.reply_src_port) not in served:
            filters.setdefault(Filter.for_entry(entry, reason="stale at start-up"), None)
    return list(filters)


def _canonical_ip(ip: str) -> str:
    return ip if PLAIN_IPV4.fullmatch(ip) else str(ipaddress.ip_address(ip))


# ------------------------------------------------------------------------ clearing


class Conntrack(Protocol):
    def clear(self, flt: Filter) -> int:
        """Delete the matching entries; how many. Raises ConntrackError."""
        ...

    def entries(self, family: IPFamily, protocol: L4Protocol) -> list[Entry]:
        """Every entry of ``protocol`` in ``family``. Raises ConntrackError."""
        ...


_DELETED = re.compile(r"(\d+) flow entries have been deleted")
_FIELD = re.compile(r"\b(src|dst|sport|dport)=(\S+)")


def parse_listing(text: str, family: IPFamily, protocol: L4Protocol) -> list[Entry]:
    """``conntrack -L`` output: the original tuple and the reply source of each line."""
    out = []
    for line in text.splitlines():
        fields = _FIELD.findall(line)
        if len(fields) < 8:
            continue
        orig, reply = dict(fields[:4]), dict(fields[4:8])
        try:
            out.append(
                Entry(
                    family,
                    protocol,
                    str(ipaddress.ip_address(orig["src"])),
                    str(ipaddress.ip_address(orig["dst"])),
                    int(orig["sport"]),
                    int(orig["dport"]),
                    str(ipaddress.ip_address(reply["src"])),
                    int(reply["sport"]),
                )
            )
        except (KeyError, ValueError):
            continue  # not a line of entries (the tool's summary, say)
    return out


class ConntrackCommand:
    """Runs ``conntrack -D`` (conntrack-tools) in the caller's network namespace."""

    def __init__(self, binary: str = "conntrack", timeout: float = 30.0) -> None:
        self.binary = binary
        self.timeout = timeout

    def _run(self, args: list[str]) -> CompletedProcess[str]:
        try:
            # A hung tool is killed after the timeout: a failure, kept and retried.
            return run_tool(self.binary, args, timeout=self.timeout, package="conntrack")
        except (OSError, ToolError) as err:
            raise ConntrackError(f"{self.binary}: {err}", incomplete=True) from None

    def clear(self, flt: Filter) -> int:
        proc = self._run(flt.args())
        output = f"{proc.stderr}\n{proc.stdout}"
        match = _DELETED.search(output)
        # "0 flow entries have been deleted" comes with exit status 1: not an error.
        if match is not None and (proc.returncode == 0 or match.group(1) == "0"):
            return int(match.group(1))
        raise ConntrackError(
            f"{self.binary} {' '.join(flt.args())}: "
            f"{' '.join(output.split()) or f'exit status {proc.returncode}'}"
        )

    def entries(self, family: IPFamily, protocol: L4Protocol) -> list[Entry]:
        args = ["-L", "-f", "ipv6" if family is IPFamily.IPv6 else "ipv4", "-p", protocol.lower()]
        proc = self._run(args)
        if proc.returncode != 0:
            raise ConntrackError(f"{self.binary} {' '.join(args)}: {' '.join(proc.stderr.split())}")
        return parse_listing(proc.stdout, family, protocol)


@dataclass(frozen=True)
class Entry:
    """One conntrack entry, as much of it as filters look at."""

    family: IPFamily
    protocol: L4Protocol
    orig_src: str
    orig_dst: str
    orig_src_port: int
    orig_dst_port: int
    reply_src: str
    reply_src_port: int = 0

    def matches(self, flt: Filter) -> bool:
        return (
            self.family is flt.family
            and self.protocol is flt.protocol
            and flt.orig_dst in (None, self.orig_dst)
            and flt.orig_dst_port in (None, self.orig_dst_port)
            and flt.reply_src in (None, self.reply_src)
            and flt.reply_src_port in (None, self.reply_src_port)
        )


@dataclass
class FakeConntrack:
    """An in-memory conntrack table with the real tool's matching; ``refuse`` fails those
    filters, as the real one fails when the kernel refuses."""

    table: list[Entry] = field(default_factory=list)
    refuse: set[Filter] = field(default_factory=set)
    cleared: list[Filter] = field(default_factory=list)
    refuse_listing: bool = False
    listed: int = 0

    def entries(self, family: IPFamily, protocol: L4Protocol) -> list[Entry]:
        if self.refuse_listing:
            raise ConntrackError("listing refused")
        self.listed += 1
        return [e for e in self.table if e.family is family and e.protocol is protocol]

    def clear(self, flt: Filter) -> int:
        if flt in self.refuse:
            raise ConntrackError(f"refused: {flt}")
        self.cleared.append(flt)
        kept = [e for e in self.table if not e.matches(flt)]
        deleted = len(self.table) - len(kept)
        self.table = kept
        return deleted


@dataclass
class CleanupResult:
    deleted: int = 0
    failed: list[tuple[Filter, str]] = field(default_factory=list)


# More filters than this for one family and protocol: list the table, run those that match.
LIST_ABOVE = 16


def apply(conntrack: Conntrack, filters: Iterable[Filter]) -> CleanupResult:
    """Run every filter that matches an entry; a failure is logged and counted, and the
    rest still run.

    Where a family and protocol have more than :data:`LIST_ABOVE` filters, the table is
    listed once for them first, and a filter that matches nothing there is not run: a
    churn that removes thousands of UDP endpoints per sync would otherwise cost one
    ``conntrack -D`` process each, minutes per sync (measured, bench.soak), although few
    of them ever had a flow. (Upstream's reconciler reads the table once per sync.) A
    few filters run directly: listing a busy node's table (DNS makes it large) costs
    more than a few deletions. The listing comes after the new rules are in, so a flow
    to a removed endpoint is in it. If the listing fails, every filter is run.
    """
    result = CleanupResult()
    filters = list(filters)
    per_key = Counter((f.family, f.protocol) for f in filters)
    present: dict[tuple[IPFamily, L4Protocol], _Present] = {}
    for key in sorted(k for k, n in per_key.items() if n > LIST_ABOVE):
        try:
            present[key] = _Present(conntrack.entries(*key))
        except ConntrackError as err:
            log.warning("Cannot list conntrack entries (%s); clearing by every filter", err)
    for flt in filters:
        listed = present.get((flt.family, flt.protocol))
        if listed is not None and not listed.matched(flt):
            continue
        try:
            deleted = conntrack.clear(flt)
        except ConntrackError as err:
            log.error("Failed to clear stale conntrack entries (%s): %s", flt.reason, err)
            result.failed.append((flt, str(err)))
            continue
        result.deleted += deleted
        log.debug("Cleared %d conntrack entries: %s (%s)", deleted, flt, flt.reason)
    return result


_MATCHED_FIELDS = ("orig_dst", "orig_dst_port", "reply_src", "reply_src_port")


class _Present:
    """Listed entries, indexed by each combination of the fields a filter may set."""

    def __init__(self, entries: list[Entry]) -> None:
        self._entries = entries
        self._index: dict[tuple[str, ...], set[tuple[str | int, ...]]] = {}

    def matched(self, flt: Filter) -> bool:
        shape = tuple(f for f in _MATCHED_FIELDS if getattr(flt, f) is not None)
        index = self._index.get(shape)
        if index is None:
            index = {tuple(_canonical(getattr(e, f)) for f in shape) for e in self._entries}
            self._index[shape] = index
        return tuple(_canonical(getattr(flt, f)) for f in shape) in index


def _canonical(value: str | int) -> str | int:
    if not isinstance(value, str) or PLAIN_IPV4.fullmatch(value):
        return value  # plain IPv4 is already canonical
    return str(ipaddress.ip_address(value))
