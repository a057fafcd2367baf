"""The world-size trial's parts: the launcher's --nproc_per_node read and replaced, the
reduced loss of a segment, and a restart's refusal told from a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashdrill.drill.command import CommandTarget
from crashdrill.drill.target import Segment
from crashdrill.drill.trace import LossParser, StepPoint
from crashdrill.drill.world_size import (
    launcher_world_size,
    reduced_points,
    refused,
    with_world_size,
)

TORCHRUN = ["torchrun", "--standalone"]


@pytest.mark.parametrize(
    ("argv", "ranks", "changed"),
    [
        (
            [*TORCHRUN, "--nproc_per_node", "2", "t.py"],
            2,
            [*TORCHRUN, "--nproc_per_node", "1", "t.py"],
        ),
        ([*TORCHRUN, "--nproc-per-node=4", "t.py"], 4, [*TORCHRUN, "--nproc-per-node=1", "t.py"]),
    ],
)
def test_the_launcher_s_ranks_are_read_and_replaced(
    argv: list[str], ranks: int, changed: list[str]
) -> None:
    assert launcher_world_size(argv) == ranks
    assert with_world_size(argv, 1) == changed


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["python", "train.py"], "--nproc_per_node N"),
        ([*TORCHRUN, "--nproc_per_node", "auto", "t.py"], "'auto'"),
    ],
)
def test_a_command_whose_ranks_the_drill_cannot_change_is_refused(
    argv: list[str], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        launcher_world_size(argv)


def test_only_restarts_that_find_a_checkpoint_run_at_the_new_world_size(tmp_path: Path) -> None:
    argv = [*TORCHRUN, "--nproc_per_node", "2", "t.py"]
    target = CommandTarget(argv, parser=LossParser(), resume_world_size=1, tolerance=1e-4)
    assert target.command(tmp_path, restart=False) == argv
    assert target.command(tmp_path, restart=True) == argv  # nothing to resume: a fresh start
    (tmp_path / "step-4").mkdir()
    (tmp_path / "step-4" / ".metadata").write_bytes(b"\x80\x04N.")  # a pickle: DCP's
    assert target.command(tmp_path, restart=True)[3] == "1"
    with pytest.raises(ValueError, match="own --nproc_per_node"):
        CommandTarget(argv, parser=LossParser(), resume_world_size=2, tolerance=1e-4)


def _p(step: int, value: float) -> StepPoint:
    return StepPoint(step, repr(value), value, None, float(step))


def test_the_reduced_loss_is_the_mean_of_the_ranks_losses_at_steps_every_rank_printed() -> None:
    seg = Segment(1, ["torchrun"], None, started=0.0)
    seg.rank_points = {0: [_p(1, 1.0), _p(2, 2.0)], 1: [_p(1, 3.0)]}
    assert [(p.step, p.value) for p in reduced_points(seg)] == [(1, 2.0)]
    seg.rank_points = {}
    seg.points = [_p(1, 5.0)]
    assert [p.value for p in reduced_points(seg)] == [5.0]  # the run's trace


def test_a_restart_that_says_the_world_size_differs_refused() -> None:
    seg = Segment(2, ["torchrun"], None, started=0.0)
    seg.exit_code = 1
    seg.stderr_tail = ["[default0]:step-8: written by 2 ranks, this run has 1: …", "exit"]
    assert refused(seg) is not None and "written by 2 ranks" in (refused(seg) or "")
    seg.stderr_tail = ["KeyError: 'optim'"]
    assert refused(seg) is None
