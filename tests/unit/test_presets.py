from __future__ import annotations

import re

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


# ---------------------------------------------------------------- the format of issue #7

from crashdrill.trainer.presets import dump_preset, parse_preset_text  # noqa: E402


def test_every_builtin_preset_round_trips_through_dump_preset():
    for preset in list_presets():
        text = dump_preset(preset)
        again = parse_preset_text(text)
        assert again == preset, preset.id
        assert dump_preset(again) == text


def test_dump_preset_keeps_awkward_text_and_numbers_exact():
    p = parse_preset(
        {
            **VALID,
            "explanation": 'Line one\nline "two"\t\\ tab — ünïcode \x01',
            "run": {"steps": 10, "warmup": 0, "lr": 1e-05, "min_lr": 0.0, "cuda": {"lr": 0.1}},
            "a": {"eval_every": 3},
            "b": {"eval_every": 3},
            "locked": ["knob", "lr"],
            "published": False,
            "crash": {"mode": "wipe", "expect": "it fails"},
        }
    )
    assert parse_preset_text(dump_preset(p)) == p


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"run": {"steps": 10, "flavour": 1}},
            r"\[run\] unknown setting 'flavour'; allowed: .*batch",
        ),
        ({"run": {"steps": 10, "cuda": {"x": 1}}}, r"\[run.cuda\] unknown setting 'x'"),
        ({"knob": {"name": "ckpt_every", "a": 2, "b": 5, "c": 1}}, r"\[knob\] unknown key 'c'"),
        (
            {"crash": {"mode": "explode"}},
            r"\[crash\] mode = 'explode' is not allowed: one of 'kill'",
        ),
        (
            {"crash": {"mode": "kill", "when": 3}},
            r"\[crash\] unknown key 'when'; allowed: expect, mode",
        ),
        ({"locked": ["knob", "colour"]}, r"locked: 'colour' is not a run setting"),
        ({"locked": "knob"}, r"locked = 'knob': a list"),
        ({"published": "yes"}, r"published = 'yes': true or false"),
        ({"explanation": 3}, r"explanation = 3: must be text"),
        ({"a": {"lr": 0.1}}, r"A and B differ in lr \(A 0.1, B 0.003\)"),
        ({"b": {"ckpt_every": 7}}, r"\[b\] sets ckpt_every, which is the knob"),
        ({"a": {"steps": 0}}, r"\[a\] steps = 0 is not allowed"),
    ],
)
def test_invalid_new_keys_say_what_is_wrong(change, message):
    with pytest.raises(PresetError, match=message):
        parse_preset({**VALID, **change})


def test_every_problem_is_reported_not_only_the_first():
    with pytest.raises(PresetError) as e:
        parse_preset({**VALID, "colour": 1, "published": 2, "crash": {"mode": "x"}})
    assert len(e.value.problems) == 3, e.value.problems


def test_sides_may_differ_only_when_they_end_up_equal():
    p = parse_preset({**VALID, "a": {"eval_every": 2}, "b": {"eval_every": 2}})
    assert p.config_for("A").eval_every == p.config_for("B").eval_every == 2


@pytest.mark.parametrize("name", [p.id for p in list_presets()])
def test_every_builtin_lesson_has_its_texts(name):
    p = get_preset(name)
    assert p.title and p.question and p.whats_happening and p.what_to_watch
    assert len(p.explanation) > 200


def test_presets_cli_validate_prints_every_problem(tmp_path):
    from tests.conftest import run_cli

    bad = tmp_path / "bad.toml"
    bad.write_text('id = "x"\ntitle = "X"\ncolour = 1\n[knob]\nname = "ckpt_every"\na = 1\nb = 1\n')
    proc = run_cli("presets", "validate", str(bad))
    assert proc.returncode == 2
    assert "unknown key 'colour'" in proc.stderr and "a and b are both 1" in proc.stderr
    good = tmp_path / "good.toml"
    good.write_text(dump_preset(get_preset("lesson-1.10")).replace("lesson-1.10", "mine"))
    proc = run_cli("presets", "validate", str(good))
    assert proc.returncode == 0 and "ok — mine" in proc.stdout and "during_save" in proc.stdout


