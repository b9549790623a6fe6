"""The manifest source: Services, EndpointSlices, Nodes (and ServiceCIDRs) from a directory.

Files ending in ``.yaml``, ``.yml`` or ``.json`` anywhere under the directory (hidden files
and directories skipped) are read; a file may hold several YAML documents and ``kind: List``
documents are unpacked, as ``kubectl apply -f`` accepts. Objects of other kinds are ignored.

Each (re)load is diffed against the previous one by kind and namespace/name, producing the
same ADDED / MODIFIED / DELETED events a Kubernetes watch produces, so the rest of the
proxy cannot tell the sources apart.

Bad input, decided here:

* an invalid object is logged once (kind, namespace/name, why) and treated as absent;
* a file that is not valid YAML/JSON keeps contributing the objects it held at its last
  good read (an editor's half-written save must not delete Services), with one log line;
* the same object in two files: the first path (sorted) wins, the other is logged.

With ``raw=True`` Pods are read too and every object is passed on undecoded, as a
:class:`~kubeproxy.sources.events.RawObject`, for
:mod:`kubeproxy.controlplane.standalone` to complete (and parse) before the proxy sees it.

Parsing is cached per file by (mtime, size, inode), so a reload costs work only for the
files that changed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncGenerator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from watchfiles import awatch

from kubeproxy.model.parse import (
    InvalidObjectError,
    object_key,
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
)
from kubeproxy.model.types import NamespacedName
from kubeproxy.sources.events import Event, Model, RawObject

log = logging.getLogger(__name__)

_SUFFIXES = (".yaml", ".yml", ".json")
_KINDS = ("Service", "EndpointSlice", "Node", "ServiceCIDR")
_RAW_KINDS = (*_KINDS, "Pod")

ObjectKey = tuple[str, NamespacedName]  # (kind, namespace/name)

# libyaml is much faster on large manifests; PyYAML's wheels ship it.
_Loader: type[yaml.CSafeLoader] | type[yaml.SafeLoader] = getattr(
    yaml, "CSafeLoader", yaml.SafeLoader
)


@dataclass
class _FileEntry:
    stamp: tuple[int, ...]
    objects: dict[ObjectKey, Model | None]  # None: present in the file but invalid/ignored


@dataclass
class ManifestSource:
    directory: Path
    poll_interval: float = 1.0
    raw: bool = False  # Pods too, every object as a RawObject (see the module docstring)
    _files: dict[Path, _FileEntry] = field(default_factory=dict)
    _current: dict[ObjectKey, Model] = field(default_factory=dict)
    _duplicates: set[str] = field(default_factory=set)

    # ---------------------------------------------------------------- loading

    def _paths(self) -> Iterator[Path]:
        for root, dirs, files in os.walk(self.directory):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                if not name.startswith(".") and name.endswith(_SUFFIXES):
                    yield Path(root) / name

    def _read(self, path: Path, stamp: tuple[int, ...]) -> _FileEntry | None:
        """Parse one file; None if it cannot be read or decoded."""
        try:
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".json":
                docs: list[Any] = [json.loads(text)]
            else:
                docs = list(yaml.load_all(text, Loader=_Loader))
        # ValueError covers JSONDecodeError and UnicodeDecodeError, and also what YAML's
        # constructors raise for well-formed but impossible scalars ("date: 2024-13-45",
        # "!!int x"); RecursionError comes from deeply nested JSON. Any of these must only
        # cost this file, never abort the whole reload.
        except (OSError, ValueError, RecursionError, yaml.YAMLError) as err:
            log.error(
                "Cannot read manifest file %s: %s (keeping the objects it held before)",
                path,
                _one_line(err),
            )
            return None
        objects: dict[ObjectKey, Model | None] = {}
        for doc in _documents(docs):
            kind = doc.get("kind")
            if not isinstance(kind, str) or kind not in (_RAW_KINDS if self.raw else _KINDS):
                continue
            key = object_key(kind, doc)
            if self.raw and key is not None:
                parsed: Model | None = RawObject(kind, key, doc)
            else:
                parsed = _parse(kind, doc) if kind in _KINDS else None
            if key is None:
                continue
            if (kind, key) in objects:
                # Same rule as across files: the first definition wins.
                log.error(
                    "Skipping duplicate %s %s in %s (defined earlier in the same file)",
                    kind,
                    _escape(str(key)),
                    path,
                )
                continue
            objects[(kind, key)] = parsed
        return _FileEntry(stamp, objects)

    def load(self) -> dict[ObjectKey, Model]:
        """Read the directory (re-parsing only changed files); the full desired state."""
        seen: dict[Path, _FileEntry] = {}
        # Sorted as a whole (os.walk lists a directory's files before its subdirectories'),
        # so "the first path wins" for duplicates means the first path in sorted order.
        for path in sorted(self._paths()):
            try:
                st = path.stat()
            except OSError:
                continue
            # ctime too: a chmod that makes an unreadable file readable changes only ctime.
            stamp = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
            entry = self._files.get(path)
            if entry is None or entry.stamp != stamp:
                fresh = self._read(path, stamp)
                if fresh is None:
                    # Keep what the file held at its last good read, under the new stamp so
                    # the broken version is read (and logged) once, not on every reload.
                    fresh = _FileEntry(stamp, entry.objects if entry is not None else {})
                entry = fresh
            seen[path] = entry
        self._files = seen
        merged: dict[ObjectKey, Model] = {}
        owner: dict[ObjectKey, Path] = {}
        duplicates: set[str] = set()
        for path, entry in seen.items():
            for key, obj in entry.objects.items():
                if key in owner:
                    # key[1] is the raw (unvalidated) name: escape it to keep one line.
                    duplicates.add(
                        f"Skipping duplicate {key[0]} {_escape(str(key[1]))} in {path} "
                        f"(already defined in {owner[key]})"
                    )
                    continue
                owner[key] = path
                if obj is not None:
                    merged[key] = obj
        # Log each duplicate when it appears, not on every reload.
        for message in sorted(duplicates - self._duplicates):
            log.error("%s", message)
        self._duplicates = duplicates
        return merged

    def reload(self) -> list[Event]:
        """Load and diff against the previous load: the watch-style events to apply."""
        new = self.load()
        events = diff(self._current, new)
        self._current = new
        return events

    # --------------------------------------------------------------- watching

    async def watch(self, stop: asyncio.Event) -> AsyncGenerator[list[Event], None]:
        """Yield the initial state, then a batch of events whenever files change.

        Besides inotify events, the directory is re-checked every ``poll_interval``
        (cheap: files are only re-parsed when their stat changes), which also covers a
        change made before the watcher started and filesystems without inotify.
        """
        yield self.reload()
        async for _ in awatch(
            self.directory,
            stop_event=stop,
            debounce=200,
            step=50,
            rust_timeout=int(self.poll_interval * 1000),
            yield_on_timeout=True,
            recursive=True,
        ):
            events = self.reload()
            if events:
                yield events


def diff(old: Mapping[ObjectKey, Model], new: Mapping[ObjectKey, Model]) -> list[Event]:
    """Watch-style events turning ``old`` into ``new``: deletes first, then adds/updates."""
    events: list[Event] = []
    for key in sorted(old.keys() - new.keys()):
        events.append(Event.deleted(old[key]))
    for key in sorted(new.keys()):
        before = old.get(key)
        after = new[key]
        if before is None:
            events.append(Event.added(after))
        elif before != after:
            events.append(Event.modified(before, after))
    return events


def _documents(docs: list[Any]) -> Iterator[Mapping[str, Any]]:
    for doc in docs:
        if not isinstance(doc, Mapping):
            continue
        kind = doc.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
            yield from _documents(doc["items"])
        else:
            yield doc


def _parse(kind: str, doc: Mapping[str, Any]) -> Model | None:
    try:
        if kind == "Service":
            return parse_service(doc)
        if kind == "EndpointSlice":
            return parse_endpoint_slice(doc)
        if kind == "ServiceCIDR":
            return parse_service_cidr(doc)
        return parse_node(doc)
    except InvalidObjectError as err:
        log.error("%s", err)
        return None


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def _escape(text: str) -> str:
    """Escape non-printable characters (newlines, escapes) so a name cannot forge log lines."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
