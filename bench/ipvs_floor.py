"""``python -m bench.ipvs_floor``: what programming IPVS costs at the bottom, no kubeproxy.

Needs a kernel with IPVS: started on the host, it re-runs itself inside the user-mode-linux
guest (:mod:`kubeproxy.lab.uml`), so every figure is "inside the UML guest" (1 CPU,
HZ=100, process starts ~25x slower than on the host). For each size (virtual servers x
10 NAT real servers, round robin, TCP) in a fresh network namespace each time:

* ``ipvsadm --restore``: one process reading the whole table as text (``-A``/``-a``
  lines), into an empty table;
* netlink batch: the same objects as IPVS generic-netlink messages, encoded once with
  pyroute2's message class (timed apart: "encode"; and timed with ipvs mode's own
  ``struct`` packing, :mod:`kubeproxy.dataplane.ipvs.wire`, for comparison), then
  written many per ``send`` on one socket with no per-message acknowledgement, ended by
  one request that is answered ("kernel": from the first send to that answer; an error
  from any message is counted);
* pyroute2's API (``IPVS.service("add")`` / ``IPVS.dest("add")``: one request and
  acknowledgement per object), up to ``--api-max`` virtual servers (it costs ~1 ms per
  object in encoding alone);
* reading the whole table back: ``ipvsadm -Sn`` and a netlink dump (services, then each
  service's real servers; messages counted, not decoded);
* one more virtual server with its 10 real servers into the full table (the floor of a
  one-Service change): by ``ipvsadm --restore`` of its 11 lines and by a netlink batch.

Median of ``--rounds``. Prints a Markdown table (see bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import itertools
import os
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pyroute2 import IPVS
from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR
from pyroute2.netlink.generic import ipvs as genl

from kubeproxy.dataplane.ipvs import Change, Destination, ServiceKey, VirtualServer, wire
from kubeproxy.lab import ipvs, uml
from kubeproxy.lab.netns import NetnsExecutor, add_netns, delete_netns, ns_exec

ROOT = Path(__file__).resolve().parents[1]
REAL_SERVERS = 10
PORT, TARGET_PORT = 80, 8080
NETLINK_GENERIC = 16
# Under the socket's default send buffer (netlink refuses a larger single message).
SEND_CHUNK = 150_000

Table = list[tuple[str, list[str]]]
_SCRATCH = itertools.count()


def _ip(base: int, i: int) -> str:
    return f"10.{base + (i >> 16)}.{(i >> 8) & 255}.{i & 255}"


def table(size: int, first: int = 0) -> Table:
    """``size`` virtual servers (10.96.x.y) from number ``first``, each with 10 real servers."""
    return [
        (_ip(96, v), [_ip(128, v * REAL_SERVERS + r) for r in range(REAL_SERVERS)])
        for v in range(first, first + size)
    ]


def restore_text(vs: Table) -> str:
    lines = []
    for vip, reals in vs:
        lines.append(f"-A -t {vip}:{PORT} -s rr")
        lines.extend(f"-a -t {vip}:{PORT} -r {rip}:{TARGET_PORT} -m -w 1" for rip in reals)
    return "\n".join(lines) + "\n"


def _service_key(vip: str) -> dict[str, Any]:
    return {
        "attrs": [
            ("IPVS_SVC_ATTR_AF", socket.AF_INET),
            ("IPVS_SVC_ATTR_PROTOCOL", socket.IPPROTO_TCP),
            ("IPVS_SVC_ATTR_ADDR", vip),
            ("IPVS_SVC_ATTR_PORT", PORT),
        ]
    }


def _message(family: int, cmd: int, attrs: list[tuple[str, Any]], flags: int) -> bytes:
    msg = genl.ipvsmsg()
    msg["cmd"] = cmd
    msg["version"] = genl.GENL_VERSION
    msg["attrs"] = attrs
    msg["header"]["type"] = family
    msg["header"]["flags"] = flags
    msg.encode()
    return bytes(msg.data)


def messages(family: int, vs: Table) -> list[bytes]:
    """IPVS_CMD_NEW_SERVICE / _NEW_DEST requests, no acknowledgement asked."""
    out = []
    for vip, reals in vs:
        key = _service_key(vip)
        service = {
            "attrs": [
                *key["attrs"],
                ("IPVS_SVC_ATTR_SCHED_NAME", "rr"),
                ("IPVS_SVC_ATTR_FLAGS", {"flags": 0, "mask": 0xFFFF}),
                ("IPVS_SVC_ATTR_TIMEOUT", 0),
                ("IPVS_SVC_ATTR_NETMASK", "255.255.255.255"),
            ]
        }
        out.append(
            _message(family, genl.IPVS_CMD_NEW_SERVICE, [("IPVS_CMD_ATTR_SERVICE", service)], 1)
        )
        for rip in reals:
            dest = {
                "attrs": [
                    ("IPVS_DEST_ATTR_ADDR", rip),
                    ("IPVS_DEST_ATTR_ADDR_FAMILY", socket.AF_INET),
                    ("IPVS_DEST_ATTR_PORT", TARGET_PORT),
                    ("IPVS_DEST_ATTR_FWD_METHOD", ipvs.FWD_MASQ),
                    ("IPVS_DEST_ATTR_WEIGHT", 1),
                    ("IPVS_DEST_ATTR_U_THRESH", 0),
                    ("IPVS_DEST_ATTR_L_THRESH", 0),
                ]
            }
            attrs = [("IPVS_CMD_ATTR_SERVICE", key), ("IPVS_CMD_ATTR_DEST", dest)]
            out.append(_message(family, genl.IPVS_CMD_NEW_DEST, attrs, NLM_F_REQUEST))
    return out


def changes(vs: Table) -> list[Change]:
    """The same table as ipvs mode's changes."""
    out = []
    for vip, reals in vs:
        key = ServiceKey(vip, "TCP", PORT)
        out.append(Change.add_service(VirtualServer(key)))
        out.extend(Change.add_dest(key, Destination(rip, TARGET_PORT)) for rip in reals)
    return out


