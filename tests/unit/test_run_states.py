"""A run's states have one home (server/storage/store.py RunState and its groups): no module
of the server, in any of its subpackages, spells a state as a string of its own, neither in
SQL nor in Python."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crashdrill.server.storage.store import (
    ACTIVE_STATES,
    LIVE_STATES,
    RUN_STATES,
    TERMINAL_STATES,
    RunState,
    sql_list,
)

SERVER = Path(__file__).resolve().parents[2] / "server"
HOME = SERVER / "storage" / "store.py"

# `state` as a name, a key (`row["state"]`, `"state":`) or a call's result (`.get("state")`),
# then what a literal follows.
_STATE = r"""\bstate\b["'\])]*\s*"""
_QUOTED = re.compile(r"""["'](\w+)["']""")
# One literal: `state == "x"`, `!=`, `state="x"` (a keyword), `"state": "x"`, SQL `state = 'x'`.
_ONE = re.compile(_STATE + r"""(?:==|!=|=|:)\s*["'](\w+)["']""", re.IGNORECASE)
# A group: `state in ("x", "y")`, `not in [...]`, SQL `state IN ('x')`; runs_in(["x"]);
# update_run_if(run_id, "x", ...).
_GROUP = re.compile(
    _STATE + r"(?:not\s+)?in\s*[(\[{]([^)\]}]*)|runs_in\(\s*[(\[{]([^)\]}]*)", re.IGNORECASE
)
_EXPECTED = re.compile(r"""update_run_if\(\s*[^,()]+,\s*["'](\w+)["']""")


def spelled_states(text: str) -> list[str]:
    """Each run state the text spells as a literal where code names a state."""
    found = [m.group(1) for m in _ONE.finditer(text)]
    found += [m.group(1) for m in _EXPECTED.finditer(text)]
    for m in _GROUP.finditer(text):
        found += _QUOTED.findall(m.group(1) or m.group(2) or "")
    return [s for s in found if s in RUN_STATES]


def test_no_server_module_spells_a_state_as_a_literal() -> None:
    found = [
        f"{p.relative_to(SERVER.parent)}: {s!r}"
        for p in sorted(SERVER.rglob("*.py"))
        if p != HOME
        for s in spelled_states(p.read_text(encoding="utf-8"))
    ]
    assert found == [], f"name these from server/storage/store.py's RunState or groups: {found}"


@pytest.mark.parametrize(
    "line",
    [
        'if row["state"] == "queued":',
        'if change.state != "running":',
        'if state in ("starting", "running", "restarting") and ok:',
        'if row.get("state") not in ["finished"]:',
        'store.update_run(run_id, state="failed", ended_at=now)',
        'fields = {"state": "stopped", "ended_at": now}',
        'queued = store.runs_in(["queued"])',
        'store.update_run_if(row["id"], "queued", **fields)',
        "db.run(\"SELECT * FROM runs WHERE state = 'running'\")",
        "db.run(\"SELECT * FROM runs WHERE r.state IN ('queued', 'starting')\")",
    ],
)
def test_each_spelling_of_a_state_is_caught(line: str) -> None:
    assert spelled_states(line) != []


def test_named_states_and_other_words_are_not_caught() -> None:
    text = (
        'if row["state"] == RunState.QUEUED and state in ACTIVE_STATES:\n'
        'store.update_run(run_id, state=RunState.FAILED, stage="train")\n'
        'outage_state = "open"; view = {"state": "open"}\n'
    )
    assert spelled_states(text) == []


def test_the_groups_are_run_states_and_sql_list_refuses_anything_else() -> None:
    assert set(ACTIVE_STATES) <= set(LIVE_STATES) <= set(RUN_STATES)
    assert tuple(RunState) == RUN_STATES  # every state in one group, in the order runs live them
    assert set(LIVE_STATES).isdisjoint(TERMINAL_STATES)
    assert sql_list(LIVE_STATES) == ", ".join(f"'{s}'" for s in LIVE_STATES)
    with pytest.raises(ValueError, match="not run states"):
        sql_list(["runing"])
