"""The socket load-balancer in the kernel: its maps, its programs, their pins.

* :class:`ServiceTable` — frontends and their endpoints in the ``kp_svc4`` and ``kp_svc6``
  maps (layout in ``sock_lb.c``), over any :class:`KVMap`: the real map
  (:class:`~.libbpf.MapFd`) or :class:`FakeMap`, a dict as strict as the kernel about key
  and value sizes. Writes
  are ordered so a concurrent ``connect()`` never sees a count larger than the slots
  behind it: slots before the count when growing, the count before the slots when
  shrinking.
* :class:`SockLB` — load the object with its maps pinned under the pin directory
  (reused when already there with this :data:`LAYOUT`: a restart keeps every entry;
  new, empty ones otherwise), attach each program to the cgroup through a pinned link,
  or swap the program of a link already pinned (the hook never goes empty), then drop
  the pins of older layouts. When the pinned links run programs of another layout, the
  attach waits until the caller has filled the new maps (:meth:`SockLB.attach`);
  ``close`` leaves everything pinned and attached.
* :meth:`SockLB.destroy_stale` — destroy the connected UDP sockets the hooks sent to an
  endpoint that is gone (:mod:`kubeproxy.dataplane.sockdiag`): the ones whose socket
  cookie and peer ``kp_rev4/6`` records as rewritten from that frontend.
* :func:`pinned_entry`, :func:`unlinked_hooks` — read what is pinned (``explain --live``).
* :func:`cleanup` — detach the pinned links and remove every pin.

Both families: connect, sendmsg, recvmsg and getpeername, each in its 4 and 6 flavour.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kubeproxy.dataplane import sockdiag
from kubeproxy.dataplane.bpf import libbpf
from kubeproxy.dataplane.errors import DataplaneError
from kubeproxy.model.types import IPFamily, L4Protocol, family_of

log = logging.getLogger(__name__)

DEFAULT_PIN_PATH = Path("/sys/fs/bpf/kubeproxy")

# The maps' key and value layouts and their meaning (sock_lb.c). Bump it with any change
# there: maps pinned by another layout are then replaced (filled anew before the links
# switch to the new programs), never reused with the wrong meaning.
LAYOUT = 2
MAPS = ("kp_svc4", "kp_rev4", "kp_aff4", "kp_svc6", "kp_rev6", "kp_aff6")
# hook -> program (sock_lb.c's SEC names and functions)
PROGRAMS = {
    f"{hook}{v}": f"kp_{hook}{v}"
    for v in "46"
    for hook in ("connect", "sendmsg", "recvmsg", "getpeername")
}
_PROTO = {L4Protocol.TCP: socket.IPPROTO_TCP, L4Protocol.UDP: socket.IPPROTO_UDP}
_PROTO_BACK = {v: k for k, v in _PROTO.items()}

# struct svc_key4/6 {u32 addr[1 or 4]; u16 port; u16 slot; u8 proto; u8 pad[3]}
# (addr, port: network order), and struct endpoint4/6 {u32 addr[1 or 4]; u16 port; u16 count}
# whose slot 0 carries the affinity timeout (u32 seconds, native order) in place of addr
_SVC_KEY = {IPFamily.IPv4: struct.Struct("=4s2sHB3x"), IPFamily.IPv6: struct.Struct("=16s2sHB3x")}
_ENDPOINT = {IPFamily.IPv4: struct.Struct("=4s2sH"), IPFamily.IPv6: struct.Struct("=16s2sH")}
# struct rev_key4/6 {u64 cookie; u32 addr[1 or 4]; u16 port; u16 pad[1 or 3]}
_REV_KEY = {IPFamily.IPv4: struct.Struct("=Q4s2s2x"), IPFamily.IPv6: struct.Struct("=Q16s2s6x")}
_SLOT0 = {IPFamily.IPv4: struct.Struct("=I2xH"), IPFamily.IPv6: struct.Struct("=I12x2xH")}
_AF = {IPFamily.IPv4: socket.AF_INET, IPFamily.IPv6: socket.AF_INET6}
MAX_ENDPOINTS = 0xFFFF
BPF_FS_MAGIC = "bpf"


class SockLBError(DataplaneError):
    """The socket load-balancer cannot be set up here; the message says why."""

    tool = "sock_lb"


@dataclass(frozen=True, order=True, slots=True)
class Frontend:
    """A destination the hooks rewrite: an address, port and protocol."""

    ip: str
    port: int
    protocol: L4Protocol

    @property
    def family(self) -> IPFamily:
        return family_of(self.ip)

    def __str__(self) -> str:
        ip = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{ip}:{self.port}/{self.protocol.value}"


@dataclass(frozen=True, order=True, slots=True)
class Target:
    """An endpoint a frontend's sockets are sent to."""

    ip: str
    port: int

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"


