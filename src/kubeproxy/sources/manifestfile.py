"""One manifest file to its objects, and many files at once across processes.

:func:`read_file` is pure apart from reading the file: no state, no logging. What is wrong
with a file comes back as log lines, which :mod:`kubeproxy.sources.manifests` logs when it
takes the result in, so the log is the same (and in the same order) whichever process
read the file.

That is what lets a first start spread the work: at 10,000 files YAML is most of a
manifest proxy's cold start, and PyYAML holds the GIL. :func:`read_files` hands chunks of
a long list of files to helper processes (one per extra CPU, started with this
interpreter and running :func:`serve`) while this process reads chunks too, all pulling
from one queue so that a helper started late, or a slow file, unbalances nothing. A
helper sends back only compact objects (:class:`~kubeproxy.model.events.RawObject`'s
pickled document, the form the source keeps anyway), so taking a result in costs little.
A helper that cannot start or dies is one log line; its files are read here. Short
lists, one CPU, or parsed models (non-raw mode: unpickling a model costs as much as
parsing it) are read in this process alone.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgspec
import yaml

from kubeproxy.model.events import Model, RawObject
from kubeproxy.model.parse import (
    InvalidObjectError,
    object_key,
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
    skipped_parts,
)
from kubeproxy.model.types import NamespacedName
from kubeproxy.sources.parsecache import SETTLE_NS
from kubeproxy.sources.yamlload import load_all

log = logging.getLogger(__name__)

KINDS = ("Service", "EndpointSlice", "Node", "ServiceCIDR")
RAW_KINDS = (*KINDS, "Pod")

ObjectKey = tuple[str, NamespacedName]  # (kind, namespace/name)
Stamp = tuple[int, ...]

# Fewer files than this are read in this process: a helper's start (an interpreter and
# these imports, ~0.1-0.3 s) would cost more than it saves.
PARALLEL_MIN_FILES = 400
MAX_HELPERS = 3


@dataclass(slots=True)
class FileEntry:
    stamp: Stamp
    objects: dict[ObjectKey, Model | None]  # None: present in the file but invalid/ignored
    # What the parse cache may keep (see kubeproxy.sources.parsecache).
    cacheable: bool = False


# A file's objects (None: it could not be read or decoded), and the lines to log.
ReadResult = tuple[FileEntry | None, list[str]]


def read_file(path: str, stamp: Stamp, raw: bool, settled_before: int) -> ReadResult:
    """Parse one file as it is now; cacheable only if its stamp's times are before
    ``settled_before`` (ns since the epoch)."""
    messages: list[str] = []
    # Changed just before this read: a change to come could keep the same stamp.
    settled = max(stamp[0], stamp[1]) < settled_before
    clean = True
    try:
        text = Path(path).read_text(encoding="utf-8")
        if path.endswith(".json"):
            docs: list[Any] = [_json(text)]
        else:
            docs = load_all(text)
            # An alias can only form a cycle if the text has one ("*name").
            if "*" in text and _cyclic(docs):
                raise ValueError("a YAML alias makes an object contain itself")
    # ValueError covers JSONDecodeError and UnicodeDecodeError, and also what YAML's
    # constructors raise for well-formed but impossible scalars ("date: 2024-13-45",
    # "!!int x"); RecursionError comes from deeply nested JSON. Any of these must only
    # cost this file, never abort the whole reload.
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as err:
        messages.append(
            f"Cannot read manifest file {path}: {_one_line(err)} "
            "(keeping the objects it held before)"
        )
        return None, messages
    objects: dict[ObjectKey, Model | None] = {}
    for doc in _documents(docs):
        kind = doc.get("kind")
        if not isinstance(kind, str) or kind not in (RAW_KINDS if raw else KINDS):
            continue
        key = object_key(kind, doc)
        if raw and key is not None:
            try:
                # Compact at once: decoded again by the consumer one at a time, so the
                # documents of a whole directory are never all in memory together.
                parsed: Model | None = RawObject(kind, key, doc).compact()
            except RecursionError:
                messages.append(
                    f"Cannot read manifest file {path}: {kind} {escape(str(key))} is nested "
                    "too deeply (keeping the objects it held before)"
                )
                return None, messages
        else:
            parsed = _parse(kind, doc, messages) if kind in KINDS else None
        if key is None:
            continue
        if (kind, key) in objects:
            clean = False  # logged: not cached, so the next start logs it too
            # Same rule as across files: the first definition wins.
            messages.append(
                f"Skipping duplicate {kind} {escape(str(key))} in {path} "
                "(defined earlier in the same file)"
            )
            continue
        objects[(kind, key)] = parsed
    return FileEntry(stamp, objects, cacheable=raw and settled and clean), messages


def read_files(jobs: Sequence[tuple[str, Stamp]], raw: bool) -> Iterator[ReadResult]:
    """:func:`read_file` for each job, in order, each as soon as it and those before it
    are read (across processes when it pays): what the caller does with early files
    between two results runs while the helpers read later ones. Run it to its end: the
    helpers are joined, and the read logged, only then."""
    settled_before = time.time_ns() - SETTLE_NS
    helpers = _helper_count(len(jobs)) if raw else 0
    if helpers == 0:
        for path, stamp in jobs:
            yield read_file(path, stamp, raw, settled_before)
        return
    started = time.monotonic()
    shared = _Shared(len(jobs), helpers)
    chunks = _Chunks(len(jobs), helpers + 1)
    threads = [
        threading.Thread(target=_feed, args=(chunks, jobs, settled_before, shared), daemon=True)
        for _ in range(helpers)
    ]
    for thread in threads:
        thread.start()
    try:
        for i in range(len(jobs)):
            while (result := shared.results[i]) is None:
                # Not read yet: read a chunk here, or wait for the helper reading it.
                chunk = chunks.take()
                if chunk is not None:
                    for j in chunk:
                        path, stamp = jobs[j]
                        shared.results[j] = read_file(path, stamp, raw, settled_before)
                elif not shared.wait_for(i):
                    path, stamp = jobs[i]  # its helper failed: read here
                    shared.results[i] = read_file(path, stamp, raw, settled_before)
            shared.results[i] = None  # the caller's from here
            yield result
    finally:
        chunks.close()
        for thread in threads:
            thread.join()
    log.info(
        "Read %d manifest files in %.2fs with %d helper process(es)",
        len(jobs),
        time.monotonic() - started,
        helpers,
    )


class _Shared:
    """The results slots the helpers' feeder threads fill, and who is still feeding."""

    def __init__(self, jobs: int, feeders: int) -> None:
        self.results: list[ReadResult | None] = [None] * jobs
        self.orphans: set[int] = set()  # taken by a helper that failed
        self.feeders = feeders
        self.changed = threading.Condition()

    def wait_for(self, i: int) -> bool:
        """Wait until job ``i`` is read; False if nobody will (its helper failed)."""
        with self.changed:
            while self.results[i] is None:
                if i in self.orphans or self.feeders == 0:
                    return False
                self.changed.wait()
        return True

    def store(self, chunk: range, answer: Sequence[ReadResult]) -> None:
        with self.changed:
            for i, result in zip(chunk, answer, strict=True):
                self.results[i] = result
            self.changed.notify_all()

    def orphan(self, chunk: range) -> None:
        with self.changed:
            self.orphans.update(chunk)
            self.changed.notify_all()

    def done(self) -> None:
        with self.changed:
            self.feeders -= 1
            self.changed.notify_all()


