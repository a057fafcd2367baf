"""Resume checks and diagnosis: what the two traces say, and why they differ.

Each resume (segment k of the crashed run) is paired step by step with the uninterrupted
reference. The findings name the likely cause wherever the evidence points to one. The
comparison of the paired losses is the lab's too (`crashdrill.trainer.resume_compare`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from crashdrill.drill.divergence import (
    reference_diverged_text,
    resume_diverged_text,
    same_divergence,
)
from crashdrill.drill.landing import Landing, judge_landing
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.record_fields import RunRecords, field_verdict
from crashdrill.drill.snapshot import Snapshot
from crashdrill.drill.target import Segment, Target, last_step_trained
from crashdrill.drill.trace import Precision, StepPoint, classify_precision, step_spacing
from crashdrill.trainer.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from crashdrill.trainer.resume_compare import LOSS, FieldComparison, compare

if TYPE_CHECKING:  # imported by the command drill only: the preset drill never inspects
    from crashdrill.drill.checkpoint_evidence import CheckpointLook

TINY_RELATIVE = 1e-4  # a first difference this small is rounding, not a different batch
TORN = "write checkpoints atomically: a temp file, fsync, then os.replace"
TORN_DIR = (
    "write each checkpoint under a temp name and rename it when complete (os.replace), "
    "and make resume skip a checkpoint that is incomplete"
)


@dataclass
class Finding:
    """One class of bug (or a warning) with what proves it. `evidence` holds one sentence
    per fact the drill observed (where the kill landed, what the restart loaded, what a
    checkpoint lacks): a new kind of evidence is one more line, not a new finding."""

    code: str
    text: str
    fails: bool = True
    resume: int | None = None
    evidence: list[str] = field(default_factory=list)


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
    trial: str = "after-checkpoint"  # a TRIAL_KINDS key, "replay" or "restart-after-crash"
    kill: int | None = None  # the number of the kill before it (report's `kills`)
    kill_where: str = ""  # Landing.where: inside a write, after it, between writes
    kill_evidence: tuple[str, ...] = ()  # what proves where the kill landed
    replay_of: int | None = None  # started from the copy of resume k's start state
    compared_with: str = "reference"  # or "killed process" once the run had diverged

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

    ref_div = target.diverged(ref)
    if ref.hung or (ref.crashed and ref_div is None) or not ref.points:
        findings.append(_reference_problem(ref, target))
        code = EXIT_USAGE if findings[0].code == "no-steps" else EXIT_FAILED
        return Analysis([], findings, precision, "fail", code)
    # A reference that diverged is compared with only where a resume reached its end.
    judged = 0
    if ref_div is not None:
        judged = sum(1 for s in segs[1:] if s.points and s.points[0].step <= ref_div.step)
        if not judged:  # a run that does not train: nothing to judge a resume against
            findings.append(Finding("reference-diverged", reference_diverged_text(ref_div, 0)))
            return Analysis([], findings, precision, "fail", EXIT_USAGE)

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

    kill_numbers = {
        seg.index: n for n, (_, seg) in enumerate(executed_kills(ev.plan, segs), 1) if seg
    }
    resumes: list[ResumeVerdict] = []
    for k in range(1, len(segs)):
        resumes.append(
            _check(k, ev, spacing, precision, unrepeatable, findings, resumes, kill_numbers)
        )

    if ref_div is not None:
        text = reference_diverged_text(ref_div, judged)
        findings.append(Finding("reference-diverged", text, fails=False))
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
        missed = [k for k, seg in executed_kills(ev.plan, segs) if seg is None or not seg.killed]
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
    exit_code = EXIT_FAILED if failed else EXIT_OK
    return Analysis(resumes, findings, precision, "fail" if failed else "pass", exit_code)


def executed_kills(
    plan: list[KillPoint], segs: list[Segment]
) -> list[tuple[KillPoint, Segment | None]]:
    """Every kill in the order the crashed run met it, with the segment it was meant to
    end (None: the chain ended before that kill was tried): the plan's kills and any
    recovery kill the engine added. Segments that carry no kill point (made by hand)
    are matched to the plan by position."""
    if not any(s.kill_point is not None for s in segs):
        return [(k, segs[i] if i < len(segs) else None) for i, k in enumerate(plan)]
    out: list[tuple[KillPoint, Segment | None]] = [
        (s.kill_point, s) for s in segs if s.kill_point is not None
    ]
    tried = {id(k) for k, _ in out}
    return out + [(k, None) for k in plan if id(k) not in tried]


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


def _lineage_divergence(k: int, segs: list[Segment], earlier: list[ResumeVerdict]) -> int | None:
    """The earlier resume, on the same line of restarts as resume k (no copy put back in
    between), whose losses already left the reference's: what it printed after that is
    inherited, so resume k is judged against the killed process's own losses."""
    if segs[k].restored_from is not None:
        return None  # started from a copy: a new line of restarts
    for r in reversed(earlier):
        if r.first_divergent_step is not None and r.compared_with == "reference":
            return r.index
        if segs[r.index].restored_from is not None:
            return None
    return None


