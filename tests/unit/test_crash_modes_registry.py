"""Crash modes and run states have one definition each; the presets' check, the API's
choices, the supervisor's states and the docs are checked against them here, so that a
mode or a state added in its home cannot leave a copy behind."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import get_args

import pytest

from crashdrill.server.api import schemas
from crashdrill.server.storage.store import ACTIVE_STATES, LIVE_STATES, RUN_STATES, TERMINAL_STATES
from crashdrill.trainer import crash_modes
from crashdrill.trainer.crash_modes import CrashModeError, mode_named
from crashdrill.trainer.presets import PresetError, parse_preset_text
from crashdrill.trainer.record_contract import contract_json
from crashdrill.workers.launch import ENDED, State

ROOT = Path(__file__).resolve().parents[2]


def test_the_registry_names_each_mode_once_and_its_default_is_one_of_them():
    assert len(set(crash_modes.NAMES)) == len(crash_modes.NAMES)
    assert crash_modes.DEFAULT in crash_modes.NAMES
    assert crash_modes.NAMES == ("kill", "during_save", "wipe", "host", "rank")
    for mode in crash_modes.MODES:
        assert mode_named(mode.name) is mode and mode.summary
        assert not mode.moves_host or mode.wipes_disk  # a new machine has a new disk


def test_an_unknown_mode_names_itself_and_every_mode_allowed():
    with pytest.raises(CrashModeError, match=r"'explode' is not allowed: one of 'kill', "):
        mode_named("explode")
    with pytest.raises(PresetError, match=r"\[crash\] mode = 'explode'.*'during_save'.*'host'"):
        parse_preset_text(_preset('mode = "explode"'))


def test_every_registered_mode_is_accepted_by_a_preset_and_by_the_api():
    for name in crash_modes.NAMES:
        assert parse_preset_text(_preset(f'mode = "{name}"')).crash.mode == name
    assert list(get_args(schemas.CrashModeName)) == list(crash_modes.NAMES)
    props = schemas.CrashResult.model_json_schema()["properties"]["crash_mode"]
    assert props["enum"] == list(crash_modes.NAMES)
    assert all(m.summary in props["description"] for m in crash_modes.MODES)


def test_a_mode_added_to_the_registry_alone_is_one_the_crash_answer_accepts():
    """A mode added in the registry only (no edit of server/api/schemas.py) must not make the
    crash route's answer fail its own validation (a 500)."""
    script = textwrap.dedent(
        """
        from crashdrill.trainer import crash_modes
        crash_modes.NAMES = (*crash_modes.NAMES, "meteor")
        from crashdrill.server.api.schemas import CrashResult
        body = dict(run="r", killed_pid=1, at_step=3, state="restarting", crash_mode="meteor")
        print(CrashResult.model_validate(body).crash_mode)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "meteor"


def test_the_page_gets_every_mode_and_its_fields_from_the_record_kinds_contract():
    served = contract_json()["crash_modes"]
    assert [m["name"] for m in served] == list(crash_modes.NAMES)
    for mode, out in zip(crash_modes.MODES, served, strict=True):
        assert out == {f.name: getattr(mode, f.name) for f in dataclasses.fields(mode)}
    # The API's answer declares every field of a mode, so a new flag reaches the page.
    flags = set(schemas.CrashModeOut.model_fields)
    assert flags == {f.name for f in dataclasses.fields(crash_modes.CrashMode)}
    assert schemas.RecordKinds.model_validate(contract_json()).crash_modes[1].waits_for_save


# A comparison with a mode's name in a page file: `=== "wipe"`, `"host" !== x`, `case "kill":`,
# or a list of names (`["wipe", "host"].includes(mode)`).
_NAME = "|".join(crash_modes.NAMES)
_COMPARES_A_NAME = re.compile(
    rf"""[=!]==?\s*["']({_NAME})["']|["']({_NAME})["']\s*[=!]==?|case\s+["']({_NAME})["']"""
    rf"""|\[\s*["']({_NAME})["']\s*,[^\]]*\]\s*\.\s*includes"""
)


def test_no_page_file_compares_a_crash_mode_name():
    """The page acts on a mode's fields (waits_for_save, wipes_disk, moves_host) from GET
    /api/record-kinds, never on its name: a renamed or added mode needs no page edit."""
    pages = [*(ROOT / "web" / "static").glob("*.js"), *(ROOT / "web" / "templates").glob("*")]
    assert len(pages) > 10 and any(p.name == "cards.js" for p in pages)  # the walk works
    for page in pages:
        found = _COMPARES_A_NAME.search(page.read_text(encoding="utf-8"))
        assert found is None, f"{page.name} compares a crash mode's name: {found.group(0)!r}"
    assert _COMPARES_A_NAME.search('preset?.crash?.mode === "during_save"')  # it can fail
    assert _COMPARES_A_NAME.search('["wipe", "host"].includes(mode)')


def test_run_states_have_one_definition_that_the_api_and_the_supervisor_agree_with():
    assert ("queued", *ACTIVE_STATES, *TERMINAL_STATES) == RUN_STATES
    assert ("queued", *ACTIVE_STATES) == LIVE_STATES
    assert list(get_args(schemas.RunState)) == list(RUN_STATES)
    state = schemas.StopResult.model_json_schema()["properties"]["state"]
    assert state["enum"] == list(RUN_STATES)
    # Every state a supervisor reports is a run state, and the ended ones are terminal.
    assert set(get_args(State)) <= set(RUN_STATES)
    assert set(ENDED) == set(TERMINAL_STATES) == set(get_args(State)) - set(ACTIVE_STATES)


def test_docs_list_the_registered_crash_modes_in_their_order():
    presets_md = (ROOT / "docs" / "presets.md").read_text()
    rows = presets_md.split("| mode | what Crash test does |\n|---|---|\n", 1)[1].split("\n\n")[0]
    table = re.findall(r"^\| `(\w+)` \|", rows, flags=re.MULTILINE)
    assert tuple(table) == crash_modes.NAMES, "docs/presets.md's table of crash modes"
    (choices,) = re.findall(r"^mode = \"\w+\" +# (.+)$", presets_md, flags=re.MULTILINE)
    listed = tuple(w.split()[0] for w in choices.split(" | "))
    assert listed == crash_modes.NAMES, "docs/presets.md's example [crash] table"
    readme = (ROOT / "README.md").read_text()
    lessons = readme[readme.index("## Lessons") :].split("\n\n")[1]
    said = tuple(re.findall(r"`(\w+)` \(", lessons))
    assert said == crash_modes.NAMES, "README.md's Lessons paragraph"


def test_docs_list_the_run_states():
    server_md = (ROOT / "docs" / "server.md").read_text()
    (line,) = re.findall(r"Run `state`: `([^`]+)`", server_md)
    assert tuple(re.findall(r"\w+", line)) == RUN_STATES


def _preset(crash_line: str) -> str:
    return textwrap.dedent(
        f"""
        id = "crash-check"
        title = "crash check"
        [run]
        steps = 20
        ckpt_every = 10
        [knob]
        name = "ckpt_every"
        a = 5
        b = 10
        [crash]
        {crash_line}
        """
    )
