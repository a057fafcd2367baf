from __future__ import annotations

import dataclasses

import pytest

from crashdrill.trainer.presets import PresetError, get_preset, list_presets, parse_preset

VALID = {
    "id": "t",
    "title": "T",
    "run": {"steps": 10, "warmup": 0},
    "knob": {"name": "ckpt_every", "a": 2, "b": 5},
}


def test_builtin_presets_include_quick_and_lesson_1_7():
    ids = {p.id for p in list_presets()}
    assert {"quick", "lesson-1.7"} <= ids


@pytest.mark.parametrize("name", ["quick", "lesson-1.7"])
def test_runs_a_and_b_differ_only_in_the_knob(name):
    preset = get_preset(name)
    for cuda in (False, True):
        a = preset.config_for("A", cuda=cuda).to_dict()
        b = preset.config_for("B", cuda=cuda).to_dict()
        diff = {k for k in a if a[k] != b[k]}
        assert diff == {preset.knob.name}


def test_lesson_1_7_keeps_the_tenfold_cadence_ratio():
    p = get_preset("lesson-1.7")
    assert p.knob.name == "ckpt_every" and p.knob.b == 10 * p.knob.a
    assert p.config_for("A").steps == 3000
    cuda = p.config_for("A", cuda=True)
    assert (cuda.n_layer, cuda.d_model, cuda.ctx, cuda.batch, cuda.precision) == (
        6,
        384,
        256,
        32,
        "bf16",
    )


def test_unknown_preset_lists_known_ones():
    with pytest.raises(PresetError, match=r"known presets: .*quick"):
        get_preset("nope")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "x"}, "unknown key 'colour'"),
        ({"knob": {"name": "flavour", "a": 1, "b": 2}}, "not a run setting"),
        ({"knob": {"name": "ckpt_every", "a": 3, "b": 3}}, "a and b are both 3"),
        ({"knob": {"name": "ckpt_every", "a": 0, "b": 3}}, r"\[knob\] a ckpt_every = 0"),
        ({"run": {"steps": 10, "ctx": -1}}, r"\[run\] ctx = -1"),
        ({"id": "has space"}, "without spaces"),
    ],
)
def test_invalid_presets_say_what_is_wrong(change, message):
    with pytest.raises(PresetError, match=message):
        parse_preset({**VALID, **change})


def test_valid_preset_round_trips_to_public():
    p = parse_preset(VALID)
    pub = p.to_public()
    assert pub["knob_text"] == "ckpt_every: A 2 vs B 5"
    assert "source" not in pub
    assert dataclasses.is_dataclass(p)
