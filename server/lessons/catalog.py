"""The lessons the lab offers: built-in presets (read-only, with any CRASHDRILL_PRESETS_DIR)
and instructor presets, TOML files in `settings.instructor_presets_dir` that an instructor
creates, edits, duplicates, locks and publishes through /api/instructor.

Who sees which lesson (published or not) and what a student may change in it is the
lesson policy's (server/lessons/policy.py). An instructor preset is one file, `<id>.toml`;
the lab rewrites its top-level keys (`published`, `locked`, a copy's `id` and `title`) with
tomlkit, which keeps every comment and the layout as the instructor wrote them.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tomlkit
from starlette.convertors import Convertor
from tomlkit.exceptions import TOMLKitError

from crashdrill.server.errors import BadInput, Conflict, Forbidden, NotFound
from crashdrill.server.lessons.policy import locked_names, student_overrides_allowed, visible_to
from crashdrill.trainer.corpus_files import CorpusPathError, corpus_file
from crashdrill.trainer.presets import (
    Preset,
    PresetError,
    list_presets,
    locked_problems,
    number_key,
    parse_preset_text,
    preset_dirs,
)

log = logging.getLogger(__name__)

Origin = Literal["builtin", "instructor"]
ID_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ID_ALLOWED = "1–64 letters, digits, '.', '_' or '-', starting with a letter or digit"
# Words after /api/instructor/presets/ that are routes of their own, never a preset's id.
RESERVED_IDS = ("validate",)
MAX_TEXT = 32 * 1024


@dataclass(frozen=True)
class Lesson:
    """A preset and where it came from."""

    preset: Preset
    origin: Origin
    path: Path | None  # the file (None for a built-in read from the package)
    text: str

    @property
    def published(self) -> bool:
        return bool(self.preset.published)

    def summary(self) -> dict[str, Any]:
        p = self.preset
        return {
            "id": p.id,
            "number": p.number,
            "title": p.title,
            "origin": self.origin,
            "editable": self.origin == "instructor",
            "published": self.published,
            "locked": sorted(locked_names(p)),
            "student_adjustable": sorted(student_overrides_allowed(p)),
            "knob_text": p.knob_text(),
            "predict": p.predict.question if p.predict is not None else None,
        }


def parse_text(text: str, source: str = "the preset") -> Preset:
    """A preset from TOML text; PresetError names the field, the value and what is allowed."""
    if len(text) > MAX_TEXT:
        raise PresetError(f"{source}: {len(text)} characters; at most {MAX_TEXT}")
    preset = parse_preset_text(text, source=source)
    problem = id_problem(preset.id)
    if problem is not None:
        raise PresetError(f"{source}: id = {preset.id!r}: {problem}")
    return preset


def id_problem(preset_id: str) -> str | None:
    """Why `preset_id` cannot be a preset's id; None when it can."""
    if preset_id in RESERVED_IDS:
        return f"reserved (POST /api/instructor/presets/{preset_id} is a route); choose another"
    if not ID_RULE.match(preset_id):
        return ID_ALLOWED
    return None


class PresetIdConvertor(Convertor[str]):
    """`{preset:preset_id}` in a route: a path segment, but never a reserved word, so that
    /api/instructor/presets/validate is its own route's alone (a 405 there names POST)."""

    regex = "(?!(?:" + "|".join(map(re.escape, RESERVED_IDS)) + ")(?:/|$))[^/]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


def corpus_problems(preset: Preset, corpora_dir: Path) -> list[str]:
    """Why the preset's `file:` corpora (any run, CPU or CUDA) may not be read: each one
    must be a regular file inside `corpora_dir` (trainer/corpus_files.py's rule)."""
    sources: set[str] = set()
    for label in ("A", "B"):
        for cuda in (False, True):
            try:
                sources.add(preset.config_for(label, cuda=cuda).data)
            except (ValueError, TypeError):
                continue  # the preset's own validation names that problem
    problems = []
    for source in sorted(s for s in sources if s.startswith("file:")):
        try:
            corpus_file(source, corpora_dir)
        except CorpusPathError as e:
            problems.append(str(e))
    return problems


