"""The executor contract (tests/support/executor_contract.py) on the local executor:
trainers exec'd, and trainers forked from a warm process. The Ray executor passes the
same tests in tests/integration/test_ray_lab.py, on that module's cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from crashdrill.workers.executor import Executor
from crashdrill.workers.local_executor import LocalExecutor
from crashdrill.workers.warm import WarmTrainers
from tests.support.executor_contract import SHORT, ExecutorContract

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STAND_IN_MODULE = "tests.support.stand_in_trainer"


class TestLocalExecutorContract(ExecutorContract):
    def make_executor(self) -> Executor:
        return LocalExecutor()


class TestWarmLocalExecutorContract(ExecutorContract):
    """The stand-in run as `python -m tests.support.stand_in_trainer`, which the warm
    process forks as it forks the built-in trainer (`python -m crashdrill run`)."""

    command = (sys.executable, "-m", STAND_IN_MODULE)

    def make_executor(self) -> Executor:
        warm = WarmTrainers(keep_children=True, preload=["json"], command=[STAND_IN_MODULE])
        return LocalExecutor(warm)

    def test_its_trainers_are_forked_from_the_warm_process(
        self, executor: Executor, tmp_path: Path
    ) -> None:
        launch = self.launch(tmp_path)
        trainer = self.start(executor, launch, **SHORT)
        assert trainer.wait(60) == 0
        starts = executor.starts()
        assert starts["mode"] == "fork" and starts["forked"] == 1, starts
