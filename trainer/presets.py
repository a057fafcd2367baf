"""Lesson presets: a TOML file per lesson, with the shared run config and the one knob
that differs between run A and run B.

    id = "lesson-1.7"            # how users name it: no spaces, no '/'
    number = "1.7"               # text, also the sort key of `list_presets`
    chapter, title, question     # text; title is required
    whats_happening              # text: what the two runs are doing
    what_to_watch                # text: what to press and what to look at
    explanation                  # text: what happened and why, shown with the outcome
    published = true             # false: the lab hides it from students (default true)
    locked = ["knob", "n_layer"] # what a student may not change (see the lab's policy)

    [run]        shared TrainConfig values (unknown names are refused)
    [run.cuda]   overrides applied when the run executes on CUDA
    [a], [b]     optional run settings of one side only; A and B must still end up
                 differing in the knob alone (else the preset is refused, naming the setting)
    [knob]       name = "ckpt_every", a = 100, b = 1000   (exactly these three keys)
    [predict]    question = text, measure = "lost_steps" | "resume" | "bit_identical",
                 runs = ["A", "B"], answer_after_outcome = true: the prediction a student
                 makes before the first crash test (trainer/prediction.py)
    [crash]      mode = one of the crash modes below (default "kill"); expect = text
                 (what a crash shows);
                 offer = ["rank"]: modes a student may pick at Crash test instead of
                 `mode` (default none; not a mode that waits for a save, which needs its
                 pause from the runs' start);
                 restart_ranks = N: a crash test's restart runs on N ranks for good
                 (default 0: the same), the resume on another world size of lesson 1.18;
                 wall_step = N: the lab preempts each run once when it passes step N
                 (SIGTERM, then SIGKILL after the run's stop_grace), as a platform's
                 session limit does (0, the default: no wall);
                 window = [FROM, TO] (TO a step or "end"), or { A = [..], B = [..] }:
                 the steps in which the lesson wants its Crash test (trainer/crash_window.py;
                 none: any moment of training will do)
    [one_machine] whats_happening / what_to_watch / explanation as they read on a lab of
                 one machine (no Ray cluster), where they differ from the cluster's: the
                 lab shows the text that is true where it runs (`Preset.for_lab`)

Crash modes (what the lab's Crash test button does for this lesson) are one registry,
trainer/crash_modes.py (the table in docs/presets.md); this module only checks that a
preset names one of them.

`published` and `locked` are only read and checked here: what they let a student see and
change (and the bounds on a student's values, and the during_save pause) is the lab's
lesson policy, server/lessons/policy.py. `config_problems(preset, where)` is the check
that a preset's values, a student's changed ones included, make valid TrainConfigs.

Built-ins ship in `presets/` beside this file; an instructor's directory can be added with
CRASHDRILL_PRESETS_DIR (searched first). `dump_preset` writes a preset back as TOML that
`parse_preset_text` reads to an equal preset.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from crashdrill.trainer import crash_modes
from crashdrill.trainer.config import MAX_RANKS, ConfigError, TrainConfig
from crashdrill.trainer.crash_window import Window, parse_window, window_problems, window_toml
from crashdrill.trainer.prediction import Prediction, parse_prediction
from crashdrill.trainer.preset_toml import dump_toml

BUILTIN_DIR = Path(__file__).with_name("presets")
_TEXT_FIELDS = (
    "number",
    "chapter",
    "title",
    "question",
    "whats_happening",
    "what_to_watch",
    "explanation",
)
_TOP_LEVEL = (
    "id",
    *_TEXT_FIELDS,
    "published",
    "locked",
    "run",
    "a",
    "b",
    "knob",
    "crash",
    "predict",
    "one_machine",
)
_ONE_MACHINE_KEYS = ("whats_happening", "what_to_watch", "explanation")
_KNOB_KEYS = ("name", "a", "b")
_CRASH_KEYS = ("mode", "expect", "wall_step", "window", "restart_ranks", "offer")
LABELS = ("A", "B")
KNOB = "knob"
SETTINGS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "extra")


class PresetError(ValueError):
    """A preset that cannot be used: names the file, the field and what is allowed.
    `problems` holds every problem found (the message joins them)."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class Knob:
    name: str
    a: Any
    b: Any

    def value_for(self, label: str) -> Any:
        return self.a if label == "A" else self.b


