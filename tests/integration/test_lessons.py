"""Each built-in lesson, end to end: the real server in-process, the real trainer, real
SIGKILL through the Crash test route, and the lesson's outcome asserted from what the
lab reports (resume checks, events, records, run states)."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from crashdrill.trainer.presets import get_preset
from tests.support.lab import lab_client, wait_for_pair

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LN_256 = math.log(256)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    with lab_client(tmp_path / "lab") as c:
        yield c


@dataclass
class Pair:
    client: httpx.Client
    id: str
    runs: tuple[str, str]  # A, B

    def wait(
        self, ok: Callable[[list[dict[str, Any]]], bool], what: str, limit: float = 200
    ) -> list[dict[str, Any]]:
        return wait_for_pair(self.client, self.id, ok, what, timeout_s=limit, poll_s=0.02)

    def crash_at(self, label: str, step: int) -> dict[str, Any]:
        """Crash test run `label` once its first segment has trained `step` steps."""
        i = "AB".index(label)
        self.wait(
            lambda rs: (
                rs[i]["can_crash"] and rs[i]["segment"] == 0 and (rs[i]["step"] or 0) >= step
            ),
            f"{label} to reach step {step}",
        )
        r = self.client.post(f"/api/runs/{self.runs[i]}/crash")
        assert r.status_code == 202, r.text
        body: dict[str, Any] = r.json()
        return body

    def wait_ended(self) -> list[dict[str, Any]]:
        return self.wait(
            lambda rs: all(r["state"] in ("finished", "failed", "stopped") for r in rs),
            "both runs to end",
        )

    def checks(self, label: str) -> list[dict[str, Any]]:
        run = self.runs["AB".index(label)]
        checks: list[dict[str, Any]] = self.client.get(f"/api/runs/{run}/resume-checks").json()[
            "checks"
        ]
        return checks

    def events(self, label: str) -> list[dict[str, Any]]:
        run = self.runs["AB".index(label)]
        events: list[dict[str, Any]] = self.client.get(f"/api/runs/{run}/events").json()["events"]
        return events

    def records(self, label: str, kind: str) -> list[dict[str, Any]]:
        run = self.runs["AB".index(label)]
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.client.get(
                f"/api/runs/{run}/records", params={"kind": kind, "after": after, "limit": 20000}
            ).json()
            out.extend(page["records"])
            if not page["records"] or page["next_after"] is None or page["next_after"] == after:
                return out
            after = page["next_after"]


def start(client: httpx.Client, preset: str) -> Pair:
    r = client.post("/api/pairs", json={"preset": preset})
    assert r.status_code == 201, r.text
    body = r.json()
    a, b = (run["id"] for run in body["runs"])
    return Pair(client, body["pair"], (a, b))


def every(preset: str, label: str) -> int:
    """The run's checkpoint cadence, read from the lesson (tests must not restate it)."""
    return get_preset(preset).config_for(label).ckpt_every


def crash_event(pair: Pair, label: str) -> dict[str, Any]:
    return next(e for e in pair.events(label) if e["code"] == "crash")


def predict(pair: Pair, answers: dict[str, Any]) -> None:
    """The student's prediction, made before the first crash test (#23)."""
    r = pair.client.post(f"/api/pairs/{pair.id}/prediction", json={"answers": answers})
    assert r.status_code == 200, r.text


def measured(pair: Pair) -> dict[str, Any]:
    """What the lab measured for the prediction: each predicted run's first restart."""
    outcome: dict[str, Any] = pair.client.get(f"/api/pairs/{pair.id}").json()["prediction"][
        "outcome"
    ]
    return outcome


def report(lesson: str, **numbers: Any) -> None:
    """The measured outcome, printed for the record (pytest -s shows it)."""
    print(f"\n{lesson}: " + json.dumps(numbers, default=str))


