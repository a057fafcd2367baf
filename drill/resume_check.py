"""One resume judged: what the kill hit, what the restart loaded, and how its losses
compare with the reference's, with the finding that names the likely cause.

    verdict = check_resume(k, evidence, spacing, precision, unrepeatable, findings, ...)

Called by `analyse` (drill/compare.py) once per resume, in order: a resume on the same
line of restarts as an earlier one that already diverged is judged against the killed
process's own losses (`_lineage_divergence`).
"""

from __future__ import annotations

from crashdrill.drill.divergence import resume_diverged_text, same_divergence
from crashdrill.drill.finding_codes import (
    CRASHED,
    FIELDS_DIFFER,
    HUNG,
    IN_PLACE_WRITE,
    INCOMPLETE_SKIPPED,
    NONDETERMINISTIC,
    RESUME_DIVERGED,
    SILENT_FRESH_START,
    STATE_MISSING,
    STEPS_RESTARTED,
    TORN_CHECKPOINT,
)
from crashdrill.drill.landing import Landing, judge_landing
from crashdrill.drill.record_fields import field_verdict
from crashdrill.drill.target import Segment, last_step_trained
from crashdrill.drill.trace import Precision
from crashdrill.drill.verdicts import (
    NOTHING_LEFT,
    Evidence,
    Finding,
    ResumeVerdict,
    compare_losses,
    delta_text,
    pair,
    stderr_tail,
    step_text,
)
from crashdrill.drill.write_evidence import incomplete_proof
from crashdrill.trainer.resume_outcome import ResumeOutcome

TINY_RELATIVE = 1e-4  # a first difference this small is rounding, not a different batch
TORN = "write checkpoints atomically: a temp file, fsync, then os.replace"
TORN_DIR = (
    "write each checkpoint under a temp name and rename it when complete (os.replace), "
    "and make resume skip a checkpoint that is incomplete"
)


def _outcome(seg: Segment) -> str:
    if seg.killed:
        return "killed"
    if seg.hung:
        return "hung"
    return "finished" if seg.exit_code == 0 else f"crashed (exit {seg.exit_code})"


def _explain(ev: Evidence, at: str) -> tuple[str, str]:
    """The code and the cause of a divergence at the first resumed step (`at` "batch") or
    the second ("update"), from what the checkpoint holds (drill/checkpoint_evidence.py);
    the built-in trainer's drill reads no checkpoint: the trace's words alone."""
    if ev.checkpoint is not None:
        return ev.checkpoint.explain(at)
    from crashdrill.drill.checkpoint_evidence import HEDGED, TRACE

    return STATE_MISSING, TRACE[at] + HEDGED[at]


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


def _trial(
    prev: Segment | None,
    seg: Segment,
    landing: Landing,
    saved: bool,
    from_step: int | None,
    writes: list[int],
) -> str:
    """What resume `seg` tested, from what happened, not what was planned: a plain kill
    is after a checkpoint only with evidence that a complete one newer than the start
    existed when it landed: the restart resumed from a later step than the start, or a
    checkpoint newer than the start was in the dir and (when the reference's writes are
    known) the killed process had printed a step line after the first of them."""
    if seg.restored_from is not None:
        return "replay"
    if prev is None or not prev.killed:
        return "restart-after-crash"
    kp = prev.kill_point
    if (kp is not None and kp.preempt) or prev.term_time is not None:
        return "preemption"
    if landing.in_write:
        return "inside-write"
    resumed_later = from_step is not None and from_step > 0
    past_first = not writes or (prev.last_step is not None and prev.last_step > writes[0])
    return (
        "after-checkpoint"
        if resumed_later or (saved and past_first)
        else ("before-first-checkpoint")
    )


