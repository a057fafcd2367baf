"""The sentence the supervisor writes when it restarts a killed trainer
(workers/restart_events.py): it names the checkpoint it resumes from, or says loudly that
the run refuses or starts over from step 0, and never claims a checkpoint is required
from a run set to start over (lesson 1.12's B, issue #19 point 3)."""

from __future__ import annotations

from typing import Any

import pytest

from crashdrill.server.lessons.crash_effects import fresh_start_allowed
from crashdrill.trainer.crash_modes import HOST_LOSS, MODES, mode_named
from crashdrill.workers.executor import Host
from crashdrill.workers.restart_events import moved_event, restart_event

LEAD = "Crash test: killed the process with SIGKILL (no chance to save) at step 178"


def event(**kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"step": 178, "ckpt": None, "require": True, "fresh": False}
    args.update(kw)
    return restart_event(
        LEAD,
        1,
        args["step"],
        args["ckpt"],
        None,
        bool(args["require"]),
        code="crash",
        level="info",
        mode="wipe",
        fresh=bool(args["fresh"]),
    )


def test_a_restart_names_the_checkpoint_it_found_and_promises_no_resume() -> None:
    e = event(ckpt=100)
    # Written before the new trainer loaded anything: what was found and what is done now;
    # "resumed" is the trainer's own event, once it has loaded the checkpoint.
    assert e["text"].endswith(
        "The newest checkpoint on its disk is at step 100, 78 steps back;"
        " restarting the trainer to load it."
    )
    assert "resum" not in e["text"].lower()
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


def test_a_move_names_the_crash_mode_that_moved_it_and_a_vanished_host_the_registry_s() -> None:
    old, new = Host("n1", "node-one"), Host("n2", "node-two")
    by_test = moved_event("Crash test: lost host node-one", old, new, 1, 30, 20, None, moved=True)
    assert (by_test["code"], by_test["crash_mode"]) == ("crash", "host")
    assert mode_named(str(by_test["crash_mode"])).moves_host
    vanished = moved_event("Lost host node-one", old, None, 1, 30, None, None, moved=False)
    assert (vanished["code"], vanished["crash_mode"]) == ("lost_host", HOST_LOSS)
    assert mode_named(HOST_LOSS).moves_host  # the registry's first mode that moves the run


def test_a_move_refuses_a_crash_mode_that_does_not_move_the_run() -> None:
    for mode in (m.name for m in MODES if not m.moves_host):
        with pytest.raises(ValueError, match=f"{mode!r} does not move the run"):
            moved_event("x", Host("n1", "a"), None, 1, 3, None, None, moved=True, mode=mode)


def test_a_trainer_that_refused_to_start_fails_saying_it_refused_not_that_it_crashed() -> None:
    from crashdrill.trainer.exit_codes import EXIT_USAGE
    from crashdrill.workers.restart_events import failure_text

    text = failure_text(EXIT_USAGE)
    assert text.startswith("The trainer refused to start (exit status 2)")
    assert "a checkpoint it cannot resume without losing state" in text
    assert failure_text(1).startswith("The trainer failed (exit status 1)")


def test_a_group_with_no_node_left_that_has_room_restarts_on_fewer_ranks_and_says_so() -> None:
    old, new = Host("n1", "node-one"), Host("n3", "node-three")
    same = moved_event("Lost host node-one", old, new, 1, 112, 100, None, moved=False, ranks=2)
    assert "; restarting its 2 ranks on host node-three from its disk's checkpoint" in same["text"]
    assert "ranks" not in same and "from_ranks" not in same
    fewer = moved_event(
        "Lost host node-one", old, new, 1, 112, 100, None, moved=False, ranks=2, fewer=(2, 1)
    )
    assert fewer["text"].startswith(
        "Lost host node-one at step 112; restarting on 1 rank instead of 2 (no node left has"
        " room for 2) on host node-three from its disk's checkpoint at step 100, 12 steps back."
        " Its checkpoint must reshard onto 1 rank"
    ), fewer["text"]
    assert (fewer["from_ranks"], fewer["ranks"]) == (2, 1)


def test_a_launch_s_world_size_is_its_last_ranks_setting_and_with_ranks_replaces_it() -> None:
    from pathlib import Path

    from crashdrill.workers.launch import Launch
    from crashdrill.workers.ray_placement import Resources

    launch = Launch(Path("/tmp/r"), "lesson-1.18", "A", settings=("steps=600", "ranks=4"))
    assert launch.ranks() == 4
    assert Launch(Path("/tmp/r"), "lesson-1.18", "A").ranks() is None
    two = launch.with_ranks(2)
    assert two.settings == ("steps=600", "ranks=2") and two.ranks() == 2
    assert "--set" in two.argv(require_checkpoint=True) and "ranks=2" in two.argv(
        require_checkpoint=True
    )
    assert Resources.of_launch(Launch(Path("/tmp/r"), "lesson-1.18", "A")).ranks == 2
    need = Resources.of_launch(two.with_ranks(1))
    assert need.ranks == 1 and need.fits({"CPU": 1.0}) and not need.with_ranks(2).fits({"CPU": 1.0})
