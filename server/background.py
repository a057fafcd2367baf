"""The lab's background tasks on the event loop: started under a name, stopped by
cancelling them, a crash logged instead of lost.

    task = BackgroundTask("crashdrill-housekeeping", log)
    task.start(every(interval_s, self.pass_once, log, "housekeeping failed; ..."))
    task.start(on_signal(wanted, self.apply))   # whenever `wanted` is set, one at a time
    await task.stop()       # cancelled; waits for it to end (at most STOP_TIMEOUT_S)
    task.cancel()           # the same, from code that cannot wait

The loops themselves keep going whatever one pass raises: `every` logs the exception
(`DatabaseUnavailable` quietly: the ingest tells the outage, once) and tries again on the
next tick; `on_signal` tries again after RETRY_S when a pass says it failed. Should a
loop still end by an exception, the task logs it with its name and the lab carries on:
its `stop` does not raise it again.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from crashdrill.server.storage.db import DatabaseUnavailable

_log = logging.getLogger(__name__)

RETRY_S = 1.0  # a scheduling pass or a supervisor's report waiting for the database
# How long `stop` waits for a cancelled task: a task ends at its next await, so only one
# that swallows the cancellation gets near this (it is then left running, and said so).
STOP_TIMEOUT_S = 10.0


class BackgroundTask:
    """One named asyncio task of the lab; `log` is the owner's logger (its crash is
    logged there)."""

    def __init__(self, name: str, log: logging.Logger = _log) -> None:
        self.name = name
        self._log = log
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, body: Coroutine[Any, Any, None]) -> None:
        """Run `body` as the task (on the event loop's thread)."""
        self._task = asyncio.get_running_loop().create_task(body, name=self.name)
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._log.error("background task %s crashed", self.name, exc_info=error)

    def cancel(self) -> None:
        """Cancel the task without waiting for it to end."""
        if self._task is not None:
            self._task.cancel()
        self._task = None

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Cancel the task and wait until it ended, at most `timeout_s`."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            self._log.warning("background task %s did not stop within %g s", self.name, timeout_s)


async def every(
    interval_s: float,
    work: Callable[[], Awaitable[object] | object],
    log: logging.Logger,
    failed: str,
) -> None:
    """Forever: wait `interval_s`, then run `work` (a function or a coroutine function);
    an exception is logged as `failed`, a DatabaseUnavailable is left to the outage."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            result = work()
            if inspect.isawaitable(result):
                await result
        except DatabaseUnavailable:
            pass  # the outage is said elsewhere; the next pass tries again
        except Exception:
            log.exception(failed)


async def on_signal(
    wanted: asyncio.Event, work: Callable[[], Awaitable[bool]], retry_s: float = RETRY_S
) -> None:
    """Run `work` whenever `wanted` is set, one at a time; when it fails (False), again
    after `retry_s` (the scheduler's task, and the one applying supervisors' reports)."""
    while True:
        await wanted.wait()
        wanted.clear()
        if not await work():
            await asyncio.sleep(retry_s)
            wanted.set()
