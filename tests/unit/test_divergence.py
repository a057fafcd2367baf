"""A run whose loss or gradient turns non-finite (issue #24, item 2): the trainer stops at
that step with exit 4, in a stage of its own, saves nothing after it, and every record it
wrote is valid JSON (a NaN is null, its bits kept). The real trainer, on settings that
lesson-1.7-fast allows a student."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from crashdrill.trainer.divergence import nonfinite
from crashdrill.trainer.exit_codes import EXIT_DIVERGED
from crashdrill.trainer.loop import RunOptions, train
from crashdrill.trainer.presets import get_preset
from crashdrill.trainer.record_contract import finite_or_null, float32_bits
from crashdrill.trainer.records import RecordWriter

pytestmark = pytest.mark.timeout(120)

DIVERGING = {"lr": 1.0, "weight_decay": 10.0, "warmup": 0, "grad_clip": 1000.0}


def strict(line: str) -> Any:
    def refuse(token: str) -> Any:
        raise AssertionError(f"{token} in {line!r}: not JSON")

    return json.loads(line, parse_constant=refuse)


def test_nonfinite_names_the_loss_first_then_the_gradient_norm() -> None:
    assert nonfinite(2.5, 1.0) is None
    assert nonfinite(2.5) is None
    assert nonfinite(math.nan, math.inf) == "the loss is nan"
    assert nonfinite(-math.inf) == "the loss is -inf"
    assert nonfinite(2.5, math.inf) == "the gradient norm is inf"


def test_a_record_writes_nan_and_infinity_as_null_and_keeps_the_loss_bits(
    tmp_path: Path,
) -> None:
    w = RecordWriter(tmp_path, segment=0)
    w.write("step", step=3, loss=math.nan, loss_bits=float32_bits(math.nan), grad_norm=math.inf)
    w.write("probe", step=3, probes={"capital": -math.inf, "ok": 0.5})
    w.close()
    step, probe = (strict(x) for x in (tmp_path / "records.jsonl").read_text().splitlines())
    assert step["loss"] is None and step["grad_norm"] is None
    assert step["loss_bits"] == 0x7FC00000  # the NaN, exactly
    assert probe["probes"] == {"capital": None, "ok": 0.5}


def test_a_bare_nan_token_from_outside_the_contract_reads_as_null() -> None:
    read = json.loads('{"loss": NaN, "xs": [Infinity, 1.5], "n": 2}')
    assert finite_or_null(read) == {"loss": None, "xs": [None, 1.5], "n": 2}


def test_diverging_settings_stop_the_run_at_once_with_exit_4_and_nothing_saved_after(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = get_preset("lesson-1.7-fast").config_for("A").with_overrides(DIVERGING)
    code = train(cfg, tmp_path, RunOptions(label="A", preset="lesson-1.7-fast"))
    assert code == EXIT_DIVERGED
    records = [strict(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    event = next(r for r in records if r.get("code") == "diverged")
    at = event["step"]
    assert 1 < at < cfg.ckpt_every, "lesson-1.7-fast with these settings diverges at once"
    assert event["level"] == "error" and event["what"].startswith("the ")
    assert event["text"].startswith(f"Diverged at step {at}: {event['what']}.")
    assert event["checkpoint_step"] == 0
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, at + 1))  # nothing trains past it
    last = steps[-1]
    assert last["loss"] is None or last["grad_norm"] is None  # what was not finite: null
    assert all(isinstance(r["loss"], float) for r in steps[:-1])
    assert records[-1]["kind"] == "stage" and records[-1]["stage"] == "diverged"
    assert not any(r["kind"] == "stage" and r["stage"] == "failed" for r in records)
    assert [r["step"] for r in records if r["kind"] == "ckpt"] == [0]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-00000000"]
    err = capsys.readouterr().err
    assert f"crashdrill: diverged at step {at}: {event['what']}; stopped" in err
    assert "Traceback" not in err