def test_lesson_1_7_fast_work_lost_follows_the_cadence(client: httpx.Client) -> None:
    pair = start(client, "lesson-1.7-fast")
    pair.crash_at("A", 430)  # A resumes from 400, B (if before step 500) from 250
    pair.crash_at("B", 430)
    runs = pair.wait_ended()
    assert [r["state"] for r in runs] == ["finished", "finished"]
    lost = {}
    for label in "AB":
        cadence = every("lesson-1.7-fast", label)
        (check,) = pair.checks(label)
        at = crash_event(pair, label)["step"]
        assert check["from_step"] == at // cadence * cadence, (label, at, check)
        assert check["points"] == check["expected_points"] == at - check["from_step"]
        if at > check["from_step"]:
            assert check["bit_identical"] is True and check["complete"], check
        else:  # a loaded machine: the kill landed on a checkpoint step, nothing to redo
            assert check["bit_identical"] is None, check
        lost[label] = check["expected_points"]
    assert lost["A"] < 50 and lost["B"] < 250
    report("lesson-1.7-fast", steps_lost=lost, max_abs_delta=0.0)


def test_lesson_1_8_weights_only_diverges_at_once_and_names_what_was_missing(
    client: httpx.Client,
) -> None:
    pair = start(client, "lesson-1.8")
    predict(pair, {"A": "yes", "B": "yes"})
    pair.crash_at("A", 120)
    pair.crash_at("B", 120)
    runs = pair.wait_ended()
    assert [r["state"] for r in runs] == ["finished", "finished"]
    (a,) = pair.checks("A")
    (b,) = pair.checks("B")
    assert a["bit_identical"] is True and a["missing"] == [] and a["complete"]
    assert b["from_step"] % every("lesson-1.8", "B") == 0 and b["from_step"] > 0
    assert b["bit_identical"] is False and b["max_abs_delta"] > 0
    assert b["first_divergent_step"] == b["from_step"] + 1
    assert measured(pair) == {"A": "yes", "B": "no"}  # the prediction's outcome says so too
    assert b["missing"] == [
        "AdamW state (moments and step counts)",
        "schedule position",
        "RNG states",
        "data position",
    ]
    resumed = next(e for e in pair.events("B") if e["code"] == "resumed")
    assert resumed["level"] == "warn"
    assert (
        "did not hold: AdamW state, schedule position, RNG states, data position"
        in (resumed["text"])
    )
    report(
        "lesson-1.8",
        from_step={"A": a["from_step"], "B": b["from_step"]},
        max_abs_delta={"A": a["max_abs_delta"], "B": b["max_abs_delta"]},
        mean_abs_delta_B=b["mean_abs_delta"],
        first_divergent_step_B=b["first_divergent_step"],
    )


def test_lesson_1_9_saving_only_at_the_end_starts_over_and_says_so(client: httpx.Client) -> None:
    pair = start(client, "lesson-1.9")
    pair.crash_at("A", 150)
    pair.crash_at("B", 150)
    runs = pair.wait_ended()
    assert [r["state"] for r in runs] == ["finished", "finished"]
    crash_a = crash_event(pair, "A")
    at = crash_a["step"]
    assert crash_a["level"] == "warn"
    assert f"starts over from step 0: all {at} trained steps are lost" in crash_a["text"]
    (a,) = pair.checks("A")
    assert a["started_over"] is True and a["from_step"] in (0, None)
    assert a["expected_points"] == at and a["complete"]
    started_over = next(e for e in pair.events("A") if e["code"] == "started_over")
    first_loss = float(started_over["text"].split("first loss is ")[1][:5])
    assert abs(first_loss - LN_256) < 0.1, started_over["text"]
    assert f"The {at} steps trained before the crash are gone" in started_over["text"]
    (b,) = pair.checks("B")
    cadence_b = every("lesson-1.9", "B")
    assert b["started_over"] is False
    assert b["from_step"] == crash_event(pair, "B")["step"] // cadence_b * cadence_b
    assert b["bit_identical"] is True
    report(
        "lesson-1.9",
        steps_lost={"A": a["expected_points"], "B": b["expected_points"]},
        first_loss_after_restart_A=first_loss,
        ln_vocab=round(LN_256, 4),
    )