def _replies(sock: socket.socket) -> Iterator[tuple[int, int, bytes]]:
    """(type, sequence number, payload) of every message the kernel sends back."""
    while True:
        data = sock.recv(1 << 20)
        offset = 0
        while offset < len(data):
            length, kind, _, seq, _ = struct.unpack_from("=IHHII", data, offset)
            yield kind, seq, data[offset + 16 : offset + length]
            offset += (length + 3) & ~3


def _with_seq(message: bytes, seq: int) -> bytes:
    return message[:8] + struct.pack("=I", seq) + message[12:]


def send_batch(family: int, batch: list[bytes]) -> int:
    """Send ``batch`` (this thread's namespace), wait until the kernel has read it all;
    how many messages it refused."""
    fence = len(batch) + 1
    ask = _with_seq(_message(family, genl.IPVS_CMD_GET_INFO, [], NLM_F_REQUEST), fence)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC) as sock:
        sock.bind((0, 0))
        chunk: list[bytes] = []
        size = 0
        for seq, message in enumerate(batch, 1):
            if size + len(message) > SEND_CHUNK:
                sock.send(b"".join(chunk))
                chunk, size = [], 0
            chunk.append(_with_seq(message, seq))
            size += len(message)
        sock.send(b"".join([*chunk, ask]))
        errors = 0
        for kind, seq, payload in _replies(sock):
            if kind == NLMSG_ERROR and struct.unpack_from("=i", payload)[0] != 0:
                errors += 1
            if seq == fence:
                return errors
    raise AssertionError("unreachable")


def dump(family: int, vips: list[str]) -> int:
    """Dump every service, then each one's real servers; how many objects came back."""
    count = 0
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC) as sock:
        sock.bind((0, 0))
        requests = [_message(family, genl.IPVS_CMD_GET_SERVICE, [], NLM_F_REQUEST | NLM_F_DUMP)]
        requests += [
            _message(
                family,
                genl.IPVS_CMD_GET_DEST,
                [("IPVS_CMD_ATTR_SERVICE", _service_key(vip))],
                NLM_F_REQUEST | NLM_F_DUMP,
            )
            for vip in vips
        ]
        # A dump answers across several reads; one dump at a time on the socket.
        for request in requests:
            sock.send(request)
            for kind, _, _ in _replies(sock):
                if kind == NLMSG_DONE:
                    break
                if kind == NLMSG_ERROR:
                    raise OSError("IPVS dump refused")
                count += 1
    return count


