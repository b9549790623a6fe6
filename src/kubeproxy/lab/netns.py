"""Network namespaces for the lab: create, wire, run code inside, and always delete.

Namespaces are made with ``ip netns add`` (so they are visible to ``ip netns exec`` and to
kubeproxy run inside them) and deleted by their own names. Code runs inside a namespace
through :class:`NetnsExecutor`: a thread pool whose threads ``setns(2)`` into the
namespace when they start, so a test can open thousands of sockets in a Pod's namespace
without spawning a process per connection. (Network namespace membership is per thread
on Linux, and sockets stay in the namespace they were created in.) Wiring spawns as few
processes as it can (``ip -n``; sysctls written from such a thread): in the
user-mode-linux guest of the IPVS tests every process start costs ~40 ms.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class LabError(RuntimeError):
    pass


def sh(*args: str, check: bool = True, input: str | None = None) -> str:
    """Run a command; raise LabError with its stderr when it fails."""
    proc = subprocess.run(list(args), capture_output=True, text=True, input=input, check=False)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def ns_exec(ns: str, *args: str, check: bool = True, input: str | None = None) -> str:
    return sh("ip", "netns", "exec", ns, *args, check=check, input=input)


def enter_netns(name: str) -> None:
    """Move the calling thread into network namespace ``name``."""
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


class NetnsExecutor:
    """Run callables in threads that live in one network namespace."""

    def __init__(self, name: str, workers: int = 4) -> None:
        self.name = name
        self._pool = ThreadPoolExecutor(
            max_workers=workers,
            thread_name_prefix=f"netns-{name}",
            initializer=enter_netns,
            initargs=(name,),
        )

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` inside the namespace and return its result."""
        return self._pool.submit(fn, *args, **kwargs).result(timeout=120)

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Start ``fn`` inside the namespace; the future gives its result."""
        return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def add_netns(name: str) -> None:
    sh("ip", "netns", "add", name)
    sh("ip", "-n", name, "link", "set", "lo", "up")
    # Deterministic behaviour inside the lab regardless of the host's defaults (the IPv6
    # keys are missing where IPv6 is off).
    sysctls(
        name,
        {
            "net.ipv4.conf.all.rp_filter": "0",
            "net.ipv4.conf.default.rp_filter": "0",
            "net.ipv6.conf.all.accept_dad": "0",
            "net.ipv6.conf.default.accept_dad": "0",
        },
        check=False,
    )


def delete_netns(name: str) -> None:
    sh("ip", "netns", "delete", name, check=False)


@contextlib.contextmanager
def temporary_netns(name: str) -> Iterator[str]:
    """A namespace made by :func:`add_netns` for the ``with`` block, then deleted by name."""
    add_netns(name)
    try:
        yield name
    finally:
        delete_netns(name)


def list_netns() -> list[str]:
    out = sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def veth(ns_a: str, name_a: str, ns_b: str, name_b: str) -> None:
    """A veth pair with one end in each namespace, both up."""
    sh("ip", "link", "add", name_a, "netns", ns_a, "type", "veth", "peer", name_b, "netns", ns_b)
    sh("ip", "-n", ns_a, "link", "set", name_a, "up")
    sh("ip", "-n", ns_b, "link", "set", name_b, "up")


def addr(ns: str, dev: str, cidr: str, peer: str | None = None) -> None:
    args = ["ip", "-n", ns, "addr", "add", cidr]
    if peer is not None:
        args += ["peer", peer]
    args += ["dev", dev]
    if ":" in cidr:
        args.append("nodad")
    sh(*args)


def route(ns: str, *spec: str) -> None:
    family = "-6" if any(":" in s for s in spec) else "-4"
    # A fresh veth's carrier reaches IPv6 through the kernel's link watcher, up to a
    # second later on a busy machine; until then the gateway has no route.
    deadline = time.monotonic() + 5
    while True:
        try:
            sh("ip", "-n", ns, family, "route", "add", *spec)
            return
        except LabError as err:
            if "No route to host" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def sysctl(ns: str, key: str, value: str) -> None:
    sysctls(ns, {key: value})


def sysctls(ns: str, values: dict[str, str], check: bool = True) -> None:
    """Set sysctls of namespace ``ns`` (``net.ipv4.ip_forward``...) without a process:
    /proc/sys/net belongs to the namespace of the thread that opens it."""

    def write() -> None:
        for key, value in values.items():
            try:
                with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
                    f.write(value)
            except OSError as err:
                if check:
                    raise LabError(f"sysctl {key}={value} in {ns}: {err.strerror}") from None

    executor = NetnsExecutor(ns, workers=1)
    try:
        executor.call(write)
    finally:
        executor.shutdown()
