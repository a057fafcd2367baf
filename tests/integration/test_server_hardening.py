"""A lab for a class of untrusted students, against the real server (uvicorn on loopback,
the stand-in trainer as real subprocesses): trainers' environments, corpora, instructor
sessions, cross-origin requests and security headers, and the bounds on streams, the class
view, the catalog and the paths records show (issue #15, items 4-7)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from itsdangerous import TimestampSigner, URLSafeTimedSerializer

from crashdrill.server.settings import Settings
from crashdrill.workers.trainer_env import SERVER_SECRETS
from crashdrill.workers.trainer_process import find_live_trainer
from tests.support.lab import free_port, serving, stand_in_settings, wait_for_pair

pytestmark = pytest.mark.timeout(180)

TOKEN = "a-long-instructor-token-for-tests"
SECRET_KEY = "cookie-signing-key-of-this-test"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
SECRETS = {
    "CRASHDRILL_INSTRUCTOR_TOKEN": TOKEN,
    "CRASHDRILL_SECRET_KEY": SECRET_KEY,
    "CRASHDRILL_DATABASE_URL": "postgresql://lab:hunter2@db.example/lab",
    "SUPABASE_SERVICE_KEY": "service-role-key",
    "SUPABASE_ANON_KEY": "anon-key",
    "SUPABASE_URL": "https://project.supabase.co",
}


def lab_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **changes: Any) -> Settings:
    settings: Settings = stand_in_settings(tmp_path / "lab", monkeypatch, steps=3000, token=TOKEN)
    return dataclasses.replace(
        settings, port=free_port(), telemetry=False, secret_key=SECRET_KEY, **changes
    )


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return lab_settings(tmp_path, monkeypatch)


@pytest.fixture
def client(settings: Settings) -> Iterator[httpx.Client]:
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as c:
        yield c


def start_pair(client: httpx.Client, **headers: str) -> dict[str, Any]:
    r = client.post("/api/pairs", json={"preset": "quick"}, headers=headers)
    assert r.status_code == 201, r.text
    made: dict[str, Any] = r.json()  # the API's JSON: {"pair": id, "runs": [{"id", "label"}]}
    return made


# ---- 4. trainers ----------------------------------------------------------------------


def test_a_live_trainer_s_environment_holds_none_of_the_server_s_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)  # the server process's environment holds them
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    settings = lab_settings(tmp_path, monkeypatch)
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        made = start_pair(client)
        pair = str(made["pair"])
        wait_for_pair(client, pair, lambda rs: all(r["step"] for r in rs), "both runs training")
        for run in made["runs"]:
            run_dir = settings.runs_dir / run["id"]
            pid = find_live_trainer(run_dir, [], scan=True)
            assert pid is not None, f"no live trainer for {run_dir}"
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            env = dict(e.split("=", 1) for e in raw.decode().split("\0") if "=" in e)
            assert not SERVER_SECRETS & set(env), sorted(SERVER_SECRETS & set(env))
            for value in SECRETS.values():
                assert value.encode() not in raw
            assert env["PATH"] and env["OMP_NUM_THREADS"] == "1"
            assert env["CRASHDRILL_CORPORA_DIR"] == str(settings.corpora)
            assert env["CRASHDRILL_STANDIN_STEPS"] == "3000"  # CRASHDRILL_TRAINER_ENV_PASS


PRESET = """id = "{id}"
number = "9.{n}"
title = "Reading a corpus"
question = "Which text?"
published = true

[run]
data = "{data}"
n_layer = 1
d_model = 32
n_head = 2
ctx = 32
batch = 4
steps = 40
threads = 1

