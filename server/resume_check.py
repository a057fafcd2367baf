"""The resume check: does the recomputed loss segment equal the original, bit for bit?

For resume k of a run (segment k ≥ 1) take the step rows of segment k whose steps had
already been trained by an earlier segment, pair each with the original row (the
earliest segment that has the step), and report the steps range, the number of points,
max and mean |Δloss|, and `bit_identical` when every pair has the same float32 bits.
`first_divergent_step` is the first recomputed step whose bits differ; `missing` names
what the resumed checkpoint did not hold (from the trainer's `resume` record), so a check
that is not bit-identical can say why; `started_over` marks a segment that trained from
step 0 again (no checkpoint was resumed).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class ResumeCheck:
    segment: int
    from_step: int | None  # the checkpoint step it resumed from (None: started over)
    steps: tuple[int, int] | None  # [lo, hi] of the compared steps
    points: int
    expected_points: int  # steps between the checkpoint and the crash
    complete: bool  # every lost step has been recomputed
    max_abs_delta: float | None
    mean_abs_delta: float | None
    bit_identical: bool | None  # None until there is a point to compare
    first_divergent_step: int | None = None
    missing: tuple[str, ...] = ()  # words for the parts the checkpoint lacked
    started_over: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["steps"] = list(self.steps) if self.steps else None
        d["missing"] = list(self.missing)
        return d


def loss_bits(row: Mapping[str, Any]) -> int | None:
    """The float32 bits of a step record's loss (from `loss_bits`, else from `loss`)."""
    bits = row.get("loss_bits")
    if isinstance(bits, int) and not isinstance(bits, bool):
        return bits & 0xFFFFFFFF
    loss = row.get("loss")
    if isinstance(loss, int | float) and not isinstance(loss, bool):
        return int(struct.unpack("<I", struct.pack("<f", float(loss)))[0])
    return None


# The trainer's words for checkpoint parts (trainer/checkpoint.py PART_WORDS, with what
# each one holds spelled out for a resume check).
PART_WORDS = {
    "weights": "weights",
    "optimizer": "AdamW state (moments and step counts)",
    "schedule": "schedule position",
    "rng": "RNG states",
    "data": "data position",
}


def bits_to_float(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


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
    by_segment: dict[int, dict[int, int]] = {}
    for segment, step, row in steps:
        bits = loss_bits(row)
        if bits is not None:
            by_segment.setdefault(segment, {}).setdefault(step, bits)
    segments = sorted(set(by_segment) | {s for s in resumes if s > 0})
    checks = []
    original: dict[int, int] = {}  # step -> bits from the earliest segment that has it
    for k in segments:
        if k > 0:
            check = _check(k, by_segment.get(k, {}), original, resumes.get(k, -1))
            words = tuple(PART_WORDS.get(p, p) for p in missing.get(k, ()))
            checks.append(replace(check, missing=words) if words else check)
        for step, bits in by_segment.get(k, {}).items():
            original.setdefault(step, bits)
    return checks


def _check(
    segment: int, rows: dict[int, int], original: dict[int, int], from_step: int | None
) -> ResumeCheck:
    if from_step == -1:  # no resume record: infer from the first recomputed step
        from_step = min(rows) - 1 if rows else None
    reached = max(original) if original else 0
    start = (from_step or 0) + 1
    expected = max(0, reached - start + 1)
    paired = sorted(s for s in rows if s in original and s >= start)
    deltas = [abs(bits_to_float(rows[s]) - bits_to_float(original[s])) for s in paired]
    differs = [s for s in paired if rows[s] != original[s]]
    return ResumeCheck(
        segment=segment,
        from_step=from_step,
        steps=(paired[0], paired[-1]) if paired else None,
        points=len(paired),
        expected_points=expected,
        complete=len(paired) >= expected,
        max_abs_delta=max(deltas) if deltas else None,
        mean_abs_delta=sum(deltas) / len(deltas) if deltas else None,
        bit_identical=not differs if paired else None,
        first_divergent_step=differs[0] if differs else None,
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
