"""The resume check: does the recomputed loss segment equal the original, bit for bit?

For resume k of a run (segment k ≥ 1) take the step rows of segment k whose steps had
already been trained by an earlier segment, pair each with the original row (the
earliest segment that has the step), and report the steps range, the number of points,
max and mean |Δloss|, and `bit_identical` when every pair has the same float32 bits.
`first_divergent_step` is the first recomputed step whose bits differ; `missing` names
what the resumed checkpoint did not hold (from the trainer's `resume` record), so a check
that is not bit-identical can say why; `started_over` marks a segment that trained from
step 0 again (no checkpoint was resumed).

This module pairs the rows; what a pair is worth (equal bits, |Δ|, the first divergence)
is `crashdrill.trainer.resume_compare`, the comparison `crashdrill verify` uses too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from crashdrill.trainer.resume_compare import FieldComparison, Reading, compare, loss_reading


@dataclass(frozen=True)
class ResumeCheck:
    segment: int
    from_step: int | None  # the checkpoint step it resumed from (None: started over)
    expected_points: int  # steps between the checkpoint and the crash
    loss: FieldComparison  # the recomputed losses against the originals
    missing: tuple[str, ...] = ()  # words for the parts the checkpoint lacked
    started_over: bool = False

    @property
    def steps(self) -> tuple[int, int] | None:  # [lo, hi] of the compared steps
        return self.loss.steps

    @property
    def points(self) -> int:
        return self.loss.points

    @property
    def complete(self) -> bool:  # every lost step has been recomputed
        return self.points >= self.expected_points

    @property
    def max_abs_delta(self) -> float | None:
        return self.loss.max_abs_delta

    @property
    def mean_abs_delta(self) -> float | None:
        return self.loss.mean_abs_delta

    @property
    def bit_identical(self) -> bool | None:  # None until there is a point to compare
        return self.loss.identical

    @property
    def first_divergent_step(self) -> int | None:
        return self.loss.first_divergent_step

    def to_dict(self) -> dict[str, Any]:
        return {
            "segment": self.segment,
            "from_step": self.from_step,
            "steps": list(self.steps) if self.steps else None,
            "points": self.points,
            "expected_points": self.expected_points,
            "complete": self.complete,
            "max_abs_delta": self.max_abs_delta,
            "mean_abs_delta": self.mean_abs_delta,
            "bit_identical": self.bit_identical,
            "first_divergent_step": self.first_divergent_step,
            "missing": list(self.missing),
            "started_over": self.started_over,
        }


def loss_bits(row: Mapping[str, Any]) -> int | None:
    """The float32 bits of a step record's loss (from `loss_bits`, else from `loss`)."""
    reading = loss_reading(row)
    return reading.bits if reading is not None else None


# The trainer's words for checkpoint parts (trainer/checkpoint.py PART_WORDS, with what
# each one holds spelled out for a resume check).
PART_WORDS = {
    "weights": "weights",
    "optimizer": "AdamW state (moments and step counts)",
    "schedule": "schedule position",
    "rng": "RNG states",
    "data": "data position",
}


def resume_checks(
    steps: Iterable[tuple[int, int, Mapping[str, Any]]],
    resumes: Mapping[int, int | None] | None = None,
    missing: Mapping[int, Iterable[str]] | None = None,
) -> list[ResumeCheck]:
    """Checks for every segment ≥ 1.

    `steps` holds (segment, step, step record) in any order; `resumes` maps a segment to
    the `from_step` of its `resume` record (when the trainer wrote one); `missing` maps a
    segment to the checkpoint parts its resume lacked.
    """
    resumes = dict(resumes or {})
    missing = dict(missing or {})
    by_segment: dict[int, dict[int, Reading]] = {}
    for segment, step, row in steps:
        reading = loss_reading(row)
        if reading is not None:
            by_segment.setdefault(segment, {}).setdefault(step, reading)
    segments = sorted(set(by_segment) | {s for s in resumes if s > 0})
    checks = []
    original: dict[int, Reading] = {}  # step -> loss from the earliest segment that has it
    for k in segments:
        if k > 0:
            check = _check(k, by_segment.get(k, {}), original, resumes.get(k, -1))
            words = tuple(PART_WORDS.get(p, p) for p in missing.get(k, ()))
            checks.append(replace(check, missing=words) if words else check)
        for step, reading in by_segment.get(k, {}).items():
            original.setdefault(step, reading)
    return checks


def _check(
    segment: int, rows: dict[int, Reading], original: dict[int, Reading], from_step: int | None
) -> ResumeCheck:
    if from_step == -1:  # no resume record: infer from the first recomputed step
        from_step = min(rows) - 1 if rows else None
    reached = max(original) if original else 0
    start = (from_step or 0) + 1
    paired = sorted(s for s in rows if s in original and s >= start)
    return ResumeCheck(
        segment=segment,
        from_step=from_step,
        expected_points=max(0, reached - start + 1),
        loss=compare("loss", [(s, original[s], rows[s]) for s in paired]),
        started_over=from_step in (0, None) and bool(rows) and min(rows) == 1,
    )


def checks_from_rows(
    step_rows: Iterable[Mapping[str, Any]], resume_rows: Iterable[Mapping[str, Any]]
) -> list[ResumeCheck]:
    """Checks from database rows: step rows (segment, step, data) and resume rows (data)."""
    steps = []
    for row in step_rows:
        if row["step"] is not None:
            steps.append((int(row["segment"]), int(row["step"]), json.loads(row["data"])))
    resumes: dict[int, int | None] = {}
    missing: dict[int, list[str]] = {}
    for row in resume_rows:
        data = json.loads(row["data"])
        segment = data.get("segment", row.get("segment"))
        from_step = data.get("from_step")
        if isinstance(segment, int) and segment > 0:
            if data.get("path") is None and not isinstance(from_step, int):
                from_step = None
            resumes[segment] = from_step if isinstance(from_step, int) else None
            parts = data.get("missing")
            if isinstance(parts, list):
                missing[segment] = [str(p) for p in parts]
    return resume_checks(steps, resumes, missing)
