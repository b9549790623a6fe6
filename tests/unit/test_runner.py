"""kubeproxy.runner: the bounded-frequency sync runner, on a manual clock.

Time moves only when a test advances the :class:`ManualClock`; between steps the event
loop is spun so the runner reacts, so no test sleeps for real.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from kubeproxy.runner import BoundedFrequencyRunner, ManualClock

# A power of two, so sums of steps hit whole seconds exactly.
STEP = 1 / 128


async def spin(times: int = 10) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


async def advance(clock: ManualClock, seconds: float) -> None:
    """Let the runner react to what just happened, then move time in small steps."""
    for _ in range(round(seconds / STEP)):
        await spin()
        clock.advance(STEP)
    await spin()


class Recorder:
    """The runner's function: records start times; results come from ``outcomes``."""

    def __init__(self, clock: ManualClock, outcomes: Callable[[int], bool] = lambda _: True):
        self.clock = clock
        self.starts: list[float] = []
        self.outcomes = outcomes

    async def __call__(self) -> bool:
        self.starts.append(round(self.clock.now(), 3))
        return self.outcomes(len(self.starts))


async def start(runner: BoundedFrequencyRunner, stop: asyncio.Event) -> asyncio.Task[None]:
    """Start the loop and let it reach its first wait before time moves."""
    task = asyncio.create_task(runner.loop(stop))
    await spin()
    return task


