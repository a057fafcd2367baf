"""What a resume came to, in one word: the one list of outcomes that the lab's resume
check (server/lessons/resume_checks.py, the `outcome` of each check the API serves), the page
(web/static/lesson.js picks its words by it), a lesson's prediction (trainer/prediction.py:
its choices are outcomes) and the drill (drill/judge.py, `resume_outcome` in its
report) all name, so that nobody decides it again from `bit_identical`, `missing` or
`started_over`.

    from crashdrill.trainer.resume_outcome import ResumeOutcome, outcomes_json
    ResumeOutcome.IDENTICAL.value            # "identical": what is stored and served
    ResumeOutcome("fresh").meaning           # the sentence docs/run-contract.md shows

The values are stable strings (stored in a pair's measured outcome, read by pages). Not
every producer reaches every outcome: the lab's check is live, so it can be waiting or
identical so far; only the drill sees a restart that hung, crashed or loaded a torn
checkpoint (the lab's trainer rejects a torn one by its manifest); a restart that refused
to start has no check in the lab (its `no_checkpoint` event is the outcome).

Imports nothing but the standard library.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ResumeOutcome(StrEnum):
    """One resume's outcome; the value is what is stored and served."""

    WAITING = "waiting"
    IDENTICAL_SO_FAR = "identical_so_far"
    IDENTICAL = "identical"
    EQUAL_AS_PRINTED = "equal_as_printed"
    NOTHING_LEFT = "nothing_left"
    DIFFERENT = "different"
    FRESH = "fresh"
    REFUSED = "refused"
    TORN = "torn"
    CRASHED = "crashed"
    HUNG = "hung"
    NOT_COMPARED = "not_compared"

    @property
    def meaning(self) -> str:
        return MEANINGS[self]

    @property
    def held(self) -> bool:
        """The resume kept the run: it matched, or it had nothing left to recompute."""
        return self in HELD


MEANINGS: dict[ResumeOutcome, str] = {
    ResumeOutcome.WAITING: "it resumed a checkpoint; no lost step is recomputed yet",
    ResumeOutcome.IDENTICAL_SO_FAR: "the steps recomputed so far are bit-identical;"
    " more lost steps are still to recompute",
    ResumeOutcome.IDENTICAL: "every lost step was recomputed bit for bit (every compared field)",
    ResumeOutcome.EQUAL_AS_PRINTED: "every recomputed loss equals the original at the digits"
    " the script prints (the drill, for a script that prints too few to compare bits)",
    ResumeOutcome.NOTHING_LEFT: "the checkpoint was of the last step trained (a graceful"
    " stop): nothing was lost, nothing to recompute",
    ResumeOutcome.DIFFERENT: "it resumed, but a recomputed value differs from the original:"
    " a different run",
    ResumeOutcome.FRESH: "no checkpoint was resumed: it trained from step 0 again",
    ResumeOutcome.REFUSED: "no checkpoint, and one was required: the restart refused to"
    " start (exit 3); or one it cannot load without dropping a rank's state (exit 2)",
    ResumeOutcome.TORN: "the kill tore a checkpoint write, and the restart met the torn"
    " checkpoint (the drill)",
    ResumeOutcome.CRASHED: "the restarted process failed by itself (the drill)",
    ResumeOutcome.HUNG: "the restarted process did not finish in time (the drill)",
    ResumeOutcome.NOT_COMPARED: "the restart printed no step that could be compared (the drill)",
}

HELD: frozenset[ResumeOutcome] = frozenset(
    {ResumeOutcome.IDENTICAL, ResumeOutcome.EQUAL_AS_PRINTED, ResumeOutcome.NOTHING_LEFT}
)
# What the lab's check (server/lessons/resume_checks.py) can say; the rest are the drill's or, for a
# refused restart, a prediction's (read from the `no_checkpoint` event, with no check).
LAB_CHECK: frozenset[ResumeOutcome] = frozenset(
    {
        ResumeOutcome.WAITING,
        ResumeOutcome.IDENTICAL_SO_FAR,
        ResumeOutcome.IDENTICAL,
        ResumeOutcome.NOTHING_LEFT,
        ResumeOutcome.DIFFERENT,
        ResumeOutcome.FRESH,
    }
)
# Not final yet: a live check that more recomputed steps will decide.
PENDING: frozenset[ResumeOutcome] = frozenset(
    {ResumeOutcome.WAITING, ResumeOutcome.IDENTICAL_SO_FAR}
)


def outcomes_json() -> list[dict[str, Any]]:
    """Every outcome with its meaning, for GET /api/record-kinds (`resume_outcomes`)."""
    return [
        {
            "value": o.value,
            "meaning": o.meaning,
            "held": o.held,
            "pending": o in PENDING,
            "lab_check": o in LAB_CHECK,
        }
        for o in ResumeOutcome
    ]
