"""Resume checks and diagnosis: what the two traces say, and why they differ.

Each resume (segment k of the crashed run) is paired step by step with the uninterrupted
reference. The findings name the likely cause wherever the evidence points to one. The
comparison of the paired losses is the lab's too (`crashdrill.trainer.resume_compare`).

    an = analyse(Evidence(target, ref, ref_snapshot, crashed, plan))
    an.verdict, an.exit_code        # "pass" 0, "fail" 1, or "fail" 2 (nothing to judge)

Here: the whole run (the reference's own failures, a run that never checkpoints, kills
that never landed, the final state). One resume is judged in drill/resume_check.py; the
data (Evidence, Finding, ResumeVerdict, Analysis) is in drill/verdicts.py.
"""

from __future__ import annotations

from crashdrill.drill.divergence import reference_diverged_text
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.resume_check import check_resume
from crashdrill.drill.target import Segment, Target, last_step_trained
from crashdrill.drill.trace import classify_precision, step_spacing
from crashdrill.drill.verdicts import (
    NOTHING_LEFT,
    Analysis,
    Evidence,
    Finding,
    ResumeVerdict,
    compare_losses,
    delta_text,
    pair,
    stderr_tail,
    step_text,
)
from crashdrill.trainer.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE


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
                f"the crashed run differs from the reference at step {a.step} before any "
                f"kill (|Δ| {delta_text(a.delta(b))}): the script is not reproducible even "
                "without a crash — nondeterministic kernels, a different thread count, or an "
                "unseeded RNG",
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
                f"{stderr_tail(segs[0])}{_hint(target, segs[0])}",
            )
        )

    kill_numbers = {
        seg.index: n for n, (_, seg) in enumerate(executed_kills(ev.plan, segs), 1) if seg
    }
    resumes: list[ResumeVerdict] = []
    for k in range(1, len(segs)):
        resumes.append(
            check_resume(k, ev, spacing, precision, unrepeatable, findings, resumes, kill_numbers)
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
            "hung",
            f"the reference run (no kills) did not finish within {target.timeout:g} s; last "
            f"step printed: {step_text(ref.last_step)}. stderr tail:{stderr_tail(ref)}",
        )
    if ref.crashed:
        return Finding(
            "crashed",
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
        "no-steps",
        f"no step lines found in the script's stdout ({target.parser.describe()}); its first "
        f"lines were: {seen}.{hint} Print one of those shapes or JSON lines with step and "
        "loss, or pass --loss-regex with the named groups step and loss, e.g. "
        "--loss-regex 'iter (?P<step>\\d+): loss (?P<loss>\\S+)'",
    )