@dataclass(frozen=True)
class Crash:
    mode: str = crash_modes.DEFAULT
    expect: str = ""
    wall_step: int = 0  # the lab preempts each run once past this step (0: never)
    # the steps in which the lesson wants its Crash test, by run ({}: any moment)
    window: Window = field(default_factory=dict)
    offer: tuple[str, ...] = ()  # modes a student may pick at Crash test instead of `mode`
    restart_ranks: int = 0  # the world size a crash test restarts on (0: the same)


@dataclass(frozen=True)
class Preset:
    id: str
    number: str
    chapter: str
    title: str
    question: str
    whats_happening: str
    what_to_watch: str
    run: dict[str, Any]
    cuda: dict[str, Any]
    knob: Knob
    explanation: str = ""
    published: bool = True
    locked: tuple[str, ...] | None = None  # None: the lab's default rule
    crash: Crash = field(default_factory=Crash)
    a: dict[str, Any] = field(default_factory=dict)
    b: dict[str, Any] = field(default_factory=dict)
    predict: Prediction | None = None  # the question asked before the first crash test
    source: str = field(default="", compare=False)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    one_machine: dict[str, str] = field(default_factory=dict)  # text for a lab of one machine

    def for_lab(self, *, cluster: bool) -> Preset:
        """The preset with the text that is true where the lab runs: on one machine its
        [one_machine] text replaces the cluster's."""
        if cluster or not self.one_machine:
            return self
        text: dict[str, Any] = dict(self.one_machine)
        return replace(self, **text)

    def config_for(self, label: str = "A", *, cuda: bool = False) -> TrainConfig:
        """The TrainConfig of run `label` ("A" or "B")."""
        if label not in LABELS:
            raise PresetError(f"run label {label!r} is not allowed: use A or B")
        return TrainConfig.from_dict(self._values(label, cuda))

    def _values(self, label: str, cuda: bool) -> dict[str, Any]:
        values = dict(self.run)
        if cuda:
            values.update(self.cuda)
        values.update(self.a if label == "A" else self.b)
        values[self.knob.name] = self.knob.value_for(label)
        return values

    def knob_text(self) -> str:
        return f"{self.knob.name}: A {self.knob.a} vs B {self.knob.b}"


# ---------------------------------------------------------------- parsing


