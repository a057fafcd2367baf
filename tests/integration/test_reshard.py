"""A real 2-rank gloo group SIGKILLed by the supervisor and restarted on 1 rank, as lesson
1.18's Crash test does: the DCP checkpoint of the global data layout reshards and resumes
at the same global sample within the stated tolerance; one file per rank is refused,
naming both world sizes and the rank whose state it would drop."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from crashdrill.server.lessons.crash_effects import crash_settings
from crashdrill.server.lessons.resume_checks import resume_checks
from crashdrill.trainer.checkpoint import load_model_state
from crashdrill.trainer.presets import Crash, dump_preset, get_preset
from crashdrill.trainer.records import read_records
from crashdrill.trainer.resume_compare import RESHARD_LOSS_TOLERANCE
from crashdrill.trainer.stages import Stage
from crashdrill.workers.launch import Launch
from crashdrill.workers.run_dir import RunDir
from crashdrill.workers.supervisor import Supervisor
from tests.support.supervising import Changes, wait_for_step

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _small_lesson(tmp_path: Path) -> Path:
    """Lesson 1.18 at a smoke size: 30 steps, checkpoints every 10."""
    lesson = get_preset("lesson-1.18")
    small = {"steps": 30, "ckpt_every": 10, "eval_every": 10, "probe_every": 10}
    run = {**lesson.run, **small, "sample_every": 30, "warmup": 5}
    crash = Crash("kill", restart_ranks=lesson.crash.restart_ranks)
    path = tmp_path / "reshard.toml"
    path.write_text(dump_preset(replace(lesson, id="reshard", run=run, crash=crash)))
    return path


def test_a_2_rank_run_restarted_on_1_reshards_dcp_within_tolerance_and_rank_files_refuse(
    tmp_path: Path,
) -> None:
    preset = str(_small_lesson(tmp_path))
    assert crash_settings(preset) == ("ranks=1",)
    runs: dict[str, tuple[Supervisor, Changes, RunDir]] = {}
    for label in "AB":
        changes, rd = Changes(), RunDir(tmp_path / label)
        launch = Launch(rd.path, preset, label, crash_settings=crash_settings(preset))
        runs[label] = (Supervisor(launch, changes), changes, rd)
        runs[label][0].start()
    for sup, _, rd in runs.values():
        wait_for_step(rd, 13, timeout=240)
        sup.crash()
    runs["A"][1].wait_for("finished", timeout=300)
    runs["B"][1].wait_for("failed", timeout=300)

    recs, _ = read_records(runs["A"][2].records)
    (crash,) = [r for r in recs if r.get("code") == "crash"]
    assert "The lesson restarts it with ranks=1" in crash["text"], crash
    (resume,) = [r for r in recs if r["kind"] == "resume"]
    assert (resume["from_ranks"], resume["ranks"]) == (2, 1) and resume["missing"] == []
    compared = [(r["segment"], r["step"], r) for r in recs
                if r["kind"] in ("step", "val", "probe", "sample")]  # fmt: skip
    (check,) = resume_checks(compared, {1: resume["from_step"]}, {}, {1: (2, 1)})
    view = check.to_dict()
    assert check.complete and check.points == crash["lost_steps"] > 0, view
    assert check.bit_identical is False  # the same samples, summed over another split
    assert view["resharded"]["within_tolerance"] is True, view["max_abs_delta"]
    assert not [f for f in view["fields"] if f["field"].startswith("step.rank_loss_bits")]
    run_records = [r for r in recs if r["kind"] == "run"]
    assert [r["ranks"] for r in run_records] == [2, 1]
    print(f"\n2 → 1 ranks: max |Δloss| {check.max_abs_delta:.3g} over {check.points} steps"
          f" (tolerance {RESHARD_LOSS_TOLERANCE:g})")  # fmt: skip

    recs, _ = read_records(runs["B"][2].records)
    (refused,) = [r for r in recs if r.get("code") == "checkpoint_refused"]
    assert refused["segment"] == 1 and (refused["written_ranks"], refused["ranks"]) == (2, 1)
    assert "written by 2 ranks, this run has 1" in refused["text"], refused
    assert "rank 1's RNG states and data position would be silently dropped" in refused["text"]
    stages = [r["stage"] for r in recs if r["kind"] == "stage" and r["segment"] == 1]
    assert stages[-1] == Stage.FAILED
    assert not [r for r in recs if r["kind"] == "step" and r["segment"] == 1]
    (failed,) = [r for r in recs if r.get("code") == "failed"]
    assert failed["exit_code"] == 2, failed
    # Its checkpoint is whole: readable by a tool at its own world size (the drill's weights).
    weights = load_model_state(runs["B"][2].path)
    assert set(weights) == set(load_model_state(runs["A"][2].path)) and weights
