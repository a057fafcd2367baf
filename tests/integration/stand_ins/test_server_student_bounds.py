"""Students are untrusted (issue #15, point 1) against the real app in-process: what a
student may change and within which bounds, through every door (the lesson link's query,
GET /api/presets/ID, POST /api/pairs), and the lab's budget on instructor presets. Every
refusal is a 4xx naming the field, the value and what is allowed; never a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from crashdrill.server.settings import Settings
from tests.support.lab import app_state, stand_in_app, stand_in_settings

pytestmark = pytest.mark.timeout(120)

TOKEN = "teach-me-crash-tests-with-bounds"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
LESSON = """id = "big"
title = "A lesson sized by its instructor"
published = true

[run]
n_layer = 2
d_model = 64
n_head = 4
ctx = 64
batch = 8
steps = 300

[knob]
name = "ckpt_every"
a = 50
b = 150
"""


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return stand_in_settings(tmp_path / "lab", monkeypatch, steps=400, token=TOKEN)


@pytest.fixture
def app(settings: Settings) -> FastAPI:
    return stand_in_app(settings)


@pytest.fixture
def student(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def pair(client: TestClient, preset: str, overrides: dict[str, Any]) -> Any:
    return client.post("/api/pairs", json={"preset": preset, "overrides": overrides})


@pytest.mark.parametrize(
    ("preset", "overrides", "status", "words"),
    [
        ("quick", {"keep": "x"}, 422, ["keep", "'x'", "a whole number"]),
        ("quick", {"steps": 10**30}, 422, ["steps", str(10**30), "from 1 to"]),
        ("quick", {"seed": 2**64}, 422, ["seed", str(2**64), "2**63"]),
        ("lesson-1.13", {"ckpt_every": 1}, 422, ["ckpt_every = 1", "from 10 to 200"]),
        ("lesson-1.13", {"steps": 801}, 422, ["steps = 801", "from 1 to 800"]),
        ("lesson-1.13", {"keep": 100_000_000}, 403, ["keep is locked"]),
        ("lesson-1.7-fast", {"keep": 100_000_000}, 422, ["keep = 100000000", "from 2 to 10"]),
        ("lesson-1.7-fast", {"dropout": "x"}, 422, ["dropout", "'x'", "a number"]),
        ("lesson-1.7-fast", {"vocab": 2_000_000_000}, 422, ["vocab = 2000000000", "fixes vocab"]),
        ("lesson-1.7-fast", {"tokenizer": "gpt2"}, 422, ["tokenizer = 'gpt2'", "fixes tokenizer"]),
        ("lesson-1.7-fast", {"precision": "bf16"}, 422, ["precision", "fixes precision"]),
        ("lesson-1.7-fast", {"mirror": "off"}, 422, ["mirror", "fixes mirror"]),
        ("lesson-1.7-fast", {"eval_batches": 10**6}, 422, ["eval_batches = 1000000", "from 1 to"]),
        ("lesson-1.7-fast", {"lr": 1e9}, 422, ["lr = 1000000000.0", "from 0 to 1"]),
        ("quick", {"n_layer": 4}, 403, ["n_layer is locked by the instructor"]),
    ],
)
def test_a_students_wrong_value_is_refused_through_every_door_naming_field_value_and_allowed(
    student: TestClient, preset: str, overrides: dict[str, Any], status: int, words: list[str]
) -> None:
    (name, value), *_ = overrides.items()
    query = {name: str(value)}
    for r in (
        pair(student, preset, overrides),
        student.get(f"/api/presets/{preset}", params=query),
    ):
        assert r.status_code == status, r.text
        assert all(w in r.json()["detail"] for w in words), r.json()["detail"]
    assert student.get(f"/lesson/{preset}", params=query).status_code == status
    assert student.get(f"/lesson/{preset}").status_code == 200


def test_the_lessons_as_shipped_and_a_students_values_in_range_start(student: TestClient) -> None:
    cases: list[tuple[str, dict[str, Any]]] = [
        ("quick", {"steps": 120, "seed": 7}),
        ("lesson-1.13", {"steps": 400, "ckpt_every": 25}),
        ("lesson-1.7-fast", {"keep": 10, "lr": 0.001, "eval_batches": 8}),
    ]
    for preset, overrides in cases:
        r = pair(student, preset, overrides)
        assert r.status_code == 201, (preset, r.text)
        student.post(f"/api/runs/{r.json()['runs'][0]['id']}/stop")  # make room for the next
        student.post(f"/api/runs/{r.json()['runs'][1]['id']}/stop")


def test_settings_in_range_that_would_write_gigabytes_of_checkpoints_are_refused_up_front(
    student: TestClient,
) -> None:
    # Issue #24, item 3: lesson-1.13 (a 38.8 MB checkpoint) saved 81 times, and each copied
    # to the lab's mirror: 6.3 GB a run, every value within its own range.
    r = pair(student, "lesson-1.13", {"steps": 800, "ckpt_every": 10})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    for words in (
        "run A has 6,285,496,320 disk bytes written",
        "the 81 checkpoints it saves × 2 for the copies in the lab's mirror",
        "this lab's limit is 4,294,967,296 (max_disk_bytes_per_run)",
        "raise ckpt_every or lower steps",
    ):
        assert words in detail, detail
    assert student.get("/api/presets/lesson-1.13?steps=800&ckpt_every=10").status_code == 422
    assert not app_state(student).lab.store.runs_in(["queued", "starting", "running"])


def test_the_public_view_says_the_server_locked_settings_are_locked(student: TestClient) -> None:
    fast = student.get("/api/presets/lesson-1.7-fast").json()
    assert {"tokenizer", "vocab", "data", "precision", "mirror"} <= set(fast["locked"])
    assert "keep" in fast["student_adjustable"] and "vocab" not in fast["student_adjustable"]
    quick = student.get("/api/presets/quick").json()
    assert quick["student_adjustable"] == ["seed", "steps"]  # ckpt_every is its (locked) knob
    assert "ckpt_every" in quick["locked"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ('dropout = "x"', ["dropout", "'x'", "a finite number"]),
        ('keep = "x"', ["keep", "'x'", "a whole number"]),
        ("vocab = 2000000000", ["parameters", "max_params_per_run", "50,000,000"]),
        ("[run.cuda]\nbatch = 100000", ["run A on CUDA has", "tokens", "max_tokens_per_run"]),
        ("keep = 100000", ["checkpoint bytes", "max_checkpoint_bytes_per_run"]),
    ],
)
def test_an_instructor_preset_over_the_budget_or_of_a_wrong_type_is_a_422_naming_it(
    student: TestClient, change: str, words: list[str]
) -> None:
    if change.startswith("["):
        text = f"{LESSON}{change}\n"
    else:
        text = LESSON.replace("[run]\n", f"[run]\n{change}\n")
    checked = student.post("/api/instructor/presets/validate", json={"text": text}, headers=BEARER)
    assert checked.status_code == 200 and checked.json()["ok"] is False, checked.text
    assert all(w in checked.json()["detail"] for w in words), checked.json()["detail"]
    r = student.post("/api/instructor/presets", json={"text": text}, headers=BEARER)
    assert r.status_code == 422, r.text
    assert all(w in r.json()["detail"] for w in words), r.json()["detail"]
    assert student.get("/api/instructor/presets/big", headers=BEARER).status_code == 404


def test_a_preset_saved_under_a_larger_budget_cannot_be_published_under_a_smaller_one(
    settings: Settings, tmp_path: Path
) -> None:
    import dataclasses

    with TestClient(stand_in_app(settings)) as lab:
        r = lab.post("/api/instructor/presets", json={"text": LESSON}, headers=BEARER)
        assert r.status_code == 201, r.text
    small = dataclasses.replace(settings, max_tokens_per_run=100_000)  # 300 × 8 × 64 = 153,600
    with TestClient(stand_in_app(small)) as lab:
        r = lab.put(
            "/api/instructor/presets/big/published", json={"published": True}, headers=BEARER
        )
        assert r.status_code == 422 and "max_tokens_per_run" in r.json()["detail"], r.text
        assert "153,600 tokens" in r.json()["detail"]
        r = lab.post("/api/pairs", json={"preset": "big"})  # published in its file already
        assert r.status_code == 422 and "over this lab's budget" in r.json()["detail"], r.text
        r = lab.put(
            "/api/instructor/presets/big/published", json={"published": False}, headers=BEARER
        )
        assert r.status_code == 200


def test_a_server_setting_lets_an_instructor_open_a_server_locked_setting(
    settings: Settings,
) -> None:
    import dataclasses

    opened = dataclasses.replace(settings, student_unlockable=("n_layer",))
    with TestClient(stand_in_app(opened)) as lab:
        r = pair(lab, "lesson-1.7-fast", {"n_layer": 3})
        assert r.status_code == 403  # the lesson still locks it
        fast = lab.get("/api/presets/lesson-1.7-fast").json()
        assert "n_layer" in fast["locked"] and "vocab" in fast["locked"]
        lesson = LESSON.replace("published = true\n", 'published = true\nlocked = ["knob"]\n')
        r = lab.post("/api/instructor/presets", json={"text": lesson}, headers=BEARER)
        assert r.status_code == 201, r.text
        r = pair(lab, "big", {"n_layer": 3})
        assert r.status_code == 201, r.text
        listed = {p["id"]: p for p in lab.get("/api/presets").json()}["big"]
        assert "n_layer" in listed["student_adjustable"] and "vocab" in listed["locked"]
        r = pair(lab, "big", {"n_layer": 9})
        assert r.status_code == 422 and "from 1 to 8" in r.json()["detail"]
        r = pair(lab, "big", {"vocab": 300})
        assert r.status_code == 422 and "fixes vocab" in r.json()["detail"]


# ---- any overrides at all: never a 5xx ------------------------------------------------

NAMES = [
    "steps",
    "seed",
    "ckpt_every",
    "keep",
    "knob",
    "lr",
    "dropout",
    "vocab",
    "tokenizer",
    "data",
    "n_layer",
    "batch",
    "eval_every",
    "threads",
    "device",
    "bogus",
    "ckpt_mode",
]
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
OVERRIDES = st.dictionaries(
    st.sampled_from(NAMES) | st.text(max_size=12), JSON_VALUES, max_size=5
) | st.dictionaries(st.just("knob"), st.dictionaries(st.sampled_from(["a", "b", "c"]), JSON_VALUES))


@hypothesis_settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(preset=st.sampled_from(["quick", "lesson-1.13", "lesson-1.7-fast"]), overrides=OVERRIDES)
def test_any_overrides_of_a_pair_get_an_answer_below_500(
    student: TestClient, preset: str, overrides: dict[str, Any]
) -> None:
    r = student.post(
        "/api/pairs",
        content=_json(preset, overrides),
        headers={"content-type": "application/json"},
    )
    assert r.status_code < 500, (overrides, r.text)
    assert r.status_code in (201, 400, 403, 422, 429), (overrides, r.text)
    if r.status_code == 201:
        for run in r.json()["runs"]:
            student.post(f"/api/runs/{run['id']}/stop")
    else:
        assert r.json()["detail"]


def _json(preset: str, overrides: dict[str, Any]) -> bytes:
    import json

    # NaN and Infinity as Python's json writes them: a client may send them too.
    return json.dumps({"preset": preset, "overrides": overrides}).encode()


QUERY = st.dictionaries(
    st.sampled_from([*NAMES, "knob.a", "knob.b"]) | st.text(max_size=8),
    st.sampled_from(["x", "1e400", "NaN", "-1", "true", "null", "[1]", '{"a": 1}', "9" * 40])
    | st.text(max_size=20),
    max_size=4,
)


@hypothesis_settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(preset=st.sampled_from(["quick", "lesson-1.7-fast", "nope"]), query=QUERY)
def test_any_query_on_a_lesson_link_gets_an_answer_below_500(
    student: TestClient, preset: str, query: dict[str, str]
) -> None:
    r = student.get(f"/api/presets/{preset}", params=query)
    assert r.status_code in (200, 403, 404, 422), (query, r.text)
    page = student.get(f"/lesson/{preset}", params=query)
    assert page.status_code == r.status_code, (query, page.status_code, r.text)


def test_a_query_that_sets_the_knob_itself_is_a_422_saying_how_to_set_each_runs_value(
    student: TestClient,
) -> None:
    # found by the query test above: ?knob=x&knob.a=x answered 500
    for query in ({"knob": "x", "knob.a": "x"}, {"knob": "50"}):
        r = student.get("/api/presets/quick", params=query)
        assert r.status_code == 422, r.text
        assert "knob.a=" in r.json()["detail"] and "knob.b=" in r.json()["detail"]
        assert student.get("/lesson/quick", params=query).status_code == 422
