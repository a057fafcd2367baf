"""What the supervisor writes when a trainer dies: the restart event, or why the run failed.

    event = restart_event(lead, segment, step, ckpt, pulled, require, code=..., level=...)
    event = moved_event(lead, old, new, segment, step, ckpt, pulled, moved=False)
    text = failure_text(exit_code)            # what the student sees
    text = diverged_text(records, step)       # a divergence: the trainer's own sentence

Pure functions of what the supervisor found (workers/supervisor.py decides; these say it).
The sentences are the lab's event log, written when the old trainer is dead and before the
new one has loaded anything: each says only what happened and what the supervisor does now
(the newest checkpoint it found, how far back that is, that it restarts the trainer), or
says loudly that the run starts over or must refuse. That it resumed is the trainer's own
`resumed` event, written once the restart has loaded the checkpoint.
"""

from __future__ import annotations

import signal
from typing import Any

from crashdrill.trainer.crash_modes import HOST_LOSS, mode_named
from crashdrill.trainer.divergence import CODE as DIVERGED_CODE
from crashdrill.trainer.event_codes import CODES, event_code
from crashdrill.trainer.event_codes import RESTART_KINDS as RESTART_KINDS  # for its readers
from crashdrill.trainer.event_record import event as build_event
from crashdrill.trainer.exit_codes import EXIT_NO_CHECKPOINT, EXIT_USAGE
from crashdrill.workers.executor import Host
from crashdrill.workers.mirror import Restored


def restart_kind(event: dict[str, Any]) -> str | None:
    """The RESTART_KINDS name of a supervisor's restart event (its code's `restart` in
    trainer/event_codes.py); None for any other event."""
    if event.get("kind", "event") != "event" or "resume_from" not in event:
        return None
    code = event.get("code")
    kind = event_code(code).restart if code in CODES else ""
    if kind != "crash" and event.get("crash_mode") == "preempt":
        return "preempt"
    return kind or "killed"


