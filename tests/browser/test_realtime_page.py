"""The page with Supabase Realtime on: it subscribes with supabase-js to a local Realtime
endpoint (tests/support/fake_realtime.py) and renders what comes through it; with the
endpoint down it falls back to the server's SSE stream and still shows the runs."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import LabServer, start_server, stop_server
from tests.support.browser_lab import wait_step
from tests.support.fake_realtime import ANON_KEY, SERVICE_KEY, FakeRealtime
from tests.support.lab import STAND_IN, free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(180)]

SUPABASE_JS = Path(__file__).resolve().parents[2] / "web" / "static" / "vendor" / "supabase.js"


@pytest.fixture
def fake() -> Iterator[FakeRealtime]:
    with FakeRealtime() as f:
        yield f


def serve(tmp_path: Path, supabase_url: str) -> LabServer:
    if not SUPABASE_JS.exists():
        pytest.fail("supabase-js is not in web/static/vendor/: run `python scripts/build_web.py`")
    return start_server(
        tmp_path / "lab",
        {
            "SUPABASE_URL": supabase_url,
            "SUPABASE_ANON_KEY": ANON_KEY,
            "SUPABASE_SERVICE_KEY": SERVICE_KEY,
            "CRASHDRILL_SUPABASE_TICK_S": "0.25",
            "CRASHDRILL_TRAINER_COMMAND": " ".join(STAND_IN),
            "CRASHDRILL_STANDIN_STEPS": "500",
            "CRASHDRILL_STANDIN_STEP_S": "0.02",
        },
    )


def start_lesson(page: Any, server: LabServer, streams: list[str]) -> str:
    page.on("request", lambda r: streams.append(r.url) if "/api/stream" in r.url else None)
    page.goto(server.url + "/?preset=browser")
    page.locator("#start:not([disabled])").click()
    page.wait_for_url(re.compile(r"\?pair="))
    return str(page.url.split("pair=")[1].split("&")[0])


def test_the_page_follows_the_runs_through_realtime_not_sse(
    tmp_path: Path, page: Any, fake: FakeRealtime
) -> None:
    server = serve(tmp_path, fake.url)
    try:
        streams: list[str] = []
        pair = start_lesson(page, server, streams)
        page.wait_for_function("() => document.body.dataset.liveTransport === 'realtime'")
        assert page.locator("#live").get_attribute("data-transport") == "realtime"
        topic = f"crashdrill:pair:{pair}"
        # The page joined with the anon key; the server publishes with the service key.
        assert (topic, "anon", True) in fake.joins
        wait_step(page, "A", 100)
        wait_step(page, "B", 100)
        assert fake.broadcasts(topic), "the server published nothing"
        # A record that only Realtime carries (the server never had it) is rendered.
        run_a = page.evaluate(
            "fetch('/api/pairs/' + new URLSearchParams(location.search).get('pair'))"
            ".then(r => r.json()).then(p => p.runs.find(r => r.label === 'A').id)"
        )
        seq = max(b.payload["seq"] for b in fake.broadcasts(topic)) + 1000
        event = {
            "v": 1,
            "kind": "event",
            "t": time.time(),
            "segment": 0,
            "level": "info",
            "text": "Pushed through Realtime only",
        }
        fake.publish(
            topic,
            "batch",
            {
                "v": 1,
                "pair": pair,
                "seq": seq,
                "tick": 0,
                "t": 0,
                "runs": [{"run": run_a, "gap": False, "records": [event]}],
            },
        )
        page.locator("#events li.run-A .event-text").filter(
            has_text="Pushed through Realtime only"
        ).wait_for(timeout=10_000)
        wait_step(page, "A", 500, timeout=90_000)
        wait_step(page, "B", 500, timeout=90_000)
        assert streams == [], f"the page opened the SSE stream: {streams}"
        assert page.errors == []
    finally:
        stop_server(server)


def test_with_realtime_down_the_page_falls_back_to_sse_and_shows_the_runs(
    tmp_path: Path, page: Any
) -> None:
    server = serve(tmp_path, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    try:
        streams: list[str] = []
        start_lesson(page, server, streams)
        page.wait_for_function(
            "() => document.body.dataset.liveTransport === 'sse'", timeout=30_000
        )
        assert streams, "the page never opened the SSE stream"
        assert page.locator("body").get_attribute("data-live-fallback")
        wait_step(page, "A", 500, timeout=90_000)
        wait_step(page, "B", 500, timeout=90_000)
        page.wait_for_function("() => document.body.dataset.pairState === 'done'", timeout=30_000)
        # Chromium reports the failed websocket as a console error; nothing else may fail.
        others = [e for e in page.errors if "WebSocket" not in e]
        assert others == []
    finally:
        stop_server(server)


def test_without_realtime_configured_the_page_uses_sse_and_loads_no_supabase_client(
    tmp_path: Path, page: Any
) -> None:
    server = start_server(
        tmp_path / "lab",
        {
            "SUPABASE_URL": "",  # whatever the environment says: Realtime off
            "CRASHDRILL_TRAINER_COMMAND": " ".join(STAND_IN),
            "CRASHDRILL_STANDIN_STEPS": "200",
            "CRASHDRILL_STANDIN_STEP_S": "0.02",
        },
    )
    try:
        scripts: list[str] = []
        page.on("request", lambda r: scripts.append(r.url) if "supabase" in r.url else None)
        streams: list[str] = []
        start_lesson(page, server, streams)
        page.wait_for_function("() => document.body.dataset.liveTransport === 'sse'")
        wait_step(page, "A", 200)
        wait_step(page, "B", 200)
        assert streams and scripts == []
        assert page.locator("body").get_attribute("data-live-fallback") is None
        assert page.errors == []
    finally:
        stop_server(server)