def _helper_count(files: int) -> int:
    if files < PARALLEL_MIN_FILES:
        return 0
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(0, min(cpus - 1, MAX_HELPERS))


class _Chunks:
    """Indices handed out in shrinking chunks (guided: a late chunk is small, so nobody
    waits long for the last one)."""

    def __init__(self, total: int, takers: int) -> None:
        self._next = 0
        self._total = total
        self._takers = takers
        self._lock = threading.Lock()

    def close(self) -> None:
        """Hand out nothing more (the caller stopped early)."""
        with self._lock:
            self._next = self._total

    def take(self) -> range | None:
        with self._lock:
            left = self._total - self._next
            if left <= 0:
                return None
            size = min(left, max(8, min(256, left // (2 * self._takers))))
            chunk = range(self._next, self._next + size)
            self._next += size
            return chunk


def _feed(
    chunks: _Chunks,
    jobs: Sequence[tuple[str, Stamp]],
    settled_before: int,
    shared: _Shared,
) -> None:
    """Keep one helper process busy with chunks until none are left."""
    try:
        try:
            helper = _start_helper()
        except OSError as err:
            log.warning("Cannot start a manifest reading process: %s (reading here)", err)
            return
        assert helper.stdin is not None and helper.stdout is not None
        try:
            while (chunk := chunks.take()) is not None:
                try:
                    _send(helper.stdin, (settled_before, [jobs[i] for i in chunk]))
                    answer: list[ReadResult] = _receive(helper.stdout)
                except (OSError, EOFError, pickle.UnpicklingError, struct.error) as err:
                    log.warning(
                        "A manifest reading process failed: %s (reading its files here)",
                        _one_line(err) or type(err).__name__,
                    )
                    shared.orphan(chunk)
                    return
                shared.store(chunk, answer)
        finally:
            helper.stdin.close()
            helper.stdout.close()
            try:
                helper.wait(timeout=5)
            except subprocess.TimeoutExpired:
                helper.kill()
                helper.wait()
    finally:
        shared.done()


def _start_helper() -> subprocess.Popen[bytes]:
    # This package's own location first: a helper must read files exactly as this
    # process would, whatever the installation (a checkout on PYTHONPATH included).
    here = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": here + (os.pathsep + path if path else "")}
    return subprocess.Popen(
        [sys.executable, "-c", "from kubeproxy.sources.manifestfile import serve; serve()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )


def serve() -> None:
    """A helper process: read the chunks of files that come on stdin until it closes.

    Raw mode only (what :func:`read_files` sends helpers); the results go back pickled,
    to the process that started this one and sent the paths.
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    inbox, outbox = sys.stdin.buffer, sys.stdout.buffer
    try:
        while True:
            settled_before, jobs = _receive(inbox)
            results = [read_file(path, stamp, True, settled_before) for path, stamp in jobs]
            _send(outbox, results)
    except (EOFError, BrokenPipeError):
        return  # the parent is done, or gone


_LENGTH = struct.Struct("!Q")


def _send(stream: IO[bytes], value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        raise EOFError("the other process closed the pipe")
    (size,) = _LENGTH.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the other process closed the pipe mid-message")
    return pickle.loads(data)


# ----------------------------------------------------------------------------- documents


def _json(text: str) -> Any:
    """``json.loads`` as the standard library has it; msgspec's decoder (several times
    faster) for the text both read the same way."""
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return json.loads(text)  # json's error message, or what only json accepts


def _cyclic(root: Any) -> bool:
    """Whether a list or mapping contains itself (YAML aliases can say so, JSON cannot,
    and no Kubernetes object does): walking one, as unpacking ``kind: List`` does, would
    never end. Iterative, and each node is walked once, so alias-heavy files stay linear."""
    done: set[int] = set()
    on_path = {id(root)}
    stack: list[tuple[int, Iterator[Any]]] = [(id(root), _children(root))]
    while stack:
        node, children = stack[-1]
        child = next(children, _END)
        if child is _END:
            stack.pop()
            on_path.discard(node)
            done.add(node)
        elif isinstance(child, (list, dict)):
            if id(child) in on_path:
                return True
            if id(child) not in done:
                on_path.add(id(child))
                stack.append((id(child), _children(child)))
    return False


_END = object()


def _children(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        return iter(node.values())
    return iter(node if isinstance(node, list) else ())


def _documents(docs: list[Any]) -> Iterator[Mapping[str, Any]]:
    for doc in docs:
        if not isinstance(doc, Mapping):
            continue
        kind = doc.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
            yield from _documents(doc["items"])
        else:
            yield doc


def _parse(kind: str, doc: Mapping[str, Any], messages: list[str]) -> Model | None:
    try:
        if kind == "Service":
            return parse_service(doc)
        if kind == "EndpointSlice":
            endpoint_slice = parse_endpoint_slice(doc)
            partly = endpoint_slice and skipped_parts(endpoint_slice)
            if partly:
                messages.append(partly)
            return endpoint_slice
        if kind == "ServiceCIDR":
            return parse_service_cidr(doc)
        return parse_node(doc)
    except InvalidObjectError as err:
        messages.append(str(err))
        return None


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def escape(text: str) -> str:
    """Escape non-printable characters (newlines, escapes) so a name cannot forge log lines."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
