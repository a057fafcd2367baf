"""The resume check on hand-made step rows."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
from starlette.responses import JSONResponse

from crashdrill.server.ingest_loop import resume_checks as resume_checks_of_run
from crashdrill.server.lessons import resume_checks as lab_checks
from crashdrill.server.lessons.resume_checks import checks_from_rows, resume_checks
from crashdrill.server.storage.db import Database
from crashdrill.server.storage.store import NewRecord, Store
from crashdrill.trainer.checkpoint_layout import PART_WORDS, PARTS_FULL
from crashdrill.trainer.resume_outcome import LAB_CHECK


def bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def row(loss: float) -> dict[str, object]:
    return {"loss": loss, "loss_bits": bits(loss)}


def test_an_exact_resume_is_bit_identical_over_the_lost_steps() -> None:
    steps = [(0, s, row(1.0 / s)) for s in range(1, 11)]  # crashed after step 10
    steps += [(1, s, row(1.0 / s)) for s in range(7, 21)]  # resumed from 6, went on
    [check] = resume_checks(steps, {1: 6})
    assert check.segment == 1 and check.from_step == 6
    assert check.steps == (7, 10) and check.points == 4 == check.expected_points
    assert check.complete and check.bit_identical is True
    assert check.max_abs_delta == 0.0 == check.mean_abs_delta


def test_a_different_bit_shows_up_with_its_size() -> None:
    steps = [(0, s, row(2.0)) for s in range(1, 5)]
    steps += [(1, 3, row(2.0)), (1, 4, row(2.5))]
    [check] = resume_checks(steps, {1: 2})
    assert check.bit_identical is False
    assert check.max_abs_delta == pytest.approx(0.5)
    assert check.mean_abs_delta == pytest.approx(0.25)


def test_each_resume_compares_with_the_original_rows() -> None:
    steps = [(0, s, row(float(s))) for s in range(1, 13)]  # crash at 12, ckpt 10
    steps += [(1, s, row(float(s))) for s in range(11, 19)]  # crash at 18, ckpt 15
    steps += [(2, s, row(float(s) + (1 if s == 17 else 0))) for s in range(16, 21)]
    one, two = resume_checks(steps, {1: 10, 2: 15})
    assert (one.steps, one.bit_identical) == ((11, 12), True)
    assert (two.steps, two.points, two.bit_identical) == ((16, 18), 3, False)
    assert two.max_abs_delta == 1.0


def test_a_resume_that_has_not_recomputed_anything_yet_is_undecided() -> None:
    [check] = resume_checks([(0, s, row(1.0)) for s in range(1, 9)], {1: 5})
    assert check.points == 0 and check.expected_points == 3
    assert check.bit_identical is None and not check.complete and check.steps is None


def test_checks_from_database_rows_use_the_resume_records() -> None:
    step_rows = [
        {"segment": seg, "step": s, "data": json.dumps(row(1.0))}
        for seg, rng in ((0, range(1, 9)), (1, range(1, 12)))
        for s in rng
    ]
    fresh = {"from_step": 0, "segment": 1, "path": None}  # a fresh start: no checkpoint
    [check] = checks_from_rows(step_rows, [{"segment": 1, "data": json.dumps(fresh)}])
    assert check.from_step is None and check.started_over and check.steps == (1, 8)
    assert check.bit_identical  # same seed, same data: the fresh start retraced the steps
    resumed = {**fresh, "path": "ckpt/step-00000000"}  # the step-0 checkpoint, resumed
    [check] = checks_from_rows(step_rows, [{"segment": 1, "data": json.dumps(resumed)}])
    assert check.from_step == 0 and not check.started_over and check.steps == (1, 8)


def test_a_resume_with_equal_losses_but_a_different_val_train_loss_is_not_bit_identical() -> None:
    def val(train: float) -> dict[str, object]:
        return {"kind": "val", "val_loss": 2.0, "train_loss": train}

    records = [(0, s, row(1.0)) for s in range(1, 11)] + [(0, 10, val(1.5))]
    records += [(1, s, row(1.0)) for s in range(7, 11)] + [(1, 10, val(1.25))]
    [check] = resume_checks(records, {1: 6})
    assert check.loss.identical is True and check.bit_identical is False
    assert check.differing == ["val.train_loss"]
    out = check.to_dict()
    assert out["differing"] == ["val.train_loss"] and out["bit_identical"] is False
    fields = {f["field"]: f for f in out["fields"]}
    assert fields["val.train_loss"] == {
        "field": "val.train_loss",
        "equal": False,
        "points": 1,
        "steps": [10, 10],
        "first_divergent_step": 10,
        "max_abs_delta": 0.25,
        "mean_abs_delta": 0.25,
        "infinite_delta": False,
        "numeric": True,
    }
    assert fields["step.loss"]["equal"] is True and fields["val.val_loss"]["equal"] is True


def test_records_before_the_checkpoint_are_not_compared() -> None:
    probe = {"kind": "probe", "probes": {"paris": 0.5}}
    records = [(0, s, row(1.0)) for s in range(1, 11)] + [(0, 5, probe)]
    records += [(1, s, row(1.0)) for s in range(6, 11)]
    records += [(1, 5, {"kind": "probe", "probes": {"paris": 0.75}})]  # at the checkpoint
    [check] = resume_checks(records, {1: 5})
    assert check.bit_identical is True and "probe.probes.paris" not in check.differing


def test_a_nan_loss_on_one_side_gives_json_that_the_api_can_send() -> None:
    records = [(0, s, row(1.0)) for s in (1, 2)] + [(1, 2, row(math.nan))]
    [check] = resume_checks(records, {1: 1})
    assert check.max_abs_delta == math.inf
    body = JSONResponse({"run": "r", "checks": [check.to_dict()]}).body  # the route's encoder
    [sent] = json.loads(bytes(body))["checks"]
    assert sent["max_abs_delta"] is None and sent["infinite_delta"] is True
    assert sent["bit_identical"] is False and sent["first_divergent_step"] == 2


def test_the_check_names_missing_parts_with_the_trainer_s_words() -> None:
    records = [(0, s, row(1.0)) for s in range(1, 5)] + [(1, 3, row(2.0))]
    [check] = resume_checks(records, {1: 2}, {1: list(PARTS_FULL)})
    assert len(check.missing) == len(PARTS_FULL)
    for part, words in zip(PARTS_FULL, check.missing, strict=True):
        assert words.startswith(PART_WORDS[part])  # the trainer's event says PART_WORDS[part]
    assert check.missing[1] == "AdamW state (moments and step counts)"
    assert not hasattr(lab_checks, "PART_WORDS")  # no second list to disagree with


def test_the_api_reads_every_compared_kind_from_the_database(tmp_path: Path) -> None:
    db = Database(tmp_path / "lab.sqlite3")
    db.migrate()
    store = Store(db)
    store.create_pair("p1", "owner", "quick", {"knob": {}}, [("r1", "A", str(tmp_path / "r1"))])

    def rec(kind: str, segment: int, step: int | None, **data: object) -> NewRecord:
        line = json.dumps({"kind": kind, "segment": segment, "step": step, **data})
        return NewRecord(f"{segment}:{kind}:{step}", segment, kind, step, 1.0, line)

    store.insert_records(
        "r1",
        [rec("step", seg, s, **row(1.0)) for seg, steps in ((0, (1, 2)), (1, (2,))) for s in steps]
        + [rec("sample", 0, 2, prompt="A", text="A b"), rec("sample", 1, 2, prompt="A", text="A c")]
        + [rec("resume", 1, None, from_step=1, path="ckpt/step-00000001")],
        0,
        {},
    )
    [check] = resume_checks_of_run(store, "r1")
    assert check["bit_identical"] is False and check["differing"] == ["sample.text"]
    db.close()


def _outcome(
    steps: list[tuple[int, int, dict[str, object]]], resumes: dict[int, int | None]
) -> str:
    [check] = resume_checks(steps, resumes)
    assert check.to_dict()["outcome"] == check.outcome.value  # what the API serves
    assert check.outcome in LAB_CHECK
    return check.outcome.value


def test_every_kind_of_resume_gets_its_one_outcome_from_the_server() -> None:
    original = [(0, s, row(1.0 / s)) for s in range(1, 11)]  # crashed after step 10
    same = [(1, s, row(1.0 / s)) for s in range(7, 12)]  # resumed from 6, recomputed 7..10
    assert _outcome(original + same, {1: 6}) == "identical"
    assert _outcome(original + same[:2], {1: 6}) == "identical_so_far"
    assert _outcome(original, {1: 6}) == "waiting"
    assert _outcome(original, {1: 10}) == "nothing_left"  # the checkpoint was of step 10
    other = [(1, 7, row(1.0 / 7)), (1, 8, row(0.5))]
    assert _outcome(original + other, {1: 6}) == "different"
    again = [(1, s, row(1.0 / s)) for s in range(1, 5)]  # no checkpoint: step 1 again
    assert _outcome(original + again, {1: None}) == "fresh"
    assert _outcome(original, {1: None}) == "fresh"  # it said so before its first step


def test_a_resume_on_another_world_size_states_its_tolerance_and_compares_no_rank_s_own_loss() -> (
    None
):
    from crashdrill.trainer.resume_compare import RESHARD_LOSS_TOLERANCE, RESHARD_WHY

    def ranked(segment: int, s: int, shift: float) -> dict[str, object]:
        loss = 1.0 / s + shift
        per_rank = {str(r): bits(loss) for r in range(2 if segment == 0 else 1)}
        return {**row(loss), "rank_loss_bits": per_rank}

    step_rows = [
        {"segment": 0, "step": s, "data": json.dumps(ranked(0, s, 0.0))} for s in range(1, 11)
    ]
    step_rows += [
        {"segment": 1, "step": s, "data": json.dumps(ranked(1, s, 3e-6))} for s in range(7, 13)
    ]
    resume = {
        "segment": 1,
        "from_step": 6,
        "path": "ckpt/step-00000006",
        "from_ranks": 2,
        "ranks": 1,
    }
    [check] = checks_from_rows(step_rows, [{"segment": 1, "data": json.dumps(resume)}])
    view = check.to_dict()
    assert view["bit_identical"] is False and view["outcome"] == "different"
    assert view["resharded"] == {"from_ranks": 2, "ranks": 1, "tolerance": RESHARD_LOSS_TOLERANCE,
                                 "within_tolerance": True, "why": RESHARD_WHY}  # fmt: skip
    assert "not associative" in RESHARD_WHY
    # Rank 1 of two is no rank of one: the per-rank losses are not paired, nor named.
    assert view["first_divergent_rank"] is None
    assert not [f for f in view["fields"] if f["field"].startswith("step.rank_loss_bits")]
    far = [
        {**r, "data": json.dumps(ranked(1, int(str(r["step"])), 1e-3))}
        for r in step_rows
        if r["segment"] == 1
    ]
    [check] = checks_from_rows(step_rows[:10] + far, [{"segment": 1, "data": json.dumps(resume)}])
    assert check.to_dict()["resharded"]["within_tolerance"] is False
    same = {**resume, "from_ranks": 1}  # the same world size: no tolerance, bits compared
    [check] = checks_from_rows(step_rows, [{"segment": 1, "data": json.dumps(same)}])
    assert check.to_dict()["resharded"] is None
