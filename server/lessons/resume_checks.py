"""The resume check: does the recomputed segment equal the original, bit for bit?

For resume k of a run (segment k ≥ 1) take the records of segment k whose steps had
already been trained by an earlier segment, pair each with the original record of the
same kind and step (from the earliest segment that has it), and report the steps range,
the number of points, max and mean |Δloss|, and `bit_identical` when every pair is the
same in every deterministic field the run records (`fields`: the loss, grad norm, lr,
tokens, val loss and its train mean, every probe, the sample's prompt and text; one
comparison each, see trainer/resume_compare.py). `first_divergent_step` is the first
recomputed step whose loss bits differ; `differing` names every field that differs;
`missing` names what the resumed checkpoint did not hold (from the trainer's `resume`
record), so a check that is not bit-identical can say why; `started_over` marks a
segment that trained from step 0 again without a checkpoint (`from_step` null); a resume
of the step-0 checkpoint is a resume (`from_step` 0), compared like any other.

A resume on another world size (`resharded`: the `resume` record's `from_ranks` differs
from its `ranks`, data_layout = "global") cannot be bit-identical (resume_compare.py's
RESHARD_WHY): its check says so, with max |Δloss| against RESHARD_LOSS_TOLERANCE, and
compares no rank's own loss (rank r of one world size is not rank r of another).

`outcome` says in one word what all that comes to (trainer/resume_outcome.py): decided
here once and served in each check, so that the page and a lesson's prediction read it
instead of deciding it again from the fields above.

This module pairs the rows; what a pair is worth (equal bits, |Δ|, the first divergence)
is `crashdrill.trainer.resume_compare`, the comparison `crashdrill verify` uses too.
JSON has no infinity: a |Δ| that is not finite is null with `infinite_delta: true`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from crashdrill.trainer.checkpoint_layout import part_description
from crashdrill.trainer.resume_compare import (
    LOSS,
    RESHARD_LOSS_TOLERANCE,
    RESHARD_WHY,
    FieldComparison,
    RankDivergence,
    compare_records,
    differing,
    finite_or_none,
    first_rank_divergence,
    loss_reading,
    not_finite,
    rank_of,
)
from crashdrill.trainer.resume_outcome import ResumeOutcome

Record = Mapping[str, Any]


@dataclass(frozen=True)
class ResumeCheck:
    segment: int
    from_step: int | None  # the checkpoint step it resumed from (None: started over)
    expected_points: int  # steps between the checkpoint and the crash
    loss: FieldComparison  # the recomputed losses against the originals
    missing: tuple[str, ...] = ()  # words for the parts the checkpoint lacked
    started_over: bool = False
    fields: tuple[FieldComparison, ...] = ()  # every compared field, the loss included
    resharded: tuple[int, int] | None = None  # (from_ranks, ranks): on another world size

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
    def bit_identical(self) -> bool | None:
        """Every compared field the same (None until there is a loss to compare)."""
        if self.loss.identical is None:
            return None
        return self.loss.identical and not self.differing

    @property
    def differing(self) -> list[str]:
        return differing(self.fields or (self.loss,))

    @property
    def first_divergent_step(self) -> int | None:
        return self.loss.first_divergent_step

    @property
    def first_divergent_rank(self) -> RankDivergence | None:
        """In a run of several ranks, the first rank whose own loss differs (None: one
        rank, or every rank the same)."""
        return first_rank_divergence(self.fields)

    @property
    def within_tolerance(self) -> bool | None:
        """A resharded resume's max |Δloss| within RESHARD_LOSS_TOLERANCE (None: not
        resharded, or nothing compared yet)."""
        d = self.max_abs_delta
        if self.resharded is None or d is None:
            return None
        return d <= RESHARD_LOSS_TOLERANCE

    @property
    def outcome(self) -> ResumeOutcome:
        """What this resume came to so far, in the order the page has always read it: no
        checkpoint and nothing compared yet is a fresh start; nothing compared with nothing
        lost is nothing left; a started-over segment is fresh whatever it matched (a new
        model at the same seed); a match is final only once every lost step is in."""
        if self.from_step is None and not self.points:
            return ResumeOutcome.FRESH
        if not self.points:
            return ResumeOutcome.NOTHING_LEFT if not self.expected_points else ResumeOutcome.WAITING
        if self.started_over:
            return ResumeOutcome.FRESH
        if self.bit_identical:
            return ResumeOutcome.IDENTICAL if self.complete else ResumeOutcome.IDENTICAL_SO_FAR
        return ResumeOutcome.DIFFERENT

    def to_dict(self) -> dict[str, Any]:
        return {
            "segment": self.segment,
            "from_step": self.from_step,
            "steps": list(self.steps) if self.steps else None,
            "points": self.points,
            "expected_points": self.expected_points,
            "complete": self.complete,
            "max_abs_delta": finite_or_none(self.max_abs_delta),
            "mean_abs_delta": finite_or_none(self.mean_abs_delta),
            "infinite_delta": not_finite(self.max_abs_delta),
            "bit_identical": self.bit_identical,
            "first_divergent_step": self.first_divergent_step,
            "first_divergent_rank": _rank_json(self.first_divergent_rank),
            "missing": list(self.missing),
            "started_over": self.started_over,
            "differing": self.differing,
            "fields": [f.to_json() for f in self.fields],
            "outcome": self.outcome.value,
            "resharded": _reshard_json(self),
        }


def _reshard_json(c: ResumeCheck) -> dict[str, Any] | None:
    if c.resharded is None:
        return None
    return {"from_ranks": c.resharded[0], "ranks": c.resharded[1],
            "tolerance": RESHARD_LOSS_TOLERANCE, "within_tolerance": c.within_tolerance,
            "why": RESHARD_WHY}  # fmt: skip


def _rank_json(d: RankDivergence | None) -> dict[str, int] | None:
    return {"rank": d.rank, "step": d.step, "ranks": d.ranks} if d else None


def resume_checks(
    records: Iterable[tuple[int, int, Record]],
    resumes: Mapping[int, int | None] | None = None,
    missing: Mapping[int, Iterable[str]] | None = None,
    worlds: Mapping[int, tuple[int, int]] | None = None,
) -> list[ResumeCheck]:
    """Checks for every segment ≥ 1.

    `records` holds (segment, step, record) in any order, for records of the compared
    kinds (COMPARED_KINDS: step, val, probe, sample; a record without `kind` is a step
    record); `resumes` maps a segment to the `from_step` of its `resume` record (when the
    trainer wrote one); `missing` maps a segment to the checkpoint parts its resume lacked;
    `worlds` maps a segment to (from_ranks, ranks) of its resume (a run of several ranks).
    """
    resumes = dict(resumes or {})
    missing = dict(missing or {})
    by_segment: dict[int, dict[tuple[str, int], Record]] = {}
    for segment, step, row in records:
        kind = str(row.get("kind", "step"))
        if kind == "step" and loss_reading(row) is None:
            continue  # a step record without a loss says nothing a check can use
        by_segment.setdefault(segment, {}).setdefault((kind, step), row)
    segments = sorted(set(by_segment) | {s for s in resumes if s > 0})
    checks = []
    original: dict[tuple[str, int], Record] = {}  # from the earliest segment that has it
    for k in segments:
        if k > 0:
            check = _check(k, by_segment.get(k, {}), original, resumes.get(k, -1))
            world = (worlds or {}).get(k)
            if world is not None and world[0] != world[1]:  # per-rank losses do not pair
                kept = tuple(f for f in check.fields if rank_of(f.field) is None)
                check = replace(check, fields=kept, resharded=world)
            words = tuple(part_description(p) for p in missing.get(k, ()))
            checks.append(replace(check, missing=words) if words else check)
        for key, row in by_segment.get(k, {}).items():
            original.setdefault(key, row)
    return checks


def _check(
    segment: int,
    rows: dict[tuple[str, int], Record],
    original: dict[tuple[str, int], Record],
    from_step: int | None,
) -> ResumeCheck:
    steps = [s for kind, s in rows if kind == "step"]
    inferred = from_step == -1
    if inferred:  # no resume record: infer from the first recomputed step
        from_step = min(steps) - 1 if steps else None
    reached = max((s for kind, s in original if kind == "step"), default=0)
    start = (from_step or 0) + 1
    paired = sorted(key for key in rows if key in original and key[1] >= start)
    fields = compare_records((key[1], original[key], rows[key]) for key in paired)
    loss = next(f for f in fields if f.field == LOSS)
    return ResumeCheck(
        segment=segment,
        from_step=from_step,
        expected_points=max(0, reached - start + 1),
        loss=loss,
        # Trained step 1 again without resuming a checkpoint (a resume of the step-0
        # checkpoint is a resume: it is compared like any other).
        started_over=bool(steps)
        and min(steps) == 1
        and (from_step is None or (inferred and from_step == 0)),
        fields=fields,
    )


def checks_from_rows(
    record_rows: Iterable[Mapping[str, Any]], resume_rows: Iterable[Mapping[str, Any]]
) -> list[ResumeCheck]:
    """Checks from database rows: records of the compared kinds (segment, step, data) and
    resume rows (data)."""
    steps = []
    for row in record_rows:
        if row["step"] is not None:
            steps.append((int(row["segment"]), int(row["step"]), json.loads(row["data"])))
    resumes: dict[int, int | None] = {}
    missing: dict[int, list[str]] = {}
    worlds: dict[int, tuple[int, int]] = {}
    for row in resume_rows:
        data = json.loads(row["data"])
        segment = data.get("segment", row.get("segment"))
        from_step = data.get("from_step")
        if isinstance(segment, int) and segment > 0:
            if data.get("path") is None:  # it named no checkpoint: it resumed nothing
                from_step = None
            resumes[segment] = from_step if isinstance(from_step, int) else None
            parts = data.get("missing")
            if isinstance(parts, list):
                missing[segment] = [str(p) for p in parts]
            was, now = data.get("from_ranks"), data.get("ranks")
            if isinstance(was, int) and isinstance(now, int):
                worlds[segment] = (was, now)
    return resume_checks(steps, resumes, missing, worlds)
