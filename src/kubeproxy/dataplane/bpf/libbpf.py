"""A small typed ctypes layer over libbpf (``libbpf.so.1``, Debian's ``libbpf1``).

No maintained Python binding of libbpf exists (PyPI has 0.0.x wrappers; bcc brings its
own compiler and runtime), so the few calls kubeproxy needs are declared here:

* :class:`BpfObject` — open an ELF object, pin/reuse its maps by path, load it (the
  kernel's verifier runs here), find programs and maps;
* :class:`Link` — attach a program to a cgroup, pin the link, re-open a pinned link and
  swap its program atomically (a restart without a gap), detach;
* :class:`MapFd` — lookup / update / delete / iterate on a map by file descriptor
  (bytes in, bytes out: packing belongs to the caller);
* :func:`obj_get`, :func:`link_detach_pinned` — what ``cleanup`` needs without an object.

libbpf 1.x returns NULL or a negative errno and sets ``errno``; every failure here raises
:class:`BpfError` with the call, the errno's text and libbpf's own last log lines (the
verifier log when the kernel refused a program).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import threading
from collections.abc import Iterator

from kubeproxy.dataplane.errors import DataplaneError

_LIB_NAMES = ("libbpf.so.1",)
BPF_ANY = 0
BPF_NOEXIST = 1
BPF_EXIST = 2
# enum libbpf_print_level
_LIBBPF_WARN, _LIBBPF_INFO, _LIBBPF_DEBUG = 0, 1, 2
_LOG_LINES = 40


class BpfError(OSError, DataplaneError):
    """A libbpf call failed; ``errno`` is set, the message says which call and why.

    An OSError first (its constructor and ``errno``), as it always was: callers catch
    it as one alongside the OSErrors of the file system.
    """

    tool = "libbpf"


_PrintFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class _Lib:
    """libbpf's functions with their C signatures, loaded once per process."""

    def __init__(self) -> None:
        last: OSError | None = None
        for name in _LIB_NAMES:
            try:
                self.lib = ctypes.CDLL(name, use_errno=True)
                break
            except OSError as err:
                last = err
        else:
            raise BpfError(
                errno.ENOENT,
                f"libbpf.so.1 not found ({last}); install Debian's libbpf1 package",
            )
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.log: list[str] = []
        self._log_lock = threading.Lock()
        vp, cp, ci = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        sz = ctypes.c_size_t
        for fn, res, args in (
            ("bpf_object__open_file", vp, [cp, vp]),
            ("bpf_object__load", ci, [vp]),
            ("bpf_object__close", None, [vp]),
            ("bpf_object__find_map_by_name", vp, [vp, cp]),
            ("bpf_object__find_program_by_name", vp, [vp, cp]),
            ("bpf_map__set_pin_path", ci, [vp, cp]),
            ("bpf_map__fd", ci, [vp]),
            ("bpf_program__fd", ci, [vp]),
            ("bpf_program__attach_cgroup", vp, [vp, ci]),
            ("bpf_link__pin", ci, [vp, cp]),
            ("bpf_link__open", vp, [cp]),
            ("bpf_link__update_program", ci, [vp, vp]),
            ("bpf_link__fd", ci, [vp]),
            ("bpf_link__disconnect", None, [vp]),
            ("bpf_link__destroy", ci, [vp]),
            ("bpf_map_update_elem", ci, [ci, vp, vp, ctypes.c_uint64]),
            ("bpf_map_lookup_elem", ci, [ci, vp, vp]),
            ("bpf_map_delete_elem", ci, [ci, vp]),
            ("bpf_map_get_next_key", ci, [ci, vp, vp]),
            ("bpf_obj_get", ci, [cp]),
            ("bpf_link_detach", ci, [ci]),
            ("bpf_obj_get_info_by_fd", ci, [ci, vp, ctypes.POINTER(ctypes.c_uint32)]),
            ("libbpf_set_print", vp, [_PrintFn]),
        ):
            f = getattr(self.lib, fn)
            f.restype = res
            f.argtypes = args
        self.libc.vsnprintf.restype = ci
        self.libc.vsnprintf.argtypes = [cp, sz, cp, vp]
        # Kept referenced: libbpf calls it for as long as the process lives.
        self._printer = _PrintFn(self._print)
        self.lib.libbpf_set_print(self._printer)

    def _print(self, level: int, fmt: bytes | None, args: int | None) -> int:
        if level == _LIBBPF_DEBUG or fmt is None:
            return 0
        buf = ctypes.create_string_buffer(4096)
        # On x86-64 and arm64 a va_list argument is passed as a pointer: forwarding it
        # to vsnprintf is how a C callback would format it too.
        self.libc.vsnprintf(buf, len(buf), fmt, args)
        with self._log_lock:
            self.log.extend(line for line in buf.value.decode(errors="replace").splitlines())
            del self.log[:-_LOG_LINES]
        return 0

    def take_log(self) -> list[str]:
        with self._log_lock:
            out, self.log = self.log, []
        return out


