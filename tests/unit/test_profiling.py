"""kubeproxy.profiling: thread and task stacks, the sampling CPU profiler, the heap."""

from __future__ import annotations

import asyncio
import threading
import tracemalloc
from collections.abc import Iterator

import pytest

from kubeproxy import profiling
from kubeproxy.profiling import CpuProfiler, ProfilerBusyError


def spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def doze(stop: threading.Event) -> None:
    stop.wait()


@pytest.fixture
def threads() -> Iterator[dict[str, threading.Thread]]:
    """A thread burning CPU in spin() and one sleeping in doze(), for the duration."""
    stop = threading.Event()
    workers = {
        "busy": threading.Thread(target=spin, args=(stop,), name="busy"),
        "idle": threading.Thread(target=doze, args=(stop,), name="idle"),
    }
    for worker in workers.values():
        worker.start()
    try:
        yield workers
    finally:
        stop.set()
        for worker in workers.values():
            worker.join()


def parse(collapsed: str) -> dict[str, int]:
    out = {}
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        out[stack] = int(count)
    return out


def cpu_ticks(thread: threading.Thread) -> int:
    """utime + stime of ``thread`` so far, in clock ticks, as /proc counts them."""
    assert thread.native_id is not None
    with open(f"/proc/self/task/{thread.native_id}/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()
    return int(fields[11]) + int(fields[12])


def test_cpu_profile_counts_cpu_ticks_of_busy_threads_only(
    threads: dict[str, threading.Thread],
) -> None:
    # On a loaded machine the busy thread may get no clock tick between the first and the
    # last sample of one profile: profile again (the idle thread must never show up).
    for _ in range(10):
        before = cpu_ticks(threads["busy"])
        stacks = parse(asyncio.run(CpuProfiler().profile(0.5)))
        used = cpu_ticks(threads["busy"]) - before
        assert not any(s.startswith("idle;") for s in stacks)
        busy = {s: n for s, n in stacks.items() if s.startswith("busy;")}
        if busy:
            break
    assert busy, stacks
    # Collapsed stacks, outermost first: the thread, then Thread.run ... then spin.
    assert all(";spin (unit/test_profiling.py:" in s for s in busy)
    assert any(s.split(";")[1].startswith("Thread._bootstrap ") for s in busy)
    # Counts are the clock ticks the thread used between the first and the last sample:
    # within what it used during the whole profile, whatever the machine's load.
    assert 0 < sum(busy.values()) <= used
    # The sleeping thread used no CPU, so it is not in the profile.
    assert not any(s.startswith("idle;") for s in stacks)


def test_wall_profile_has_every_thread(threads: dict[str, threading.Thread]) -> None:
    stacks = parse(asyncio.run(CpuProfiler(interval=0.01).profile(0.3, wall=True)))
    idle = [s for s in stacks if s.startswith("idle;")]
    assert idle and all(";doze (unit/test_profiling.py:" in s for s in idle)

    def samples(thread: str) -> int:
        return sum(n for s, n in stacks.items() if s.startswith(f"{thread};"))

    # Every sample counts every thread once, busy or not.
    assert samples("idle") == samples("busy") > 0


def test_profiling_does_not_block_the_event_loop_and_runs_one_at_a_time() -> None:
    """A profile of an hour is under way while the loop runs this scenario (so the
    sampling is not on the loop); a second one is refused until the first ends, here
    by its client going away."""
    profiler = CpuProfiler()

    async def scenario() -> None:
        first = asyncio.create_task(profiler.profile(3600))
        for _ in range(20):
            await asyncio.sleep(0)  # the loop runs other tasks meanwhile
        assert not first.done()
        with pytest.raises(ProfilerBusyError, match="already in use"):
            await profiler.profile(0.1)
        first.cancel()
        await asyncio.wait([first])
        assert first.cancelled()
        assert await profiler.profile(0.01) is not None  # free again

    asyncio.run(scenario())


def test_goroutines_lists_threads_and_each_tasks_await_chain(
    threads: dict[str, threading.Thread],
) -> None:
    async def waiter(event: asyncio.Event) -> None:
        await inner(event)

    async def inner(event: asyncio.Event) -> None:
        await event.wait()

    async def scenario() -> str:
        event = asyncio.Event()
        task = asyncio.create_task(waiter(event), name="the-waiter")
        await asyncio.sleep(0)
        text = profiling.goroutines()
        event.set()
        await task
        return text

    text = asyncio.run(scenario())
    assert text.startswith("threads: ")
    assert 'thread "busy"' in text and 'thread "idle"' in text and "in doze" in text
    # The task's stack goes through waiter() and inner() down to Event.wait().
    task = text[text.index('task "the-waiter" [pending]:') :]
    assert task.index("in waiter\n") < task.index("in inner\n") < task.index("in wait\n")


def test_heap_lists_top_allocations_by_line_when_tracing() -> None:
    assert not tracemalloc.is_tracing()
    assert profiling.heap() is None
    profiling.start_heap_tracing()
    try:
        hoard = [bytearray(1000) for _ in range(2000)]  # about 2 MB from one line
        text = profiling.heap(top=5)
        assert text is not None
        lines = text.splitlines()
        assert lines[0].startswith("# tracemalloc: ")
        assert 3 <= len(lines) <= 2 + 5
        size, blocks, where = lines[2].split(" ")
        assert int(size) >= 2_000_000 and int(blocks) >= 2000
        assert where.endswith("test_profiling.py:" + str(_line_of("hoard = [")))
        del hoard
    finally:
        tracemalloc.stop()
    assert profiling.heap() is None


def _line_of(text: str) -> int:
    with open(__file__) as f:
        for number, line in enumerate(f, 1):
            if text in line and "_line_of" not in line:
                return number
    raise AssertionError(text)
