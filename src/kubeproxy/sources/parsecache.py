"""The manifest source's parsed files, kept on disk so a restart re-parses only changed files.

A cold start from a 10,000-file directory spends most of its time in YAML; a restart
finds the same files. Each file's objects, as the source holds them (compact
:class:`~kubeproxy.model.events.RawObject` s: kind, namespace/name, pickled document),
are stored under the file's identity: (mtime_ns, ctime_ns, size, inode, device), the stamp
the source already compares. A file is served from the cache only when its stamp now is
exactly the one stored; anything else, and any doubt, means parsing it:

* ctime is in the stamp: every write, rename over, chmod or ``touch`` changes it, and no
  user can set it back;
* a file changed less than :data:`SETTLE_NS` before it was read is never stored (its next
  change could fall in the same timestamp tick and leave the stamp as it was: git's
  "racy clean" case);
* a file whose reading logged something (a duplicate within it) is not stored, so its
  log line comes again on the next start;
* the cache names the kubeproxy version, :data:`FORMAT`, PyYAML's and Python's versions
  and the directory read; a cache written by anything else is ignored whole (one log line),
  as is a corrupt one.

One file per manifest directory, ``<cache dir>/manifests-<hash of the directory>.cache``,
written whole to a temporary file and renamed over the old one: a reader sees one whole
version, and two processes writing at once leave one of their versions (each entry is
checked against the file's stamp anyway). It holds only the files present at the save,
is not written above :data:`MAX_BYTES`, and at most :data:`MAX_FILES` directories' caches
are kept (the least recently written go).

The cache holds pickles, and unpickling runs code: it is read only from a directory and a
file owned by this user and writable by no one else (mode 0700 when created here).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import stat
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from kubeproxy import __version__
from kubeproxy.model.events import RawObject
from kubeproxy.model.types import NamespacedName

log = logging.getLogger(__name__)

# Beside the eBPF object cache (bpf/) and the lab's upstream builds (upstream/).
DEFAULT_DIR = Path("/var/cache/kubeproxy/manifests")
# Bump when what the source makes of a file changes (the loader, the unpacking of Lists).
FORMAT = 1
MAGIC = b"KUBEPROXY-MANIFEST-CACHE\n"
SETTLE_NS = 2_000_000_000  # 2 s: coarser than any filesystem's timestamps but FAT's
MAX_BYTES = 512 * 2**20
MAX_FILES = 8

Stamp = tuple[int, ...]
# (kind, namespace, name, pickled document) per object of one file.
Packed = tuple[tuple[str, str, str, bytes], ...]


class ParseCache:
    """The cached files of one manifest directory (see the module docstring)."""

    def __init__(self, cache_dir: Path, root: str) -> None:
        self.cache_dir = cache_dir
        self.root = root
        digest = hashlib.sha256(root.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        self.path = cache_dir / f"manifests-{digest}.cache"
        self._entries: dict[str, tuple[Stamp, Packed]] = {}
        self.hits = 0

    @classmethod
    def open(cls, cache_dir: Path, root: str) -> ParseCache | None:
        """The cache for ``root`` in ``cache_dir`` (created 0700), loaded; None (one log
        line) when the directory cannot be used."""
        try:
            cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            _check_private(os.stat(cache_dir), want_dir=True)
            if not os.access(cache_dir, os.W_OK | os.X_OK):
                raise PermissionError("not writable")
        except (OSError, _NotPrivateError) as err:
            log.warning(
                "Manifest parse cache disabled: cannot use %s (%s); every start parses every file",
                cache_dir,
                err,
            )
            return None
        cache = cls(cache_dir, root)
        cache._load()
        log.info(
            "Manifest parse cache %s: %d files known (re-parsed only when changed)",
            cache.path,
            len(cache._entries),
        )
        return cache

    def _identity(self) -> tuple[Any, ...]:
        return (FORMAT, __version__, yaml.__version__, sys.version, self.root)

    def _load(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return
        except OSError as err:
            log.warning("Ignoring manifest parse cache %s: %s", self.path, err)
            return
        try:
            with os.fdopen(fd, "rb") as f:
                _check_private(os.fstat(f.fileno()), want_dir=False)
                if f.read(len(MAGIC)) != MAGIC:
                    raise ValueError("not a kubeproxy manifest cache")
                identity, entries = pickle.load(f)
                if identity != self._identity():
                    raise ValueError("written by another version or for another directory")
                if not isinstance(entries, dict):
                    raise ValueError("malformed")
        # Anything unpickling a damaged file raises (EOFError, UnpicklingError, ...):
        # the cache is only ever an optimisation, so every error means parsing.
        except Exception as err:
            log.warning("Ignoring manifest parse cache %s: %s", self.path, _one_line(err))
            return
        self._entries = entries

    def get(self, path: str, stamp: Stamp) -> dict[tuple[str, NamespacedName], RawObject] | None:
        """The file's objects if the cache has them for exactly this stamp."""
        try:
            entry = self._entries.get(path)
            if entry is None or entry[0] != stamp:
                return None
            objects = {
                (kind, NamespacedName(namespace, name)): RawObject.from_packed(
                    kind, NamespacedName(namespace, name), packed
                )
                for kind, namespace, name, packed in entry[1]
            }
        except (TypeError, ValueError, IndexError):  # a malformed entry: parse the file
            return None
        self.hits += 1
        return objects

    def save(self, files: Iterable[tuple[str, Stamp, Mapping[Any, Any]]]) -> bool:
        """Write the cache for ``files`` (path, stamp, objects: compact RawObjects) whole;
        False (logged) if it could not be written."""
        entries: dict[str, tuple[Stamp, Packed]] = {}
        for path, stamp, objects in files:
            packed = []
            for obj in objects.values():
                if not isinstance(obj, RawObject) or not obj.is_compact():
                    break
                packed.append((obj.kind, obj.key.namespace, obj.key.name, obj.packed_doc))
            else:
                entries[path] = (stamp, tuple(packed))
        data = MAGIC + pickle.dumps((self._identity(), entries), protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > MAX_BYTES:
            log.warning(
                "Manifest parse cache not written: %d MB is over its %d MB bound",
                len(data) >> 20,
                MAX_BYTES >> 20,
            )
            return False
        try:
            fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=".manifests-", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as err:
            log.warning("Cannot write manifest parse cache %s: %s", self.path, err)
            return False
        self._entries = entries
        self._evict()
        return True

    def _evict(self) -> None:
        """Keep the :data:`MAX_FILES` most recently written directories' caches."""
        try:
            caches = sorted(
                self.cache_dir.glob("manifests-*.cache"),
                key=lambda p: p.stat().st_mtime_ns,
                reverse=True,
            )
            for old in caches[MAX_FILES:]:
                old.unlink(missing_ok=True)
        except OSError:
            pass  # another process evicting the same files: either result is fine


class _NotPrivateError(Exception):
    """The cache's directory or file could be written by another user."""


def _check_private(st: os.stat_result, *, want_dir: bool) -> None:
    if want_dir and not stat.S_ISDIR(st.st_mode):
        raise _NotPrivateError("not a directory")
    if not want_dir and not stat.S_ISREG(st.st_mode):
        raise _NotPrivateError("not a regular file")
    if st.st_uid != os.geteuid():
        raise _NotPrivateError(f"owned by uid {st.st_uid}, not this user")
    if st.st_mode & 0o022:
        raise _NotPrivateError(f"writable by others (mode {stat.S_IMODE(st.st_mode):o})")


def _one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())
