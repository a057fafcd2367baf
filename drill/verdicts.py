"""What the drill concludes, as data: the evidence it gathered, one verdict per resume,
the findings (each class of bug with what proves it) and the analysis that sums them up.

    an = analyse(Evidence(target, ref, ref_snapshot, crashed, plan))   # drill/compare.py
    an.verdict, an.exit_code, an.findings, an.resumes[0].verdict

drill/compare.py makes an Analysis from the Evidence; drill/judge.py judges one
resume; drill/report.py and drill/junit.py write them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from crashdrill.drill.finding_codes import code_of
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.record_fields import RunRecords
from crashdrill.drill.snapshot import Snapshot
from crashdrill.drill.target import Segment, Target
from crashdrill.drill.trace import Precision, StepPoint
from crashdrill.trainer.resume_compare import (
    LOSS,
    RANK_LOSS,
    FieldComparison,
    RankDivergence,
    compare,
    first_rank_divergence,
)
from crashdrill.trainer.resume_outcome import ResumeOutcome

if TYPE_CHECKING:  # imported by the command drill only: the preset drill never inspects
    from crashdrill.drill.checkpoint_evidence import CheckpointLook


@dataclass
class Finding:
    """One class of bug (or a warning) with what proves it. `evidence` holds one sentence
    per fact the drill observed (where the kill landed, what the restart loaded, what a
    checkpoint lacks): a new kind of evidence is one more line, not a new finding."""

    code: str  # a code of drill/finding_codes.py
    text: str
    fails: bool | None = None  # None: what the code's registry entry says
    resume: int | None = None
    evidence: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        entry = code_of(self.code)  # a ValueError for a code that is not registered
        if self.fails is None:
            self.fails = entry.fails
        elif self.fails != entry.fails and not entry.note_when:
            what = "fails" if entry.fails else "is a note"
            raise ValueError(f"finding {self.code!r} {what} (drill/finding_codes.py)")


@dataclass
class FinalParams:
    """The end state of both runs: weights by torch.equal (built-in trainer), or files by
    their bytes (--compare-file)."""

    equal: bool
    items: int
    mismatched: list[str] = field(default_factory=list)
    error: str | None = None
    method: str = "torch.equal"


@dataclass
class Evidence:
    """Everything the drill observed; analyse() turns it into a verdict."""

    target: Target
    reference: Segment
    reference_snapshot: Snapshot  # the reference's checkpoint dir when it ended
    crashed: list[Segment]
    plan: list[KillPoint]
    final_params: FinalParams | None = None
    records: RunRecords | None = None  # the built-in trainer's run records, both runs
    # `crashdrill inspect` on the crashed run's checkpoints, asked only when a finding needs it
    checkpoint: CheckpointLook | None = None


@dataclass
class ResumeVerdict:
    """One resume as the drill saw it: the kill, the restart, the recomputed losses
    against the reference, and what that means."""

    index: int  # resume k = segment k of the crashed run
    killed_at_step: int | None  # the last step the killed process printed
    kill_in_write: bool
    from_step: int | None
    first_step: int | None  # the first step the resumed process printed
    recomputed: tuple[int, int] | None  # first and last recomputed step
    recomputed_steps: int
    loss: FieldComparison  # the losses this process printed against the reference's
    bit_identical: bool
    restarted_from_start: bool
    progress_saved: bool  # a checkpoint newer than the start existed at the kill
    latency_s: float | None  # SIGKILL → first step record of the resumed process
    outcome: str  # how the resumed process ended: killed, finished, crashed, hung
    verdict: str
    # The verdict in one word, the lab's words for it (trainer/resume_outcome.py)
    resume_outcome: ResumeOutcome
    resume_args: bool | None = None  # started with the script's resume arguments
    # Every compared field of the run records (the built-in trainer), else only the loss
    fields: tuple[FieldComparison, ...] = ()
    trial: str = "after-checkpoint"  # a TRIAL_KINDS key, "replay" or "restart-after-crash"
    kill: int | None = None  # the number of the kill before it (report's `kills`)
    kill_where: str = ""  # Landing.where: inside a write, after it, between writes
    kill_evidence: tuple[str, ...] = ()  # what proves where the kill landed
    replay_of: int | None = None  # started from the copy of resume k's start state
    compared_with: str = "reference"  # or "killed process" once the run had diverged
    # --resume-world-size: the reduced loss stayed within --tolerance (None: not asked)
    within_tolerance: bool | None = None

    @property
    def held(self) -> bool:
        """It matched (to the precision printed), had nothing left to train, or, on
        another world size, stayed within the tolerance."""
        return self.resume_outcome.held or bool(self.within_tolerance)

    @property
    def points(self) -> int:  # step pairs compared with the reference
        return self.loss.points

    @property
    def max_abs_delta(self) -> float | None:
        return self.loss.max_abs_delta

    @property
    def mean_abs_delta(self) -> float | None:
        return self.loss.mean_abs_delta

    @property
    def first_divergent_step(self) -> int | None:
        return self.loss.first_divergent_step

    @property
    def divergent_offset(self) -> int | None:  # 0: the very first step this process printed
        return self.loss.divergent_offset

    @property
    def first_divergent_rank(self) -> RankDivergence | None:
        """A run of several ranks: the first rank whose own loss differs."""
        return first_rank_divergence(self.fields)


@dataclass
class Analysis:
    resumes: list[ResumeVerdict]
    findings: list[Finding]
    precision: Precision
    verdict: str  # "pass" or "fail"
    exit_code: int


def pair(reference: list[StepPoint], points: list[StepPoint]) -> list[tuple[StepPoint, StepPoint]]:
    """(reference, other) for every step both printed, in the other's order."""
    by_step = {p.step: p for p in reference}
    return [(by_step[p.step], p) for p in points if p.step in by_step]


def compare_losses(pairs: list[tuple[StepPoint, StepPoint]], field: str = LOSS) -> FieldComparison:
    """The shared resume comparison over (reference, other) pairs; `field` names it
    (a rank's own trace: `step.rank_loss_bits.R`, as the built-in trainer's records)."""
    return compare(field, [(a.step, a.reading, b.reading) for a, b in pairs])


def rank_pairs(reference: Segment, seg: Segment) -> dict[int, list[tuple[StepPoint, StepPoint]]]:
    """Each rank's steps paired with the same rank's in `reference`, when the reference's
    lines said their ranks and at least two ranks printed steps (else empty)."""
    if len(reference.rank_points) < 2:
        return {}
    return {
        r: pair(reference.rank_points[r], seg.rank_points.get(r, []))
        for r in sorted(reference.rank_points)
    }


def rank_field(rank: int) -> str:
    """The name of a rank's own loss comparison, the built-in trainer's records' too."""
    return f"{RANK_LOSS}.{rank}"


def stderr_tail(seg: Segment, n: int = 8) -> str:
    """The last `n` non-empty stderr lines, indented, for a finding's text."""
    lines = [ln for ln in seg.stderr_tail if ln.strip()][-n:]
    return ("\n    " + "\n    ".join(lines)) if lines else " (stderr was empty)"


def step_text(step: int | None) -> str:
    """A step for a sentence: its number, or "none"."""
    return "none" if step is None else str(step)


def delta_text(x: float) -> str:
    """A difference of losses for a sentence: three significant digits."""
    return f"{x:.3g}"


# The verdict of a resume whose restart found the run already at its last step (a stop
# saved it): nothing was recomputed or compared, and nothing failed.
NOTHING_LEFT = "nothing left to train"
# The verdict of a resume after one that diverged: nothing to compare it with.
NOT_JUDGED = "not judged"
