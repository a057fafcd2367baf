"""The lab's settings as the environment gives them: every variable the sections declare
(server/settings_sections/), read and parsed into the value of its Settings field, or a
SettingsError naming the variable, its value and what is allowed. `Settings.from_env`
applies them over the defaults; docs/server.md's table lists every variable.

A variable that is empty, or blank where its text is stripped, counts as unset.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

from crashdrill.server.setting_schema import Declared, SettingsError, declared_fields, parse_env
from crashdrill.server.settings_sections import SECTIONS

__all__ = ["SettingsError", "declared_variables", "values_from_env"]


def declared_variables() -> Iterator[tuple[str, str, Declared]]:
    """(variable, Settings field, declaration) of every setting the environment may set."""
    for section in SECTIONS:
        for name, declared in declared_fields(section):
            if declared.env:
                yield declared.env, name, declared


def values_from_env(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """Every setting the environment sets, by Settings field name. A variable its field's
    default reads itself (CRASHDRILL_DATA_DIR, CRASHDRILL_ALLOWED_HOSTS,
    CRASHDRILL_TRAINER_ENV_PASS) is left to it, so that settings built in code read it too."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for variable, name, declared in declared_variables():
        raw = env.get(variable, "")
        parse = declared.parse
        if declared.env_read_by_default or parse is None or not raw:
            continue
        if parse.strip and not raw.strip():
            continue
        values[name] = parse_env(variable, raw, parse)
    return values
