"""How one lab setting is declared: the environment variable and `crashdrill serve` flag
that set it, how their text is read, the values allowed, and its row in docs/server.md.

    port: int = setting(8000, flag="--port", parse=WHOLE, allowed=between(1, 65535),
                        what="port to listen on")

The settings themselves are declared once, in sections, in server/settings_sections/;
server/settings_env.py, server/serve_cli.py and server/settings_doc.py read every variable, flag
and table row from these declarations, so no second list can drift from the first.

Why not pydantic-settings (issue 36 asked to use it or say why not): it would derive the
environment variables and validation, but not the rest of what one declaration here gives,
so each setting would still carry this metadata beside it, in pydantic's terms:
- the `crashdrill serve` flags stay argparse's (`--help` grouped by section, exit 2 with
  "argument --port: 'x': a whole number"); pydantic-settings' CLI source is a second parser
  with its own usage text, and the drill's and the trainer's CLIs are argparse too;
- the names are not one prefix plus the field (SUPABASE_URL,
  CRASHDRILL_INSTRUCTOR_PRESETS_DIR for `presets_dir`), and three variables are read by
  their field's default so that settings built in code read them too
  (`env_read_by_default`): an alias or a custom source each;
- the texts are the lab's: 500M and 20GiB sizes, switches, blank-as-unset, a secret never
  stripped (custom validators each), and an error that names the setting, its value, what
  is allowed and how it is set in one sentence, not a ValidationError list;
- docs/server.md's table (what, default as written, how to set, other variables a module
  reads) comes from the same declaration;
- Settings is a frozen dataclass that reaches the workers' executors (`from_settings`);
  STYLE keeps pydantic at the server's edge (the API's bodies), and this needs no new
  dependency. The declaration here is about 200 lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class SettingsError(ValueError):
    """A setting with a value that cannot work; the message names it."""


@dataclass(frozen=True)
class Parse:
    """How the text of a variable or flag becomes a value; `kind` says what is allowed."""

    kind: str
    convert: Callable[[str], object]
    strip: bool = True  # surrounding blanks dropped first; a blank value counts as unset


_SUFFIXES = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _size(text: str) -> int:
    """A whole number, optionally with a binary suffix: 500M, 20G (also 20GiB)."""
    raw = text.lower().removesuffix("ib").removesuffix("b")
    scale = _SUFFIXES.get(raw[-1:], 1)
    return int(float(raw[:-1] if scale > 1 else raw) * scale)


def _switch(text: str) -> bool:
    raw = text.lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def names(text: str) -> tuple[str, ...]:
    """Names separated by commas or spaces."""
    return tuple(text.replace(",", " ").split())


WHOLE = Parse("a whole number", int)
NUMBER = Parse("a number", float)
SWITCH = Parse("1, true, yes, on or 0, false, no, off", _switch)
SIZE = Parse("a whole number, optionally with K, M, G or T", _size)
NAMES = Parse("names, separated by commas or spaces", names)
COMMAND = Parse("a command line", lambda text: tuple(shlex.split(text)))
PATH = Parse("a path", lambda text: Path(text).expanduser())
TEXT = Parse("text", str)
SECRET = Parse("text", str, strip=False)  # a token of blanks is refused, never taken as unset


@dataclass(frozen=True)
class Allowed:
    """The values a setting may take, and the words an error gives for them."""

    text: str
    holds: Callable[[Any], bool]


def _shown(x: float) -> str:
    """1000000 as 1000000, not 1e+06; 0.5 as 0.5."""
    return f"{int(x)}" if float(x).is_integer() else f"{x}"


def between(low: float, high: float, text: str | None = None) -> Allowed:
    """low ≤ value ≤ high (NaN is outside)."""
    return Allowed(text or f"{_shown(low)} to {_shown(high)}", lambda v: low <= v <= high)


def at_least(low: float, text: str | None = None) -> Allowed:
    """value ≥ low (NaN is outside)."""
    return Allowed(text or f"a whole number ≥ {_shown(low)}", lambda v: v >= low)


def above(low: float, text: str) -> Allowed:
    """value > low, finite (NaN and infinity are outside)."""
    return Allowed(text, lambda v: v > low and math.isfinite(v))


@dataclass(frozen=True)
class Declared:
    """What one setting is, besides its name, type and default."""

    what: str  # docs/server.md's "what"
    default_text: str  # docs/server.md's "default"
    parse: Parse | None
    env: str | None
    flag: str | None
    metavar: str | None
    help: str | None  # the flag's help; `what` when None
    allowed: Allowed | None
    how_note: str  # more words for docs/server.md's "how to set"
    env_read_by_default: bool  # the default factory reads `env` (so code-built settings do too)

    def ways(self) -> str:
        """How to set it, as an error names it: '--port', 'CRASHDRILL_MIRROR', or both."""
        return ", ".join(w for w in (self.flag, self.env) if w)


def setting(
    default: Any = dataclasses.MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    what: str,
    default_text: str | None = None,
    parse: Parse | None = None,
    env: str | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    help: str | None = None,
    allowed: Allowed | None = None,
    how_note: str = "",
    env_read_by_default: bool = False,
    secret: bool = False,
) -> Any:
    """A dataclass field that carries its declaration; `secret` keeps it out of repr."""
    if (env or flag) and parse is None:
        raise TypeError(f"a setting set by {env or flag} needs a parse")
    declared = Declared(
        what=what,
        default_text=default_text if default_text is not None else f"{default}",
        parse=parse,
        env=env,
        flag=flag,
        metavar=metavar,
        help=help,
        allowed=allowed,
        how_note=how_note,
        env_read_by_default=env_read_by_default,
    )
    metadata = {"declared": declared}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata, repr=not secret)
    return dataclasses.field(default=default, metadata=metadata, repr=not secret)


def declared_fields(section: type) -> Iterator[tuple[str, Declared]]:
    """(field name, declaration) of every setting a section (or the flat view) declares."""
    for f in dataclasses.fields(section):
        if "declared" in f.metadata:
            yield f.name, f.metadata["declared"]


def parse_env(variable: str, raw: str, parse: Parse) -> object:
    """The value of an environment variable, or a SettingsError naming it, its text and
    what is allowed."""
    try:
        return parse.convert(raw.strip() if parse.strip else raw)
    except ValueError:
        raise SettingsError(f"{variable} = {raw!r}: {parse.kind}") from None


def flag_type(parse: Parse) -> Callable[[str], object]:
    """An argparse `type` that reads a flag as the variable is read; argparse then exits 2
    with 'argument --port: 'x': a whole number'."""

    def convert(raw: str) -> object:
        try:
            return parse.convert(raw.strip() if parse.strip else raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r}: {parse.kind}") from None

    return convert


def check_allowed(settings: object) -> None:
    """Every declared setting within its allowed values, or a SettingsError naming the
    first one outside, its value, what is allowed and how it is set. None is left alone:
    it means 'from this machine' or 'off'."""
    for name, declared in declared_fields(type(settings)):
        value = getattr(settings, name)
        if declared.allowed is None or value is None or declared.allowed.holds(value):
            continue
        shown = repr(value) if isinstance(value, str) else f"{value}"
        ways = f" ({declared.ways()})" if declared.ways() else ""
        raise SettingsError(f"{name} = {shown}: {declared.allowed.text}{ways}")


GIB = 1024**3
SECONDS_OFF = at_least(0, "seconds ≥ 0 (0: off)")
WHOLE_OR_OFF = at_least(0, "a whole number ≥ 0 (0: no limit)")


def other_variables(*rows: tuple[str, str, str, str]) -> tuple[tuple[str, str, str, str], ...]:
    """A section's OTHER_VARIABLES: variables other modules read, listed in its table all
    the same, as (name, default, how to set, what). Typed here, as the class attribute
    cannot be annotated: the dataclass would take it for a setting."""
    return rows
