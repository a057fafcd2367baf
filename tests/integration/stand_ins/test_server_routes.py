"""The API in-process (Starlette's TestClient), runs played by the stand-in trainer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from crashdrill.server.app import create_app
from crashdrill.server.settings import Settings
from tests.support.lab import (
    FakeSampler,
    app_state,
    as_stranger,
    finished,
    stand_in_app,
    stand_in_settings,
    start_pair,
    wait_pair,
)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return stand_in_settings(
        tmp_path / "lab", monkeypatch, steps=60, token="teach-me-crash-tests-now"
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(stand_in_app(settings)) as c:
        yield c


def test_presets_lists_the_lessons_with_their_knob(client: TestClient) -> None:
    presets = {p["id"]: p for p in client.get("/api/presets").json()}
    assert presets["quick"]["knob"] == {"name": "ckpt_every", "a": 50, "b": 150}
    assert "source" not in presets["quick"]


def test_a_pair_starts_both_runs_and_shows_the_knob(client: TestClient) -> None:
    created = start_pair(client)
    assert [r["label"] for r in created["runs"]] == ["A", "B"]
    assert len(created["pair"]) >= 16 and all(len(r["id"]) >= 16 for r in created["runs"])
    assert "crashdrill_session" in client.cookies
    pair = client.get(f"/api/pairs/{created['pair']}").json()
    assert pair["owner"] is True
    assert pair["knob"] == {"name": "ckpt_every", "a": 50, "b": 150, "text": pair["knob"]["text"]}
    assert [r["knob"]["value"] for r in pair["runs"]] == [50, 150]
    runs = wait_pair(client, created["pair"], finished)
    assert [(r["state"], r["stage"], r["step"], r["steps"]) for r in runs] == [
        ("finished", "finished", 60, 60)
    ] * 2
    assert runs[0]["latest"]["step"]["step"] == 60
    assert not as_stranger(client, lambda: client.get(f"/api/pairs/{created['pair']}").json())[
        "owner"
    ]


def test_a_crash_test_resumes_and_the_check_is_bit_identical(client: TestClient) -> None:
    created = start_pair(client)
    run_a = created["runs"][0]["id"]
    wait_pair(client, created["pair"], lambda rs: (rs[0]["step"] or 0) >= 25 and rs[0]["can_crash"])
    r = client.post(f"/api/runs/{run_a}/crash")
    assert r.status_code == 202, r.text
    assert r.json()["state"] == "restarting" and r.json()["killed_pid"] > 0
    runs = wait_pair(client, created["pair"], finished)
    assert runs[0]["crashes"] == 1 and runs[0]["segment"] == 1
    [check] = client.get(f"/api/runs/{run_a}/resume-checks").json()["checks"]
    assert check["segment"] == 1 and check["bit_identical"] is True and check["complete"]
    assert check["max_abs_delta"] == 0.0 and check["points"] >= 1
    fields = {f["field"]: f for f in check["fields"]}  # every recorded field, not the loss only
    assert check["differing"] == [] and fields["step.tokens"]["equal"] is True
    events = client.get(f"/api/runs/{run_a}/events").json()["events"]
    texts = [e["text"] for e in events]
    crash = next(i for i, t in enumerate(texts) if t.startswith("Crash test: killed"))
    assert texts[crash + 1] == f"Resumed at step {check['from_step']} from a checkpoint."
    # The numbers are the events' fields (trainer/event_codes.py), not only in the sentence.
    assert events[crash]["code"] == "crash"
    assert events[crash]["fields"]["resume_from"] == check["from_step"]
    assert events[crash + 1]["fields"]["step"] == check["from_step"]
    assert client.post(f"/api/runs/{run_a}/crash").status_code == 409  # finished now


def test_only_the_owner_or_an_instructor_may_crash(client: TestClient) -> None:
    created = start_pair(client)
    run_a, run_b = (r["id"] for r in created["runs"])
    wait_pair(client, created["pair"], lambda rs: all(r["can_crash"] for r in rs))
    r = as_stranger(client, lambda: client.post(f"/api/runs/{run_a}/crash"))
    assert r.status_code == 403 and "owner or an instructor" in r.json()["detail"]
    r = as_stranger(client, lambda: client.post(f"/api/runs/{run_a}/stop"))
    assert r.status_code == 403
    teacher = {"Authorization": "Bearer teach-me-crash-tests-now"}
    r = as_stranger(client, lambda: client.post(f"/api/runs/{run_b}/crash", headers=teacher))
    assert r.status_code == 202
    wrong = {"Authorization": "Bearer guess"}
    r = as_stranger(client, lambda: client.post(f"/api/runs/{run_a}/crash", headers=wrong))
    assert r.status_code == 403
    client.cookies.set("crashdrill_session", "forged.value")
    assert client.post(f"/api/runs/{run_a}/crash").status_code == 403


def test_runs_past_the_limit_queue_with_their_position(client: TestClient) -> None:
    first, second = start_pair(client), start_pair(client)
    queued = client.get(f"/api/pairs/{second['pair']}").json()["runs"]
    assert [(r["stage"], r["queue_position"]) for r in queued] == [("queued", 1), ("queued", 2)]
    r = client.post(f"/api/runs/{queued[0]['id']}/crash")
    assert r.status_code == 409 and "queued" in r.json()["detail"]
    assert client.post(f"/api/runs/{queued[0]['id']}/stop").status_code == 202
    queued = client.get(f"/api/pairs/{second['pair']}").json()["runs"]
    assert [(r["state"], r["queue_position"]) for r in queued] == [("stopped", None), ("queued", 1)]
    wait_pair(client, first["pair"], finished)
    runs = wait_pair(client, second["pair"], finished)
    assert [r["state"] for r in runs] == ["stopped", "finished"]


def test_one_browser_may_not_queue_pairs_without_end(client: TestClient) -> None:
    pairs = [start_pair(client) for _ in range(3)]
    r = client.post("/api/pairs", json={"preset": "quick"})
    assert r.status_code == 429 and "already has 3 pairs" in r.json()["detail"]
    teacher = {"Authorization": "Bearer teach-me-crash-tests-now"}
    r = client.post("/api/pairs", json={"preset": "quick"}, headers=teacher)
    assert r.status_code == 201  # an instructor may start more (here: in the same browser)
    for run in [*pairs[2]["runs"], *r.json()["runs"]]:
        assert client.post(f"/api/runs/{run['id']}/stop").status_code == 202
    assert client.post("/api/pairs", json={"preset": "quick"}).status_code == 201


def test_stopping_a_training_run_ends_it_for_good(client: TestClient) -> None:
    created = start_pair(client)
    run_a = created["runs"][0]["id"]
    wait_pair(client, created["pair"], lambda rs: rs[0]["can_crash"])
    assert client.post(f"/api/runs/{run_a}/stop").status_code == 202
    runs = wait_pair(client, created["pair"], finished)
    assert [r["state"] for r in runs] == ["stopped", "finished"]
    assert client.post(f"/api/runs/{run_a}/stop").status_code == 409


def test_records_page_by_kind_and_after(client: TestClient) -> None:
    created = start_pair(client)
    run_a = created["runs"][0]["id"]
    wait_pair(client, created["pair"], finished)
    page = client.get(f"/api/runs/{run_a}/records", params={"kind": "step", "limit": 25}).json()
    assert [r["step"] for r in page["records"]] == list(range(1, 26))
    assert all(r["run"] == run_a and r["kind"] == "step" for r in page["records"])
    rest = client.get(
        f"/api/runs/{run_a}/records", params={"kind": "step", "after": page["next_after"]}
    ).json()
    assert [r["step"] for r in rest["records"]] == list(range(26, 61))
    both = client.get(f"/api/runs/{run_a}/records", params=[("kind", "ckpt"), ("kind", "resume")])
    assert {r["kind"] for r in both.json()["records"]} == {"ckpt"}


def test_the_machine_sample_is_served(client: TestClient) -> None:
    sample = client.get("/api/machine").json()["sample"]
    assert sample["kind"] == "telemetry" and sample["cpu_pct"] == 12.5


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/pairs/nope"),
        ("POST", "/api/runs/nope/crash"),
        ("POST", "/api/runs/nope/stop"),
        ("GET", "/api/runs/nope/records"),
        ("GET", "/api/runs/nope/events"),
        ("GET", "/api/runs/nope/resume-checks"),
        ("GET", "/api/stream?pair=nope"),
    ],
)
def test_unknown_ids_are_404_with_a_message(client: TestClient, method: str, path: str) -> None:
    r = client.request(method, path)
    assert r.status_code == 404 and "nope" in r.json()["detail"]


@pytest.mark.parametrize(
    ("body", "headers", "status", "says"),
    [
        ('{"preset": "no-such-lesson"}', {}, 404, "unknown preset 'no-such-lesson'"),
        ('{"preset": ', {}, 400, "not valid JSON"),
        ("{}", {}, 422, "preset: Field required"),
        ('{"preset": "quick", "steps": 1}', {}, 422, "steps: Extra inputs"),
        ('{"preset": 5}', {}, 422, "preset: Input should be a valid string"),
        ('{"preset": "../../etc/passwd.toml"}', {}, 404, "unknown preset"),
        ('{"preset": "' + "x" * 70000 + '"}', {}, 413, "over the limit"),
    ],
)
def test_bad_input_gets_a_clear_4xx_and_changes_nothing(
    client: TestClient, body: str, headers: dict[str, str], status: int, says: str
) -> None:
    r = client.post(
        "/api/pairs", content=body, headers={"content-type": "application/json", **headers}
    )
    assert r.status_code == status and says in r.json()["detail"], r.text
    assert app_state(client).lab.store.runs_in(["queued", "starting", "running"]) == []


def test_a_chunked_oversized_body_is_refused(client: TestClient) -> None:
    chunks = (b"x" * 10_000 for _ in range(10))
    r = client.post("/api/pairs", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_an_unknown_record_kind_is_422(client: TestClient) -> None:
    created = start_pair(client)
    r = client.get(f"/api/runs/{created['runs'][0]['id']}/records", params={"kind": "bogus"})
    assert r.status_code == 422 and "kind" in r.json()["detail"]


def test_the_page_is_served_at_the_root(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]


def test_every_route_and_setting_is_documented(tmp_path: Path) -> None:
    doc = (Path(__file__).parents[3] / "docs" / "server.md").read_text()
    app = create_app(Settings(data_dir=tmp_path))
    routes = [
        f"{method.upper()} {path}"
        for path, item in app.openapi()["paths"].items()
        for method in item
    ]
    missing = [r for r in routes if f"`{r}" not in doc]
    assert not missing, f"routes missing from docs/server.md: {missing}"
    missing = [f for f in Settings.__dataclass_fields__ if f"`{f}`" not in doc]
    assert not missing, f"settings missing from docs/server.md: {missing}"


def test_a_405_names_in_allow_every_method_its_path_answers(client: TestClient) -> None:
    for method, path, allow in (
        ("DELETE", "/api/instructor/presets", "GET, POST"),  # two routes, one path
        ("PATCH", "/api/instructor/presets/quick", "DELETE, GET, PUT"),
        # A word of its own, not a preset id: /presets/{preset} does not claim it.
        ("OPTIONS", "/api/instructor/presets/validate", "POST"),
        ("GET", "/api/instructor/presets/validate", "POST"),
        ("PUT", "/api/pairs", "POST"),
        ("POST", "/static/app.js", "GET, HEAD"),
    ):
        r = client.request(method, path)
        assert r.status_code == 405, (method, path, r.text)
        assert r.headers["allow"] == allow, (method, path)


def test_every_operation_lists_the_statuses_the_middlewares_answer_before_it(
    client: TestClient,
) -> None:
    """A body over max_body_bytes gets 413 and a Host not the lab's 400 on any route, a
    route with no body of its own included: the schema says so for each."""
    schema = client.get("/openapi.json").json()
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            listed = set(operation["responses"])
            assert {"400", "413"} <= listed, f"{method.upper()} {path}: {sorted(listed)}"
    big = "x" * (app_state(client).settings.max_body_bytes + 1)
    r = client.post("/api/instructor/logout", content=big)
    assert r.status_code == 413 and "over the limit" in r.json()["detail"]


def test_a_run_that_ends_has_every_record_it_wrote_stored_before_it_says_so(
    settings: Settings,
) -> None:
    """The supervisor's 'finished' can come before the ingest pass that reads the last
    lines: the lab stores them first, so whoever sees 'finished' can read them all."""
    import json

    from crashdrill.server.lab import Lab
    from crashdrill.workers.launch import Change

    lab = Lab(settings, sampler_factory=FakeSampler)
    try:
        run_dir = settings.data_dir / "runs" / "r1"
        run_dir.mkdir(parents=True)
        lab.store.create_pair("p1", "owner", "quick", {"knob": {}}, [("r1", "A", str(run_dir))])
        lines = [{"v": 1, "kind": "step", "t": 1.0, "segment": 0, "step": s} for s in (1, 2, 3)]
        (run_dir / "records.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        stored = lab.reports.store_change("r1", Change("finished", exit_code=0))
        assert stored is not None
        _row, messages = stored
        assert [m.event for _, m in messages] == ["records", "run"]
        assert [json.loads(i)["step"] for i in messages[0][1].items] == [1, 2, 3]
        row = lab.store.run("r1")
        assert row is not None and (row["state"], row["step"]) == ("finished", 3)
        assert len(lab.store.records("r1", ["step"], 0, 10)) == 3
    finally:
        lab.close()
