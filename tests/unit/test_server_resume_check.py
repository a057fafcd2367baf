"""The resume check on hand-made step rows."""

from __future__ import annotations

import json
import struct

import pytest

from crashdrill.server.resume_check import checks_from_rows, loss_bits, resume_checks


def bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def row(loss: float) -> dict[str, object]:
    return {"loss": loss, "loss_bits": bits(loss)}


def test_an_exact_resume_is_bit_identical_over_the_lost_steps() -> None:
    steps = [(0, s, row(1.0 / s)) for s in range(1, 11)]  # crashed after step 10
    steps += [(1, s, row(1.0 / s)) for s in range(7, 21)]  # resumed from 6, went on
    [check] = resume_checks(steps, {1: 6})
    assert check.segment == 1 and check.from_step == 6
    assert check.steps == (7, 10) and check.points == 4 == check.expected_points
    assert check.complete and check.bit_identical is True
    assert check.max_abs_delta == 0.0 == check.mean_abs_delta


def test_a_different_bit_shows_up_with_its_size() -> None:
    steps = [(0, s, row(2.0)) for s in range(1, 5)]
    steps += [(1, 3, row(2.0)), (1, 4, row(2.5))]
    [check] = resume_checks(steps, {1: 2})
    assert check.bit_identical is False
    assert check.max_abs_delta == pytest.approx(0.5)
    assert check.mean_abs_delta == pytest.approx(0.25)


def test_each_resume_compares_with_the_original_rows() -> None:
    steps = [(0, s, row(float(s))) for s in range(1, 13)]  # crash at 12, ckpt 10
    steps += [(1, s, row(float(s))) for s in range(11, 19)]  # crash at 18, ckpt 15
    steps += [(2, s, row(float(s) + (1 if s == 17 else 0))) for s in range(16, 21)]
    one, two = resume_checks(steps, {1: 10, 2: 15})
    assert (one.steps, one.bit_identical) == ((11, 12), True)
    assert (two.steps, two.points, two.bit_identical) == ((16, 18), 3, False)
    assert two.max_abs_delta == 1.0


def test_a_resume_that_has_not_recomputed_anything_yet_is_undecided() -> None:
    [check] = resume_checks([(0, s, row(1.0)) for s in range(1, 9)], {1: 5})
    assert check.points == 0 and check.expected_points == 3
    assert check.bit_identical is None and not check.complete and check.steps is None


def test_loss_bits_fall_back_to_the_float() -> None:
    assert loss_bits({"loss": 0.1}) == bits(0.1)
    assert loss_bits({"loss_bits": bits(0.1), "loss": 99.0}) == bits(0.1)
    assert loss_bits({}) is None


def test_checks_from_database_rows_use_the_resume_records() -> None:
    step_rows = [
        {"segment": seg, "step": s, "data": json.dumps(row(1.0))}
        for seg, rng in ((0, range(1, 9)), (1, range(1, 12)))
        for s in rng
    ]
    resume_rows = [{"segment": 1, "data": json.dumps({"from_step": 0, "segment": 1, "path": None})}]
    [check] = checks_from_rows(step_rows, resume_rows)
    assert check.from_step == 0 and check.steps == (1, 8) and check.bit_identical