def test_lesson_1_10_a_torn_in_place_write_is_caught_and_atomic_loses_nothing_saved(
    client: httpx.Client,
) -> None:
    pair = start(client, "lesson-1.10")
    t0 = time.monotonic()
    assert pair.crash_at("A", 110)["crash_mode"] == "during_save"
    pair.crash_at("B", 110)
    runs = pair.wait_ended()
    wall = time.monotonic() - t0
    assert [r["state"] for r in runs] == ["finished", "failed"]
    assert runs[1]["exit_code"] == 3
    # "during_save" waits for the next checkpoint after the click (step 110) and kills inside it
    cadence = every("lesson-1.10", "A")
    assert cadence == every("lesson-1.10", "B")
    torn = (110 // cadence + 1) * cadence
    for label in "AB":
        text = crash_event(pair, label)["text"]
        assert f"in the middle of writing the checkpoint for step {torn}" in text, text
    (a,) = pair.checks("A")
    assert a["from_step"] == torn - cadence and a["bit_identical"] is True and a["complete"]
    events_b = pair.events("B")
    rejected = next(e for e in events_b if e["code"] == "ckpt_corrupt")
    assert "latest" in rejected["text"] and "sha256" in rejected["text"], rejected
    refused = next(e for e in events_b if e["code"] == "no_checkpoint")
    assert "Refused to start" in refused["text"]
    assert any(e["code"] == "failed" and "exit status 3" in e["text"] for e in events_b)
    report(
        "lesson-1.10",
        A={"resumed_from": a["from_step"], "lost": a["expected_points"], "max_abs_delta": 0.0},
        B={"state": runs[1]["state"], "exit": runs[1]["exit_code"], "rejected": rejected["text"]},
        wall_s=round(wall, 1),
    )


def test_lesson_1_12_one_run_refuses_and_the_other_silently_starts_from_scratch(
    client: httpx.Client,
) -> None:
    pair = start(client, "lesson-1.12")
    predict(pair, {"A": "refused", "B": "identical"})
    pair.crash_at("A", 150)
    pair.crash_at("B", 150)
    runs = pair.wait_ended()
    assert [r["state"] for r in runs] == ["failed", "finished"]
    assert runs[0]["exit_code"] == 3
    for label in "AB":
        event = crash_event(pair, label)
        # The kill lands a little after step 150 (later on a loaded machine): the newest
        # checkpoint it wiped is the last multiple of the run's ckpt_every before it.
        e = every("lesson-1.12", label)
        newest = {event["step"] // e * e, (event["step"] - 1) // e * e}
        assert "checkpoint directory was deleted" in event["text"]
        assert any(f"the checkpoint at step {n}" in event["text"] for n in newest)
    events_a = pair.events("A")
    assert any(e["code"] == "no_checkpoint" and "Refused to start" in e["text"] for e in events_a)
    failed = next(e for e in events_a if e["code"] == "failed")
    assert "no complete checkpoint to resume from (exit status 3)" in failed["text"]
    events_b = pair.events("B")
    assert not any(e["code"] == "fresh_start" for e in events_b)  # the trainer kept quiet
    started_over = next(e for e in events_b if e["code"] == "started_over")
    first_loss = float(started_over["text"].split("first loss is ")[1][:5])
    assert abs(first_loss - LN_256) < 0.1
    (b,) = pair.checks("B")
    at_b = crash_event(pair, "B")["step"]
    assert b["started_over"] is True and b["expected_points"] == at_b
    assert measured(pair) == {"A": "refused", "B": "fresh"}  # the prediction's outcome
    report(
        "lesson-1.12",
        A={"state": runs[0]["state"], "exit": runs[0]["exit_code"]},
        B={"steps_lost": at_b, "first_loss_after_restart": first_loss},
        ln_vocab=round(LN_256, 4),
    )


def test_lesson_1_13_sync_saves_stall_training_and_async_resumes_bit_identically(
    client: httpx.Client,
) -> None:
    pair = start(client, "lesson-1.13")
    pair.crash_at("A", 60)
    pair.crash_at("B", 60)
    runs = pair.wait_ended()
    assert [r["state"] for r in runs] == ["finished", "finished"]
    numbers: dict[str, Any] = {}
    for label in "AB":
        (check,) = pair.checks(label)
        assert check["bit_identical"] is True and check["complete"], (label, check)
        ckpts = [r for r in pair.records(label, "ckpt") if r["step"] > 0]
        ckpt_steps = {r["step"] for r in ckpts}
        dts = {(r["segment"], r["step"]): r["dt"] for r in pair.records(label, "step")}
        after = [dt for (_, s), dt in dts.items() if s - 1 in ckpt_steps]
        other = [dt for (_, s), dt in dts.items() if s - 1 not in ckpt_steps and s > 1]
        numbers[label] = {
            "blocked_s": statistics.median(r["seconds"] for r in ckpts),
            "dt_after_ckpt": statistics.median(after),
            "dt_other": statistics.median(other),
            "ckpt_mb": round(ckpts[0]["bytes"] / 1e6, 1),
        }
    a, b = numbers["A"], numbers["B"]
    assert a["dt_after_ckpt"] > 1.5 * a["dt_other"], numbers  # the stall shows in step time
    assert b["blocked_s"] * 3 < a["blocked_s"], numbers  # async blocks for the snapshot only
    report("lesson-1.13", **numbers)


def test_lesson_1_15_without_a_cluster_losing_the_machine_wipes_the_disk_and_says_so(
    client: httpx.Client,
) -> None:
    """Crash mode "host" on one machine: there is no other host, so the run restarts here
    with its disk wiped, as in 1.11; the event says why (the Ray tier has the real move)."""
    pair = start(client, "lesson-1.15")
    first = every("lesson-1.15", "B")
    deadline = time.monotonic() + 120
    while not any(r["step"] >= first for r in pair.records("B", "mirror")):
        assert time.monotonic() < deadline, f"B's step {first} never reached the mirror"
        time.sleep(0.05)
    assert pair.crash_at("A", 150)["crash_mode"] == "host"
    pair.crash_at("B", 150)
    runs = pair.wait_ended()
    assert [r["state"] for r in runs] == ["failed", "finished"]
    assert runs[0]["exit_code"] == 3
    for label in "AB":
        text = crash_event(pair, label)["text"]
        assert "There is no other machine to move to" in text, text
    assert "pulled the checkpoint at step" in crash_event(pair, "B")["text"]
    (b,) = pair.checks("B")
    assert b["from_step"] >= first and b["bit_identical"] is True and b["complete"]


def test_lesson_1_11_only_the_mirrored_run_survives_its_disk(client: httpx.Client) -> None:
    pair = start(client, "lesson-1.11")
    first = every("lesson-1.11", "B")  # B's first checkpoint must be off the machine
    deadline = time.monotonic() + 120
    while not any(r["step"] >= first for r in pair.records("B", "mirror")):
        assert time.monotonic() < deadline, (
            f"B's checkpoint at step {first} never reached the mirror"
        )
        time.sleep(0.05)
    pair.crash_at("A", 150)
    pair.crash_at("B", 150)
    runs = pair.wait_ended()
    assert [r["state"] for r in runs] == ["failed", "finished"]
    assert runs[0]["exit_code"] == 3
    assert not pair.records("A", "mirror")  # mirror = "off": nothing left the machine
    text_b = crash_event(pair, "B")["text"]
    assert (
        "checkpoint directory was deleted" in text_b and "pulled the checkpoint at step" in text_b
    ), text_b
    (b,) = pair.checks("B")
    at_b = crash_event(pair, "B")["step"]
    assert b["from_step"] >= first and b["bit_identical"] is True and b["complete"]
    failed = next(e for e in pair.events("A") if e["code"] == "failed")
    assert "exit status 3" in failed["text"]
    report(
        "lesson-1.11",
        A={"state": runs[0]["state"], "exit": runs[0]["exit_code"], "steps_lost": "all"},
        B={"resumed_from_mirror": b["from_step"], "steps_lost": at_b - b["from_step"]},
    )


def test_lesson_1_14_at_the_wall_the_graceful_run_loses_nothing_and_the_other_all_it_trained(
    client: httpx.Client,
) -> None:
    wall = get_preset("lesson-1.14").crash.wall_step  # the lab SIGTERMs both runs there
    pair = start(client, "lesson-1.14")
    runs = pair.wait_ended()
    assert [r["state"] for r in runs] == ["finished", "finished"]
    events = {label: pair.records(label, "event") for label in "AB"}
    (a,) = [e for e in events["A"] if e.get("code") == "preempt"]
    (b,) = [e for e in events["B"] if e.get("code") == "preempt"]
    (saved,) = [e for e in events["A"] if e.get("code") == "stopped_gracefully"]
    assert a["text"].startswith(f"The session wall at step {wall}: SIGTERM with a 5s grace")
    assert a["at_step"] >= wall and a["resume_from"] == a["at_step"] and a["lost_steps"] == 0
    assert saved["within_grace"] is True and saved["checkpoint_step"] == a["at_step"]
    assert not pair.checks("A") or pair.checks("A")[0]["points"] == 0  # nothing to redo
    assert b["at_step"] >= wall and b["resume_from"] == 0 and b["lost_steps"] == b["at_step"]
    assert "ended the trainer on the spot" in b["text"], b["text"]
    assert not [e for e in events["B"] if e.get("code") == "stopped_gracefully"]
    (check_b,) = pair.checks("B")
    assert check_b["from_step"] == 0 and check_b["bit_identical"] is True and check_b["complete"]
    assert check_b["started_over"] is False  # it resumed its step-0 checkpoint
    report(
        "lesson-1.14",
        A={"stopped_at": a["at_step"], "save_s": saved["save_seconds"], "steps_lost": 0},
        B={"killed_at": b["at_step"], "resumed_from": 0, "steps_lost": b["lost_steps"]},
    )


def test_lesson_1_16_rank_0_saving_for_all_is_named_on_rank_1_and_each_rank_s_own_is_exact(
    client: httpx.Client,
) -> None:
    pair = start(client, "lesson-1.16")
    predict(pair, {"A": "yes", "B": "yes"})
    pair.crash_at("A", 60)
    pair.crash_at("B", 60)
    runs = pair.wait_ended()
    assert [r["state"] for r in runs] == ["finished", "finished"]
    (a,) = pair.checks("A")
    (b,) = pair.checks("B")
    assert a["bit_identical"] is True and a["complete"] and a["missing"] == []
    assert a["first_divergent_rank"] is None
    ranks_a = [f for f in a["fields"] if f["field"].startswith("step.rank_loss_bits.")]
    assert [f["field"] for f in ranks_a] == ["step.rank_loss_bits.0", "step.rank_loss_bits.1"]
    assert all(f["equal"] and f["points"] == a["points"] for f in ranks_a)
    assert b["from_step"] % every("lesson-1.16", "B") == 0 and b["from_step"] > 0
    assert b["bit_identical"] is False and b["first_divergent_step"] == b["from_step"] + 1
    # Rank 1 trained on rank 0's batch at the first recomputed step; rank 0 matched there.
    first = b["first_divergent_rank"]
    assert first == {"rank": 1, "step": b["from_step"] + 1, "ranks": 2}, first
    rank0 = next(f for f in b["fields"] if f["field"] == "step.rank_loss_bits.0")
    assert rank0["first_divergent_step"] == b["from_step"] + 2
    assert b["missing"] == ["rank 1's RNG states", "rank 1's data position"]
    assert measured(pair) == {"A": "yes", "B": "no"}
    resumed = next(e for e in pair.events("B") if e["code"] == "resumed")
    assert resumed["level"] == "warn" and "every rank took rank 0's" in resumed["text"]
    report(
        "lesson-1.16",
        from_step={"A": a["from_step"], "B": b["from_step"]},
        max_abs_delta={"A": a["max_abs_delta"], "B": b["max_abs_delta"]},
        first_divergent_rank_B=first,
    )


def test_lesson_1_17_a_blind_launcher_s_survivor_waits_for_its_timeout_and_both_resume_exactly(
    client: httpx.Client,
) -> None:
    timeout_s = get_preset("lesson-1.17").config_for("B").collective_timeout_s
    pair = start(client, "lesson-1.17")
    predict(pair, {"A": "yes", "B": "yes"})
    pair.crash_at("A", 60)
    pair.crash_at("B", 60)
    runs = pair.wait_ended()
    assert [r["state"] for r in runs] == ["finished", "finished"]
    events = {label: pair.records(label, "event") for label in "AB"}
    crash = {label: next(e for e in events[label] if e["code"] == "crash") for label in "AB"}
    assert crash["A"]["crash_mode"] == "rank" and crash["A"]["lost_rank"] == 1
    assert "its launcher noticed in" in crash["A"]["text"], crash["A"]
    assert not [
        e for e in events["A"] if e["code"] in ("rank_lost_waiting", "collective_timed_out")
    ]
    (waiting,) = [e for e in events["B"] if e["code"] == "rank_lost_waiting"]
    (timed_out,) = [e for e in events["B"] if e["code"] == "collective_timed_out"]
    assert waiting["lost_rank"] == 1 and waiting["timeout_s"] == timeout_s, waiting
    assert timed_out["rank"] == 0 and timed_out["waited_s"] > timeout_s / 2, timed_out
    assert "the others waited" in crash["B"]["text"], crash["B"]
    for label in "AB":
        (check,) = pair.checks(label)
        assert check["bit_identical"] is True and check["complete"], (label, check)
    assert measured(pair) == {"A": "yes", "B": "yes"}
    report(
        "lesson-1.17",
        noticed_s={label: crash[label]["noticed_s"] for label in "AB"},
        B_waited_s=timed_out["waited_s"],
        lost_to_resumed_s={label: _lost_to_resumed(pair, label) for label in "AB"},
    )


def _lost_to_resumed(pair: Pair, label: str) -> float:
    """Seconds from the first segment's last step record (the rank was lost within a step
    of it) to the restarted group's `resumed` event: what a lost rank cost in wall time."""
    last = max(r["t"] for r in pair.records(label, "step") if r["segment"] == 0)
    resumed = next(e for e in pair.records(label, "event") if e["code"] == "resumed")
    return round(resumed["t"] - last, 2)


def test_lesson_1_18_a_reshards_onto_one_rank_within_its_tolerance_and_b_s_rank_files_refuse(
    client: httpx.Client,
) -> None:
    from crashdrill.trainer.resume_compare import RESHARD_LOSS_TOLERANCE, RESHARD_WHY

    lesson = get_preset("lesson-1.18")
    cfg = lesson.config_for("A")
    # The texts name what the runs do; these are the numbers they name, from the lesson.
    assert (cfg.ranks, lesson.crash.restart_ranks, cfg.data_layout) == (2, 1, "global")
    assert f"global batch of {cfg.batch} windows" in lesson.whats_happening
    assert f"checkpoint every {cfg.ckpt_every} steps" in lesson.whats_happening
    assert "restarts both runs on one rank instead of two" in lesson.whats_happening
    tolerance = f"tolerance of {RESHARD_LOSS_TOLERANCE:g}"
    assert tolerance in lesson.what_to_watch and tolerance in lesson.crash.expect
    refusal = f"written by {cfg.ranks} ranks, this run has {lesson.crash.restart_ranks}"
    assert refusal in lesson.crash.expect and "written by 2 ranks and this run has 1" in (
        lesson.what_to_watch
    )
    pair = start(client, "lesson-1.18")
    predict(pair, {"A": "different", "B": "refused"})
    pair.crash_at("A", 60)
    pair.crash_at("B", 60)
    runs = pair.wait(
        lambda rs: [r["state"] for r in rs] == ["finished", "failed"], "A to finish and B to fail"
    )
    assert [r["state"] for r in runs] == ["finished", "failed"]
    for label in "AB":
        assert "The lesson restarts it with ranks=1" in crash_event(pair, label)["text"]
    (a,) = pair.checks("A")
    assert a["from_step"] % every("lesson-1.18", "A") == 0 and a["complete"], a
    assert a["bit_identical"] is False and a["outcome"] == "different"
    assert a["resharded"] == {"from_ranks": 2, "ranks": 1, "tolerance": RESHARD_LOSS_TOLERANCE,
                              "within_tolerance": True, "why": RESHARD_WHY}  # fmt: skip
    assert a["max_abs_delta"] <= RESHARD_LOSS_TOLERANCE and a["first_divergent_rank"] is None
    assert pair.checks("B") == []  # it resumed nothing: its refusal is the outcome
    (refused,) = [e for e in pair.records("B", "event") if e["code"] == "checkpoint_refused"]
    assert refusal in refused["text"] and "rank 1's RNG states and data position" in refused["text"]
    assert (refused["written_ranks"], refused["ranks"]) == (2, 1)
    assert not [r for r in pair.records("B", "step") if r["segment"] == 1]
    assert measured(pair) == {"A": "different", "B": "refused"}
    report(
        "lesson-1.18",
        from_step=a["from_step"],
        A_points=a["points"],
        A_max_abs_delta=a["max_abs_delta"],
        tolerance=RESHARD_LOSS_TOLERANCE,
    )
