"""Where each run trains, in GET /api/pairs/{pair}: this machine on the local executor."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from crashdrill.server.lab import Lab
from crashdrill.server.settings import Settings
from tests.support.lab import stand_in_settings


def test_a_started_run_names_this_machine_as_its_host_and_a_queued_one_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings: Settings = stand_in_settings(tmp_path / "lab", monkeypatch, steps=60)
    lab = Lab(settings, sampler_factory=lambda _s: None)
    try:
        runs = [
            (rid, label, str(settings.runs_dir / rid)) for rid, label in (("r1", "A"), ("r2", "B"))
        ]
        lab.store.create_pair("p1", "owner", "quick", {"knob": {}}, runs)
        lab.store.update_run("r1", state="running")
        view = {r["id"]: r for r in lab.pair("p1", "owner")["runs"]}
        name = socket.gethostname()
        assert view["r1"]["host"] == {"node_id": name, "name": name}
        assert view["r2"]["state"] == "queued" and view["r2"]["host"] is None
    finally:
        lab.close()