@dataclass(frozen=True, slots=True)
class Backends:
    """What a frontend's sockets get: its endpoints, and its ClientIP affinity timeout
    in seconds (0: none)."""

    targets: tuple[Target, ...]
    affinity: int = 0


NONE = Backends(())


def supported(protocol: L4Protocol) -> bool:
    """Protocols whose sockets the hooks rewrite (SCTP stays with nftables)."""
    return protocol in _PROTO


class KVMap(Protocol):
    """The map operations the table needs (:class:`~.libbpf.MapFd` or :class:`FakeMap`)."""

    def update(self, key: bytes, value: bytes, flags: int = ...) -> None: ...

    def delete(self, key: bytes) -> bool: ...

    def lookup(self, key: bytes) -> bytes | None: ...

    def items(self) -> Iterator[tuple[bytes, bytes]]: ...


class FakeMap:
    """A hash map (``BPF_MAP_TYPE_HASH``) in memory, refusing what the kernel and
    :class:`~.libbpf.MapFd` refuse (tests/bpf_map_cases.py checks it against both):
    a key or value of another size (EINVAL), a new key in a full map (E2BIG),
    ``BPF_NOEXIST`` on a key that is there (EEXIST), ``BPF_EXIST`` on one that is not
    (ENOENT), other flags (EINVAL: ``BPF_F_LOCK`` needs a spin lock these maps lack)."""

    def __init__(self, key_size: int, value_size: int, max_entries: int = 1048576) -> None:
        self.key_size = key_size
        self.value_size = value_size
        self.max_entries = max_entries
        self.data: dict[bytes, bytes] = {}
        self.writes = 0

    def update(self, key: bytes, value: bytes, flags: int = libbpf.BPF_ANY) -> None:
        if len(key) != self.key_size or len(value) != self.value_size:
            raise libbpf.BpfError(errno.EINVAL, "update: wrong key or value size")
        if flags not in (libbpf.BPF_ANY, libbpf.BPF_NOEXIST, libbpf.BPF_EXIST):
            raise libbpf.BpfError(errno.EINVAL, f"update: flags {flags}")
        if flags == libbpf.BPF_NOEXIST and key in self.data:
            raise libbpf.BpfError(errno.EEXIST, "update: the key exists")
        if flags == libbpf.BPF_EXIST and key not in self.data:
            raise libbpf.BpfError(errno.ENOENT, "update: no such key")
        if key not in self.data and len(self.data) >= self.max_entries:
            raise libbpf.BpfError(errno.E2BIG, "update: map full")
        self.data[key] = value
        self.writes += 1

    def delete(self, key: bytes) -> bool:
        if len(key) != self.key_size:
            raise libbpf.BpfError(errno.EINVAL, "delete: wrong key size")
        self.writes += 1
        return self.data.pop(key, None) is not None

    def lookup(self, key: bytes) -> bytes | None:
        if len(key) != self.key_size:
            raise libbpf.BpfError(errno.EINVAL, "lookup: wrong key size")
        return self.data.get(key)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        yield from list(self.data.items())


def _key(frontend: Frontend, slot: int) -> bytes:
    family = frontend.family
    return _SVC_KEY[family].pack(
        socket.inet_pton(_AF[family], frontend.ip),
        frontend.port.to_bytes(2, "big"),
        slot,
        _PROTO[frontend.protocol],
    )


def _value(family: IPFamily, target: Target) -> bytes:
    address = socket.inet_pton(_AF[family], target.ip)
    return _ENDPOINT[family].pack(address, target.port.to_bytes(2, "big"), 0)


