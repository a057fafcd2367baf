"""Every code a finding of the drill can carry: what it means, whether it fails the drill,
and where docs/verify.md explains it. One home: a finding is made with a code from here
(`Finding` refuses any other), and tests/unit/test_drill_finding_codes.py fails when a
code is missing from the docs' table or the table names a code that is not here.

    from crashdrill.drill.finding_codes import STATE_MISSING, CODES
    Finding(STATE_MISSING, "resume 1: …")      # fails, as CODES[STATE_MISSING].fails says
    CODES["kill-missed"].fails                  # False: a note

A code whose finding is a note in some cases and a failure in others says when in
`note_when`; `Finding` allows the other value only for such a code.
"""

from __future__ import annotations

from dataclasses import dataclass

DOCS = "docs/verify.md"


@dataclass(frozen=True)
class FindingCode:
    code: str
    meaning: str  # what the evidence shows, in one line
    fails: bool  # False: a note (the drill can still pass)
    anchor: str  # the heading of docs/verify.md whose table lists it
    note_when: str = ""  # a failing code that is a note in this case (or the reverse)

    @property
    def docs(self) -> str:
        return f"{DOCS}#{self.anchor}"


_DIAGNOSIS = "diagnosis"
_PREEMPTION = "preemption---preempt"

_ALL = [
    FindingCode(
        "silent-fresh-start",
        "the restart printed the run's first step again with the reference's first loss "
        "although a checkpoint existed: it trained from scratch",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "steps-restarted",
        "the restart printed the run's first step again, but not with the first loss of a "
        "fresh start: it loaded the weights and started counting steps from 0 again",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "state-missing",
        "a resume diverges at once and the checkpoint lacks the state that explains it "
        "(optimizer state, RNG states), or could not be read",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "saved-not-restored",
        "a resume diverges at once although `crashdrill inspect` finds the state that "
        "explains it (RNG states, optimizer state) in the checkpoint: saved but not restored",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "rank-state",
        "a resume of several ranks diverges first on one rank while the others match: that "
        "rank did not get its own RNG states and data position back",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "dcp-incomplete",
        "a restart resumed from a DCP checkpoint dir that holds .distcp shards but no "
        ".metadata (DCP writes it last): an incomplete checkpoint",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "rank-killed",
        "--kill-rank: one rank's process was SIGKILLed; what the launcher did (restarted "
        "the group, exited) and how long it took",
        False,
        _DIAGNOSIS,
    ),
    FindingCode(
        "rank-lost-hang",
        "--kill-rank: after one rank's SIGKILL the launcher neither restarted the group nor "
        "exited before --timeout: the survivors waited",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "world-size-changed",
        "--resume-world-size: the restarts ran at another number of ranks, so the bits cannot "
        "match; the reduced loss is compared within --tolerance",
        False,
        _DIAGNOSIS,
    ),
    FindingCode(
        "world-size-tolerance",
        "--resume-world-size: a resume's reduced loss left the reference's by more than "
        "--tolerance",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "world-size-refused",
        "--resume-world-size: a restart exited non-zero saying the world size differs: the "
        "script does not resume on another world size",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "nondeterministic",
        "the trace differs before any kill, or a resume diverges later than its first steps",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "never-checkpoints",
        "no checkpoint existed at any kill: every kill loses everything",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "torn-checkpoint",
        "a kill (or a stop) landed inside a checkpoint write that left it torn, and the "
        "restart could not resume from it",
        True,
        _DIAGNOSIS,
    ),
    FindingCode("crashed", "a process exited non-zero by itself", True, _DIAGNOSIS),
    FindingCode("hung", "a process ran past --timeout and was killed", True, _DIAGNOSIS),
    FindingCode("too-few-digits", "the printed losses are rounded", True, _DIAGNOSIS),
    FindingCode(
        "incomplete",
        "the crashed run finished at an earlier step than the reference",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "fields-differ",
        "the losses match but another recorded field differs (--preset)",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "final-state-differs",
        "the traces match but the final weights or --compare-file files differ",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "reference-diverged",
        "the reference run (no kills) of the built-in trainer diverged",
        True,
        _DIAGNOSIS,
        note_when="a resume diverged at the same step with the same bits: a note",
    ),
    FindingCode(
        "resume-diverged",
        "a resumed built-in trainer diverged where the reference did not",
        True,
        _DIAGNOSIS,
    ),
    FindingCode("no-steps", "no step line in the reference's stdout", True, _DIAGNOSIS),
    FindingCode(
        "incomplete-skipped",
        "a kill left a new checkpoint incomplete (shown by its content or its files) and "
        "the restart resumed from the older complete one",
        False,
        _DIAGNOSIS,
    ),
    FindingCode(
        "in-place-write",
        "a kill aimed at a write landed after it had finished, and that write had rewritten "
        "a checkpoint file in place",
        False,
        _DIAGNOSIS,
    ),
    FindingCode(
        "non-atomic-write",
        "the reference run wrote checkpoints under their final names (in place, or filled "
        "in there), and no kill of this drill landed inside such a write",
        False,
        _DIAGNOSIS,
    ),
    FindingCode(
        "kill-missed",
        "a planned kill never landed because the run finished before its step",
        False,
        _DIAGNOSIS,
    ),
    FindingCode(
        "ignores-sigterm",
        "a stop trained on (or sat) until the SIGKILL at the grace",
        True,
        _PREEMPTION,
    ),
    FindingCode(
        "saves-too-slowly",
        "a write began after the SIGTERM and was not done when the grace ran out",
        True,
        _PREEMPTION,
    ),
    FindingCode(
        "exits-without-saving",
        "a stop exited within the grace and its checkpoint dir did not change",
        True,
        _PREEMPTION,
    ),
    FindingCode(
        "restart-loop",
        "two restarts in a row crashed the same way (same exit status and last stderr line, "
        "the second getting no further): the drill stopped restarting",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "restart-cap",
        "the drill made --max-restarts restarts and the run had still not finished",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "deadline",
        "the drill's deadline ran out: the report holds what was seen until then",
        True,
        _DIAGNOSIS,
    ),
    FindingCode(
        "interrupted",
        "SIGINT or SIGTERM stopped the drill: the report holds what was seen until then",
        True,
        _DIAGNOSIS,
    ),
]

