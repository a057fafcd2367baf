"""The drill compares every recorded field of the built-in trainer's runs, not only the
printed loss (drill/record_fields.py), on hand-made records and evidence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crashdrill.drill import report
from crashdrill.drill.compare import analyse
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.record_fields import RunRecords, fields_summary
from crashdrill.drill.verdicts import Evidence
from crashdrill.drill.verify import DrillResult
from crashdrill.trainer.record_contract import float32_bits
from crashdrill.trainer.run_files import RECORDS_FILE
from tests.unit.test_drill_compare import CKPT, REF, FakeTarget, _ref, _seg


def records(segment: int, steps: range, train_loss: float = 2.5) -> list[dict[str, Any]]:
    """What the trainer writes: a step record each step, a val and a probe every 10."""
    out: list[dict[str, Any]] = []
    for s in steps:
        at = {"segment": segment, "step": s}
        loss = {"loss": REF[s - 1], "loss_bits": float32_bits(REF[s - 1])}
        more = {"lr": 1e-3, "grad_norm": 0.5, "tokens": 64 * s, "dt": 0.01 * (segment + 1)}
        if s == steps.start:  # a process's first step record says how long its start took
            more["startup_s"] = 2.4 if segment == 0 else 0.4
        out.append({"kind": "step", **at, **loss, **more})  # dt differs: timing, not compared
        if s % 10 == 0:
            out.append({"kind": "val", **at, "val_loss": 2.0, "train_loss": train_loss})
            out.append({"kind": "probe", **at, "probes": {"paris": 0.5, "water": 0.75}})
    return out


def write(run_dir: Path, recs: list[dict[str, Any]]) -> Path:
    run_dir.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in recs)
    (run_dir / RECORDS_FILE).write_text(text + '{"kind": "step", "step": 4')  # a killed tail
    return run_dir


def drill(tmp_path: Path, resumed_train_loss: float) -> DrillResult:
    ref = write(tmp_path / "reference", records(0, range(1, 41)))
    crashed = records(0, range(1, 24)) + records(1, range(16, 41), resumed_train_loss)
    crash = write(tmp_path / "crashed", crashed)
    segs = [_seg(0, range(1, 24), killed=True, before=CKPT), _seg(1, range(16, 41))]
    plan = [KillPoint(23)]
    ev = Evidence(FakeTarget(), _ref(), CKPT, segs, plan, records=RunRecords.read(ref, crash))
    return DrillResult(FakeTarget(), "preset", 3, 1, plan, ev, analyse(ev), 0.0, 1.0)


def test_a_resume_that_reproduces_every_record_passes_with_every_field_compared(
    tmp_path: Path,
) -> None:
    result = drill(tmp_path, resumed_train_loss=2.5)
    an = result.analysis
    [r] = an.resumes
    assert an.verdict == "pass" and r.bit_identical and r.verdict == "bit-identical"
    names = [f.field for f in r.fields if f.points]
    assert names == [
        "step.loss", "step.lr", "step.grad_norm", "step.tokens", "val.val_loss",
        "val.train_loss", "probe.probes.paris", "probe.probes.water",
    ]  # fmt: skip
    assert {f.field: f.points for f in r.fields}["val.val_loss"] == 3  # steps 20, 30, 40
    assert fields_summary(r.fields) == "loss and 7 other metrics: bit-identical"
    assert "resume 1 records: loss and 7 other metrics: bit-identical" in report.table(result)


def test_equal_losses_with_a_different_val_train_loss_fail_and_name_the_field(
    tmp_path: Path,
) -> None:
    result = drill(tmp_path, resumed_train_loss=2.25)
    an = result.analysis
    [r] = an.resumes
    assert r.loss.identical  # the printed losses alone would have passed
    assert an.verdict == "fail" and an.exit_code == 1 and not r.bit_identical
    assert r.verdict == "val.train_loss differs at step 20"
    [finding] = an.findings
    assert finding.code == "fields-differ" and "val.train_loss" in finding.text
    data = report.to_json(result)
    assert data["resumes"][0]["differing"] == ["val.train_loss"]
    train = next(f for f in data["resumes"][0]["fields"] if f["field"] == "val.train_loss")
    assert (train["equal"], train["first_divergent_step"], train["max_abs_delta"]) == (
        False,
        20,
        0.25,
    )
    assert "1 of 8 metrics differ: val.train_loss (from step 20)" in report.table(result)
