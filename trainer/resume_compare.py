"""The one resume comparison: recomputed values against the originals, step by step.

Both resume checks use it — the lab's (server/lessons/resume_checks.py: a resumed segment against
the earlier segments of the same run) and the drill's (drill/compare.py: a resumed
process against an uninterrupted reference). Each pairs the steps its own way; what two
paired values are worth is decided here, once:

    pairs = [(step, Reading(orig, orig_bits), Reading(new, new_bits)), ...]
    c = compare("loss", pairs)
    c.identical, c.first_divergent_step, c.max_abs_delta

Two readings are the same when their exact bits are equal (both have bits), else when
the numbers are equal (NaN equals NaN); a text is the same as an equal text, and a value
that one side recorded and the other did not is a difference. |Δ| is 0 for the same
readings, the distance otherwise, and infinite when one side is NaN or absent; a text
field has no |Δ|. The mean |Δ| is over the finite ones (infinite when none is).

Every deterministic field of the record contract is compared, each in its own
FieldComparison (`compare_records`): the fields come from record_contract.py, so a field
added there is compared without a change here.

    compare_records([(step, original_record, recomputed_record), ...])
    # (FieldComparison('step.loss', ...), FieldComparison('step.lr', ...), ...,
    #  FieldComparison('probe.probes.paris', ...), ..., FieldComparison('sample.text', ...))

JSON has no infinity: `FieldComparison.to_json()` writes a non-finite |Δ| as null with
`infinite_delta: true` (docs/run-contract.md).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crashdrill.trainer.record_contract import KINDS, bits_to_float32, float32_bits


@dataclass(frozen=True)
class Reading:
    """One recorded value of a compared field: the number, and its exact bits when the
    writer recorded them (the float32 bits of a loss, the float64 bits of a JSON float);
    or a text (a sample), compared as text; or `present=False` for a value one side
    did not record."""

    value: float
    bits: int | None = None
    text: str | None = None
    present: bool = True

    def same_as(self, other: Reading) -> bool:
        """Equal at the precision both carry: bits when both have them, else the number."""
        if not (self.present and other.present):
            return self.present == other.present
        if self.text is not None or other.text is not None:
            return self.text == other.text
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


ABSENT = Reading(math.nan, present=False)


def loss_reading(record: Mapping[str, Any]) -> Reading | None:
    """The loss of a step record, exactly: its `loss_bits`, else its `loss` rounded to
    float32; None when it has neither."""
    return _bits_reading(record, "loss_bits", "loss")


def _bits_reading(record: Mapping[str, Any], bits_field: str, field: str) -> Reading | None:
    bits = record.get(bits_field)
    if isinstance(bits, int) and not isinstance(bits, bool):
        bits &= 0xFFFFFFFF
        return Reading(bits_to_float32(bits), bits)
    value = record.get(field)
    if isinstance(value, int | float) and not isinstance(value, bool):
        bits = float32_bits(float(value))
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
    numeric: bool = True  # False for a text field: no |Δ|

    @property
    def identical(self) -> bool | None:
        """Every pair the same; None until there is a pair to compare."""
        return self.first_divergent_step is None if self.points else None

    def to_json(self) -> dict[str, Any]:
        """The comparison as JSON (the lab's API and the drill's report): |Δ| that is not
        finite (a NaN or a missing value on one side) is null with `infinite_delta`."""
        return {
            "field": self.field,
            "equal": self.identical,
            "points": self.points,
            "steps": list(self.steps) if self.steps else None,
            "first_divergent_step": self.first_divergent_step,
            "max_abs_delta": finite_or_none(self.max_abs_delta),
            "mean_abs_delta": finite_or_none(self.mean_abs_delta),
            "infinite_delta": not_finite(self.max_abs_delta),
            "numeric": self.numeric,
        }


def finite_or_none(x: float | None) -> float | None:
    """x, or None when it is None, infinite or NaN (JSON has no such numbers)."""
    return x if x is not None and math.isfinite(x) else None


def not_finite(x: float | None) -> bool:
    return x is not None and not math.isfinite(x)


def compare(field: str, pairs: Sequence[tuple[int, Reading, Reading]]) -> FieldComparison:
    """Compare (step, original, recomputed) pairs, in the order the recomputed process
    wrote them."""
    deltas = [orig.delta(new) for _, orig, new in pairs]
    offset = next((i for i, (_, orig, new) in enumerate(pairs) if not orig.same_as(new)), None)
    steps = [step for step, _, _ in pairs]
    finite = [d for d in deltas if math.isfinite(d)]
    mean = (sum(finite) / len(finite) if finite else math.inf) if deltas else None
    numeric = not any(r.text is not None for _, orig, new in pairs for r in (orig, new))
    return FieldComparison(
        field=field,
        steps=(min(steps), max(steps)) if steps else None,
        points=len(pairs),
        max_abs_delta=(max(deltas) if deltas else None) if numeric else None,
        mean_abs_delta=mean if numeric else None,
        first_divergent_step=pairs[offset][0] if offset is not None else None,
        divergent_offset=offset,
        numeric=numeric,
    )


# ---------------------------------------------------------------- every deterministic field


@dataclass(frozen=True)
class ComparedField:
    """A deterministic field of the contract that a resume must reproduce."""

    kind: str
    field: str
    type: str  # the contract's JSON type
    bits: str | None  # the field that holds its exact float32 bits (loss: loss_bits)

    @property
    def name(self) -> str:  # "step.loss"; an object's entries are "probe.probes.paris"
        return f"{self.kind}.{self.field}"


def _compared_fields() -> tuple[ComparedField, ...]:
    out = []
    for k in KINDS:
        if not k.keyed_by_step:
            continue  # a resume pairs records by step: only step-keyed kinds can be paired
        bits = {f.bits_of: f.name for f in k.fields if f.bits_of}
        for f in k.fields:
            if f.deterministic and f.name != "step" and not f.bits_of:
                out.append(ComparedField(k.name, f.name, f.type, bits.get(f.name)))
    return tuple(out)


COMPARED: tuple[ComparedField, ...] = _compared_fields()
COMPARED_KINDS: tuple[str, ...] = tuple(dict.fromkeys(c.kind for c in COMPARED))
LOSS = "step.loss"
RANK_LOSS = "step.rank_loss_bits"  # a run of several ranks: each rank's own loss bits

# A resume on another world size (data_layout = "global": the same global samples, split
# over another number of ranks; lesson 1.18) cannot be bit-identical, and why; its check
# states this bound on |Δloss| instead. Measured: ≤ 5.3e-6 over 20 recomputed steps of
# 2 → 1 ranks and ≤ 9.6e-7 of 2 → 4 (tests/integration/test_reshard.py prints its own).
RESHARD_LOSS_TOLERANCE = 1e-4
RESHARD_WHY = (
    "the same global samples were split over another number of ranks, so every sum over"
    " them (each rank's mean loss, the all-reduce that averages the gradients, the mean of"
    " the ranks' losses) adds the same float32 numbers in another grouping and order; float32"
    " addition is not associative, so the last bits differ from the first recomputed step"
    " and the difference carries into the weights"
)


def _exact(x: Any) -> Reading:
    """A recorded JSON value, exactly: an int as itself, a float by its float64 bits, any
    other value as its JSON text."""
    if isinstance(x, int) and not isinstance(x, bool):
        return Reading(float(x), x)
    if isinstance(x, float):
        return Reading(x, int(struct.unpack("<Q", struct.pack("<d", x))[0]))
    if isinstance(x, str):
        return Reading(math.nan, text=x)
    return Reading(math.nan, text=json.dumps(x, sort_keys=True))


def readings(kind: str, record: Mapping[str, Any]) -> dict[str, Reading]:
    """Every compared value of one record of `kind`, by field name (an object field gives
    one reading per entry)."""
    out: dict[str, Reading] = {}
    for c in COMPARED:
        if c.kind != kind:
            continue
        if c.bits is not None:
            reading = _bits_reading(record, c.bits, c.field)
            if reading is not None:
                out[c.name] = reading
            continue
        value = record.get(c.field)
        if isinstance(value, Mapping):
            for key in sorted(value, key=str):
                v = value[key]
                if c.name == RANK_LOSS and isinstance(v, int) and not isinstance(v, bool):
                    bits = v & 0xFFFFFFFF  # a rank's float32 loss bits: |Δ| of the losses
                    out[f"{c.name}.{key}"] = Reading(bits_to_float32(bits), bits)
                else:
                    out[f"{c.name}.{key}"] = _exact(v)
        elif value is not None:
            out[c.name] = _exact(value)
    return out


def compare_records(
    pairs: Iterable[tuple[int, Mapping[str, Any], Mapping[str, Any]]],
) -> tuple[FieldComparison, ...]:
    """Every compared field over (step, original record, recomputed record) pairs of any
    compared kinds (each record's `kind`, "step" when it has none), paired by the caller.
    One FieldComparison per contract field, in the contract's order, each over its pairs in
    step order: fields that no pair has are there with 0 points; an object field (probes)
    is compared entry by entry, in its place, by name."""
    by_field: dict[str, list[tuple[int, Reading, Reading]]] = {
        c.name: [] for c in COMPARED if c.type != "object"
    }
    for step, orig, new in sorted(pairs, key=lambda p: p[0]):
        kind = str(new.get("kind", orig.get("kind", "step")))
        a, b = readings(kind, orig), readings(kind, new)
        for name in sorted(set(a) | set(b), key=_field_order):
            by_field.setdefault(name, []).append((step, a.get(name, ABSENT), b.get(name, ABSENT)))
    return tuple(compare(name, by_field[name]) for name in sorted(by_field, key=_field_order))


_ORDER = {c.name: i for i, c in enumerate(COMPARED)}


def _field_order(name: str) -> tuple[int, str]:
    """Contract order; an entry of an object field (kind.field.key) after its field."""
    base = ".".join(name.split(".")[:2])
    return (_ORDER.get(base, len(_ORDER)), name)


def differing(fields: Iterable[FieldComparison]) -> list[str]:
    """The names of the fields that differ somewhere."""
    return [f.field for f in fields if f.identical is False]


# ---------------------------------------------------------------- rank by rank


@dataclass(frozen=True)
class RankDivergence:
    """The first rank whose own loss left the original, and where."""

    rank: int
    step: int
    ranks: int  # how many ranks' losses were compared

    def words(self) -> str:
        return f"rank {self.rank} first, at step {self.step} (of {self.ranks} ranks compared)"


def rank_of(field: str) -> int | None:
    """The rank of a per-rank loss field ("step.rank_loss_bits.1" → 1), else None."""
    prefix = RANK_LOSS + "."
    if not field.startswith(prefix):
        return None
    tail = field[len(prefix) :]
    return int(tail) if tail.isdigit() else None


def first_rank_divergence(fields: Iterable[FieldComparison]) -> RankDivergence | None:
    """Of the ranks' own losses compared, the one that differs first: the earliest step
    (the order the recomputed process wrote them), the lowest rank when several differ at
    that step. None when no rank was compared or every rank's loss is the same."""
    per_rank = [(r, f) for f in fields if (r := rank_of(f.field)) is not None and f.points]
    bad = [(f.divergent_offset, r, f) for r, f in per_rank if f.divergent_offset is not None]
    if not bad:
        return None
    _, rank, f = min(bad, key=lambda t: (t[0], t[1]))
    assert f.first_divergent_step is not None
    return RankDivergence(rank, f.first_divergent_step, len(per_rank))
