"""The one resume comparison (trainer/resume_compare.py), and the lab's and the drill's
checks giving the same answer on the same losses — including the cases where their two
former copies disagreed (a NaN loss on both sides, a NaN against a number)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from crashdrill.drill.trace import StepPoint
from crashdrill.drill.verdicts import compare_losses
from crashdrill.server.lessons.resume_checks import resume_checks
from crashdrill.trainer.record_contract import KINDS, bits_to_float32, float32_bits
from crashdrill.trainer.resume_compare import (
    COMPARED,
    FieldComparison,
    Reading,
    compare,
    compare_records,
    differing,
    first_rank_divergence,
    loss_reading,
    rank_of,
)


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


# ---------------------------------------------------------------- every deterministic field


def test_every_deterministic_field_of_the_contract_is_compared_and_nothing_else() -> None:
    want = {
        f"{k.name}.{f.name}"
        for k in KINDS
        for f in k.fields
        if f.deterministic and f.name != "step" and not f.bits_of
    }
    assert {c.name for c in COMPARED} == want
    assert {"step.loss", "step.grad_norm", "val.train_loss", "sample.text"} <= want
    timing = {"step.dt", "step.tokens_per_s", "step.mfu", "step.startup_s"}
    assert not {c.name for c in COMPARED} & timing


def step_record(loss: float, **more: object) -> dict[str, object]:
    exact_loss = {"loss": loss, "loss_bits": float32_bits(loss)}
    return {
        "kind": "step",
        **exact_loss,
        "lr": 1e-3,
        "grad_norm": 0.5,
        "tokens": 64,
        "dt": 0.1,
        **more,
    }


def by_name(fields: tuple[FieldComparison, ...]) -> dict[str, FieldComparison]:
    return {f.field: f for f in fields}


def test_a_field_that_differs_is_named_with_its_first_step_and_size() -> None:
    val = {"kind": "val", "val_loss": 2.0, "train_loss": 2.5}
    pairs = [
        # timing differs (a restart's first record says how long its start took): not compared
        (10, step_record(1.0, startup_s=2.4), step_record(1.0, dt=9.9, startup_s=0.4)),
        (10, val, {**val, "train_loss": 2.25}),
        (11, step_record(1.0), step_record(1.0, grad_norm=0.5 + 2**-40)),
    ]
    fields = by_name(compare_records(pairs))
    assert fields["step.loss"].identical and fields["val.val_loss"].identical
    assert fields["val.train_loss"].first_divergent_step == 10
    assert fields["val.train_loss"].max_abs_delta == 0.25
    assert fields["step.grad_norm"].first_divergent_step == 11  # below float32 precision
    assert differing(fields.values()) == ["step.grad_norm", "val.train_loss"]
    assert not any(name.startswith("probe.") for name in fields)  # no probe record paired
    assert fields["sample.text"].identical is None and fields["sample.text"].points == 0


def test_each_probe_and_the_sample_text_are_compared_on_their_own() -> None:
    probe: dict[str, Any] = {"kind": "probe", "probes": {"paris": 0.75, "water": 0.5}}
    sample: dict[str, Any] = {"kind": "sample", "prompt": "Water is", "text": "Water is wet"}
    pairs: list[tuple[int, dict[str, Any], dict[str, Any]]] = [
        (20, probe, {**probe, "probes": {"paris": 0.75, "water": 0.625}}),
        (20, sample, {**sample, "text": "Water is dry"}),
    ]
    fields = by_name(compare_records(pairs))
    assert fields["probe.probes.paris"].identical is True
    water = fields["probe.probes.water"]
    assert (water.first_divergent_step, water.max_abs_delta) == (20, 0.125)
    text = fields["sample.text"]
    assert text.identical is False and not text.numeric and text.max_abs_delta is None
    assert fields["sample.prompt"].identical is True


def test_a_value_that_one_side_did_not_record_is_a_difference() -> None:
    probe = {"kind": "probe", "probes": {"paris": 0.75, "water": 0.5}}
    fields = by_name(compare_records([(5, probe, {"kind": "probe", "probes": {"paris": 0.75}})]))
    water = fields["probe.probes.water"]
    assert water.identical is False and water.max_abs_delta == math.inf


def test_json_of_a_comparison_against_a_nan_is_finite_with_a_flag() -> None:
    c = compare("step.loss", [(1, exact(1.0), exact(math.nan))])
    out = c.to_json()
    json.dumps(out, allow_nan=False)  # what Starlette's JSONResponse does
    assert out["max_abs_delta"] is None and out["infinite_delta"] is True
    assert out["equal"] is False and out["first_divergent_step"] == 1
    same = compare("step.loss", [(1, exact(1.0), exact(1.0))]).to_json()
    assert same["max_abs_delta"] == 0.0 and same["infinite_delta"] is False


def _ranked(step: int, losses: list[float]) -> dict[str, Any]:
    mean = sum(losses) / len(losses)
    return {
        "kind": "step",
        "step": step,
        "loss": mean,
        "loss_bits": float32_bits(mean),
        "rank_loss_bits": {str(r): float32_bits(v) for r, v in enumerate(losses)},
    }


def test_each_rank_s_loss_is_compared_in_loss_units_and_the_first_rank_apart_is_named() -> None:
    original = [_ranked(s, [2.0 + s, 3.0 + s]) for s in (11, 12, 13)]
    # Rank 1 drew another batch at step 11; from step 12 the averaged update moved rank 0.
    recomputed = [_ranked(11, [13.0, 13.5]), _ranked(12, [14.25, 15.0]), _ranked(13, [15.5, 16])]
    fields = compare_records((o["step"], o, r) for o, r in zip(original, recomputed, strict=True))
    by = {f.field: f for f in fields}
    rank0, rank1 = by["step.rank_loss_bits.0"], by["step.rank_loss_bits.1"]
    assert (rank0.first_divergent_step, rank1.first_divergent_step) == (12, 11)
    assert rank1.max_abs_delta == pytest.approx(0.5)  # 14.0 → 13.5: a loss, not bit counts
    first = first_rank_divergence(fields)
    assert first is not None and (first.rank, first.step, first.ranks) == (1, 11, 2)
    assert first.words() == "rank 1 first, at step 11 (of 2 ranks compared)"
    same = compare_records((o["step"], o, o) for o in original)
    assert first_rank_divergence(same) is None
    assert first_rank_divergence(compare_records([(1, {"loss": 1.0}, {"loss": 2.0})])) is None


def test_ranks_that_leave_at_the_same_step_name_the_lowest_and_a_field_knows_its_rank() -> None:
    o, r = _ranked(5, [1.0, 2.0, 3.0]), _ranked(5, [1.0, 2.5, 3.5])
    first = first_rank_divergence(compare_records([(5, o, r)]))
    assert first is not None and (first.rank, first.ranks) == (1, 3)
    assert [
        rank_of(n) for n in ("step.rank_loss_bits.2", "step.loss", "step.rank_loss_bits.x")
    ] == [
        2,
        None,
        None,
    ]


def test_the_lab_s_check_serves_the_first_rank_apart() -> None:
    rows = [(0, s, _ranked(s, [2.0 + s, 3.0 + s])) for s in (1, 2, 3)]
    rows += [(1, 2, _ranked(2, [4.0, 4.0])), (1, 3, _ranked(3, [5.5, 4.0]))]
    (check,) = resume_checks(rows, {1: 1})
    out = check.to_dict()
    assert out["first_divergent_rank"] == {"rank": 1, "step": 2, "ranks": 2}
    assert out["bit_identical"] is False and out["first_divergent_step"] == 2
