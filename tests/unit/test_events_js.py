"""The event log (web/static/events.js) renders from an event's code and fields, with the
codes' weights from the record contract — run in node on records shaped as the stream
sends them and on the contract the API serves."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from crashdrill.trainer.event_record import event
from crashdrill.trainer.record_contract import contract_json

STATIC = Path(__file__).resolve().parents[2] / "web" / "static"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the page's modules")


def rows(events: list[dict[str, Any]], contract: dict[str, Any] | None = None) -> Any:
    """eventRows of a pair whose run A has `events`, as [id, kind, note] rows."""
    model, log = (json.dumps((STATIC / m).as_uri()) for m in ("model.js", "events.js"))
    code = f"""
        Promise.all([import({model}), import({log})]).then(([m, ev]) => {{
            const pair = {{eventCodes: m.eventCodes({json.dumps(contract or contract_json())}),
                           ordered: () => [{{label: "A", events: {json.dumps(events)}}}]}};
            const out = ev.eventRows(pair).map(([l, e, kind, note]) => [e.id, kind, note]);
            console.log(JSON.stringify(out));
        }})"""
    assert NODE is not None
    done = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def ckpt(id_: int, step: int, segment: int = 0) -> dict[str, Any]:
    e = event(
        "checkpoint",
        "A sentence the page does not read.",
        segment=segment,
        step=step,
        bytes=1500000,
        seconds=0.01,
        persist_seconds=0.01,
        mode="sync",
        parts=["weights"],
    )
    return {**e, "id": id_, "t": id_}


def mirror(id_: int, step: int, seconds: float, segment: int = 0) -> dict[str, Any]:
    e = event("mirror", "Copied.", segment=segment, step=step, seconds=seconds, bytes=9,
              superseded=[])  # fmt: skip
    return {**e, "id": id_, "t": id_}


def test_a_mirror_copy_folds_into_its_checkpoint_s_row_by_segment_and_step() -> None:
    got = rows([ckpt(1, 50), ckpt(2, 50, segment=1), mirror(3, 50, 0.0213, segment=1),
                mirror(4, 100, 1.24)])  # fmt: skip
    assert got == [
        [4, "routine", ""],  # no checkpoint 100 in the log: the copy keeps its own row
        [2, "routine", "copied to the mirror in 0.02s, in the background"],
        [1, "routine", ""],
    ]


def test_key_and_routine_come_from_the_contract_s_weights() -> None:
    restart = event("crash", "Crash test.", at_step=61, resume_from=50, lost_steps=11,
                    crash_mode="kill")  # fmt: skip
    evaluated = event("evaluated", "Step 50: val …", step=50, val_loss=2.0, train_loss=1.9)
    events = [
        {**restart, "id": 1, "t": 1},
        {**evaluated, "id": 2, "t": 2},
        {**event("stopping", "Stopping.", step=7), "id": 3, "t": 3},
        {**event("mirror_failed", "Could not copy.", step=50), "id": 4, "t": 4},
    ]
    assert rows(events) == [[4, "key", ""], [3, "info", ""], [2, "routine", ""], [1, "key", ""]]
    # Another weight in the contract, another look: the page holds no list of its own.
    contract = contract_json()
    for e in contract["events"]:
        if e["code"] == "evaluated":
            e["weight"] = "key"
    assert rows(events, contract)[2] == [2, "key", ""]


def test_events_stored_before_the_codes_still_show_as_plain_lines() -> None:
    old = [
        {"kind": "event", "id": 1, "t": 1, "level": "info",
         "text": "Checkpoint at step 50: 1.5 MB (weights) in 0.01s."},
        {"kind": "event", "id": 2, "t": 2, "level": "warn", "text": "Something odd."},
        {"kind": "event", "id": 3, "t": 3, "code": "mirror", "step": 50, "level": "info",
         "text": "Checkpoint step 50 copied to the mirror /m in 0.02s (background)."},
    ]  # fmt: skip
    assert rows(old) == [[3, "routine", ""], [2, "key", ""], [1, "info", ""]]


def waiting_rows(events: list[dict[str, Any]], now: float) -> Any:
    """eventRows at `now` of a pair whose run A has `events`, as [code, note] rows."""
    model, log = (json.dumps((STATIC / m).as_uri()) for m in ("model.js", "events.js"))
    code = f"""
        Promise.all([import({model}), import({log})]).then(([m, ev]) => {{
            const pair = {{eventCodes: m.eventCodes({json.dumps(contract_json())}),
                           ordered: () => [{{label: "A", events: {json.dumps(events)}}}]}};
            const out = ev.eventRows(pair, {now}).map(([l, e, kind, note]) => [e.code, note]);
            console.log(JSON.stringify(out));
        }})"""
    assert NODE is not None
    done = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_a_blind_launcher_s_lost_rank_counts_down_to_the_collective_timeout() -> None:
    lost = event("rank_lost_waiting", "Rank 1 was lost.", segment=0, lost_rank=1, status=137,
                 timeout_s=15.0, deadline=1015.0)  # fmt: skip
    waiting = {**lost, "id": 1, "t": 1000.0}
    assert waiting_rows([waiting], 1000.2) == [
        ["rank_lost_waiting", "the survivors' collective times out in 15 s"]
    ]
    assert waiting_rows([waiting], 1011.5)[0][1] == "the survivors' collective times out in 4 s"
    over = event("collective_timed_out", "Timed out.", level="error", segment=0, rank=0,
                 lost_rank=1, waited_s=15.02)  # fmt: skip
    got = waiting_rows([waiting, {**over, "id": 2, "t": 1015.1}], 1016.0)
    assert got[1] == ["rank_lost_waiting", "the collective timed out after 15.0 s"], got
