"""IPVS generic-netlink and rtnetlink address messages, packed and parsed with ``struct``
(pure: bytes in, bytes out), and the batch transport that sends many per ``send``.

Why not pyroute2's message classes: encoding one IPVS message through them costs
~0.5-1 ms (bench/RESULTS.md, "IPVS floor"), so 10,000 Services x 10 endpoints spend
~85 s in the encoder for 0.7 s of kernel work. The attribute set is small and fixed
(``include/uapi/linux/ip_vs.h``), so it is packed here directly.

* :func:`change_message` — one :class:`~.Change` (``IPVS_CMD_NEW/SET/DEL_SERVICE``,
  ``IPVS_CMD_NEW/SET/DEL_DEST``); :func:`timeouts_message` (``IPVS_CMD_SET_CONFIG``);
  :func:`dump_services_message` / :func:`dump_dests_message` the dump requests;
  :func:`family_request` / :func:`parse_family_id` the generic-netlink family number;
* :func:`parse_service` / :func:`parse_dest` — one dump reply back to data (fwmark
  services and unknown protocols give None: never ours);
* :func:`address_message` — ``RTM_NEWADDR``/``RTM_DELADDR`` for ``kube-ipvs0``;
  :func:`dump_addresses_message` / :func:`parse_address` every address of the namespace;
* :class:`Batch` — the transport over a netlink socket: messages go out in chunks of a
  few hundred (one ``send`` each), only the last of each chunk asks for an
  acknowledgement, and the kernel's error answers (it sends them unasked) are mapped
  back to the message they answer by sequence number; :meth:`Batch.ask` sends one
  request and reads its answers (a dump, or data and an acknowledgement).

Byte order as the kernel reads it: ports and the IPv4 netmask in network order, every
other integer in host order; addresses as their 4 or 16 bytes. The weight and the
timeouts are packed signed, as the kernel's ``int`` fields they land in.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kubeproxy.dataplane.ipvs import (
    FLAG_HASHED,
    FLAGS_MASK,
    FWD_MASQ,
    Change,
    Destination,
    Op,
    ServiceKey,
    VirtualServer,
)

# linux/netlink.h
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10  # error answers without a copy of the request: fixed 36 bytes
NETLINK_ROUTE = 0
NETLINK_GENERIC = 16

# linux/ip_vs.h
GENL_VERSION = 1
CMD_NEW_SERVICE, CMD_SET_SERVICE, CMD_DEL_SERVICE, CMD_GET_SERVICE = 1, 2, 3, 4
CMD_NEW_DEST, CMD_SET_DEST, CMD_DEL_DEST, CMD_GET_DEST = 5, 6, 7, 8
CMD_SET_CONFIG = 12
CMD_ATTR_SERVICE, CMD_ATTR_DEST = 1, 2
CMD_ATTR_TIMEOUT_TCP, CMD_ATTR_TIMEOUT_TCP_FIN, CMD_ATTR_TIMEOUT_UDP = 4, 5, 6
SVC_AF, SVC_PROTOCOL, SVC_ADDR, SVC_PORT, SVC_FWMARK = 1, 2, 3, 4, 5
SVC_SCHED_NAME, SVC_FLAGS, SVC_TIMEOUT, SVC_NETMASK = 6, 7, 8, 9
DEST_ADDR, DEST_PORT, DEST_FWD_METHOD, DEST_WEIGHT = 1, 2, 3, 4
DEST_U_THRESH, DEST_L_THRESH, DEST_ACTIVE_CONNS, DEST_INACT_CONNS = 5, 6, 7, 8
DEST_ADDR_FAMILY = 11
NLA_F_NESTED = 0x8000

# linux/genetlink.h
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2

# linux/rtnetlink.h, linux/if_addr.h
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
IFA_ADDRESS, IFA_LOCAL = 1, 2

PROTO_NUMBERS = {"TCP": socket.IPPROTO_TCP, "UDP": socket.IPPROTO_UDP, "SCTP": 132}
PROTO_NAMES = {v: k for k, v in PROTO_NUMBERS.items()}
_COMMANDS = {
    Op.ADD_SERVICE: CMD_NEW_SERVICE,
    Op.SET_SERVICE: CMD_SET_SERVICE,
    Op.DELETE_SERVICE: CMD_DEL_SERVICE,
    Op.ADD_DEST: CMD_NEW_DEST,
    Op.SET_DEST: CMD_SET_DEST,
    Op.DELETE_DEST: CMD_DEL_DEST,
}
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_ATTR = struct.Struct("=HH")
_U16 = struct.Struct("=H")
_U32 = struct.Struct("=I")
# The weight and the timeouts are u32 attributes the kernel reads into ints: packed
# signed, a negative value reaches the kernel, which refuses it (ERANGE, EINVAL).
_I32 = struct.Struct("=i")
_BE16 = struct.Struct("!H")
# Messages per send: ~40 KB of requests, and at most as many 36-byte error answers,
# well under the socket buffers.
CHUNK = 400
ANSWER_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Message:
    """One netlink request without its header (the transport numbers it)."""

    type: int
    flags: int
    body: bytes


def _attr(kind: int, value: bytes) -> bytes:
    length = 4 + len(value)
    return _ATTR.pack(length, kind) + value + b"\0" * (-length & 3)


def _family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def _packed(address: str) -> bytes:
    return socket.inet_pton(_family(address), address)


def _service_key(key: ServiceKey) -> bytes:
    return b"".join(
        (
            _attr(SVC_AF, _U16.pack(_family(key.address))),
            _attr(SVC_PROTOCOL, _U16.pack(PROTO_NUMBERS[key.protocol])),
            _attr(SVC_ADDR, _packed(key.address)),
            _attr(SVC_PORT, _BE16.pack(key.port)),
        )
    )


def _service(key: ServiceKey, vs: VirtualServer | None) -> bytes:
    attrs = _service_key(key)
    if vs is not None:
        # The kernel reads the IPv4 netmask as a be32 and the IPv6 one as a prefix
        # length in host order (as ipvsadm sends them).
        netmask = _U32.pack(128) if key.v6 else b"\xff\xff\xff\xff"
        attrs += b"".join(
            (
                _attr(SVC_SCHED_NAME, vs.scheduler.encode() + b"\0"),
                _attr(SVC_FLAGS, struct.pack("=II", vs.flags, FLAGS_MASK)),
                _attr(SVC_TIMEOUT, _U32.pack(vs.timeout)),
                _attr(SVC_NETMASK, netmask),
            )
        )
    return _attr(CMD_ATTR_SERVICE | NLA_F_NESTED, attrs)


def _dest(dest: Destination, full: bool) -> bytes:
    attrs = [
        _attr(DEST_ADDR, _packed(dest.address)),
        _attr(DEST_PORT, _BE16.pack(dest.port)),
        _attr(DEST_ADDR_FAMILY, _U16.pack(_family(dest.address))),
    ]
    if full:
        attrs += [
            _attr(DEST_FWD_METHOD, _U32.pack(FWD_MASQ)),
            _attr(DEST_WEIGHT, _I32.pack(dest.weight)),
            _attr(DEST_U_THRESH, _U32.pack(0)),
            _attr(DEST_L_THRESH, _U32.pack(0)),
        ]
    return _attr(CMD_ATTR_DEST | NLA_F_NESTED, b"".join(attrs))


def _genl(cmd: int) -> bytes:
    return struct.pack("=BBH", cmd, GENL_VERSION, 0)


def change_body(change: Change) -> bytes:
    """The generic-netlink payload (genlmsghdr and attributes) of ``change``."""
    head = _genl(_COMMANDS[change.op])
    if change.dest is None:
        return head + _service(change.key, change.service)
    full = change.op is not Op.DELETE_DEST
    return head + _service(change.key, None) + _dest(change.dest, full)


def attributes(data: bytes | memoryview, offset: int = 0) -> dict[int, memoryview]:
    """Netlink attributes from ``offset`` to the end, by type (the last one wins)."""
    view = memoryview(data)
    out = {}
    end = len(view)
    while offset + 4 <= end:
        length, kind = _ATTR.unpack_from(view, offset)
        if length < 4:
            break
        out[kind & NLA_TYPE_MASK] = view[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return out


def _u32(attrs: dict[int, memoryview], kind: int) -> int:
    value = attrs.get(kind)
    return int(_U32.unpack_from(value)[0]) if value is not None and len(value) >= 4 else 0


def _address(value: memoryview | None, af: int) -> str | None:
    if value is None:
        return None
    if af == socket.AF_INET6:
        # Written as ipaddress writes it (canonical_ip), which differs from inet_ntop
        # for IPv4-mapped addresses.
        return str(ipaddress.IPv6Address(bytes(value[:16]))) if len(value) >= 16 else None
    return socket.inet_ntop(af, bytes(value[:4])) if len(value) >= 4 else None


def parse_service(payload: bytes | memoryview) -> VirtualServer | None:
    """A ``IPVS_CMD_NEW_SERVICE`` dump reply (its payload after the nlmsghdr)."""
    outer = attributes(payload, 4)
    nested = outer.get(CMD_ATTR_SERVICE)
    if nested is None:
        return None
    a = attributes(nested)
    if _u32(a, SVC_FWMARK):
        return None  # firewall-mark services are never ours
    af = _U16.unpack_from(a[SVC_AF])[0] if SVC_AF in a else socket.AF_INET
    proto = PROTO_NAMES.get(_U16.unpack_from(a[SVC_PROTOCOL])[0] if SVC_PROTOCOL in a else 0)
    address = _address(a.get(SVC_ADDR), af)
    if proto is None or address is None or SVC_PORT not in a:
        return None
    sched = bytes(a.get(SVC_SCHED_NAME, b"")).split(b"\0", 1)[0].decode()
    flags = _u32(a, SVC_FLAGS) & ~FLAG_HASHED
    port = _BE16.unpack_from(a[SVC_PORT])[0]
    return VirtualServer(ServiceKey(address, proto, port), sched, flags, _u32(a, SVC_TIMEOUT))


def parse_dest(payload: bytes | memoryview, service_af: int) -> Destination | None:
    """A ``IPVS_CMD_NEW_DEST`` dump reply (its payload after the nlmsghdr)."""
    nested = attributes(payload, 4).get(CMD_ATTR_DEST)
    if nested is None:
        return None
    a = attributes(nested)
    af = _U16.unpack_from(a[DEST_ADDR_FAMILY])[0] if DEST_ADDR_FAMILY in a else service_af
    address = _address(a.get(DEST_ADDR), af)
    if address is None or DEST_PORT not in a:
        return None
    return Destination(
        address,
        _BE16.unpack_from(a[DEST_PORT])[0],
        _u32(a, DEST_WEIGHT),
        _u32(a, DEST_ACTIVE_CONNS),
        _u32(a, DEST_INACT_CONNS),
    )


def family_request(name: str) -> Message:
    """``CTRL_CMD_GETFAMILY``: the number of generic-netlink family ``name`` (the kernel
    loads its module on demand, as for ``ip_vs``)."""
    return Message(GENL_ID_CTRL, NLM_F_REQUEST, struct.pack("=BBH", CTRL_CMD_GETFAMILY, 1, 0)
                   + _attr(CTRL_ATTR_FAMILY_NAME, name.encode() + b"\0"))  # fmt: skip


def parse_family_id(payload: bytes | memoryview) -> int | None:
    value = attributes(payload, 4).get(CTRL_ATTR_FAMILY_ID)
    return None if value is None else int(_U16.unpack_from(value)[0])


def timeouts_message(family: int, tcp: int, tcp_fin: int, udp: int) -> Message:
    """``IPVS_CMD_SET_CONFIG`` (``ipvsadm --set``): 0 leaves that timeout as it is."""
    attrs = b"".join(_attr(kind, _I32.pack(v)) for kind, v in
                     ((CMD_ATTR_TIMEOUT_TCP, tcp), (CMD_ATTR_TIMEOUT_TCP_FIN, tcp_fin),
                      (CMD_ATTR_TIMEOUT_UDP, udp)))  # fmt: skip
    return Message(family, NLM_F_REQUEST, _genl(CMD_SET_CONFIG) + attrs)


def change_message(family: int, change: Change) -> Message:
    return Message(family, NLM_F_REQUEST, change_body(change))


def dump_services_message(family: int) -> Message:
    return Message(family, NLM_F_REQUEST, _genl(CMD_GET_SERVICE))


def dump_dests_message(family: int, key: ServiceKey) -> Message:
    return Message(family, NLM_F_REQUEST, _genl(CMD_GET_DEST) + _service(key, None))


def dump_addresses_message() -> Message:
    return Message(RTM_GETADDR, NLM_F_REQUEST, struct.pack("=BBBBI", 0, 0, 0, 0, 0))


def address_index(payload: bytes | memoryview) -> int | None:
    """The interface index of an ``RTM_NEWADDR`` answer, without parsing the rest."""
    return int(struct.unpack_from("=I", payload, 4)[0]) if len(payload) >= 8 else None


def parse_address(payload: bytes | memoryview) -> tuple[int, str] | None:
    """An ``RTM_NEWADDR`` dump answer: (interface index, the local address).

    A point-to-point address (``ip addr add LOCAL peer PEER``: a veth to a Pod, as some
    network plugins set up) carries the peer in ``IFA_ADDRESS`` and the node's own
    address in ``IFA_LOCAL``, as iproute2 and upstream's netlink library read it."""
    if len(payload) < 8:
        return None
    af, _, _, _, index = struct.unpack_from("=BBBBI", payload)
    attrs = attributes(payload, 8)
    value = attrs.get(IFA_LOCAL, attrs.get(IFA_ADDRESS))
    if af not in (socket.AF_INET, socket.AF_INET6):
        return None
    address = _address(value, af)
    return None if address is None else (index, address)