_lib: _Lib | None = None
_lib_lock = threading.Lock()


def lib() -> _Lib:
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _Lib()
        return _lib


def _fail(call: str, code: int | None = None) -> BpfError:
    err = abs(code) if code else ctypes.get_errno() or errno.EINVAL
    log = lib().take_log()
    detail = ("\n  " + "\n  ".join(log)) if log else ""
    return BpfError(err, f"{call}: {os.strerror(err)}{detail}")


def _check(call: str, code: int) -> int:
    if code < 0:
        raise _fail(call, code)
    return code


def _ptr(call: str, value: int | None) -> int:
    if not value:
        raise _fail(call)
    return value


class MapFd:
    """A BPF map by file descriptor; keys and values are raw bytes of fixed sizes.

    A key or value of another size is refused here (EINVAL): the kernel cannot tell,
    it copies the map's sizes from the pointers it is given (reading past a shorter
    buffer, ignoring the rest of a longer one)."""

    def __init__(self, fd: int, name: str, key_size: int, value_size: int) -> None:
        self.fd = fd
        self.name = name
        self.key_size = key_size
        self.value_size = value_size

    def _sized(self, call: str, key: bytes, value: bytes | None = None) -> None:
        if len(key) != self.key_size or (value is not None and len(value) != self.value_size):
            sizes = f"{len(key)}-byte key" + (f", {len(value)}-byte value" if value else "")
            raise BpfError(
                errno.EINVAL,
                f"{call} {self.name}: {sizes} (the map's: {self.key_size}, {self.value_size})",
            )

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        self._sized("update", key, value)
        _check(
            f"update {self.name}",
            lib().lib.bpf_map_update_elem(self.fd, key, value, flags),
        )

    def lookup(self, key: bytes) -> bytes | None:
        self._sized("lookup", key)
        out = ctypes.create_string_buffer(self.value_size)
        if lib().lib.bpf_map_lookup_elem(self.fd, key, out) < 0:
            if ctypes.get_errno() == errno.ENOENT:
                return None
            raise _fail(f"lookup {self.name}")
        return out.raw

    def delete(self, key: bytes) -> bool:
        """False if the key was not there."""
        self._sized("delete", key)
        if lib().lib.bpf_map_delete_elem(self.fd, key) < 0:
            if ctypes.get_errno() == errno.ENOENT:
                return False
            raise _fail(f"delete {self.name}")
        return True

    def keys(self) -> Iterator[bytes]:
        prev: bytes | None = None
        out = ctypes.create_string_buffer(self.key_size)
        while lib().lib.bpf_map_get_next_key(self.fd, prev, out) == 0:
            prev = out.raw
            yield prev
        if ctypes.get_errno() != errno.ENOENT:
            raise _fail(f"iterate {self.name}")

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        for key in list(self.keys()):
            value = self.lookup(key)
            if value is not None:
                yield key, value


