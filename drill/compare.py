"""Resume checks and diagnosis: what the two traces say, and why they differ.

Each resume (segment k of the crashed run) is paired step by step with the uninterrupted
reference. The findings name the likely cause wherever the evidence points to one. The
comparison of the paired losses is the lab's too (`crashdrill.trainer.resume_compare`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from crashdrill.drill.engine import (
    Segment,
    Snapshot,
    Target,
    appeared_incomplete,
    last_step_trained,
    modified_in_place,
)
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.record_fields import RunRecords, field_verdict
from crashdrill.drill.trace import Precision, StepPoint, classify_precision, step_spacing
from crashdrill.trainer.resume_compare import LOSS, FieldComparison, compare

if TYPE_CHECKING:  # imported by the command drill only: the preset drill never inspects
    from crashdrill.drill.checkpoint_evidence import CheckpointLook

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
TINY_RELATIVE = 1e-4  # a first difference this small is rounding, not a different batch
TORN = "write checkpoints atomically: a temp file, fsync, then os.replace"
TORN_DIR = (
    "write each checkpoint under a temp name and rename it when complete (os.replace), "
    "and make resume skip a checkpoint that is incomplete"
)


@dataclass
class Finding:
    code: str
    text: str
    fails: bool = True
    resume: int | None = None


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
    resume_args: bool | None = None  # started with the script's resume arguments
    # Every compared field of the run records (the built-in trainer), else only the loss
    fields: tuple[FieldComparison, ...] = ()

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


def compare_losses(pairs: list[tuple[StepPoint, StepPoint]]) -> FieldComparison:
    """The shared resume comparison over (reference, other) pairs."""
    return compare(LOSS, [(a.step, a.reading, b.reading) for a, b in pairs])


def _outcome(seg: Segment) -> str:
    if seg.killed:
        return "killed"
    if seg.hung:
        return "hung"
    return "finished" if seg.exit_code == 0 else f"crashed (exit {seg.exit_code})"


def _tail(seg: Segment, n: int = 8) -> str:
    lines = [ln for ln in seg.stderr_tail if ln.strip()][-n:]
    return ("\n    " + "\n    ".join(lines)) if lines else " (stderr was empty)"


def _opt(step: int | None) -> str:
    return "none" if step is None else str(step)


def _fmt(x: float) -> str:
    return f"{x:.3g}"


# The verdict of a resume whose restart found the run already at its last step (a stop
# saved it): nothing was recomputed or compared, and nothing failed.
NOTHING_LEFT = "nothing left to train"


def analyse(ev: Evidence) -> Analysis:
    ref, segs, target = ev.reference, ev.crashed, ev.target
    every_point = ref.points + [p for s in segs for p in s.points]
    precision = classify_precision(every_point)
    findings: list[Finding] = []

    if ref.hung or ref.crashed or not ref.points:
        findings.append(_reference_problem(ref, target))
        code = EXIT_USAGE if findings[0].code == "no-steps" else EXIT_FAIL
        return Analysis([], findings, precision, "fail", code)

    spacing = step_spacing(ref.points)
    seg0_pairs = pair(ref.points, segs[0].points) if segs else []
    i0 = compare_losses(seg0_pairs).divergent_offset
    unrepeatable = i0 is not None
    if i0 is not None:
        a, b = seg0_pairs[i0]
        findings.append(
            Finding(
                "nondeterministic",
                f"the crashed run differs from the reference at step {a.step} before any kill "
                f"(|Δ| {_fmt(a.delta(b))}): the script is not reproducible even without a crash "
                "— nondeterministic kernels, a different thread count, or an unseeded RNG",
            )
        )

    never = _never_checkpoints(ev)
    if never:
        findings.append(Finding("never-checkpoints", never))
    if segs and not segs[0].killed and (segs[0].hung or segs[0].crashed):
        how = "hung" if segs[0].hung else f"exited with status {segs[0].exit_code} by itself"
        findings.append(
            Finding(
                "hung" if segs[0].hung else "crashed",
                f"the crashed run's first process {how} before any kill. stderr tail:"
                f"{_tail(segs[0])}",
            )
        )

    resumes = [
        _check(k, ev, spacing, precision, unrepeatable, findings) for k in range(1, len(segs))
    ]

    last = segs[-1] if segs else None
    if last is not None and last.exit_code == 0 and not last.killed:
        end = last_step_trained(segs)
        if end is None or end < (ref.last_step or 0):
            findings.append(
                Finding(
                    "incomplete",
                    f"the crashed run finished at step {end}, the reference at "
                    f"{ref.last_step}: the resumed run did not train to the end",
                )
            )
        missed = ev.plan[len(segs) - 1 :]
        if missed:
            findings.append(
                Finding(
                    "kill-missed",
                    f"{len(missed)} planned kill(s) never landed ("
                    + ", ".join(k.describe() for k in missed)
                    + "): the run finished first",
                    fails=False,
                )
            )
    if not precision.exact and precision.kind != "none":
        findings.append(Finding("too-few-digits", precision.describe()))
    fp = ev.final_params
    if fp is not None and (fp.error or not fp.equal):
        what = fp.error or (
            f"{len(fp.mismatched)} of {fp.items} differ ({fp.method}): "
            + ", ".join(fp.mismatched[:5])
        )
        findings.append(Finding("final-state-differs", f"final state: {what}"))

    failed = any(f.fails for f in findings) or any(
        not r.bit_identical and r.verdict != NOTHING_LEFT for r in resumes
    )
    exit_code = EXIT_FAIL if failed else EXIT_PASS
    return Analysis(resumes, findings, precision, "fail" if failed else "pass", exit_code)


def _inspected(ev: Evidence) -> str:
    """What the checkpoint holds and lacks, as one more sentence of evidence (or "")."""
    said = ev.checkpoint.sentence() if ev.checkpoint is not None else ""
    return f".{said}" if said else ""


def _never_checkpoints(ev: Evidence) -> str | None:
    """Every kill lost everything: no checkpoint anywhere, or none yet at any kill that
    came after the point where the reference had written its first."""
    target = ev.target
    landed = [s for s in ev.crashed if s.killed]
    found = any(target.has_checkpoint(s.snapshot_before_kill) for s in landed)
    if not target.has_checkpoint(ev.reference_snapshot) and not found:
        return (
            "the script never wrote a checkpoint into the directory the drill gave it "
            "({ckpt_dir} / CRASHDRILL_CKPT_DIR): every kill loses everything"
        )
    first = ev.reference.first_ckpt_step
    late = [s.last_step for s in landed if first is None or (s.last_step or 0) > first]
    if landed and not found and late:
        when = f"only after step {first}" if first is not None else "only when it finished"
        return (
            f"no checkpoint existed at any kill (the last at step {late[-1]}): the script "
            f"wrote its first checkpoint {when}, so every kill loses everything"
        )
    return None


def _reference_problem(ref: Segment, target: Target) -> Finding:
    if ref.hung:
        return Finding(
            "hung",
            f"the reference run (no kills) did not finish within {target.timeout:g} s; last "
            f"step printed: {_opt(ref.last_step)}. stderr tail:{_tail(ref)}",
        )
    if ref.crashed:
        return Finding(
            "crashed",
            f"the reference run (no kills) exited with status {ref.exit_code} by itself. "
            f"stderr tail:{_tail(ref)}",
        )
    seen = "; ".join(repr(s) for s in ref.other_stdout[:3]) or "nothing"
    return Finding(
        "no-steps",
        f"no step lines found in the script's stdout ({target.parser.describe()}); it printed "
        f"{seen}. Print JSON lines with step and loss, or pass --loss-regex with the named "
        "groups step and loss, e.g. --loss-regex 'iter (?P<step>\\d+): loss (?P<loss>\\S+)'",
    )


def _check(
    k: int,
    ev: Evidence,
    spacing: int,
    precision: Precision,
    unrepeatable: bool,
    findings: list[Finding],
) -> ResumeVerdict:
    segs, ref, target = ev.crashed, ev.reference, ev.target
    prev, seg = segs[k - 1], segs[k]
    killed_at = prev.last_step
    from_step = target.resumed_from(seg)
    from_start = seg.first_step is not None and seg.first_step <= (ref.first_step or 0)
    if from_step is None and seg.first_step is not None and not from_start:
        from_step = seg.first_step - spacing  # a restart from scratch resumed from nothing
    recomputed = None
    n_recomputed = 0
    first = from_step + 1 if from_step is not None else seg.first_step
    if first is not None and killed_at is not None and killed_at >= first:
        recomputed = (first, killed_at)
        n_recomputed = killed_at - first + 1
    saved = target.progress_saved(segs[0].snapshot_first_step, prev.snapshot_before_kill)
    in_place = modified_in_place(prev.snapshot_before_kill, prev.snapshot_after_kill)
    pairs = pair(ref.points, seg.points)
    loss = compare_losses(pairs)
    i = loss.divergent_offset
    latency = None
    if seg.points and prev.kill_time is not None:
        latency = seg.points[0].t - prev.kill_time

    def add(code: str, text: str) -> None:
        findings.append(Finding(code, f"resume {k}: {text}", resume=k))

    torn_note = (
        f" The kill landed inside a checkpoint write that overwrote {', '.join(in_place[:3])} "
        f"in place: the checkpoint was torn — {TORN}."
        if prev.in_write and in_place
        else ""
    )
    partial = appeared_incomplete(prev.snapshot_before_kill, prev.snapshot_after_kill)
    if prev.in_write and partial and not torn_note:
        torn_note = (
            f" The kill landed inside a checkpoint write that left {', '.join(partial[:3])} "
            f"incomplete under its final name: the checkpoint was torn — {TORN_DIR}."
        )
    verdict = ""
    if seg.hung:
        add(
            "hung",
            f"the restarted script did not finish within {target.timeout:g} s (last "
            f"step printed: {_opt(seg.last_step)}).{torn_note} stderr tail:{_tail(seg)}",
        )
        verdict = "hung"
    elif seg.crashed:
        meaning = target.exit_meaning(seg.exit_code)
        what = meaning or f"crashed by itself with exit status {seg.exit_code}"
        if torn_note:
            add(
                "torn-checkpoint",
                f"the restarted script {what}.{torn_note} stderr tail:{_tail(seg)}",
            )
        else:
            add("crashed", f"the restarted script {what}. stderr tail:{_tail(seg)}")
        verdict = "refused" if meaning else "crashed"
    if from_start and saved:
        if torn_note:
            add("torn-checkpoint", f"restarted from the start.{torn_note}")
        else:
            add(
                "silent-fresh-start",
                f"the step counter went back to {seg.first_step} although "
                "a checkpoint existed: the script started fresh without saying so (it does not "
                "load its checkpoint, or loads it and throws it away)",
            )
        verdict = verdict or "silent fresh start"
    if i is not None:
        a, b = pairs[i]
        worst = loss.max_abs_delta or 0.0  # there are pairs: never None here
        verdict = verdict or f"diverged at step {a.step}"
        if not unrepeatable and not (from_start and saved):
            rel = a.delta(b) / max(abs(a.value), 1e-12)
            if torn_note:
                add("torn-checkpoint", f"diverges from step {a.step}.{torn_note}")
            elif i == 0 and rel > TINY_RELATIVE:
                add(
                    "state-missing",
                    f"the very first recomputed loss (step {a.step}) differs "
                    f"by {_fmt(a.delta(b))}: the batch or the weights differ — the checkpoint "
                    "lacks (or the script does not restore) the RNG state or the data position"
                    + _inspected(ev),
                )
            elif i == 1 and rel > TINY_RELATIVE:
                add(
                    "state-missing",
                    f"the first recomputed loss matches (the weights came "
                    f"back) but step {a.step} differs by {_fmt(a.delta(b))}: the update "
                    "differs — optimizer state (momentum, Adam moments, step count) or the "
                    "LR-schedule position is missing from the checkpoint" + _inspected(ev),
                )
            else:
                add(
                    "nondeterministic",
                    f"diverges {i} printed step(s) after the resume, at "
                    f"step {a.step}, by {_fmt(a.delta(b))}, growing to {_fmt(worst)}: "
                    "nondeterministic kernels or a different thread count (or state that "
                    "only acts later, e.g. the LR schedule or a data epoch)",
                )
    fields = ev.records.compare(k) if ev.records is not None else (loss,)
    other = field_verdict(fields) if i is None and not verdict else None
    if other is not None:
        verdict = other[0]
        add("fields-differ", other[1])
    exact = precision.exact
    if not verdict:
        verdict = "bit-identical" if exact else f"equal at {precision.digits} digits"
    if not pairs and not verdict.startswith(("crashed", "hung", "refused")):
        reached = last_step_trained(segs[:k])
        ended = seg.exit_code == 0 and not seg.killed and not seg.points
        if ended and reached is not None and reached >= (ref.last_step or 0):
            verdict = NOTHING_LEFT  # a stop saved the last step: the restart had nothing to do
        else:
            verdict = "no steps"
    return ResumeVerdict(
        index=k,
        killed_at_step=killed_at,
        kill_in_write=prev.in_write,
        from_step=from_step,
        first_step=seg.first_step,
        recomputed=recomputed,
        recomputed_steps=n_recomputed,
        loss=loss,
        bit_identical=verdict == "bit-identical",
        restarted_from_start=from_start,
        progress_saved=saved,
        latency_s=latency,
        outcome=_outcome(seg),
        verdict=verdict,
        resume_args=seg.resume_args,
        fields=fields,
    )
