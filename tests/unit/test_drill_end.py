"""How a drill ended when its run did not (drill/drill_end.py): the restart-loop finding
quotes the restart's own error, and the whole drill's default deadline comes from the
reference run's time with a floor."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from crashdrill.drill.drill_end import (
    MIN_DEADLINE_S,
    DrillLimits,
    default_deadline,
    end_findings,
    same_failure,
)
from crashdrill.drill.target import Segment, Target
from crashdrill.drill.trace import StepPoint
from crashdrill.drill.verdicts import Evidence

ERROR = "RuntimeError: optimizer state dict has 0 groups, expected 1"


def _crashed(index: int, steps: int = 0, error: str = ERROR) -> Segment:
    seg = Segment(index, ["python", "train.py", "--resume"], None, 0.0, exit_code=1)
    seg.stderr_tail = ["Traceback (most recent call last):", '  File "train.py"', error]
    seg.points = [StepPoint(s, "1.0", 1.0, None, 0.0) for s in range(1, steps + 1)]
    return seg


def _evidence(segments: list[Segment]) -> Evidence:
    killed = Segment(0, ["python", "train.py"], None, 0.0, killed=True, exit_code=-9)
    target = cast(Target, object())  # end_findings reads only the crashed run's segments
    return Evidence(target, killed, {}, [killed, *segments], [])


def test_the_restart_loop_finding_quotes_the_restart_s_error_and_names_both_restarts() -> None:
    first, second = _crashed(1), _crashed(2)
    assert same_failure(first, second)
    second.chain_end = "same-failure"
    limits = DrillLimits(max_restarts=16)
    (finding,) = end_findings(_evidence([first, second]), limits)
    assert finding.code == "restart-loop" and finding.resume == 2
    assert finding.text.startswith("restarts 1 and 2 failed the same way, exit status 1 with ")
    assert repr(ERROR) in finding.text  # the error itself, quoted
    assert finding.text.rstrip().endswith(ERROR)  # and the stderr tail under it
    assert limits.chain_end == "same-failure"


def test_restarts_that_fail_differently_or_get_further_are_no_loop() -> None:
    assert not same_failure(_crashed(1), _crashed(2, error="KeyError: 'optimizer'"))
    assert not same_failure(_crashed(1, steps=3), _crashed(2, steps=5))
    assert same_failure(_crashed(1, steps=5), _crashed(2, steps=5))


def test_the_default_deadline_is_four_reference_runs_per_kill_and_one_more_with_a_floor() -> None:
    assert default_deadline(30.0, 2) == 4 * 3 * 30.0
    assert default_deadline(100.0, 0) == 400.0
    assert default_deadline(1.0, 3) == MIN_DEADLINE_S  # a fast script: a slow start's room
    assert MIN_DEADLINE_S == 120.0


@pytest.mark.parametrize("default", [True, False])
def test_the_deadline_finding_says_whether_the_deadline_was_the_default(default: bool) -> None:
    limits = DrillLimits(max_restarts=16, deadline_s=360.0, deadline_default=default)
    limits.deadline_hit, limits.running = True, "process 2 of the crashed run, at step 40"
    (finding,) = end_findings(_evidence([]), limits)
    assert finding.code == "deadline" and "360 s" in finding.text
    assert ("(the default: from the reference run's time)" in finding.text) is default
    assert "during process 2 of the crashed run, at step 40" in finding.text
    data = limits.to_json()
    assert data["deadline_default"] is default and data["deadline_hit"] and not data["complete"]


def test_an_interrupt_names_the_kept_work_dir(tmp_path: Path) -> None:
    limits = DrillLimits(max_restarts=16, work_dir=str(tmp_path))
    limits.signal = "SIGINT"
    (finding,) = end_findings(_evidence([]), limits)
    assert finding.code == "interrupted"
    assert f"the evidence is kept in --work-dir {tmp_path}" in finding.text
