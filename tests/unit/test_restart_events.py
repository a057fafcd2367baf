"""The sentence the supervisor writes when it restarts a killed trainer
(workers/restart_events.py): it names the checkpoint it resumes from, or says loudly that
the run refuses or starts over from step 0, and never claims a checkpoint is required
from a run set to start over (lesson 1.12's B, issue #19 point 3)."""

from __future__ import annotations

from crashdrill.server.crash_modes import fresh_start_allowed
from crashdrill.workers.restart_events import restart_event

LEAD = "Crash test: killed the process with SIGKILL (no chance to save) at step 178"


def event(**kw: object) -> dict[str, object]:
    args: dict[str, object] = {"step": 178, "ckpt": None, "require": True, "fresh": False}
    args.update(kw)
    return restart_event(
        LEAD,
        1,
        args["step"],  # type: ignore[arg-type]
        args["ckpt"],  # type: ignore[arg-type]
        None,
        bool(args["require"]),
        code="crash",
        level="info",
        mode="wipe",
        fresh=bool(args["fresh"]),
    )


def test_a_resume_names_its_checkpoint_and_the_steps_to_recompute() -> None:
    e = event(ckpt=100)
    assert e["text"].endswith("Resuming from the checkpoint at step 100; 78 steps to recompute.")
    assert e["lost_steps"] == 78 and e["resume_from"] == 100


def test_a_run_that_requires_a_checkpoint_and_finds_none_must_refuse() -> None:
    e = event()
    assert "the restart requires one (--require-checkpoint)" in str(e["text"])
    assert "refuse to start" in str(e["text"])


def test_a_run_set_to_start_over_does_not_claim_it_requires_a_checkpoint() -> None:
    e = event(fresh=True)
    text = str(e["text"])
    assert "--require-checkpoint" not in text and "requires one" not in text
    assert 'on_missing_checkpoint = "fresh"' in text and "from step 0" in text
    assert "all 178 trained steps are lost" in text
    assert e["level"] == "warn" and e["lost_steps"] == 178


def test_a_run_that_never_saved_starts_over_and_says_so() -> None:
    e = event(require=False)
    assert "There is no checkpoint yet, so the run starts over from step 0" in str(e["text"])


def test_lesson_1_12_lets_only_run_b_start_over() -> None:
    assert fresh_start_allowed("lesson-1.12", "B") is True
    assert fresh_start_allowed("lesson-1.12", "A") is False
    assert fresh_start_allowed("lesson-1.7", "B") is False
    assert fresh_start_allowed("no-such-lesson", "B") is False


def test_restarts_are_counted_by_kind_for_the_class_view() -> None:
    import json

    from crashdrill.server.views import restart_counts

    def row(run: str, **event: object) -> dict[str, str]:
        return {"run_id": run, "data": json.dumps({"kind": "event", "resume_from": 0, **event})}

    rows = [
        row("a", code="preempt", crash_mode="preempt"),  # the session wall's graceful stop
        row("a", code="crash", crash_mode="during_save"),
        row("b", code="graceful_stop", crash_mode="preempt"),
        row("b", code="killed", crash_mode="kill"),
        row("b", code="lost_host"),
        {"run_id": "b", "data": json.dumps({"kind": "event", "code": "crash"})},  # not a restart
    ]
    counts = restart_counts(rows)
    assert counts["a"] == {"crash": 1, "preempt": 1, "lost_host": 0, "killed": 0}
    assert counts["b"] == {"crash": 0, "preempt": 1, "lost_host": 1, "killed": 1}