def _unknown(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> list[str]:
    return [
        f"{where}unknown key {k!r}; allowed: {', '.join(sorted(allowed))}"
        for k in sorted(set(table) - set(allowed))
    ]


def _settings_table(data: Mapping[str, Any], name: str, problems: list[str]) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        problems.append(f"[{name}] must be a table of run settings, not {value!r}")
        return {}
    out = dict(value)
    for key in sorted(set(out) - set(SETTINGS) - ({"cuda"} if name == "run" else set())):
        problems.append(f"[{name}] unknown setting {key!r}; allowed: {', '.join(sorted(SETTINGS))}")
        del out[key]
    return out


def parse_preset(data: Mapping[str, Any], source: str = "<memory>") -> Preset:
    """Validate a preset's parsed TOML. Raises PresetError listing every problem found,
    each naming the field, the value and what is allowed."""
    problems = _unknown(data, _TOP_LEVEL, "")
    pid = data.get("id")
    if not isinstance(pid, str) or not pid or any(c.isspace() or c == "/" for c in pid):
        problems.append(f"id = {pid!r}: a non-empty name without spaces or '/'")
        pid = "?"
    text: dict[str, str] = {}
    for name in _TEXT_FIELDS:
        value = data.get(name, "")
        if not isinstance(value, str):
            problems.append(f"{name} = {value!r}: must be text")
            value = ""
        text[name] = value
    if not text["title"]:
        problems.append("title is missing: every lesson needs a title")
    published = data.get("published", True)
    if not isinstance(published, bool):
        problems.append(f"published = {published!r}: true or false")
        published = True
    locked = _parse_locked(data, problems)
    run = _settings_table(data, "run", problems)
    cuda = run.pop("cuda", {})
    if not isinstance(cuda, dict):
        problems.append("[run.cuda] must be a table of settings")
        cuda = {}
    for key in sorted(set(cuda) - set(SETTINGS)):
        problems.append(
            f"[run.cuda] unknown setting {key!r}; allowed: {', '.join(sorted(SETTINGS))}"
        )
        del cuda[key]
    sides = {side: _settings_table(data, side, problems) for side in ("a", "b")}
    knob = _parse_knob(data.get("knob"), problems)
    crash = _parse_crash(data.get("crash", {}), problems)
    predict = parse_prediction(data.get("predict"), problems)
    one_machine = _parse_one_machine(data.get("one_machine", {}), problems)
    if knob is None:
        raise PresetError([f"{source}: {p}" for p in problems])
    for side, values in sides.items():
        if knob.name in values:
            problems.append(
                f"[{side}] sets {knob.name}, which is the knob: put its two values in [knob]"
            )
            del values[knob.name]
    preset = Preset(
        id=pid,
        run=run,
        cuda=cuda,
        knob=knob,
        published=published,
        locked=locked,
        crash=crash,
        predict=predict,
        a=sides["a"],
        b=sides["b"],
        source=source,
        number=text["number"],
        chapter=text["chapter"],
        title=text["title"],
        question=text["question"],
        whats_happening=text["whats_happening"],
        what_to_watch=text["what_to_watch"],
        explanation=text["explanation"],
        one_machine=one_machine,
    )
    if not problems:
        problems.extend(config_problems(preset, ""))
    if not problems:
        problems.extend(restart_problems(preset))
    if problems:
        raise PresetError([f"{source}: {p}" for p in problems])
    return preset


def _parse_locked(data: Mapping[str, Any], problems: list[str]) -> tuple[str, ...] | None:
    if "locked" not in data:
        return None
    locked = data["locked"]
    if not isinstance(locked, list) or not all(isinstance(x, str) for x in locked):
        problems.append(f'locked = {locked!r}: a list of setting names (or "knob")')
        return None
    problems += locked_problems(locked)
    return tuple(dict.fromkeys(n for n in locked if n in (KNOB, *SETTINGS)))


def locked_problems(names: list[str]) -> list[str]:
    """One sentence per name a `locked` list may not hold: "knob" or a run setting only."""
    return [
        f'locked: {name!r} is not a run setting; allowed: "knob" or one of '
        + ", ".join(sorted(SETTINGS))
        for name in names
        if name not in (KNOB, *SETTINGS)
    ]


def _parse_knob(value: Any, problems: list[str]) -> Knob | None:
    if not isinstance(value, dict):
        problems.append("[knob] is missing: name, a and b (the one setting that differs)")
        return None
    problems.extend(_unknown(value, _KNOB_KEYS, "[knob] "))
    missing = [k for k in _KNOB_KEYS if k not in value]
    if missing:
        problems.append(
            f"[knob] needs name, a and b (the one setting that differs); "
            f"missing: {', '.join(missing)}"
        )
        return None
    name = value["name"]
    if name not in SETTINGS:
        problems.append(
            f"[knob] name = {name!r} is not a run setting; allowed: {', '.join(sorted(SETTINGS))}"
        )
        return None
    if value["a"] == value["b"]:
        problems.append(f"[knob] {name}: a and b are both {value['a']!r}; they must differ")
    return Knob(name, value["a"], value["b"])


def _parse_one_machine(value: Any, problems: list[str]) -> dict[str, str]:
    if not isinstance(value, dict):
        problems.append("[one_machine] must be a table of text")
        return {}
    problems.extend(_unknown(value, _ONE_MACHINE_KEYS, "[one_machine] "))
    out = {}
    for key in _ONE_MACHINE_KEYS:
        if key in value and not isinstance(value[key], str):
            problems.append(f"[one_machine] {key} = {value[key]!r}: must be text")
        elif key in value:
            out[key] = value[key]
    return out


def _parse_crash(value: Any, problems: list[str]) -> Crash:
    if not isinstance(value, dict):
        problems.append(f"[crash] must be a table (mode, expect), not {value!r}")
        return Crash()
    problems.extend(_unknown(value, _CRASH_KEYS, "[crash] "))
    mode = value.get("mode", crash_modes.DEFAULT)
    if mode not in crash_modes.NAMES:
        problems.append(f"[crash] mode = {mode!r} is not allowed: one of {crash_modes.allowed()}")
        mode = crash_modes.DEFAULT
    expect = value.get("expect", "")
    if not isinstance(expect, str):
        problems.append(f"[crash] expect = {expect!r}: must be text")
        expect = ""
    wall = value.get("wall_step", 0)
    if not isinstance(wall, int) or isinstance(wall, bool) or wall < 0:
        problems.append(f"[crash] wall_step = {wall!r}: a step ≥ 1, or 0 for no wall")
        wall = 0
    window = parse_window(value.get("window"), problems)
    restart_ranks = value.get("restart_ranks", 0)
    if (
        not isinstance(restart_ranks, int)
        or isinstance(restart_ranks, bool)
        or not (0 <= restart_ranks <= MAX_RANKS)
    ):
        problems.append(
            f"[crash] restart_ranks = {restart_ranks!r}: a world size in [1, {MAX_RANKS}] for the"
            " restart after a crash test, or 0 for the run's own"
        )
        restart_ranks = 0
    offer = _parse_offer(value.get("offer", []), mode, problems)
    return Crash(mode, expect, wall, window, offer, restart_ranks=restart_ranks)


def _parse_offer(value: Any, mode: str, problems: list[str]) -> tuple[str, ...]:
    """`[crash] offer`: distinct registered modes other than `mode`, none that waits for a
    save (its runs need the checkpoint pause from their start: make it the `mode`)."""
    allowed = [m.name for m in crash_modes.MODES if not m.waits_for_save and m.name != mode]
    text = ", ".join(repr(n) for n in allowed)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"[crash] offer = {value!r}: a list of crash modes, from {text}")
        return ()
    bad = [v for v in value if v not in allowed]
    if bad or len(set(value)) != len(value):
        what = f"{bad[0]!r} cannot be offered" if bad else "names a mode twice"
        problems.append(
            f"[crash] offer = {value!r}: {what}; offer distinct modes other than mode ="
            f" {mode!r}, from {text}"
        )
        return ()
    return tuple(value)


