"""The page refetches any hole its stream skipped (web/static/model.js `missedBefore`, used by
app.js `onRecords`): a `records` message that says `gap` (the server dropped records for a
slow page), or whose `after` — the run's record before its first one — is past the newest
record id the page has (a reconnect, a hello that raced a batch), gives the id to refetch
after; a message that follows on from what the page has gives none. Run in node on
messages shaped as server/stream/fanout.py renders them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from crashdrill.server.stream.fanout import Message, _render

STATIC = Path(__file__).resolve().parents[2] / "web" / "static"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the page's modules")


def records_message(ids: list[int], after: int | None, gap: bool = False) -> dict[str, Any]:
    """A `records` message as the stream sends it (its data line, parsed)."""
    items = [json.dumps({"id": i, "kind": "stage", "stage": "train", "t": i}) for i in ids]
    m = Message(
        event="records",
        key="records:r",
        mode="append",
        items=items,
        run="r",
        last_id=ids[-1],
        after_id=after,
    )
    frame = _render(m, items, gap=gap, last_id=ids[-1]).decode()
    data = next(line[6:] for line in frame.splitlines() if line.startswith("data: "))
    return json.loads(data)


def refetches(messages: list[dict[str, Any]]) -> list[int | None]:
    model = json.dumps((STATIC / "model.js").as_uri())
    code = f"""
        import({model}).then((m) => {{
            const run = new m.RunModel({{id: "r", label: "A", state: "running", stage: "train",
                segment: 0, crashes: 0, step: null}}, new Set(["step"]));
            const out = [];
            for (const d of {json.dumps(messages)}) {{
                out.push(run.missedBefore(d));
                run.add(d.records);
            }}
            console.log(JSON.stringify(out));
        }})"""
    assert NODE is not None
    done = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_a_stream_that_follows_on_refetches_nothing() -> None:
    msgs = [records_message([1, 2], None), records_message([3], 2), records_message([4, 5], 3)]
    assert refetches(msgs) == [None, None, None]


def test_records_skipped_without_a_gap_flag_are_refetched_from_the_page_s_newest() -> None:
    msgs = [records_message([1, 2], None), records_message([9, 10], 8), records_message([11], 10)]
    assert refetches(msgs) == [None, 2, None]


def test_a_gap_the_server_flagged_is_refetched() -> None:
    msgs = [records_message([1], None), records_message([7], 6, gap=True)]
    assert refetches(msgs) == [None, 1]


def test_the_server_says_after_only_when_it_knows_it() -> None:
    assert "after" not in records_message([1], None)
    assert records_message([5], 4)["after"] == 4
