"""The page's run states (web/static/run_states.js) are the server's (server/storage/store.py), as
GET /api/record-kinds serves them, and no other page module spells a group of them again."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from crashdrill.server.api.runs import record_kinds
from crashdrill.server.storage.store import ACTIVE_STATES, LIVE_STATES, RUN_STATES, TERMINAL_STATES

STATIC = Path(__file__).resolve().parents[2] / "web" / "static"
MODULE = STATIC / "run_states.js"
NODE = shutil.which("node")


def page_states() -> dict[str, list[str]]:
    assert NODE is not None
    code = (
        f"import({json.dumps(MODULE.as_uri())}).then((m) => console.log(JSON.stringify("
        "{all: m.ALL, live: [...m.LIVE], active: [...m.ACTIVE], terminal: [...m.TERMINAL]})))"
    )
    out = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    result: dict[str, list[str]] = json.loads(out.stdout)
    return result


def test_the_contract_serves_the_store_s_states() -> None:
    served = record_kinds()["run_states"]
    assert served == {
        "all": list(RUN_STATES),
        "live": list(LIVE_STATES),
        "active": list(ACTIVE_STATES),
        "terminal": list(TERMINAL_STATES),
    }


@pytest.mark.skipif(NODE is None, reason="needs node to run the page's module")
def test_the_page_s_states_are_the_served_ones() -> None:
    assert page_states() == record_kinds()["run_states"]


def test_no_page_module_spells_a_group_of_states_again() -> None:
    # An array literal of state names equal to one of the groups is a copy of it (a subset
    # a module needs for one decision, e.g. running or starting, is not a group).
    groups = [set(g) for g in (LIVE_STATES, ACTIVE_STATES, TERMINAL_STATES)]
    literal = re.compile(r'\[((?:\s*"[a-z]+",?)+)\s*\]')
    copies = [
        f"{p.name}:{n}"
        for p in sorted(STATIC.glob("*.js"))
        if p != MODULE
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        for m in literal.finditer(line)
        if set(re.findall(r'"([a-z]+)"', m.group(1))) in groups
    ]
    assert copies == [], f"import the group from run_states.js instead: {copies}"


def test_the_api_serves_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from crashdrill.server.app import create_app
    from tests.support.lab import stand_in_settings

    with TestClient(create_app(stand_in_settings(tmp_path, monkeypatch, steps=10))) as client:
        served = client.get("/api/record-kinds").json()["run_states"]
    assert served["active"] == list(ACTIVE_STATES)
