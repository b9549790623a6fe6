"""The standalone cluster's memory: which Service got which ClusterIPs and NodePorts.

A cluster keeps allocations in etcd; a manifest directory has no etcd, so
:mod:`kubeproxy.controlplane.standalone` keeps them in one small JSON file beside the
manifests (``DIR/.kubeproxy-state.json``: hidden, so the manifest source never reads it
as a manifest)::

    {"apiVersion": "kubeproxy.dev/v1alpha1", "kind": "AllocationState",
     "services": {"demo/web": {"clusterIPs": ["10.96.0.10"],
                               "nodePorts": {"80": 30080}, "healthCheckNodePort": 0}}}

``nodePorts`` is keyed by the Service port number (upstream gives ports with the same
number one nodePort). Writes are atomic: a temporary file in the same directory, fsync,
rename over the old file, fsync of the directory — a crash leaves the old file or the
new one, never half of either; the temporary file a crash leaves behind is removed by a
later save. A file that cannot be read or decoded is logged once and
treated as empty (the cluster then allocates afresh); a directory that cannot be
written is logged once and the cluster keeps working from memory.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STATE_FILE_NAME = ".kubeproxy-state.json"
# A save's temporary file older than this was abandoned by a killed process.
ABANDONED_SECONDS = 60.0
API_VERSION = "kubeproxy.dev/v1alpha1"
KIND = "AllocationState"

#: One Service's allocation: ``clusterIPs``, ``nodePorts`` (port number → nodePort) and
#: ``healthCheckNodePort``, as stored in the file.
Allocation = dict[str, Any]


class StateFile:
    """Load and atomically save the allocations of one manifest directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._write_failed = False

    @classmethod
    def beside(cls, directory: Path) -> StateFile:
        return cls(directory / STATE_FILE_NAME)

    def load(self) -> dict[str, Allocation]:
        """The saved allocations by ``namespace/name``; empty when there is no usable file."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as err:
            log.error("Cannot read %s: %s (allocating afresh)", self.path, err)
            return {}
        try:
            doc = json.loads(text)
        except ValueError as err:
            log.error("Cannot decode %s: %s (allocating afresh)", self.path, err)
            return {}
        return decode(doc, str(self.path))

    def save(self, allocations: Mapping[str, Allocation]) -> bool:
        """Replace the file atomically; False (logged once) if the directory is not writable."""
        body = json.dumps(encode(allocations), indent=1, sort_keys=True) + "\n"
        directory = self.path.parent
        self._sweep()
        try:
            fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(body)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            # The rename is only durable once the directory entry is.
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as err:
            if not self._write_failed:
                log.error(
                    "Cannot write %s: %s (allocations are kept in memory only; "
                    "a restart may give Services other ClusterIPs and NodePorts)",
                    self.path,
                    err,
                )
            self._write_failed = True
            return False
        if self._write_failed:
            log.info("Wrote %s again", self.path)
        self._write_failed = False
        return True

    def _sweep(self) -> None:
        """Remove the temporary files of saves that a crash (SIGKILL) cut short.

        Only files older than :data:`ABANDONED_SECONDS`: a save takes milliseconds, so an
        older one is nobody's, while a younger one may be another process's save in
        progress. Without this, every crash in the middle of a save left one more file.
        """
        cutoff = time.time() - ABANDONED_SECONDS
        for leftover in self.path.parent.glob(f"{glob.escape(self.path.name)}.*.tmp"):
            with contextlib.suppress(OSError):
                if leftover.stat().st_mtime < cutoff:
                    leftover.unlink()
                    log.info("Removed %s, left by an interrupted save", leftover)


def encode(allocations: Mapping[str, Allocation]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "services": {key: dict(value) for key, value in sorted(allocations.items())},
    }


def decode(doc: Any, where: str) -> dict[str, Allocation]:
    """The valid entries of a decoded state document; each bad entry is logged and dropped."""
    if not isinstance(doc, Mapping) or doc.get("kind") != KIND:
        log.error("Ignoring %s: not a %s document", where, KIND)
        return {}
    services = doc.get("services")
    if not isinstance(services, Mapping):
        return {}
    out: dict[str, Allocation] = {}
    for key, value in services.items():
        entry = _entry(value)
        if not isinstance(key, str) or entry is None:
            log.error("Ignoring entry %r of %s: not an allocation", key, where)
            continue
        out[key] = entry
    return out


def _entry(value: Any) -> Allocation | None:
    if not isinstance(value, Mapping):
        return None
    ips = value.get("clusterIPs", [])
    ports = value.get("nodePorts", {})
    health = value.get("healthCheckNodePort", 0)
    if not (isinstance(ips, list) and all(isinstance(ip, str) for ip in ips)):
        return None
    if not (
        isinstance(ports, Mapping)
        and all(isinstance(k, str) and _is_port(v) for k, v in ports.items())
    ):
        return None
    if not _is_port(health) and health != 0:
        return None
    return {"clusterIPs": list(ips), "nodePorts": dict(ports), "healthCheckNodePort": health}


def _is_port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536
