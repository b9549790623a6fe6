"""IPVS and the dummy link over netlink, with pyroute2 (no ``ipvsadm`` process per change).

:class:`NetlinkIpvs` implements :class:`~kubeproxy.dataplane.ipvs.Ipvs` on pyroute2's
generic-netlink ``IPVS`` socket; :class:`NetlinkLinks` implements
:class:`~kubeproxy.dataplane.ipvs.Links` on ``IPRoute``. Both work in another network
namespace when given its name (the socket is opened there).

pyroute2 0.9's IPVS helpers have traps this module steps around:

* ``IPVSDest`` defaults to direct routing (``fwd_method=3``): every destination here is
  written with ``fwd_method=0`` (NAT), as upstream kube-proxy's.
* ``IPVSDest.from_message()``/``IPVSService.from_message()`` report their defaults for
  some fields instead of what the kernel sent: listings read the attributes themselves.
* ``service("update")`` sends a *delete*: changes use ``"set"``.
* ``IPVS_CMD_SET_CONFIG``'s timeouts are mapped as raw bytes; :meth:`set_timeouts` packs
  them as the u32 the kernel reads.
* A service add needs the netmask attribute in both families; for IPv6 the kernel reads
  it as the prefix length (128) in host byte order, as ipvsadm sends it.

Opening :class:`NetlinkIpvs` is the check that the kernel has IPVS: the ``IPVS`` generic
netlink family exists once ``ip_vs`` is loaded (the kernel loads it on demand where the
module is available).
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pyroute2 import IPVS, IPRoute, IPVSDest, IPVSService
from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.generic import ipvs as genl_ipvs

from kubeproxy.dataplane.ipvs import (
    FLAG_HASHED,
    FLAGS_MASK,
    FWD_MASQ,
    Destination,
    IpvsError,
    ServiceKey,
    VirtualServer,
)

T = TypeVar("T")
_PROTO_NUMBERS = {"TCP": socket.IPPROTO_TCP, "UDP": socket.IPPROTO_UDP, "SCTP": 132}
_PROTO_NAMES = {v: k for k, v in _PROTO_NUMBERS.items()}
_V6_NETMASK = ".".join(str(b) for b in struct.pack("=I", 128))


def _error(err: NetlinkError, what: str) -> IpvsError:
    code = int(err.code)
    return IpvsError(f"{what}: {errno.errorcode.get(code, code)} ({err})", code)


class _Confined:
    """Runs every netlink call on one thread of its own: pyroute2's synchronous sockets
    drive an asyncio loop of the calling thread, which fails on a thread whose loop is
    already running (the proxy's), and a socket is best used from one thread."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._pool.submit(fn, *args, **kwargs).result()

    def _shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class NetlinkIpvs(_Confined):
    def __init__(self, netns: str | None = None) -> None:
        super().__init__("ipvs-netlink")
        try:
            self.sock = self._call(lambda: IPVS(netns=netns) if netns else IPVS())
        except (NetlinkError, OSError) as err:
            self._shutdown()
            raise IpvsError(f"the kernel has no IPVS ({err})", errno.ENOENT) from None

    def close(self) -> None:
        self._call(self.sock.close)
        self._shutdown()

    # ---------------------------------------------------------------- requests

    @staticmethod
    def _service_arg(key: ServiceKey, vs: VirtualServer | None = None) -> Any:
        fields: dict[str, Any] = {
            "af": socket.AF_INET6 if key.v6 else socket.AF_INET,
            "addr": key.address,
            "port": key.port,
            "protocol": _PROTO_NUMBERS[key.protocol],
            "netmask": _V6_NETMASK if key.v6 else "255.255.255.255",
        }
        if vs is not None:
            fields["sched_name"] = vs.scheduler
            fields["flags"] = {"flags": vs.flags, "mask": FLAGS_MASK}
            fields["timeout"] = vs.timeout
        return IPVSService(**fields)

    @staticmethod
    def _dest_arg(dest: Destination) -> Any:
        return IPVSDest(
            addr=dest.address,
            addr_family=socket.AF_INET6 if ":" in dest.address else socket.AF_INET,
            port=dest.port,
            weight=dest.weight,
            fwd_method=FWD_MASQ,
        )

    def services(self) -> list[VirtualServer]:
        try:
            msgs = self._call(lambda: list(self.sock.service("dump")))
        except NetlinkError as err:
            raise _error(err, "list IPVS services") from None
        out = []
        for msg in msgs:
            svc = msg.get_attr("IPVS_CMD_ATTR_SERVICE")
            if svc is None or svc.get_attr("IPVS_SVC_ATTR_FWMARK"):
                continue  # firewall-mark services are never ours
            proto = _PROTO_NAMES.get(svc.get_attr("IPVS_SVC_ATTR_PROTOCOL"))
            addr = svc.get_attr("IPVS_SVC_ATTR_ADDR")
            if proto is None or addr is None:
                continue
            flags = svc.get_attr("IPVS_SVC_ATTR_FLAGS") or {}
            out.append(
                VirtualServer(
                    ServiceKey(str(addr), proto, int(svc.get_attr("IPVS_SVC_ATTR_PORT"))),
                    scheduler=str(svc.get_attr("IPVS_SVC_ATTR_SCHED_NAME")),
                    flags=int(flags.get("flags", 0)) & ~FLAG_HASHED,
                    timeout=int(svc.get_attr("IPVS_SVC_ATTR_TIMEOUT") or 0),
                )
            )
        return out

    def destinations(self, key: ServiceKey) -> list[Destination]:
        try:
            service = self._service_arg(key)
            msgs = self._call(lambda: list(self.sock.dest("dump", service=service)))
        except NetlinkError as err:
            raise _error(err, f"list destinations of {key}") from None
        out = []
        for msg in msgs:
            d = msg.get_attr("IPVS_CMD_ATTR_DEST")
            if d is None:
                continue
            out.append(
                Destination(
                    str(d.get_attr("IPVS_DEST_ATTR_ADDR")),
                    int(d.get_attr("IPVS_DEST_ATTR_PORT")),
                    int(d.get_attr("IPVS_DEST_ATTR_WEIGHT") or 0),
                    int(d.get_attr("IPVS_DEST_ATTR_ACTIVE_CONNS") or 0),
                    int(d.get_attr("IPVS_DEST_ATTR_INACT_CONNS") or 0),
                )
            )
        return out

    def _service(self, command: str, key: ServiceKey, vs: VirtualServer | None) -> None:
        try:
            self._call(self.sock.service, command, service=self._service_arg(key, vs))
        except NetlinkError as err:
            raise _error(err, f"{command} IPVS service {key}") from None

    def add_service(self, vs: VirtualServer) -> None:
        self._service("add", vs.key, vs)

    def set_service(self, vs: VirtualServer) -> None:
        self._service("set", vs.key, vs)

    def delete_service(self, key: ServiceKey) -> None:
        self._service("del", key, None)

    def _dest(self, command: str, key: ServiceKey, dest: Destination) -> None:
        try:
            self._call(
                self.sock.dest, command, service=self._service_arg(key), dest=self._dest_arg(dest)
            )
        except NetlinkError as err:
            raise _error(err, f"{command} destination {dest} of {key}") from None

    def add_destination(self, key: ServiceKey, dest: Destination) -> None:
        self._dest("add", key, dest)

    def set_destination(self, key: ServiceKey, dest: Destination) -> None:
        self._dest("set", key, dest)

    def delete_destination(self, key: ServiceKey, address: str, port: int) -> None:
        self._dest("del", key, Destination(address, port))

    def set_timeouts(self, tcp: int, tcp_fin: int, udp: int) -> None:
        msg = genl_ipvs.ipvsmsg()
        msg["cmd"] = genl_ipvs.IPVS_CMD_SET_CONFIG
        msg["version"] = genl_ipvs.GENL_VERSION
        # The kernel reads each as a u32 (0: leave that timeout as it is).
        msg["attrs"] = [
            ("IPVS_CMD_ATTR_TIMEOUT_TCP", struct.pack("=I", tcp)),
            ("IPVS_CMD_ATTR_TIMEOUT_TCP_FIN", struct.pack("=I", tcp_fin)),
            ("IPVS_CMD_ATTR_TIMEOUT_UDP", struct.pack("=I", udp)),
        ]
        try:
            self._call(
                lambda: tuple(
                    self.sock.nlm_request(
                        msg, msg_type=self.sock.prid, msg_flags=NLM_F_REQUEST | NLM_F_ACK
                    )
                )
            )
        except NetlinkError as err:
            raise _error(err, "set IPVS timeouts") from None


class NetlinkLinks(_Confined):
    def __init__(self, netns: str | None = None) -> None:
        super().__init__("links-netlink")
        self.ipr = self._call(lambda: IPRoute(netns=netns) if netns else IPRoute())

    def close(self) -> None:
        self._call(self.ipr.close)
        self._shutdown()

    def _index(self, name: str) -> int | None:
        found = self._call(self.ipr.link_lookup, ifname=name)
        return int(found[0]) if found else None

    def exists(self, name: str) -> bool:
        return self._index(name) is not None

    def ensure_dummy(self, name: str) -> bool:
        if self._index(name) is not None:
            return True
        try:
            self._call(self.ipr.link, "add", ifname=name, kind="dummy")
        except NetlinkError as err:
            raise _error(err, f"create dummy link {name}") from None
        return False

    def _addrs(self, index: int | None) -> set[str]:
        kwargs = {} if index is None else {"index": index}
        return {
            str(a.get_attr("IFA_ADDRESS"))
            for a in self._call(lambda: list(self.ipr.get_addr(**kwargs)))
            if a.get_attr("IFA_ADDRESS") is not None
        }

    def addresses(self, name: str) -> set[str]:
        index = self._index(name)
        return set() if index is None else self._addrs(index)

    def _addr(self, command: str, name: str, address: str) -> None:
        index = self._index(name)
        if index is None:
            raise IpvsError(f"no link {name}", errno.ENODEV)
        prefix = 128 if ":" in address else 32
        try:
            self._call(self.ipr.addr, command, index=index, address=address, prefixlen=prefix)
        except NetlinkError as err:
            raise _error(err, f"{command} address {address} on {name}") from None

    def add_address(self, name: str, address: str) -> None:
        self._addr("add", name, address)

    def delete_address(self, name: str, address: str) -> None:
        self._addr("del", name, address)

    def node_addresses(self, exclude: str) -> set[str]:
        skip = self._index(exclude)
        out = set()
        for a in self._call(lambda: list(self.ipr.get_addr())):
            if skip is not None and a["index"] == skip:
                continue
            addr = a.get_attr("IFA_ADDRESS")
            if addr is not None:
                out.add(str(addr))
        return out

    def delete_link(self, name: str) -> bool:
        index = self._index(name)
        if index is None:
            return False
        try:
            self._call(self.ipr.link, "del", index=index)
        except NetlinkError as err:
            raise _error(err, f"delete link {name}") from None
        return True
