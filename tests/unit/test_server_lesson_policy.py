"""The lab's lesson policy (server/lessons/policy.py): who sees a lesson, what a student may
change in it, within which bounds, and the during_save pause."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from crashdrill.server.lessons.bounds import SERVER_LOCKED, LabLimits
from crashdrill.server.lessons.catalog import Lesson
from crashdrill.server.lessons.policy import (
    STUDENT_ADJUSTABLE,
    LockedSetting,
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
    # the knob (ckpt_every) is locked, so its setting is too: never "a student may change" it
    assert pub["student_adjustable"] == sorted(STUDENT_ADJUSTABLE - {"ckpt_every"})
    assert "ckpt_every" in pub["locked"]


@pytest.mark.parametrize("locked", [None, ["n_layer"], [], ["knob", "steps"]])
def test_the_catalog_and_the_public_view_agree_on_what_is_locked(locked):
    p = parse_preset(VALID if locked is None else {**VALID, "locked": locked})
    summary = Lesson(p, "instructor", Path("t.toml"), "").summary()
    pub = public_view(p)
    assert summary["locked"] == pub["locked"] == sorted(locked_names(p))
    assert summary["student_adjustable"] == pub["student_adjustable"]
    assert not set(pub["locked"]) & set(pub["student_adjustable"])
    assert set(pub["locked"]) >= SERVER_LOCKED


def test_every_builtin_lesson_leaves_its_student_settings_within_the_setting_names():
    for preset in list_presets():
        assert student_overrides_allowed(preset) <= {KNOB, *SETTINGS}, preset.id
        assert not student_overrides_allowed(preset) & SERVER_LOCKED, preset.id


def test_default_lock_leaves_only_the_student_adjustable_settings_open():
    p = parse_preset(VALID)
    assert student_overrides_allowed(p) == set(STUDENT_ADJUSTABLE) - {p.knob.name}
    changed = apply_student_overrides(p, {"steps": 20, "seed": 7})
    assert changed.config_for("B").steps == 20 and changed.config_for("A").seed == 7
    assert p.config_for("A").steps == 10  # the original is untouched


def test_a_locked_setting_is_refused_by_name():
    p = parse_preset(VALID)
    with pytest.raises(LockedSetting, match=r"n_layer is locked in lesson 't'; a student may"):
        apply_student_overrides(p, {"n_layer": 4})
    with pytest.raises(LockedSetting, match=r"knob is locked"):
        apply_student_overrides(p, {"knob": {"a": 3}})
    with pytest.raises(PresetError, match=r"ckpt_every is this lesson's knob"):
        apply_student_overrides(p, {"ckpt_every": 3})
    with pytest.raises(PresetError, match=r"'flavour' is not a setting"):
        apply_student_overrides(p, {"flavour": 3})


def test_an_explicit_lock_list_opens_the_rest_but_never_what_the_server_locks():
    p = parse_preset({**VALID, "locked": ["n_layer"]})
    allowed = student_overrides_allowed(p)
    assert "knob" in allowed and "lr" in allowed and "keep" in allowed and "n_layer" not in allowed
    assert not allowed & SERVER_LOCKED
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


# ---- bounds (server/lessons/bounds.py) ----------------------------------------------

OPEN = {**VALID, "run": {"steps": 100, "warmup": 0}, "locked": []}  # nothing locked by the lesson


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"keep": "x"}, r"keep = 'x' is not allowed: a whole number"),
        ({"dropout": "x"}, r"dropout = 'x' is not allowed: a number"),
        ({"steps": 1.5}, r"steps = 1.5 is not allowed: a whole number"),
        ({"steps": True}, r"steps = True is not allowed: a whole number"),
        ({"lr": float("nan")}, r"lr = nan is not allowed: a number"),
        ({"data": 5}, r"data = 5 is not allowed: text"),
        ({"knob": {"a": "often"}}, r"knob.a: ckpt_every = 'often' is not allowed: a whole number"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_field_the_value_and_the_type(
    overrides, message
):
    for preset in (parse_preset(VALID), parse_preset(OPEN)):  # locked or not: the type first
        with pytest.raises(PresetError, match=message) as e:
            apply_student_overrides(preset, overrides)
        assert not isinstance(e.value, LockedSetting)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"keep": 100_000_000}, r"keep = 100000000 is not allowed: a whole number from 2 to 10"),
        ({"keep": 1}, r"keep = 1 is not allowed: a whole number ≥ 2"),
        ({"steps": 401}, r"steps = 401 is not allowed: a whole number from 1 to 400"),
        ({"knob": {"a": 1}}, r"knob.a: ckpt_every = 1 is not allowed: a whole number from 2 to"),
        ({"eval_batches": 10**9}, r"eval_batches = 1000000000 is not allowed"),
        ({"ckpt_mode": "sometimes"}, r"ckpt_mode = 'sometimes' is not allowed: one of 'sync'"),
        ({"device": "cuda"}, r"device = 'cuda' is not allowed: one of 'auto', 'cpu'"),
        ({"threads": 10_000}, r"threads = 10000 is not allowed: a whole number from 1 to"),
    ],
)
def test_a_value_out_of_its_range_is_refused_naming_the_field_the_value_and_the_range(
    overrides, message
):
    with pytest.raises(PresetError, match=message):
        apply_student_overrides(parse_preset(OPEN), overrides)


def test_ckpt_every_is_at_least_ten_and_at_most_the_runs_steps():
    p = parse_preset({**OPEN, "knob": {"name": "keep", "a": 2, "b": 3}, "run": {"steps": 200}})
    assert apply_student_overrides(p, {"ckpt_every": 10}).config_for("A").ckpt_every == 10
    with pytest.raises(PresetError, match=r"ckpt_every = 1 is not allowed: a whole number from 10"):
        apply_student_overrides(p, {"ckpt_every": 1})
    with pytest.raises(PresetError, match=r"ckpt_every = 300 is not allowed: .* to 200 \(at most"):
        apply_student_overrides(p, {"ckpt_every": 300})
    assert (
        apply_student_overrides(p, {"ckpt_every": 300, "steps": 300}).config_for("B").steps == 300
    )


def test_the_server_locks_corpus_tokenizer_mirror_shape_and_precision_whatever_a_lesson_opens():
    p = parse_preset(OPEN)  # the lesson locks nothing
    for name, value in [
        ("tokenizer", "gpt2"),
        ("vocab", 2_000_000_000),
        ("data", "file:/proc/self/environ"),
        ("mirror", "off"),
        ("precision", "bf16"),
        ("n_layer", 64),
    ]:
        with pytest.raises(
            PresetError, match=rf"{name} = .* this lab fixes {name} for students"
        ) as e:
            apply_student_overrides(p, {name: value})
        assert not isinstance(e.value, LockedSetting)  # 422, not 403: the server's range
        assert name not in student_overrides_allowed(p) and name in locked_names(p)


def test_a_server_setting_unlocks_a_server_locked_setting_within_its_range_and_the_budget():
    p = parse_preset(OPEN)
    limits = LabLimits(unlockable=frozenset({"n_layer", "vocab", "tokenizer"}), max_params=10**6)
    assert {"n_layer", "vocab"} <= student_overrides_allowed(p, limits)
    assert apply_student_overrides(p, {"n_layer": 4}, limits).config_for("A").n_layer == 4
    with pytest.raises(
        PresetError, match=r"n_layer = 9 is not allowed: a whole number from 1 to 8"
    ):
        apply_student_overrides(p, {"n_layer": 9}, limits)
    with pytest.raises(PresetError, match=r"vocab = 2000000000 is not allowed: .* from 0 to 1024"):
        apply_student_overrides(p, {"vocab": 2_000_000_000}, limits)
    over = r"has 469,632 parameters; this lab's limit is 100,000 \(max_params_per_run\)"
    with pytest.raises(PresetError, match=over):
        apply_student_overrides(
            p,
            {"n_layer": 8, "vocab": 1024},
            LabLimits(unlockable=limits.unlockable, max_params=10**5),
        )
    gpt2 = r"tokenizer = 'gpt2' is not allowed: one of 'byte'"
    with pytest.raises(PresetError, match=gpt2):  # a machine without tiktoken
        apply_student_overrides(p, {"tokenizer": "gpt2"}, limits)


def test_a_change_that_takes_the_run_over_the_budget_is_refused_naming_the_limit():
    p = parse_preset(OPEN)  # 100 steps × batch 16 × ctx 64 = 102,400 tokens
    limits = LabLimits(max_tokens=200_000)
    assert apply_student_overrides(p, {"steps": 150}, limits).config_for("A").steps == 150
    over = r"has 204,800 tokens \(steps × batch × ctx\); this lab's limit is 200,000"
    with pytest.raises(PresetError, match=over):
        apply_student_overrides(p, {"steps": 200}, limits)


def test_every_setting_has_a_student_range_that_holds_the_built_in_lessons_own_values():
    from crashdrill.server.lessons.bounds import lesson_values, student_range

    limits = LabLimits(unlockable=SERVER_LOCKED)
    for preset in list_presets():
        for name in SETTINGS:
            for label in ("A", "B"):
                config = preset.config_for(label)
                allowed = student_range(name, preset, config, limits)
                for value in lesson_values(preset, name):
                    assert allowed.allows(value), (preset.id, name, value, allowed)


def test_every_built_in_lesson_fits_the_default_budget_with_a_student_s_longest_run():
    from crashdrill.server.lessons.bounds import budget_problems
    from crashdrill.server.settings import Settings, default_disk_bytes_per_run

    limits = LabLimits.from_settings(Settings(data_dir=Path("/nonexistent")))
    limits = dataclasses.replace(limits, gpt2_tokenizer=True, mirrored=True)
    for gpus in (0, 1):  # disk bytes count the runs of the lab's machine: CPU or CUDA
        disk = default_disk_bytes_per_run(gpus)
        here = dataclasses.replace(limits, gpus=gpus, max_disk_bytes=disk)
        for preset in list_presets():
            assert budget_problems(preset, here) == [], preset.id
            steps = max(preset.config_for("A", cuda=c).steps for c in (False, True)) * 4
            keep = {"keep": 10} if "keep" in student_overrides_allowed(preset) else {}
            changed = apply_student_overrides(preset, {"steps": steps, **keep}, here)
            assert budget_problems(changed, here) == [], (preset.id, gpus)


def test_the_parameter_count_is_the_models():
    torch = pytest.importorskip("torch")
    from crashdrill.server.lessons.bounds import param_count
    from crashdrill.trainer.config import TrainConfig
    from crashdrill.trainer.model import GPT

    for cfg in (TrainConfig(), TrainConfig(n_layer=3, d_model=96, n_head=4, ctx=32, vocab=300)):
        with torch.device("meta"):
            model = GPT(cfg, cfg.vocab or 256)
        assert param_count(cfg) == model.num_params()
