"""The run-record contract has one home (trainer/record_contract.py): the doc spells all of
it, a real run writes nothing it does not declare, and the server reads its lists from it."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from crashdrill.trainer.event_record import check_record
from crashdrill.trainer.record_contract import (
    COMMON,
    KIND_NAMES,
    KINDS,
    STATE_KINDS,
    STEP_KEYED_KINDS,
    bits_to_float32,
    contract_json,
    float32_bits,
    kind,
)

DOC = Path(__file__).parents[2] / "docs" / "run-contract.md"


def _doc_sections() -> dict[str, str]:
    """`### \\`kind\\`` sections of docs/run-contract.md, by kind."""
    text = DOC.read_text()
    parts = re.split(r"^#{2,3} ", text, flags=re.M)
    out = {}
    for part in parts:
        m = re.match(r"`(\w+)`\n", part)
        if m:
            out[m.group(1)] = part
    return out


def _documented_fields(section: str) -> set[str]:
    return set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))


def test_every_kind_and_field_of_the_contract_is_in_run_contract_md() -> None:
    sections = _doc_sections()
    assert list(sections) == list(KIND_NAMES), "one `### `kind`` section per kind, in order"
    for k in KINDS:
        documented = _documented_fields(sections[k.name])
        assert documented == set(k.field_names()), f"{k.name}: doc {documented}"
        for f in k.fields:
            deterministic = re.search(rf"^\| `{f.name}` \|[^|]*\| yes \|", sections[k.name], re.M)
            assert bool(deterministic) == f.deterministic, f"{k.name}.{f.name}"
    records = DOC.read_text().split("## Run records", 1)[1]
    assert {f.name for f in COMMON} <= _documented_fields(records.split("### ", 1)[0])


def _short_run(run_dir: Path) -> list[dict[str, Any]]:
    """A real run of a few steps with every report due, then a restart that resumes."""
    from crashdrill.trainer.loop import RunOptions, train
    from crashdrill.trainer.presets import get_preset
    from crashdrill.trainer.records import read_records

    cfg = dataclasses.replace(
        get_preset("quick").config_for("A"),
        steps=4,
        warmup=1,
        log_every=1,
        ckpt_every=2,
        eval_every=2,
        probe_every=2,
        sample_every=2,
        sample_tokens=4,
    )
    assert train(cfg, run_dir, RunOptions(preset="quick")) == 0
    assert train(cfg, run_dir, RunOptions(preset="quick", require_checkpoint=True)) == 0
    records, _ = read_records(run_dir / "records.jsonl")
    return records


@pytest.mark.timeout(120)
def test_a_real_run_writes_exactly_the_fields_the_contract_declares(tmp_path: Path) -> None:
    records = _short_run(tmp_path)
    common = {f.name for f in COMMON}
    written: dict[str, set[str]] = {}
    codes = set()
    for rec in records:
        assert rec["kind"] in KIND_NAMES, rec
        if rec["kind"] == "event":  # its own fields are its code's (trainer/event_codes.py)
            codes.add(check_record(rec).code)
            rec = {k: rec[k] for k in (*common, *kind("event").field_names()) if k in rec}
        written.setdefault(rec["kind"], set()).update(rec)
    assert {"training_started", "checkpoint", "evaluated", "resumed", "finished"} <= codes
    for name, fields in written.items():
        undeclared = fields - common - set(kind(name).field_names())
        assert not undeclared, f"{name} records carry undeclared fields {undeclared}"
    for k in KINDS:
        if k.writers == ("trainer",):  # all of it is the trainer's: all of it is written
            one_rank = {f.name for f in k.fields if not f.ranks_only}  # this run has 1 rank
            assert one_rank <= written.get(k.name, set()), k.name


def test_the_server_takes_its_kind_lists_from_the_contract() -> None:
    from crashdrill.server import ingest, views
    from crashdrill.server.api.schemas import RecordKind, RecordKinds

    assert get_args(RecordKind) == KIND_NAMES
    assert ingest.STEP_KEYED_KINDS == STEP_KEYED_KINDS
    assert frozenset(STATE_KINDS) == ingest.LATEST_KINDS
    assert set(views.SHOWN_LATEST) == set(STATE_KINDS) - {"run"}
    RecordKinds.model_validate(contract_json())


@pytest.mark.timeout(60)
def test_the_api_serves_the_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from crashdrill.server.app import create_app
    from tests.support.lab import stand_in_settings

    settings = stand_in_settings(tmp_path / "lab", monkeypatch, steps=10)
    settings = dataclasses.replace(settings, telemetry=False)
    with TestClient(create_app(settings)) as client:
        r = client.get("/api/record-kinds")
    assert r.status_code == 200
    # The trainer's contract, and the lab's run states beside it (server/storage/store.py).
    from crashdrill.server.storage.store import run_states_json

    assert r.json() == {**contract_json(), "run_states": run_states_json()}
    keyed = {k["name"] for k in r.json()["kinds"] if k["keyed_by_step"]}
    assert keyed == STEP_KEYED_KINDS


def test_the_page_has_no_list_of_kinds_of_its_own() -> None:
    static = Path(__file__).parents[2] / "web" / "static"
    for js in static.glob("*.js"):
        text = js.read_text()
        for name in STEP_KEYED_KINDS:
            assert not re.search(rf'Set\(\[[^\]]*"{name}"', text), f"{js.name} lists kinds"


def test_float32_bits_are_exact_and_ignore_bits_past_32() -> None:
    assert float32_bits(1.0) == 0x3F800000
    assert bits_to_float32(0x3F800000) == 1.0
    assert bits_to_float32(0x1_3F80_0000) == 1.0
    assert float32_bits(0.1) != float32_bits(0.1 + 1e-8)


def test_the_contract_and_the_comparison_import_without_torch() -> None:
    code = (
        "import sys\n"
        "import crashdrill.trainer.record_contract, crashdrill.trainer.resume_compare\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
