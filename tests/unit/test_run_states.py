"""A run's states have one home (server/storage/store.py RUN_STATES and its groups): no query of the
server spells a state as an SQL literal of its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crashdrill.server.storage.store import ACTIVE_STATES, LIVE_STATES, RUN_STATES, sql_list

SERVER = Path(__file__).resolve().parents[2] / "server"


def test_no_server_query_spells_a_state_as_a_literal() -> None:
    literal = re.compile(r"state\s*(?:=|IN\s*\()\s*'(\w+)'", re.I)
    found = {
        f"{p.name}: {m.group(0)}"
        for p in SERVER.glob("*.py")
        for m in literal.finditer(p.read_text())
    }
    assert not found, f"use the states of server/storage/store.py (sql_list): {sorted(found)}"


def test_the_groups_are_run_states_and_sql_list_refuses_anything_else() -> None:
    assert set(ACTIVE_STATES) <= set(LIVE_STATES) <= set(RUN_STATES)
    assert sql_list(LIVE_STATES) == ", ".join(f"'{s}'" for s in LIVE_STATES)
    with pytest.raises(ValueError, match="not run states"):
        sql_list(["runing"])
