"""A client process inside a cgroup of its own, for ebpf mode's tests and benchmarks.

Socket hooks apply per cgroup, not per network namespace: a client whose sockets must be
load-balanced is a separate process that moves itself into the test's cgroup (so that
cgroup holds nothing else), then runs in a Pod's namespace::

    ip netns exec POD-NS python -m kubeproxy.lab.sockclient --cgroup DIR tcp 10.96.0.1 80 20

and prints one JSON object. :class:`BpfLab` mounts what the tests need outside ``/sys``
(which ``ip netns exec`` replaces): a BPF filesystem for the pins, the cgroup v2
hierarchy, and a child cgroup for the clients; :meth:`BpfLab.close` removes all three.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from kubeproxy.lab.cluster import lab_env
from kubeproxy.lab.echo import Reply, read_reply


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _address(addr: tuple[str, int] | tuple[str, int, int, int]) -> str:
    return f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"


def _tcp(host: str, port: int) -> tuple[str, str]:
    """(pod that answered or why not, the peer address getpeername() gave)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect((host, port))
        except OSError as err:
            return errno.errorcode.get(err.errno or 0, str(err)), ""
        peer = _address(s.getpeername())
        return read_reply(s).pod, peer


def _udp(host: str, port: int, connected: bool) -> tuple[str, str]:
    """(pod that answered or why not, the reply's source: recvfrom, or getpeername)."""
    with socket.socket(_family(host), socket.SOCK_DGRAM) as s:
        s.settimeout(1)
        try:
            if connected:
                s.connect((host, port))
                s.send(b"?")
                data = s.recv(256)
                source = _address(s.getpeername())
            else:
                s.sendto(b"?", (host, port))
                data, addr = s.recvfrom(256)
                source = _address(addr)
        except OSError as err:
            return errno.errorcode.get(err.errno or 0, str(err)), ""
    return Reply.parse(data.decode()).pod, source


def _udp_stay(host: str, port: int, seconds: float) -> list[str]:
    """One connected UDP socket asking every 50 ms for ``seconds``, reconnecting after
    an error: the answers and errors in order, repeats collapsed."""
    seen: list[str] = []
    s: socket.socket | None = None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if s is None:
                s = socket.socket(_family(host), socket.SOCK_DGRAM)
                s.settimeout(1)
                s.connect((host, port))
            s.send(b"?")
            answer = Reply.parse(s.recv(256).decode()).pod
        except OSError as err:
            answer = errno.errorcode.get(err.errno or 0, str(err))
            if s is not None:
                s.close()
            s = None
        if not seen or seen[-1] != answer:
            seen.append(answer)
        time.sleep(0.05)
    if s is not None:
        s.close()
    return seen


def _udp_hold(host: str, port: int, count: int) -> dict[str, int]:
    """``count`` connected UDP sockets, held until stdin closes (a line ``ready`` on
    stdout once they are connected); how many a ``SOCK_DESTROY`` aborted meanwhile."""
    sockets = []
    for _ in range(count):
        s = socket.socket(_family(host), socket.SOCK_DGRAM)
        s.connect((host, port))
        sockets.append(s)
    print("ready", flush=True)
    sys.stdin.read()
    aborted = 0
    for s in sockets:
        aborted += s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNABORTED
        s.close()
    return {"sockets": count, "aborted": aborted}


def _tally(results: list[tuple[str, str]]) -> dict[str, Any]:
    answers: dict[str, int] = {}
    for pod, _ in results:
        answers[pod] = answers.get(pod, 0) + 1
    return {"answers": answers, "peers": sorted({peer for _, peer in results if peer})}


def _latency(host: str, port: int, count: int) -> list[int]:
    """Nanoseconds per TCP connect() (then close), ``count`` times."""
    out = []
    for _ in range(count):
        s = socket.socket(_family(host), socket.SOCK_STREAM)
        started = time.perf_counter_ns()
        s.connect((host, port))
        out.append(time.perf_counter_ns() - started)
        s.close()
    return out


