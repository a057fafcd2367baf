"""The mirror's settings, its TrainConfig knob, and the ingest of DIR/mirror.jsonl."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from crashdrill.server.ingest import ingest_mirror_log, ingest_run
from crashdrill.server.settings import Settings, SettingsError
from crashdrill.server.storage.store import Store
from crashdrill.trainer.config import ConfigError, TrainConfig
from tests.support.postgres import open_test_database
from tests.support.rows import present


def test_the_default_mirror_is_a_directory_beside_the_data_dir(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path / "lab").mirror_url == str(tmp_path / "lab-mirror")
    assert Settings(data_dir=tmp_path / "lab", mirror="off").mirror_url is None


def test_the_mirror_comes_from_the_environment_and_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_MIRROR", "gs://my-bucket/lab/")
    assert Settings.from_env(data_dir=tmp_path).mirror_url == "gs://my-bucket/lab"
    flag = Settings.from_env(data_dir=tmp_path, mirror=str(tmp_path / "m"))
    assert flag.mirror_url == str(tmp_path / "m")


@pytest.mark.parametrize("bad", ["s3://bucket/x", "gs://No_Such/x", "http://host/x"])
def test_a_bad_mirror_setting_names_the_value_and_what_is_allowed(tmp_path: Path, bad: str) -> None:
    with pytest.raises(SettingsError) as e:
        Settings(data_dir=tmp_path, mirror=bad)
    assert repr(bad) in str(e.value) and "gs://BUCKET[/PREFIX]" in str(e.value)
    assert "or off" in str(e.value)


def test_the_mirror_knob_is_validated_and_does_not_change_the_fingerprint() -> None:
    on = TrainConfig()
    assert on.mirror == "on"
    assert TrainConfig(mirror="off").fingerprint() == on.fingerprint()
    with pytest.raises(ConfigError, match="mirror = 'yes' is not allowed: one of 'on', 'off'"):
        TrainConfig(mirror="yes")


# ---------------------------------------------------------------- ingest


@pytest.fixture
def store(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Store]:
    db = open_test_database("sqlite", tmp_path, request)
    db.migrate()
    s = Store(db)
    s.create_pair("p1", "owner", "quick", {"knob": {}}, [("r1", "A", str(tmp_path / "r1"))])
    (tmp_path / "r1").mkdir()
    yield s
    db.close()


def _line(**rec: object) -> str:
    return json.dumps({"v": 1, "t": 2.0, "segment": 0, **rec}) + "\n"


def test_mirror_jsonl_is_ingested_once_beside_records_jsonl(store: Store, tmp_path: Path) -> None:
    (tmp_path / "r1" / "records.jsonl").write_text(
        _line(kind="step", step=1, loss=1.0) + _line(kind="event", text="Training.")
    )
    mirror = _line(kind="mirror", step=50, seconds=1.3, url="gs://b/r1/step-00000050")
    event = _line(kind="event", level="info", code="mirror", step=50, text="copied")
    (tmp_path / "r1" / "mirror.jsonl").write_text(mirror + event + '{"kind": "eve')
    batch = ingest_run(store, present(store.run("r1"), "run r1"))
    assert batch is not None and len(batch.inserted) == 2
    row = store.run("r1")
    assert row is not None
    got, offset = ingest_mirror_log(store, row, 0)
    assert got is not None and [r.kind for _, r in got.inserted] == ["mirror", "event"]
    assert offset == len(mirror + event)  # the torn last line waits for its newline
    after = store.run("r1")
    assert after is not None and after["ingest_offset"] == row["ingest_offset"]
    assert json.loads(after["latest_json"])["mirror"]["step"] == 50
    assert json.loads(after["latest_json"])["step"]["step"] == 1
    again, _ = ingest_mirror_log(store, after, 0)  # a server restart reads it from 0
    assert again is not None and again.inserted == []
    texts = [json.loads(r["data"])["text"] for r in store.records_of_kind("r1", "event")]
    assert texts == ["Training.", "copied"]
