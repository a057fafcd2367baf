"""The one resume comparison (trainer/resume_compare.py), and the lab's and the drill's
checks giving the same answer on the same losses — including the cases where their two
former copies disagreed (a NaN loss on both sides, a NaN against a number)."""

from __future__ import annotations

import math

import pytest

from crashdrill.drill.compare import compare_losses
from crashdrill.drill.trace import StepPoint
from crashdrill.server.resume_check import resume_checks
from crashdrill.trainer.record_contract import bits_to_float32, float32_bits
from crashdrill.trainer.resume_compare import Reading, compare, loss_reading


def exact(x: float) -> Reading:
    return Reading(bits_to_float32(float32_bits(x)), float32_bits(x))


def test_equal_bits_are_the_same_reading_even_when_the_value_is_nan() -> None:
    nan = exact(math.nan)
    assert nan.same_as(nan) and nan.delta(nan) == 0.0
    assert exact(1.0).delta(nan) == math.inf
    assert not Reading(0.0, float32_bits(0.0)).same_as(Reading(-0.0, float32_bits(-0.0)))


def test_printed_values_without_bits_compare_as_numbers() -> None:
    assert Reading(2.5).same_as(Reading(2.5)) and not Reading(2.5).same_as(Reading(2.50001))
    assert Reading(2.5).delta(Reading(2.75)) == 0.25


def test_the_first_divergence_is_the_first_pair_in_the_order_written() -> None:
    pairs = [(s, exact(1.0), exact(1.0 if s != 5 else 1.5)) for s in (3, 4, 5, 6)]
    c = compare("loss", pairs)
    assert (c.steps, c.points, c.identical) == ((3, 6), 4, False)
    assert (c.first_divergent_step, c.divergent_offset) == (5, 2)
    assert c.max_abs_delta == 0.5 and c.mean_abs_delta == pytest.approx(0.125)


def test_no_pairs_is_undecided_and_infinite_deltas_leave_the_mean_finite() -> None:
    empty = compare("loss", [])
    assert empty.identical is None and empty.max_abs_delta is None and empty.steps is None
    c = compare("loss", [(1, exact(1.0), exact(math.nan)), (2, exact(1.0), exact(1.25))])
    assert c.max_abs_delta == math.inf and c.mean_abs_delta == 0.25


def test_a_step_record_s_loss_is_its_bits_else_its_float_rounded() -> None:
    assert loss_reading({"loss_bits": float32_bits(0.1), "loss": 99.0}) == exact(0.1)
    assert loss_reading({"loss": 0.1}) == exact(0.1)
    assert loss_reading({"loss": True}) is None and loss_reading({}) is None


@pytest.mark.parametrize(
    "recomputed",
    [
        {7: 0.5, 8: 0.25},  # identical
        {7: 0.5, 8: 0.25000003},  # one float32 ulp apart
        {7: math.nan, 8: 0.25},  # NaN against a number
    ],
)
def test_the_lab_and_the_drill_agree_on_the_same_losses(recomputed: dict[int, float]) -> None:
    original = {6: 1.0, 7: 0.5, 8: 0.25}
    original_nan = {**original, 5: math.nan}  # equal NaN bits on both sides
    recomputed = {5: math.nan, **recomputed}

    def row(x: float) -> dict[str, object]:
        return {"loss": x, "loss_bits": float32_bits(x)}

    steps = [(0, s, row(x)) for s, x in original_nan.items()]
    steps += [(1, s, row(x)) for s, x in recomputed.items()]
    [lab] = resume_checks(steps, {1: 4})

    def point(s: int, x: float) -> StepPoint:
        return StepPoint(s, repr(x), bits_to_float32(float32_bits(x)), float32_bits(x), 0.0)

    pairs = [(point(s, original_nan[s]), point(s, x)) for s, x in recomputed.items()]
    drill = compare_losses(pairs)
    assert lab.loss == drill
    assert lab.max_abs_delta is not None and not math.isnan(lab.max_abs_delta)
