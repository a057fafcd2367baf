"""The lab's lesson policy (server/lesson_policy.py): who sees a lesson, what a student may
change in it, within which bounds, and the during_save pause."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashdrill.server.catalog import Lesson
from crashdrill.server.lesson_policy import (
    ALWAYS_LOCKED,
    STUDENT_ADJUSTABLE,
    STUDENT_BOUNDS,
    apply_student_overrides,
    during_save_pause,
    locked_names,
    public_view,
    student_overrides_allowed,
    visible_to,
)
from crashdrill.trainer.presets import KNOB, SETTINGS, PresetError, list_presets, parse_preset

VALID = {
    "id": "t",
    "title": "T",
    "run": {"steps": 10, "warmup": 0},
    "knob": {"name": "ckpt_every", "a": 2, "b": 5},
}


def test_an_unpublished_lesson_is_visible_to_an_instructor_only():
    hidden = parse_preset({**VALID, "published": False})
    assert not visible_to(hidden, instructor=False) and visible_to(hidden, instructor=True)
    shown = parse_preset(VALID)
    assert visible_to(shown, instructor=False) and visible_to(shown, instructor=True)


def test_the_public_view_names_what_is_locked_and_what_a_student_may_change():
    p = parse_preset(VALID)
    pub = public_view(p)
    assert pub["knob_text"] == "ckpt_every: A 2 vs B 5"
    assert "source" not in pub and "extra" not in pub
    assert set(pub["locked"]) | set(pub["student_adjustable"]) == {KNOB, *SETTINGS}
    assert pub["student_adjustable"] == sorted(STUDENT_ADJUSTABLE)


@pytest.mark.parametrize("locked", [None, ["n_layer"], [], ["knob", "steps"]])
def test_the_catalog_and_the_public_view_agree_on_what_is_locked(locked):
    p = parse_preset(VALID if locked is None else {**VALID, "locked": locked})
    summary = Lesson(p, "instructor", Path("t.toml"), "").summary()
    pub = public_view(p)
    assert summary["locked"] == pub["locked"] == sorted(locked_names(p))
    assert summary["student_adjustable"] == pub["student_adjustable"]
    assert not set(pub["locked"]) & set(pub["student_adjustable"])
    assert set(pub["locked"]) >= ALWAYS_LOCKED


def test_every_builtin_lesson_leaves_its_student_settings_within_the_setting_names():
    for preset in list_presets():
        assert student_overrides_allowed(preset) <= {KNOB, *SETTINGS}, preset.id
        assert not student_overrides_allowed(preset) & ALWAYS_LOCKED, preset.id


def test_every_bounded_setting_is_one_a_lesson_can_leave_open():
    assert set(STUDENT_BOUNDS) <= set(SETTINGS)


def test_default_lock_leaves_only_the_student_adjustable_settings_open():
    p = parse_preset(VALID)
    assert student_overrides_allowed(p) == set(STUDENT_ADJUSTABLE)
    changed = apply_student_overrides(p, {"steps": 20, "seed": 7})
    assert changed.config_for("B").steps == 20 and changed.config_for("A").seed == 7
    assert p.config_for("A").steps == 10  # the original is untouched


def test_a_locked_setting_is_refused_by_name():
    p = parse_preset(VALID)
    with pytest.raises(PresetError, match=r"n_layer is locked in lesson 't'; a student may change"):
        apply_student_overrides(p, {"n_layer": 4})
    with pytest.raises(PresetError, match=r"knob is locked"):
        apply_student_overrides(p, {"knob": {"a": 3}})
    with pytest.raises(PresetError, match=r"ckpt_every is this lesson's knob"):
        apply_student_overrides(p, {"ckpt_every": 3})
    with pytest.raises(PresetError, match=r"'flavour' is not a setting"):
        apply_student_overrides(p, {"flavour": 3})


def test_an_explicit_lock_list_opens_the_rest_but_never_data():
    p = parse_preset({**VALID, "locked": ["n_layer"]})
    allowed = student_overrides_allowed(p)
    assert "knob" in allowed and "lr" in allowed and "n_layer" not in allowed
    assert "data" not in allowed
    changed = apply_student_overrides(p, {"knob": {"b": 9}, "lr": 0.01})
    assert (changed.knob.a, changed.knob.b) == (2, 9) and changed.config_for("A").lr == 0.01


def test_student_values_are_validated_with_the_field_named():
    p = parse_preset(VALID)
    with pytest.raises(PresetError, match=r"\[student settings\] steps = -1 is not allowed"):
        apply_student_overrides(p, {"steps": -1})


def test_a_student_may_lengthen_a_lesson_only_up_to_a_bound():
    p = parse_preset(VALID)  # steps = 10
    assert apply_student_overrides(p, {"steps": 40}).config_for("A").steps == 40
    too_long = r"steps = 41 is not allowed: a whole number from 1 to 40"
    with pytest.raises(PresetError, match=too_long):
        apply_student_overrides(p, {"steps": 41})


def test_during_save_pause_holds_every_cadence_checkpoint_but_not_step_0_or_the_last():
    p = parse_preset({**VALID, "crash": {"mode": "during_save"}})
    assert during_save_pause(p, "A", 1.0) == "2:1,4:1,6:1,8:1"
    assert during_save_pause(p, "B", 0.5) == "5:0.5"