class BpfObject:
    """An opened (then loaded) ELF object file; close() releases what is not pinned."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._obj: int = _ptr(f"open {path}", lib().lib.bpf_object__open_file(path.encode(), None))

    def _map(self, name: str) -> int:
        return _ptr(
            f"map {name} in {self.path}",
            lib().lib.bpf_object__find_map_by_name(self._obj, name.encode()),
        )

    def pin_map(self, name: str, path: str) -> None:
        """Before load: reuse the map pinned at ``path`` (if compatible), else pin it there."""
        _check(
            f"pin path of {name}",
            lib().lib.bpf_map__set_pin_path(self._map(name), path.encode()),
        )

    def load(self) -> None:
        _check(f"load {self.path}", lib().lib.bpf_object__load(self._obj))

    def map_fd(self, name: str, key_size: int, value_size: int) -> MapFd:
        fd = _check(f"fd of map {name}", lib().lib.bpf_map__fd(self._map(name)))
        return MapFd(fd, name, key_size, value_size)

    def program(self, name: str) -> int:
        return _ptr(
            f"program {name} in {self.path}",
            lib().lib.bpf_object__find_program_by_name(self._obj, name.encode()),
        )

    def close(self) -> None:
        if self._obj:
            lib().lib.bpf_object__close(self._obj)
            self._obj = 0


class Link:
    """A bpf_link (program attached to a hook); pinned, it outlives this process."""

    def __init__(self, ptr: int, what: str) -> None:
        self._ptr = ptr
        self.what = what

    @classmethod
    def attach_cgroup(cls, program: int, cgroup_fd: int, what: str) -> Link:
        return cls(
            _ptr(f"attach {what}", lib().lib.bpf_program__attach_cgroup(program, cgroup_fd)),
            what,
        )

    @classmethod
    def open_pinned(cls, path: str) -> Link:
        return cls(_ptr(f"open link {path}", lib().lib.bpf_link__open(path.encode())), path)

    def pin(self, path: str) -> None:
        _check(f"pin {self.what} at {path}", lib().lib.bpf_link__pin(self._ptr, path.encode()))

    def update_program(self, program: int) -> None:
        """Swap the attached program in one step: no moment without a program."""
        _check(f"update {self.what}", lib().lib.bpf_link__update_program(self._ptr, program))

    @property
    def fd(self) -> int:
        return int(lib().lib.bpf_link__fd(self._ptr))

    def info(self) -> LinkInfo:
        return link_info(self.fd)

    def close(self) -> None:
        """Release our handle; a pinned link stays attached."""
        if self._ptr:
            lib().lib.bpf_link__disconnect(self._ptr)
            lib().lib.bpf_link__destroy(self._ptr)
            self._ptr = 0


class LinkInfo(ctypes.Structure):
    """The head of ``struct bpf_link_info`` for a cgroup link (uapi linux/bpf.h)."""

    _fields_ = (
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("prog_id", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("cgroup_id", ctypes.c_uint64),
        ("attach_type", ctypes.c_uint32),
        ("_rest", ctypes.c_uint8 * 44),
    )


def link_info(fd: int) -> LinkInfo:
    info = LinkInfo()
    size = ctypes.c_uint32(ctypes.sizeof(info))
    _check("link info", lib().lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), size))
    return info


def obj_get(path: str) -> int:
    """A file descriptor for the object pinned at ``path``."""
    return _check(f"open {path}", lib().lib.bpf_obj_get(path.encode()))


def link_detach_pinned(path: str) -> None:
    """Detach the link pinned at ``path`` (whoever else holds it) and remove the pin."""
    fd = obj_get(path)
    try:
        _check(f"detach {path}", lib().lib.bpf_link_detach(fd))
    finally:
        os.close(fd)
    os.unlink(path)


def available() -> str | None:
    """None if libbpf can be loaded here, else why not."""
    try:
        lib()
    except BpfError as err:
        return str(err)
    return None