def restart_event(
    lead: str,
    segment: int,
    step: int | None,
    ckpt: int | None,
    pulled: Restored | None,
    require: bool,
    *,
    code: str,
    level: str,
    mode: str,
    fresh: bool = False,
    save_step: int | None = None,
    lost_rank: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The event of a restart on the same machine (`ckpt`: the step it resumes from;
    `fresh`: the run is set to train from scratch when it finds no checkpoint, its config's
    on_missing_checkpoint = "fresh", so it does not refuse whatever `require` says;
    `save_step`: a crash test's kill came while this step's checkpoint was being written;
    `lost_rank`: a rank crash's fields, `lost_rank` and `noticed_s`, workers/rank_crash.py)."""
    lost_steps = None
    if ckpt is not None:
        back = ""
        if step is not None and step > ckpt:
            lost_steps = step - ckpt
            back = f", {_steps(lost_steps)} back"
        text = (
            f"{lead}. The newest checkpoint on its disk is at step {ckpt}{back};"
            " restarting the trainer to load it."
        )
        if pulled is not None:
            text = (
                f"{lead}. No checkpoint on this machine; pulled the checkpoint at step {ckpt}"
                f" from {pulled.url} (verified){back}; restarting the trainer to load it."
            )
    elif fresh:
        lost_steps = step or 0
        text = (
            f"{lead}. No checkpoint is left to resume from, and this run is set to start over"
            ' when it finds none (on_missing_checkpoint = "fresh"): it trains a new model from'
            f" step 0, and all {lost_steps} trained steps are lost."
        )
        level = "warn"
    elif require:
        text = (
            f"{lead}. No checkpoint is left to resume from; the restart requires one"
            " (--require-checkpoint), so the trainer must find one or refuse to start."
        )
        lost_steps = step
    else:
        lost_steps = step or 0
        text = (
            f"{lead}. There is no checkpoint yet, so the run starts over from step 0: "
            f"all {lost_steps} trained steps are lost."
        )
        level = "warn"
    extra = {"save_step": save_step} if save_step is not None else {}
    extra.update(lost_rank or {})
    return build_event(
        code,
        text,
        level=level,
        segment=segment,
        at_step=step,
        resume_from=ckpt,
        lost_steps=lost_steps,
        crash_mode=mode,
        **extra,
    )


def moved_event(
    lead: str,
    old: Host,
    new: Host | None,
    segment: int,
    step: int | None,
    ckpt: int | None,
    pulled: Restored | None,
    *,
    moved: bool,
    mode: str = HOST_LOSS,
    times: dict[str, float] | None = None,
    ranks: int = 1,
    fewer: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The event of a restart on another machine: "Lost host NODE at step N; restarting on
    host OTHER from the mirror's checkpoint at step M, K steps back" (`moved`: a crash test of
    crash mode `mode`, one that moves_host, took the host away; else it vanished by itself,
    told as HOST_LOSS). `times`: a lost host's noticed_t and placed_t (unix times); `ranks`:
    a run of several restarts them all, at the same world size ("restarting its 2 ranks");
    `fewer`: (N, M), no node left had room for its N ranks, so it restarts on M ("restarting
    on 1 rank instead of 2, on host …")."""
    if not mode_named(mode).moves_host:
        raise ValueError(f"crash mode {mode!r} does not move the run to another host")
    where = f"host {new.name}" if new is not None else "another host"
    if fewer is not None:
        had, now = fewer
        where = f"on {_ranks(now)} instead of {had} (no node left has room for {had}) on {where}"
    elif ranks > 1:  # a group restarts whole, at the same world size
        where = f"its {ranks} ranks on {where}"
    else:
        where = f"on {where}"
    at = f" at step {step}" if step is not None else ""
    lost_steps = None
    if step is not None:
        lost_steps = max(step - ckpt, 0) if ckpt is not None else step
    if ckpt is not None:
        source = "the mirror's" if pulled is not None else "its disk's"
        text = f"{lead}{at}; restarting {where} from {source} checkpoint at step {ckpt}"
        if lost_steps:
            text += f", {_steps(lost_steps)} back"
        text += "."
        if fewer is not None:
            text += (
                f" Its checkpoint must reshard onto {_ranks(fewer[1])} (DCP, global data"
                " positions), or the trainer refuses it rather than drop a rank's state."
            )
    else:
        text = (
            f"{lead}{at}; restarted {where}, but the mirror holds no checkpoint of this"
            " run: the restart requires one (--require-checkpoint), so it must refuse."
        )
    return build_event(
        "crash" if moved else "lost_host",
        text,
        level="warn",
        segment=segment,
        at_step=step,
        resume_from=ckpt,
        lost_steps=lost_steps,
        crash_mode=mode,
        lost_host=old.to_dict(),
        host=new.to_dict() if new is not None else None,
        **(times or {}),
        **({"ranks": fewer[1], "from_ranks": fewer[0]} if fewer is not None else {}),
    )


def _ranks(n: int) -> str:
    return f"{n} rank{'' if n == 1 else 's'}"


def _steps(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


def failure_text(code: int | None) -> str:
    """Why a trainer that was not killed ended the run, for everyone who sees the run.
    Its stderr (a traceback, the server's paths) is not in it: that goes to the lab's log
    and the instructor's class view (Change.detail), never into the records."""
    if code == EXIT_NO_CHECKPOINT:
        return (
            "The trainer found no complete checkpoint to resume from"
            f" (exit status {EXIT_NO_CHECKPOINT}),"
            " so the run cannot continue."
        )
    if code == EXIT_USAGE:
        return (
            f"The trainer refused to start (exit status {EXIT_USAGE}): a setting it does not"
            " accept, or a checkpoint it cannot resume without losing state; the run's log"
            " says which, so the run cannot continue."
        )
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else -code
        return f"The trainer was ended by signal {name}."
    if code is None:
        return "The trainer exited while nobody was watching its exit status."
    return (
        f"The trainer failed (exit status {code}). The instructor's class view and the"
        " lab's log have its error output."
    )


def diverged_text(records: list[dict[str, Any]], step: int | None) -> str:
    """The sentence of a run that diverged (trainer/divergence.py): the trainer's own
    event's, from the end of its records, else one from the step it reached."""
    for rec in reversed(records):
        if rec.get("kind") == "event" and rec.get("code") == DIVERGED_CODE:
            text = rec.get("text")
            if isinstance(text, str) and text:
                return text
    at = f" at step {step}" if step is not None else ""
    return f"Diverged{at}: the loss or the gradient was no longer a finite number."
