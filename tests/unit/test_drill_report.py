"""The drill's report: the JSON schema (documented field by field) and the table."""

from __future__ import annotations

import json
from pathlib import Path

from crashdrill.drill import report
from crashdrill.drill.checkpoint_files import CheckpointFiles
from crashdrill.drill.compare import analyse
from crashdrill.drill.drill_end import DrillLimits
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.trace import StepPoint
from crashdrill.drill.verdicts import Evidence, FinalParams
from crashdrill.drill.verify import DrillResult
from crashdrill.trainer.resume_outcome import ResumeOutcome
from tests.unit.test_drill_compare import CKPT, FakeTarget, _seg

DOCS = Path(__file__).resolve().parents[2] / "docs" / "verify.md"


def _result() -> DrillResult:
    crashed = [
        _seg(0, range(1, 4), killed=True, before={}),
        _seg(1, range(1, 23), killed=True, before=CKPT, in_write=True),
        _seg(2, range(16, 41)),
    ]
    plan = [KillPoint(3), KillPoint(20, during_write=True)]
    ref = _seg(0, range(1, 41))
    ev = Evidence(FakeTarget(), ref, CKPT, crashed, plan, FinalParams(True, 4, method="bytes"))
    return DrillResult(FakeTarget(), "command", 7, 2, plan, ev, analyse(ev), 0.0, 3.21)


SCHEMA_KEYS = {
    "schema", "mode", "target", "seed", "kills_requested", "kills", "resumes", "stops", "reference",
    "crashed", "precision", "final_state", "verdict", "exit_code", "diagnosis", "wall_seconds",
    "trials", "drill", "checkpoint_files", "unexercised", "ranks",
}  # fmt: skip
DRILL_KEYS = {
    "complete", "restarts", "max_restarts", "deadline_s", "deadline_default", "deadline_hit",
    "interrupted_by", "running_when_stopped", "chain_end", "work_dir",
}  # fmt: skip
CHECKPOINT_FILES_KEYS = {"globs", "taken", "ignored", "temp_files"}
RESUME_KEYS = {
    "index", "killed_at_step", "kill_in_checkpoint_write", "from_step", "first_step",
    "recomputed", "points", "max_abs_delta", "mean_abs_delta", "first_divergent_step",
    "first_divergent_rank",
    "bit_identical", "restarted_from_start", "checkpoint_existed", "latency_s", "outcome",
    "verdict", "resume_args", "differing", "fields", "trial", "kill", "replay_of",
    "compared_with", "resume_outcome", "within_tolerance",
}  # fmt: skip
FIELD_KEYS = {
    "field", "equal", "points", "steps", "first_divergent_step", "max_abs_delta",
    "mean_abs_delta", "infinite_delta", "numeric",
}  # fmt: skip
KILL_KEYS = {
    "index", "planned_step", "during_write", "preempt", "landed", "t", "step",
    "in_checkpoint_write", "processes", "kind", "recovery", "where", "evidence", "planned",
    "rank", "launcher",
}  # fmt: skip
TRIAL_KEYS = {"kind", "resumes", "passed", "judged", "codes"}
UNEXERCISED_KEYS = {"kind", "reason"}
DIAGNOSIS_KEYS = {"code", "fails", "resume", "text", "evidence"}
STOP_KEYS = {
    "index", "planned_step", "sigterm_step", "last_step", "exit_code", "stop_s", "grace_s",
    "within_grace", "wrote_checkpoint", "resumed_from", "steps_lost", "diagnosis", "text",
}  # fmt: skip


