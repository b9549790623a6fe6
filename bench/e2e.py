"""Change-to-packet latency, cold start and memory of a real ``kubeproxy run``, from outside.

    python -m bench.e2e [--sizes 100,10000] [--sources manifests,api] [--rounds 10]
                        [--src DIR] [--out FILE] [--profile DIR]
                        [--manifests-dir DIR] [--cache-dir DIR]

(as root, from the repository root.) For each source and size, in two network namespaces
this module creates and deletes by their own names:

* ``node``: where ``kubeproxy run`` (nftables mode, ``--iptables-min-sync-period 0s``)
  runs as a separate process, from ``--src`` (default: this checkout's ``src``; pass
  another checkout's to measure the code before a change), reading either a manifest
  directory of one YAML file per Service (Service + EndpointSlice) or the API stand-in
  (:mod:`bench.e2e_api`, a process of its own in the same namespace);
* ``peer``, linked by a veth pair: every ClusterIP (10.96.0.0/12) and every endpoint
  address (10.128.0.0/9) is a local address there (``ip route add local``), and one echo
  server answers each connection to port 8080 with the address it was reached on, i.e.
  the endpoint the proxy chose. A ClusterIP the proxy does not (or no longer) DNAT
  reaches the peer on port 80, where nothing listens: the connection is refused at once,
  so a probe never waits for a timeout.

Probes are real TCP connects from the node's namespace to ClusterIP:80, made by this
process (a thread in that namespace), never by the proxy's own timers. Each Service has
10 endpoints. Measured, ``--rounds`` times each, one change at a time:

* **add**: a new Service and its EndpointSlice (manifests: a file renamed into the
  directory; API: both written, slice first) → the first probe answered by one of its
  endpoints;
* **change**: its EndpointSlice rewritten with 10 new addresses (every endpoint changes,
  so the first probe that lands after the change tells) → the first probe answered by a
  new endpoint; any probe refused meanwhile counts against "hitless";
* **delete**: the file removed / both objects deleted → the first probe refused.

The clock starts just before the rename or the write request (the API stand-in
acknowledges each command). **Cold start** is from spawning the proxy process to the
last of a sample of Services answering (the highest-numbered, the last by name, every
20th: a new table's Services appear piece by piece in name order, within one full
sync); its probes give up on a connect after 0.1 s (see COLD_PROBE_TIMEOUT).
**Peak RSS** is that of the whole process tree (the proxy and its
``nft`` children), summed over the tree and sampled every 5 ms from this process, and
the proxy's own high-water mark (VmHWM). A child that has not exec'd yet (still the
proxy's program: between fork and exec) is not counted: it shares the proxy's pages
and would count them twice. The proxy's modules are byte-compiled first (``__pycache__``
beside them), as an installed package's are. Results go to stdout as Markdown and to
``--out`` as JSON; ``--profile`` keeps the proxy's logs (``--v=2``: each sync's time) and,
if py-spy is installed beside this Python, samples of the proxy during the changes.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from bench.cluster import cluster_ip, pod_ip, service_objects
from kubeproxy.lab.netns import (
    NetnsExecutor,
    add_netns,
    addr,
    delete_netns,
    route,
    veth,
)

ROOT = Path(__file__).resolve().parents[1]
ENDPOINTS = 10
NODE_IP, PEER_IP = "192.168.77.1", "192.168.77.2"
PROBE_DEADLINE = 60.0
COLD_DEADLINE = 900.0
# A cold start's probes give up on a connect after this long and probe again. Until its
# Service is programmed, a probe is refused, by the peer or (once the new table holds the
# ClusterIP but not yet its Service's elements) by the table's REJECT, and Linux loses
# about 2 % of locally generated connects REJECTed in OUTPUT: the ICMP error arrives
# while connect() still holds the socket, and the connect waits for the SYN's 1 s
# retransmission. With a 1 s probe timeout that kernel race, not the proxy, added up to
# 1 s to the measured cold start (seen in every 10,000-Service run). An answer takes
# well under a millisecond here.
COLD_PROBE_TIMEOUT = 0.1

ECHO = """
import socket
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 8080))
srv.listen(1024)
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    try:
        conn.sendall(conn.getsockname()[0].encode() + b"\\n")
    except OSError:
        pass
    conn.close()
"""


# ----------------------------------------------------------------------------- probes


def probe(ip: str, timeout: float = 1.0) -> str | None:
    """Connect to ``ip``:80; the endpoint address that answered, or None if refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Reset on close: no TIME_WAIT, so thousands of probes never run out of ports.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.settimeout(timeout)
    try:
        sock.connect((ip, 80))
        return sock.recv(64).decode().strip() or None
    except OSError:
        return None
    finally:
        sock.close()