def restart_problems(preset: Preset) -> list[str]:
    """Where a crash test's restart on `[crash] restart_ranks` ranks would be refused by a
    run's config (a global batch it does not divide): said when the lesson is read, not
    when a student's restart fails."""
    n = preset.crash.restart_ranks
    problems: list[str] = []
    for label in LABELS if n else ():
        try:
            preset.config_for(label).with_overrides({"ranks": n})
        except ConfigError as e:
            problems.append(f"[crash] restart_ranks = {n}: run {label} refuses it: {e}")
    return problems


def config_problems(preset: Preset, where: str) -> list[str]:
    """Each side's config must validate (plain and CUDA) and A and B must differ in the
    knob alone. `where` names the place in each problem ("": the table the value came
    from, as a preset file's problems say)."""
    problems: list[str] = []
    configs: dict[tuple[str, bool], dict[str, Any]] = {}
    for on_cuda in (False, True):
        for label in LABELS:
            # Every bad value, not just the first: a value found bad is set aside (its
            # default stands in) and the config is built again, at most once per field.
            tried, clean = preset, True
            for _ in range(len(preset.run) + len(preset.cuda) + len(preset.a) + len(preset.b)):
                try:
                    config = tried.config_for(label, cuda=on_cuda).to_dict()
                except ConfigError as e:
                    clean = False
                    place, tried_next = _where_and_without(tried, e.field, label, on_cuda)
                    msg = f"[{where}] {e}" if where else f"{place} {e}"
                    if msg not in problems:
                        problems.append(msg)
                    if tried_next is None:
                        break
                    tried = tried_next
                else:
                    if clean:
                        configs[label, on_cuda] = config
                    break
        if ("A", on_cuda) in configs and ("B", on_cuda) in configs:
            a, b = configs["A", on_cuda], configs["B", on_cuda]
            for name in sorted(k for k in a if a[k] != b[k] and k != preset.knob.name):
                msg = (
                    f"A and B differ in {name} (A {a[name]!r}, B {b[name]!r}) as well as in the "
                    f"knob {preset.knob.name}: a lesson changes one thing at a time"
                )
                if msg not in problems:
                    problems.append(msg)
    return problems