def test_each_resume_reports_its_outcome_in_the_lab_s_words(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    report.write_json(_result(), path)
    resumes = json.loads(path.read_text())["resumes"]
    values = {o.value for o in ResumeOutcome}
    assert resumes and all(r["resume_outcome"] in values for r in resumes)
    assert all((r["resume_outcome"] == "identical") == r["bit_identical"] for r in resumes)


def test_json_report_has_the_documented_fields(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    report.write_json(_result(), path)
    data = json.loads(path.read_text())
    assert set(data) == SCHEMA_KEYS and data["schema"] == "crashdrill.verify/1"
    assert data["seed"] == 7 and data["verdict"] == "pass" and data["exit_code"] == 0
    assert all(set(k) == KILL_KEYS for k in data["kills"]) and len(data["kills"]) == 2
    assert data["kills"][1]["in_checkpoint_write"] and data["kills"][1]["step"] == 22
    assert all(set(r) == RESUME_KEYS for r in data["resumes"])
    assert data["resumes"][1]["recomputed"] == {"first": 16, "last": 22, "steps": 7}
    assert all(set(f) == FIELD_KEYS for r in data["resumes"] for f in r["fields"])
    assert [f["field"] for f in data["resumes"][1]["fields"]] == ["step.loss"]  # stdout only
    assert data["final_state"]["method"] == "bytes"
    # Labelled by what happened: kill 1 was planned as a plain kill, but no checkpoint
    # existed when it landed, so it tested a kill before the first checkpoint.
    assert [k["planned"] for k in data["kills"]] == ["after-checkpoint", "inside-write"]
    assert [k["kind"] for k in data["kills"]] == ["before-first-checkpoint", "inside-write"]
    assert [u["kind"] for u in data["unexercised"]] == ["after-checkpoint"]
    assert all(set(u) == UNEXERCISED_KEYS for u in data["unexercised"])
    # what the resume after the kill inside a write showed of a plain resume is said too
    assert (
        "resume 2, resumed from the complete checkpoint at step 15 and recomputed 7"
        in (data["unexercised"][0]["reason"])
    )
    assert (
        "kill 1 (planned at step 3) tested a kill before the first checkpoint"
        in (data["unexercised"][0]["reason"])
    )
    assert any("older than the step being written (22)" in e for e in data["kills"][1]["evidence"])
    assert all(set(t) == TRIAL_KEYS for t in data["trials"])
    assert [(t["kind"], t["resumes"], t["passed"]) for t in data["trials"]] == [
        ("before-first-checkpoint", [1], True),
        ("inside-write", [2], True),
    ]


def test_a_trial_whose_resumes_came_after_a_divergence_reads_not_judged_not_failed() -> None:
    from crashdrill.drill.report import _trial_verdict

    group = {"passed": False, "judged": False, "codes": []}
    assert _trial_verdict(group) == "not judged (an earlier resume had diverged)"
    assert _trial_verdict({**group, "judged": True}) == "FAILED (differ)"
    assert _trial_verdict({**group, "judged": True, "codes": ["rank-state"]}) == (
        "FAILED (rank-state)"
    )


def test_every_json_field_is_documented() -> None:
    text = DOCS.read_text(encoding="utf-8")
    keys = SCHEMA_KEYS | RESUME_KEYS | KILL_KEYS | FIELD_KEYS | STOP_KEYS | TRIAL_KEYS
    keys |= DRILL_KEYS | CHECKPOINT_FILES_KEYS | UNEXERCISED_KEYS
    for key in keys | DIAGNOSIS_KEYS:
        assert f"`{key}`" in text, f"docs/verify.md does not document {key}"


def test_json_has_no_bare_infinity() -> None:
    res = _result()
    res.evidence.crashed[2].points[0] = StepPoint(16, "NaN", float("nan"), None, 21.0)
    res.analysis = analyse(res.evidence)
    text = json.dumps(report.to_json(res), allow_nan=False)
    assert '"max_abs_delta": "inf"' in text


def test_table_names_each_resume_and_the_verdict() -> None:
    text = report.table(_result())
    assert "inside a checkpoint write after step 22" in text
    assert "bit-identical" in text and text.splitlines()[-1].startswith("PASS")
    assert "--seed 7" in text
    assert "trials: a kill before the first checkpoint after the start (it starts again at " in text
    assert "not exercised: a plain kill after a complete checkpoint: kill 1" in text
    assert "--seed 7 replays this plan" in text and "depends on timing" in text


def test_the_table_says_what_compared_counts_under_the_resumes() -> None:
    lines = report.table(_result()).splitlines()
    head = next(i for i, line in enumerate(lines) if line.strip().startswith("resume "))
    legend = next(i for i, line in enumerate(lines) if line.strip() == report.COMPARED)
    assert head < legend, "the legend follows the resumes' rows"
    assert "compared" in lines[head] and "the recomputed ones" in report.COMPARED


def test_a_kill_before_the_first_checkpoint_resumed_from_step_0_says_so_on_each_line() -> None:
    res = _result()
    first = res.analysis.resumes[0]
    assert first.trial == "before-first-checkpoint" and first.kill == 1
    first.from_step = 0  # a step-0 checkpoint, written at the start
    text = report.table(res)
    said = (
        "a kill before the first checkpoint after the start (it resumes from the step-0 checkpoint)"
    )
    kill_line = next(line for line in text.splitlines() if line.strip().startswith("kill 1 "))
    assert kill_line.endswith(said), kill_line
    assert f"trials: {said}: resume(s) 1" in text


def test_the_report_lists_the_files_it_took_as_checkpoints_and_those_it_ignored(
    tmp_path: Path,
) -> None:
    (tmp_path / "model.pt").write_bytes(b"PK\x03\x04" + b"\0" * 60)
    (tmp_path / "events.out.tfevents.1700000000.host.42").write_bytes(b"\x18\0\0\0")
    (tmp_path / "log.csv").write_text("1,2.0\n")
    res = _result()
    res.target.files = files = CheckpointFiles()
    res.limits = DrillLimits(max_restarts=16, deadline_s=120.0, deadline_default=True)
    assert list(files.scan(tmp_path)) == ["model.pt"]
    data = report.to_json(res)
    assert (
        set(data["drill"]) == DRILL_KEYS and set(data["checkpoint_files"]) == CHECKPOINT_FILES_KEYS
    )
    assert [f["path"] for f in data["checkpoint_files"]["taken"]] == ["model.pt"]
    ignored = {f["path"]: f["why"] for f in data["checkpoint_files"]["ignored"]}
    assert ignored == {
        "events.out.tfevents.1700000000.host.42": "a TensorBoard event log",
        "log.csv": "a log or text file (.csv)",
    }
    text = report.table(res)
    assert "checkpoint files: took 1 (model.pt); ignored 2 (" in text
    assert "a TensorBoard event log: events.out.tfevents.1700000000.host.42" in text
    assert "drill: 0 restart(s) of at most 16; deadline 120 s (default" in text
