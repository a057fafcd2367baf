"""Supabase Realtime: settings, the per-pair batches (size cap, gaps), one message per pair
per tick, and no secret in anything the server hands out."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from crashdrill.server.app import create_app
from crashdrill.server.settings import Settings, SettingsError
from crashdrill.server.stream.fanout import Message
from crashdrill.server.stream.realtime import (
    PAGE_KEYS,
    PairPending,
    RealtimeFanout,
    encode_batch,
    page_config,
    realtime_fanout,
    topic_of,
)
from crashdrill.server.stream.realtime_publisher import channel_params, connect
from tests.support.extras import require_extra
from tests.support.fake_realtime import ANON_KEY, SERVICE_KEY, FakeRealtime
from tests.support.lab import STAND_IN

pytestmark = pytest.mark.timeout(60)

URL = "https://abc.supabase.co"


def rt_settings(tmp_path: Path, **kw: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "lab",
        "supabase_url": URL,
        "supabase_anon_key": ANON_KEY,
        "supabase_service_key": SERVICE_KEY,
        **kw,
    }
    return Settings(**values)


def record(rid: int, run: str, pad: int = 0) -> str:
    return json.dumps({"id": rid, "run": run, "v": 1, "kind": "step", "step": rid, "x": "y" * pad})


# ---- settings ------------------------------------------------------------------------


def test_realtime_is_off_by_default_and_the_page_config_says_so(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert not settings.realtime
    assert page_config(settings) == {"realtime": None}


def test_settings_come_from_the_supabase_environment_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUPABASE_URL", URL)
    monkeypatch.setenv("SUPABASE_ANON_KEY", ANON_KEY)
    monkeypatch.setenv("SUPABASE_SERVICE_KEY", SERVICE_KEY)
    monkeypatch.setenv("CRASHDRILL_SUPABASE_TICK_S", "0.5")
    s = Settings.from_env(data_dir=tmp_path)
    assert s.realtime and s.supabase_service_key == SERVICE_KEY and s.supabase_tick_s == 0.5
    assert SERVICE_KEY not in repr(s)  # settings get logged; the service key never is


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"supabase_anon_key": None}, "SUPABASE_ANON_KEY"),
        ({"supabase_url": "abc.supabase.co"}, "SUPABASE_URL"),
        ({"supabase_service_key": ANON_KEY}, "SUPABASE_SERVICE_KEY"),
        ({"supabase_tick_s": 0.01}, "supabase_tick_s"),
        ({"supabase_max_payload_bytes": 10_000_000}, "supabase_max_payload_bytes"),
        ({"supabase_max_messages_per_s": 0}, "supabase_max_messages_per_s"),
    ],
)
def test_a_bad_supabase_setting_is_named(
    tmp_path: Path, changes: dict[str, Any], named: str
) -> None:
    with pytest.raises(SettingsError, match=named):
        rt_settings(tmp_path, **changes)


def test_the_page_config_has_the_anon_key_and_never_the_service_key(tmp_path: Path) -> None:
    config = page_config(rt_settings(tmp_path))["realtime"]
    assert set(config) == set(PAGE_KEYS)
    assert config["key"] == ANON_KEY and config["private"] is True
    assert SERVICE_KEY not in json.dumps(config)
    public = page_config(rt_settings(tmp_path, supabase_service_key=None))["realtime"]
    assert public["private"] is False


# ---- one batch -----------------------------------------------------------------------


def test_a_batch_that_fits_carries_everything_as_json() -> None:
    pending = PairPending()
    rp = pending.run("r1")
    rp.records = [record(i, "r1") for i in range(1, 4)]
    rp.view = '{"id":"r1","state":"running"}'
    rp.checks = '{"run":"r1","checks":[]}'
    text, dropped = encode_batch("p1", 3, 9, pending, '{"cpu_pct":1}', 65536)
    batch = json.loads(text)
    assert dropped == 0
    assert batch["pair"] == "p1" and batch["seq"] == 3 and batch["tick"] == 9
    (run,) = batch["runs"]
    assert [r["id"] for r in run["records"]] == [1, 2, 3] and run["gap"] is False
    assert run["view"]["state"] == "running" and run["checks"] == {"run": "r1", "checks": []}
    assert batch["telemetry"] == {"cpu_pct": 1}


@pytest.mark.parametrize("seed", range(20))
def test_an_oversized_batch_keeps_the_newest_records_under_the_cap_and_flags_the_gap(
    seed: int,
) -> None:
    rng = random.Random(seed)
    cap = rng.choice([4096, 8192, 20000])
    pending = PairPending()
    for run in ("A-run", "B-run"):
        rp = pending.run(run)
        rp.records = [record(i, run, rng.randrange(0, 400)) for i in range(rng.randrange(0, 300))]
        rp.view = json.dumps({"id": run, "latest": {"sample": "é" * rng.randrange(0, 500)}})
    text, dropped = encode_batch("pair", 1, 1, pending, json.dumps({"t": 1.5}), cap)
    assert len(text.encode()) <= cap
    batch = json.loads(text)
    total = sum(len(rp.records) for rp in pending.runs.values())
    assert sum(len(r["records"]) for r in batch["runs"]) == total - dropped
    for r in batch["runs"]:
        sent = [x["id"] for x in r["records"]]
        whole = [json.loads(x)["id"] for x in pending.runs[r["run"]].records]
        assert sent == whole[len(whole) - len(sent) :]  # the newest, in order
        assert r["gap"] == (len(sent) < len(whole))


def test_a_view_too_big_for_the_cap_is_left_out_and_marked_stale() -> None:
    pending = PairPending()
    pending.run("r1").view = json.dumps({"id": "r1", "latest": {"sample": "x" * 10000}})
    pending.run("r1").records = [record(1, "r1")]
    text, dropped = encode_batch("p", 1, 1, pending, None, 4096)
    batch = json.loads(text)
    assert (
        len(text) <= 4096 and batch["runs"][0]["stale"] is True and "view" not in batch["runs"][0]
    )
    assert dropped == 0 and batch["runs"][0]["records"][0]["id"] == 1


# ---- the fan-out: one message per pair per tick ---------------------------------------


class RecordingPublisher:
    def __init__(self, capacity: int = 100) -> None:
        self.capacity = capacity
        self.sent: list[tuple[str, dict[str, Any], int]] = []
        self.started = self.closed = False

    def start(self) -> None:
        self.started = True

    def full(self) -> bool:
        return len(self.sent) >= self.capacity

    def offer(self, topic: str, payload: str) -> bool:
        if self.full():
            return False
        self.sent.append((topic, json.loads(payload), len(payload.encode())))
        return True

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fan(tmp_path: Path) -> Iterator[tuple[RealtimeFanout, RecordingPublisher, set[str]]]:
    pairs = {"a1": "pA", "a2": "pA", "b1": "pB"}
    live: set[str] = {"pA", "pB"}

    def live_pairs() -> Iterable[str]:
        return list(live)

    pub = RecordingPublisher()
    settings = rt_settings(tmp_path, supabase_max_payload_bytes=8192, stream_max_pending_records=50)
    yield RealtimeFanout(settings, pairs.get, live_pairs, publisher=pub), pub, live


def records_message(run: str, ids: range) -> Message:
    items = [record(i, run) for i in ids]
    return Message(event="records", key=f"records:{run}", mode="append", items=items, run=run)


def test_each_tick_sends_one_message_per_pair_with_everything_since_the_last(
    fan: tuple[RealtimeFanout, RecordingPublisher, set[str]],
) -> None:
    fanout, pub, _ = fan
    sse = fanout.subscribe(["run:a1"])
    for i in range(5):
        fanout.publish("run:a1", records_message("a1", range(10 * i, 10 * i + 10)))
        fanout.publish("run:a2", records_message("a2", range(100 + i, 101 + i)))
        fanout.publish("run:a1", Message(event="run", key="run:a1", data=f'{{"step":{i}}}'))
    fanout.publish("run:b1", records_message("b1", range(7, 9)))
    fanout.publish("machine", Message(event="telemetry", key="machine", data='{"cpu_pct":3}'))
    assert fanout.flush(now=100.0) == 2
    assert sorted(t for t, _, _ in pub.sent) == [topic_of("pA"), topic_of("pB")]
    batch = next(b for t, b, _ in pub.sent if t == topic_of("pA"))
    runs = {r["run"]: r for r in batch["runs"]}
    assert [r["id"] for r in runs["a1"]["records"]] == list(range(50))
    assert [r["id"] for r in runs["a2"]["records"]] == list(range(100, 105))
    assert runs["a1"]["view"] == {"step": 4} and batch["telemetry"] == {"cpu_pct": 3}
    assert all(size <= 8192 for _, _, size in pub.sent)
    # SSE clients still get every message: one records frame with all 50 of a1's records
    frames = [f.decode() for f in asyncio.run(sse.next(0.0))]
    records = next(f for f in frames if f.startswith("event: records"))
    body = json.loads(records.split("data: ", 1)[1])
    assert sse.dropped == 0 and [r["id"] for r in body["records"]] == list(range(50))
    # Nothing new: no message (keepalives are due only after KEEPALIVE_S).
    assert fanout.flush(now=101.0) == 0
    fanout.publish("run:b1", records_message("b1", range(9, 10)))
    assert fanout.flush(now=102.0) == 1
    seqs = [b["seq"] for t, b, _ in pub.sent if t == topic_of("pB")]
    assert seqs == [1, 2]


def test_live_pairs_get_telemetry_and_keepalives_finished_ones_do_not(
    fan: tuple[RealtimeFanout, RecordingPublisher, set[str]],
) -> None:
    fanout, pub, live = fan
    live.discard("pB")
    fanout.publish("machine", Message(event="telemetry", key="machine", data='{"cpu_pct":3}'))
    assert fanout.flush(now=0.0) == 1 and pub.sent[-1][0] == topic_of("pA")
    assert fanout.flush(now=5.0) == 0
    assert fanout.flush(now=20.0) == 1  # keepalive: an empty batch
    assert pub.sent[-1][1]["runs"] == [] and "telemetry" not in pub.sent[-1][1]


def test_a_full_outbox_keeps_the_batch_pending_and_coalesces_with_a_gap(
    fan: tuple[RealtimeFanout, RecordingPublisher, set[str]],
) -> None:
    fanout, pub, live = fan
    live.clear()
    pub.capacity = 0  # the publisher is stuck (Supabase down)
    for i in range(8):
        fanout.publish("run:a1", records_message("a1", range(10 * i, 10 * i + 10)))
        assert fanout.flush() == 0
    pub.capacity = 10
    assert fanout.flush() == 1
    (run,) = pub.sent[0][1]["runs"]
    assert run["gap"] is True  # 80 records > 50 kept: the page refetches the hole
    assert [r["id"] for r in run["records"]] == list(range(30, 80))
    assert fanout.dropped == 30


# ---- what the server hands out --------------------------------------------------------


def test_no_response_contains_the_service_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "20")
    with FakeRealtime() as fake:
        settings = rt_settings(
            tmp_path, supabase_url=fake.url, trainer_command=STAND_IN, stop_runs_on_exit=True
        )
        with TestClient(create_app(settings)) as client:
            page = client.get("/")
            assert page.status_code == 200
            config = json.loads(page.text.split('id="lab-config">')[1].split("</script>")[0])
            assert config["realtime"]["key"] == ANON_KEY
            assert "/static/vendor/supabase.js" in page.text
            pair = client.post("/api/pairs", json={"preset": "quick"}).json()
            run = pair["runs"][0]["id"]
            bodies = [page.text]
            for path in (
                "/openapi.json",
                "/docs",
                "/api/presets",
                f"/api/pairs/{pair['pair']}",
                f"/api/runs/{run}/records",
                f"/api/runs/{run}/events",
                f"/api/runs/{run}/resume-checks",
                "/api/machine",
                "/static/app.js",
                "/static/realtime.js",
            ):
                r = client.get(path)
                assert r.status_code == 200, path
                bodies.append(r.text + json.dumps(dict(r.headers)))
    assert not [b for b in bodies if SERVICE_KEY in b]


def test_without_realtime_the_page_loads_no_supabase_client(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(data_dir=tmp_path / "lab"))) as client:
        page = client.get("/").text
    assert "supabase.js" not in page
    assert json.loads(page.split('id="lab-config">')[1].split("</script>")[0]) == {"realtime": None}


# ---- the client: Supabase's Python client (the `supabase` extra) -----------------------


def test_the_publisher_joins_through_supabase_s_client_at_the_project_s_realtime_url() -> None:
    require_extra("supabase")
    import supabase

    async def join(url: str) -> None:
        client = await connect(url, SERVICE_KEY, 5)
        try:
            assert isinstance(client, supabase.AsyncClient) and client.realtime.is_connected
            channel = client.channel(topic_of("p1"), channel_params(ack=True, private=True))
            await channel.subscribe()
            assert channel.is_joined
        finally:
            await client.realtime.close()

    with FakeRealtime() as fake:  # answers only at <url>/realtime/v1/websocket
        asyncio.run(join(fake.url))
    assert fake.joins == [(topic_of("p1"), "service", True)]


def test_a_lab_set_up_for_supabase_without_its_client_names_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "supabase", None)  # `import supabase` fails
    with pytest.raises(SettingsError, match=r"pip install 'crashdrill\[supabase\]'"):
        realtime_fanout(rt_settings(tmp_path), lambda run: None, list)