class ServiceTable:
    """Frontends → endpoints in ``kp_svc4`` and ``kp_svc6`` (by the frontend's family)."""

    def __init__(self, kv4: KVMap, kv6: KVMap) -> None:
        self.kv = {IPFamily.IPv4: kv4, IPFamily.IPv6: kv6}

    def write(self, frontend: Frontend, want: Backends, before: Backends = NONE) -> int:
        """Program ``want`` for ``frontend`` (no targets: remove it) where ``before`` is
        programmed; only slots that differ are written. Returns the map operations."""
        targets, have = want.targets, before.targets
        if len(targets) > MAX_ENDPOINTS:
            raise SockLBError(f"{frontend}: {len(targets)} endpoints (at most {MAX_ENDPOINTS})")
        family = frontend.family
        kv = self.kv[family]
        ops = 0
        if not targets:
            ops += kv.delete(_key(frontend, 0))
        else:
            for slot, target in enumerate(targets, 1):
                if slot > len(have) or have[slot - 1] != target:
                    kv.update(_key(frontend, slot), _value(family, target))
                    ops += 1
            if len(targets) != len(have) or want.affinity != before.affinity:
                slot0 = _SLOT0[family].pack(want.affinity, len(targets))
                kv.update(_key(frontend, 0), slot0)
                ops += 1
        for slot in range(len(targets) + 1, len(have) + 1):
            kv.delete(_key(frontend, slot))
            ops += 1
        return ops

    def read(self, frontend: Frontend) -> Backends:
        """What the map holds for ``frontend`` now (its count's slots; NONE: no entry):
        a few lookups, where :meth:`dump` walks the whole map."""
        family = frontend.family
        kv = self.kv[family]
        slot0 = kv.lookup(_key(frontend, 0))
        if slot0 is None:
            return NONE
        affinity, count = _SLOT0[family].unpack(slot0)
        af = _AF[family]
        targets = []
        for slot in range(1, count + 1):
            value = kv.lookup(_key(frontend, slot))
            if value is None:
                targets.append(Target("", 0))  # a write cut short (dump shows it too)
                continue
            ep_addr, ep_port, _ = _ENDPOINT[family].unpack(value)
            targets.append(Target(socket.inet_ntop(af, ep_addr), int.from_bytes(ep_port, "big")))
        return Backends(tuple(targets), affinity)

    def dump(self) -> dict[Frontend, Backends]:
        """Everything programmed (what a restart finds in the pinned map): the frontends
        with their endpoints in slot order; slots beyond a frontend's count (a write cut
        short) count as programmed so the next write removes them."""
        counts: dict[Frontend, tuple[int, int]] = {}
        slots: dict[Frontend, dict[int, Target]] = {}
        for family, kv in self.kv.items():
            af = _AF[family]
            for key, value in kv.items():
                addr, port, slot, proto = _SVC_KEY[family].unpack(key)
                if proto not in _PROTO_BACK:
                    continue
                frontend = Frontend(
                    socket.inet_ntop(af, addr), int.from_bytes(port, "big"), _PROTO_BACK[proto]
                )
                if slot == 0:
                    affinity, count = _SLOT0[family].unpack(value)
                    counts[frontend] = (affinity, count)
                else:
                    ep_addr, ep_port, _ = _ENDPOINT[family].unpack(value)
                    target = Target(socket.inet_ntop(af, ep_addr), int.from_bytes(ep_port, "big"))
                    slots.setdefault(frontend, {})[slot] = target
        out: dict[Frontend, Backends] = {}
        for frontend in sorted(counts.keys() | slots.keys()):
            by_slot = slots.get(frontend, {})
            affinity, count = counts.get(frontend, (0, 0))
            last = max([count, *by_slot])
            out[frontend] = Backends(
                tuple(by_slot.get(slot, Target("", 0)) for slot in range(1, last + 1)), affinity
            )
        return out


# ------------------------------------------------------------------ in the kernel


