"""Lesson policy: who may see a lesson and what a student may change in it. The server
decides; the trainer's preset module (trainer/presets.py) owns only the file format and
checks that a preset's values make valid TrainConfigs.

    limits = LabLimits.from_settings(settings)   # server/lessons/bounds.py
    visible_to(preset, instructor=False)   # may this person see and start it?
    locked_names(preset, limits)           # what a student may not change
    student_overrides_allowed(preset, limits)  # what they may: run settings and/or "knob"
    apply_student_overrides(preset, {"steps": 600, "knob": {"a": 50}}, limits)  # or PresetError
    public_view(preset, limits)            # what a page shows, both lists included
    during_save_pause(preset, "A")         # the checkpoint pause of a during_save lesson

Published. A preset is published unless its file says `published = false`. Students see
and start published lessons only; an instructor sees and starts every one.

Locked. A student who starts a lesson may change the settings that are not locked. "knob"
stands for the knob's two values (`{"knob": {"a": 50, "b": 500}}`); the knob's own setting
is changed only that way. A preset without `locked` locks everything except
STUDENT_ADJUSTABLE (steps, seed, ckpt_every). A preset with `locked` locks exactly the
names listed, and the server locks SERVER_LOCKED on top (the corpus, the tokenizer, the
mirror, the model's shape, the precision) unless its `student_unlockable` setting opens
some: an instructor unlocks more per preset, the lab's owner decides how far.

Bounds. Each value a student gives is checked, in order: of the setting's type (a
whole number, a number, text: 422); not locked by the lesson (LockedSetting: 403); not
locked by the server (422); within its range, derived from the lesson and the machine
(server/lessons/bounds.py: `steps` ≤ 4× the lesson's, `ckpt_every` ≥ 10 and ≤ steps,
`keep` 2..10, …); the changed runs within the lab's budget (parameters, tokens,
checkpoint bytes); and valid configs (the preset's own validation). Every problem names
the field, the value and what is allowed, prefixed "[student settings]".

During save. A lesson whose `[crash] mode` is "during_save" trains with every cadence
checkpoint's write held open for DURING_SAVE_PAUSE_S, so that a crash test lands inside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from crashdrill.server.lessons.bounds import (
    LabLimits,
    budget_problems,
    range_problem,
    type_problem,
)
from crashdrill.trainer.checkpoint_pause import format_pause
from crashdrill.trainer.config import ConfigError
from crashdrill.trainer.prediction import ask_when
from crashdrill.trainer.presets import (
    KNOB,
    LABELS,
    SETTINGS,
    Knob,
    Preset,
    PresetError,
    config_problems,
)

STUDENT_ADJUSTABLE = frozenset({"steps", "seed", "ckpt_every"})
DEFAULT_LIMITS = LabLimits()  # a lab that unlocks nothing beyond STUDENT_ADJUSTABLE
DURING_SAVE_PAUSE_S = 1.0


def visible_to(preset: Preset, *, instructor: bool) -> bool:
    """Whether a student (or an instructor) may see and start the lesson."""
    return instructor or preset.published


def _lesson_locked(preset: Preset) -> frozenset[str]:
    """What the lesson itself locks (its `locked` list, else all but STUDENT_ADJUSTABLE)."""
    if preset.locked is None:
        return frozenset({KNOB, *SETTINGS}) - STUDENT_ADJUSTABLE
    return frozenset(preset.locked)


def locked_names(preset: Preset, limits: LabLimits = DEFAULT_LIMITS) -> frozenset[str]:
    """Settings (and "knob") a student may not change: the lesson's and the server's (the
    knob too when its setting is one the server locks, and the knob's setting when the
    knob is locked)."""
    server = limits.server_locked
    knob = {KNOB} if preset.knob.name in server else set()
    locked = _lesson_locked(preset) | server | knob
    # A locked knob locks its setting too: the page shows it locked, and refusals agree.
    return locked | {preset.knob.name} if KNOB in locked else locked


def student_overrides_allowed(preset: Preset, limits: LabLimits = DEFAULT_LIMITS) -> set[str]:
    """Names a student may set when starting the lesson: run settings and/or "knob". Never
    the knob's own setting: its two values are changed through "knob" alone, so a lesson
    that locks the knob does not say its setting may be changed."""
    return {KNOB, *SETTINGS} - locked_names(preset, limits) - {preset.knob.name}


def public_view(preset: Preset, limits: LabLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """What a page needs to show the lesson (no file paths), with what is locked, in the
    text that is true where the lab runs (one machine, or a cluster: `limits.cluster`)."""
    d = dataclasses.asdict(preset.for_lab(cluster=limits.cluster))
    d.pop("source")
    d.pop("extra")
    d.pop("one_machine")
    d["crash"]["offer"] = list(preset.crash.offer)  # JSON's form: asdict keeps the tuple
    d["locked"] = sorted(locked_names(preset, limits))
    d["student_adjustable"] = sorted(student_overrides_allowed(preset, limits))
    d["knob_text"] = preset.knob_text()
    d["predict"] = None
    if preset.predict is not None:
        # When the question is asked follows from the crash: one that comes by itself
        # (a session wall) is predicted before Start (trainer/prediction.py ask_when).
        d["predict"] = {**preset.predict.to_dict(), "ask": ask_when(preset.crash.wall_step)}
    return d


# ---------------------------------------------------------------- a student's settings


class LockedSetting(PresetError):
    """A student's change to a setting the lesson locks (the lab answers 403)."""