@dataclass
class Waited:
    seconds: float
    probes: int
    refused: int  # probes refused before the awaited answer


def wait_for(
    ip: str,
    done: Callable[[str | None], bool],
    started: float,
    deadline: float = PROBE_DEADLINE,
    timeout: float = 1.0,
) -> Waited:
    """Probe ``ip`` back to back until ``done(answer)``; seconds since ``started``."""
    probes = refused = 0
    while True:
        answer = probe(ip, timeout)
        probes += 1
        if done(answer):
            return Waited(time.perf_counter() - started, probes, refused)
        if answer is None:
            refused += 1
        if time.perf_counter() - started > deadline:
            raise TimeoutError(f"{ip}: no expected answer after {deadline:.0f}s")


# --------------------------------------------------------------------------- the lab


@dataclass
class Lab:
    node: str
    peer: str
    probes: NetnsExecutor
    children: list[subprocess.Popen[str]] = field(default_factory=list)


@contextmanager
def lab() -> Iterator[Lab]:
    tag = os.getpid() % 100000
    node, peer = f"kpe2e-node-{tag}", f"kpe2e-peer-{tag}"
    add_netns(node)
    add_netns(peer)
    created = Lab(node, peer, NetnsExecutor(node, workers=1))
    try:
        veth(node, "eth0", peer, "eth0")
        addr(node, "eth0", f"{NODE_IP}/24")
        addr(peer, "eth0", f"{PEER_IP}/24")
        for cidr in ("10.96.0.0/12", "10.128.0.0/9"):
            route(node, cidr, "via", PEER_IP)
            route(peer, "local", cidr, "dev", "lo")
        echo = spawn(peer, ["-c", ECHO])
        created.children.append(echo)
        assert echo.stdout is not None
        if echo.stdout.readline().strip() != "ready":
            raise RuntimeError("the echo server did not start")
        yield created
    finally:
        created.probes.shutdown()
        for child in created.children:
            stop(child)
        delete_netns(node)
        delete_netns(peer)


def spawn(
    ns: str,
    args: list[str],
    *,
    pythonpath: str | None = None,
    stdin: bool = False,
    stderr: IO[str] | None = None,
) -> subprocess.Popen[str]:
    """``python ARGS`` in namespace ``ns`` (``ip netns exec`` execs: the pid is Python's)."""
    path = pythonpath or f"{ROOT}:{ROOT / 'src'}"
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, *args],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=dict(os.environ, PYTHONPATH=path),
        cwd=ROOT,
    )


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):  # a pipe to a dead process
                stream.close()


# ------------------------------------------------------------------------------ memory


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a child is listed under the thread that forked it),
    without children that have not exec'd yet (their memory is their parent's)."""
    pids = [pid]
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # gone meanwhile
        return pids
    program = _cmdline(pid)
    for task in tasks:
        try:
            listed = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        except OSError:
            continue
        for child in listed:
            if _cmdline(int(child)) != program:
                pids.extend(process_tree(int(child)))
    return pids


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def status_kb(pid: int, field_name: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field_name):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeRss:
    """The peak of the summed RSS of a process and its descendants, sampled every 5 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            total = sum(status_kb(p, "VmRSS:") for p in process_tree(self.pid))
            self.peak_kb = max(self.peak_kb, total)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


# ----------------------------------------------------------------------------- sources


def _objects(i: int, first_endpoint: int | None = None) -> list[dict[str, Any]]:
    return service_objects(i, ENDPOINTS, first_endpoint=first_endpoint)


def _endpoints(first: int) -> set[str]:
    return {pod_ip(first + j) for j in range(ENDPOINTS)}


