"""The lab's background tasks (server/background.py): started by name, stopped at once,
a crash logged and the lab going on."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from crashdrill.server.background import BackgroundTask, every, on_signal
from crashdrill.server.storage.db import DatabaseUnavailable

log = logging.getLogger("crashdrill.tests.background")


async def _forever() -> None:
    await asyncio.sleep(3600)


def test_stop_cancels_a_sleeping_task_at_once_and_a_second_stop_is_harmless() -> None:
    async def main() -> float:
        task = BackgroundTask("crashdrill-test", log)
        task.start(_forever())
        await asyncio.sleep(0)
        assert task.running
        t0 = time.monotonic()
        await task.stop()
        took = time.monotonic() - t0
        assert not task.running
        await task.stop()
        return took

    assert asyncio.run(main()) < 1.0  # not the hour it sleeps


def test_the_task_runs_under_its_name() -> None:
    async def main() -> set[str]:
        task = BackgroundTask("crashdrill-named", log)
        task.start(_forever())
        names = {t.get_name() for t in asyncio.all_tasks()}
        await task.stop()
        return names

    assert "crashdrill-named" in asyncio.run(main())


def test_a_task_that_swallows_its_cancellation_is_left_after_the_timeout_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()

    async def main() -> float:
        task = BackgroundTask("crashdrill-stubborn", log)
        task.start(stubborn())
        await asyncio.sleep(0)
        t0 = time.monotonic()
        await task.stop(timeout_s=0.05)
        took = time.monotonic() - t0
        release.set()
        await asyncio.sleep(0)
        return took

    with caplog.at_level(logging.WARNING, logger=log.name):
        assert asyncio.run(main()) < 1.0
    assert "crashdrill-stubborn did not stop within 0.05 s" in caplog.text


def test_a_task_that_crashes_is_logged_by_name_and_its_stop_does_not_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def crash() -> None:
        raise RuntimeError("boom")

    async def main() -> None:
        task = BackgroundTask("crashdrill-crashy", log)
        task.start(crash())
        await asyncio.sleep(0.01)
        assert not task.running
        await task.stop()  # the lab's shutdown goes on

    with caplog.at_level(logging.ERROR, logger=log.name):
        asyncio.run(main())
    [rec] = [r for r in caplog.records if r.name == log.name]
    assert rec.getMessage() == "background task crashdrill-crashy crashed"
    assert rec.exc_info is not None and "boom" in str(rec.exc_info[1])


def test_every_logs_a_failed_pass_and_keeps_going_and_is_quiet_about_the_database(
    caplog: pytest.LogCaptureFixture,
) -> None:
    passes: list[int] = []

    def work() -> None:
        passes.append(len(passes))
        if len(passes) == 1:
            raise ValueError("first pass fails")
        if len(passes) == 2:
            raise DatabaseUnavailable("database down")

    async def main() -> None:
        task = BackgroundTask("crashdrill-every", log)
        task.start(every(0.001, work, log, "the pass failed; trying again"))
        while len(passes) < 4:
            await asyncio.sleep(0.001)
        await task.stop()

    with caplog.at_level(logging.WARNING, logger=log.name):
        asyncio.run(main())
    failed = [r for r in caplog.records if r.name == log.name]
    assert [r.getMessage() for r in failed] == ["the pass failed; trying again"]
    exc_info = failed[0].exc_info
    assert exc_info is not None  # logged with the exception
    assert "first pass fails" in str(exc_info[1])


def test_every_awaits_a_coroutine_function() -> None:
    done = asyncio.Event()

    async def work() -> None:
        await asyncio.sleep(0)
        done.set()

    async def main() -> None:
        task = BackgroundTask("crashdrill-every-async", log)
        task.start(every(0.001, work, log, "failed"))
        await asyncio.wait_for(done.wait(), 5)
        await task.stop()

    asyncio.run(main())


def test_on_signal_runs_work_when_asked_and_again_after_a_failed_pass() -> None:
    results = [False, True]
    calls: list[float] = []

    async def work() -> bool:
        calls.append(time.monotonic())
        return results[len(calls) - 1]

    async def main() -> None:
        wanted = asyncio.Event()
        task = BackgroundTask("crashdrill-signal", log)
        task.start(on_signal(wanted, work, retry_s=0.01))
        await asyncio.sleep(0.02)
        assert calls == []  # nobody asked
        wanted.set()
        while len(calls) < 2:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.03)
        await task.stop()

    asyncio.run(main())
    assert len(calls) == 2  # the failed pass once more, then nothing until asked again
