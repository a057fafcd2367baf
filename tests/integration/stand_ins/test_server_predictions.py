"""Predict, then crash (issue #23 item 3): a lesson's `[predict]` table, the owner's
prediction stored with the pair, its outcome measured from the first restart, the class's
predictions per lesson; and Stop for a pair's owner (item 4). Runs are the stand-in
trainer's, in-process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx2
import pytest
from fastapi.testclient import TestClient

from crashdrill.server.lessons.policy import LockedSetting, apply_student_overrides
from crashdrill.server.lessons.predictions import run_outcome
from crashdrill.server.storage.store import Store
from crashdrill.trainer.prediction import MEASURES, Prediction
from crashdrill.trainer.presets import (
    PresetError,
    dump_preset,
    list_presets,
    parse_preset,
    parse_preset_text,
)
from tests.support.lab import (
    app_state,
    as_stranger,
    finished,
    stand_in_app,
    stand_in_settings,
    start_pair,
    wait_pair,
)

pytestmark = pytest.mark.timeout(90)

TOKEN = "teach-me-crash-tests-now"
TEACHER = {"Authorization": f"Bearer {TOKEN}"}
BASE = {
    "id": "t",
    "title": "T",
    "run": {
        "steps": 10,
        "warmup": 2,
        "n_layer": 1,
        "d_model": 16,
        "n_head": 2,
        "ctx": 8,
        "batch": 2,
    },
    "knob": {"name": "ckpt_every", "a": 2, "b": 5},
}


# ---- the preset's [predict] table ------------------------------------------------------


def test_every_builtin_lesson_asks_a_prediction_with_a_known_measure() -> None:
    for preset in list_presets():
        assert preset.predict is not None, f"{preset.id} asks no prediction"
        assert preset.predict.question.endswith("?"), preset.id
        assert preset.predict.measure in MEASURES, preset.id


def test_a_prediction_survives_dump_and_parse() -> None:
    p = parse_preset(
        {
            **BASE,
            "predict": {
                "question": "B?",
                "measure": "resume",
                "runs": ["B"],
                "answer_after_outcome": False,
            },
        }
    )
    assert p.predict == Prediction("B?", "resume", ("B",), False)
    assert parse_preset_text(dump_preset(p)).predict == p.predict


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"measure": "resume"}, "[predict] question = '': a short question (text) is required"),
        (
            {"question": "Q?", "measure": "vibes"},
            "[predict] measure = 'vibes' is not allowed: one of 'lost_steps'",
        ),
        ({"question": "Q?", "measure": "resume", "runs": ["C"]}, "[predict] runs = ['C']"),
        ({"question": "Q?", "measure": "resume", "colour": 1}, "[predict] unknown key 'colour'"),
        (
            {"question": "Q?", "measure": "resume", "answer_after_outcome": "no"},
            "[predict] answer_after_outcome = 'no': true or false",
        ),
        ("ask", "[predict] must be a table"),
    ],
)
def test_a_bad_predict_table_is_refused_naming_the_key_and_what_is_allowed(
    table: object, words: str
) -> None:
    with pytest.raises(PresetError) as e:
        parse_preset({**BASE, "predict": table})
    assert words in str(e.value)


def test_a_refusal_of_a_locked_knob_never_offers_the_knob_s_setting() -> None:
    p = parse_preset(BASE)  # default lock: the knob (ckpt_every) locked
    with pytest.raises(LockedSetting) as e:
        apply_student_overrides(p, {"knob": {"a": 3}})
    assert str(e.value).endswith("a student may change: seed, steps")


# ---- the API -------------------------------------------------------------------------


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    settings = stand_in_settings(tmp_path / "lab", monkeypatch, steps=60, token=TOKEN)
    with TestClient(stand_in_app(settings)) as c:
        yield c


def predicted(
    client: TestClient, body: dict[str, object]
) -> tuple[dict[str, Any], httpx2.Response]:
    created = start_pair(client)
    r = client.post(f"/api/pairs/{created['pair']}/prediction", json=body)
    return created, r


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (
            {"answers": {"A": -1, "B": 10}},
            422,
            "answers.A = -1: a whole number of steps from 0 to 300",
        ),
        ({"answers": {"A": 10}}, 422, "answers: run B has no answer"),
        ({"answers": {"A": 1, "B": 2, "C": 3}}, 422, "run 'C' is not asked about"),
        ({"answers": {"A": "many", "B": 2}}, 422, "answers.A = 'many'"),
        ({"answers": {"A": 1, "B": 301}}, 422, "answers.B = 301"),
        ({"answers": {"A": 1, "B": 2}, "skip": True}, 422, "give answers or skip: true, not both"),
        ({"guess": 3}, 422, "guess"),
    ],
)
def test_a_bad_prediction_gets_a_clear_4xx_and_stores_nothing(
    client: TestClient, body: dict[str, object], status: int, words: str
) -> None:
    created, r = predicted(client, body)
    assert r.status_code == status, r.text
    assert words in r.text
    assert client.get(f"/api/pairs/{created['pair']}").json()["prediction"] is None
    client.post(f"/api/pairs/{created['pair']}/stop")


def test_only_the_owner_predicts_and_only_before_the_first_crash(client: TestClient) -> None:
    created = start_pair(client)
    pair = created["pair"]
    url = f"/api/pairs/{pair}/prediction"
    r = as_stranger(client, lambda: client.post(url, json={"skip": True}, headers=TEACHER))
    assert r.status_code == 403 and "only the browser that started" in r.json()["detail"]
    assert client.post("/api/pairs/nope/prediction", json={"skip": True}).status_code == 404
    run_a = created["runs"][0]["id"]
    wait_pair(client, pair, lambda rs: (rs[0]["step"] or 0) >= 25 and rs[0]["can_crash"])
    assert client.post(f"/api/runs/{run_a}/crash").status_code == 202
    r = client.post(url, json={"answers": {"A": 5, "B": 5}})
    assert r.status_code == 409 and "before the outcome" in r.json()["detail"]
    client.post(f"/api/pairs/{pair}/stop")


def test_a_prediction_is_stored_with_the_pair_and_shown_beside_the_outcome(
    client: TestClient,
) -> None:
    created, r = predicted(client, {"answers": {"A": 20, "B": 3}})
    assert r.status_code == 200, r.text
    pair = created["pair"]
    view = client.get(f"/api/pairs/{pair}").json()["prediction"]
    assert view["answers"] == {"A": 20, "B": 3} and view["skipped"] is False
    assert view["outcome"] == {"A": None, "B": None}  # nothing crashed yet: nothing measured
    run_a, run_b = (r["id"] for r in created["runs"])
    wait_pair(client, pair, lambda rs: all((x["step"] or 0) >= 25 and x["can_crash"] for x in rs))
    assert client.post(f"/api/runs/{run_a}/crash").status_code == 202
    assert client.post(f"/api/runs/{run_b}/crash").status_code == 202
    wait_pair(client, pair, finished)
    outcome = client.get(f"/api/pairs/{pair}").json()["prediction"]["outcome"]
    for run in (run_a, run_b):
        [check] = client.get(f"/api/runs/{run}/resume-checks").json()["checks"]
        label = "A" if run == run_a else "B"
        assert outcome[label] == check["expected_points"], (label, outcome, check)
    # the class sees it, against the outcome, under its lesson
    lessons = client.get("/api/instructor/class/predictions", headers=TEACHER).json()["lessons"]
    [quick] = [x for x in lessons if x["preset_id"] == "quick"]
    assert quick["predict"]["measure"] == "lost_steps" and quick["predict"]["kind"] == "number"
    [made] = quick["predictions"]
    assert {k: made[k] for k in ("pair", "answers", "outcome")} == {
        "pair": pair,
        "answers": {"A": 20, "B": 3},
        "outcome": outcome,
    }
    # the verdict is the server's, by the one rule both views show
    for label, answer in (("A", 20), ("B", 3)):
        right = abs(answer - outcome[label]) <= max(2, round(0.1 * outcome[label]))
        assert made["results"][label] == {
            "status": "measured",
            "outcome": outcome[label],
            "right": right,
        }
    r = as_stranger(client, lambda: client.get("/api/instructor/class/predictions"))
    assert r.status_code in (401, 403)


def test_a_skipped_prediction_is_counted_apart(client: TestClient) -> None:
    created, r = predicted(client, {"skip": True})
    assert r.status_code == 200 and r.json()["skipped"] is True
    lessons = client.get("/api/instructor/class/predictions", headers=TEACHER).json()["lessons"]
    [quick] = [x for x in lessons if x["preset_id"] == "quick"]
    assert quick["skipped"] == 1 and quick["predictions"] == []
    client.post(f"/api/pairs/{created['pair']}/stop")


def test_the_owner_stops_the_pair_and_its_quota_is_free_again(client: TestClient) -> None:
    limit = app_state(client).settings.max_pairs_per_session
    pairs = [start_pair(client) for _ in range(limit)]
    assert client.post("/api/pairs", json={"preset": "quick"}).status_code == 429
    created = pairs[0]
    pair = created["pair"]
    r = as_stranger(client, lambda: client.post(f"/api/pairs/{pair}/stop"))
    assert r.status_code == 403
    r = client.post(f"/api/pairs/{pair}/stop")
    assert r.status_code == 202 and sorted(r.json()["stopped"]) == sorted(
        x["id"] for x in created["runs"]
    )
    runs = wait_pair(client, pair, finished)
    assert {x["state"] for x in runs} == {"stopped"}
    again = client.post("/api/pairs", json={"preset": "quick"})  # the quota is free again
    assert again.status_code == 201, again.text
    for p in [*pairs[1:], again.json()]:
        client.post(f"/api/pairs/{p['pair']}/stop")
    assert client.post("/api/pairs/nope/stop").status_code == 404


def test_the_lesson_s_question_reaches_the_page(client: TestClient) -> None:
    quick = client.get("/api/presets/quick").json()
    assert quick["predict"]["kind"] == "number" and quick["predict"]["runs"] == ["A", "B"]
    p18 = client.get("/api/presets/lesson-1.8").json()["predict"]
    assert p18["kind"] == "choice" and [c["value"] for c in p18["choices"]] == ["yes", "no"]


def test_the_docs_describe_the_predict_table() -> None:
    doc = (Path(__file__).parents[3] / "docs" / "presets.md").read_text()
    for word in ("[predict]", *MEASURES, "answer_after_outcome"):
        assert word in doc, word


# ---- the outcome of a run's first restart, as each measure reads it --------------------


class RecordsOf:
    """The part of a Store that measuring reads: a run's records by kind."""

    def __init__(self, records: list[tuple[str, int, int | None, dict[str, object]]]) -> None:
        self.rows: list[dict[str, Any]] = [
            {"id": i, "segment": seg, "step": step, "t": float(i), "data": json.dumps(data)}
            for i, (kind, seg, step, data) in enumerate(records, 1)
            for data in [{"kind": kind, **data}]
        ]

    def records_of_kind(self, run_id: str, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if json.loads(str(r["data"]))["kind"] == kind]