class Manifests:
    """One YAML file per Service; every write is an atomic rename into the directory.

    ``directory``: use (and keep) this one, written only if empty; a second run over it
    is a restart (with ``--cache-dir``, a restart with a warm parse cache). The rounds
    leave it as they found it."""

    def __init__(self, services: int, directory: Path | None = None) -> None:
        self.keep = directory is not None
        self.dir = directory or Path(tempfile.mkdtemp(prefix="kpe2e-manifests-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        if not any(self.dir.glob("svc-*.yaml")):
            for i in range(services):
                self.write(i, _objects(i))

    def args(self) -> list[str]:
        return ["--manifests", str(self.dir)]

    def write(self, i: int, objects: list[dict[str, Any]]) -> None:
        self.prepare_write(i, objects)()

    def prepare_write(self, i: int, objects: list[dict[str, Any]]) -> Callable[[], None]:
        """Write the file aside (hidden); the returned step renames it into place."""
        tmp = self.dir / f".svc-{i}.yaml.tmp"
        tmp.write_text(yaml.safe_dump_all(objects, sort_keys=False))

        def rename() -> None:
            tmp.replace(self.dir / f"svc-{i}.yaml")

        return rename

    def prepare_delete(self, i: int) -> Callable[[], None]:
        return (self.dir / f"svc-{i}.yaml").unlink

    def close(self) -> None:
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


class Api:
    """The stand-in in its own process; a write returns once the stand-in acknowledged it."""

    def __init__(self, lab: Lab, services: int, endpoints: int = ENDPOINTS) -> None:
        self.proc = spawn(
            lab.node, ["-m", "bench.e2e_api", str(services), str(endpoints)], stdin=True
        )
        lab.children.append(self.proc)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def args(self) -> list[str]:
        return ["--master", f"http://127.0.0.1:{self.port}"]

    def command(self, command: dict[str, Any]) -> None:
        """``{"apply": [OBJECT...]}`` or ``{"delete": [[KIND, NAMESPACE, NAME]...]}``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "ok":
            raise RuntimeError("the API stand-in did not acknowledge a write")

    def prepare_write(self, i: int, objects: list[dict[str, Any]]) -> Callable[[], None]:
        # The slice first, so the Service never exists without its endpoints.
        command = {"apply": sorted(objects, key=lambda o: o["kind"] == "Service")}
        return lambda: self.command(command)

    def prepare_delete(self, i: int) -> Callable[[], None]:
        name = f"svc-{i}"
        slice_name = f"{name}-ipv4"
        command = {"delete": [["Service", "bench", name], ["EndpointSlice", "bench", slice_name]]}
        return lambda: self.command(command)

    def close(self) -> None:
        stop(self.proc)


# -------------------------------------------------------------------------------- runs


def run(size: Size, source: str) -> dict[str, Any]:
    # The proxy's log (--v=2): kept beside the profile, or shown only if the run fails.
    log_path = size.profile.with_suffix(".log") if size.profile is not None else None
    with (
        lab() as the_lab,
        open(log_path or os.devnull, "w+") if log_path else tempfile.TemporaryFile("w+") as log,
    ):
        feed: Manifests | Api = (
            Manifests(size.services, size.manifests_dir)
            if source == "manifests"
            else Api(the_lab, size.services)
        )
        try:
            return _measure(the_lab, feed, size, log)
        except Exception:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:])
            raise
        finally:
            feed.close()


@dataclass(frozen=True)
class Size:
    services: int
    rounds: int
    src: Path  # the checkout's src directory the proxy runs from
    # The proxy's log, and py-spy's collapsed stacks of the change rounds if py-spy is there.
    profile: Path | None = None
    manifests_dir: Path | None = None  # see Manifests
    cache_dir: Path | None = None  # the proxy's --manifests-cache-dir (None: not passed)


def _py_spy(pid: int, out: Path | None) -> subprocess.Popen[str] | None:
    """Sample the proxy's threads during the changes (not the cold start) with py-spy."""
    if out is None or not Path(sys.executable).with_name("py-spy").exists():
        return None
    spy = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("py-spy")),
            "record",
            "--pid",
            str(pid),
            "--rate",
            "1000",
            "--threads",
            "--idle",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    time.sleep(1.0)
    return spy


def _measure(the_lab: Lab, feed: Manifests | Api, size: Size, log: IO[str]) -> dict[str, Any]:
    argv = [
        "-m",
        "kubeproxy",
        "run",
        "--proxy-mode",
        "nftables",
        "--hostname-override",
        "node-a",
        "--iptables-min-sync-period",
        "0s",
        "--cluster-cidr",
        "10.128.0.0/9",
        "--healthz-bind-address",
        "127.0.0.1:10256",
        "--metrics-bind-address",
        "127.0.0.1:10249",
        "--v=2",
        *feed.args(),
        *(
            ["--manifests-cache-dir", str(size.cache_dir)]
            if size.cache_dir is not None and isinstance(feed, Manifests)
            else []
        ),
    ]
    services = size.services
    last = services - 1
    started = time.perf_counter()
    proxy = spawn(the_lab.node, argv, pythonpath=str(size.src), stderr=log)
    the_lab.children.append(proxy)
    rss = TreeRss(proxy.pid)
    try:
        # A new table's Services become reachable piece by piece, in the order of their
        # names, so the cold start ends when the last of these answers: the
        # highest-numbered, the last by name, and every 20th.
        by_name = max(range(services), key=lambda i: f"svc-{i}")
        sample = [last, by_name, *range(0, services, max(1, services // 20))]
        cold_seconds = 0.0
        for i in dict.fromkeys(sample):
            # submit, not call: call gives up after 120 s, and a loaded machine takes longer.
            waited = the_lab.probes.submit(
                wait_for,
                cluster_ip(i),
                _endpoints(i * ENDPOINTS).__contains__,
                started,
                # The first waits for the cold start; the others only for the pieces after
                # it (a Service that never answers correctly fails the run).
                COLD_DEADLINE if not cold_seconds else cold_seconds + 30,
                COLD_PROBE_TIMEOUT,
            ).result(COLD_DEADLINE + 10)
            cold_seconds = max(cold_seconds, waited.seconds)
        time.sleep(1.0)
        results: dict[str, list[Waited]] = {"add": [], "change": [], "delete": []}
        spy = _py_spy(proxy.pid, size.profile)
        for r in range(size.rounds):
            for kind, waited in _round(the_lab, feed, services + r, services + size.rounds + r):
                results[kind].append(waited)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        hwm_kb = status_kb(proxy.pid, "VmHWM:")
    finally:
        rss.close()
        stop(proxy)
    if proxy.returncode not in (0, -signal.SIGTERM):
        raise RuntimeError(f"kubeproxy exited with {proxy.returncode}")
    out: dict[str, Any] = {
        "services": services,
        "cold_seconds": cold_seconds,
        "tree_peak_rss_mb": rss.peak_kb / 1024,
        "proxy_hwm_mb": hwm_kb / 1024,
    }
    for kind, waits in results.items():
        seconds = [w.seconds for w in waits]
        out[kind] = {
            "median": statistics.median(seconds),
            "max": max(seconds),
            "all": seconds,
            "refused_probes": sum(w.refused for w in waits) if kind == "change" else None,
        }
    return out


def _round(
    the_lab: Lab, feed: Manifests | Api, i: int, moved_to: int
) -> Iterator[tuple[str, Waited]]:
    """Add Service ``i``, move its endpoints, delete it: each change timed on its own."""
    ip = cluster_ip(i)
    base, moved = i * ENDPOINTS, moved_to * ENDPOINTS
    old, new = _endpoints(base), _endpoints(moved)
    steps: list[tuple[str, Callable[[], Callable[[], None]], Callable[[str | None], bool]]] = [
        ("add", lambda: feed.prepare_write(i, _objects(i, base)), old.__contains__),
        ("change", lambda: feed.prepare_write(i, _objects(i, moved)), new.__contains__),
        ("delete", lambda: feed.prepare_delete(i), lambda answer: answer is None),
    ]
    for kind, prepare, done in steps:
        act = prepare()  # serialising the objects is the writer's cost, not the proxy's
        t0 = time.perf_counter()
        act()
        yield kind, the_lab.probes.call(wait_for, ip, done, t0)
        time.sleep(0.2)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| source | Services | add (median / max) | change (median / max) | delete (median / max) "
        "| refused during change | cold start | peak RSS tree (proxy VmHWM) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [
            f"{ms(row[k]['median'])} / {ms(row[k]['max'])}" for k in ("add", "change", "delete")
        ]
        lines.append(
            f"| {row['source']} | {row['services']:,} | {' | '.join(cells)} "
            f"| {row['change']['refused_probes']} | {ms(row['cold_seconds'])} "
            f"| {row['tree_peak_rss_mb']:.0f} MB ({row['proxy_hwm_mb']:.0f} MB) |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.e2e", description=__doc__)
    parser.add_argument("--sizes", default="100,10000")
    parser.add_argument("--sources", default="manifests,api")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--src", type=Path, default=ROOT / "src")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="directory for the proxy's logs, and py-spy samples of the proxy during the "
        "changes if py-spy is installed beside this Python",
    )
    parser.add_argument(
        "--manifests-dir",
        type=Path,
        default=None,
        help="manifests: read (and keep) this directory, written only if empty",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="manifests: the proxy's --manifests-cache-dir (not passed without it: the "
        "code before the parse cache has no such flag)",
    )
    args = parser.parse_args()
    # The proxy starts as an installed package does, from compiled bytecode (pip compiles
    # at install, the image has it); otherwise, with PYTHONDONTWRITEBYTECODE set (as on
    # this machine), every start compiles the modules from source (about 0.1 s).
    compileall.compile_dir(args.src, quiet=1)
    rows = []
    for source in args.sources.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            profile = None
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
                profile = args.profile / f"{source}-{size}.txt"
            spec = Size(
                size, args.rounds, args.src.resolve(), profile, args.manifests_dir, args.cache_dir
            )
            row = {"source": source, **run(spec, source)}
            rows.append(row)
            print(table([row]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows))
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