def check_corpora(preset: Preset, corpora_dir: Path) -> None:
    """422 naming the `data` value when a `file:` corpus is outside `corpora_dir`."""
    problems = corpus_problems(preset, corpora_dir)
    if problems:
        raise BadInput(f"{preset.id}: " + "; ".join(problems))


class Catalog:
    def __init__(self, directory: Path, corpora_dir: Path | None = None) -> None:
        self.directory = directory
        self.corpora_dir = corpora_dir  # None: `file:` corpora are not checked here
        self._cache: tuple[tuple[object, ...], dict[str, Lesson]] | None = None

    # ---- reading ----------------------------------------------------------------------

    def lessons(self) -> dict[str, Lesson]:
        """Every lesson by id: built-ins first (an instructor file never shadows one).
        Read again only when a preset file or directory changed (mtime, size, names)."""
        key = self._files_signature()
        cached = self._cache
        if cached is not None and cached[0] == key:
            return dict(cached[1])
        lessons = self._read_lessons()
        self._cache = (key, lessons)
        return dict(lessons)

    def _files_signature(self) -> tuple[object, ...]:
        """What changes when any preset file is added, removed, renamed or rewritten: each
        directory's mtime and every TOML file's name, mtime and size (a stat each, no read)."""
        parts: list[object] = []
        for d in [*preset_dirs(), self.directory]:
            try:
                entries = sorted(
                    (e.name, e.stat().st_mtime_ns, e.stat().st_size)
                    for e in os.scandir(d)
                    if e.name.endswith(".toml")
                )
                parts.append((str(d), os.stat(d).st_mtime_ns, tuple(entries)))
            except OSError:
                parts.append((str(d), None))
        return tuple(parts)

    def _read_lessons(self) -> dict[str, Lesson]:
        out: dict[str, Lesson] = {}
        try:
            builtins = list_presets()
        except PresetError as e:
            raise BadInput(f"the lesson presets cannot be read: {e}") from None
        for preset in builtins:
            path = Path(preset.source) if preset.source else None
            text = _read(path) if path else ""
            out[preset.id] = Lesson(preset, "builtin", path, text)
        for lesson in self._instructor_lessons():
            out.setdefault(lesson.preset.id, lesson)
        return out

    def _instructor_lessons(self) -> list[Lesson]:
        found = []
        for path in sorted(self.directory.glob("*.toml")) if self.directory.is_dir() else []:
            try:
                text = path.read_text(encoding="utf-8")
                preset = parse_text(text, source=path.name)
            except (OSError, UnicodeDecodeError, PresetError) as e:
                log.warning("skipping the instructor preset %s: %s", path, e)
                continue
            if preset.id != path.stem:
                log.warning("skipping %s: its id %r differs from its file name", path, preset.id)
                continue
            found.append(Lesson(preset, "instructor", path, text))
        return found

    def get(self, preset_id: str, *, instructor: bool) -> Lesson:
        """A lesson a student may start (published), or any for an instructor; else 404."""
        lessons = self.lessons()
        lesson = lessons.get(preset_id)
        if lesson is None or not visible_to(lesson.preset, instructor=instructor):
            known = ", ".join(
                sorted(k for k, x in lessons.items() if visible_to(x.preset, instructor=instructor))
            )
            raise NotFound(
                f"unknown preset {preset_id!r} (or not published); known presets: {known}"
            )
        return lesson

    def visible(self, *, instructor: bool) -> list[Lesson]:
        lessons = self.lessons().values()
        shown = [x for x in lessons if visible_to(x.preset, instructor=instructor)]
        return sorted(shown, key=lambda x: (number_key(x.preset.number), x.preset.id))

    # ---- writing (instructor presets only) --------------------------------------------

    def create(self, text: str) -> Lesson:
        """A new instructor preset; unpublished unless its text says `published = true`."""
        preset = self.checked(text)
        if preset.id in self.lessons():
            raise Conflict(f"a preset with id {preset.id!r} exists already: choose another id")
        if "published" not in tomllib.loads(text):
            text = set_top_level(text, "published", False)
        return self._write(preset.id, text)

    def update(self, preset_id: str, text: str) -> Lesson:
        self._editable(preset_id)
        preset = self.checked(text)
        if preset.id != preset_id:
            raise BadInput(
                f"id = {preset.id!r}: the text must keep the id {preset_id!r} (duplicate the"
                " preset to give it another id)"
            )
        return self._write(preset_id, text)

    def duplicate(self, preset_id: str, new_id: str | None) -> Lesson:
        source = self.get(preset_id, instructor=True)
        taken = self.lessons()
        if new_id is None:
            new_id = f"{preset_id}-copy"
            n = 2
            while new_id in taken:
                new_id, n = f"{preset_id}-copy{n}", n + 1
        elif new_id in taken:
            raise Conflict(f"a preset with id {new_id!r} exists already: choose another id")
        problem = id_problem(new_id)
        if problem is not None:
            raise BadInput(f"new_id = {new_id!r}: {problem}")
        header = f"# Duplicated from {preset_id!r} ({source.origin}).\n"
        text = set_top_level(source.text, "id", new_id)
        if source.preset.number:
            # Its own number, right after the source's in the picker: never two lessons
            # that a student reads as the same number.
            numbers = {lesson.preset.number for lesson in taken.values()}
            text = set_top_level(text, "number", fresh_number(source.preset.number, numbers))
        text = set_top_level(text, "published", False)
        text = set_top_level(text, "title", f"{source.preset.title} ({new_id})")
        return self._write(new_id, header + text)

    def set_published(self, preset_id: str, published: bool) -> Lesson:
        lesson = self._editable(preset_id)
        return self._write(preset_id, set_top_level(lesson.text, "published", published))

    def set_locked(self, preset_id: str, locked: list[str]) -> Lesson:
        lesson = self._editable(preset_id)
        problems = locked_problems(locked)
        if problems:
            raise BadInput("; ".join(problems))
        text = set_top_level(lesson.text, "locked", sorted(set(locked)))
        self.checked(text)  # the preset's own rules say which names may be locked
        return self._write(preset_id, text)

    def delete(self, preset_id: str) -> None:
        lesson = self._editable(preset_id)
        assert lesson.path is not None
        lesson.path.unlink(missing_ok=True)

    def checked(self, text: str) -> Preset:
        """The preset in `text`, or 422 naming the field, the value and what is allowed
        (its `file:` corpora included)."""
        try:
            preset = parse_text(text)
        except PresetError as e:
            raise BadInput(str(e)) from None
        if self.corpora_dir is not None:
            check_corpora(preset, self.corpora_dir)
        return preset

    def _editable(self, preset_id: str) -> Lesson:
        lesson = self.get(preset_id, instructor=True)
        if lesson.origin != "instructor":
            raise Forbidden(
                f"{preset_id!r} is a built-in preset and read-only: duplicate it to change it"
            )
        return lesson

    def _write(self, preset_id: str, text: str) -> Lesson:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{preset_id}.toml"
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{preset_id}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text if text.endswith("\n") else text + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return Lesson(
            parse_text(path.read_text(encoding="utf-8"), path.name), "instructor", path, text
        )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def set_top_level(text: str, key: str, value: bool | str | list[str]) -> str:
    """`text` with its top-level `key` set to `value` (added before the first table when it
    is missing), every comment and line around it kept as written: tomlkit edits the
    document, so a quoted key (`"published" = false`), a multi-line string holding a line
    that starts with `[`, or a value spanning lines are all found as TOML reads them."""
    try:
        document = tomlkit.parse(text)
        document[key] = value
        result = tomlkit.dumps(document)
    except TOMLKitError as e:
        raise BadInput(f"the preset text is not valid TOML ({e}): fix it in the editor") from None
    if tomllib.loads(result).get(key) != value:
        raise BadInput(f"could not set {key} in the preset text: fix the file by hand")
    return result


def fresh_number(number: str, taken: set[str]) -> str:
    """A lesson number no lesson has yet, sorting right after `number`: "0.1" → "0.1.1"
    (or "0.1.2" when that is taken, …)."""
    n = 1
    while f"{number}.{n}" in taken:
        n += 1
    return f"{number}.{n}"
