"""Parsing losses out of a script's stdout, and judging how precisely they are printed."""

from __future__ import annotations

import random
import struct

import pytest

from crashdrill.drill.trace import (
    LossParser,
    StepPoint,
    TraceError,
    classify_precision,
    significant_digits,
    step_spacing,
)


def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def _points(texts: list[str]) -> list[StepPoint]:
    return [StepPoint(i + 1, t, float(t), None, 0.0) for i, t in enumerate(texts)]


def _losses(n: int = 60, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [_f32(rng.uniform(0.4, 6.0)) for _ in range(n)]


def test_json_line_keeps_the_printed_text_of_the_loss() -> None:
    p = LossParser().parse('{"step": 7, "loss": 2.3411, "lr": 0.001}', 1.5)
    assert p == StepPoint(7, "2.3411", 2.3411, None, 1.5)


def test_json_line_with_loss_bits_uses_the_bits_as_the_value() -> None:
    x = _f32(2.3411216)
    p = LossParser().parse(f'{{"step": 3, "loss": {x!r}, "loss_bits": {_bits(x)}}}', 0.0)
    assert p is not None and p.bits == _bits(x) and p.value == x


def test_lines_that_are_not_steps_are_skipped() -> None:
    parser = LossParser()
    for line in ["", "epoch 1", '{"step": 1}', '{"loss": 1.0}', "{not json", "[1, 2]"]:
        assert parser.parse(line, 0.0) is None


def test_regex_reads_iter_lines_and_pipe_lines() -> None:
    p = LossParser(r"iter (?P<step>\d+): loss (?P<loss>\S+)").parse("iter 120: loss 2.3411", 0)
    assert p is not None and (p.step, p.text) == (120, "2.3411")
    q = LossParser(r"step (?P<step>\d+) \| loss (?P<loss>\S+)").parse("step 7 | loss 0.51", 0)
    assert q is not None and (q.step, q.value) == (7, 0.51)


@pytest.mark.parametrize("regex", [r"(?P<step>\d+", r"iter (\d+): loss (\S+)", r"(?P<loss>\S+)"])
def test_a_regex_that_cannot_work_is_refused(regex: str) -> None:
    with pytest.raises(TraceError):
        LossParser(regex)


def test_equal_bits_are_equal_and_different_bits_differ() -> None:
    a = StepPoint(1, "1.0", 1.0, _bits(1.0), 0)
    b = StepPoint(1, "1.00000001", 1.0, _bits(1.0), 0)
    c = StepPoint(1, "1.0000001", _f32(1.0000001), _bits(1.0000001), 0)
    assert a.same_as(b) and not a.same_as(c) and a.delta(c) > 0


def test_nan_equals_nan_but_differs_from_a_number() -> None:
    nan = StepPoint(1, "NaN", float("nan"), None, 0)
    one = StepPoint(1, "1.0", 1.0, None, 0)
    assert nan.same_as(nan) and not nan.same_as(one) and nan.delta(one) == float("inf")


@pytest.mark.parametrize(
    ("text", "digits"),
    [("2.3411", 5), ("0.00120", 3), ("1e-05", 1), ("-3.25E+02", 3), ("100", 3), ("0.0", 1)],
)
def test_significant_digits_counts_the_digits_a_printed_loss_carries(
    text: str, digits: int
) -> None:
    assert significant_digits(text) == digits


def test_python_float_repr_is_exact() -> None:
    pr = classify_precision(_points([repr(x) for x in _losses()]))
    assert pr.kind == "exact" and pr.exact


def test_shortest_float32_text_is_exact() -> None:
    import numpy as np

    pr = classify_precision(_points([str(np.float32(x)) for x in _losses()]))
    assert pr.kind == "shortest" and pr.exact


@pytest.mark.parametrize("fmt", ["{:.4f}", "{:.6f}", "{:.5g}", "{:.3e}"])
def test_fixed_formats_are_rounded(fmt: str) -> None:
    pr = classify_precision(_points([fmt.format(x) for x in _losses()]))
    assert pr.kind == "rounded" and not pr.exact
    assert "float32 needs 9" in pr.describe()


@pytest.mark.parametrize("ndigits", [4, 6, 7])
def test_rounded_json_floats_are_rounded(ndigits: int) -> None:
    pr = classify_precision(_points([repr(round(x, ndigits)) for x in _losses()]))
    assert not pr.exact


def test_bits_on_every_point_win() -> None:
    pts = [StepPoint(i, "2.34", 2.34, _bits(2.34), 0) for i in range(3)]
    assert classify_precision(pts).kind == "bits"


def test_step_spacing_is_the_usual_gap() -> None:
    assert step_spacing(_points(["1"] * 3)) == 1
    pts = [StepPoint(s, "1", 1.0, None, 0) for s in (10, 20, 30, 40, 45)]
    assert step_spacing(pts) == 10
