"""The drill's verdict on a built-in trainer that diverged (exit 4), on hand-made evidence:
the reference diverged (nothing to judge: exit 2), a resume diverged where the reference
did not (a finding: exit 1), both diverged at the same step with the same bits (pass)."""

from __future__ import annotations

import math

from crashdrill.drill.builtin import PresetTarget
from crashdrill.drill.compare import analyse
from crashdrill.drill.diverged import Divergence
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.target import Segment
from crashdrill.drill.trace import LossParser, StepPoint
from crashdrill.drill.verdicts import Analysis, Evidence
from crashdrill.trainer.checkpoint_layout import MANIFEST, step_dir_name
from crashdrill.trainer.divergence import diverged_line, parse_diverged_line
from crashdrill.trainer.exit_codes import EXIT_DIVERGED, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from crashdrill.trainer.record_contract import float32_bits

NAN_BITS = float32_bits(math.nan)
OTHER_NAN_BITS = NAN_BITS | 1  # a NaN too, with other bits


def _loss(step: int) -> float:
    return 3.0 - 0.01 * step


def _seg(
    index: int,
    steps: range,
    *,
    killed: bool = False,
    ckpt: int = 0,
    diverged: int | None = None,
    nan_bits: int = NAN_BITS,
) -> Segment:
    """A process that printed `steps` (exact float32 bits) and then, with `diverged`, a
    NaN loss at that step, the trainer's line, and exit 4. A killed one had a complete
    checkpoint of step `ckpt` when the kill landed."""
    seg = Segment(index, ["crashdrill", "run"], None, started=10.0 * index)
    for j, s in enumerate(steps):
        bits = float32_bits(_loss(s))
        t = seg.started + 1 + 0.01 * j
        seg.points.append(StepPoint(s, repr(_loss(s)), _loss(s), bits, t))
    seg.exit_code = -9 if killed else 0
    seg.killed = killed
    if killed:
        seg.kill_time = seg.points[-1].t + 0.001
        seg.snapshot_before_kill = {f"{step_dir_name(ckpt)}/{MANIFEST}": (1, 100, ckpt)}
    if diverged is not None:
        seg.points.append(StepPoint(diverged, "nan", math.nan, nan_bits, seg.started + 2))
        seg.stderr_tail = [diverged_line(diverged, "the loss is nan")]
        seg.exit_code = EXIT_DIVERGED
    seg.ended = seg.started + 3
    return seg


def _analyse(ref: Segment, crashed: list[Segment]) -> Analysis:
    target = PresetTarget("quick")
    plan = [KillPoint(s.last_step or 0) for s in crashed if s.killed]
    return analyse(Evidence(target, ref, {}, crashed, plan))


def test_the_trainer_s_diverged_line_reads_back_as_where_and_why() -> None:
    line = diverged_line(9, "the gradient norm is inf")
    assert parse_diverged_line(line) == (9, "the gradient norm is inf")
    assert parse_diverged_line("crashdrill: resumed at step 8 from /x") is None
    seg = _seg(0, range(1, 9), diverged=9)
    assert PresetTarget("quick").diverged(seg) == Divergence(9, "the loss is nan")
    seg.exit_code = 1  # the same line with another exit status is no divergence
    assert PresetTarget("quick").diverged(seg) is None


def test_a_diverged_step_s_null_loss_is_read_by_its_bits() -> None:
    line = f'{{"step": 9, "loss": null, "loss_bits": {NAN_BITS}, "segment": 0}}'
    p = LossParser().parse(line, 1.0)
    assert p is not None and p.step == 9 and p.bits == NAN_BITS and math.isnan(p.value)
    assert LossParser().parse('{"step": 9, "loss": null}', 1.0) is None  # no bits: no point


def test_a_reference_that_diverged_before_any_resume_cannot_be_judged_and_exits_2() -> None:
    ref = _seg(0, range(1, 9), diverged=9)
    an = _analyse(ref, [_seg(0, range(1, 9), diverged=9)])  # the kills were planned later
    assert an.exit_code == EXIT_USAGE and an.verdict == "fail" and not an.resumes
    (f,) = an.findings
    assert f.code == "reference-diverged" and f.fails
    assert "the reference run (no kills) diverged at step 9: the loss is nan" in f.text
    assert "fix the settings before drilling resumes" in f.text


def test_a_resume_that_diverges_where_the_reference_trained_on_is_a_finding() -> None:
    ref = _seg(0, range(1, 41))
    crashed = [_seg(0, range(1, 21), killed=True, ckpt=15), _seg(1, range(16, 25), diverged=25)]
    an = _analyse(ref, crashed)
    assert an.exit_code == EXIT_FAILED
    assert [f.code for f in an.findings] == ["resume-diverged"]
    text = an.findings[0].text
    assert "resume 1: the restarted run diverged at step 25 (the loss is nan)" in text
    assert f"its loss at step 25 was {_loss(25)!r}" in text  # the reference's value there
    (r,) = an.resumes
    assert r.verdict == "diverged at step 25" and not r.bit_identical
    assert (r.from_step, r.recomputed) == (15, (16, 20))
    assert r.outcome == f"diverged (exit {EXIT_DIVERGED})"


def test_a_resume_that_diverges_at_the_reference_s_step_with_the_same_bits_passes() -> None:
    ref = _seg(0, range(1, 9), diverged=9)
    crashed = [_seg(0, range(1, 4), killed=True), _seg(1, range(1, 9), diverged=9)]
    an = _analyse(ref, crashed)
    assert an.exit_code == EXIT_OK and an.verdict == "pass"
    (r,) = an.resumes
    assert r.bit_identical and r.verdict == "bit-identical" and r.points == 9
    (note,) = an.findings  # the reference diverged: said, but it fails nothing
    assert note.code == "reference-diverged" and not note.fails
    assert "1 resume(s) reached that step" in note.text


def test_a_resume_that_diverges_at_the_same_step_with_other_bits_is_a_finding() -> None:
    ref = _seg(0, range(1, 9), diverged=9)
    crashed = [
        _seg(0, range(1, 4), killed=True),
        _seg(1, range(1, 9), diverged=9, nan_bits=OTHER_NAN_BITS),
    ]
    an = _analyse(ref, crashed)
    assert an.exit_code == EXIT_FAILED
    assert [f.code for f in an.findings if f.fails] == ["resume-diverged"]
    assert "diverged at that step too, but with another value" in an.findings[0].text
