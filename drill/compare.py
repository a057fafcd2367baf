"""Resume checks and diagnosis: what the two traces say, and why they differ.

Each resume (segment k of the crashed run) is paired step by step with the uninterrupted
reference. The findings name the likely cause wherever the evidence points to one. The
comparison of the paired losses is the lab's too (`crashdrill.trainer.resume_compare`).

    an = analyse(Evidence(target, ref, ref_snapshot, crashed, plan))
    an.verdict, an.exit_code        # "pass" 0, "fail" 1, or "fail" 2 (nothing to judge)

Here: the whole run (the reference's own failures, a run that never checkpoints, kills
that never landed, the final state). One resume is judged in drill/judge.py; the
data (Evidence, Finding, ResumeVerdict, Analysis) is in drill/verdicts.py.
"""

from __future__ import annotations

from crashdrill.drill.diverged import reference_diverged_text
from crashdrill.drill.finding_codes import (
    CRASHED,
    FINAL_STATE_DIFFERS,
    HUNG,
    INCOMPLETE,
    KILL_MISSED,
    NEVER_CHECKPOINTS,
    NO_STEPS,
    NON_ATOMIC_WRITE,
    NONDETERMINISTIC,
    RANK_KILLED,
    RANK_LOST_HANG,
    REFERENCE_DIVERGED,
    TOO_FEW_DIGITS,
    WORLD_SIZE_CHANGED,
)
from crashdrill.drill.judge import check_resume
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.target import Segment, Target, last_step_trained
from crashdrill.drill.trace import classify_precision, step_spacing
from crashdrill.drill.verdicts import (
    Analysis,
    Evidence,
    Finding,
    ResumeVerdict,
    compare_losses,
    delta_text,
    pair,
    rank_pairs,
    stderr_tail,
    step_text,
)
from crashdrill.drill.world_size import why_bits_differ
from crashdrill.trainer.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from crashdrill.trainer.resume_outcome import ResumeOutcome


