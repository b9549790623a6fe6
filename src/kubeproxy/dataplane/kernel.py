"""The running kernel's version, as upstream's ``utilkernel.GetVersion`` reads it.

Modes check it before they touch anything: nftables mode needs 5.13 or later (upstream's
``NFTablesKubeProxyKernelVersion``), ipvs mode picks its sysctls by it.
"""

from __future__ import annotations

import os


def kernel_version(release: str | None = None) -> tuple[int, ...]:
    """``(major, minor, patch)`` of ``release`` (``uname -r`` when None); a part without
    digits counts as 0 (``6.1.0-18-amd64`` -> ``(6, 1, 0)``)."""
    text = release if release is not None else os.uname().release
    parts = []
    for word in text.split("-")[0].split(".")[:3]:
        digits = "".join(c for c in word if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in version)
