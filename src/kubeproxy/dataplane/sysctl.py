"""Conntrack sysctls from the ``conntrack`` section of the configuration (at start-up).

The section arrives as :class:`ConntrackSettings` (plain values, built by
:func:`kubeproxy.config.runtime.conntrack_settings`), so this module knows no
configuration schema.

As upstream's ``pkg/proxy/conntrack/sysctls.go``:

* ``nf_conntrack_max`` is raised to max(``min``, ``maxPerCore`` x CPUs), at most
  1,048,576 (the cap applies before ``min``, as upstream's), when ``maxPerCore`` > 0 (0
  leaves the limit, and ``min``, alone) — raised only: a higher limit already in place
  stays. Unless that write failed, the conntrack hash table is then grown to max/4
  buckets through ``/sys/module/nf_conntrack/parameters/hashsize`` if it is smaller.
* ``tcpEstablishedTimeout``, ``tcpCloseWaitTimeout``, ``udpTimeout``,
  ``udpStreamTimeout`` are written in whole seconds when > 0; ``tcpBeLiberal`` writes 1
  when true. Unset or zero values leave the kernel's setting alone.
* A value already in place is not written again (so an unchanged setting succeeds where
  the file is read-only).

Unlike upstream, which stops kube-proxy at the first failure, every setting is tried and
the outcome of each is returned: in a non-initial network namespace ``nf_conntrack_max``
is read-only (the other netfilter sysctls are per namespace and writable), and the proxy
still works without it. :func:`plan` is the pure part; :func:`apply_conntrack_sysctls`
does the I/O under the ``/proc`` and ``/sys`` roots it is given (:data:`HOST_PROC` and
:data:`HOST_SYS` on a node).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

NETFILTER = "sys/net/netfilter"
HASHSIZE = "module/nf_conntrack/parameters/hashsize"
CONNTRACK_MAX = "nf_conntrack_max"
# Upstream's cap on maxPerCore x CPUs (pkg/proxy/conntrack/sysctls.go, maxLimit).
CONNTRACK_MAX_LIMIT = 1048576

# The node's own /proc and /sys: named by the production entry points only (kubeproxy's
# cli and its mode registry). Nothing that writes under them has these as a default, so
# a test that builds a backend or applies sysctls in its own process must say where.
HOST_PROC = Path("/proc")
HOST_SYS = Path("/sys")

Outcome = Literal["set", "unchanged", "failed"]


@dataclass(frozen=True)
class ConntrackSettings:
    """The ``conntrack`` section: counts as written (None: unset), timeouts in whole
    seconds (None: leave the kernel's value)."""

    max_per_core: int | None = None
    min: int | None = None
    tcp_established_timeout: int | None = None
    tcp_close_wait_timeout: int | None = None
    tcp_be_liberal: bool = False
    udp_timeout: int | None = None
    udp_stream_timeout: int | None = None


@dataclass(frozen=True)
class SysctlResult:
    """One setting: its file (relative to the /proc or /sys root), value and outcome."""

    path: str
    value: int
    outcome: Outcome
    error: str | None = None


def conntrack_max(cfg: ConntrackSettings, cpus: int) -> int:
    """The nf_conntrack_max to set, 0 for "leave it"."""
    per_core = cfg.max_per_core or 0
    if per_core <= 0:
        return 0
    scaled = per_core * cpus
    if scaled > CONNTRACK_MAX_LIMIT:
        return CONNTRACK_MAX_LIMIT
    return max(scaled, cfg.min or 0)


def plan(cfg: ConntrackSettings, cpus: int) -> list[tuple[str, int]]:
    """The netfilter sysctls to write, by name, in upstream's order."""
    out: list[tuple[str, int]] = []
    maximum = conntrack_max(cfg, cpus)
    if maximum > 0:
        out.append((CONNTRACK_MAX, maximum))
    for name, value in (
        ("nf_conntrack_tcp_timeout_established", cfg.tcp_established_timeout),
        ("nf_conntrack_tcp_timeout_close_wait", cfg.tcp_close_wait_timeout),
        ("nf_conntrack_tcp_be_liberal", 1 if cfg.tcp_be_liberal else None),
        ("nf_conntrack_udp_timeout", cfg.udp_timeout),
        ("nf_conntrack_udp_timeout_stream", cfg.udp_stream_timeout),
    ):
        if value is not None:
            out.append((name, value))
    return out


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _write_int(root: Path, relative: str, value: int, *, always: bool = False) -> SysctlResult:
    path = root / relative
    if not always and _read_int(path) == value:
        return SysctlResult(relative, value, "unchanged")
    try:
        path.write_text(str(value))
    except OSError as err:
        log.warning("Cannot set %s to %d: %s", path, value, err.strerror or err)
        return SysctlResult(relative, value, "failed", err.strerror or str(err))
    log.info("Set %s to %d", path, value)
    return SysctlResult(relative, value, "set")


def apply_conntrack_sysctls(
    cfg: ConntrackSettings,
    *,
    proc_root: Path,
    sys_root: Path,
    cpus: int | None = None,
) -> list[SysctlResult]:
    """Write what :func:`plan` asks for; one result per setting touched, failures included."""
    count = cpus or os.cpu_count() or 1
    results = []
    for name, value in plan(cfg, count):
        relative = f"{NETFILTER}/{name}"
        current = _read_int(proc_root / relative) if name == CONNTRACK_MAX else None
        if current is not None and current >= value:
            # As upstream: the limit is only ever raised (a node tuned higher keeps it).
            result = SysctlResult(relative, current, "unchanged")
        else:
            result = _write_int(proc_root, relative, value)
        results.append(result)
        if name == CONNTRACK_MAX and result.outcome != "failed":
            results.extend(_grow_hashsize(sys_root, value))
    return results


def _grow_hashsize(sys_root: Path, maximum: int) -> list[SysctlResult]:
    """Upstream's check: a hash table of at least max/4 buckets (an unreadable hashsize
    is a failure, not a reason to write blindly)."""
    wanted = maximum // 4
    path = sys_root / HASHSIZE
    try:
        current = int(path.read_text().strip())
    except (OSError, ValueError) as err:
        message = err.strerror if isinstance(err, OSError) else str(err)
        log.warning("Cannot read %s: %s", path, message)
        return [SysctlResult(HASHSIZE, wanted, "failed", message or str(err))]
    if current >= wanted:
        return []
    return [_write_int(sys_root, HASHSIZE, wanted, always=True)]
