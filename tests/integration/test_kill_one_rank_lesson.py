"""Lesson 1.16 with Crash test's other choice, Kill one rank (#34 §2): the real server
in-process, the real trainer on two gloo ranks, one rank's process SIGKILLed through the
crash route's `crash_mode`. Its text promises the same outcome either way: A's resume is
bit-identical on both ranks, B's names rank 1 first; the crash event names the rank
killed, and while the group restarts the view's `ranks` says which one was lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_lessons import Pair, predict, report, start
from tests.support.lab import lab_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    with lab_client(tmp_path / "lab") as c:
        yield c


def kill_one_rank_at(pair: Pair, label: str, step: int) -> dict[str, Any]:
    i = "AB".index(label)
    pair.wait(
        lambda rs: rs[i]["can_crash"] and rs[i]["segment"] == 0 and (rs[i]["step"] or 0) >= step,
        f"{label} to reach step {step}",
    )
    r = pair.client.post(f"/api/runs/{pair.runs[i]}/crash", json={"crash_mode": "rank"})
    assert r.status_code == 202, r.text
    body: dict[str, Any] = r.json()
    assert body["crash_mode"] == "rank"
    return body


def test_lesson_1_16_s_kill_one_rank_gives_the_outcome_its_text_promises(
    client: httpx.Client,
) -> None:
    pair = start(client, "lesson-1.16")
    predict(pair, {"A": "yes", "B": "yes"})
    kill_one_rank_at(pair, "B", 60)
    lost = pair.wait(
        lambda rs: any(r["state"] == "lost" for r in rs[1]["ranks"] or []), "B's rank lost", 60
    )[1]["ranks"]
    kill_one_rank_at(pair, "A", 60)
    runs = pair.wait(
        lambda rs: all(r["state"] in ("finished", "failed", "stopped") for r in rs),
        "both runs to end",
    )
    assert [r["state"] for r in runs] == ["finished", "finished"]
    assert [r["state"] for r in runs[0]["ranks"]] == ["finished", "finished"]
    killed = next(r["rank"] for r in lost if r["state"] == "lost")
    for label in "AB":
        crash = next(e for e in pair.events(label) if e["code"] == "crash")
        assert crash["fields"]["crash_mode"] == "rank", crash
        assert f"Crash test: killed rank {killed} of 2" in crash["text"], crash["text"]
    (a,) = pair.checks("A")
    (b,) = pair.checks("B")
    assert a["bit_identical"] is True and a["complete"], a
    assert b["bit_identical"] is False and b["first_divergent_rank"]["rank"] == 1, b
    report("lesson-1.16, kill one rank", killed=killed, B_ranks_while_restarting=lost)