def check_resume(
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
    if replay_of is not None and segs[replay_of].copy_step is not None:
        # It started from the dir as the torn write found it (the write before it holds
        # the newest checkpoint): it recomputes what segment `replay_of` printed from there.
        killed_at = segs[replay_of].last_step
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
    state = prev.snapshot_before_kill if prev is not None else None
    if replay_of is not None and segs[replay_of].copy_step is not None:
        state = segs[replay_of].copy_snapshot
    saved = prev is not None and target.progress_saved(segs[0].snapshot_first_step, state)
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

    def add(code: str, text: str, fails: bool | None = None, more: tuple[str, ...] = ()) -> None:
        findings.append(Finding(code, f"resume {k}: {text}", fails, k, [*evidence, *more]))

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
    # Said only when something shows the skipped one was incomplete: a kill between a new
    # checkpoint's write and the update of the one a restart loads (Lightning's last.ckpt)
    # leaves a complete new file that the restart had no reason to load.
    proof: tuple[str, ...] = ()
    if skipped and prev is not None:
        was = (prev.snapshot_before_kill, prev.snapshot_after_kill, ev.reference_snapshot)
        proof = tuple(incomplete_proof(landing.partial, *was))
    if skipped:
        torn_note = ""
    if proof:
        add(
            INCOMPLETE_SKIPPED,
            f"the kill left {', '.join(landing.partial[:3])} incomplete under its final name; "
            f"the restart skipped it and resumed from the older complete checkpoint (step "
            f"{from_step}), so nothing torn was loaded. A script that did not skip it would "
            f"load a torn checkpoint — {TORN_DIR}",
            more=proof,
        )
    if landing.in_place and not landing.in_write:
        add(
            IN_PLACE_WRITE,
            f"{', '.join(landing.in_place[:3])} {'were' if len(landing.in_place) > 1 else 'was'}"
            " rewritten in place (the same file), not "
            "written under a temp name and renamed. This kill landed after that write had "
            f"finished, so nothing was torn this time; a kill inside it would tear it — {TORN}",
            fails=False,
        )
    verdict = ""
    outcome: ResumeOutcome | None = None  # the verdict in one word (trainer/resume_outcome.py)
    div = target.diverged(seg)
    diverged_at = None  # a divergence of its own, where the reference did not
    if div is not None and not same_divergence(div, seg.points, ref.points, target.diverged(ref)):
        diverged_at = div.step
    if seg.hung:
        add(
            HUNG,
            f"the restarted script did not finish within {target.timeout:g} s (last "
            f"step printed: {step_text(seg.last_step)}).{torn_note} stderr tail:{stderr_tail(seg)}",
        )
        verdict = "hung"
        outcome = ResumeOutcome.TORN if torn_note else ResumeOutcome.HUNG
    elif diverged_at is not None and div is not None and not torn_note:
        add(RESUME_DIVERGED, resume_diverged_text(div, seg.points, ref.points, ref_div))
        verdict = f"diverged at step {diverged_at}"
        outcome = ResumeOutcome.DIFFERENT
    elif seg.crashed and div is None:
        meaning = target.exit_meaning(seg.exit_code)
        what = meaning or f"crashed by itself with exit status {seg.exit_code}"
        if torn_note:
            add(
                TORN_CHECKPOINT,
                f"the restarted script {what}.{torn_note} stderr tail:{stderr_tail(seg)}",
            )
        else:
            add(CRASHED, f"the restarted script {what}. stderr tail:{stderr_tail(seg)}")
        verdict = "refused" if meaning else "crashed"
        if torn_note:
            outcome = ResumeOutcome.TORN
        else:
            outcome = ResumeOutcome.REFUSED if meaning else ResumeOutcome.CRASHED
    elif seg.crashed and torn_note:  # it diverged after loading a torn checkpoint
        add(
            TORN_CHECKPOINT,
            f"the restarted script {target.exit_meaning(seg.exit_code)}."
            f"{torn_note} stderr tail:{stderr_tail(seg)}",
        )
        verdict = "diverged"
        outcome = ResumeOutcome.TORN
    if from_start and saved:
        # A fresh start prints the reference's first loss; one that loaded the weights and
        # counted from 0 again prints another (the script is deterministic: `unrepeatable`)
        loaded = i == 0 and not unrepeatable and pairs[0][1].step == seg.first_step
        if torn_note:
            add(TORN_CHECKPOINT, f"restarted from the start.{torn_note}")
            outcome = outcome or ResumeOutcome.TORN
        elif loaded:
            a, b = pairs[0]
            evidence.append(
                f"the resumed process printed step {b.step} again with loss {b.text}, a fresh "
                f"start (the reference) {a.text} there: it did not start from the initial "
                "weights"
            )
            lacks = ev.checkpoint.lacks_sentence() if ev.checkpoint is not None else ""
            add(
                STEPS_RESTARTED,
                f"it loaded the weights and started counting steps from {b.step} again: the "
                "step counter is not restored (a checkpoint existed at the kill), so whatever "
                "follows the step (an LR schedule, a data position) starts over too." + lacks,
            )
            verdict = verdict or f"steps restarted from {b.step}"
            outcome = outcome or ResumeOutcome.DIFFERENT
        else:
            add(
                SILENT_FRESH_START,
                f"the step counter went back to {seg.first_step} although "
                "a checkpoint existed, and its first loss is a fresh start's (the reference's):"
                " the script started fresh without saying so (it does not load its checkpoint,"
                " or loads it and throws it away)",
            )
        verdict = verdict or "silent fresh start"
        outcome = outcome or ResumeOutcome.FRESH
    if inherited is not None and not pairs and not verdict:
        verdict = f"not judged: the run had diverged at resume {inherited}"
        outcome = ResumeOutcome.NOT_COMPARED
    if i is not None:
        a, b = pairs[i]
        worst = loss.max_abs_delta or 0.0  # there are pairs: never None here
        verdict = verdict or f"diverged at step {a.step}"
        outcome = outcome or ResumeOutcome.DIFFERENT
        if not unrepeatable and not (from_start and saved):
            rel = a.delta(b) / max(abs(a.value), 1e-12)
            was_recomputed = recomputed is not None and a.step <= recomputed[1]
            if was_recomputed:
                where = f"the very first recomputed loss (step {a.step})"
            else:
                where = (
                    f"the first loss after the resume (step {a.step}; no step was recomputed: "
                    f"it resumed from step {step_text(from_step)}, the last one before the kill)"
                )
            if inherited is not None:
                evidence.append(
                    f"compared with the losses the killed process printed (the run had "
                    f"already diverged from the reference at resume {inherited})"
                )
            if a.step == diverged_at:
                pass  # the divergence is the finding: resume-diverged above
            elif torn_note:
                add(TORN_CHECKPOINT, f"diverges from step {a.step}.{torn_note}")
                outcome = ResumeOutcome.TORN
            elif i in (0, 1) and rel > TINY_RELATIVE:
                at = "batch" if i == 0 else "update"
                if at == "batch":
                    said = f"{where} differs by {delta_text(a.delta(b))}: "
                else:
                    matched = "first recomputed loss" if was_recomputed else "first loss after it"
                    said = (
                        f"the {matched} matches (the weights came back) but step {a.step} "
                        f"differs by {delta_text(a.delta(b))}: "
                    )
                code, why = _explain(ev, at)
                add(code, said + why)
            else:
                add(
                    NONDETERMINISTIC,
                    f"diverges {i} printed step(s) after the resume, at "
                    f"step {a.step}, by {delta_text(a.delta(b))}, growing to {delta_text(worst)}: "
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
        outcome = ResumeOutcome.DIFFERENT
        add(FIELDS_DIFFER, other[1])
    exact = precision.exact
    if not verdict:
        verdict = "bit-identical" if exact else f"equal at {precision.digits} digits"
        outcome = ResumeOutcome.IDENTICAL if exact else ResumeOutcome.EQUAL_AS_PRINTED
    if not pairs and not verdict.startswith(
        ("crashed", "hung", "refused", "not judged", "diverged")
    ):
        reached = last_step_trained(segs[:k])
        ended = seg.exit_code == 0 and not seg.killed and not seg.points
        if ended and reached is not None and reached >= (ref.last_step or 0):
            verdict = NOTHING_LEFT  # a stop saved the last step: the restart had nothing to do
            outcome = ResumeOutcome.NOTHING_LEFT
        else:
            verdict = "no steps"
            outcome = ResumeOutcome.NOT_COMPARED
    return ResumeVerdict(
        index=k,
        killed_at_step=killed_at,
        kill_in_write=landing.in_write,
        from_step=from_step,
        first_step=seg.first_step,
        recomputed=recomputed,
        recomputed_steps=n_recomputed,
        loss=loss,
        bit_identical=outcome is ResumeOutcome.IDENTICAL,
        restarted_from_start=from_start,
        progress_saved=saved,
        latency_s=latency,
        outcome=f"diverged (exit {seg.exit_code})" if div is not None else _outcome(seg),
        verdict=verdict,
        resume_outcome=outcome or ResumeOutcome.NOT_COMPARED,
        resume_args=seg.resume_args,
        fields=fields,
        trial=_trial(prev, seg, landing, saved, from_step, ref.write_steps),
        kill=kill_numbers.get(prev.index) if prev is not None and replay_of is None else None,
        kill_where=landing.where if prev is not None and prev.killed else "",
        kill_evidence=tuple(landing.evidence),
        replay_of=replay_of,
        compared_with="killed process" if inherited is not None else "reference",
    )
