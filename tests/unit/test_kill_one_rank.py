"""Crash test's "kill one rank" (#34 §2): a lesson of several ranks whose [crash] mode is
"kill" may offer "rank" through its preset's `[crash] offer`; a crash test then asks for it
with `crash_mode` (POST /api/runs/{run}/crash), and the lab refuses a mode its lesson does
not offer, naming what it does (server/lessons/crash_effects.py `chosen_mode`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from crashdrill.server.errors import BadInput, Conflict
from crashdrill.server.lessons.crash_effects import chosen_mode, offered_modes
from crashdrill.server.lessons.policy import public_view
from crashdrill.trainer.presets import PresetError, dump_preset, get_preset, parse_preset_text
from tests.support.lab import stand_in_settings
from tests.unit.test_server_pending_kill import (
    RUN,
    FakeSupervisor,
    lab_on,
    open_store,
    trains,
)


def _preset(crash: str) -> str:
    return f"""
id = "t"
title = "T"
[run]
steps = 20
ranks = 2
[knob]
name = "seed"
a = 1
b = 2
[crash]
{crash}
"""


def _pair(store: Any, tmp_path: Path, crash: dict[str, Any]) -> None:
    runs = [(f"p1-{label}", label, str(tmp_path / label)) for label in "AB"]
    store.create_pair("p1", "me", "t", {"knob": {}, "crash": crash}, runs)


def test_a_preset_offers_kill_one_rank_beside_its_own_mode_and_keeps_it_through_toml() -> None:
    preset = parse_preset_text(_preset('mode = "kill"\noffer = ["rank"]'))
    assert preset.crash.offer == ("rank",)
    assert parse_preset_text(dump_preset(preset)) == preset
    assert list(public_view(preset)["crash"]["offer"]) == ["rank"]  # the page reads it
    assert parse_preset_text(_preset('mode = "kill"')).crash.offer == ()  # off by default


@pytest.mark.parametrize(
    ("offer", "said"),
    [
        ('["meteor"]', "'meteor' cannot be offered"),
        ('["during_save"]', "'during_save' cannot be offered"),  # needs its pause from the start
        ('["kill"]', "'kill' cannot be offered"),  # the lesson's own mode
        ('["rank", "rank"]', "names a mode twice"),
        ('"rank"', "a list of crash modes"),
    ],
)
def test_an_offer_that_cannot_be_made_names_the_value_and_the_modes_allowed(
    offer: str, said: str
) -> None:
    with pytest.raises(PresetError, match=r"\[crash\] offer = .*" + said + r".*'rank'"):
        parse_preset_text(_preset(f'mode = "kill"\noffer = {offer}'))


def test_lesson_1_16_offers_killing_one_rank_and_lesson_1_17_kills_one_rank_anyway() -> None:
    assert get_preset("lesson-1.16").crash.offer == ("rank",)
    assert get_preset("lesson-1.17").crash.mode == "rank"


def test_a_crash_test_that_asks_for_an_offered_mode_kills_one_rank(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    _pair(store, tmp_path, {"mode": "kill", "offer": ["rank"]})
    trains(store, 0, 40)
    sup = FakeSupervisor()
    answer = lab_on(store, sup).crash(RUN, "me", False, "rank")
    assert sup.asked == ["rank"] and answer["crash_mode"] == "rank"


def test_a_crash_test_that_asks_for_nothing_uses_the_lesson_s_own_mode(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    _pair(store, tmp_path, {"mode": "kill", "offer": ["rank"]})
    trains(store, 0, 40)
    sup = FakeSupervisor()
    lab_on(store, sup).crash(RUN, "me", False)
    assert sup.asked == ["kill"]


def test_a_mode_the_lesson_does_not_offer_is_refused_naming_what_it_does(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    _pair(store, tmp_path, {"mode": "kill"})
    trains(store, 0, 40)
    sup = FakeSupervisor()
    with pytest.raises(Conflict, match=r"crash_mode 'rank' is not offered by this lesson.*'kill'"):
        lab_on(store, sup).crash(RUN, "me", False, "rank")
    with pytest.raises(BadInput, match=r"crash_mode 'meteor' is no crash mode: one of .*'?rank"):
        lab_on(store, sup).crash(RUN, "me", False, "meteor")
    assert sup.asked == []  # nothing was killed
    pair = {"preset_json": '{"crash": {"mode": "kill", "offer": ["rank", "wipe"]}}'}
    assert offered_modes(pair) == ("kill", "rank", "wipe")
    assert chosen_mode(pair, "wipe") == "wipe"


def test_the_crash_route_answers_409_to_a_mode_not_offered_and_422_to_one_not_registered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crashdrill.server.app import create_app

    settings = stand_in_settings(tmp_path / "lab", monkeypatch, steps=400)
    settings = dataclasses.replace(settings, telemetry=False)
    with TestClient(create_app(settings)) as client:
        pair = client.post("/api/pairs", json={"preset": "quick"}).json()
        run = pair["runs"][0]["id"]
        r = client.post(f"/api/runs/{run}/crash", json={"crash_mode": "rank"})
        assert r.status_code == 409, r.text  # a valid request this lesson says no to
        assert "crash_mode 'rank' is not offered by this lesson" in r.json()["detail"]
        r = client.post(f"/api/runs/{run}/crash", json={"crash_mode": "meteor"})
        assert r.status_code == 422, r.text
        r = client.post(f"/api/runs/{run}/crash", json={"mode": "rank"})
        assert r.status_code == 422, r.text  # one field, and no other
        client.post(f"/api/pairs/{pair['pair']}/stop")