def test_every_bad_value_of_a_section_is_named_not_just_the_first() -> None:
    from crashdrill.trainer.presets import dump_preset, parse_preset_text

    text = dump_preset(get_preset("quick"))
    text = text.replace("lr = 0.003\n", "lr = 0.003\ndropout = 2.0\nweight_decay = -1.0\n", 1)
    text = text.replace("threads = 1", "threads = 0")
    with pytest.raises(PresetError) as e:
        parse_preset_text(text)
    for name in ("threads = 0", "dropout = 2.0", "weight_decay = -1.0"):
        assert f"[run] {name} is not allowed" in str(e.value), str(e.value)


def test_one_machine_text_replaces_the_cluster_s_only_on_one_machine() -> None:
    preset = get_preset("lesson-1.15")
    assert "another host" in preset.what_to_watch
    one = preset.for_lab(cluster=False)
    assert "one machine" in one.what_to_watch and "another host" not in one.what_to_watch
    assert "one machine" in one.explanation
    assert one.whats_happening == preset.whats_happening  # not in [one_machine]: the same
    assert preset.for_lab(cluster=True) is preset
    assert parse_preset_text(dump_preset(preset)) == preset


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"title": "x"}, "[one_machine] unknown key 'title'"),
        ({"explanation": 3}, "[one_machine] explanation = 3: must be text"),
    ],
)
def test_a_bad_one_machine_table_says_what_is_allowed(table, message) -> None:
    data = {**VALID, "one_machine": table}
    with pytest.raises(PresetError) as e:
        parse_preset(data)
    assert message in str(e.value)


# ---------------------------------------------------------------- [crash] window


def test_a_crash_window_is_read_for_both_runs_or_each_its_own() -> None:
    both = parse_preset({**VALID, "crash": {"window": [2, "end"]}})
    assert both.crash.window == {"A": (2, None), "B": (2, None)}
    own = parse_preset({**VALID, "crash": {"window": {"A": [1, 4], "B": [3, "end"]}}})
    assert own.crash.window == {"A": (1, 4), "B": (3, None)}
    assert parse_preset(VALID).crash.window == {}  # none: any moment of training will do
    for preset in (both, own):
        assert parse_preset_text(dump_preset(preset)) == preset


def test_a_crash_window_survives_any_what_to_watch_text() -> None:
    preset = get_preset("lesson-1.8")
    changed = parse_preset_text(
        dump_preset(preset).replace(preset.what_to_watch, "Crash whenever you like.")
    )
    assert changed.what_to_watch == "Crash whenever you like."
    assert changed.crash.window == preset.crash.window == {"A": (100, None), "B": (100, None)}


@pytest.mark.parametrize(
    ("window", "message"),
    [
        (
            "soon",
            r"\[crash\] window = 'soon': \[FROM, TO\] steps \(TO a step after FROM, or \"end\"",
        ),
        ([5], r"\[crash\] window = \[5\]: \[FROM, TO\]"),
        ([-1, 5], r"\[crash\] window = \[-1, 5\]: its first step -1 must be a step ≥ 0"),
        ([5, 5], r"\[crash\] window = \[5, 5\]: its last step 5 must be a step after 5 or \"end\""),
        ([5, "later"], r"its last step 'later' must be a step after 5 or \"end\""),
        ({"A": [1, 4]}, r"\[crash\] window: no window for run B; give both A and B"),
        (
            {"A": [1, 4], "B": [1, 4], "C": [1, 2]},
            r"\[crash\] window: unknown run 'C'; allowed: A, B",
        ),
        ({"A": [1, 4], "B": "x"}, r"\[crash\] window.B = 'x'"),
    ],
)
def test_a_bad_crash_window_names_the_field_the_value_and_what_is_allowed(window, message):
    with pytest.raises(PresetError, match=message):
        parse_preset({**VALID, "crash": {"window": window}})


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ([10, "end"], r"run A's window starts at step 10, but the run trains 10 steps"),
        ([2, 11], r"run A's window ends at step 11, past the run's 10 steps"),
    ],
)
def test_a_window_that_misses_the_run_s_steps_is_a_warning_and_the_preset_still_loads(
    window, message
):
    # A run shortened on purpose (a student's steps, a smoke size) keeps its lesson.
    from crashdrill.trainer.presets import window_warnings

    preset = parse_preset({**VALID, "crash": {"window": window}})
    warnings = window_warnings(preset)  # one per run: both train 10 steps
    assert len(warnings) == 2 and re.search(message, warnings[0]), warnings
