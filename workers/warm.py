"""Warm trainers: a machine that runs trainers keeps one process that has imported torch and
crashdrill, and forks every trainer start from it (crashdrill/processes/forkserver.py, the
drill's mechanism too). A start or a crash test's restart then costs a fork, not ~1.5 s of imports.

    warm = WarmTrainers(keep_children=True)    # the lab's machine (the local executor)
    warm = WarmTrainers(die_with_parent=True)  # a Ray node's run actor
    warm.prewarm()                             # start importing now, in the background
    child = warm.spawn(argv, env, stdout=out, stderr=err)   # None: start it with exec
    warm.status()   # {"mode": "fork" | "exec", "warm", "pid", "forked", "exec", "error"}
    warm.close()

`status()["warm"]` is WARMING while the warm process is still importing torch (the first
start waits for it: seconds on a small machine), READY once it has said its imports are
done (a start is a fork: tenths of a second), NONE where there is none (starts exec). The
lab's health says it (GET /api/health `warm_trainers`), and the page says "warming up".

Only the built-in trainer's command (`python -m crashdrill run …`, with this Python) is
forked; any other trainer command is exec'd as before. The fork server gets the
environment a trainer would (the allowlist of workers/trainer_env.py, never the server's
secrets); each child gets its run's own. Where the warm process is missing or dies, the
start falls back to exec (the trainer still starts, a second later) and `status()` says
why; the next start after RETRY_S tries a new warm process.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from crashdrill.processes.forkserver import (
    RANKS_PRELOAD,
    TRAINER_PRELOAD,
    CommandTooLong,
    ForkedProcess,
    ForkServer,
    ForkServerError,
    supported,
)
from crashdrill.processes.forkserver import (
    START_TIMEOUT as IMPORT_WAIT_S,
)
from crashdrill.workers.trainer_env import env_pass_from_environ, trainer_environment

log = logging.getLogger(__name__)

RETRY_S = 30.0  # after the warm process failed: exec until this long has passed
ENV_SWITCH = "CRASHDRILL_WARM_TRAINERS"  # "0": every start execs (the old way)
WARMING, READY, NONE = "warming", "ready", "none"  # status()["warm"]


def wanted() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


TRAINER_COMMAND = ("crashdrill", "run")  # `python -m crashdrill run …`


def forkable(argv: Sequence[str], command: Sequence[str] = TRAINER_COMMAND) -> bool:
    """A command the warm process can start: `python -m <command> …` with this Python."""
    n = len(command)
    return len(argv) >= 2 + n and list(argv[: 2 + n]) == [sys.executable, "-m", *command]


class WarmTrainers:
    """One warm process, started on first use (or `prewarm`), replaced after it dies."""

    def __init__(
        self,
        *,
        keep_children: bool = False,
        die_with_parent: bool = False,
        enabled: bool | None = None,
        preload: Sequence[str] = (*TRAINER_PRELOAD, *RANKS_PRELOAD),
        command: Sequence[str] = TRAINER_COMMAND,
    ) -> None:
        self.preload = list(preload)
        self.command = tuple(command)
        self.keep_children = keep_children
        self.die_with_parent = die_with_parent
        self._asked = True if enabled is None else enabled  # False: not ours (a custom command)
        self.enabled = self._asked and wanted() and supported()
        self._lock = threading.Lock()
        self._server: ForkServer | None = None
        self._failed_at: float | None = None
        self._closed = False
        self.error: str | None = None if self.enabled else self._why_off()
        self.forked = 0  # starts forked from the warm process
        self.execs = 0  # starts of the trainer that fell back to exec

    def _why_off(self) -> str:
        if not supported():
            return "this platform cannot fork a warm process (Linux only)"
        if not wanted():
            return f"turned off ({ENV_SWITCH}=0)"
        return "the trainer command is not the built-in trainer's (python -m crashdrill run)"

    def prewarm(self) -> None:
        """Start the warm process now; its imports run while the caller goes on (a thread
        waits for them to be done and logs how long they took)."""
        with self._lock:
            server = self._server_locked()
        if server is not None:
            threading.Thread(
                target=self._log_when_imported, args=(server,), name="warm-imports", daemon=True
            ).start()

    def _log_when_imported(self, server: ForkServer) -> None:
        if server.imported(timeout=IMPORT_WAIT_S):
            seconds = (server.imported_at or server.ready or server.started) - server.started
            log.info(
                "warm trainer process ready: it imported torch in %.1f s; starts fork from it",
                seconds,
            )

    def _server_locked(self) -> ForkServer | None:
        if not self.enabled or self._closed:
            return None
        server = self._server
        if server is not None and server.alive():
            return server
        if server is not None:  # it died: say so once, exec until RETRY_S has passed
            self._drop_locked(f"the warm process exited{server.why()}")
            return None
        if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_S:
            return None
        env = trainer_environment(os.environ, passes=env_pass_from_environ())
        try:
            self._server = ForkServer(
                self.preload,
                env=env,
                keep_children=self.keep_children,
                die_with_parent=self.die_with_parent,
            )
        except ForkServerError as e:
            self._failed_at = time.monotonic()
            self.error = str(e)
            log.warning("no warm trainer process (%s): trainers start with exec", e)
            return None
        self._failed_at = None
        self.error = None
        return self._server

    def _drop_locked(self, why: str) -> None:
        server, self._server = self._server, None
        self._failed_at = time.monotonic()
        self.error = why
        log.warning("%s; trainers start with exec until a new one is ready", why)
        if server is not None:
            try:
                server.close()
            except Exception:
                log.exception("closing the warm process failed")

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        stdout: IO[bytes],
        stderr: IO[bytes],
        cwd: str | None = None,
        nice: int | None = None,
    ) -> ForkedProcess | None:
        """The trainer forked from the warm process (`nice`: yielding the CPU from the fork
        on); None when it must be exec'd (not the built-in trainer's command, no warm
        process, or it failed just now)."""
        if not forkable(argv, self.command):
            return None  # not ours to start: no fallback to count
        with self._lock:
            server = self._server_locked()
        child = None
        if server is not None:
            try:  # not under the lock: the first start waits for the imports; status not
                child = server.spawn(
                    list(argv), dict(env), cwd, stdout=stdout, stderr=stderr, nice=nice
                )
            except CommandTooLong:
                pass  # this one execs; the warm process stays for the others
            except ForkServerError as e:
                with self._lock:
                    if self._server is server:
                        self._drop_locked(str(e))
        with self._lock:
            if child is None:
                self.execs += 1 if self.enabled else 0
            else:
                self.forked += 1
        return child

    def status(self) -> dict[str, Any]:
        """What GET /api/health shows: whether starts fork or exec, and why."""
        with self._lock:
            server = self._server
            if server is not None and not server.alive():
                self._drop_locked(f"the warm process exited{server.why()}")
                server = None
            if server is not None:
                warm = READY if server.imported() else WARMING
            else:
                # About to start one (the lab's first start does), or none: exec.
                starting = self.enabled and not self._closed and self._failed_at is None
                warm = WARMING if starting else NONE
            return {
                "mode": "fork" if server is not None else "exec",
                "warm": warm,
                "pid": server.pid if server is not None else None,
                "forked": self.forked,
                "exec": self.execs,
                "error": self.error,
            }

    def close(self) -> None:
        """The warm process exits; with `keep_children` its trainers keep training."""
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
        if server is not None:
            server.close()