def steps(segment: int, lo: int, hi: int, loss: float = 1.0) -> list[Any]:
    return [
        ("step", segment, s, {"step": s, "loss": loss + s / 1000, "lr": 0.1})
        for s in range(lo, hi + 1)
    ]


def resume(from_step: int | None) -> Any:
    path = None if from_step is None else f"ckpt/step-{from_step}"
    return ("resume", 1, from_step, {"segment": 1, "from_step": from_step, "path": path})


RUN = {"id": "r", "crashes": 1, "segment": 1, "step": 30}
CASES = {
    # trained 1..30, crashed, resumed from 20 and recomputed 21..30 exactly
    "identical": [*steps(0, 1, 30), resume(20), *steps(1, 21, 30)],
    # ... but with other losses (the checkpoint lacked the optimizer state)
    "different": [*steps(0, 1, 30), resume(20), *steps(1, 21, 30, loss=2.0)],
    # no checkpoint: trained from step 1 again
    "fresh": [*steps(0, 1, 30), resume(None), *steps(1, 1, 30)],
    # the restart refused to train without a checkpoint
    "refused": [*steps(0, 1, 30), ("event", 1, None, {"code": "no_checkpoint", "text": "x"})],
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_measure_reads_the_first_restart_s_outcome(kind: str) -> None:
    store = cast(Store, RecordsOf(CASES[kind]))  # the part of a Store it reads
    assert run_outcome(store, RUN, "resume") == kind
    assert run_outcome(store, RUN, "bit_identical") == ("yes" if kind == "identical" else "no")
    lost = {"identical": 10, "different": 10, "fresh": 30, "refused": 30}[kind]
    assert run_outcome(store, RUN, "lost_steps") == lost


def test_an_outcome_is_not_read_before_it_is_final() -> None:
    half = cast(
        Store, RecordsOf([*steps(0, 1, 30), resume(20), *steps(1, 21, 25)])
    )  # 5 of 10 so far
    assert run_outcome(half, RUN, "resume") is None
    assert run_outcome(half, RUN, "lost_steps") == 10
    never = cast(Store, RecordsOf(steps(0, 1, 30)))
    fresh_run = {**RUN, "crashes": 0, "segment": 0}
    assert run_outcome(never, fresh_run, "resume") is None
