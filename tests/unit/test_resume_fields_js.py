"""The page's line for the resume check's fields (web/static/resume_fields.js), run in
node on checks shaped as GET /api/runs/{run}/resume-checks sends them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from crashdrill.server.lessons.resume_checks import resume_checks
from crashdrill.trainer.record_contract import float32_bits

MODULE = Path(__file__).resolve().parents[2] / "web" / "static" / "resume_fields.js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the page's module")


def page_lines(check: dict[str, object]) -> tuple[str | None, str | None]:
    """(fieldsLine, otherFieldsVerdict) of one check, as the page computes them."""
    code = (
        f"import({json.dumps(MODULE.as_uri())}).then((m) => {{"
        f" const c = {json.dumps(check)};"
        " console.log(JSON.stringify([m.fieldsLine(c), m.otherFieldsVerdict(c)])); })"
    )
    assert NODE is not None
    out = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    first, second = json.loads(out.stdout)
    return first, second


def check_of(resumed_train_loss: float, resumed_paris: float) -> dict[str, object]:
    def step(seg: int, s: int) -> tuple[int, int, dict[str, object]]:
        return (seg, s, {"kind": "step", "loss": 1.0, "loss_bits": float32_bits(1.0), "lr": 0.1})

    def at_10(seg: int, train: float, paris: float) -> list[tuple[int, int, dict[str, object]]]:
        return [
            (seg, 10, {"kind": "val", "val_loss": 2.0, "train_loss": train}),
            (seg, 10, {"kind": "probe", "probes": {"paris": paris, "water": 0.5}}),
        ]

    records = [step(0, s) for s in range(1, 12)] + at_10(0, 1.5, 0.75)
    records += [step(1, s) for s in range(9, 12)] + at_10(1, resumed_train_loss, resumed_paris)
    [check] = resume_checks(records, {1: 8})
    return check.to_dict()


def test_a_resume_equal_in_every_field_reads_loss_and_n_other_metrics() -> None:
    line, verdict = page_lines(check_of(1.5, 0.75))
    assert line == "loss and 5 other metrics: bit-identical"  # lr, val ×2, probes ×2
    assert verdict is None


def test_differing_fields_are_named_with_their_first_step_and_the_verdict_says_why() -> None:
    check = check_of(1.25, float("nan"))
    json.dumps(check, allow_nan=False)  # as the API sends it: no bare NaN or infinity
    line, verdict = page_lines(check)
    assert line == (
        "loss and 5 other metrics: 2 differ — train loss of the eval (from step 10, "
        "|Δ| up to 2.5e-1), probe paris (from step 10, |Δ| up to ∞)"
    )
    assert verdict is not None and verdict.startswith(
        "Not bit-identical: the recomputed losses match, but train loss of the eval, probe paris"
    )
