"""Instructor mode in-process: login, writing presets, locking and publishing, and the
server's enforcement of both for students (runs played by the stand-in trainer)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from crashdrill.server.lessons.catalog import set_top_level
from crashdrill.server.settings import Settings
from tests.support.lab import STAND_IN, stand_in_app, stand_in_settings

pytestmark = pytest.mark.timeout(90)

TOKEN = "teach-me-crash-tests-now"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
LESSON = """# A lesson written in the lab.
id = "my-lesson"
number = "9.1"
chapter = "Checkpointing"
title = "My lesson"
question = "What does a crash cost?"

[run]
n_layer = 2
d_model = 64
n_head = 4
ctx = 64
batch = 8
steps = 300
threads = 1

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
def teacher(app: FastAPI) -> Iterator[TestClient]:
    """The instructor's browser (runs the app's lifespan), logged in with the token."""
    with TestClient(app) as c:
        r = c.post("/api/instructor/login", json={"token": TOKEN})
        assert r.status_code == 200, r.text
        yield c


@pytest.fixture
def student(app: FastAPI, teacher: TestClient) -> TestClient:
    """Another browser on the same running app: its own cookie, no token."""
    return TestClient(app)


def publish(teacher: TestClient, preset: str, published: bool = True) -> dict[str, Any]:
    r = teacher.put(f"/api/instructor/presets/{preset}/published", json={"published": published})
    assert r.status_code == 200, r.text
    return r.json()


def create(teacher: TestClient, text: str = LESSON) -> dict[str, Any]:
    r = teacher.post("/api/instructor/presets", json={"text": text})
    assert r.status_code == 201, r.text
    return r.json()


# ---- logging in ---------------------------------------------------------------------


def test_login_with_the_right_token_sets_a_cookie_that_makes_the_browser_an_instructor(
    app: FastAPI, teacher: TestClient
) -> None:
    assert teacher.get("/api/instructor/me").json() == {"enabled": True, "instructor": True}
    other = TestClient(app)
    assert other.get("/api/instructor/me").json() == {"enabled": True, "instructor": False}
    r = other.post("/api/instructor/login", json={"token": "guess"})
    assert r.status_code == 401 and "not the instructor token" in r.json()["detail"]
    assert other.get("/api/instructor/presets").status_code == 401
    pasted = other.post("/api/instructor/login", json={"token": f" {TOKEN}\n"})
    assert pasted.status_code == 200, pasted.text  # a pasted token's spaces are stripped
    teacher.post("/api/instructor/logout")
    assert teacher.get("/api/instructor/me").json()["instructor"] is False


def test_a_forged_instructor_cookie_is_ignored(app: FastAPI, teacher: TestClient) -> None:
    other = TestClient(app)
    other.cookies.set("crashdrill_instructor", "not-signed")
    assert other.get("/api/instructor/presets").status_code == 401


