"""ClusterIP allocation rules (kubeproxy.controlplane.ipallocator), table by table.

Covers the docs' band sizes (/28, /24, /16, /12, IPv6 /108), the addresses that are never
allocatable, the dynamic-before-static order, several ServiceCIDRs (overlap, deletion,
readiness), dual stack, and the legacy bitmap's limits; Hypothesis checks the invariants
over random operation sequences.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeproxy.controlplane.ipallocator import (
    AllocationError,
    Allocator,
    BitmapAllocator,
    ClusterIPAllocator,
    ErrAllocated,
    ErrFull,
    ErrMismatchedNetwork,
    ErrNotInRange,
    MetaAllocator,
    calculate_range_offset,
    service_parent_ref,
)


@pytest.mark.parametrize(
    ("cidr", "offset"),
    [
        ("10.0.0.0/32", 0),
        ("10.0.0.0/31", 0),
        ("10.0.0.0/30", 0),
        ("10.0.0.0/28", 0),  # 16 addresses: too small to split
        ("10.0.0.0/27", 16),  # 32/16 = 2, raised to the minimum 16
        ("10.0.0.0/24", 16),
        ("10.0.0.0/23", 32),
        ("10.0.0.0/22", 64),
        ("10.0.0.0/21", 128),
        ("10.0.0.0/20", 256),
        ("10.0.0.0/16", 256),  # 4096, capped at 256
        ("10.0.0.0/12", 256),
        ("fd00::/124", 0),
        ("fd00::/120", 16),
        ("fd00::/112", 256),
        ("fd00::/108", 256),
        ("fd00::/64", 256),
        ("10.0.0.5/24", 16),  # host bits are ignored, as ParseCIDRSloppy does
    ],
)
def test_range_offset_formula(cidr: str, offset: int) -> None:
    assert calculate_range_offset(cidr) == offset


@pytest.mark.parametrize(
    ("cidr", "static", "dynamic", "usable"),
    [
        ("10.0.0.0/28", None, ("10.0.0.1", "10.0.0.14"), 14),
        ("10.0.0.0/24", ("10.0.0.1", "10.0.0.16"), ("10.0.0.17", "10.0.0.254"), 254),
        ("10.0.0.0/16", ("10.0.0.1", "10.0.1.0"), ("10.0.1.1", "10.0.255.254"), 65534),
        ("10.0.0.0/12", ("10.0.0.1", "10.0.1.0"), ("10.0.1.1", "10.15.255.254"), 2**20 - 2),
        ("fd00::/108", ("fd00::1", "fd00::100"), ("fd00::101", "fd00::f:ffff"), 2**20 - 1),
    ],
)
def test_band_sizes_from_the_docs(
    cidr: str, static: tuple[str, str] | None, dynamic: tuple[str, str], usable: int
) -> None:
    allocator = Allocator(cidr)
    assert allocator.static_band() == static
    assert allocator.dynamic_band() == dynamic
    assert allocator.size == usable == allocator.free()


@pytest.mark.parametrize(
    ("cidr", "ip", "allowed"),
    [
        ("10.0.0.0/24", "10.0.0.0", False),  # network address
        ("10.0.0.0/24", "10.0.0.255", False),  # IPv4 broadcast
        ("10.0.0.0/24", "10.0.0.1", True),
        ("10.0.0.0/24", "10.0.0.254", True),
        ("10.0.0.0/24", "10.0.1.1", False),
        ("10.0.0.0/24", "fd00::1", False),
        ("fd00::/120", "fd00::", False),  # network address
        ("fd00::/120", "fd00::ff", True),  # IPv6 has no broadcast: all-ones is usable
        ("fd00::/120", "fd00::100", False),
        ("10.0.0.0/32", "10.0.0.0", False),
        ("10.0.0.0/31", "10.0.0.1", False),
        ("fd00::/127", "fd00::1", True),
    ],
)
def test_which_addresses_are_allocatable(cidr: str, ip: str, allowed: bool) -> None:
    allocator = Allocator(cidr)
    if allowed:
        allocator.allocate(ip)
        assert allocator.has(ip)
    else:
        with pytest.raises(ErrNotInRange, match=rf"\({ip}\) is not in the valid range"):
            allocator.allocate(ip)


def test_errors_share_one_base_and_read_like_upstream() -> None:
    allocator = Allocator("10.0.0.0/30")
    allocator.allocate("10.0.0.1")
    with pytest.raises(ErrAllocated, match="provided IP is already allocated"):
        allocator.allocate("10.0.0.1")
    with pytest.raises(ErrNotInRange, match=r"not in the valid range.*10\.0\.0\.0/30"):
        allocator.allocate("10.0.0.9")
    allocator.allocate_next()
    with pytest.raises(ErrFull, match="range is full"):
        allocator.allocate_next()
    for error in (ErrFull, ErrAllocated, ErrNotInRange, ErrMismatchedNetwork):
        assert issubclass(error, AllocationError)


def test_ipv6_prefixes_shorter_than_64_are_refused() -> None:
    with pytest.raises(ValueError, match="shortest allowed prefix length"):
        Allocator("fd00::/63")
    assert Allocator("fd00::/64").size == 2**64 - 1


def test_allocate_next_is_deterministic_with_an_injected_rng() -> None:
    first, again = (Allocator("10.0.0.0/24", rng=random.Random(7)) for _ in range(2))
    assert [first.allocate_next() for _ in range(20)] == [again.allocate_next() for _ in range(20)]


def test_dynamic_band_fills_before_the_static_band() -> None:
    allocator = Allocator("10.0.0.0/27", rng=random.Random(1))  # 14 dynamic, 16 static
    dynamic = {allocator.allocate_next() for _ in range(14)}
    assert dynamic == {f"10.0.0.{i}" for i in range(17, 31)}
    static = {allocator.allocate_next() for _ in range(16)}
    assert static == {f"10.0.0.{i}" for i in range(1, 17)}
    with pytest.raises(ErrFull, match="range is full"):
        allocator.allocate_next()


def test_static_band_picks_are_skipped_by_allocate_next() -> None:
    allocator = Allocator("10.0.0.0/27", rng=random.Random(2))
    allocator.allocate("10.0.0.20")  # a hand-picked address in the dynamic band
    got = {allocator.allocate_next() for _ in range(13)}
    assert "10.0.0.20" not in got and len(got) == 13
    assert allocator.used() == 14 and allocator.free() == 16


def test_release_makes_an_address_reusable_and_is_a_no_op_otherwise() -> None:
    allocator = Allocator("10.0.0.0/30", rng=random.Random(3))
    a = allocator.allocate_next()
    allocator.release(a)
    allocator.release(a)  # releasing a free address, or one elsewhere, is a no-op
    allocator.release("192.168.0.1")
    b, c = allocator.allocate_next(), allocator.allocate_next()
    assert a in (b, c) and {b, c} == {"10.0.0.1", "10.0.0.2"}


def test_ip_address_objects_record_allocations() -> None:
    allocator = Allocator("10.0.0.0/24")
    allocator.allocate("10.0.0.5", service_parent_ref("default", "web"))
    (obj,) = allocator.registry.objects()
    assert obj["metadata"] == {
        "name": "10.0.0.5",
        "labels": {
            "ipaddress.kubernetes.io/ip-family": "IPv4",
            "ipaddress.kubernetes.io/managed-by": "ipallocator.k8s.io",
        },
    }
    assert obj["spec"]["parentRef"] == {
        "group": "",
        "resource": "services",
        "namespace": "default",
        "name": "web",
    }


# ------------------------------------------------------------------ several ServiceCIDRs


def _cidr(name: str, *cidrs: str, ready: bool | None = True, deleting: bool = False) -> dict:  # type: ignore[type-arg]
    meta: dict[str, str] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    status = (
        {}
        if ready is None
        else {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    )
    return {"metadata": meta, "spec": {"cidrs": list(cidrs)}, "status": status}


def test_several_cidrs_of_one_family() -> None:
    meta = MetaAllocator("IPv4", rng=random.Random(4))
    meta.sync_service_cidrs(
        [_cidr("kubernetes", "10.96.0.0/29", "fd00::/120"), _cidr("extra", "10.97.0.0/29")]
    )
    assert meta.cidrs() == [("10.96.0.0/29", True), ("10.97.0.0/29", True)]
    got = {meta.allocate_next() for _ in range(12)}
    assert len(got) == 12
    assert all(ip.startswith(("10.96.0.", "10.97.0.")) for ip in got)
    with pytest.raises(ErrFull, match="range is full"):
        meta.allocate_next()
    assert meta.free() == 0


def test_overlapping_cidrs_never_share_an_address() -> None:
    meta = MetaAllocator("IPv4", rng=random.Random(5))
    meta.sync_service_cidrs([_cidr("a", "10.96.0.0/28"), _cidr("b", "10.96.0.0/29")])
    meta.allocate("10.96.0.3")  # inside both
    with pytest.raises(ErrAllocated, match="provided IP is already allocated"):
        meta.allocate("10.96.0.3")
    got = [meta.allocate_next() for _ in range(13)]
    assert len(set(got)) == 13 and "10.96.0.3" not in got
    assert meta.free() == 0  # the /29 inside the /28 is not counted twice


def test_an_address_one_cidr_cannot_hold_goes_to_an_overlapping_one_that_can() -> None:
    """As kube-apiserver's MetaAllocator: a ServiceCIDR holds an address when it is one of
    its hosts (not its network address, nor its IPv4 broadcast address), so the broadcast
    address of a /27 is an ordinary address of a /26 around it (found against the real
    kube-apiserver: tests/realk8s/test_controlplane_parity.py)."""
    meta = MetaAllocator("IPv4")
    meta.sync_service_cidrs([_cidr("kubernetes", "10.100.0.0/27"), _cidr("wider", "10.100.0.0/26")])
    meta.allocate("10.100.0.31")
    assert meta.has("10.100.0.31")
    for edge in ("10.100.0.0", "10.100.0.63"):  # network of both, broadcast of the /26
        with pytest.raises(ErrMismatchedNetwork, match=r"^the provided network does not match"):
            meta.allocate(edge)
    meta.release("10.100.0.31")
    assert not meta.has("10.100.0.31")
    ipv6 = MetaAllocator("IPv6")
    ipv6.sync_service_cidrs([_cidr("kubernetes", "fd00::/123")])
    ipv6.allocate("fd00::1f")  # IPv6 has no broadcast address
    with pytest.raises(ErrMismatchedNetwork, match=r"^the provided network does not match"):
        ipv6.allocate("fd00::")


def _old_and_new(ready: bool | None, deleting: bool) -> tuple[MetaAllocator, str]:
    """ServiceCIDR "old" (10.96.0.0/29, one address taken) changed to ``ready`` and
    ``deleting``, and "new" (10.97.0.0/29) after it; the address taken."""
    meta = MetaAllocator("IPv4", rng=random.Random(6))
    meta.sync_service_cidrs([_cidr("old", "10.96.0.0/29")])
    kept = meta.allocate_next()
    meta.sync_service_cidrs(
        [_cidr("old", "10.96.0.0/29", ready=ready, deleting=deleting), _cidr("new", "10.97.0.0/29")]
    )
    return meta, kept


@pytest.mark.parametrize("ready", [True, None])  # no Ready condition counts as ready
def test_a_ready_cidr_keeps_receiving_allocations(ready: bool | None) -> None:
    meta, kept = _old_and_new(ready, deleting=False)
    assert meta.cidrs() == [("10.96.0.0/29", True), ("10.97.0.0/29", True)]
    picks = [meta.allocate_next() for _ in range(6)]
    # The old CIDR comes first: its five free addresses, then the new one's.
    assert {*picks[:5], kept} == {f"10.96.0.{i}" for i in range(1, 7)}
    assert picks[5].startswith("10.97.0.")
    meta.release(picks[0])
    meta.allocate(picks[0])  # and by address


@pytest.mark.parametrize(("ready", "deleting"), [(False, False), (True, True)])
def test_a_cidr_being_deleted_or_not_ready_stops_receiving_allocations(
    ready: bool | None, deleting: bool
) -> None:
    meta, kept = _old_and_new(ready, deleting)
    assert meta.cidrs() == [("10.96.0.0/29", False), ("10.97.0.0/29", True)]
    picks = {meta.allocate_next() for _ in range(6)}
    assert all(ip.startswith("10.97.0.") for ip in picks)
    free = next(f"10.96.0.{i}" for i in range(1, 7) if f"10.96.0.{i}" != kept)
    # kube-apiserver's MetaAllocator's words for an address no allocatable CIDR holds.
    with pytest.raises(ErrMismatchedNetwork, match=r"^the provided network does not match"):
        meta.allocate(free)
    meta.release(kept)  # releasing still works, so the ServiceCIDR can finish deleting
    assert not meta.has(kept)


def test_a_cidr_no_servicecidr_names_is_dropped() -> None:
    meta = MetaAllocator("IPv4")
    meta.sync_service_cidrs([_cidr("a", "10.96.0.0/29"), _cidr("b", "10.97.0.0/29")])
    meta.sync_service_cidrs([_cidr("b", "10.97.0.0/29")])
    assert meta.cidrs() == [("10.97.0.0/29", True)]
    with pytest.raises(ErrMismatchedNetwork, match=r"^the provided network does not match"):
        meta.allocate("10.96.0.1")


def test_two_servicecidrs_with_one_cidr_are_ready_if_either_is() -> None:
    meta = MetaAllocator("IPv4")
    meta.sync_service_cidrs([_cidr("a", "10.96.0.0/29", deleting=True), _cidr("b", "10.96.0.0/29")])
    assert meta.cidrs() == [("10.96.0.0/29", True)]


def test_dual_stack_gets_one_address_per_family() -> None:
    allocator = ClusterIPAllocator(
        [_cidr("kubernetes", "10.96.0.0/24", "fd00:10:96::/112")], rng=random.Random(8)
    )
    v4, v6 = allocator.allocate_cluster_ips(["IPv4", "IPv6"])
    assert v4.startswith("10.96.0.") and v6.startswith("fd00:10:96::")
    assert allocator.allocate_cluster_ips(["IPv6", "IPv4"], ["fd00:10:96::5", ""])[0] == (
        "fd00:10:96::5"
    )
    assert allocator.has(v4) and allocator.has("fd00:10:96::5")


def test_dual_stack_is_all_or_nothing() -> None:
    allocator = ClusterIPAllocator([_cidr("kubernetes", "10.96.0.0/24", "fd00::/120")])
    allocator.allocate_cluster_ips(["IPv6"], ["fd00::7"])
    with pytest.raises(ErrAllocated, match="provided IP is already allocated"):
        allocator.allocate_cluster_ips(["IPv4", "IPv6"], ["10.96.0.9", "fd00::7"])
    assert not allocator.has("10.96.0.9")  # the IPv4 half was given back
    with pytest.raises(ErrNotInRange, match="The range of valid IPs is the IPv4 ServiceCIDRs"):
        allocator.allocate_cluster_ips(["IPv4"], ["fd00::8"])


# ------------------------------------------------------------------------ legacy bitmap


@pytest.mark.parametrize(
    ("cidr", "size", "last"),
    [("10.0.0.0/12", 2**20 - 2, "10.15.255.254"), ("fd00::/108", 65535, "fd00::ffff")],
)
def test_the_bitmap_allocator_takes_ranges_up_to_its_limit(cidr: str, size: int, last: str) -> None:
    allocator = BitmapAllocator(cidr)
    assert allocator.size == size
    allocator.allocate(last)
    assert allocator.has(last) and allocator.free() == size - 1


@pytest.mark.parametrize("cidr", ["10.0.0.0/11", "fd00::/107"])
def test_the_bitmap_allocator_refuses_larger_ranges(cidr: str) -> None:
    with pytest.raises(ValueError, match="too large for the bitmap allocator"):
        BitmapAllocator(cidr)


def test_bitmap_allocator_tracks_only_the_first_65535_ipv6_hosts() -> None:
    legacy, current = BitmapAllocator("fd00::/108"), Allocator("fd00::/108")
    assert legacy.size == 65535 and current.size == 2**20 - 1
    legacy.allocate("fd00::ffff")
    with pytest.raises(ErrNotInRange, match="The range of valid IPs is fd00::/108"):
        legacy.allocate("fd00::1:0")
    current.allocate("fd00::1:0")


def test_bitmap_and_ipaddress_allocators_pick_the_same_addresses() -> None:
    legacy = BitmapAllocator("10.0.0.0/26", rng=random.Random(9))
    current = Allocator("10.0.0.0/26", rng=random.Random(9))
    for _ in range(62):
        assert legacy.allocate_next() == current.allocate_next()
    for allocator in (legacy, current):
        with pytest.raises(ErrFull, match="range is full"):
            allocator.allocate_next()
        allocator.release("10.0.0.40")
        assert allocator.free() == 1 and not allocator.has("10.0.0.40")


# ------------------------------------------------------------------------- properties

_OPS = st.lists(
    st.one_of(
        st.just(("next", 0)),
        st.tuples(st.just("take"), st.integers(0, 40)),
        st.tuples(st.just("release"), st.integers(0, 40)),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, seed=st.integers(0, 2**16), legacy=st.booleans())
def test_allocator_invariants(ops: list[tuple[str, int]], seed: int, legacy: bool) -> None:
    """Never the same IP twice; static band only once dynamic is full; releases reusable."""
    allocator: Allocator | BitmapAllocator = (
        BitmapAllocator("10.1.0.0/27", rng=random.Random(seed))
        if legacy
        else Allocator("10.1.0.0/27", rng=random.Random(seed))
    )
    held: set[str] = set()
    static = {f"10.1.0.{i}" for i in range(1, 17)}
    dynamic = {f"10.1.0.{i}" for i in range(17, 31)}
    for op, n in ops:
        ip = f"10.1.0.{n}"
        if op == "next":
            if len(held) == 30:
                with pytest.raises(ErrFull, match="range is full"):
                    allocator.allocate_next()
                continue
            dynamic_full = dynamic <= held
            got = allocator.allocate_next()
            assert got not in held
            assert (got in static) == dynamic_full
            held.add(got)
        elif op == "take":
            if ip not in static | dynamic:
                with pytest.raises(ErrNotInRange, match=rf"\({ip}\) is not in the valid range"):
                    allocator.allocate(ip)
            elif ip in held:
                with pytest.raises(ErrAllocated, match="provided IP is already allocated"):
                    allocator.allocate(ip)
            else:
                allocator.allocate(ip)
                held.add(ip)
        else:
            allocator.release(ip)
            held.discard(ip)
        assert allocator.used() == len(held)
        assert allocator.free() == 30 - len(held)
    for ip in list(held):
        allocator.release(ip)
    assert {allocator.allocate_next() for _ in range(30)} == static | dynamic