def address_message(add: bool, index: int, address: str) -> Message:
    """``ip addr add|del ADDRESS/32|128 dev INDEX`` (scope global, as upstream binds)."""
    af = _family(address)
    raw = _packed(address)
    body = struct.pack("=BBBBI", af, len(raw) * 8, 0, 0, index) + _attr(IFA_LOCAL, raw)
    body += _attr(IFA_ADDRESS, raw)
    if add:
        return Message(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL, body)
    return Message(RTM_DELADDR, NLM_F_REQUEST, body)


def split(data: bytes | memoryview) -> Iterator[tuple[int, int, int, memoryview]]:
    """(type, flags, sequence, payload) of each message in one read."""
    view = memoryview(data)
    offset = 0
    while offset + _HEADER.size <= len(view):
        length, kind, flags, seq, _ = _HEADER.unpack_from(view, offset)
        if length < _HEADER.size:
            break
        yield kind, flags, seq, view[offset + _HEADER.size : offset + length]
        offset += (length + 3) & ~3


class Batch:
    """Requests over one netlink socket: many per ``send``, errors mapped back to each.

    Not thread-safe: the caller confines it to one thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.seq = 0
        # For tests and benchmarks that count round trips and changes.
        self.sends = 0
        self.messages = 0
        sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        # The kernel answers at once; a lost answer fails the exchange instead of
        # hanging the sync (later answers to it are told apart by sequence number).
        sock.settimeout(ANSWER_TIMEOUT)

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _header(self, message: Message, seq: int, flags: int = 0) -> bytes:
        length = _HEADER.size + len(message.body)
        return _HEADER.pack(length, message.type, message.flags | flags, seq, 0) + message.body

    def _recv(self) -> bytes:
        return self.sock.recv(1 << 20)

    def _send(self, data: bytes) -> None:
        self.sock.send(data)
        self.sends += 1

    def run(self, messages: Sequence[Message]) -> list[int]:
        """Send every message in order; the errno each got (0: done). The kernel goes
        on after a refused message, as separate requests would. OSError if the socket
        itself fails."""
        codes = [0] * len(messages)
        self.messages += len(messages)
        for start in range(0, len(messages), CHUNK):
            chunk = messages[start : start + CHUNK]
            if self.seq + len(chunk) > 0x7FFFFFFF:
                self.seq = 0  # sequence numbers are u32: start over, well before
            first = self.seq + 1
            parts = [self._header(m, self._next()) for m in chunk[:-1]]
            last = self._next()
            parts.append(self._header(chunk[-1], last, NLM_F_ACK))
            self._send(b"".join(parts))
            done = False
            while not done:
                for kind, _, seq, payload in split(self._recv()):
                    if kind != NLMSG_ERROR or not first <= seq <= last:
                        continue  # a stale answer of an earlier, failed exchange
                    code = -struct.unpack_from("=i", payload)[0]
                    codes[start + seq - first] = code
                    done = done or seq == last
        return codes

    def ask(self, message: Message, dump: bool = False) -> list[memoryview]:
        """The payloads of the answers to one request (a dump, or a request answered with
        data and an acknowledgement). OSError with the kernel's errno if refused."""
        if self.seq >= 0x7FFFFFFF:
            self.seq = 0
        seq = self._next()
        self._send(self._header(message, seq, NLM_F_DUMP if dump else NLM_F_ACK))
        out: list[memoryview] = []
        while True:
            for kind, _, got, payload in split(self._recv()):
                if got != seq:
                    continue
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", payload)[0]
                    if code:
                        raise OSError(code, errno.errorcode.get(code, str(code)))
                    return out
                out.append(payload)