def scenario(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


def test_a_burst_of_requests_coalesces_into_a_few_runs() -> None:
    async def body() -> None:
        clock = ManualClock()
        fn = Recorder(clock)
        runner = BoundedFrequencyRunner(fn, 1.0, 30.0, clock)
        stop = asyncio.Event()
        task = await start(runner, stop)
        for _ in range(100):  # 100 changes within one minSyncPeriod
            runner.run()
            await advance(clock, STEP)
        await advance(clock, 2.0)
        stop.set()
        await task
        # The first change syncs at once; the other 99 coalesce into one more run,
        # a minSyncPeriod after the first.
        assert fn.starts == [0.0, 1.0]
        assert runner.runs == 2

    scenario(body)


def test_runs_periodically_without_changes() -> None:
    async def body() -> None:
        clock = ManualClock()
        fn = Recorder(clock)
        runner = BoundedFrequencyRunner(fn, 1.0, 5.0, clock)
        stop = asyncio.Event()
        task = await start(runner, stop)
        await advance(clock, 16.0)
        stop.set()
        await task
        assert fn.starts == [5.0, 10.0, 15.0]

    scenario(body)


def test_periodic_timer_restarts_after_each_run() -> None:
    async def body() -> None:
        clock = ManualClock()
        fn = Recorder(clock)
        runner = BoundedFrequencyRunner(fn, 1.0, 5.0, clock)
        stop = asyncio.Event()
        task = await start(runner, stop)
        await advance(clock, 3.0)
        runner.run()
        await advance(clock, 9.0)
        stop.set()
        await task
        assert fn.starts == [3.0, 8.0]

    scenario(body)


def test_failures_are_retried_with_exponential_backoff_capped_at_max_interval() -> None:
    async def body() -> None:
        clock = ManualClock()
        healthy = asyncio.Event()
        fn = Recorder(clock, lambda _: healthy.is_set())
        runner = BoundedFrequencyRunner(fn, 0.0, 8.0, clock, retry_initial=1.0)
        stop = asyncio.Event()
        task = await start(runner, stop)
        runner.run()
        await advance(clock, 24.0)
        # Delays 1, 2, 4, then capped at 8.
        assert fn.starts == [0.0, 1.0, 3.0, 7.0, 15.0, 23.0]
        healthy.set()
        await advance(clock, 8.0)  # the retry at 31 succeeds...
        await advance(clock, 6.0)  # ...and the backoff resets: periodic at 39, no retries
        assert fn.starts[6:] == [31.0]
        await advance(clock, 2.0)
        assert fn.starts[6:] == [31.0, 39.0]
        stop.set()
        await task

    scenario(body)


def test_an_exception_is_a_failure_and_retries_respect_min_interval() -> None:
    async def body() -> None:
        clock = ManualClock()
        calls: list[float] = []

        async def explode() -> bool:
            calls.append(round(clock.now(), 3))
            raise RuntimeError("nft refused")

        runner = BoundedFrequencyRunner(explode, 2.0, 30.0, clock, retry_initial=0.5)
        stop = asyncio.Event()
        task = await start(runner, stop)
        runner.run()
        await advance(clock, 5.0)
        stop.set()
        await task
        # Retries 0.5s and 1s after a failure, but never within minSyncPeriod (2s).
        assert calls == [0.0, 2.0, 4.0]

    scenario(body)


def test_requests_during_a_run_schedule_exactly_one_follow_up() -> None:
    async def body() -> None:
        clock = ManualClock()
        release = asyncio.Event()
        started: list[float] = []

        async def slow() -> bool:
            started.append(round(clock.now(), 3))
            if len(started) == 1:
                await release.wait()
            return True

        runner = BoundedFrequencyRunner(slow, 1.0, 60.0, clock)
        stop = asyncio.Event()
        task = await start(runner, stop)
        runner.run()
        await spin()
        assert started == [0.0]
        for _ in range(5):
            runner.run()
        await advance(clock, 3.0)  # the first run takes 3s
        release.set()
        await spin()
        await advance(clock, 5.0)
        stop.set()
        await task
        # One follow-up for the five requests, minSyncPeriod after the first run ended.
        assert started == [0.0, 4.0]

    scenario(body)


def test_min_interval_counts_from_the_end_of_a_run() -> None:
    async def body() -> None:
        clock = ManualClock()
        starts: list[float] = []

        async def takes_three_seconds() -> bool:
            starts.append(round(clock.now(), 3))
            clock.advance(3.0)
            return True

        runner = BoundedFrequencyRunner(takes_three_seconds, 1.0, 60.0, clock)
        stop = asyncio.Event()
        task = await start(runner, stop)
        runner.run()
        await spin()
        runner.run()
        await advance(clock, 2.0)
        stop.set()
        await task
        assert starts == [0.0, 4.0]

    scenario(body)


def test_retry_after_runs_no_later_than_asked() -> None:
    async def body() -> None:
        clock = ManualClock()
        fn = Recorder(clock)
        runner = BoundedFrequencyRunner(fn, 1.0, 60.0, clock)
        stop = asyncio.Event()
        task = await start(runner, stop)
        runner.retry_after(10.0)
        runner.retry_after(4.0)  # the sooner wins
        runner.retry_after(20.0)
        await advance(clock, 12.0)
        stop.set()
        await task
        assert fn.starts == [4.0]

    scenario(body)


def test_stop_ends_the_loop_while_waiting_and_after_a_run() -> None:
    async def body() -> None:
        clock = ManualClock()
        fn = Recorder(clock)
        runner = BoundedFrequencyRunner(fn, 1.0, 60.0, clock)
        stop = asyncio.Event()
        task = await start(runner, stop)
        await spin()
        assert clock.sleepers == 1
        stop.set()
        await asyncio.wait_for(task, 1)
        assert fn.starts == []
        assert clock.sleepers == 0  # nothing left waiting on the clock

        release = asyncio.Event()
        stop = asyncio.Event()

        async def stopping_run() -> bool:
            stop.set()
            await release.wait()
            return True

        runner = BoundedFrequencyRunner(stopping_run, 1.0, 60.0, clock)
        runner.run()
        task = await start(runner, stop)
        await spin()
        assert not task.done()  # a run in progress is finished first
        release.set()
        await asyncio.wait_for(task, 1)
        assert runner.runs == 1

    scenario(body)


def test_max_interval_below_min_interval_is_refused() -> None:
    async def fn() -> bool:
        return True

    with pytest.raises(ValueError, match="max_interval"):
        BoundedFrequencyRunner(fn, 5.0, 1.0)