def analyse(ev: Evidence) -> Analysis:
    ref, segs, target = ev.reference, ev.crashed, ev.target
    every_point = [
        p
        for s in (ref, *segs)
        for p in [*s.points, *(q for r, qs in s.rank_points.items() if r for q in qs)]
    ]
    precision = classify_precision(every_point)
    findings: list[Finding] = []

    ref_div = target.diverged(ref)
    if ref.hung or (ref.crashed and ref_div is None) or not ref.points:
        findings.append(_reference_problem(ref, target))
        code = EXIT_USAGE if findings[0].code == NO_STEPS else EXIT_FAILED
        return Analysis([], findings, precision, "fail", code)
    # A reference that diverged is compared with only where a resume reached its end.
    judged = 0
    if ref_div is not None:
        judged = sum(1 for s in segs[1:] if s.points and s.points[0].step <= ref_div.step)
        if not judged:  # a run that does not train: nothing to judge a resume against
            findings.append(Finding(REFERENCE_DIVERGED, reference_diverged_text(ref_div, 0)))
            return Analysis([], findings, precision, "fail", EXIT_USAGE)

    spacing = step_spacing(ref.points)
    seg0_pairs = pair(ref.points, segs[0].points) if segs else []
    i0 = compare_losses(seg0_pairs).divergent_offset
    if i0 is None and segs:  # a script's ranks: any rank's own trace before any kill
        for pairs in rank_pairs(ref, segs[0]).values():
            if (i0 := compare_losses(pairs).divergent_offset) is not None:
                seg0_pairs = pairs
                break
    unrepeatable = i0 is not None
    if i0 is not None:
        a, b = seg0_pairs[i0]
        findings.append(
            Finding(
                NONDETERMINISTIC,
                f"the crashed run differs from the reference at step {a.step} before any "
                f"kill (|Δ| {delta_text(a.delta(b))}): the script is not reproducible even "
                "without a crash — nondeterministic kernels, a different thread count, or an "
                "unseeded RNG",
            )
        )

    never = _never_checkpoints(ev)
    if never:
        findings.append(Finding(NEVER_CHECKPOINTS, never))
    if segs and not segs[0].killed and (segs[0].hung or segs[0].crashed):
        how = "hung" if segs[0].hung else f"exited with status {segs[0].exit_code} by itself"
        findings.append(
            Finding(
                HUNG if segs[0].hung else CRASHED,
                f"the crashed run's first process {how} before any kill. stderr tail:"
                f"{stderr_tail(segs[0])}{_hint(target, segs[0])}",
            )
        )

    for seg in segs:  # --kill-rank: what the launcher did after the rank's SIGKILL
        rk = seg.rank_kill
        if rk is not None and (rk.launcher or rk.pid is None):
            hung = rk.launcher == "hung"
            findings.append(Finding(RANK_LOST_HANG if hung else RANK_KILLED, rk.words()))
    kill_numbers = {
        seg.index: n for n, (_, seg) in enumerate(executed_kills(ev.plan, segs), 1) if seg
    }
    resumes: list[ResumeVerdict] = []
    for k in range(1, len(segs)):
        resumes.append(
            check_resume(k, ev, spacing, precision, unrepeatable, findings, resumes, kill_numbers)
        )

    world = getattr(target, "resume_world_size", None)
    if world is not None and resumes:  # why the bits cannot match, and what was compared
        worst = max((r.max_abs_delta or 0.0 for r in resumes if r.points), default=0.0)
        findings.append(
            Finding(
                WORLD_SIZE_CHANGED,
                why_bits_differ(getattr(target, "world_size", 0), world)
                + f": max |Δ| {delta_text(worst)} over the resumes, tolerance "
                f"{getattr(target, 'tolerance', 0):g}",
            )
        )
    untested = _untested_writes(ev, resumes)
    if untested is not None:
        findings.append(untested)
    if ref_div is not None:
        text = reference_diverged_text(ref_div, judged)
        findings.append(Finding(REFERENCE_DIVERGED, text, fails=False))
    last = segs[-1] if segs else None
    if last is not None and last.exit_code == 0 and not last.killed:
        end = last_step_trained(segs)
        if end is None or end < (ref.last_step or 0):
            findings.append(
                Finding(
                    INCOMPLETE,
                    f"the crashed run finished at step {end}, the reference at "
                    f"{ref.last_step}: the resumed run did not train to the end",
                )
            )
        # A kill that never landed because the process armed with it finished first (exit
        # 0 before its step): one armed in a restart that crashed is not "missed" — the
        # crash is the finding, and a re-planned kill is listed where it landed.
        missed = [
            (k, seg)
            for k, seg in executed_kills(ev.plan, segs)
            if seg is not None and not seg.killed and seg.exit_code == 0
        ]
        if missed:
            findings.append(
                Finding(
                    KILL_MISSED,
                    f"{len(missed)} planned kill(s) never landed ("
                    + ", ".join(k.describe() for k, _ in missed)
                    + "): the run finished first",
                    evidence=[
                        f"the process armed with the kill {k.describe()} exited 0 at step "
                        f"{step_text(seg.last_step)}"
                        for k, seg in missed
                    ],
                )
            )
    if not precision.exact and precision.kind != "none":
        findings.append(Finding(TOO_FEW_DIGITS, precision.describe()))
    fp = ev.final_params
    if fp is not None and (fp.error or not fp.equal):
        what = fp.error or (
            f"{len(fp.mismatched)} of {fp.items} differ ({fp.method}): "
            + ", ".join(fp.mismatched[:5])
        )
        findings.append(Finding(FINAL_STATE_DIFFERS, f"final state: {what}"))

    failed = any(f.fails for f in findings) or any(
        r.resume_outcome not in (ResumeOutcome.IDENTICAL, ResumeOutcome.NOTHING_LEFT)
        and not r.within_tolerance
        for r in resumes
    )
    exit_code = EXIT_FAILED if failed else EXIT_OK
    return Analysis(resumes, findings, precision, "fail" if failed else "pass", exit_code)


