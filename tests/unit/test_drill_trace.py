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


# ---------------------------------------------------------------- shapes without a flag


@pytest.mark.parametrize(
    ("line", "shape", "step", "loss"),
    [
        ('{"step": 120, "loss": 2.3411}', "json", 120, "2.3411"),
        ("iter 120: loss 2.3411, time 12.34ms, mfu 1.23%", "nanogpt", 120, "2.3411"),
        ("step 120 | loss 2.3411 | lr 3e-4", "step-bar", 120, "2.3411"),
        ("step 120/300 | loss: 2.3411", "step-bar", 120, "2.3411"),
        ("120 | loss 2.3411 | dt 12ms", "number-bar", 120, "2.3411"),
        ("{'loss': 2.3411, 'epoch': 0.5, 'step': 120}", "huggingface", 120, "2.3411"),
        (" 4%|▍         | 12/300 [00:01<00:20, 10.5it/s, loss=2.31]", "progress", 12, "2.31"),
        ("epoch 1 step=12 lr=0.001 loss=2.3100", "progress", 12, "2.3100"),
        ("iter 7: loss nan, time 1.0ms", "nanogpt", 7, "nan"),
        ("{'loss': nan, 'grad_norm': inf, 'epoch': 0.5, 'step': 9}", "huggingface", 9, "nan"),
    ],
)  # fmt: skip
def test_each_common_loss_line_shape_is_read_without_a_regex(
    line: str, shape: str, step: int, loss: str
) -> None:
    parser = LossParser()
    p = parser.parse(line, 0.0)
    assert p is not None and (p.step, p.text) == (step, loss)
    assert parser.matched == shape and shape in parser.describe()


def test_the_shape_is_decided_by_the_first_line_and_kept_for_every_process() -> None:
    parser = LossParser()
    assert parser.parse("step 0: train loss 4.2874, val loss 4.2823", 0) is None  # nanoGPT eval
    assert parser.matched is None
    assert parser.parse("iter 1: loss 4.25", 0) is not None and parser.matched == "nanogpt"
    # Another shape later, or in the crashed run's processes, is not a step of this trace.
    crashed = parser.for_process()
    assert crashed.parse("step 5 | loss 1.0", 0) is None
    assert crashed.parse('{"step": 5, "loss": 1.0}', 0) is None
    q = crashed.parse("iter 5: loss 3.5", 0)
    assert q is not None and q.step == 5


def test_a_given_shape_or_regex_is_never_replaced_by_what_the_lines_look_like() -> None:
    assert LossParser(shape="json").parse("iter 1: loss 4.25", 0) is None
    rx = LossParser(r"it=(?P<step>\d+) L=(?P<loss>\S+)")
    assert rx.parse("iter 1: loss 4.25", 0) is None and rx.matched == "regex"
    with pytest.raises(TraceError, match="nanogpt"):
        LossParser(shape="nanoGPT")


def test_hugging_face_lines_without_a_step_are_counted_and_a_restart_placed_by_its_epoch() -> None:
    parser = LossParser()
    ref = parser.for_process()
    lines = [f"{{'loss': {2.0 - i / 100}, 'epoch': {i / 10}}}" for i in range(1, 9)]
    steps = [p.step for p in (ref.parse(x, 0) for x in lines) if p is not None]
    assert steps == list(range(1, 9)) and parser.matched == "huggingface-counted"
    assert "counted" in parser.describe()
    restart = parser.for_process()  # resumed at step 5: prints epochs 0.6, 0.7, …
    got = [p.step for p in (restart.parse(x, 0) for x in lines[5:]) if p is not None]
    assert got == [6, 7, 8]
    # the final summary and the eval dicts carry no 'loss': not steps
    assert ref.parse("{'train_runtime': 3.2, 'train_loss': 1.9, 'epoch': 0.8}", 0) is None
    assert ref.parse("{'eval_loss': 1.9, 'epoch': 0.8}", 0) is None


def test_a_counted_epoch_printed_at_two_steps_places_nothing() -> None:
    parser = LossParser()
    ref = parser.for_process()
    for _ in range(3):
        ref.parse("{'loss': 1.0, 'epoch': 0.01}", 0)
    p = parser.for_process().parse("{'loss': 1.0, 'epoch': 0.01}", 0)
    assert p is not None and p.step == 1  # no place known: counted from the start


def test_lines_that_match_no_shape_leave_the_shape_undecided_and_say_what_was_tried() -> None:
    parser = LossParser()
    for line in ["Epoch 1/3", "loss went down", "training done", "12%"]:
        assert parser.parse(line, 0) is None
    assert parser.matched is None
    text = parser.describe()
    assert "none of the loss-line shapes matched" in text and "iter 120: loss 2.3411" in text