[knob]
name = "ckpt_every"
a = 10
b = 20
"""


def test_a_preset_may_read_corpora_only_from_the_corpora_directory(
    settings: Settings, client: httpx.Client, tmp_path: Path
) -> None:
    settings.corpora.mkdir(parents=True)
    (settings.corpora / "notes.txt").write_text("a class's own text\n" * 50, "utf-8")
    (tmp_path / "private.txt").write_text("the server's file\n", "utf-8")
    (settings.corpora / "escape.txt").symlink_to(tmp_path / "private.txt")
    for n, data in enumerate(["file:/proc/self/environ", "file:/dev/zero", "file:escape.txt"]):
        text = PRESET.format(id=f"leak-{n}", n=n, data=data)
        # The editor's check answers 200 with the errors (no failed request per keystroke);
        # saving the same text is refused.
        r = client.post("/api/instructor/presets/validate", json={"text": text}, headers=BEARER)
        assert r.status_code == 200 and r.json()["ok"] is False, r.text
        assert data in r.json()["detail"] and "corpora directory" in r.json()["detail"]
        r = client.post("/api/instructor/presets", json={"text": text}, headers=BEARER)
        assert r.status_code == 422, r.text
        assert data in r.json()["detail"] and "corpora directory" in r.json()["detail"]
    good = PRESET.format(id="own-text", n=9, data="file:notes.txt")
    assert (
        client.post("/api/instructor/presets", json={"text": good}, headers=BEARER).status_code
        == 201
    )


def test_a_pair_of_a_preset_whose_corpus_left_the_directory_is_refused_when_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = tmp_path / "presets"
    extra.mkdir()
    (extra / "leak.toml").write_text(PRESET.format(id="leak", n=1, data="file:/proc/self/environ"))
    monkeypatch.setenv("CRASHDRILL_PRESETS_DIR", str(extra))
    settings = lab_settings(tmp_path, monkeypatch)
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        r = client.post("/api/pairs", json={"preset": "leak"})
        assert r.status_code == 422, r.text
        assert "/proc/self/environ" in r.json()["detail"]
        assert not settings.runs_dir.exists() or not any(settings.runs_dir.iterdir())


# ---- 5. instructor sessions -----------------------------------------------------------


def test_a_short_instructor_token_stops_the_server_with_exit_2_naming_it(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    proc = run_cli(
        "serve",
        "--data-dir",
        str(tmp_path / "lab"),
        "--port",
        str(free_port()),
        env={"CRASHDRILL_INSTRUCTOR_TOKEN": "short-token"},
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "CRASHDRILL_INSTRUCTOR_TOKEN" in proc.stderr and "at least 16" in proc.stderr


def login(client: httpx.Client, **headers: str) -> httpx.Response:
    r = client.post("/api/instructor/login", json={"token": TOKEN}, headers=headers)
    assert r.status_code == 200, r.text
    return r


def test_logout_revokes_the_session_so_a_copied_cookie_no_longer_works(
    client: httpx.Client,
) -> None:
    r = login(client)
    cookie = r.cookies["crashdrill_instructor"]
    assert TOKEN not in cookie
    set_cookie = r.headers["set-cookie"]
    assert "HttpOnly" in set_cookie and "Max-Age=43200" in set_cookie
    assert "Secure" not in set_cookie  # plain http, no trusted proxy
    copy = {"Cookie": f"crashdrill_instructor={cookie}"}
    assert client.get("/api/instructor/me", headers=copy).json()["instructor"] is True
    assert client.post("/api/instructor/logout").status_code == 200
    assert client.get("/api/instructor/me", headers=copy).json()["instructor"] is False
    assert client.get("/api/instructor/presets", headers=copy).status_code == 401


def test_a_session_cookie_older_than_the_session_lifetime_is_refused(
    client: httpx.Client,
) -> None:
    cookie = login(client).cookies["crashdrill_instructor"]
    signer = URLSafeTimedSerializer(SECRET_KEY, salt="crashdrill-instructor-session")
    sid = signer.loads(cookie)  # the server's session id, nothing derived from the token

    class Yesterday(TimestampSigner):
        def get_timestamp(self) -> int:
            return int(time.time()) - 13 * 3600

    old = URLSafeTimedSerializer(
        SECRET_KEY, salt="crashdrill-instructor-session", signer=Yesterday
    ).dumps(sid)
    headers = {"Cookie": f"crashdrill_instructor={old}"}
    assert client.get("/api/instructor/me", headers=headers).json()["instructor"] is False
    fresh = {"Cookie": f"crashdrill_instructor={cookie}"}
    assert client.get("/api/instructor/me", headers=fresh).json()["instructor"] is True


def test_cookies_are_secure_over_https_and_behind_a_trusted_proxy_that_says_https(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    https = lab_settings(tmp_path / "a", monkeypatch, https=True)
    with serving(https) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert "Secure" in login(client).headers["set-cookie"]
        assert "Secure" in client.get("/api/presets").headers["set-cookie"]
    proxied = lab_settings(tmp_path / "b", monkeypatch, trusted_proxies=("127.0.0.1",))
    with serving(proxied) as url, httpx.Client(base_url=url, timeout=30) as client:
        behind = login(client, **{"X-Forwarded-Proto": "https"})
        assert "Secure" in behind.headers["set-cookie"]
        assert "Secure" not in login(client).headers["set-cookie"]
    untrusted = lab_settings(tmp_path / "c", monkeypatch)
    with serving(untrusted) as url, httpx.Client(base_url=url, timeout=30) as client:
        forged = login(client, **{"X-Forwarded-Proto": "https"})
        assert "Secure" not in forged.headers["set-cookie"]


def test_the_right_token_works_after_ten_wrong_ones_from_the_same_address(
    client: httpx.Client,
) -> None:
    codes = [
        client.post("/api/instructor/login", json={"token": f"guess-{i}"}).status_code
        for i in range(11)
    ]
    assert codes == [401] * 10 + [429]
    assert client.post("/api/instructor/login", json={"token": TOKEN}).status_code == 200
    assert client.get("/api/instructor/presets", headers=BEARER).status_code == 200
    r = client.get("/api/instructor/presets", headers={"Authorization": "Bearer guess-x"})
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0


# ---- 6. browsers ----------------------------------------------------------------------


def test_state_changes_from_another_origin_are_refused_and_from_the_lab_s_own_accepted(
    client: httpx.Client,
) -> None:
    own = str(client.base_url).rstrip("/")
    for headers in (
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Referer": "https://evil.example/page.html"},
    ):
        r = client.post("/api/pairs", json={"preset": "quick"}, headers=headers)
        assert r.status_code == 403, (headers, r.text)
        assert "may not change this lab's state" in r.json()["detail"]
        r = client.post("/api/instructor/login", json={"token": TOKEN}, headers=headers)
        assert r.status_code == 403
    made = start_pair(client, Origin=own)
    run = made["runs"][0]["id"]
    r = client.post(f"/api/runs/{run}/stop", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403
    r = client.post("/api/instructor/login", json={"token": TOKEN}, headers={"Referer": own + "/"})
    assert r.status_code == 200
    assert client.get("/api/presets", headers={"Origin": "https://evil.example"}).status_code == 200


def test_a_page_rebound_to_the_lab_s_address_is_refused_before_its_origin_is_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DNS rebinding: the attacker's name now resolves to 127.0.0.1, so the browser sends
    # its Host and a matching Origin, which the Origin check alone takes as the lab's own.
    settings = lab_settings(tmp_path, monkeypatch, allowed_hosts=())
    rebound = "rebind.attacker.example:8802"
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        headers = {"Host": rebound, "Origin": f"http://{rebound}"}
        r = client.post("/api/pairs", json={"preset": "quick"}, headers=headers)
        assert r.status_code == 400, r.text
        assert "DNS rebinding" in r.json()["detail"]
        assert client.get("/api/presets", headers={"Host": rebound}).status_code == 400
        own = f"localhost:{settings.port}"
        start_pair(client, Host=own, Origin=f"http://{own}")


def test_an_allowed_origin_may_send_state_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = lab_settings(tmp_path, monkeypatch, allowed_origins=("https://lms.example.edu",))
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        start_pair(client, Origin="https://lms.example.edu")
        r = client.post("/api/pairs", json={"preset": "quick"}, headers={"Origin": "https://x.io"})
        assert r.status_code == 403


def test_every_response_carries_csp_framing_nosniff_and_referrer_headers(
    client: httpx.Client,
) -> None:
    for path in ("/", "/api/presets", "/class", "/static/app.js", "/api/no-such-route"):
        r = client.get(path)
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert "unsafe-inline" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "same-origin"


def test_the_pages_hold_no_inline_script_or_style_that_the_csp_would_block(
    client: httpx.Client,
) -> None:
    import re

    for path in ("/", "/instructor", "/class", "/lesson/quick"):
        html = client.get(path).text
        for tag in re.findall(r"<script\b[^>]*>", html):
            assert "src=" in tag or 'type="application/json"' in tag, (path, tag)
        assert not re.search(r"<style\b|\sstyle=|\son[a-z]+=", html), path


# ---- 7. bounds --------------------------------------------------------------------------


def test_event_streams_are_capped_per_address_and_in_all_with_a_clear_429(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = lab_settings(tmp_path, monkeypatch, stream_max_per_address=2, stream_max_total=3)
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        pair = start_pair(client)["pair"]
        path = f"/api/stream?pair={pair}"
        with client.stream("GET", path) as one, client.stream("GET", path) as two:
            assert one.status_code == two.status_code == 200
            r = client.get(path)
            assert r.status_code == 429 and "CRASHDRILL_STREAM_MAX_PER_ADDRESS" in r.text
            assert int(r.headers["retry-after"]) > 0
        deadline = time.monotonic() + 10
        while True:  # closed streams give their slots back
            with client.stream("GET", path) as again:
                if again.status_code == 200:
                    break
            assert time.monotonic() < deadline, "closed streams kept their slots"
            time.sleep(0.2)


def test_the_class_view_comes_a_page_at_a_time(client: httpx.Client) -> None:
    made = [start_pair(client, **BEARER)["pair"] for _ in range(3)]
    first = client.get("/api/instructor/class?limit=2", headers=BEARER).json()
    assert first["total"] == 3 and len(first["pairs"]) == 2
    second = client.get("/api/instructor/class?limit=2&offset=2", headers=BEARER).json()
    assert len(second["pairs"]) == 1
    seen = [p["pair"] for p in first["pairs"] + second["pairs"]]
    assert seen == list(reversed(made))  # all live: newest first
    r = client.get("/api/instructor/class?limit=100000", headers=BEARER)
    assert r.status_code == 422


def test_the_catalog_is_read_again_only_when_a_preset_file_changes(
    settings: Settings, client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    import crashdrill.server.lessons.catalog as catalog

    reads: list[str] = []
    real = catalog.parse_text

    def counting(text: str, source: str = "the preset") -> object:
        reads.append(source)
        return real(text, source)

    real_builtins = catalog.list_presets

    def counting_builtins() -> object:
        reads.append("built-ins")
        return real_builtins()

    monkeypatch.setattr(catalog, "parse_text", counting)
    monkeypatch.setattr(catalog, "list_presets", counting_builtins)
    text = PRESET.format(id="mine", n=5, data="builtin")
    assert (
        client.post("/api/instructor/presets", json={"text": text}, headers=BEARER).status_code
        == 201
    )
    client.get("/api/presets")
    reads.clear()
    for _ in range(3):
        client.get("/api/presets")
    assert reads == [], "the catalog parsed presets again though no file changed"
    path = settings.instructor_presets_dir / "mine.toml"
    path.write_text(path.read_text().replace("Reading a corpus", "Changed by hand"))
    titles = {p["id"]: p["title"] for p in client.get("/api/presets").json()}
    assert titles["mine"] == "Changed by hand"


def test_records_and_events_show_paths_relative_to_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings: Settings = stand_in_settings(tmp_path / "lab", monkeypatch, steps=30)
    settings = dataclasses.replace(settings, port=free_port(), telemetry=False)
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        made = start_pair(client)
        runs = wait_for_pair(
            client, str(made["pair"]), lambda rs: all(r["state"] == "finished" for r in rs), "end"
        )
        for run in runs:
            records = client.get(f"/api/runs/{run['id']}/records?kind=ckpt").json()["records"]
            assert records and all(r["path"].startswith("ckpt/") for r in records), records
            body = client.get(f"/api/runs/{run['id']}/records").text
            body += client.get(f"/api/runs/{run['id']}/events").text
            body += client.get(f"/api/pairs/{made['pair']}").text
            assert str(settings.data_dir) not in body
