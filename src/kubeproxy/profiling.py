"""``--profiling`` / ``enableProfiling``: Python's answers to Go's ``/debug/pprof`` profiles.

Upstream kube-proxy mounts net/http/pprof on its metrics server when profiling is on;
:class:`kubeproxy.metrics.MetricsServer` mounts these instead, all plain text:

* :func:`goroutines` — ``/debug/pprof/goroutine``: the stack of every thread and of every
  asyncio task (a task's stack follows its ``await`` chain down to where it waits, which
  ``Task.get_stack`` alone does not show).
* :class:`CpuProfiler` — ``/debug/pprof/profile?seconds=N``: samples every thread's
  stack (``sys._current_frames``) every 10 ms for N seconds in a thread of its own, so the
  event loop keeps serving, and answers collapsed stacks — ``thread;outer;...;inner
  count`` lines that flamegraph.pl, speedscope or inferno read. By default it is a *CPU*
  profile like Go's: a sample is weighted by the CPU clock ticks its thread used since
  the previous sample (``/proc/self/task/TID/stat``), so idle threads waiting in
  ``select`` or on a queue weigh nothing; ``mode=wall`` counts every sample instead.
  One profile at a time, as Go's.
* :func:`heap` — ``/debug/pprof/heap``: the lines that allocated the most live memory,
  from tracemalloc, which :func:`start_heap_tracing` starts at start-up only when
  profiling is enabled (it costs memory and time for every allocation).
* :func:`cmdline` — ``/debug/pprof/cmdline``: the command line, NUL-separated as Go's.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import threading
import time
import traceback
import tracemalloc
from collections.abc import Iterator
from types import FrameType
from typing import Any

SAMPLE_INTERVAL = 0.01
DEFAULT_PROFILE_SECONDS = 30  # Go's default for /debug/pprof/profile
HEAP_TOP = 50
_TRACEMALLOC_FRAMES = 1  # top allocations by line need only the allocating frame


class ProfilerBusyError(RuntimeError):
    """A CPU profile is already running (Go: "cpu profiling already in use")."""


# --------------------------------------------------------------------- goroutines


def goroutines(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """Every thread's stack, then every asyncio task's (call on the loop's thread)."""
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
    out = [f"threads: {len(frames)}, asyncio tasks: {len(tasks)}", ""]
    for ident, frame in sorted(frames.items()):
        thread = threads.get(ident)
        name = thread.name if thread is not None else "?"
        native = thread.native_id if thread is not None else "?"
        out.append(f'thread "{name}" ident={ident} native={native}:')
        out.append("".join(traceback.format_stack(frame)).rstrip("\n"))
        out.append("")
    for task in tasks:
        state = "done" if task.done() else "cancelling" if task.cancelling() else "pending"
        out.append(f'task "{task.get_name()}" [{state}]:')
        stack = traceback.StackSummary.extract((f, f.f_lineno) for f in _await_chain(task))
        out.append("".join(stack.format()).rstrip("\n") or "  (no frames)")
        out.append("")
    return "\n".join(out)


def _await_chain(task: asyncio.Task[Any]) -> Iterator[FrameType]:
    """The frames of a task's coroutine and of everything it awaits, outermost first."""
    obj: Any = task.get_coro()
    while obj is not None:
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
        if frame is not None:
            yield frame
        obj = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None)


# ------------------------------------------------------------------- CPU profile


class CpuProfiler:
    """Samples every thread's stack; one profile at a time."""

    def __init__(self, interval: float = SAMPLE_INTERVAL, proc: str = "/proc/self/task") -> None:
        self.interval = interval
        self._proc = proc
        self._busy = threading.Lock()

    async def profile(self, seconds: float, *, wall: bool = False) -> str:
        """Sample for ``seconds`` in a thread; collapsed stacks. Raises ProfilerBusyError."""
        if not self._busy.acquire(blocking=False):
            raise ProfilerBusyError("cpu profiling already in use")
        stop = threading.Event()
        try:
            return await asyncio.to_thread(self._sample, seconds, wall, stop)
        finally:
            # A client that went away (cancellation) ends the sampling too.
            stop.set()
            self._busy.release()

    def _sample(self, seconds: float, wall: bool, stop: threading.Event) -> str:
        me = threading.get_ident()
        # Without per-thread CPU times (no /proc), a CPU profile falls back to wall time.
        cpu = not wall and os.path.isdir(self._proc)
        counts: collections.Counter[str] = collections.Counter()
        ticks: dict[int, int] = {}
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            threads = {t.ident: t for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                thread = threads.get(ident)
                weight = 1
                if cpu:
                    # The first sample of a thread is its baseline (weight 0).
                    used = self._cpu_ticks(thread.native_id if thread is not None else None)
                    weight = 0 if used is None else used - ticks.get(ident, used)
                    if used is not None:
                        ticks[ident] = used
                if weight > 0:
                    name = thread.name if thread is not None else str(ident)
                    counts[_collapse(name, frame)] += weight
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            stop.wait(min(self.interval, remaining))
        return "".join(f"{stack} {count}\n" for stack, count in sorted(counts.items()))

    def _cpu_ticks(self, native_id: int | None) -> int | None:
        """utime + stime of one thread, in clock ticks (None if unknown)."""
        if native_id is None:
            return None
        try:
            with open(f"{self._proc}/{native_id}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return None
        # The command name may contain spaces and parentheses: fields follow the last ")".
        fields = stat[stat.rindex(b")") + 2 :].split()
        return int(fields[11]) + int(fields[12])


def _collapse(thread: str, frame: FrameType | None) -> str:
    labels = []
    while frame is not None:
        labels.append(_label(frame))
        frame = frame.f_back
    labels.append(_clean(thread))
    return ";".join(reversed(labels))


def _label(frame: FrameType) -> str:
    """``qualname (dir/file.py:first line)``: one label per function, not per line."""
    code = frame.f_code
    return _clean(f"{code.co_qualname} ({_short_path(code.co_filename)}:{code.co_firstlineno})")


def _clean(text: str) -> str:
    # ";" separates frames and the last space precedes the count in collapsed stacks.
    return text.replace(";", ":").replace("\n", " ")


def _short_path(path: str) -> str:
    parent, name = os.path.split(path)
    return f"{os.path.basename(parent)}/{name}" if parent else name


# -------------------------------------------------------------------------- heap


def start_heap_tracing() -> None:
    """Start tracemalloc (profiling only: every allocation pays for it from now on)."""
    if not tracemalloc.is_tracing():
        tracemalloc.start(_TRACEMALLOC_FRAMES)


def heap(top: int = HEAP_TOP) -> str | None:
    """The ``top`` lines by live bytes allocated; None when tracemalloc is not tracing."""
    if not tracemalloc.is_tracing():
        return None
    snapshot = tracemalloc.take_snapshot().filter_traces(
        (tracemalloc.Filter(False, tracemalloc.__file__),)
    )
    stats = snapshot.statistics("lineno")
    current, peak = tracemalloc.get_traced_memory()
    out = [
        f"# tracemalloc: {current} bytes live, {peak} bytes at peak, {len(stats)} allocating lines",
        f"# top {min(top, len(stats))} by live bytes: bytes blocks file:line",
    ]
    for stat in stats[:top]:
        frame = stat.traceback[0]
        out.append(f"{stat.size} {stat.count} {frame.filename}:{frame.lineno}")
    return "\n".join(out) + "\n"


def cmdline() -> str:
    return "\x00".join(sys.orig_argv)