def _where_and_without(
    preset: Preset, name: str, label: str, on_cuda: bool
) -> tuple[str, Preset | None]:
    """Where run `label`'s value of `name` came from, and the preset without it there
    (None when it cannot be set aside: the knob's own value, or a cross-field rule)."""
    if name == preset.knob.name:
        return f"[knob] {label.lower()}", None
    side = preset.a if label == "A" else preset.b
    if name in side:
        changes: dict[str, Any] = {label.lower(): _without(side, name)}
        return f"[{label.lower()}]", replace(preset, **changes)
    if on_cuda and name in preset.cuda:
        return "[run.cuda]", replace(
            preset, cuda={k: v for k, v in preset.cuda.items() if k != name}
        )
    if name in preset.run:
        return "[run]", replace(preset, run={k: v for k, v in preset.run.items() if k != name})
    return "[run]", None


def _without(table: Mapping[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in table.items() if k != name}


def parse_preset_text(text: str, source: str = "<text>") -> Preset:
    """A preset from TOML text (what an instructor edits in the lab's page)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PresetError(f"{source}: not valid TOML: {e}") from None
    return parse_preset(data, source=source)


def window_warnings(preset: Preset) -> list[str]:
    """Where the lesson's crash window misses its runs as they are set (a window that starts
    at or ends past a run's last step). A warning, not an error: a run shortened on purpose
    (a student's `steps`, a smoke size) keeps its preset, and the page says the window was
    missed; `crashdrill presets validate` prints these for the preset as written."""
    if not preset.crash.window:
        return []
    steps = {label: preset.config_for(label).steps for label in LABELS}
    return window_problems(preset.crash.window, steps)


def load_preset_file(path: str | Path) -> Preset:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PresetError(f"{path}: no such preset file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PresetError(f"{path}: cannot be read: {e}") from None
    return parse_preset_text(text, source=str(path))


def dump_preset(preset: Preset) -> str:
    """The preset as TOML text; `parse_preset_text` of it gives an equal preset."""
    top: dict[str, Any] = {"id": preset.id}
    for name in _TEXT_FIELDS:
        value = getattr(preset, name)
        if value or name == "title":
            top[name] = value
    top["published"] = preset.published
    if preset.locked is not None:
        top["locked"] = list(preset.locked)
    run = dict(preset.run)
    if preset.cuda:
        run["cuda"] = dict(preset.cuda)
    top["run"] = run
    for side in ("a", "b"):
        if getattr(preset, side):
            top[side] = dict(getattr(preset, side))
    top["knob"] = {"name": preset.knob.name, "a": preset.knob.a, "b": preset.knob.b}
    crash: dict[str, Any] = {"mode": preset.crash.mode}
    if preset.crash.expect:
        crash["expect"] = preset.crash.expect
    if preset.crash.wall_step:
        crash["wall_step"] = preset.crash.wall_step
    if preset.crash.window:
        crash["window"] = window_toml(preset.crash.window)
    if preset.crash.restart_ranks:
        crash["restart_ranks"] = preset.crash.restart_ranks
    if preset.crash.offer:
        crash["offer"] = list(preset.crash.offer)
    top["crash"] = crash
    if preset.predict is not None:
        top["predict"] = preset.predict.file_table()
    if preset.one_machine:
        top["one_machine"] = dict(preset.one_machine)
    return dump_toml(top)


# ---------------------------------------------------------------- finding presets


def preset_dirs() -> list[Path]:
    dirs = []
    extra = os.environ.get("CRASHDRILL_PRESETS_DIR")
    if extra:
        dirs.append(Path(extra))
    dirs.append(BUILTIN_DIR)
    return dirs


def list_presets() -> list[Preset]:
    seen: dict[str, Preset] = {}
    for d in preset_dirs():
        for path in sorted(d.glob("*.toml")) if d.is_dir() else []:
            preset = load_preset_file(path)
            seen.setdefault(preset.id, preset)
    return sorted(seen.values(), key=lambda p: (number_key(p.number), p.id))


def number_key(number: str) -> tuple[tuple[int, int | str], ...]:
    """The order of lessons: "1.10" after "1.9", numeric parts compare as numbers (the
    lab's lists and `list_presets` both sort by it)."""
    return tuple((0, int(p)) if p.isascii() and p.isdigit() else (1, p) for p in number.split("."))


def get_preset(name: str) -> Preset:
    """A preset by id, or a TOML file path."""
    if name.endswith(".toml") and Path(name).is_file():
        return load_preset_file(name)
    presets = list_presets()
    for preset in presets:
        if preset.id == name:
            return preset
    known = ", ".join(p.id for p in presets)
    raise PresetError(f"unknown preset {name!r}; known presets: {known}")
