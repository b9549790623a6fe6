"""Connected UDP sockets, listed and destroyed through sock_diag netlink (as ``ss -K``).

Why: ebpf mode gives a connected UDP socket its endpoint inside ``connect()``, so there
is no conntrack entry to delete when that endpoint goes away (nftables mode's cleanup);
the socket itself must be told. ``SOCK_DESTROY`` (kernel ``CONFIG_INET_DIAG_DESTROY``)
makes the application's next ``send``/``recv`` fail with ``ECONNABORTED``, so it
reconnects and gets a live endpoint, as a client of nftables mode gets one on its next
datagram once the conntrack entry is gone.

* :func:`connected_udp` — the connected UDP sockets of one family in the calling
  thread's network namespace (sock_diag is per namespace);
* :func:`destroy` — one of them (through one :func:`session` for many: a netlink
  socket per destroyed socket cost 10-15 % more CPU in bench.ebpf_teardown);
* :func:`in_namespaces_of` — run a function once in each network namespace that the
  processes of a cgroup tree are in, from a thread of its own (``setns(2)`` moves only
  the calling thread, and this one ends when done).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
SOCK_DESTROY = 21
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
TCP_ESTABLISHED = 1  # a connected UDP socket's state
_CLONE_NEWNET = 0x40000000

_NLMSGHDR = struct.Struct("=IHHII")
# struct inet_diag_req_v2 {u8 family, protocol, ext, pad; u32 states; sockid}
_REQ = struct.Struct("=BBBxI")
# struct inet_diag_sockid {be16 sport, dport; be32 src[4], dst[4]; u32 if; u32 cookie[2]}
_SOCKID = struct.Struct("=2s2s16s16sIII")
# struct inet_diag_msg {u8 family, state, timer, retrans; sockid; u32 expires, ...}
_MSG = struct.Struct("=BBBB")

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True, slots=True)
class UdpSocket:
    """A connected UDP socket: its peer and cookie (``sockid``: the kernel's key)."""

    family: int
    peer: str
    peer_port: int
    cookie: int
    sockid: bytes


def _request(kind: int, flags: int, family: int, sockid: bytes = bytes(_SOCKID.size)) -> bytes:
    body = _REQ.pack(family, socket.IPPROTO_UDP, 0, 0xFFFFFFFF) + sockid
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, 1, 0) + body


def _messages(sock: socket.socket) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of every reply message up to DONE or the (one) ERROR/ACK."""
    while True:
        data = sock.recv(1 << 16)
        offset = 0
        while offset < len(data):
            length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
            yield kind, data[offset + _NLMSGHDR.size : offset + length]
            if kind in (NLMSG_DONE, NLMSG_ERROR):
                return
            offset += (length + 3) & ~3


def _netlink() -> socket.socket:
    return socket.socket(
        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG
    )


def connected_udp(family: int) -> list[UdpSocket]:
    """The connected UDP sockets of ``family`` (AF_INET or AF_INET6) in this namespace."""
    out = []
    with _netlink() as nl:
        nl.send(_request(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, family))
        for kind, payload in _messages(nl):
            if kind == NLMSG_ERROR:
                code = -int.from_bytes(payload[:4], "little", signed=True)
                raise OSError(code, f"sock_diag dump: {os.strerror(code)}")
            if kind != SOCK_DIAG_BY_FAMILY:
                continue
            fam, state, _, _ = _MSG.unpack_from(payload)
            if state != TCP_ESTABLISHED:
                continue
            sockid = payload[_MSG.size : _MSG.size + _SOCKID.size]
            _, dport, _, dst, _, low, high = _SOCKID.unpack(sockid)
            size = 4 if fam == socket.AF_INET else 16
            peer = socket.inet_ntop(fam, dst[:size])
            cookie = low | high << 32
            out.append(UdpSocket(fam, peer, int.from_bytes(dport, "big"), cookie, sockid))
    return out


def session() -> socket.socket:
    """A sock_diag netlink socket of this namespace, for several :func:`destroy` calls."""
    return _netlink()


def destroy(sock: UdpSocket, nl: socket.socket | None = None) -> bool:
    """Destroy ``sock`` (through ``nl``, from :func:`session`, or a socket of its own);
    False if it was gone already."""
    if nl is None:
        with _netlink() as own:
            return destroy(sock, own)
    nl.send(_request(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, sock.family, sock.sockid))
    for kind, payload in _messages(nl):
        if kind == NLMSG_ERROR:
            code = -int.from_bytes(payload[:4], "little", signed=True)
            if code in (0, errno.ENOENT):
                return code == 0
            raise OSError(code, f"SOCK_DESTROY {sock.peer}: {os.strerror(code)}")
    return False


def _namespaces(cgroup: Path) -> list[int]:
    """An open fd on each distinct network namespace of the processes under ``cgroup``."""
    seen: set[tuple[int, int]] = set()
    fds = []
    for procs in cgroup.rglob("cgroup.procs"):
        try:
            pids = procs.read_text().split()
        except OSError:
            continue  # a cgroup removed meanwhile
        for pid in pids:
            try:
                fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # the process exited
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) in seen:
                os.close(fd)
                continue
            seen.add((st.st_dev, st.st_ino))
            fds.append(fd)
    return fds


def in_namespaces_of(cgroup: Path, fn: Callable[[], None]) -> None:
    """Call ``fn`` in each network namespace of ``cgroup``'s processes (descendants
    included); the first error is raised after every namespace was tried."""
    errors: list[BaseException] = []

    def walk() -> None:
        fds = _namespaces(cgroup)
        try:
            for fd in fds:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    errors.append(OSError(code, f"setns: {os.strerror(code)}"))
                    continue
                try:
                    fn()
                except Exception as err:  # reported after the other namespaces
                    errors.append(err)
        finally:
            for fd in fds:
                os.close(fd)

    thread = threading.Thread(target=walk, name="sockdiag-netns")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
