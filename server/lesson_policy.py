"""Lesson policy: who may see a lesson and what a student may change in it. The server
decides; the trainer's preset module (trainer/presets.py) owns only the file format and
checks that a preset's values make valid TrainConfigs.

    visible_to(preset, instructor=False)   # may this person see and start it?
    locked_names(preset)                   # what a student may not change
    student_overrides_allowed(preset)      # what they may: run settings and/or "knob"
    apply_student_overrides(preset, {"steps": 600, "knob": {"a": 50}})  # or PresetError
    public_view(preset)                    # what a page shows, both lists included
    during_save_pause(preset, "A")         # CRASHDRILL_CKPT_PAUSE of a during_save lesson

Published. A preset is published unless its file says `published = false`. Students see
and start published lessons only; an instructor sees and starts every one.

Locked. A student who starts a lesson may change the settings that are not locked. "knob"
stands for the knob's two values (`{"knob": {"a": 50, "b": 500}}`); the knob's own setting
is changed only that way. A preset without `locked` locks everything except
STUDENT_ADJUSTABLE (steps, seed, ckpt_every, keep). A preset with `locked` locks exactly
the names listed, and ALWAYS_LOCKED too (`data`: a path on the lab's machine is not a
student's to choose).

Bounds. A student's values must make valid configs (the preset's own validation, named
"[student settings]"), and a setting in STUDENT_BOUNDS must also pass its bound: today
`steps`, at most STUDENT_MAX_STEPS_FACTOR times the lesson's (the lab's machine is shared
and the instructor sized the lesson; an instructor who wants longer runs edits the
preset). A bound for another setting is one more entry there.

During save. A lesson whose `[crash] mode` is "during_save" trains with every cadence
checkpoint's write held open for DURING_SAVE_PAUSE_S, so that a crash test lands inside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.presets import (
    KNOB,
    SETTINGS,
    Knob,
    Preset,
    PresetError,
    config_problems,
)

STUDENT_ADJUSTABLE = frozenset({"steps", "seed", "ckpt_every", "keep"})
ALWAYS_LOCKED = frozenset({"data"})
STUDENT_MAX_STEPS_FACTOR = 4
DURING_SAVE_PAUSE_S = 1.0


def visible_to(preset: Preset, *, instructor: bool) -> bool:
    """Whether a student (or an instructor) may see and start the lesson."""
    return instructor or preset.published


def locked_names(preset: Preset) -> frozenset[str]:
    """Settings (and "knob") a student may not change."""
    if preset.locked is None:
        return frozenset({KNOB, *SETTINGS}) - STUDENT_ADJUSTABLE
    return frozenset(preset.locked) | ALWAYS_LOCKED


def student_overrides_allowed(preset: Preset) -> set[str]:
    """Names a student may set when starting the lesson: run settings and/or "knob"."""
    return {KNOB, *SETTINGS} - locked_names(preset)


def public_view(preset: Preset) -> dict[str, Any]:
    """What a page needs to show the lesson (no file paths), with what is locked."""
    d = dataclasses.asdict(preset)
    d.pop("source")
    d.pop("extra")
    d["locked"] = sorted(locked_names(preset))
    d["student_adjustable"] = sorted(student_overrides_allowed(preset))
    d["knob_text"] = preset.knob_text()
    return d


# ---------------------------------------------------------------- bounds


def _steps_bound(preset: Preset, value: Any) -> str | None:
    base = preset.run.get("steps", TrainConfig().steps)
    most = max(int(base), int(preset.cuda.get("steps", base))) * STUDENT_MAX_STEPS_FACTOR
    if isinstance(value, int) and not isinstance(value, bool) and value > most:
        return (
            f"[student settings] steps = {value!r} is not allowed: a whole number from 1 to "
            f"{most} ({STUDENT_MAX_STEPS_FACTOR}× the lesson's {base}; ask the instructor for more)"
        )
    return None  # a value of the wrong type is the config's to refuse


# A setting's bound beyond what its config accepts: the problem (naming the setting, the
# value and what is allowed) or None.
Bound = Callable[[Preset, Any], str | None]
STUDENT_BOUNDS: Mapping[str, Bound] = {"steps": _steps_bound}


def apply_student_overrides(preset: Preset, overrides: Mapping[str, Any]) -> Preset:
    """The preset with a student's changes applied and validated, or PresetError naming
    the locked or invalid field. A setting applies to both runs (and to [run.cuda]);
    {"knob": {"a": …, "b": …}} changes the knob's values."""
    allowed = student_overrides_allowed(preset)
    allowed_text = ", ".join(sorted(allowed)) or "nothing (every setting is locked)"
    run, cuda, knob = dict(preset.run), dict(preset.cuda), preset.knob
    for name, value in overrides.items():
        if name == preset.knob.name:
            raise PresetError(
                f"{name} is this lesson's knob: change its two values with "
                f'{{"knob": {{"a": …, "b": …}}}}, not {name}'
            )
        if name not in {KNOB, *SETTINGS}:
            raise PresetError(f"{name!r} is not a setting; a student may change: {allowed_text}")
        if name not in allowed:
            raise PresetError(
                f"{name} is locked in lesson {preset.id!r}; a student may change: {allowed_text}"
            )
        if name == KNOB:
            if not isinstance(value, Mapping) or not value or set(value) - {"a", "b"}:
                raise PresetError(f'knob = {value!r}: give {{"a": …, "b": …}} (either or both)')
            knob = Knob(knob.name, value.get("a", knob.a), value.get("b", knob.b))
        else:
            bound = STUDENT_BOUNDS.get(name)
            problem = bound(preset, value) if bound is not None else None
            if problem:
                raise PresetError(problem)
            run[name] = value
            if name in cuda:
                cuda[name] = value
    changed = dataclasses.replace(preset, run=run, cuda=cuda, knob=knob)
    problems = config_problems(changed, "student settings")
    if problems:
        raise PresetError(problems)
    return changed


# ---------------------------------------------------------------- during save


def during_save_pause(preset: Preset, label: str, seconds: float = DURING_SAVE_PAUSE_S) -> str:
    """CRASHDRILL_CKPT_PAUSE for a during_save lesson's run `label`: hold every cadence
    checkpoint's write open (not step 0's, not the last one) so that a crash test can land
    inside it. Covers the CPU and the CUDA config."""
    steps: set[int] = set()
    for cuda in (False, True):
        cfg = preset.config_for(label, cuda=cuda)
        if cfg.ckpt_policy == "every":
            steps.update(range(cfg.ckpt_every, cfg.steps, cfg.ckpt_every))
    return ",".join(f"{s}:{seconds:g}" for s in sorted(steps))
