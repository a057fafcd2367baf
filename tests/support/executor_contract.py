"""The executor contract (workers/executor.py), as tests every executor must pass.

    class TestMyExecutorContract(ExecutorContract):
        def make_executor(self) -> Executor: ...   # a fresh one: a restarted server's too

Subclass it in a test module with `make_executor` (and `command`, when the stand-in
trainer must be started another way); pytest collects the inherited tests there.
tests/integration/test_executor_conformance.py runs it on the local executor (exec and
forked from a warm process), tests/integration/test_ray_lab.py on the Ray executor with
that module's cluster. Every run is the stand-in trainer (tests/support/stand_in_trainer.py),
started the way the supervisor starts one: `start(launch, env, require_checkpoint=…)`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from crashdrill.trainer.event_record import event
from crashdrill.trainer.start_line import Start, read_start
from crashdrill.workers.executor import Executor, StartCancelled, Trainer
from crashdrill.workers.launch import Launch
from tests.support.lab import STAND_IN

LONG = {"CRASHDRILL_STANDIN_STEPS": "100000", "CRASHDRILL_STANDIN_STEP_S": "0.02"}
SHORT = {"CRASHDRILL_STANDIN_STEPS": "25", "CRASHDRILL_STANDIN_STEP_S": "0.005"}


def records(run_dir: Path) -> list[dict[str, Any]]:
    """The server's copy of the run's records (complete lines)."""
    try:
        text = (run_dir / "records.jsonl").read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_exit(trainer: Trainer, within: float = 60.0) -> int | None:
    """Its exit status: `wait` until it stops raising TimeoutError."""
    deadline = time.monotonic() + within
    while True:
        try:
            return trainer.wait(0.2)
        except TimeoutError:
            assert time.monotonic() < deadline, f"trainer {trainer.pid} still runs"


def wait_record(
    trainer: Trainer, run_dir: Path, code_or_kind: str, within: float = 60.0
) -> dict[str, Any]:
    """The first record of that code (or kind) in the server's copy; waiting ships on
    executors whose trainer writes elsewhere."""
    deadline = time.monotonic() + within
    while True:
        for rec in records(run_dir):
            if code_or_kind in (rec.get("code"), rec.get("kind")):
                return rec
        assert time.monotonic() < deadline, f"no {code_or_kind} record in {run_dir}"
        with contextlib.suppress(TimeoutError):
            trainer.wait(0.1)


def gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


class ExecutorContract:
    command: tuple[str, ...] = STAND_IN

    def make_executor(self) -> Executor:
        raise NotImplementedError

    @pytest.fixture
    def executor(self) -> Iterator[Executor]:
        executor = self.make_executor()
        executor.open()
        yield executor
        executor.close()

    def launch(self, tmp_path: Path, name: str = "run") -> Launch:
        return Launch(tmp_path / "runs" / name, "quick", "A", command=self.command)

    def start(self, executor: Executor, launch: Launch, **knobs: str) -> Trainer:
        env = {**os.environ, **knobs}
        executor.prepare(launch)
        return executor.start(launch, env, require_checkpoint=False)

    def test_wait_returns_the_exit_status_once_every_record_is_in_the_server_s_run_dir(
        self, executor: Executor, tmp_path: Path
    ) -> None:
        launch = self.launch(tmp_path)
        trainer = self.start(executor, launch, **SHORT)
        try:
            assert wait_exit(trainer) == 0
            recs = records(launch.run_dir)  # read once, right after wait returned
            assert [r["step"] for r in recs if r["kind"] == "step"] == list(range(1, 26))
            assert recs[-1].get("code") == "finished"
            assert executor.starts()["mode"] in ("fork", "exec", "node")
        finally:
            executor.release(launch.run_dir)

    def test_sigkill_takes_the_trainer_s_whole_tree_even_a_child_in_its_own_session(
        self, executor: Executor, tmp_path: Path
    ) -> None:
        launch = self.launch(tmp_path)
        trainer = self.start(executor, launch, CRASHDRILL_STANDIN_CHILD="1", **LONG)
        try:
            child = wait_record(trainer, launch.run_dir, "standin_child")["pid"]
            wait_record(trainer, launch.run_dir, "step")
            trainer.signal(signal.SIGKILL)
            code = wait_exit(trainer)
            assert code != 0
            assert gone(child), f"the trainer's child {child} outlived the kill"
            assert trainer.lost_host is None  # its machine is still there
        finally:
            executor.release(launch.run_dir)

    def test_a_restarted_server_s_executor_adopts_the_running_trainer(
        self, executor: Executor, tmp_path: Path
    ) -> None:
        assert self.make_executor().adopt(self.launch(tmp_path, "never").run_dir, []) is None
        launch = self.launch(tmp_path)
        trainer = self.start(executor, launch, **LONG)
        try:
            wait_record(trainer, launch.run_dir, "step")
            again = self.make_executor()
            adopted = again.adopt(launch.run_dir, [trainer.pid])
            assert adopted is not None and adopted.pid == trainer.pid
            with pytest.raises(TimeoutError):
                adopted.wait(0.3)  # it still trains
            adopted.signal(signal.SIGKILL)
            wait_exit(adopted)  # the adopted one's status may be unknown (None)
            assert gone(trainer.pid)
        finally:
            executor.release(launch.run_dir)

    def test_the_run_files_where_the_trainer_ran_give_checkpoints_stderr_and_take_records(
        self, executor: Executor, tmp_path: Path
    ) -> None:
        launch = self.launch(tmp_path)
        trainer = self.start(executor, launch, **SHORT)
        try:
            assert wait_exit(trainer) == 0
            files = executor.files(launch.run_dir)
            assert files.checkpoint_step() == 20  # every 10 steps, of 25
            size = files.stderr_size()
            assert size > 0 and read_start(files.stderr_since(0)) == Start("fresh", 0)
            assert files.stderr_since(size) == b""
            assert read_start(files.stderr_tail(0)) == Start("fresh", 0)
            assert files.stderr_tail(size) == ""
            files.append_records([event("mirror_unreachable", "after", segment=0)])
            last = records(launch.run_dir)[-1]
            assert (last["code"], last["v"]) == ("mirror_unreachable", 1)  # after the trainer's
            files.wipe()
            assert files.checkpoint_step() is None
        finally:
            executor.release(launch.run_dir)

    def test_a_cancel_before_the_start_gives_it_up_or_leaves_it_be_and_release_forgets_it(
        self, executor: Executor, tmp_path: Path
    ) -> None:
        """A Stop before the trainer exists: a start that has to wait (for a node) gives
        up with StartCancelled, one that never waits starts; after `release` (the run
        ended) the run dir's next start is not affected either way."""
        launch = self.launch(tmp_path)
        executor.cancel(launch.run_dir)
        try:
            trainer = self.start(executor, launch, **SHORT)
        except StartCancelled:
            pass
        else:
            assert wait_exit(trainer) == 0
        executor.release(launch.run_dir)
        trainer = self.start(executor, launch, **SHORT)
        try:
            assert wait_exit(trainer) == 0
            assert records(launch.run_dir)[-1].get("code") == "finished"
        finally:
            executor.release(launch.run_dir)
