"""One resume judged: what the kill hit, what the restart loaded, and how its losses
compare with the reference's, with the finding that names the likely cause.

    verdict = check_resume(k, evidence, spacing, precision, unrepeatable, findings, ...)

Called by `analyse` (drill/compare.py) once per resume, in order: a resume on the same
line of restarts as an earlier one that already diverged is judged against the killed
process's own losses (`_lineage_divergence`).
"""

from __future__ import annotations

import re

from crashdrill.drill.diverged import resume_diverged_text, same_divergence
from crashdrill.drill.finding_codes import (
    CRASHED,
    DCP_INCOMPLETE,
    FIELDS_DIFFER,
    HUNG,
    IN_PLACE_WRITE,
    INCOMPLETE_SKIPPED,
    NONDETERMINISTIC,
    RANK_STATE,
    RESUME_DIVERGED,
    SILENT_FRESH_START,
    STATE_MISSING,
    STEPS_RESTARTED,
    TORN_CHECKPOINT,
    WORLD_SIZE_REFUSED,
    WORLD_SIZE_TOLERANCE,
)
from crashdrill.drill.landing import Landing, judge_landing
from crashdrill.drill.record_fields import field_verdict
from crashdrill.drill.snapshot import dcp_dirs
from crashdrill.drill.target import Segment, last_step_trained
from crashdrill.drill.trace import Precision
from crashdrill.drill.verdicts import (
    NOT_JUDGED,
    NOTHING_LEFT,
    Evidence,
    Finding,
    ResumeVerdict,
    compare_losses,
    delta_text,
    pair,
    rank_field,
    rank_pairs,
    stderr_tail,
    step_text,
)
from crashdrill.drill.world_size import reduced_points, refused
from crashdrill.drill.write_evidence import incomplete_proof
from crashdrill.trainer.resume_compare import (
    FieldComparison,
    RankDivergence,
    first_rank_divergence,
    rank_of,
)
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
    if prev.rank_kill is not None and prev.rank_kill.pid is not None:
        return "rank-kill"
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
    """Judge resume k: where it started and what it recomputed, what the kill hit, how
    the restart ended, then its losses and fields against the reference's. Each step may
    add a finding (to `findings`) and settle the verdict; the first verdict said stands."""
    judge = _ResumeJudge(k, ev, spacing, findings, earlier, unrepeatable)
    torn_note = judge.note_the_landing()
    judge.note_incomplete_dcp()
    verdict = judge.refused_world_size() or judge.how_it_ended(torn_note)
    verdict = judge.restart_from_start(verdict, torn_note, unrepeatable)
    verdict = judge.first_difference(verdict, torn_note, unrepeatable)
    verdict = judge.fields_and_verdict(verdict, precision)
    return judge.verdict(verdict, kill_numbers)


