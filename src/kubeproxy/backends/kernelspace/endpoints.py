"""The HNS endpoints kernelspace mode's load balancers use, by IP, reference-counted.

Upstream's winkernel proxier finds each endpoint of a Service among the network's HNS
endpoints by IP (a Pod on this node has one, made by the CNI; a remote endpoint may be
left from an earlier run) and otherwise creates a remote endpoint (Overlay: with the
provider address of the remote subnet; a MAC made from the IP, ``conjureMac``). Remote
endpoints are shared by every load balancer using the IP and counted; the last release
deletes the endpoint. A local (CNI) endpoint with the IP always wins, and is never
deleted by kube-proxy.

:class:`EndpointBook` holds that: :meth:`refresh` reads the network's endpoints (once a
sync), :meth:`acquire` hands out an ID (creating a remote endpoint when needed) and
counts a reference, :meth:`release` drops one. A delete HNS refuses is retried at the
next :meth:`refresh`.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable

import psutil

from kubeproxy.backends.kernelspace.translate import WantedEndpoint
from kubeproxy.dataplane.hns import Endpoint, Hns, HnsError

log = logging.getLogger(__name__)


def interface_mac(ip: str) -> str:
    """The MAC of the interface holding ``ip`` ("" if none does), dash-separated as HNS
    writes it: upstream's hostMac, for the source VIP and ClusterIP endpoints."""
    addrs = psutil.net_if_addrs()
    for nic in addrs.values():
        if any(a.address.split("%")[0] == ip for a in nic if a.family != psutil.AF_LINK):
            mac = next((a.address for a in nic if a.family == psutil.AF_LINK), "")
            return mac.replace(":", "-").lower()
    return ""


def conjure_mac(ip: str, prefix: str = "02-11") -> str:
    """Upstream's ``conjureMac``: a MAC for a remote endpoint, from its IP."""
    packed = ipaddress.ip_address(ip).packed
    tail = packed[:4] if len(packed) == 4 else packed[15:11:-1]
    return prefix + "".join(f"-{b:02x}" for b in tail)


class EndpointBook:
    """The network's endpoints by IP, and the references kube-proxy holds on remote ones."""

    def __init__(self, hns: Hns, network_id: str) -> None:
        self.hns = hns
        self.network_id = network_id
        self._by_ip: dict[str, Endpoint] = {}
        self._refs: dict[str, int] = {}  # remote endpoint IP -> load balancers using it
        self._doomed: dict[str, str] = {}  # IP -> ID of a remote endpoint to delete
        self.writes = 0

    def refresh(self) -> None:
        """Read the network's endpoints; retry the deletes HNS refused before."""
        for ip, ep_id in list(self._doomed.items()):
            self._delete(ip, ep_id)
        by_ip: dict[str, Endpoint] = {}
        for ep in self.hns.list_endpoints(self.network_id):
            for ip in ep.ip_addresses:
                # A local (CNI) endpoint wins over a remote one with the same IP.
                if ip not in by_ip or by_ip[ip].is_remote:
                    by_ip[ip] = ep
        self._by_ip = by_ip

    def by_ip(self, ip: str) -> Endpoint | None:
        return self._by_ip.get(ip)

    def by_name(self, name: str) -> Endpoint | None:
        return next((ep for ep in self._by_ip.values() if ep.name == name), None)

    @property
    def remote_count(self) -> int:
        return sum(1 for n in self._refs.values() if n > 0)

    def refs(self, ip: str) -> int:
        return self._refs.get(ip, 0)

    def acquire(self, wanted: WantedEndpoint) -> tuple[str, bool]:
        """The ID of the endpoint for ``wanted`` and whether it is a remote one (then a
        reference is counted); raises :class:`HnsError` (creating failed, or a local
        one is missing)."""
        found = self._by_ip.get(wanted.ip)
        if found is not None and not found.is_remote:
            return found.id, False
        if found is None:
            if wanted.local:
                raise HnsError(
                    f"local endpoint {wanted.ip} not found on the network (not yet made by "
                    "the CNI?)",
                    operation="get_endpoint_by_ip",
                )
            found = self._create(wanted)
        self._refs[wanted.ip] = self._refs.get(wanted.ip, 0) + 1
        return found.id, True

    def _create(self, wanted: WantedEndpoint) -> Endpoint:
        overlay = bool(wanted.provider_address)
        doc = Endpoint(
            ip_addresses=(wanted.ip,),
            mac_address=wanted.mac or (conjure_mac(wanted.ip) if overlay else ""),
            is_remote=True,
            provider_address=wanted.provider_address,
        )
        self.writes += 1
        created = self.hns.create_endpoint(self.network_id, doc)
        self._by_ip[wanted.ip] = created
        self._doomed.pop(wanted.ip, None)
        return created

    def ensure_local(self, ip: str, mac: str) -> None:
        """Upstream's source VIP endpoint (Overlay): a local endpoint with the source VIP
        and the host's MAC, made when the network has none with that IP."""
        if ip in self._by_ip:
            return
        self.writes += 1
        doc = Endpoint(ip_addresses=(ip,), mac_address=mac)
        self._by_ip[ip] = self.hns.create_endpoint(self.network_id, doc)

    def release(self, ips: Iterable[str]) -> None:
        """Drop one reference on each remote endpoint IP; delete those at zero."""
        for ip in ips:
            left = self._refs.get(ip, 0) - 1
            if left > 0:
                self._refs[ip] = left
                continue
            self._refs.pop(ip, None)
            ep = self._by_ip.get(ip)
            if ep is not None and ep.is_remote:
                self._delete(ip, ep.id)

    def _delete(self, ip: str, ep_id: str) -> None:
        if self._refs.get(ip, 0) > 0:  # taken again since
            self._doomed.pop(ip, None)
            return
        self.writes += 1
        try:
            self.hns.delete_endpoint(ep_id)
        except HnsError as err:
            if err.incomplete:
                raise
            if not err.not_found:
                log.warning("Deleting remote endpoint %s (%s) failed, retrying: %s", ip, ep_id, err)
                self._doomed[ip] = ep_id
                return
        self._doomed.pop(ip, None)
        if self._by_ip.get(ip) is not None and self._by_ip[ip].id == ep_id:
            del self._by_ip[ip]
