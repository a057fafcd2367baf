"""Lesson presets: a TOML file per lesson, with the shared run config and the one knob
that differs between run A and run B.

    id = "lesson-1.7"          # how users name it
    number, chapter, title, question, whats_happening, what_to_watch   # lesson text
    [run]        shared TrainConfig values
    [run.cuda]   overrides applied when the run executes on CUDA
    [knob]       name = "ckpt_every", a = 100, b = 1000

Built-ins ship in `presets/` beside this file; an instructor's directory can be added with
CRASHDRILL_PRESETS_DIR (searched first).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashdrill.trainer.config import ConfigError, TrainConfig

BUILTIN_DIR = Path(__file__).with_name("presets")
_TEXT_FIELDS = ("number", "chapter", "title", "question", "whats_happening", "what_to_watch")
_TOP_LEVEL = {"id", *_TEXT_FIELDS, "run", "knob"}
LABELS = ("A", "B")


class PresetError(ValueError):
    """A preset that cannot be used: names the file, the field and what is allowed."""


@dataclass(frozen=True)
class Knob:
    name: str
    a: Any
    b: Any

    def value_for(self, label: str) -> Any:
        return self.a if label == "A" else self.b


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
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def config_for(self, label: str = "A", *, cuda: bool = False) -> TrainConfig:
        """The TrainConfig of run `label` ("A" or "B")."""
        if label not in LABELS:
            raise PresetError(f"run label {label!r} is not allowed: use A or B")
        values = dict(self.run)
        if cuda:
            values.update(self.cuda)
        values[self.knob.name] = self.knob.value_for(label)
        return TrainConfig.from_dict(values)

    def knob_text(self) -> str:
        return f"{self.knob.name}: A {self.knob.a} vs B {self.knob.b}"

    def to_public(self) -> dict[str, Any]:
        """What a page needs to show the lesson (no file paths)."""
        d = dataclasses.asdict(self)
        d.pop("source")
        d.pop("extra")
        d["knob_text"] = self.knob_text()
        return d


def parse_preset(data: dict[str, Any], source: str = "<memory>") -> Preset:
    """Validate a preset's parsed TOML; errors name the field and the allowed values."""
    unknown = sorted(set(data) - _TOP_LEVEL)
    if unknown:
        raise PresetError(
            f"{source}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(_TOP_LEVEL))}"
        )
    pid = data.get("id")
    if not isinstance(pid, str) or not pid or any(c.isspace() or c == "/" for c in pid):
        raise PresetError(f"{source}: id = {pid!r}: a non-empty name without spaces or '/'")
    text = {}
    for name in _TEXT_FIELDS:
        value = data.get(name, "")
        if not isinstance(value, str):
            raise PresetError(f"{source}: {name} = {value!r}: must be text")
        text[name] = value
    if not text["title"]:
        raise PresetError(f"{source}: title is missing: every lesson needs a title")
    run = dict(data.get("run", {}))
    cuda = run.pop("cuda", {})
    if not isinstance(cuda, dict):
        raise PresetError(f"{source}: [run.cuda] must be a table of settings")
    knob_data = data.get("knob")
    if not isinstance(knob_data, dict) or set(knob_data) != {"name", "a", "b"}:
        raise PresetError(
            f"{source}: [knob] needs exactly name, a and b (the one setting that differs)"
        )
    knob = Knob(str(knob_data["name"]), knob_data["a"], knob_data["b"])
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"extra"}
    if knob.name not in fields:
        raise PresetError(f"{source}: knob.name = {knob.name!r} is not a run setting")
    if knob.a == knob.b:
        raise PresetError(f"{source}: knob {knob.name}: a and b are both {knob.a!r}")
    preset = Preset(id=pid, run=run, cuda=cuda, knob=knob, source=source, **text)
    for label in LABELS:
        for on_cuda in (False, True):
            try:
                preset.config_for(label, cuda=on_cuda)
            except ConfigError as e:
                where = "[run.cuda]" if on_cuda and e.field in cuda else "[run]"
                if e.field == knob.name:
                    where = f"[knob] {label.lower()}"
                raise PresetError(f"{source}: {where} {e}") from None
    return preset


def load_preset_file(path: str | Path) -> Preset:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PresetError(f"{path}: no such preset file") from None
    except tomllib.TOMLDecodeError as e:
        raise PresetError(f"{path}: not valid TOML: {e}") from None
    return parse_preset(data, source=str(path))


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
    return sorted(seen.values(), key=lambda p: (p.number, p.id))


def get_preset(name: str) -> Preset:
    """A preset by id, or a TOML file path."""
    if name.endswith(".toml") and Path(name).is_file():
        return load_preset_file(name)
    for preset in list_presets():
        if preset.id == name:
            return preset
    known = ", ".join(p.id for p in list_presets())
    raise PresetError(f"unknown preset {name!r}; known presets: {known}")
