"""A long-lived TCP connection through a Service, carrying data all the time.

:class:`StreamEcho` runs in a Pod's namespace and echoes every byte back on each
connection. :class:`LongFlow` connects once, from another namespace, and then sends a
numbered line every ``interval`` seconds and waits for its echo, remembering when each
round trip completed: a test asks how many round trips completed in a time window (say,
while the proxy was dead) and whether the connection ever failed. Nothing is retried: a
reset, a wrong echo or a round trip slower than ``stall`` seconds ends the flow with
:attr:`LongFlow.error` set.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import selectors
import socket
import threading
import time

from kubeproxy.lab.netns import enter_netns


class StreamEcho:
    """Echo server on one TCP port in namespace ``netns`` (a thread; :meth:`stop` ends it)."""

    def __init__(self, netns: str, port: int) -> None:
        self._stop_r, self._stop_w = socket.socketpair()
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=self._main, args=(netns, port), name=f"stream-echo-{netns}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"echo server in {netns} did not start")

    def _main(self, netns: str, port: int) -> None:
        enter_netns(netns)
        sel = selectors.DefaultSelector()
        listener = socket.create_server(("0.0.0.0", port), reuse_port=True)
        listener.setblocking(False)
        sel.register(listener, selectors.EVENT_READ)
        sel.register(self._stop_r, selectors.EVENT_READ)
        self._ready.set()
        try:
            while True:
                for key, _ in sel.select():
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._stop_r:
                        return
                    if sock is listener:
                        with contextlib.suppress(OSError):
                            conn, _ = listener.accept()
                            conn.setblocking(False)
                            sel.register(conn, selectors.EVENT_READ)
                        continue
                    try:
                        data = sock.recv(65536)
                        # Lines are short and the echo is answered before the next is
                        # sent, so the send buffer always has room.
                        if data:
                            sock.sendall(data)
                            continue
                    except OSError:
                        pass
                    sel.unregister(sock)
                    sock.close()
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            sel.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._stop_w.send(b"x")
        self._thread.join(5)
        self._stop_w.close()


class LongFlow:
    """One TCP connection from namespace ``netns`` to ``ip:port``, exchanging lines."""

    def __init__(
        self, netns: str, ip: str, port: int, interval: float = 0.02, stall: float = 5.0
    ) -> None:
        self.interval = interval
        self.stall = stall
        self.error: str | None = None
        self.sent = 0
        self._times: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread = threading.Thread(
            target=self._main, args=(netns, ip, port), name=f"flow-{netns}", daemon=True
        )
        self._thread.start()
        if not self._connected.wait(10) or self.error is not None:
            raise RuntimeError(f"flow to {ip}:{port} did not start: {self.error}")

    def _main(self, netns: str, ip: str, port: int) -> None:
        try:
            enter_netns(netns)
            sock = socket.create_connection((ip, port), timeout=self.stall)
        except OSError as err:
            self.error = f"connect: {err}"
            self._connected.set()
            return
        self._connected.set()
        with sock:
            try:
                self._exchange(sock)
            except OSError as err:
                self.error = f"after {self.sent} round trips: {err!r}"

    def _exchange(self, sock: socket.socket) -> None:
        buffer = b""
        while not self._stop.wait(self.interval):
            line = f"{self.sent:012d}\n".encode()
            sock.sendall(line)
            while b"\n" not in buffer:
                chunk = sock.recv(4096)
                if not chunk:
                    raise ConnectionResetError("closed by the peer")
                buffer += chunk
            got, _, buffer = buffer.partition(b"\n")
            if got + b"\n" != line:
                raise ConnectionError(f"echo {got!r} for {line!r}")
            self.sent += 1
            with self._lock:
                self._times.append(time.monotonic())

    def round_trips(self, start: float, end: float | None = None) -> int:
        """Round trips completed between monotonic times ``start`` and ``end`` (now)."""
        with self._lock:
            lo = bisect.bisect_left(self._times, start)
            hi = len(self._times) if end is None else bisect.bisect_right(self._times, end)
        return hi - lo

    def wait_round_trip(self, start: float) -> bool:
        """Wait for a round trip completed after monotonic time ``start``: True once one
        has, False when the flow failed or ``stall`` passed without one (a connection
        that lost its path stalls; a busy test process may just not have run the flow's
        thread yet)."""
        deadline = time.monotonic() + self.stall
        while self.round_trips(start) == 0:
            if self.error is not None or time.monotonic() >= deadline:
                return self.round_trips(start) > 0
            time.sleep(self.interval)
        return True

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time between round trips within the window (seconds)."""
        with self._lock:
            lo = bisect.bisect_left(self._times, start)
            hi = bisect.bisect_right(self._times, end)
            marks = [start, *self._times[lo:hi], end]
        return max(b - a for a, b in itertools.pairwise(marks))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