CODES: dict[str, FindingCode] = {c.code: c for c in _ALL}

SILENT_FRESH_START = "silent-fresh-start"
STEPS_RESTARTED = "steps-restarted"
STATE_MISSING = "state-missing"
SAVED_NOT_RESTORED = "saved-not-restored"
NONDETERMINISTIC = "nondeterministic"
RANK_STATE = "rank-state"
DCP_INCOMPLETE = "dcp-incomplete"
RANK_KILLED = "rank-killed"
RANK_LOST_HANG = "rank-lost-hang"
WORLD_SIZE_CHANGED = "world-size-changed"
WORLD_SIZE_TOLERANCE = "world-size-tolerance"
WORLD_SIZE_REFUSED = "world-size-refused"
NEVER_CHECKPOINTS = "never-checkpoints"
TORN_CHECKPOINT = "torn-checkpoint"
CRASHED = "crashed"
HUNG = "hung"
TOO_FEW_DIGITS = "too-few-digits"
INCOMPLETE = "incomplete"
FIELDS_DIFFER = "fields-differ"
FINAL_STATE_DIFFERS = "final-state-differs"
REFERENCE_DIVERGED = "reference-diverged"
RESUME_DIVERGED = "resume-diverged"
NO_STEPS = "no-steps"
INCOMPLETE_SKIPPED = "incomplete-skipped"
IN_PLACE_WRITE = "in-place-write"
NON_ATOMIC_WRITE = "non-atomic-write"
KILL_MISSED = "kill-missed"
IGNORES_SIGTERM = "ignores-sigterm"
SAVES_TOO_SLOWLY = "saves-too-slowly"
EXITS_WITHOUT_SAVING = "exits-without-saving"
RESTART_LOOP = "restart-loop"
RESTART_CAP = "restart-cap"
DEADLINE = "deadline"
INTERRUPTED = "interrupted"


def code_of(code: str) -> FindingCode:
    """The registered code, or a ValueError naming it and the codes there are."""
    try:
        return CODES[code]
    except KeyError:
        raise ValueError(
            f"finding code {code!r} is not registered in drill/finding_codes.py "
            f"(registered: {', '.join(sorted(CODES))})"
        ) from None
