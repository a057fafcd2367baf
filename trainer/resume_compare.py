"""The one resume comparison: recomputed values against the originals, step by step.

Both resume checks use it — the lab's (server/resume_check.py: a resumed segment against
the earlier segments of the same run) and the drill's (drill/compare.py: a resumed
process against an uninterrupted reference). Each pairs the steps its own way; what two
paired values are worth is decided here, once:

    pairs = [(step, Reading(orig, orig_bits), Reading(new, new_bits)), ...]
    c = compare("loss", pairs)
    c.identical, c.first_divergent_step, c.max_abs_delta

Two readings are the same when their exact bits are equal (both have bits), else when
the numbers are equal (NaN equals NaN). |Δ| is 0 for the same readings, the distance
otherwise, and infinite when one side is NaN. The mean |Δ| is over the finite ones
(infinite when none is). A field is compared in its own FieldComparison, so comparing
more than the loss means more calls of `compare`, one per field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crashdrill.trainer.record_contract import bits_to_float32, float32_bits


@dataclass(frozen=True)
class Reading:
    """One recorded value of a compared field: the number, and its exact bits when the
    writer recorded them (the float32 bits of a loss)."""

    value: float
    bits: int | None = None

    def same_as(self, other: Reading) -> bool:
        """Equal at the precision both carry: bits when both have them, else the number."""
        if self.bits is not None and other.bits is not None:
            return self.bits == other.bits
        if math.isnan(self.value) and math.isnan(other.value):
            return True
        return self.value == other.value

    def delta(self, other: Reading) -> float:
        if self.same_as(other):
            return 0.0
        d = abs(self.value - other.value)
        return d if not math.isnan(d) else math.inf


def loss_reading(record: Mapping[str, Any]) -> Reading | None:
    """The loss of a step record, exactly: its `loss_bits`, else its `loss` rounded to
    float32; None when it has neither."""
    bits = record.get("loss_bits")
    if isinstance(bits, int) and not isinstance(bits, bool):
        bits &= 0xFFFFFFFF
        return Reading(bits_to_float32(bits), bits)
    loss = record.get("loss")
    if isinstance(loss, int | float) and not isinstance(loss, bool):
        bits = float32_bits(float(loss))
        return Reading(bits_to_float32(bits), bits)
    return None


@dataclass(frozen=True)
class FieldComparison:
    """One field over the paired steps of one resume."""

    field: str
    steps: tuple[int, int] | None  # lowest and highest compared step
    points: int  # pairs compared
    max_abs_delta: float | None  # None without points
    mean_abs_delta: float | None
    first_divergent_step: int | None  # the first pair (in the order given) that differs
    divergent_offset: int | None  # its index among the pairs: 0 is the very first

    @property
    def identical(self) -> bool | None:
        """Every pair the same; None until there is a pair to compare."""
        return self.first_divergent_step is None if self.points else None


def compare(field: str, pairs: Sequence[tuple[int, Reading, Reading]]) -> FieldComparison:
    """Compare (step, original, recomputed) pairs, in the order the recomputed process
    wrote them."""
    deltas = [orig.delta(new) for _, orig, new in pairs]
    offset = next((i for i, (_, orig, new) in enumerate(pairs) if not orig.same_as(new)), None)
    steps = [step for step, _, _ in pairs]
    finite = [d for d in deltas if math.isfinite(d)]
    mean = (sum(finite) / len(finite) if finite else math.inf) if deltas else None
    return FieldComparison(
        field=field,
        steps=(min(steps), max(steps)) if steps else None,
        points=len(pairs),
        max_abs_delta=max(deltas) if deltas else None,
        mean_abs_delta=mean,
        first_divergent_step=pairs[offset][0] if offset is not None else None,
        divergent_offset=offset,
    )
