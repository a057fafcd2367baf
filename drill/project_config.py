"""`[tool.crashdrill]` in a project's pyproject.toml: the drill's options, so that
`crashdrill verify` alone drills the project's script.

    [tool.crashdrill]
    command = "{python} train.py --out {ckpt_dir}"    # or a list of words
    resume-args = "--resume"
    kills = 3
    timeout = 300

Every key is a `crashdrill verify` option, spelled as its long flag without the dashes
(`loss-regex`, `resume-args-always`; `loss_regex` works too), plus `command` for
`-- COMMAND…`. The keys come from the verify parser itself (`options(parser)`), so a new
option is a key at once. A flag on the command line wins over the table; a COMMAND or
`--preset` on the command line replaces the table's target (its `command` / `preset`).

The table is looked for in the nearest pyproject.toml, from the current directory
upward, that has one. Its `command` runs in that file's directory, and relative paths in
it (`json`, `junit`, `work-dir`) are relative to that directory too. An unknown key or a
value of the wrong type is a ConfigFileError naming the key and what is allowed
(`crashdrill verify` exits 2).
"""

from __future__ import annotations

import argparse
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TABLE = "tool.crashdrill"
PATH_KEYS = ("json", "junit", "work_dir")  # relative to the pyproject's directory
TOML_TYPES = {"str": "string", "int": "integer", "float": "float", "bool": "boolean",
              "list": "list", "dict": "table", "datetime": "date-time"}  # fmt: skip


class ConfigFileError(ValueError):
    """A [tool.crashdrill] table that cannot be used: the message names the key."""


class Unset:
    """An option's default, marked so that a value given on the command line (even one
    equal to the default) is told apart from one that was not."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Option:
    dest: str
    key: str  # the TOML spelling: the long flag without its dashes
    kind: str  # bool, int, float, str, list, words (a string split like a shell, or a list)
    choices: tuple[str, ...] | None = None

    def allowed(self) -> str:
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        return {
            "bool": "true or false",
            "int": "a whole number",
            "float": "a number",
            "str": "a string",
            "list": "a list of strings (or one string)",
            "words": "a string (split like a shell) or a list of strings",
        }[self.kind]


def mark_defaults(parser: argparse.ArgumentParser) -> None:
    """Wrap every option's default in Unset (after the parser is configured)."""
    for action in parser._actions:
        if action.dest != "help" and not isinstance(action, argparse._AppendAction):
            action.default = Unset(action.default)


def options(parser: argparse.ArgumentParser) -> dict[str, Option]:
    """The keys a table may hold: one per option of the parser, and `command`."""
    out: dict[str, Option] = {}
    for a in parser._actions:
        if a.dest in ("help", "print_config"):
            continue
        if not a.option_strings:
            out["command"] = Option(a.dest, "command", "words")
            continue
        long = next((s for s in a.option_strings if s.startswith("--")), a.option_strings[0])
        if isinstance(a, argparse._StoreTrueAction):
            kind = "bool"
        elif isinstance(a, argparse._AppendAction):
            kind = "list"
        elif a.type is int:
            kind = "int"
        elif a.type is float:
            kind = "float"
        elif a.dest == "resume_args":
            kind = "words"
        else:
            kind = "str"
        choices = tuple(str(c) for c in a.choices) if a.choices else None
        key = long.lstrip("-")
        out[key] = Option(a.dest, key, kind, choices)
    return out


@dataclass
class ProjectConfig:
    path: Path | None  # the pyproject.toml read; None: none found
    values: dict[str, Any] = field(default_factory=dict)  # dest → value, checked

    @property
    def where(self) -> str:
        return f"{self.path} [{TABLE}]"