def apply_student_overrides(
    preset: Preset, overrides: Mapping[str, Any], limits: LabLimits = DEFAULT_LIMITS
) -> Preset:
    """The preset with a student's changes applied and checked, or PresetError naming the
    field, the value and what is allowed (LockedSetting for a setting the lesson locks).
    A setting applies to both runs (and to [run.cuda]); {"knob": {"a": …, "b": …}}
    changes the knob's values. In order: a known name of the right type; not locked by
    the lesson (LockedSetting), nor by the server; within its range; the run within the
    lab's budget; a valid config."""
    lesson_allowed = {KNOB, *SETTINGS} - _lesson_locked(preset)
    allowed = student_overrides_allowed(preset, limits)
    allowed_text = ", ".join(sorted(allowed)) or "nothing (every setting is locked)"
    run, cuda, knob = dict(preset.run), dict(preset.cuda), preset.knob
    changed_names: list[str] = []
    for name, value in overrides.items():
        if name == preset.knob.name:
            raise PresetError(
                f"{name} is this lesson's knob: change its two values with "
                f'{{"knob": {{"a": …, "b": …}}}}, not {name}'
            )
        if name not in {KNOB, *SETTINGS}:
            raise PresetError(f"{name!r} is not a setting; a student may change: {allowed_text}")
        if name == KNOB:
            if not isinstance(value, Mapping) or not value or set(value) - {"a", "b"}:
                raise PresetError(f'knob = {value!r}: give {{"a": …, "b": …}} (either or both)')
            for side, v in value.items():
                problem = type_problem(preset.knob.name, v)
                if problem:
                    raise PresetError(f"[student settings] knob.{side}: {problem}")
        else:
            problem = type_problem(name, value)
            if problem:
                raise PresetError(f"[student settings] {problem}")
        if name not in lesson_allowed:
            raise LockedSetting(
                f"{name} is locked in lesson {preset.id!r}; a student may change: {allowed_text}"
            )
        fixed = preset.knob.name if name == KNOB else name
        if fixed in limits.server_locked:
            shown = value if name == KNOB else repr(value)
            raise PresetError(
                f"[student settings] {name} = {shown} is not allowed: this lab fixes {fixed}"
                f" for students (the server's setting student_unlockable); a student may"
                f" change: {allowed_text}"
            )
        if name == KNOB:
            knob = Knob(knob.name, value.get("a", knob.a), value.get("b", knob.b))
        else:
            run[name] = value
            if name in cuda:
                cuda[name] = value
        changed_names.append(name)
    changed = dataclasses.replace(preset, run=run, cuda=cuda, knob=knob)
    problems = _range_problems(preset, changed, changed_names, limits)
    if not problems:
        problems = config_problems(changed, "student settings")
    if not problems:
        problems = [f"[student settings] {p}" for p in budget_problems(changed, limits)]
    if problems:
        raise PresetError(problems)
    return changed


def _range_problems(
    preset: Preset, changed: Preset, names: list[str], limits: LabLimits
) -> list[str]:
    """Each changed setting's value against its range in each of the changed configs."""
    problems: list[str] = []
    for label in LABELS:
        for cuda in (False, True):
            try:
                config = changed.config_for(label, cuda=cuda)
            except ConfigError:
                continue  # the config's own problem, said after the ranges
            for name in names:
                setting = preset.knob.name if name == KNOB else name
                value = getattr(config, setting)
                problem = range_problem(setting, value, preset, config, limits)
                if problem:
                    where = f"knob.{label.lower()}: " if name == KNOB else ""
                    problems.append(f"[student settings] {where}{problem}")
    return list(dict.fromkeys(problems))


# ---------------------------------------------------------------- during save


def during_save_pause(preset: Preset, label: str, seconds: float = DURING_SAVE_PAUSE_S) -> str:
    """The checkpoint pause (trainer/checkpoint_pause.py) for a during_save lesson's run
    `label`: hold every cadence checkpoint's write open (not step 0's, not the last one) so
    that a crash test can land inside it. Covers the CPU and the CUDA config; "" when the
    run writes no cadence checkpoint."""
    steps: set[int] = set()
    for cuda in (False, True):
        cfg = preset.config_for(label, cuda=cuda)
        if cfg.ckpt_policy == "every":
            steps.update(range(cfg.ckpt_every, cfg.steps, cfg.ckpt_every))
    return format_pause(steps, seconds) if steps else ""
