"""ClusterIP allocation, as kube-apiserver does it (``pkg/registry/core/service/ipallocator``).

Map of this module:

* :func:`calculate_range_offset` — the size of the *static* lower band of a Service CIDR,
  ``min(max(16, size/16), 256)`` with ``size`` the CIDR's full size (``k8s.io/utils/net``
  ``RangeSize``), and 0 when the CIDR has 16 addresses or fewer (KEP-3070).
* :class:`Allocator` — one CIDR, allocations recorded as IPAddress objects
  (``ipallocator.go``). The network address is never allocatable; the IPv4 broadcast
  address neither, while the IPv6 all-ones address is (IPv6 has no broadcast). IPv6
  prefixes shorter than /64 are refused, as upstream.
* :class:`MetaAllocator` — one IP family over every ServiceCIDR object of that family
  (``cidrallocator.go``): several CIDRs, overlapping ones included, share one set of
  IPAddress objects (:class:`IPAddressRegistry`), so an address is never handed out twice
  even when two CIDRs contain it. An address belongs to the first CIDR that has it as a
  host (:func:`prefix_contains_ip`: not the network address, nor the IPv4 broadcast
  address), so one CIDR's edge can be a wider CIDR's ordinary address. A CIDR whose
  ServiceCIDR is being deleted (or whose Ready condition is False) stops receiving
  allocations but can still release.
* :class:`ClusterIPAllocator` — both families: one IP per requested family, all or nothing
  (what a dual-stack Service gets).
* :class:`BitmapAllocator` — the legacy allocator (``bitmap.go`` over
  ``allocator/bitmap.go``), kept for its different limits; see "default" below.
* Errors: :class:`AllocationError` and its subclasses :class:`ErrFull`,
  :class:`ErrAllocated`, :class:`ErrNotInRange` (plus :class:`ErrMismatchedNetwork`, a
  kind of ErrNotInRange for "no ready ServiceCIDR holds this address").

**Which is the default, and why.** The IPAddress-object allocators are: upstream's
``MultiCIDRServiceAllocator`` feature is GA and locked on since Kubernetes 1.33, and
``DisableAllocatorDualWrite`` (stop mirroring into the old bitmap) is GA since 1.34. The
bitmap allocator differs in what it accepts, not in how it picks: one CIDR only, at most a
/12 for IPv4 and a /108 for IPv6 (kube-apiserver refuses larger ``--service-cluster-ip-range``
values for it), and for IPv6 it only ever tracks the first 65,535 hosts of the range (its
bitmap is capped at 65,536 bits); both pick with the same two-band random scan
(``_bands.scan_banded``) from the same injected :class:`random.Random`.

Everything here is in memory and deterministic given the RNG: no API server, no clock.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kubeproxy.controlplane._bands import AllocationBitmap, scan_banded

IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Labels and manager name upstream puts on every IPAddress object it creates.
LABEL_IP_FAMILY = "ipaddress.kubernetes.io/ip-family"
LABEL_MANAGED_BY = "ipaddress.kubernetes.io/managed-by"
CONTROLLER_NAME = "ipallocator.k8s.io"

# Bounds of the static band, from KEP-3070: min(max(16, size/16), 256).
_BAND_MIN = 16
_BAND_MAX = 256
_BAND_STEP = 16
# The legacy allocator keeps a bitmap; kube-apiserver caps it (IPv6: 65,536 bits) and
# refuses ranges with more than 20 host bits (/12 for IPv4, /108 for IPv6).
_BITMAP_IPV6_MAX = 65536
_BITMAP_MAX_HOST_BITS = 20


class AllocationError(Exception):
    """Base of every allocation failure in :mod:`kubeproxy.controlplane`."""


# The Err* names are upstream's (ErrFull, ErrAllocated, ErrNotInRange), kept for grep-ability.
class ErrFull(AllocationError):  # noqa: N818
    def __init__(self, message: str = "range is full") -> None:
        super().__init__(message)


class ErrAllocated(AllocationError):  # noqa: N818
    def __init__(self, message: str = "provided IP is already allocated") -> None:
        super().__init__(message)


class ErrNotInRange(AllocationError):  # noqa: N818
    def __init__(self, value: object, valid_range: str, *, what: str = "IP") -> None:
        super().__init__(
            f"the provided {what} ({value}) is not in the valid range. "
            f"The range of valid {what}s is {valid_range}"
        )
        self.value = value
        self.valid_range = valid_range


class ErrMismatchedNetwork(ErrNotInRange):
    """No ready ServiceCIDR holds the address (upstream's ``ErrMismatchedNetwork``, and
    its words, which kube-apiserver returns for any requested ClusterIP outside them)."""

    def __init__(self, value: object, valid_range: str) -> None:
        super().__init__(value, valid_range)
        self.args = ("the provided network does not match the current range",)


def parse_cidr(cidr: str | IPNet) -> IPNet:
    """A CIDR with its host bits cleared, as Go's ``ParseCIDRSloppy`` returns it."""
    if isinstance(cidr, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return cidr
    return ipaddress.ip_network(cidr, strict=False)


def parse_ip(ip: str | IPAddr) -> IPAddr:
    if isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return ip
    return ipaddress.ip_address(ip)


def family_of(network: IPNet | IPAddr) -> str:
    return "IPv4" if network.version == 4 else "IPv6"


def range_size(cidr: str | IPNet) -> int:
    """``k8s.io/utils/net.RangeSize``: the number of addresses of the whole CIDR.

    Upstream guards against overflow: a CIDR with 31+ (IPv4) or 127+ (IPv6) host bits
    answers 0, and 63+ host bits answer MaxInt64.
    """
    net = parse_cidr(cidr)
    host_bits = net.max_prefixlen - net.prefixlen
    if (net.version == 4 and host_bits >= 31) or (net.version == 6 and host_bits >= 127):
        return 0
    if host_bits >= 63:
        return 2**63 - 1
    return 1 << host_bits


def calculate_range_offset(cidr: str | IPNet) -> int:
    """The size of the static lower band: ``min(max(16, size/16), 256)``, 0 if size <= 16.

    >>> [calculate_range_offset(c) for c in ("10.0.0.0/28", "10.0.0.0/24", "10.0.0.0/16")]
    [0, 16, 256]
    """
    size = range_size(cidr)
    # A /28 has 16 addresses and 14 usable ones: too few to split.
    if size <= _BAND_MIN:
        return 0
    return min(max(_BAND_MIN, size // _BAND_STEP), _BAND_MAX)


class IPAddressRegistry:
    """The IPAddress objects (``networking.k8s.io/v1``) that record ClusterIP allocations.

    Several allocators share one registry: that is what makes an address unique across
    overlapping ServiceCIDRs. Keys are addresses; values are the objects in JSON form.
    """

    def __init__(self) -> None:
        self._objects: dict[IPAddr, dict[str, Any]] = {}

    def __contains__(self, ip: object) -> bool:
        return ip in self._objects

    def __len__(self) -> int:
        return len(self._objects)

    def create(self, ip: IPAddr, parent_ref: Mapping[str, Any] | None) -> None:
        if ip in self._objects:
            raise ErrAllocated
        obj: dict[str, Any] = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "IPAddress",
            "metadata": {
                "name": str(ip),
                "labels": {LABEL_IP_FAMILY: family_of(ip), LABEL_MANAGED_BY: CONTROLLER_NAME},
            },
            "spec": {"parentRef": dict(parent_ref)} if parent_ref is not None else {},
        }
        self._objects[ip] = obj

    def delete(self, ip: IPAddr) -> None:
        self._objects.pop(ip, None)

    def addresses(self) -> list[IPAddr]:
        return list(self._objects)

    def objects(self) -> list[dict[str, Any]]:
        """The IPAddress objects, as ``kubectl get ipaddresses -o json`` would list them."""
        return list(self._objects.values())


def service_parent_ref(namespace: str, name: str) -> dict[str, str]:
    """The ``spec.parentRef`` of a Service's IPAddress object."""
    return {"group": "", "resource": "services", "namespace": namespace, "name": name}


class _Range:
    """Index arithmetic over one CIDR: index ``i`` is address ``first + i``, ``0 <= i < size``.

    Both allocators number the usable addresses from the one after the network address;
    they differ only in ``size`` (see the module docstring).
    """

    def __init__(self, network: IPNet, size: int, rng: random.Random | None) -> None:
        self.network = network
        # A single-address range (/32, /128) has no usable address (size 0), and its
        # address + 1 may not exist (255.255.255.255/32).
        self.first: IPAddr = network.network_address + min(1, network.num_addresses - 1)
        self.size = max(0, size)
        self.band_offset = calculate_range_offset(network)
        self.rng = rng if rng is not None else random.Random()

    @property
    def cidr(self) -> str:
        return str(self.network)

    @property
    def family(self) -> str:
        return family_of(self.network)

    def index_of(self, ip: IPAddr) -> int | None:
        """The index of ``ip``, or None when it is not an allocatable address of this range."""
        if ip.version != self.network.version:
            return None
        index = int(ip) - int(self.first)
        if 0 <= index < self.size:
            return index
        return None

    def address(self, index: int) -> IPAddr:
        return self.first + index

    def not_in_range(self, ip: IPAddr | str) -> ErrNotInRange:
        return ErrNotInRange(ip, self.cidr)

    def static_band(self) -> tuple[str, str] | None:
        """First and last address of the static lower band (None when there is none)."""
        if self.band_offset == 0 or self.size == 0:
            return None
        return str(self.first), str(self.address(self.band_offset - 1))

    def dynamic_band(self) -> tuple[str, str] | None:
        """First and last address of the dynamic upper band (None when there is none)."""
        if self.size <= self.band_offset:
            return None
        return str(self.address(self.band_offset)), str(self.address(self.size - 1))


def hosts_per_network(network: IPNet) -> int:
    """Upstream ``hostsPerNetwork``: IPv4 ``2^h - 2``, IPv6 ``2^h - 1``, capped at 2^64-1."""
    host_bits = network.max_prefixlen - network.prefixlen
    if host_bits >= 64:
        return 2**64 - 1
    hosts = (1 << host_bits) - 1  # never the network address
    if network.version == 4:
        hosts -= 1  # nor the IPv4 broadcast address
    return max(0, hosts)


class Allocator(_Range):
    """ClusterIPs from one CIDR, recorded as IPAddress objects (upstream ``Allocator``).

    ``registry`` is shared when several allocators must not hand out the same address
    (:class:`MetaAllocator` does that); ``rng`` makes ``allocate_next`` deterministic.
    """

    def __init__(
        self,
        cidr: str | IPNet,
        *,
        registry: IPAddressRegistry | None = None,
        rng: random.Random | None = None,
    ) -> None:
        network = parse_cidr(cidr)
        if network.version == 6 and network.prefixlen < 64:
            raise ValueError(
                f"shortest allowed prefix length for service CIDR is 64, got {network.prefixlen}"
            )
        super().__init__(network, hosts_per_network(network), rng)
        self.registry = registry if registry is not None else IPAddressRegistry()
        # A MetaAllocator clears this for a CIDR whose ServiceCIDR is not ready/being deleted.
        self.ready = True

    def allocate(self, ip: str | IPAddr, parent_ref: Mapping[str, Any] | None = None) -> None:
        """Reserve ``ip``: ErrNotInRange outside the usable range, ErrAllocated if taken."""
        addr = parse_ip(ip)
        if self.index_of(addr) is None:
            raise self.not_in_range(addr)
        self.registry.create(addr, parent_ref)

    def allocate_next(self, parent_ref: Mapping[str, Any] | None = None) -> str:
        """A free address: dynamic band first (random start, wrapping), then static; ErrFull."""
        index = scan_banded(self.size, self.band_offset, self._is_free, self.rng)
        if index is None:
            raise ErrFull
        addr = self.address(index)
        self.registry.create(addr, parent_ref)
        return str(addr)

    def release(self, ip: str | IPAddr) -> None:
        """Give ``ip`` back. Releasing a free or out-of-range address is a no-op."""
        self.registry.delete(parse_ip(ip))

    def has(self, ip: str | IPAddr) -> bool:
        return parse_ip(ip) in self.registry

    def used(self) -> int:
        """Allocated addresses inside this CIDR (an overlapping CIDR's count them too)."""
        return sum(1 for ip in self.registry.addresses() if ip in self.network)

    def free(self) -> int:
        return max(0, self.size - self.used())

    def _is_free(self, index: int) -> bool:
        return self.address(index) not in self.registry


class BitmapAllocator(_Range):
    """The legacy single-CIDR allocator (upstream ``Range`` over an ``AllocationBitmap``)."""

    def __init__(self, cidr: str | IPNet, *, rng: random.Random | None = None) -> None:
        network = parse_cidr(cidr)
        host_bits = network.max_prefixlen - network.prefixlen
        if host_bits > _BITMAP_MAX_HOST_BITS:
            raise ValueError(
                f"service CIDR {network} is too large for the bitmap allocator: "
                f"at most {_BITMAP_MAX_HOST_BITS} host bits "
                f"(/{network.max_prefixlen - _BITMAP_MAX_HOST_BITS})"
            )
        size = 1 << host_bits
        if network.version == 6:
            size = min(size, _BITMAP_IPV6_MAX)
        else:
            size -= 1  # the IPv4 broadcast address is never in the bitmap
        super().__init__(network, size - 1, rng)  # nor the network address
        self._bitmap = AllocationBitmap(self.size, self.band_offset, self.rng)

    def allocate(self, ip: str | IPAddr) -> None:
        addr = parse_ip(ip)
        index = self.index_of(addr)
        if index is None:
            raise self.not_in_range(addr)
        if not self._bitmap.allocate(index):
            raise ErrAllocated

    def allocate_next(self) -> str:
        index = self._bitmap.allocate_next()
        if index is None:
            raise ErrFull
        return str(self.address(index))

    def release(self, ip: str | IPAddr) -> None:
        index = self.index_of(parse_ip(ip))
        if index is not None:
            self._bitmap.release(index)

    def has(self, ip: str | IPAddr) -> bool:
        index = self.index_of(parse_ip(ip))
        return index is not None and self._bitmap.has(index)

    def used(self) -> int:
        return self._bitmap.used()

    def free(self) -> int:
        return self._bitmap.free()


def service_cidr_ready(service_cidr: Mapping[str, Any]) -> bool:
    """Whether a ServiceCIDR may receive allocations (upstream ``isReady`` + deletion).

    Not when it is being deleted; otherwise its Ready condition decides, and a ServiceCIDR
    with no Ready condition counts as ready (upstream: "in order to handle scenarios where
    kcm is not running").
    """
    metadata = service_cidr.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return False
    for condition in (service_cidr.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return True


class MetaAllocator:
    """ClusterIPs of one family from every ServiceCIDR of that family (upstream's name).

    Call :meth:`sync_service_cidrs` with the current ServiceCIDR objects whenever they
    change; it creates an :class:`Allocator` per CIDR, drops those no object names any
    more, and marks each ready when at least one ServiceCIDR naming it is ready.
    """

    def __init__(
        self,
        family: str = "IPv4",
        *,
        registry: IPAddressRegistry | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if family not in ("IPv4", "IPv6"):
            raise ValueError(f"unknown IP family {family!r}")
        self.family = family
        self.registry = registry if registry is not None else IPAddressRegistry()
        self.rng = rng if rng is not None else random.Random()
        self._allocators: dict[IPNet, Allocator] = {}

    def sync_service_cidrs(self, service_cidrs: Iterable[Mapping[str, Any]]) -> None:
        ready_by_cidr: dict[IPNet, bool] = {}
        for service_cidr in service_cidrs:
            ready = service_cidr_ready(service_cidr)
            for text in (service_cidr.get("spec") or {}).get("cidrs") or ():
                network = parse_cidr(text)
                if family_of(network) != self.family:
                    continue
                ready_by_cidr[network] = ready_by_cidr.get(network, False) or ready
        for network in list(self._allocators):
            if network not in ready_by_cidr:
                del self._allocators[network]
        for network, ready in ready_by_cidr.items():
            allocator = self._allocators.get(network)
            if allocator is None:
                allocator = Allocator(network, registry=self.registry, rng=self.rng)
                self._allocators[network] = allocator
            allocator.ready = ready

    def cidrs(self) -> list[tuple[str, bool]]:
        """Every CIDR with its readiness, in the order the ServiceCIDRs listed them."""
        return [(str(n), a.ready) for n, a in self._allocators.items()]

    def allocate(self, ip: str | IPAddr, parent_ref: Mapping[str, Any] | None = None) -> None:
        self._holder(parse_ip(ip), ready=True).allocate(ip, parent_ref)

    def allocate_next(self, parent_ref: Mapping[str, Any] | None = None) -> str:
        """From the first ready CIDR that has room, in ServiceCIDR order.

        Upstream walks a Go map (random order) and says so in a TODO; a fixed order keeps
        this deterministic.
        """
        for allocator in self._allocators.values():
            if not allocator.ready:
                continue
            try:
                return allocator.allocate_next(parent_ref)
            except ErrFull:
                continue
        raise ErrFull

    def release(self, ip: str | IPAddr) -> None:
        # Any CIDR holding the address may release it, ready or not: a ServiceCIDR being
        # deleted waits for exactly these releases.
        self._holder(parse_ip(ip), ready=False).release(ip)

    def has(self, ip: str | IPAddr) -> bool:
        addr = parse_ip(ip)
        return any(addr in n for n in self._allocators) and addr in self.registry

    def used(self) -> int:
        return sum(1 for ip in self.registry.addresses() if family_of(ip) == self.family)

    def free(self) -> int:
        """Addresses left, counting each top-level CIDR once (contained ones are inside it)."""
        networks = list(self._allocators)
        top = [n for n in networks if not any(o != n and _contains(o, n) for o in networks)]
        return sum(self._allocators[n].size for n in top) - self.used()

    def _holder(self, addr: IPAddr, *, ready: bool) -> Allocator:
        for network, allocator in self._allocators.items():
            if prefix_contains_ip(network, addr) and (allocator.ready or not ready):
                return allocator
        raise ErrMismatchedNetwork(addr, ", ".join(str(n) for n in self._allocators) or "none")


def prefix_contains_ip(network: IPNet, ip: IPAddr) -> bool:
    """Upstream ``servicecidr.PrefixContainsIP``: ``ip`` is a host of ``network``, not its
    network address nor (IPv4) its broadcast address. Which CIDR holds an address is asked
    this way, so an address that is the edge of one CIDR can belong to a wider one."""
    if ip.version != network.version or ip not in network:
        return False
    if ip == network.network_address:
        return False
    return not (network.version == 4 and ip == network.broadcast_address)


def _contains(outer: IPNet, inner: IPNet) -> bool:
    return outer.version == inner.version and inner.subnet_of(outer)  # type: ignore[arg-type]


class ClusterIPAllocator:
    """Both families over the cluster's ServiceCIDRs: what a (dual-stack) Service gets."""

    def __init__(
        self,
        service_cidrs: Iterable[Mapping[str, Any]] = (),
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.registry = IPAddressRegistry()
        rng = rng if rng is not None else random.Random()
        self.families = {
            family: MetaAllocator(family, registry=self.registry, rng=rng)
            for family in ("IPv4", "IPv6")
        }
        self.sync_service_cidrs(service_cidrs)

    def sync_service_cidrs(self, service_cidrs: Iterable[Mapping[str, Any]]) -> None:
        objects = list(service_cidrs)
        for allocator in self.families.values():
            allocator.sync_service_cidrs(objects)

    def allocate_cluster_ips(
        self,
        families: Sequence[str],
        requested: Sequence[str] = (),
        parent_ref: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """One address per family (``requested[i]`` when given and not empty), all or none.

        On any failure the addresses taken so far are released and the error is raised,
        as the Service REST storage's allocation transaction does.
        """
        taken: list[str] = []
        try:
            for i, family in enumerate(families):
                allocator = self.families[family]
                want = requested[i] if i < len(requested) else ""
                if want:
                    if family_of(parse_ip(want)) != family:
                        raise ErrNotInRange(want, f"the {family} ServiceCIDRs")
                    allocator.allocate(want, parent_ref)
                    taken.append(want)
                else:
                    taken.append(allocator.allocate_next(parent_ref))
        except AllocationError:
            for ip in taken:
                self.release(ip)
            raise
        return taken

    def release(self, ip: str | IPAddr) -> None:
        addr = parse_ip(ip)
        self.families[family_of(addr)].release(addr)

    def has(self, ip: str | IPAddr) -> bool:
        addr = parse_ip(ip)
        return self.families[family_of(addr)].has(addr)
