"""Fan-out: every record for a client that keeps up, latest values for a slow one."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from crashdrill.server.storage.store import state_rank
from crashdrill.server.stream.fanout import LocalFanout, Message


def records(run: str, ids: range) -> Message:
    items = [json.dumps({"id": i, "kind": "step"}) for i in ids]
    return Message("records", f"records:{run}", "append", items=items, run=run, last_id=ids[-1])


def parse(frame: bytes) -> tuple[str, str | None, dict[str, Any]]:
    fields = dict(line.split(": ", 1) for line in frame.decode().strip().split("\n"))
    return fields["event"], fields.get("id"), json.loads(fields["data"])


def test_a_client_that_keeps_up_gets_every_record() -> None:
    async def main() -> list[int]:
        fan = LocalFanout(max_items=100)
        sub = fan.subscribe(["run:a"])
        got: list[int] = []
        for start in range(0, 30, 3):
            fan.publish("run:a", records("a", range(start, start + 3)))
            for frame in await sub.next(1.0):
                got += [r["id"] for r in parse(frame)[2]["records"]]
        return got

    assert asyncio.run(main()) == list(range(30))


def test_a_slow_client_gets_latest_values_and_a_bounded_record_backlog() -> None:
    async def main() -> None:
        fan = LocalFanout(max_items=10)
        sub = fan.subscribe(["run:a", "machine"])
        for i in range(50):
            fan.publish("run:a", records("a", range(i * 2, i * 2 + 2)))
            fan.publish("run:a", Message("run", "run:a", data=json.dumps({"step": i})))
            fan.publish("machine", Message("telemetry", "machine", data=json.dumps({"n": i})))
        frames = await sub.next(1.0)
        assert len(frames) == 3  # one per key, not 150
        by_event = {parse(f)[0]: parse(f) for f in frames}
        _, last_id, data = by_event["records"]
        assert data["gap"] is True and last_id == "99"
        assert [r["id"] for r in data["records"]] == list(range(90, 100))
        assert by_event["run"][2] == {"step": 49}
        assert by_event["telemetry"][2] == {"n": 49}
        assert sub.dropped == 90

    asyncio.run(main())


def test_next_times_out_empty_and_unsubscribe_stops_delivery() -> None:
    async def main() -> None:
        fan = LocalFanout()
        sub = fan.subscribe(["run:a"])
        assert await sub.next(0.01) == []
        fan.unsubscribe(sub)
        fan.publish("run:a", records("a", range(1)))
        assert sub.closed and await sub.next(0.01) == []
        assert fan.subscribers() == 0

    asyncio.run(main())


def test_multiline_data_stays_one_sse_event() -> None:
    async def main() -> None:
        fan = LocalFanout()
        sub = fan.subscribe(["x"])
        fan.publish("x", Message("run", "k", data='{"a":\n1}'))
        [frame] = await sub.next(1.0)
        assert frame == b'event: run\ndata: {"a":\ndata: 1}\n\n'

    asyncio.run(main())


def view(state: str, step: int) -> Message:
    data = json.dumps({"state": state, "step": step})
    return Message("run", "run:a", data=data, rank=state_rank(state))


def test_a_view_built_before_the_run_ended_never_follows_its_final_view() -> None:
    """Two threads read the database: the ingest's throttled view (still running) can be
    published after the supervisor's report (finished). The client keeps the end."""

    async def main() -> None:
        fan = LocalFanout()
        sub = fan.subscribe(["run:a"])
        fan.publish("run:a", view("finished", 300))
        fan.publish("run:a", view("running", 297))  # late, while the first is pending
        assert [parse(f)[2] for f in await sub.next(1.0)] == [{"state": "finished", "step": 300}]
        fan.publish("run:a", view("running", 298))  # late, after the client took the end
        assert await sub.next(0.05) == []
        fan.publish("run:a", view("restarting", 5))  # a new subscriber takes anything
        other = fan.subscribe(["run:a"])
        fan.publish("run:a", view("running", 6))
        assert [parse(f)[2]["state"] for f in await other.next(1.0)] == ["running"]

    asyncio.run(main())


def test_running_and_restarting_alternate_and_the_hello_seeds_what_is_stale() -> None:
    async def main() -> None:
        fan = LocalFanout()
        sub = fan.subscribe(["run:a"])
        fan.publish("run:a", view("starting", 0))  # published before the hello's read
        sub.seen("run:a", state_rank("running"))  # the hello said running
        assert await sub.next(0.05) == []  # the older "starting" is not sent after it
        for state in ("restarting", "running", "restarting"):
            fan.publish("run:a", view(state, 1))
            assert [parse(f)[2]["state"] for f in await sub.next(1.0)] == [state]

    asyncio.run(main())


def test_merged_record_messages_say_the_record_before_their_first() -> None:
    """`after` of a records frame is the run's record before its first item, also when
    several published batches are merged for a client: the page checks it against its own
    newest id (web/static/model.js missedBefore)."""

    async def main() -> list[object]:
        fan = LocalFanout(max_items=100)
        sub = fan.subscribe(["run:a"])
        seen: list[object] = []
        for start in (10, 13, 16):
            m = records("a", range(start, start + 3))
            fan.publish("run:a", dataclasses.replace(m, after_id=start - 1))
        seen += [parse(f)[2]["after"] for f in await sub.next(1.0)]
        fan.publish("run:a", records("a", range(19, 20)))  # the publisher did not know
        seen += [parse(f)[2].get("after") for f in await sub.next(1.0)]
        return seen

    assert asyncio.run(main()) == [9, None]
