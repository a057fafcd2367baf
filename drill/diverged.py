"""A run that diverged (its loss or gradient norm no longer finite), as the drill judges it.

The built-in trainer stops at such a step, prints `diverged_line` and exits EXIT_DIVERGED
(trainer/divergence.py, trainer/exit_codes.py); `Target.diverged(segment)` reads that
back as a `Divergence` (drill/builtin.py). A script target says nothing of the kind: its
exit status stays a crash.

    ref_div = target.diverged(reference)        # Divergence(9, "the loss is nan") or None
    same_divergence(div, seg.points, ref.points, ref_div)   # identical: a pass

Three cases, each with its own verdict (drill/compare.py, drill/judge.py):
- the reference (no kills) diverged, and no resume reached that step: the resume check
  cannot be judged on a run that does not train — bad input, exit 2, "fix the settings";
- a resumed process diverged at a step where the reference did not (or not with the same
  bits): the resume brought back different state — a finding, exit 1;
- both diverged at the same step with the same bits: the resume is identical (pass).
"""

from __future__ import annotations

from dataclasses import dataclass

from crashdrill.drill.trace import StepPoint

FIX = (
    "lower the learning rate, keep a warmup or gradient clipping (the trainer's message"
    " says the same: trainer/divergence.py)"
)


@dataclass(frozen=True)
class Divergence:
    """Where a process stopped because its loss or gradient norm was not finite."""

    step: int
    what: str  # "the loss is nan", "the gradient norm is inf"


def _at(points: list[StepPoint], step: int) -> StepPoint | None:
    return next((p for p in reversed(points) if p.step == step), None)


def _value(p: StepPoint) -> str:
    bits = f" (float32 bits 0x{p.bits:08x})" if p.bits is not None else ""
    return f"{p.text}{bits}"


def same_divergence(
    div: Divergence,
    points: list[StepPoint],
    ref_points: list[StepPoint],
    ref_div: Divergence | None,
) -> bool:
    """Both stopped at the same step, and the loss each printed there has the same bits
    (or, when neither printed that step, for the same reason)."""
    if ref_div is None or ref_div.step != div.step:
        return False
    mine, theirs = _at(points, div.step), _at(ref_points, div.step)
    if mine is None or theirs is None:
        return mine is None and theirs is None and div.what == ref_div.what
    return mine.same_as(theirs)


def reference_diverged_text(div: Divergence, judged: int) -> str:
    """The finding when the reference diverged. `judged`: how many resumes reached the
    step before it (and were compared as usual)."""
    said = f"the reference run (no kills) diverged at step {div.step}: {div.what}"
    if not judged:
        return (
            f"{said}, so no resume could be judged against it: fix the settings before "
            f"drilling resumes — {FIX}"
        )
    return (
        f"{said}. {judged} resume(s) reached that step and were compared with it; kills "
        f"planned after it never landed: fix the settings to drill the rest of the run — {FIX}"
    )


def resume_diverged_text(
    div: Divergence,
    points: list[StepPoint],
    ref_points: list[StepPoint],
    ref_div: Divergence | None,
) -> str:
    """The finding of a resumed process that diverged where the reference did not."""
    ref_at, mine = _at(ref_points, div.step), _at(points, div.step)
    if ref_div is not None and ref_div.step == div.step:
        there = (
            f"the reference diverged at that step too, but with another value"
            f" ({_value(ref_at) if ref_at else ref_div.what} against "
            f"{_value(mine) if mine else div.what})"
        )
    elif ref_div is not None and ref_div.step < div.step:
        there = f"the reference had diverged earlier, at step {ref_div.step} ({ref_div.what})"
    elif ref_at is not None:
        there = f"the reference trained on: its loss at step {div.step} was {_value(ref_at)}"
    else:
        there = "the reference trained past it"
    return (
        f"the restarted run diverged at step {div.step} ({div.what}) where {there}. A "
        "correct resume repeats the reference bit for bit, a divergence included: the state "
        "it resumed from (weights, optimizer moments, LR-schedule position, data position) "
        "was not the state the run had"
    )