def _time(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _family_id() -> int:
    """The number of the "IPVS" generic netlink family (the same in every namespace)."""
    with IPVS() as sock:
        list(sock.service("dump"))  # the socket resolves the family on first use
        return int(sock.asyncore.prid)


def _api(ns: str, vs: Table) -> None:
    """The table through pyroute2's API: one acknowledged request per object."""
    with ipvs.ipvs_in(ns) as sock:
        for vip, reals in vs:
            service = ipvs.virtual_server(vip, PORT)
            sock.service("add", service=service)
            for rip in reals:
                sock.dest("add", service=service, dest=ipvs.nat_real_server(rip, TARGET_PORT))


class Scratch:
    """A fresh namespace (its own empty IPVS table) and a thread inside it."""

    def __init__(self, tag: str) -> None:
        self.ns = f"kpbipvs{os.getpid() % 100000}{tag}{next(_SCRATCH)}"
        add_netns(self.ns)
        self.inside = NetnsExecutor(self.ns, workers=1)

    def close(self) -> None:
        self.inside.shutdown()
        delete_netns(self.ns)


def _ipvsadm_round(text: str, extra_text: str) -> dict[str, float]:
    box = Scratch("r")
    try:
        return {
            "ipvsadm_restore": _time(lambda: ns_exec(box.ns, "ipvsadm", "-R", input=text))[0],
            "ipvsadm_save": _time(lambda: ns_exec(box.ns, "ipvsadm", "-Sn"))[0],
            "ipvsadm_one": _time(lambda: ns_exec(box.ns, "ipvsadm", "-R", input=extra_text))[0],
        }
    finally:
        box.close()


def _netlink_round(
    family: int, batch: list[bytes], extra_batch: list[bytes], vips: list[str]
) -> dict[str, float]:
    box = Scratch("n")
    try:
        seconds, errors = _time(lambda: box.inside.call(send_batch, family, batch))
        assert errors == 0, f"{errors} IPVS messages refused"
        result = {"batch": seconds}
        seconds, count = _time(lambda: box.inside.call(dump, family, vips))
        assert count == len(batch), f"dumped {count} objects, sent {len(batch)}"
        result["dump"] = seconds
        seconds, errors = _time(lambda: box.inside.call(send_batch, family, extra_batch))
        assert errors == 0, f"{errors} IPVS messages refused"
        result["batch_one"] = seconds
        return result
    finally:
        box.close()


def _api_round(vs: Table) -> dict[str, float]:
    box = Scratch("a")
    try:
        return {"api": _time(lambda: _api(box.ns, vs))[0]}
    finally:
        box.close()


def measure(size: int, rounds: int, api_max: int) -> dict[str, float]:
    """Median seconds of each figure (keys of :data:`COLUMNS`) for ``size`` virtual servers."""
    vs = table(size)
    extra = table(1, first=size)
    family = _family_id()
    encode, batch = _time(lambda: messages(family, vs))
    assert isinstance(batch, list)
    table_changes = changes(vs)
    encode_wire, _ = _time(lambda: [wire.change_message(family, c) for c in table_changes])
    samples: dict[str, list[float]] = {"encode": [encode], "encode_wire": [encode_wire]}
    for _ in range(rounds):
        figures = _ipvsadm_round(restore_text(vs), restore_text(extra))
        figures |= _netlink_round(family, batch, messages(family, extra), [v for v, _ in vs])
        if size <= api_max:
            figures |= _api_round(vs)
        for name, seconds in figures.items():
            samples.setdefault(name, []).append(seconds)
    return {name: statistics.median(values) for name, values in samples.items()}


def _cell(seconds: float | None) -> str:
    if seconds is None:
        return "not run"
    return f"{seconds:.2f} s" if seconds >= 0.1 else f"{seconds * 1000:.1f} ms"


COLUMNS = {
    "ipvsadm_restore": "ipvsadm --restore",
    "encode": "netlink: encode (pyroute2)",
    "encode_wire": "netlink: encode (wire.py)",
    "batch": "netlink: kernel",
    "api": "pyroute2 API, per object",
    "ipvsadm_save": "read back: ipvsadm -Sn",
    "dump": "read back: netlink dump",
    "ipvsadm_one": "+1 VS: ipvsadm --restore",
    "batch_one": "+1 VS: netlink batch",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="virtual servers, comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--api-max", type=int, default=1000, help="largest size timed through pyroute2's API"
    )
    args = parser.parse_args(argv)
    if not uml.in_guest():
        # No IPVS on the host: the same command, inside the guest.
        command = [sys.executable, "-m", "bench.ipvs_floor", *(argv or sys.argv[1:])]
        try:
            return uml.run(command, cwd=ROOT, timeout=7200)
        except uml.GuestError as err:
            print(f"bench.ipvs_floor: {err}", file=sys.stderr)
            return 1
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"inside the UML guest (kernel {os.uname().release}), median of {args.rounds}")
    print("| virtual servers x 10 real servers | " + " | ".join(COLUMNS.values()) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for size in sizes:
        r = measure(size, args.rounds, args.api_max)
        cells = [_cell(r.get(key)) for key in COLUMNS]
        print(f"| {size:,} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