class _ResumeJudge:
    """What the steps of `check_resume` share: the resume's place on the line of restarts
    (`prev`, the segment whose kill it resumes from), the steps it recomputed, what the kill
    hit (`landing`), its losses paired with the ones it is judged against, and the
    evidence every finding about it carries."""

    def __init__(
        self,
        k: int,
        ev: Evidence,
        spacing: int,
        findings: list[Finding],
        earlier: list[ResumeVerdict],
        unrepeatable: bool = False,
    ) -> None:
        self.k, self.ev, self.findings = k, ev, findings
        segs, ref, target = ev.crashed, ev.reference, ev.target
        self.segs, self.ref, self.target = segs, ref, target
        self.seg = seg = segs[k]
        self.replay_of = replay_of = seg.restored_from
        self.prev = prev = self._resumed_after()
        killed_at = prev.last_step if prev is not None else None
        if replay_of is not None and segs[replay_of].copy_step is not None:
            # It started from the dir as the torn write found it (the write before it holds
            # the newest checkpoint): it recomputes what segment `replay_of` printed from there.
            killed_at = segs[replay_of].last_step
        self.killed_at = killed_at
        from_step = target.resumed_from(seg)
        self.from_start = seg.first_step is not None and seg.first_step <= (ref.first_step or 0)
        if from_step is None and seg.first_step is not None and not self.from_start:
            from_step = seg.first_step - spacing  # a restart from scratch resumed from nothing
        self.from_step = from_step
        self.recomputed: tuple[int, int] | None = None
        self.n_recomputed = 0
        first = from_step + 1 if from_step is not None else seg.first_step
        if first is not None and killed_at is not None and killed_at >= first:
            self.recomputed = (first, killed_at)
            self.n_recomputed = killed_at - first + 1
        state = prev.snapshot_before_kill if prev is not None else None
        if replay_of is not None and segs[replay_of].copy_step is not None:
            state = segs[replay_of].copy_snapshot
        self.saved = prev is not None and target.progress_saved(segs[0].snapshot_first_step, state)
        # On another world size every resume differs in its bits: each is judged against the
        # reference, within the tolerance, never against a killed process's own losses.
        self.inherited = (
            None
            if getattr(target, "resume_world_size", None) is not None
            else _lineage_divergence(k, segs, earlier)
        )
        if self.inherited is not None and prev is not None:
            # Past the earlier divergence the reference says nothing about this resume: its
            # recomputed steps against what the killed process printed is the resume check.
            self.pairs = pair(prev.points, seg.points)
        else:
            self.pairs = pair(ref.points, seg.points)
        self.loss = compare_losses(self.pairs)
        # A script whose ranks print their own steps: each rank's trace against the same
        # rank's (the reference's, or the killed process's past an earlier divergence).
        against = prev if self.inherited is not None and prev is not None else ref
        self.rank_pairs = rank_pairs(against, seg)
        self.rank_fields = tuple(
            compare_losses(p, rank_field(r)) for r, p in self.rank_pairs.items()
        )
        # --resume-world-size: the restarts ran at another number of ranks, so the reduced
        # loss is compared, within the tolerance (drill/world_size.py); no rank by rank
        self.tolerance: float | None = getattr(target, "tolerance", None)
        self.within_tolerance: bool | None = None
        if getattr(target, "resume_world_size", None) is not None:
            self.pairs = pair(reduced_points(against), reduced_points(seg))
            self.loss = compare_losses(self.pairs)
            self.rank_pairs, self.rank_fields = {}, ()
        # It counted from the start again but loaded the weights: a fresh start prints the
        # reference's first loss, one that loaded them another (a deterministic script).
        self.loaded_weights = (
            self.from_start
            and bool(self.pairs)
            and self.loss.divergent_offset == 0
            and not unrepeatable
            and self.pairs[0][1].step == seg.first_step
        )
        self.landing = (
            judge_landing(prev, seg, from_step, target, ref.write_steps, self.loaded_weights)
            if prev is not None and prev.killed and replay_of is None
            else Landing(False, False, killed_at)
        )
        self.latency: float | None = None
        if seg.points and prev is not None and prev.kill_time is not None and replay_of is None:
            self.latency = seg.points[0].t - prev.kill_time
        self.evidence = list(self.landing.evidence)
        div = target.diverged(seg)
        self.div = div
        self.outcome: ResumeOutcome | None = (
            None  # the verdict in one word (trainer/resume_outcome.py)
        )
        self.diverged_at: int | None = None  # its own divergence, where the reference had none
        if div is not None and not same_divergence(
            div, seg.points, ref.points, target.diverged(ref)
        ):
            self.diverged_at = div.step

    def _resumed_after(self) -> Segment | None:
        """The segment whose kill this resume restarts from: the one before it, or, for a
        replay started from the copy of segment r's start, the one before r (it resumes
        from the kill that ended segment r - 1, as segment r did)."""
        if self.replay_of is not None:
            return self.segs[self.replay_of - 1] if self.replay_of > 0 else None
        return self.segs[self.k - 1]

    def add(
        self, code: str, text: str, fails: bool | None = None, more: tuple[str, ...] = ()
    ) -> None:
        """A finding about this resume, with the evidence gathered so far."""
        self.findings.append(
            Finding(code, f"resume {self.k}: {text}", fails, self.k, [*self.evidence, *more])
        )

    def note_the_landing(self) -> str:
        """Findings about the checkpoint write the kill hit (an incomplete one the restart
        skipped, one rewritten in place); returns the sentence that a torn checkpoint adds
        to whatever this resume is found to have done, "" when nothing was torn."""
        landing, seg, prev, from_step = self.landing, self.seg, self.prev, self.from_step
        torn_note = ""
        if landing.torn and landing.in_place:
            torn_note = (
                f" The kill landed inside a checkpoint write that overwrote "
                f"{', '.join(landing.in_place[:3])} in place: the checkpoint was torn — {TORN}."
            )
        elif landing.torn:
            torn_note = (
                f" The kill landed inside a checkpoint write that left "
                f"{', '.join(landing.partial[:3])} incomplete under its final name: the "
                f"checkpoint was torn — {TORN_DIR}."
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
            was = (prev.snapshot_before_kill, prev.snapshot_after_kill, self.ev.reference_snapshot)
            proof = tuple(incomplete_proof(landing.partial, *was))
        if skipped:
            torn_note = ""
        if proof:
            self.add(
                INCOMPLETE_SKIPPED,
                f"the kill left {', '.join(landing.partial[:3])} incomplete under its final "
                f"name; the restart skipped it and resumed from the older complete checkpoint "
                f"(step {from_step}), so nothing torn was loaded. A script that did not skip it "
                f"would load a torn checkpoint — {TORN_DIR}",
                more=proof,
            )
        if landing.in_place and not landing.in_write:
            self.add(
                IN_PLACE_WRITE,
                f"{', '.join(landing.in_place[:3])} "
                f"{'were' if len(landing.in_place) > 1 else 'was'}"
                " rewritten in place (the same file), not "
                "written under a temp name and renamed. This kill landed after that write had "
                f"finished, so nothing was torn this time; a kill inside it would tear it — {TORN}",
                fails=False,
            )
        return torn_note

    def note_incomplete_dcp(self) -> None:
        """A restart that resumed from a DCP dir holding shards but no `.metadata` (the
        file DCP writes last): the dir's step, the last number in its name, is the step it
        resumed from."""
        if self.from_step is None:
            return
        for folder, complete in dcp_dirs(self.seg.snapshot_start).items():
            numbers = re.findall(r"\d+", folder.rsplit("/", 1)[-1])
            if complete or not numbers or int(numbers[-1]) != self.from_step:
                continue
            shards = sorted(k for k in self.seg.snapshot_start or {} if k.startswith(f"{folder}/"))
            self.add(
                DCP_INCOMPLETE,
                f"the restart resumed from step {self.from_step}, and {folder}/ held DCP "
                f"shards but no .metadata when it started: DCP writes .metadata last, once "
                "every rank's shards are written, so that checkpoint was incomplete (a write "
                "the kill cut short) and the restart trusted its name. Write the DCP dir under "
                "a temp name and rename it once .metadata is there, and resume only from a dir "
                "that holds it",
                more=(f"{folder}/ held {', '.join(shards[:4])} and no .metadata",),
            )

    def refused_world_size(self) -> str:
        """--resume-world-size: a restart that exited non-zero saying the world size
        differs refused, as a per-rank checkpoint must ("" when it did not)."""
        line = refused(self.seg) if self.tolerance is not None else None
        if line is None:
            return ""
        world = getattr(self.target, "resume_world_size", None)
        self.add(
            WORLD_SIZE_REFUSED,
            f"the restart at {world} rank(s) refused to resume (exit {self.seg.exit_code}): "
            f"{line[:300]}. The script does not resume on another world size (its checkpoint "
            "holds per-rank state that cannot be resharded): it says so instead of dropping a "
            "rank's state, but it does not resume elastically",
        )
        self.outcome = ResumeOutcome.REFUSED
        return "refused"

    def within_tolerance_verdict(self, verdict: str) -> str:
        """--resume-world-size: the reduced loss within the tolerance passes; beyond it is a
        finding naming the step and the |Δ|."""
        tol, worst = self.tolerance, self.loss.max_abs_delta
        assert tol is not None
        if verdict or not self.pairs or worst is None or self.loss.identical:
            return verdict  # bit-identical: a fresh start at the reference's world size
        if worst <= tol:
            self.within_tolerance = True
            self.outcome = ResumeOutcome.DIFFERENT  # the bits differ; the tolerance holds
            return f"within {tol:g} (max |Δ| {delta_text(worst)})"
        self.within_tolerance = False
        beyond = next(a for a, b in self.pairs if a.delta(b) > tol)
        world = getattr(self.target, "resume_world_size", None)
        self.add(
            WORLD_SIZE_TOLERANCE,
            f"at {world} rank(s) the reduced loss leaves the reference's by more than the "
            f"tolerance {tol:g} at step {beyond.step} (max |Δ| {delta_text(worst)} over "
            f"{self.loss.points} steps): the resume on another world size does not continue "
            "the same run (its data position or optimizer state was not mapped to the new "
            "ranks, or the tolerance is too tight for this many steps)",
        )
        self.outcome = ResumeOutcome.DIFFERENT
        return f"beyond {tol:g} from step {beyond.step}"

    def likely_cause(self) -> str:
        """The target's likely cause of this restart's failure, as a line of its own."""
        hint = self.target.failure_hint(self.seg)
        return f"\n  likely cause: {hint}" if hint else ""

    def how_it_ended(self, torn_note: str) -> str:
        """The verdict of a restart that hung, diverged by itself or crashed ("" when it
        did none of these), with the finding that says so."""
        seg, target, div = self.seg, self.target, self.div
        if seg.hung:
            self.add(
                HUNG,
                f"the restarted script did not finish within {target.timeout:g} s (last "
                f"step printed: {step_text(seg.last_step)}).{torn_note} stderr tail:"
                f"{stderr_tail(seg)}{self.likely_cause()}",
            )
            self.outcome = ResumeOutcome.TORN if torn_note else ResumeOutcome.HUNG
            return "hung"
        if self.diverged_at is not None and div is not None and not torn_note:
            ref_div = target.diverged(self.ref)
            self.add(
                RESUME_DIVERGED, resume_diverged_text(div, seg.points, self.ref.points, ref_div)
            )
            self.outcome = ResumeOutcome.DIFFERENT
            return f"diverged at step {self.diverged_at}"
        if seg.crashed and div is None:
            meaning = target.exit_meaning(seg.exit_code)
            what = meaning or f"crashed by itself with exit status {seg.exit_code}"
            if torn_note:
                self.add(
                    TORN_CHECKPOINT,
                    f"the restarted script {what}.{torn_note} stderr tail:{stderr_tail(seg)}",
                )
            else:
                self.add(
                    CRASHED,
                    f"the restarted script {what}. stderr tail:{stderr_tail(seg)}"
                    f"{self.likely_cause()}",
                )
            if torn_note:
                self.outcome = ResumeOutcome.TORN
            else:
                self.outcome = ResumeOutcome.REFUSED if meaning else ResumeOutcome.CRASHED
            return "refused" if meaning else "crashed"
        if seg.crashed and torn_note:  # it diverged after loading a torn checkpoint
            self.add(
                TORN_CHECKPOINT,
                f"the restarted script {target.exit_meaning(seg.exit_code)}."
                f"{torn_note} stderr tail:{stderr_tail(seg)}",
            )
            self.outcome = ResumeOutcome.TORN
            return "diverged"
        return ""

    def restart_from_start(self, verdict: str, torn_note: str, unrepeatable: bool) -> str:
        """A restart that counted from the first step again although progress was saved:
        did it load the weights and restart the counter, or start fresh without saying?"""
        if not (self.from_start and self.saved):
            return verdict
        seg, pairs = self.seg, self.pairs
        loaded = self.loaded_weights
        if torn_note:
            self.add(TORN_CHECKPOINT, f"restarted from the start.{torn_note}")
            self.outcome = self.outcome or ResumeOutcome.TORN
        elif loaded:
            a, b = pairs[0]
            self.evidence.append(
                f"the resumed process printed step {b.step} again with loss {b.text}, a fresh "
                f"start (the reference) {a.text} there: it did not start from the initial "
                "weights"
            )
            ev = self.ev
            lacks = ev.checkpoint.lacks_sentence() if ev.checkpoint is not None else ""
            self.add(
                STEPS_RESTARTED,
                f"it loaded the weights and started counting steps from {b.step} again: the "
                "step counter is not restored (a checkpoint existed at the kill), so whatever "
                "follows the step (an LR schedule, a data position) starts over too." + lacks,
            )
            verdict = verdict or f"steps restarted from {b.step}"
            self.outcome = self.outcome or ResumeOutcome.DIFFERENT
        else:
            self.add(
                SILENT_FRESH_START,
                f"the step counter went back to {seg.first_step} although "
                "a checkpoint existed, and its first loss is a fresh start's (the reference's):"
                " the script started fresh without saying so (it does not load its checkpoint,"
                " or loads it and throws it away)",
            )
        self.outcome = self.outcome or ResumeOutcome.FRESH
        return verdict or "silent fresh start"

    def first_difference(self, verdict: str, torn_note: str, unrepeatable: bool) -> str:
        """Where the losses first differ, and the finding that names the likely cause:
        the batch or the update (by what the checkpoint holds), a torn checkpoint, or
        nondeterminism."""
        if self.inherited is not None and not self.pairs and not verdict:
            verdict = f"{NOT_JUDGED}: the run had diverged at resume {self.inherited}"
            self.outcome = ResumeOutcome.NOT_COMPARED
        if self.tolerance is not None:
            return self.within_tolerance_verdict(verdict)
        i = self.loss.divergent_offset
        pairs, worst = self.pairs, self.loss.max_abs_delta or 0.0
        first_rank = first_rank_divergence(self.rank_fields)
        if first_rank is not None and (i is None or first_rank.step < pairs[i][0].step):
            # A rank's own loss left the reference before the run's trace (rank 0's) did.
            pairs = self.rank_pairs[first_rank.rank]
            f = next(f for f in self.rank_fields if rank_of(f.field) == first_rank.rank)
            i, worst = f.divergent_offset, f.max_abs_delta or 0.0
        if i is None:
            return verdict
        a, b = pairs[i]
        verdict = verdict or f"diverged at step {a.step}"
        self.outcome = self.outcome or ResumeOutcome.DIFFERENT
        if unrepeatable or (self.from_start and self.saved):
            return verdict
        rel = a.delta(b) / max(abs(a.value), 1e-12)
        recomputed = self.recomputed
        was_recomputed = recomputed is not None and a.step <= recomputed[1]
        if was_recomputed:
            where = f"the very first recomputed loss (step {a.step})"
        else:
            where = (
                f"the first loss after the resume (step {a.step}; no step was recomputed: "
                f"it resumed from step {step_text(self.from_step)}, the last one before the kill)"
            )
        if self.inherited is not None:
            self.evidence.append(
                f"compared with the losses the killed process printed (the run had "
                f"already diverged from the reference at resume {self.inherited})"
            )
        if a.step == self.diverged_at:
            pass  # the divergence is the finding: resume-diverged above
        elif torn_note:
            self.add(TORN_CHECKPOINT, f"diverges from step {a.step}.{torn_note}")
            self.outcome = ResumeOutcome.TORN
        elif (rank := self._rank_apart(a.step)) is not None:
            self.add(
                RANK_STATE,
                f"{where} differs on rank {rank.rank} while the other ranks' match "
                f"({rank.ranks} ranks compared): rank {rank.rank} did not get its own RNG "
                "states and data position back: a checkpoint that holds only rank 0's, or a "
                "restore that gives every rank rank 0's (it then trains on rank 0's batches)",
            )
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
            code, why = _explain(self.ev, at)
            self.add(code, said + why)
        else:
            self.add(
                NONDETERMINISTIC,
                f"diverges {i} printed step(s) after the resume, at "
                f"step {a.step}, by {delta_text(a.delta(b))}, growing to {delta_text(worst)}: "
                "nondeterministic kernels or a different thread count (or state that "
                "only acts later, e.g. the LR schedule or a data epoch)",
            )
        return verdict

    def _rank_apart(self, step: int) -> RankDivergence | None:
        """A run of several ranks whose resume left the reference on some ranks at `step`
        and not on others (the built-in trainer's records: each rank's own loss bits);
        None otherwise, or when the comparison is not with the reference."""
        ev = self.ev
        if self.rank_fields:  # a script's ranks, each printing its own steps
            fields: tuple[FieldComparison, ...] = self.rank_fields
        elif (
            ev.records is None
            or self.inherited is not None
            or any(s.restored_from is not None for s in self.segs[: self.k + 1])
        ):
            return None
        else:
            fields = ev.records.compare(self.k)
        first = first_rank_divergence(fields)
        if first is None or first.step != step:
            return None
        apart = [f for f in fields if rank_of(f.field) is not None and f.points]
        if all(f.first_divergent_step == step for f in apart):
            return None  # every rank at once: not one rank's own state
        return first

    def fields_and_verdict(self, verdict: str, precision: Precision) -> str:
        """The other recorded fields where the losses match, then the verdict when nothing
        was found ("bit-identical"), or what a resume with no step to compare did."""
        ev, k, segs, seg = self.ev, self.k, self.segs, self.seg
        restored = any(s.restored_from is not None for s in segs[: k + 1])
        # The trainer numbers its own segments: after a copy was put back they no longer
        # match the drill's, so only the printed loss is compared from there on.
        self.fields = (
            ev.records.compare(k, with_killed=self.inherited is not None)
            if ev.records is not None and not restored
            else (self.loss, *self.rank_fields)
        )
        i = self.loss.divergent_offset
        other = field_verdict(self.fields) if i is None and not verdict else None
        if other is not None:
            verdict = other[0]
            self.outcome = ResumeOutcome.DIFFERENT
            self.add(FIELDS_DIFFER, other[1])
        exact = precision.exact
        if not verdict:
            verdict = "bit-identical" if exact else f"equal at {precision.digits} digits"
            self.outcome = ResumeOutcome.IDENTICAL if exact else ResumeOutcome.EQUAL_AS_PRINTED
        if not self.pairs and not verdict.startswith(
            ("crashed", "hung", "refused", NOT_JUDGED, "diverged")
        ):
            reached = last_step_trained(segs[:k])
            ended = seg.exit_code == 0 and not seg.killed and not seg.points
            if ended and reached is not None and reached >= (self.ref.last_step or 0):
                verdict = NOTHING_LEFT  # a stop saved the last step: the restart had nothing to do
                self.outcome = ResumeOutcome.NOTHING_LEFT
            else:
                verdict = "no steps"
                self.outcome = ResumeOutcome.NOT_COMPARED
        return verdict

    def verdict(self, verdict: str, kill_numbers: dict[int, int]) -> ResumeVerdict:
        """The resume's record in the report."""
        seg, prev, landing, replay_of = self.seg, self.prev, self.landing, self.replay_of
        return ResumeVerdict(
            index=self.k,
            killed_at_step=self.killed_at,
            kill_in_write=landing.in_write,
            from_step=self.from_step,
            first_step=seg.first_step,
            recomputed=self.recomputed,
            recomputed_steps=self.n_recomputed,
            loss=self.loss,
            bit_identical=self.outcome is ResumeOutcome.IDENTICAL,
            restarted_from_start=self.from_start,
            progress_saved=self.saved,
            latency_s=self.latency,
            outcome=f"diverged (exit {seg.exit_code})" if self.div is not None else _outcome(seg),
            verdict=verdict,
            resume_outcome=self.outcome or ResumeOutcome.NOT_COMPARED,
            resume_args=seg.resume_args,
            fields=self.fields,
            trial=_trial(prev, seg, landing, self.saved, self.from_step, self.ref.write_steps),
            kill=kill_numbers.get(prev.index) if prev is not None and replay_of is None else None,
            kill_where=landing.where if prev is not None and prev.killed else "",
            kill_evidence=tuple(landing.evidence),
            replay_of=replay_of,
            compared_with="killed process" if self.inherited is not None else "reference",
            within_tolerance=self.within_tolerance,
        )