def _trial(prev: Segment | None, seg: Segment, landing: Landing, saved: bool, t: Target) -> str:
    """What resume `seg` tested, from what happened (not only what was planned)."""
    if seg.restored_from is not None:
        return "replay"
    if prev is None or not prev.killed:
        return "restart-after-crash"
    kp = prev.kill_point
    if (kp is not None and kp.preempt) or prev.term_time is not None:
        return "preemption"
    if landing.in_write:
        return "inside-write"
    if not saved and not t.has_checkpoint(prev.snapshot_before_kill):
        return "before-first-checkpoint"
    if kp is not None and kp.before_first and not saved:
        return "before-first-checkpoint"
    return "after-checkpoint"


def _check(
    k: int,
    ev: Evidence,
    spacing: int,
    precision: Precision,
    unrepeatable: bool,
    findings: list[Finding],
    earlier: list[ResumeVerdict],
    kill_numbers: dict[int, int],
) -> ResumeVerdict:
    segs, ref, target = ev.crashed, ev.reference, ev.target
    ref_div = target.diverged(ref)
    seg = segs[k]
    replay_of = seg.restored_from
    # A replay started from the copy of segment r's start: it resumes from the kill that
    # ended segment r - 1, as segment r did.
    if replay_of is not None:
        prev: Segment | None = segs[replay_of - 1] if replay_of > 0 else None
    else:
        prev = segs[k - 1]
    killed_at = prev.last_step if prev is not None else None
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
    saved = prev is not None and target.progress_saved(
        segs[0].snapshot_first_step, prev.snapshot_before_kill
    )
    landing = (
        judge_landing(prev, seg, from_step, target, ref.write_steps)
        if prev is not None and prev.killed and replay_of is None
        else Landing(False, False, killed_at)
    )
    inherited = _lineage_divergence(k, segs, earlier)
    if inherited is not None and prev is not None:
        # Past the earlier divergence the reference says nothing about this resume: its
        # recomputed steps against what the killed process printed is the resume check.
        pairs = pair(prev.points, seg.points)
    else:
        pairs = pair(ref.points, seg.points)
    loss = compare_losses(pairs)
    i = loss.divergent_offset
    latency = None
    if seg.points and prev is not None and prev.kill_time is not None and replay_of is None:
        latency = seg.points[0].t - prev.kill_time
    evidence = list(landing.evidence)

    def add(code: str, text: str, fails: bool = True) -> None:
        findings.append(Finding(code, f"resume {k}: {text}", fails, k, list(evidence)))

    torn_note = ""
    if landing.torn and landing.in_place:
        torn_note = (
            f" The kill landed inside a checkpoint write that overwrote "
            f"{', '.join(landing.in_place[:3])} in place: the checkpoint was torn — {TORN}."
        )
    elif landing.torn:
        torn_note = (
            f" The kill landed inside a checkpoint write that left "
            f"{', '.join(landing.partial[:3])} incomplete under its final name: the checkpoint "
            f"was torn — {TORN_DIR}."
        )
    # A write that left a new checkpoint incomplete under its final name, which the
    # restart skipped for the older complete one: that older one was intact, so what its
    # resume shows is judged like a plain resume, and the incomplete one is a note.
    skipped = (
        landing.torn
        and not landing.in_place
        and not seg.crashed
        and not seg.hung
        and from_step is not None
        and landing.writing_step is not None
        and from_step < landing.writing_step
    )
    if skipped:
        torn_note = ""
        add(
            "incomplete-skipped",
            f"the kill left {', '.join(landing.partial[:3])} incomplete under its final name; "
            f"the restart skipped it and resumed from the older complete checkpoint (step "
            f"{from_step}), so nothing torn was loaded. A script that did not skip it would "
            f"load a torn checkpoint — {TORN_DIR}",
            fails=False,
        )
    if landing.in_place and not landing.in_write:
        add(
            "in-place-write",
            f"{', '.join(landing.in_place[:3])} {'were' if len(landing.in_place) > 1 else 'was'}"
            " rewritten in place (the same file), not "
            "written under a temp name and renamed. This kill landed after that write had "
            f"finished, so nothing was torn this time; a kill inside it would tear it — {TORN}",
            fails=False,
        )
    verdict = ""
    div = target.diverged(seg)
    diverged_at = None  # a divergence of its own, where the reference did not
    if div is not None and not same_divergence(div, seg.points, ref.points, target.diverged(ref)):
        diverged_at = div.step
    if seg.hung:
        add(
            "hung",
            f"the restarted script did not finish within {target.timeout:g} s (last "
            f"step printed: {_opt(seg.last_step)}).{torn_note} stderr tail:{_tail(seg)}",
        )
        verdict = "hung"
    elif diverged_at is not None and div is not None and not torn_note:
        add("resume-diverged", resume_diverged_text(div, seg.points, ref.points, ref_div))
        verdict = f"diverged at step {diverged_at}"
    elif seg.crashed and div is None:
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
    elif seg.crashed and torn_note:  # it diverged after loading a torn checkpoint
        add(
            "torn-checkpoint",
            f"the restarted script {target.exit_meaning(seg.exit_code)}."
            f"{torn_note} stderr tail:{_tail(seg)}",
        )
        verdict = "diverged"
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
    if inherited is not None and not pairs and not verdict:
        verdict = f"not judged: the run had diverged at resume {inherited}"
    if i is not None:
        a, b = pairs[i]
        worst = loss.max_abs_delta or 0.0  # there are pairs: never None here
        verdict = verdict or f"diverged at step {a.step}"
        if not unrepeatable and not (from_start and saved):
            rel = a.delta(b) / max(abs(a.value), 1e-12)
            was_recomputed = recomputed is not None and a.step <= recomputed[1]
            if was_recomputed:
                where = f"the very first recomputed loss (step {a.step})"
            else:
                where = (
                    f"the first loss after the resume (step {a.step}; no step was recomputed: "
                    f"it resumed from step {_opt(from_step)}, the last one before the kill)"
                )
            if inherited is not None:
                evidence.append(
                    f"compared with the losses the killed process printed (the run had "
                    f"already diverged from the reference at resume {inherited})"
                )
            if a.step == diverged_at:
                pass  # the divergence is the finding: resume-diverged above
            elif torn_note:
                add("torn-checkpoint", f"diverges from step {a.step}.{torn_note}")
            elif i == 0 and rel > TINY_RELATIVE:
                add(
                    "state-missing",
                    f"{where} differs by {_fmt(a.delta(b))}: the batch or the weights differ — "
                    "the checkpoint lacks (or the script does not restore) the RNG state or "
                    "the data position" + _inspected(ev),
                )
            elif i == 1 and rel > TINY_RELATIVE:
                matched = "first recomputed loss" if was_recomputed else "first loss after it"
                add(
                    "state-missing",
                    f"the {matched} matches (the weights came back) but step {a.step} differs "
                    f"by {_fmt(a.delta(b))}: the update differs — optimizer state (momentum, "
                    "Adam moments, step count) or the LR-schedule position is missing from the "
                    "checkpoint" + _inspected(ev),
                )
            else:
                add(
                    "nondeterministic",
                    f"diverges {i} printed step(s) after the resume, at "
                    f"step {a.step}, by {_fmt(a.delta(b))}, growing to {_fmt(worst)}: "
                    "nondeterministic kernels or a different thread count (or state that "
                    "only acts later, e.g. the LR schedule or a data epoch)",
                )
    restored = any(s.restored_from is not None for s in segs[: k + 1])
    # The trainer numbers its own segments: after a copy was put back they no longer
    # match the drill's, so only the printed loss is compared from there on.
    fields = ev.records.compare(k) if ev.records is not None and not restored else (loss,)
    other = field_verdict(fields) if i is None and not verdict else None
    if other is not None:
        verdict = other[0]
        add("fields-differ", other[1])
    exact = precision.exact
    if not verdict:
        verdict = "bit-identical" if exact else f"equal at {precision.digits} digits"
    if not pairs and not verdict.startswith(
        ("crashed", "hung", "refused", "not judged", "diverged")
    ):
        reached = last_step_trained(segs[:k])
        ended = seg.exit_code == 0 and not seg.killed and not seg.points
        if ended and reached is not None and reached >= (ref.last_step or 0):
            verdict = NOTHING_LEFT  # a stop saved the last step: the restart had nothing to do
        else:
            verdict = "no steps"
    return ResumeVerdict(
        index=k,
        killed_at_step=killed_at,
        kill_in_write=landing.in_write,
        from_step=from_step,
        first_step=seg.first_step,
        recomputed=recomputed,
        recomputed_steps=n_recomputed,
        loss=loss,
        bit_identical=verdict == "bit-identical",
        restarted_from_start=from_start,
        progress_saved=saved,
        latency_s=latency,
        outcome=f"diverged (exit {seg.exit_code})" if div is not None else _outcome(seg),
        verdict=verdict,
        resume_args=seg.resume_args,
        fields=fields,
        trial=_trial(prev, seg, landing, saved, target),
        kill=kill_numbers.get(prev.index) if prev is not None and replay_of is None else None,
        kill_where=landing.where if prev is not None and prev.killed else "",
        kill_evidence=tuple(landing.evidence),
        replay_of=replay_of,
        compared_with="killed process" if inherited is not None else "reference",
    )