def executed_kills(
    plan: list[KillPoint], segs: list[Segment]
) -> list[tuple[KillPoint, Segment | None]]:
    """Every kill in the order the crashed run met it (recovery kills included), each
    once, with the segment it ended or was last armed in (None: the chain ended before
    that kill was tried). A kill armed in a restart that crashed and then re-planned for
    a later one is listed with the later one. Segments that carry no kill point (made by
    hand) are matched to the plan by position."""
    if not any(s.kill_point is not None for s in segs):
        return [(k, segs[i] if i < len(segs) else None) for i, k in enumerate(plan)]
    chosen: dict[int, tuple[KillPoint, Segment]] = {}
    for s in segs:
        if s.kill_point is None:
            continue
        had = chosen.get(id(s.kill_point))
        if had is None or not had[1].killed:
            chosen[id(s.kill_point)] = (s.kill_point, s)
    landed = sorted(chosen.values(), key=lambda ks: ks[1].index)
    out: list[tuple[KillPoint, Segment | None]] = [(k, s) for k, s in landed]
    return out + [(k, None) for k in plan if id(k) not in chosen]


def _untested_writes(ev: Evidence, resumes: list[ResumeVerdict]) -> Finding | None:
    """A risk the reference showed and no kill exercised: checkpoints written under their
    final names (drill/write_evidence.py), and no kill that landed inside a write."""
    seen = ev.reference.writes_in_place
    if not seen or any(r.kill_in_write for r in resumes):
        return None
    aimed = [k for k in ev.plan if k.during_write]
    if aimed:
        how = (
            f"the kill aimed inside a write ({aimed[0].describe()}) did not land inside it (a "
            "write that finished before the kill took effect): where it lands depends on "
            "timing, so rerun with another --seed, or with --kills 10 (one kill in five is "
            "aimed inside a write)"
        )
    else:
        how = (
            "no kill was aimed inside a write: rerun with --kills 2 or more (the second is "
            "the inside-write trial)"
        )
    return Finding(
        NON_ATOMIC_WRITE,
        "the reference run wrote its checkpoints under their final names, not under a temp "
        "name renamed when complete, and no kill of this drill landed inside such a write: "
        f"a kill there would leave a torn checkpoint where the restart looks. The trial that "
        f"catches it is a kill inside a checkpoint write; {how}",
        evidence=[f"in the reference run, {s}" for s in seen],
    )


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


def _hint(target: Target, seg: Segment) -> str:
    hint = target.failure_hint(seg) if seg.crashed else None
    return f"\n  likely cause: {hint}" if hint else ""


def _reference_problem(ref: Segment, target: Target) -> Finding:
    if ref.hung:
        return Finding(
            HUNG,
            f"the reference run (no kills) did not finish within {target.timeout:g} s; last "
            f"step printed: {step_text(ref.last_step)}. stderr tail:{stderr_tail(ref)}",
        )
    if ref.crashed:
        return Finding(
            CRASHED,
            f"the reference run (no kills) exited with status {ref.exit_code} by itself. "
            f"stderr tail:{stderr_tail(ref)}{_hint(target, ref)}",
        )
    seen = "; ".join(repr(s) for s in ref.other_stdout[:5]) or "nothing"
    on_stderr = next((x for x in ref.stderr_head if target.parser.shape_of(x)), None)
    hint = (
        f" Its stderr has loss lines ({on_stderr[:120]!r}): the drill reads stdout; print "
        "them there (tqdm: `tqdm(..., file=sys.stdout)`)."
        if on_stderr
        else ""
    )
    return Finding(
        NO_STEPS,
        f"no step lines found in the script's stdout ({target.parser.describe()}); its first "
        f"lines were: {seen}.{hint} Print one of those shapes or JSON lines with step and "
        "loss, or pass --loss-regex with the named groups step and loss, e.g. "
        "--loss-regex 'iter (?P<step>\\d+): loss (?P<loss>\\S+)'",
    )
