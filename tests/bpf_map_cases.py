"""BPF hash map operations and what the kernel does with them: the cases
:class:`~kubeproxy.dataplane.bpf.socklb.FakeMap` is checked against, without root
(tests/unit/test_fake_parity.py) and as root against
:class:`~kubeproxy.dataplane.bpf.libbpf.MapFd` on a ``BPF_MAP_TYPE_HASH`` map made for
the case in the host's kernel (tests/kernel/test_fakes_vs_kernel.py), the type of
``kp_svc4``/``kp_svc6``, the maps the fake stands in for. See tests/parity.py.

Each case starts with :func:`create` (key size, value size, capacity). A refusal is
described by its errno's name. The state compared after each step is every key with its
value.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass

from kubeproxy.dataplane.bpf.libbpf import BPF_ANY, BPF_EXIST, BPF_NOEXIST, BpfError
from kubeproxy.dataplane.bpf.socklb import KVMap
from tests.parity import Call, Case, Op, Step, Table

# A map of key size, value size and capacity, on the real or the fake side.
MakeMap = Callable[[int, int, int], KVMap]


@dataclass
class MapSystem:
    make: MakeMap
    map: KVMap | None = None

    @property
    def kv(self) -> KVMap:
        assert self.map is not None, "a case starts with create()"
        return self.map


def _describe(err: Exception) -> str:
    assert isinstance(err, BpfError)
    return errno.errorcode.get(err.errno or 0, str(err.errno))


def _state(system: MapSystem, refused: bool) -> object:
    return None if system.map is None else sorted(system.map.items())


TABLE = Table[MapSystem]((BpfError,), _describe, _state)


def create(key_size: int, value_size: int, max_entries: int) -> Call[MapSystem]:
    def run(s: MapSystem) -> object:
        s.map = s.make(key_size, value_size, max_entries)
        return None

    text = f"a hash map: key {key_size} B, value {value_size} B, {max_entries} entries"
    return Call(text, run)


def update(key: bytes, value: bytes, flags: int = BPF_ANY) -> Call[MapSystem]:
    text = f"update {key.hex()} = {value.hex()} flags {flags}"
    return Call(text, lambda s: s.kv.update(key, value, flags))


def lookup(key: bytes) -> Call[MapSystem]:
    return Call(f"lookup {key.hex()}", lambda s: s.kv.lookup(key))


def delete(key: bytes) -> Call[MapSystem]:
    return Call(f"delete {key.hex()}", lambda s: s.kv.delete(key))


def ok(op: Op[MapSystem], result: object = None) -> Step[MapSystem]:
    return Step(op, result=result)


def refused(code: str, op: Op[MapSystem]) -> Step[MapSystem]:
    return Step(op, error=f"^{code}$")


def case(name: str, *steps: Step[MapSystem]) -> Case[MapSystem]:
    return Case(name, steps)


def k(n: int, size: int = 4) -> bytes:
    return n.to_bytes(size, "little")


V1, V2 = b"\x01" * 4, b"\x02" * 4

CASES: list[Case[MapSystem]] = [
    case(
        "Update, look up and delete",
        ok(create(4, 4, 8)),
        ok(update(k(1), V1)),
        ok(lookup(k(1)), V1),
        ok(lookup(k(2)), None),
        ok(update(k(1), V2)),  # BPF_ANY replaces
        ok(lookup(k(1)), V2),
        ok(delete(k(1)), True),
        ok(delete(k(1)), False),
    ),
    case(
        "BPF_NOEXIST only creates, BPF_EXIST only replaces",
        ok(create(4, 4, 8)),
        ok(update(k(1), V1, BPF_NOEXIST)),
        refused("EEXIST", update(k(1), V2, BPF_NOEXIST)),
        refused("ENOENT", update(k(2), V1, BPF_EXIST)),
        ok(update(k(1), V2, BPF_EXIST)),
        ok(lookup(k(1)), V2),
    ),
    case(
        "Other flags are EINVAL (BPF_F_LOCK needs a map with a spin lock)",
        ok(create(4, 4, 8)),
        refused("EINVAL", update(k(1), V1, BPF_NOEXIST | BPF_EXIST)),
        refused("EINVAL", update(k(1), V1, 4)),
        refused("EINVAL", update(k(1), V1, 8)),
    ),
    case(
        "A full map refuses a new key (E2BIG) and still replaces",
        ok(create(4, 4, 2)),
        ok(update(k(1), V1)),
        ok(update(k(2), V1)),
        refused("E2BIG", update(k(3), V1)),
        ok(update(k(2), V2)),
        ok(delete(k(1)), True),
        ok(update(k(3), V1)),
    ),
    case(
        "Keys and values of another size are EINVAL",
        ok(create(12, 8, 8)),
        refused("EINVAL", update(k(1, 11), b"\0" * 8)),
        refused("EINVAL", update(k(1, 13), b"\0" * 8)),
        refused("EINVAL", update(k(1, 12), b"\0" * 7)),
        refused("EINVAL", update(k(1, 12), b"\0" * 9)),
        refused("EINVAL", lookup(k(1, 4))),
        refused("EINVAL", delete(k(1, 4))),
        ok(update(k(1, 12), b"\0" * 8)),
    ),
]
