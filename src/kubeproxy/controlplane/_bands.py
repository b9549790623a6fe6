"""The two-band search and the bitmap that both ClusterIP and NodePort allocation share.

Upstream (KEP-3070 for ClusterIPs, KEP-3668 for NodePorts) splits every range into a
*static* lower band, where users pick values by hand, and a *dynamic* upper band, where
``AllocateNext`` starts: a random index in the upper band, then a forward scan that wraps
inside that band; only when the whole upper band is taken does it draw a random start in
the lower band and scan that the same way (``randomScanStrategyWithOffset`` in
``pkg/registry/core/service/allocator/bitmap.go``; ``allocateNextService`` in
``ipallocator/ipallocator.go`` does the same over IPAddress objects).

:func:`scan_banded` is that search over abstract indices ``0..size-1`` with a caller's
``is_free`` test, so the IPAddress-object allocator (free = no object) and the bitmap
(free = bit clear) run the very same walk and the same draws from the injected RNG.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def scan_banded(
    size: int, band_offset: int, is_free: Callable[[int], bool], rng: random.Random
) -> int | None:
    """The index AllocateNext would take, or None when every index is taken.

    ``band_offset`` is the number of indices in the static lower band (0: no lower band).
    """
    upper = size - band_offset
    if upper > 0:
        start = rng.randrange(upper)
        for i in range(upper):
            index = band_offset + (start + i) % upper
            if is_free(index):
                return index
    if band_offset > 0:
        # Only reached when the dynamic band is full: the static band is the last resort.
        start = rng.randrange(band_offset)
        for i in range(band_offset):
            index = (start + i) % band_offset
            if is_free(index):
                return index
    return None


class AllocationBitmap:
    """Upstream's ``AllocationBitmap`` with the offset strategy: ``size`` slots, a count.

    The count makes "full" O(1), as upstream's ``count >= max`` check does, so a full
    large range answers at once instead of scanning a million bits.
    """

    def __init__(self, size: int, band_offset: int, rng: random.Random) -> None:
        self.size = max(0, size)
        self.band_offset = band_offset
        self._rng = rng
        self._taken: set[int] = set()

    def allocate(self, index: int) -> bool:
        """Take ``index``; False when it was already taken (the caller's ErrAllocated)."""
        if index in self._taken:
            return False
        self._taken.add(index)
        return True

    def allocate_next(self) -> int | None:
        if len(self._taken) >= self.size:
            return None
        index = scan_banded(self.size, self.band_offset, self._is_free, self._rng)
        if index is not None:
            self._taken.add(index)
        return index

    def release(self, index: int) -> None:
        self._taken.discard(index)

    def has(self, index: int) -> bool:
        return index in self._taken

    def free(self) -> int:
        return self.size - len(self._taken)

    def used(self) -> int:
        return len(self._taken)

    def taken(self) -> list[int]:
        return sorted(self._taken)

    def _is_free(self, index: int) -> bool:
        return index not in self._taken