def test_after_ten_wrong_tokens_a_minute_wrong_ones_get_429_but_the_right_one_still_works(
    app: FastAPI, teacher: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import crashdrill.server.door.instructor_sessions as instructor_sessions

    monkeypatch.setattr(instructor_sessions, "WRONG_TOKEN_DELAY_S", 0.0)
    monkeypatch.setattr(instructor_sessions, "OVER_LIMIT_DELAY_S", 0.0)
    guesser = TestClient(app)  # the same address as the teacher's browser ("testclient")
    for i in range(10):
        r = guesser.post("/api/instructor/login", json={"token": f"guess-{i}"})
        assert r.status_code == 401, r.text
    r = guesser.post("/api/instructor/login", json={"token": "guess-10"})
    assert r.status_code == 429 and "too many wrong instructor tokens" in r.json()["detail"]
    assert 55 <= int(r.headers["retry-after"]) <= 60
    r = guesser.get("/api/instructor/presets", headers={"Authorization": "Bearer guess-11"})
    assert r.status_code == 429
    # The instructor behind the same address (a classroom's NAT) is never locked out.
    assert guesser.post("/api/instructor/login", json={"token": TOKEN}).status_code == 200
    assert guesser.get("/api/instructor/presets", headers=BEARER).status_code == 200
    assert teacher.get("/api/instructor/presets").status_code == 200


WRONG_TOKEN_WAYS = {
    "the login form": ("POST", "/api/instructor/login", {"json": {"token": "guess"}}),
    "a bearer header": (
        "GET",
        "/api/instructor/presets",
        {"headers": {"Authorization": "Bearer guess"}},
    ),
    "x-instructor-token": (
        "GET",
        "/api/instructor/me",
        {"headers": {"X-Instructor-Token": "guess"}},
    ),
    "a header on a student route": (
        "GET",
        "/api/presets/quick",
        {"headers": {"Authorization": "Bearer guess"}},
    ),
}


@pytest.mark.parametrize("way", list(WRONG_TOKEN_WAYS))
def test_a_wrong_token_is_answered_only_after_a_delay_however_it_comes(
    app: FastAPI, teacher: TestClient, way: str
) -> None:
    import crashdrill.server.door.instructor_sessions as instructor_sessions

    method, path, kwargs = WRONG_TOKEN_WAYS[way]
    guesser = TestClient(app)
    started = time.monotonic()
    r = guesser.request(method, path, **kwargs)  # type: ignore[arg-type]
    assert time.monotonic() - started >= instructor_sessions.WRONG_TOKEN_DELAY_S, r.status_code
    # The right token is answered at once, whichever way it comes.
    started = time.monotonic()
    right = {"json": {"token": TOKEN}} if method == "POST" else {"headers": BEARER}
    assert guesser.request(method, path, **right).status_code == 200  # type: ignore[arg-type]
    assert time.monotonic() - started < instructor_sessions.WRONG_TOKEN_DELAY_S


def test_a_header_token_over_the_guess_limit_waits_the_longer_delay(
    app: FastAPI, teacher: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import crashdrill.server.door.instructor_sessions as instructor_sessions

    monkeypatch.setattr(instructor_sessions, "WRONG_TOKEN_DELAY_S", 0.0)
    monkeypatch.setattr(instructor_sessions, "OVER_LIMIT_DELAY_S", 0.4)
    guesser = TestClient(app)
    for i in range(10):
        headers = {"X-Instructor-Token": f"guess-{i}"}
        assert guesser.get("/api/instructor/presets", headers=headers).status_code == 401
    started = time.monotonic()
    r = guesser.get("/api/instructor/presets", headers={"Authorization": "Bearer guess-10"})
    assert r.status_code == 429
    assert time.monotonic() - started >= 0.4


def test_the_guess_limit_can_be_turned_off(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:

    import crashdrill.server.door.instructor_sessions as instructor_sessions

    monkeypatch.setattr(instructor_sessions, "WRONG_TOKEN_DELAY_S", 0.0)
    app = stand_in_app(settings, max_wrong_tokens=0)
    with TestClient(app) as c:
        codes = {
            c.post("/api/instructor/login", json={"token": f"g{i}"}).status_code for i in range(15)
        }
        assert codes == {401}
        assert c.post("/api/instructor/login", json={"token": TOKEN}).status_code == 200


def test_token_guesses_slide_out_of_the_window_and_addresses_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import crashdrill.server.door.instructor_sessions as sessions

    now = [1000.0]
    guesses = sessions.TokenGuesses(limit=3, window_s=60, clock=lambda: now[0])
    for dt in (0, 10, 20):
        now[0] = 1000 + dt
        assert guesses.retry_after("a") == 0
        guesses.wrong("a")
    assert guesses.retry_after("a") == 40  # until the guess at 1000 is a minute old
    assert guesses.retry_after("b") == 0
    now[0] = 1060
    assert guesses.retry_after("a") == 0  # two left in the window
    monkeypatch.setattr(sessions, "GUESS_ADDRESSES", 2)
    for who in ("x", "x", "x", "y", "y", "y", "z"):
        guesses.wrong(who)
    assert guesses.retry_after("y") == 60, "a recent address is still counted"
    assert guesses.retry_after("x") == 0, "the least recent address went first"


def test_instructor_mode_is_off_without_a_token(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "lab", trainer_command=STAND_IN, telemetry=False)
    with TestClient(stand_in_app(settings)) as c:
        r = c.post("/api/instructor/login", json={"token": "anything"})
        assert r.status_code == 403 and "CRASHDRILL_INSTRUCTOR_TOKEN" in r.json()["detail"]
        assert c.get("/api/instructor/class").status_code == 403


# ---- writing presets ----------------------------------------------------------------


def test_validate_names_the_field_the_value_and_what_is_allowed(teacher: TestClient) -> None:
    bad = LESSON.replace("n_layer = 2", "n_layer = 0")
    # answered 200 with the problems: the editor asks at every pause in typing, and a
    # refusal per keystroke would fill the console with failed requests
    r = teacher.post("/api/instructor/presets/validate", json={"text": bad})
    assert r.status_code == 200 and r.json()["ok"] is False
    assert "n_layer" in r.json()["detail"] and "0" in r.json()["detail"]
    r = teacher.post("/api/instructor/presets/validate", json={"text": "id = [oops"})
    assert r.status_code == 200 and "not valid TOML" in r.json()["detail"]
    # saving the same text is still refused
    assert teacher.post("/api/instructor/presets", json={"text": bad}).status_code == 422
    r = teacher.post("/api/instructor/presets/validate", json={"text": LESSON})
    assert r.status_code == 200 and r.json()["id"] == "my-lesson"


def test_a_created_preset_is_unpublished_and_saved_as_a_toml_file(
    teacher: TestClient, settings: Settings
) -> None:
    made = create(teacher)
    assert made["published"] is False and made["origin"] == "instructor"
    path = settings.instructor_presets_dir / "my-lesson.toml"
    assert path.read_text().startswith("# A lesson written in the lab.")
    assert "published = false" in path.read_text()
    r = teacher.post("/api/instructor/presets", json={"text": LESSON})
    assert r.status_code == 409 and "exists already" in r.json()["detail"]
    r = teacher.put(
        "/api/instructor/presets/my-lesson", json={"text": LESSON.replace("My lesson", "Renamed")}
    )
    assert r.status_code == 200 and r.json()["title"] == "Renamed"
    r = teacher.put(
        "/api/instructor/presets/my-lesson", json={"text": LESSON.replace("my-lesson", "other")}
    )
    assert r.status_code == 422 and "keep the id" in r.json()["detail"]


def test_built_ins_are_read_only_and_duplicate_into_an_unpublished_copy(
    teacher: TestClient,
) -> None:
    r = teacher.put("/api/instructor/presets/quick", json={"text": LESSON})
    assert r.status_code == 403 and "duplicate it" in r.json()["detail"]
    assert (
        teacher.put(
            "/api/instructor/presets/quick/published", json={"published": False}
        ).status_code
        == 403
    )
    r = teacher.post("/api/instructor/presets/quick/duplicate", json={})
    assert r.status_code == 201, r.text
    copy = r.json()
    assert copy["id"] == "quick-copy" and copy["published"] is False and copy["editable"]
    assert "Duplicated from 'quick'" in copy["text"]
    again = teacher.post("/api/instructor/presets/quick/duplicate", json={}).json()
    assert again["id"] == "quick-copy2"
    r = teacher.post("/api/instructor/presets/quick/duplicate", json={"new_id": "../evil"})
    assert r.status_code == 422 and "new_id" in r.json()["detail"]


def test_locking_rewrites_only_the_locked_line_and_refuses_unknown_names(
    teacher: TestClient, settings: Settings
) -> None:
    create(teacher)
    r = teacher.put("/api/instructor/presets/my-lesson/locked", json={"locked": ["knob", "steps"]})
    assert r.status_code == 200, r.text
    assert set(r.json()["locked"]) >= {"knob", "steps"}
    assert "seed" in r.json()["student_adjustable"]
    text = (settings.instructor_presets_dir / "my-lesson.toml").read_text()
    assert 'locked = ["knob", "steps"]' in text and "# A lesson written in the lab." in text
    r = teacher.put("/api/instructor/presets/my-lesson/locked", json={"locked": ["warp_drive"]})
    assert r.status_code == 422 and "warp_drive" in r.json()["detail"]


def test_set_top_level_replaces_a_multi_line_array_and_inserts_before_the_first_table() -> None:
    text = 'id = "x"\nlocked = [\n  "a",\n  "b",\n]\n# keep me\n\n[run]\nsteps = 1\n'
    out = set_top_level(text, "locked", ["knob"])
    assert out == 'id = "x"\nlocked = ["knob"]\n# keep me\n\n[run]\nsteps = 1\n'
    out = set_top_level(out, "published", True)
    assert out.index("published = true") < out.index("[run]") and "# keep me" in out


def test_a_knob_value_the_config_refuses_is_named_as_the_editor_types_and_saving_is_a_422(
    teacher: TestClient,
) -> None:
    text = LESSON.replace('name = "ckpt_every"\na = 50', 'name = "steps"\na = -1')
    for path, status in (
        ("/api/instructor/presets/validate", 200),
        ("/api/instructor/presets", 422),
    ):
        r = teacher.post(path, json={"text": text})
        assert r.status_code == status, (path, r.text)
        assert "[knob] a steps = -1" in r.json()["detail"] and "≥ 1" in r.json()["detail"]


def test_a_preset_with_a_quoted_key_can_be_published_and_duplicated(
    teacher: TestClient, settings: Settings
) -> None:
    text = LESSON.replace('number = "9.1"', '"published" = false  # not yet\nnumber = "9.1"')
    create(teacher, text)
    assert publish(teacher, "my-lesson")["published"] is True
    saved = (settings.instructor_presets_dir / "my-lesson.toml").read_text()
    assert '"published" = true  # not yet' in saved and saved.count("published") == 1
    r = teacher.post("/api/instructor/presets/my-lesson/duplicate", json={})
    assert r.status_code == 201, r.text
    assert r.json()["published"] is False and "# A lesson written in the lab." in r.json()["text"]


def test_a_multi_line_explanation_with_a_line_starting_with_a_bracket_can_be_published(
    teacher: TestClient, settings: Settings
) -> None:
    text = LESSON.replace(
        'question = "What does a crash cost?"',
        'question = "What does a crash cost?"\nexplanation = """Look at the chart:\n[A] loses'
        ' less than [B].\n"""',
    ).replace("steps = 300", "steps = 300  # five minutes")
    create(teacher, text)
    publish(teacher, "my-lesson")
    r = teacher.put("/api/instructor/presets/my-lesson/locked", json={"locked": ["knob"]})
    assert r.status_code == 200, r.text
    saved = (settings.instructor_presets_dir / "my-lesson.toml").read_text()
    assert "\n[A] loses less than [B].\n" in saved and "steps = 300  # five minutes" in saved
    assert saved.index("published = true") < saved.index("[run]")
    assert saved.index('locked = ["knob"]') < saved.index("[run]")


def test_a_locked_name_that_is_not_a_setting_is_a_422_naming_it_and_the_file_is_kept(
    teacher: TestClient, settings: Settings
) -> None:
    create(teacher)
    path = settings.instructor_presets_dir / "my-lesson.toml"
    before = path.read_text()
    r = teacher.put("/api/instructor/presets/my-lesson/locked", json={"locked": ["steps\u007f"]})
    assert r.status_code == 422, r.text
    assert "'steps\\x7f' is not a run setting" in r.json()["detail"]
    assert '"knob" or one of' in r.json()["detail"] and "steps" in r.json()["detail"]
    assert path.read_text() == before


# ---- what students may do -----------------------------------------------------------


def test_students_never_see_or_start_an_unpublished_preset(
    teacher: TestClient, student: TestClient
) -> None:
    create(teacher)
    assert "my-lesson" not in [p["id"] for p in student.get("/api/presets").json()]
    assert student.get("/api/presets/my-lesson").status_code == 404
    assert student.get("/lesson/my-lesson").status_code == 404
    r = student.post("/api/pairs", json={"preset": "my-lesson"})
    assert r.status_code == 404 and "not published" in r.json()["detail"]
    assert teacher.get("/api/presets/my-lesson").status_code == 200  # the instructor's preview

    publish(teacher, "my-lesson")
    assert "my-lesson" in [p["id"] for p in student.get("/api/presets").json()]
    assert student.get("/lesson/my-lesson").status_code == 200
    r = student.post("/api/pairs", json={"preset": "my-lesson"})
    assert r.status_code == 201, r.text

    publish(teacher, "my-lesson", False)
    assert student.post("/api/pairs", json={"preset": "my-lesson"}).status_code == 404


def test_a_student_cannot_change_a_locked_setting_but_may_change_an_unlocked_one(
    teacher: TestClient, student: TestClient, settings: Settings
) -> None:
    create(teacher)
    teacher.put("/api/instructor/presets/my-lesson/locked", json={"locked": ["knob", "steps"]})
    publish(teacher, "my-lesson")

    r = student.post("/api/pairs", json={"preset": "my-lesson", "overrides": {"steps": 100}})
    assert r.status_code == 403
    assert "steps is locked" in r.json()["detail"] and "seed" in r.json()["detail"]
    r = student.post("/api/pairs", json={"preset": "my-lesson", "overrides": {"knob": {"a": 10}}})
    assert r.status_code == 403 and "knob is locked" in r.json()["detail"]
    r = student.post("/api/pairs", json={"preset": "my-lesson", "overrides": {"seed": -1}})
    assert r.status_code == 422 and "seed" in r.json()["detail"] and "-1" in r.json()["detail"]
    r = student.post("/api/pairs", json={"preset": "my-lesson", "overrides": {"ckpt_every": 7}})
    assert r.status_code == 422 and "knob" in r.json()["detail"]

    r = student.post("/api/pairs", json={"preset": "my-lesson", "overrides": {"seed": 7}})
    assert r.status_code == 201, r.text
    run_id = r.json()["runs"][0]["id"]
    pair = student.get(f"/api/pairs/{r.json()['pair']}").json()
    assert pair["preset"]["run"]["seed"] == 7
    # The run trains a frozen copy of exactly what the pair shows.
    frozen = settings.runs_dir / run_id / "preset.toml"
    assert "seed = 7" in frozen.read_text()
    deadline = time.monotonic() + 20
    while not (settings.runs_dir / run_id / "run.json").exists():
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.05)
    assert json.loads((settings.runs_dir / run_id / "run.json").read_text())["preset"] == str(
        frozen
    )


def test_built_in_lessons_lock_all_but_the_student_settings_by_default(
    student: TestClient,
) -> None:
    r = student.get("/api/presets/quick?steps=120")
    assert r.status_code == 200 and r.json()["run"]["steps"] == 120
    assert r.json()["overrides"] == {"steps": 120}
    r = student.get("/api/presets/quick?n_layer=4")
    assert r.status_code == 403 and "n_layer is locked" in r.json()["detail"]
    r = student.get("/api/presets/quick?knob.a=10")
    assert r.status_code == 403 and "knob is locked" in r.json()["detail"]
    r = student.get("/api/presets/quick?steps=lots")
    assert r.status_code == 422 and "steps" in r.json()["detail"] and "lots" in r.json()["detail"]
    r = student.post("/api/pairs", json={"preset": "quick", "overrides": {"n_layer": 4}})
    assert r.status_code == 403


# ---- the class ----------------------------------------------------------------------


def test_the_class_view_lists_every_pair_and_the_instructor_may_stop_a_students_run(
    teacher: TestClient, student: TestClient
) -> None:
    made = student.post("/api/pairs", json={"preset": "quick"}).json()
    assert student.get("/api/instructor/class").status_code == 401
    view = teacher.get("/api/instructor/class").json()
    pair = next(p for p in view["pairs"] if p["pair"] == made["pair"])
    assert pair["preset_id"] == "quick" and pair["owner_tag"] == "student 1"
    assert {r["label"] for r in pair["runs"]} == {"A", "B"}
    assert all("state" in r and "step" in r for r in pair["runs"])
    run = made["runs"][0]["id"]
    r = teacher.post(f"/api/runs/{run}/stop")  # the login cookie, no header
    assert r.status_code == 202, r.text
    assert teacher.get("/api/instructor/class", headers=BEARER).status_code == 200


def test_an_instructor_session_expires_and_a_revoked_one_is_gone() -> None:
    from crashdrill.server.door.instructor_sessions import InstructorSessions

    now = [1000.0]
    sessions = InstructorSessions(lifetime_s=60, clock=lambda: now[0])
    old, kept = sessions.new(), sessions.new()
    assert sessions.valid(old) and sessions.valid(kept)
    sessions.revoke(kept)
    assert not sessions.valid(kept)
    now[0] = 1061
    assert not sessions.valid(old)
    assert not sessions.valid("made-up")
