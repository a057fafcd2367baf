"""Event codes: every `event` record's code, once, with its level, its typed fields and
whether it tells the lesson's story. The trainer, the supervisor, the mirror and the lab
build events only through `event_record.event()`, which refuses an unknown code, a level
the code does not have, and a missing, unknown or wrong-typed field; the page gets this
table from GET /api/record-kinds (`events`) and renders from code and fields, never from
the sentence. docs/run-contract.md lists it (a test keeps the two in step).

    from crashdrill.trainer.event_codes import event_code
    event_code("checkpoint").weight          # 'routine': the page mutes it
    event_code("crash").restart              # 'crash': what ended the segment

`text` stays the sentence for people and logs. A field's number is the number: a reader
takes `step` from the field, never from the sentence.

Adding an event: one `EventCode` below (its fields, level(s), weight), the
`event_record.event()` call where it happens, and its row in docs/run-contract.md.

Imports nothing but the standard library (and the record contract's Field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crashdrill.trainer.record_contract import Field

LEVELS = ("info", "warn", "error")
# How the page's log shows an event: "key" stands out (what a lesson is about), "info" is
# a plain line, "routine" is muted and hidden with "routine lines" (checkpoints,
# evaluations, mirror copies). A warning or an error stands out whatever its weight.
WEIGHTS = ("key", "info", "routine")
WRITERS = ("trainer", "supervisor", "mirror", "lab")
# What ended a segment, by the supervisor's restart event (every one has `resume_from`):
# a crash test (SIGKILL by a student, whatever its crash mode), a preemption (SIGTERM: the
# Preempt button, a session wall, a trainer's own graceful stop: the only kind that had a
# chance to save), a lost host, or a kill nobody asked for (the out-of-memory killer). The
# class view counts restarts by these names; the page calls all but "preempt" a crash.
RESTART_KINDS = ("crash", "preempt", "lost_host", "killed")


@dataclass(frozen=True)
class EventCode:
    code: str
    writer: str  # one of WRITERS
    levels: tuple[str, ...]  # the levels it is written at; the first is the default
    weight: str  # one of WEIGHTS
    meaning: str
    fields: tuple[Field, ...] = ()  # besides kind, segment, level, code, text
    optional: tuple[str, ...] = ()  # names of fields that may be absent
    restart: str = ""  # a supervisor's restart event: what ended the segment (RESTART_KINDS)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)


def _f(name: str, type_: str, meaning: str) -> Field:
    return Field(name, type_, meaning)


_STEP = _f("step", "int", "the step it is about")

# A supervisor's restart: what ended the segment, and where the next one resumes from.
_RESTART = (
    _f("at_step", "int or null", "the newest step the dead process logged (null: none)"),
    _f("resume_from", "int or null", "the checkpoint's step the restart resumes from (null: none)"),
    _f("lost_steps", "int or null", "steps to recompute (or lost, when it starts over)"),
    _f("crash_mode", "str", "how it was ended: a crash mode (trainer/crash_modes.py) or preempt"),
)
_SAVE_STEP = _f(
    "save_step", "int", "the checkpoint being written when the kill came (crash mode during_save)"
)
_LOST_RANK = (
    _f("lost_rank", "int", "the rank a crash test of crash mode rank killed"),
    _f(
        "noticed_s",
        "float or null",
        "seconds from that rank's SIGKILL until its launcher noticed and took the group down"
        " (null: the launcher did not say)",
    ),
)
_HOSTS = (
    _f("lost_host", "object", '{"node_id", "name"} of the machine that went away'),
    _f("host", "object or null", "the machine it restarts on (null: not known yet)"),
)

_LOSS_TIMES = (  # where a lost host's seconds go (benchmarks/ray_cluster.py prints them)
    _f("noticed_t", "float", "when the supervisor learned the machine was gone (unix time)"),
    _f("placed_t", "float", "when the run's new placement was up on another (unix time)"),
)

EVENT_CODES: tuple[EventCode, ...] = (
    # ---- the trainer ----------------------------------------------------------------
    EventCode(
        "training_started",
        "trainer",
        ("info",),
        "info",
        "a fresh run's first line: what trains on what",
        (
            _f("params", "int", "model parameters"),
            _f("dataset", "str", "the corpus's name"),
            _f("steps", "int", "steps to train"),
            _f("precision", "str", "the config's precision"),
            _f("batch", "int", "sequences a step"),
            _f("ctx", "int", "tokens a sequence"),
            _f("threads", "int", "torch threads"),
        ),
    ),
    EventCode(
        "expected_loss",
        "trainer",
        ("info",),
        "info",
        "the loss an untrained model has: ln(vocab)",
        (_f("loss", "float", "ln(vocab)"), _f("vocab", "int", "vocabulary size")),
    ),
    EventCode(
        "checkpoint",
        "trainer",
        ("info",),
        "routine",
        "a checkpoint became complete (the `ckpt` record says the same)",
        (
            _STEP,
            _f("bytes", "int", "size of its files"),
            _f("seconds", "float", "how long training was blocked"),
            _f("persist_seconds", "float", "how long the write took"),
            _f("mode", "str", '"sync" or "async"'),
            _f("parts", "list[str]", "what it holds"),
        ),
    ),
    EventCode(
        "checkpoint_write_failed",
        "trainer",
        ("error",),
        "key",
        "a checkpoint could not be written (training goes on; the sentence says why)",
    ),
    EventCode(
        "evaluated",
        "trainer",
        ("info",),
        "routine",
        "an evaluation on held-out data (the `val` record says the same)",
        (
            _STEP,
            _f("val_loss", "float or null", "mean validation loss (null: not finite)"),
            _f("train_loss", "float or null", "mean of the recent step losses (null: not finite)"),
        ),
    ),
    EventCode(
        "ckpt_corrupt",
        "trainer",
        ("warn",),
        "key",
        "a checkpoint failed its checks on load; an older one is tried, when there is one",
        (
            _f(
                "fallback_step",
                "int or null",
                "the step of the older checkpoint tried next (null: none is left; -1: unreadable)",
            ),
        ),
    ),
    EventCode(
        "no_checkpoint",
        "trainer",
        ("error",),
        "key",
        "a restart that requires a checkpoint (--require-checkpoint) found none: it refuses",
    ),
    EventCode(
        "checkpoint_refused",
        "trainer",
        ("error",),
        "key",
        "a run of several ranks refused the checkpoint it found (written by another world"
        " size it cannot load without dropping a rank's state, or another config): it fails"
        " (exit 2) instead of resuming",
        (
            _f("ranks", "int", "this run's world size"),
            _f("written_ranks", "int", "the world size that wrote it (a world size refusal)"),
        ),
        optional=("written_ranks",),
    ),
    EventCode(
        "fresh_start",
        "trainer",
        ("warn",),
        "key",
        "a restart found no checkpoint and trains from step 0 again",
    ),
    EventCode(
        "resumed",
        "trainer",
        ("info", "warn"),
        "key",
        "a restart resumed from a checkpoint (warn: it lacked some parts)",
        (
            _STEP,
            _f(
                "missing",
                "list[str]",
                "the parts the checkpoint lacked: they start over (a rank's own part, "
                '"rank1.rng", is taken from rank 0)',
            ),
        ),
    ),
    EventCode(
        "rank_lost_waiting",
        "trainer",
        ("warn",),
        "key",
        'a blind launcher (launcher = "blind") lost a rank and leaves the others waiting in'
        " their next collective until it times out",
        (
            _f("lost_rank", "int", "the rank that ended"),
            _f("status", "int", "its exit status (128 + the signal when killed)"),
            _f("timeout_s", "float", "the run's collective_timeout_s"),
            _f("deadline", "float", "when their collective times out (Unix time, seconds)"),
        ),
    ),
    EventCode(
        "collective_timed_out",
        "trainer",
        ("error",),
        "key",
        "a survivor's collective timed out waiting for the lost rank: the group ends",
        (
            _f("rank", "int", "the survivor whose collective timed out first"),
            _f("lost_rank", "int", "the rank it waited for"),
            _f("waited_s", "float", "seconds from the loss until this timeout ended the group"),
        ),
    ),
    EventCode(
        "trainer_error",
        "trainer",
        ("error",),
        "key",
        "the trainer raised an error (its traceback goes to the lab's log, not here)",
        (_f("error", "str", "the error's type name"),),
    ),
    EventCode(
        "finished",
        "trainer",
        ("info",),
        "key",
        "the run trained all its steps",
        (
            _f("steps", "int", "steps trained"),
            _f("best_val", "float or null", "the best validation loss (null: none)"),
        ),
    ),
    EventCode(
        "stopping",
        "trainer",
        ("info",),
        "info",
        "a graceful stop began: a checkpoint is being saved (trainer/preemption.py)",
        (_STEP,),
    ),
    EventCode(
        "stopped_gracefully",
        "trainer",
        ("info", "warn"),
        "info",
        "a graceful stop ended with a complete checkpoint (warn: over its grace, or unmirrored)",
        (
            _STEP,
            _f("reason", "str or null", '"SIGTERM", "SIGINT" or "stop_after"'),
            _f("checkpoint_step", "int", "the step of its checkpoint"),
            _f(
                "save_seconds",
                "float",
                "from the signal (or the budget's margin) to a complete checkpoint, mirror"
                " copy included",
            ),
            _f("grace_s", "float", "the grace it had (the config's stop_grace)"),
            _f("within_grace", "bool", "save_seconds ≤ grace_s"),
            _f("mirrored", "bool or null", "its checkpoint reached the --mirror (null: no mirror)"),
        ),
    ),
    EventCode(
        "graceful_stop_lost",
        "trainer",
        ("warn",),
        "key",
        "the previous graceful stop was killed inside its save; an older checkpoint stood",
        (_STEP, _f("lost_steps", "int", "steps lost to it")),
    ),
    EventCode(
        "diverged",
        "trainer",
        ("error",),
        "key",
        "the loss or the gradient stopped being finite (trainer/divergence.py)",
        (
            _STEP,
            _f("what", "str", 'what was not finite, e.g. "the loss is nan"'),
            _f("checkpoint_step", "int or null", "the newest checkpoint, from before it"),
        ),
    ),
    # ---- the supervisor: restarts, failures, stops -----------------------------------
    EventCode(
        "crash",
        "supervisor",
        ("info", "warn"),
        "key",
        "a crash test killed the trainer (SIGKILL, any crash mode); the run restarts",
        (*_RESTART, _SAVE_STEP, *_HOSTS, *_LOST_RANK),
        optional=("save_step", "lost_host", "host", "lost_rank", "noticed_s"),
        restart="crash",
    ),
    EventCode(
        "preempt",
        "supervisor",
        ("info", "warn"),
        "info",
        "a preemption (SIGTERM, then SIGKILL after the grace) ended the segment; it restarts",
        _RESTART,
        restart="preempt",
    ),
    EventCode(
        "graceful_stop",
        "supervisor",
        ("info", "warn"),
        "info",
        "the trainer stopped itself gracefully (its time budget); it restarts",
        _RESTART,
        restart="preempt",
    ),
    EventCode(
        "killed",
        "supervisor",
        ("warn",),
        "key",
        "a SIGKILL nobody asked for (the out-of-memory killer?); the run restarts",
        _RESTART,
        restart="killed",
    ),
    EventCode(
        "lost",
        "supervisor",
        ("warn",),
        "key",
        "the trainer died while no supervisor watched (the server was down); it restarts",
        _RESTART,
        restart="lost_host",
    ),
    EventCode(
        "lost_host",
        "supervisor",
        ("warn",),
        "key",
        "the run's machine vanished; it restarts on another from the mirror (a run of"
        " several ranks on fewer where no node has room for its group any more)",
        (
            *_RESTART,
            *_HOSTS,
            *_LOSS_TIMES,
            _f("ranks", "int", "the world size it restarts on, when fewer than it had"),
            _f("from_ranks", "int", "the world size it had (with ranks)"),
        ),
        restart="lost_host",
        optional=("noticed_t", "placed_t", "ranks", "from_ranks"),
    ),
    EventCode(
        "failed",
        "supervisor",
        ("error",),
        "key",
        "the run failed and is not restarted",
        (_f("exit_code", "int or null", "the trainer's exit status (null: not known)"),),
    ),
    EventCode(
        "stopped",
        "supervisor",
        ("info",),
        "key",
        "someone stopped the run",
        (_f("by", "str", "who stopped it"),),
    ),
    EventCode(
        "waiting_for_node",
        "supervisor",
        ("warn",),
        "key",
        "no Ray node has the resources the run needs yet; it starts when one does",
    ),
    # ---- the checkpoint mirror (DIR/mirror.jsonl) ---------------------------------------
    EventCode(
        "mirror",
        "mirror",
        ("info",),
        "routine",
        "a checkpoint was copied to the mirror (the `mirror` record says the same)",
        (
            _STEP,
            _f("seconds", "float", "the upload, in the background"),
            _f("bytes", "int", "bytes sent"),
            _f("superseded", "list[int]", "steps replaced by a newer one before their upload"),
        ),
    ),
    EventCode(
        "mirror_failed",
        "mirror",
        ("warn",),
        "key",
        "a checkpoint could not be copied to the mirror; it is retried in the background",
        (_STEP,),
    ),
    EventCode(
        "mirror_skipped",
        "mirror",
        ("warn",),
        "key",
        "a checkpoint was not copied (it was pruned, or fails its sha256 check on this machine)",
        (_STEP,),
    ),
    EventCode(
        "mirror_rejected",
        "supervisor",
        ("warn",),
        "key",
        "a restart found a mirrored checkpoint that does not verify; an older one is tried",
    ),
    EventCode(
        "mirror_unreachable",
        "supervisor",
        ("warn",),
        "key",
        "a restart with no checkpoint on its machine could not read the mirror",
    ),
    # ---- the lab (server) ------------------------------------------------------------
    EventCode(
        "started_over",
        "lab",
        ("warn",),
        "key",
        "the lab saw a restarted segment train from step 0 again (a silent fresh start)",
        (
            _f("at_step", "int", "the newest step trained before"),
            _f("lost_steps", "int", "steps trained before, now lost"),
            _f("first_loss", "float or null", "the restarted segment's first loss"),
            _f("vocab", "int or null", "vocabulary size (its ln is an untrained loss)"),
            _f("source", "str", '"lab"'),
        ),
    ),
)

CODES: tuple[str, ...] = tuple(e.code for e in EVENT_CODES)
_BY_CODE = {e.code: e for e in EVENT_CODES}
# Written by every event, whatever its code (the record's common fields aside).
BASE_FIELDS = ("kind", "segment", "level", "code", "text")


def event_code(code: str) -> EventCode:
    """The registered code `code`; KeyError names the known ones."""
    try:
        return _BY_CODE[code]
    except KeyError:
        raise KeyError(f"unknown event code {code!r}; known: {', '.join(CODES)}") from None


def events_json() -> list[dict[str, Any]]:
    """The codes as JSON (the `events` of GET /api/record-kinds)."""
    return [
        {
            "code": e.code,
            "writer": e.writer,
            "levels": list(e.levels),
            "weight": e.weight,
            "meaning": e.meaning,
            "restart": e.restart or None,
            "fields": [
                {
                    "name": f.name,
                    "type": f.type,
                    "meaning": f.meaning,
                    "optional": f.name in e.optional,
                }
                for f in e.fields
            ],
        }
        for e in EVENT_CODES
    ]