def run(action: str, host: str, port: int, count: float) -> dict[str, Any]:
    if action == "tcp":
        return _tally([_tcp(host, port) for _ in range(int(count))])
    if action in ("udp", "udp-connected"):
        return _tally([_udp(host, port, action == "udp-connected") for _ in range(int(count))])
    if action == "loop":  # TCP for ``count`` seconds: what failed, and how often
        results = []
        deadline = time.monotonic() + count
        while time.monotonic() < deadline:
            results.append(_tcp(host, port))
        return _tally(results)
    if action == "latency":
        return {"ns": _latency(host, port, int(count))}
    if action == "udp-stay":
        return {"sequence": _udp_stay(host, port, count)}
    if action == "udp-hold":
        return _udp_hold(host, port, int(count))
    raise ValueError(f"unknown action {action!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cgroup", type=Path, help="join this cgroup v2 directory first")
    parser.add_argument(
        "action",
        choices=("tcp", "udp", "udp-connected", "loop", "latency", "udp-stay", "udp-hold"),
    )
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("count", type=float)
    args = parser.parse_args(argv)
    if args.cgroup is not None:
        (args.cgroup / "cgroup.procs").write_text(str(os.getpid()))
    json.dump(run(args.action, args.host, args.port, args.count), sys.stdout)
    return 0


# ------------------------------------------------------------------ the fixture


class BpfLab:
    """A BPF filesystem and the cgroup v2 hierarchy mounted under a temporary directory,
    with a child cgroup for clients; everything removed by :meth:`close`."""

    def __init__(self, name: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        self.bpffs = self.root / "bpf"
        self.cgroup2 = self.root / "cgroup"
        self.cgroup = self.cgroup2 / name
        self._mounted: list[Path] = []

    @property
    def pin_path(self) -> Path:
        return self.bpffs / "kubeproxy"

    def flags(self) -> tuple[str, ...]:
        """kubeproxy's flags for this lab."""
        return (
            "--ebpf-cgroup-path",
            str(self.cgroup),
            "--ebpf-pin-path",
            str(self.pin_path),
        )

    def open(self) -> BpfLab:
        for path, fstype in ((self.bpffs, "bpf"), (self.cgroup2, "cgroup2")):
            path.mkdir()
            subprocess.run(["mount", "-t", fstype, fstype, str(path)], check=True)
            self._mounted.append(path)
        self.cgroup.mkdir()
        return self

    def command(self, netns: str, action: str, host: str, port: int, count: float) -> list[str]:
        """The command of a client in the lab's cgroup and ``netns`` (see :func:`main`)."""
        module = "kubeproxy.lab.sockclient"
        where = ["ip", "netns", "exec", netns, sys.executable, "-m", module]
        return [*where, "--cgroup", str(self.cgroup), action, host, str(port), str(count)]

    def client(self, netns: str, action: str, host: str, port: int, count: float) -> Any:
        """Run a client to completion; its JSON result."""
        out = subprocess.run(
            self.command(netns, action, host, port, count),
            capture_output=True,
            text=True,
            check=True,
            env=lab_env(),
        )
        return json.loads(out.stdout)

    def spawn_client(
        self, netns: str, action: str, host: str, port: int, count: float
    ) -> subprocess.Popen[str]:
        """:meth:`client` in the background; read its JSON from ``stdout`` when done."""
        return subprocess.Popen(
            self.command(netns, action, host, port, count),
            stdout=subprocess.PIPE,
            text=True,
            env=lab_env(),
        )

    def close(self) -> None:
        if self.cgroup.exists():
            # Clients are gone by now; a leftover one would keep the cgroup busy.
            for pid in (self.cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
            deadline = time.monotonic() + 5
            while True:
                try:
                    self.cgroup.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        for path in reversed(self._mounted):
            subprocess.run(["umount", str(path)], check=False)
        self._mounted.clear()
        for path in (self.bpffs, self.cgroup2):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            self.root.rmdir()

    def __enter__(self) -> BpfLab:
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