def mount_type(path: Path, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The filesystem type of the mount holding ``path`` (None if unknown)."""
    target = os.path.realpath(path)
    best, fstype = "", None
    with open(mountinfo, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            point = fields[4].replace("\\040", " ")
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, fstype = point, fields[sep + 1]
    return fstype


def cgroup2_root(mountinfo: str = "/proc/self/mountinfo") -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``.../unified``
    on a hybrid host); None without one."""
    with open(mountinfo, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if fields[fields.index("-") + 1] == "cgroup2":
                return Path(fields[4])
    return None


def _pin_dir_ready(pin_dir: Path, mount: Callable[[Path], None] | None = None) -> None:
    """The pin directory on a BPF filesystem, made if missing. Without one, as Cilium
    does: a BPF filesystem is mounted on the pin directory's parent when that is an empty
    directory (``/sys/fs/bpf`` on a host that mounts none); otherwise SockLBError says
    what to mount."""
    where = pin_dir if pin_dir.exists() else pin_dir.parent
    if mount_type(where) != BPF_FS_MAGIC:
        root = pin_dir.parent
        if not pin_dir.exists() and root.is_dir() and not any(root.iterdir()):
            try:
                (mount or mount_bpffs)(root)
            except OSError as err:
                raise SockLBError(
                    f"--ebpf-pin-path {pin_dir}: no BPF filesystem, and mounting one on "
                    f"{root} failed: {err.strerror or err}"
                ) from None
            log.info("Mounted a BPF filesystem on %s (none was mounted there)", root)
        else:
            raise SockLBError(
                f"--ebpf-pin-path {pin_dir}: not on a BPF filesystem "
                f"(mount one: mount -t bpf bpf {root})"
            )
    pin_dir.mkdir(mode=0o700, exist_ok=True)


def mount_bpffs(path: Path) -> None:
    """``mount -t bpf bpf PATH`` (mode 0700), without a process; OSError on failure."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"bpf", os.fsencode(path), b"bpf", 0, b"mode=0700") != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(path))


def _cgroup_fd(cgroup: Path) -> int:
    if mount_type(cgroup) != "cgroup2":
        raise SockLBError(f"--ebpf-cgroup-path {cgroup}: not a cgroup v2 directory")
    try:
        return os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise SockLBError(f"--ebpf-cgroup-path {cgroup}: {err.strerror}") from None


def map_pin(pin_dir: Path, name: str) -> Path:
    """Where map ``name`` of this :data:`LAYOUT` is pinned."""
    return pin_dir / f"{name}_v{LAYOUT}"  # bpffs refuses names with a dot


class SockLB:
    """The loaded programs and their maps (pinned); the hooks run them once
    :meth:`attach` has been called."""

    def __init__(self, obj: libbpf.BpfObject, pin_dir: Path, cgroup: Path) -> None:
        self._obj = obj
        self.pin_dir = pin_dir
        self.cgroup = cgroup
        self.attached = False
        self.services = ServiceTable(
            *(
                obj.map_fd(name, _SVC_KEY[family].size, _ENDPOINT[family].size)
                for name, family in (("kp_svc4", IPFamily.IPv4), ("kp_svc6", IPFamily.IPv6))
            )
        )
        self._rev = {
            family: obj.map_fd(f"kp_rev{v}", _REV_KEY[family].size, _ENDPOINT[family].size)
            for family, v in ((IPFamily.IPv4, "4"), (IPFamily.IPv6, "6"))
        }

    @classmethod
    def open(cls, object_file: Path, pin_dir: Path, cgroup: Path) -> SockLB:
        _pin_dir_ready(pin_dir)
        os.close(_cgroup_fd(cgroup))  # refuse a bad cgroup before loading anything
        reused = all(map_pin(pin_dir, name).exists() for name in MAPS)
        linked = any((pin_dir / f"link_{hook}").exists() for hook in PROGRAMS)
        obj = libbpf.BpfObject(str(object_file))
        try:
            for name in MAPS:
                obj.pin_map(name, str(map_pin(pin_dir, name)))
            obj.load()
            lb = cls(obj, pin_dir, cgroup)
            # Attached now (a refusal stops the start) unless older programs serve from
            # maps of another layout: those keep serving until ours are filled.
            if reused or not linked:
                lb.attach()
        except BaseException:
            obj.close()
            raise
        return lb

    def attach(self) -> None:
        """Point the hooks at our programs (after the maps were filled: a restart with
        new maps never shows sockets an empty map), then drop older layouts' pins."""
        if self.attached:
            return
        cgroup_fd = _cgroup_fd(self.cgroup)
        try:
            cgroup_id = os.fstat(cgroup_fd).st_ino
            for hook, program in PROGRAMS.items():
                pin = self.pin_dir / f"link_{hook}"
                _attach(self._obj.program(program), hook, pin, cgroup_fd, cgroup_id)
        finally:
            os.close(cgroup_fd)
        ours = {map_pin(self.pin_dir, name).name for name in MAPS}
        for pin in self.pin_dir.glob("kp_*"):
            if pin.name not in ours:
                pin.unlink()
        self.attached = True

    def check(self) -> str | None:
        """None if every map and link is still pinned (someone may have removed them)."""
        pins = [map_pin(self.pin_dir, name) for name in MAPS]
        if self.attached:
            pins += [self.pin_dir / f"link_{hook}" for hook in PROGRAMS]
        missing = [pin.name for pin in pins if not pin.exists()]
        return f"{self.pin_dir}: missing {', '.join(missing)}" if missing else None

    def destroy_stale(self, stale: Iterable[tuple[Frontend, Target]]) -> int:
        """Destroy the connected UDP sockets of the cgroup's network namespaces that the
        hooks sent from each frontend to its (now removed) target; how many."""
        # (family, peer as sock_diag shows it, port) -> (frontend, target)
        wanted: dict[tuple[int, str, int], tuple[Frontend, Target]] = {}
        current: dict[Frontend, tuple[Target, ...]] = {}
        for frontend, target in stale:
            if frontend.protocol is not L4Protocol.UDP:
                continue
            if frontend not in current:
                current[frontend] = self.services.read(frontend).targets
            if target in current[frontend]:
                continue  # back in the map since the sync that removed it
            wanted[(_AF[frontend.family], target.ip, target.port)] = (frontend, target)
            if frontend.family is IPFamily.IPv4:  # dual-stack sockets see ::ffff:a.b.c.d
                mapped = (socket.AF_INET6, f"::ffff:{target.ip}", target.port)
                wanted[mapped] = (frontend, target)
        if not wanted:
            return 0
        destroyed = 0

        def in_netns() -> None:
            nonlocal destroyed
            with sockdiag.session() as nl:
                for af in sorted({af for af, _, _ in wanted}):
                    for sock in sockdiag.connected_udp(af):
                        pair = wanted.get((sock.family, sock.peer, sock.peer_port))
                        if pair is not None and self._rewritten(sock.cookie, *pair):
                            destroyed += sockdiag.destroy(sock, nl)

        sockdiag.in_namespaces_of(self.cgroup, in_netns)
        return destroyed

    def _rewritten(self, cookie: int, frontend: Frontend, target: Target) -> bool:
        """Whether the hooks sent socket ``cookie`` from ``frontend`` to ``target``
        (``kp_rev4`` also holds the dual-stack sockets sent to an IPv4 Service)."""
        family = frontend.family
        af = _AF[family]
        key = _REV_KEY[family].pack(
            cookie, socket.inet_pton(af, target.ip), target.port.to_bytes(2, "big")
        )
        value = self._rev[family].lookup(key)
        if value is None:
            return False
        addr, port, _ = _ENDPOINT[family].unpack(value)
        front = (socket.inet_pton(af, frontend.ip), frontend.port.to_bytes(2, "big"))
        return (addr, port) == front

    def close(self) -> None:
        """Release our handles; programs stay attached and maps pinned."""
        self._obj.close()


def _attach(program: int, hook: str, pin: Path, cgroup_fd: int, cgroup_id: int) -> None:
    if pin.exists():
        link = libbpf.Link.open_pinned(str(pin))
        try:
            if link.info().cgroup_id == cgroup_id:
                link.update_program(program)
                return
        finally:
            link.close()
        # Attached to another cgroup (the flag changed): move it.
        libbpf.link_detach_pinned(str(pin))
    link = libbpf.Link.attach_cgroup(program, cgroup_fd, hook)
    try:
        link.pin(str(pin))
    finally:
        link.close()


def pinned_entry(pin_dir: Path, frontend: Frontend) -> Backends:
    """What the pinned ``kp_svc4/6`` map holds for ``frontend`` now (read only: for
    ``explain --live``); raises BpfError when the map is not pinned there."""
    family = frontend.family
    name = "kp_svc4" if family is IPFamily.IPv4 else "kp_svc6"
    fd = libbpf.obj_get(str(map_pin(pin_dir, name)))
    try:
        kv = libbpf.MapFd(fd, name, _SVC_KEY[family].size, _ENDPOINT[family].size)
        return ServiceTable(kv, kv).read(frontend)
    finally:
        os.close(fd)


def unlinked_hooks(pin_dir: Path) -> list[str]:
    """The hooks without a pinned link under ``pin_dir`` (not attached by us)."""
    return [hook for hook in PROGRAMS if not (pin_dir / f"link_{hook}").exists()]


def cleanup(pin_dir: Path = DEFAULT_PIN_PATH) -> list[str]:
    """Detach our links and remove every pin under ``pin_dir``; what was removed."""
    if not pin_dir.is_dir():
        return []
    removed = []
    for hook in PROGRAMS:
        pin = pin_dir / f"link_{hook}"
        if pin.exists():
            libbpf.link_detach_pinned(str(pin))
            removed.append(f"bpf link {hook} ({pin})")
    for name in MAPS:
        pin = map_pin(pin_dir, name)
        if pin.exists():
            pin.unlink()
            removed.append(f"bpf map {name} ({pin})")
    for leftover in pin_dir.iterdir():
        leftover.unlink()
        removed.append(f"bpf pin {leftover}")
    pin_dir.rmdir()
    return removed


def frontends_by_slots(entries: Mapping[Frontend, Backends]) -> int:
    """How many map entries ``entries`` take (one per frontend plus one per slot)."""
    return sum(1 + len(backends.targets) for backends in entries.values())
