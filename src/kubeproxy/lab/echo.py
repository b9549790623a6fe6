"""Tiny "who answered?" servers and clients for Pods in the lab.

A Pod's server answers every TCP connection and every UDP datagram with one line,
``<pod-name> <client-ip>``: the name shows which endpoint the proxy chose, the address
shows whether the client was masqueraded. Servers run in a thread inside the Pod's
namespace (see :mod:`kubeproxy.lab.netns`); clients are plain functions meant to be run
the same way.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Reply:
    pod: str
    client_ip: str

    @classmethod
    def parse(cls, line: str) -> Reply:
        pod, _, client = line.strip().partition(" ")
        return cls(pod, client)


class EchoServer:
    """Serves TCP and UDP on the given ports on all addresses (both families)."""

    def __init__(self, name: str, ports: tuple[int, ...] = (8080,)) -> None:
        self.name = name
        self.ports = ports
        self._sel = selectors.DefaultSelector()
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def start_in(self, netns: str) -> None:
        from kubeproxy.lab.netns import enter_netns

        def main() -> None:
            try:
                enter_netns(netns)
                self._bind()
            except BaseException as err:  # reported to the caller of start_in
                self.error = err
                self.ready.set()
                return
            self.ready.set()
            self._serve()

        self._thread = threading.Thread(target=main, name=f"echo-{self.name}", daemon=True)
        self._thread.start()
        self.ready.wait(10)
        if self.error is not None:
            raise self.error

    def _bind(self) -> None:
        for port in self.ports:
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                s = _dual_stack_socket(kind)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("::" if s.family == socket.AF_INET6 else "0.0.0.0", port))
                if kind == socket.SOCK_STREAM:
                    s.listen(512)
                s.setblocking(False)
                self._sel.register(s, selectors.EVENT_READ)
        self._sel.register(self._stop_r, selectors.EVENT_READ)

    def _answer(self, peer: str) -> bytes:
        ip = peer.removeprefix("::ffff:")
        return f"{self.name} {ip}\n".encode()

    def _serve(self) -> None:
        while True:
            for key, _ in self._sel.select():
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._stop_r:
                    self._close()
                    return
                with contextlib.suppress(OSError):
                    if sock.type == socket.SOCK_STREAM:
                        conn, peer = sock.accept()
                        with conn:
                            conn.setblocking(True)
                            conn.settimeout(2)
                            conn.sendall(self._answer(peer[0]))
                    else:
                        _, peer = sock.recvfrom(2048)
                        sock.sendto(self._answer(peer[0]), peer)

    def _close(self) -> None:
        for key in list(self._sel.get_map().values()):
            self._sel.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._stop_w.send(b"x")
        if self._thread is not None:
            self._thread.join(5)
        self._stop_w.close()


def _dual_stack_socket(kind: socket.SocketKind) -> socket.socket:
    """An IPv6 socket that also accepts IPv4, or plain IPv4 where IPv6 is disabled."""
    try:
        s = socket.socket(socket.AF_INET6, kind)
    except OSError:
        return socket.socket(socket.AF_INET, kind)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    return s


def family_of(ip: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def tcp_ask(ip: str, port: int, timeout: float = 2.0) -> Reply:
    """Connect, read the one-line answer. Raises ConnectionRefusedError, TimeoutError..."""
    with socket.socket(family_of(ip), socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect((ip, port))
        return read_reply(s)


def read_reply(s: socket.socket) -> Reply:
    """The server's one-line answer on a connected TCP socket."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(256)
        if not chunk:
            break
        data += chunk
    return Reply.parse(data.decode())


def udp_ask(ip: str, port: int, timeout: float = 1.0, sock: socket.socket | None = None) -> Reply:
    """Send one datagram and wait for the answer (TimeoutError if none)."""
    own = sock is None
    s = sock or socket.socket(family_of(ip), socket.SOCK_DGRAM)
    try:
        s.settimeout(timeout)
        s.sendto(b"?", (ip, port))
        data, _ = s.recvfrom(256)
        return Reply.parse(data.decode())
    finally:
        if own:
            s.close()


def udp_ask_connected(ip: str, port: int, timeout: float = 1.0) -> Reply:
    """:func:`udp_ask` on a connected socket: an ICMP port unreachable (REJECT) raises
    ConnectionRefusedError instead of passing as a timeout (DROP)."""
    with socket.socket(family_of(ip), socket.SOCK_DGRAM) as s:
        s.connect((ip, port))
        return udp_ask(ip, port, timeout, sock=s)


def outcome(fn: object, *args: object) -> str:
    """Run a client call and describe the result in one word or the pod that answered."""
    try:
        reply = fn(*args)  # type: ignore[operator]
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as err:
        return f"error:{err.errno}"
    assert isinstance(reply, Reply)
    return reply.pod


def tally(fn: object, *args: object, count: int) -> dict[str, int]:
    """Ask ``count`` times; how many answers came from each pod (or each failure kind)."""
    seen: dict[str, int] = {}
    for _ in range(count):
        key = outcome(fn, *args)
        seen[key] = seen.get(key, 0) + 1
    return seen