def find(start: Path | None = None) -> Path | None:
    """The nearest pyproject.toml from `start` (the cwd) upward with a [tool.crashdrill]."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        candidate = d / "pyproject.toml"
        if not candidate.is_file():
            continue
        try:
            text = candidate.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "crashdrill" in text and "crashdrill" in _read(candidate).get("tool", {}):
            return candidate  # (a pyproject that never names us is not even parsed)
    return None


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigFileError(f"{path}: not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigFileError(f"{path}: cannot be read: {e.strerror or e}") from None


def load(known: dict[str, Option], start: Path | None = None) -> ProjectConfig:
    """The table of the nearest pyproject.toml that has one, checked against `known`
    (options(parser)). Raises ConfigFileError."""
    path = find(start)
    if path is None:
        return ProjectConfig(None)
    table = _read(path)["tool"]["crashdrill"]
    where = f"{path} [{TABLE}]"
    if not isinstance(table, dict):
        raise ConfigFileError(f"{where}: must be a table of options, not {type(table).__name__}")
    values: dict[str, Any] = {}
    for raw_key, value in table.items():
        opt = known.get(raw_key) or known.get(raw_key.replace("_", "-"))
        if opt is None:
            raise ConfigFileError(
                f"{where}: unknown key {raw_key!r}; allowed: {', '.join(sorted(known))}"
            )
        values[opt.dest] = _check(where, opt, value, path.parent)
    return ProjectConfig(path, values)


def _check(where: str, opt: Option, value: Any, base: Path) -> Any:
    def bad() -> ConfigFileError:
        got = TOML_TYPES.get(type(value).__name__, type(value).__name__)
        article = "an" if got[0] in "aeiou" else "a"
        what = f" is {article} {got}" if not (opt.choices and isinstance(value, str)) else ""
        return ConfigFileError(
            f"{where}: {opt.key} = {value!r}{what}; {opt.key} must be {opt.allowed()}"
        )

    if opt.kind == "bool":
        if not isinstance(value, bool):
            raise bad()
        return value
    if opt.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if opt.kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad()
        return float(value)
    if opt.kind in ("list", "words"):
        if isinstance(value, str):
            value = shlex.split(value) if opt.kind == "words" else [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad()
        if opt.dest == "resume_args":
            return shlex.join(value)  # the CLI's form: one string, split at use
        return list(value)
    if not isinstance(value, str):
        raise bad()
    if opt.choices and value not in opt.choices:
        raise bad()
    if opt.dest in PATH_KEYS and value != "-":
        return str(base / value)
    return value


def resolve(
    args: argparse.Namespace,
    config: ProjectConfig,
    known: dict[str, Option],
    command_only: tuple[str, ...] = (),
    preset_only: tuple[str, ...] = (),
) -> dict[str, str]:
    """Fill `args` in place: the command line first, then the table, then the default.
    Returns where each option's value came from: "command line", the table, "default"."""
    dests = [o.dest for o in known.values()]
    given = {k for k in dests if not isinstance(getattr(args, k, None), Unset | None)}
    if "script" in given and not args.script:
        given.discard("script")
    table = dict(config.values)
    if {"preset", "script"} & given:  # the command line chose the target
        table.pop("preset", None)
        table.pop("script", None)
    preset = "preset" in given or "preset" in table
    for k in command_only if preset else preset_only:
        table.pop(k, None)  # options of the other kind of target: not used
    source: dict[str, str] = {}
    for k in dests:
        v = getattr(args, k, None)
        if k in given:
            source[k] = "command line"
        elif k in table:
            setattr(args, k, table[k])
            source[k] = config.where
        else:
            setattr(args, k, v.value if isinstance(v, Unset) else v)
            source[k] = "default"
    for k, v in vars(args).items():  # options that are not keys (--print-config)
        if isinstance(v, Unset):
            setattr(args, k, v.value)
    return source


def effective(args: argparse.Namespace, known: dict[str, Option], source: dict[str, str]) -> str:
    """The configuration in effect, one option a line, with where its value came from."""
    lines = []
    for key, opt in sorted(known.items(), key=lambda kv: kv[0] != "command"):
        value = getattr(args, opt.dest, None)
        shown = "(none)" if value is None or value == [] else _toml(value)
        if opt.dest == "seed" and value is None:
            shown = "(drawn at random, printed in the report)"
        lines.append(f"  {key:<20} {shown:<40} {source.get(opt.dest, 'default')}")
    return "\n".join(lines)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json_str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def json_str(text: str) -> str:
    import json

    return json.dumps(text, ensure_ascii=False)
