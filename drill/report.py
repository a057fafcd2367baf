"""The drill's report: a table for people, JSON for machines (schema in docs/verify.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from crashdrill.drill.compare import executed_kills
from crashdrill.drill.plan import ASKED_ONLY, TRIAL_KINDS
from crashdrill.drill.rank_output import ranks_read
from crashdrill.drill.record_fields import fields_summary
from crashdrill.drill.target import last_step_trained
from crashdrill.drill.verdicts import NOT_JUDGED, ResumeVerdict
from crashdrill.drill.verify import DrillResult
from crashdrill.trainer.resume_compare import differing

SCHEMA = "crashdrill.verify/1"
# What the table's `compared` column counts (`points` in the JSON)
COMPARED = (
    "compared: the steps of each resumed process whose loss was paired with the reference's "
    "(by step; after a divergence, with the killed process's): the recomputed ones and every "
    "step after them, to the end or the next kill"
)


def _num(x: float | None, digits: int = 6) -> float | str | None:
    """JSON has no inf/nan: those become strings."""
    if x is None:
        return None
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    return round(x, digits) if digits else x


def kills(result: DrillResult) -> list[dict[str, Any]]:
    """Every kill in the order the crashed run met it (recovery kills included), with
    where the evidence says it landed."""
    segs = result.evidence.crashed
    by_killed = {r.kill: r for r in result.analysis.resumes if r.kill is not None}
    out = []
    for n, (kp, seg) in enumerate(executed_kills(result.plan, segs), 1):
        landed = seg is not None and seg.killed
        r = by_killed.get(n)
        out.append(
            {
                "index": n,
                "planned_step": kp.step,
                # what it tested, from the evidence (the resume after it); else the plan's
                "kind": r.trial if landed and r is not None else kp.kind,
                "planned": kp.kind,
                "recovery": kp.recovery,
                "during_write": kp.during_write,
                "preempt": kp.preempt,
                "landed": landed,
                "t": (
                    _num(seg.kill_time - result.t0, 3) if landed and seg and seg.kill_time else None
                ),
                "step": seg.last_step if landed and seg else None,
                "in_checkpoint_write": bool(landed and r is not None and r.kill_in_write),
                "where": r.kill_where if landed and r is not None else None,
                "evidence": list(r.kill_evidence) if landed and r is not None else [],
                "processes": seg.processes_killed if landed and seg else None,
                "rank": kp.rank,  # --kill-rank: the rank whose process alone was killed
                "launcher": seg.rank_kill.to_json() if seg and seg.rank_kill else None,
            }
        )
    return out


def trials(result: DrillResult) -> list[dict[str, Any]]:
    """The resumes grouped by what they tested (TRIAL_KINDS, then replays), each group
    with whether every resume in it passed, whether any was judged at all (one after a
    resume that diverged is not), and the codes of what failed."""
    an = result.analysis
    out = []
    for kind in [*TRIAL_KINDS, "restart-after-crash", "replay"]:
        rs = [r for r in an.resumes if r.trial == kind]
        if not rs:
            continue
        idx = {r.index for r in rs}
        codes = sorted({f.code for f in an.findings if f.fails and f.resume in idx})
        passed = all(_held(r) for r in rs) and not codes
        judged = not all(r.verdict.startswith(NOT_JUDGED) for r in rs)
        group = {"kind": kind, "resumes": sorted(idx), "passed": passed, "judged": judged}
        out.append({**group, "codes": codes})
    return out


def unexercised(result: DrillResult) -> list[dict[str, str]]:
    """The trial kinds that no resume of this drill tested, each with why: the plan had
    no room for it (`plan_gaps`), or the kill planned as one tested another kind or
    never landed."""
    if not result.analysis.resumes:
        return []  # no kill landed (the reference failed, the run ended first): findings say
    tested = {r.trial for r in result.analysis.resumes}
    asked = {p.kind for p in result.plan}
    kinds = [k for k in TRIAL_KINDS if k not in ASKED_ONLY or k in asked]
    out = []
    for kind in kinds:
        if kind in tested:
            continue
        why = result.plan_gaps.get(kind)
        if why is None:
            went = [
                f"kill {k['index']} (planned at step {k['planned_step']}) "
                + (f"tested {_KIND_TEXT.get(k['kind'], k['kind'])}" if k["landed"] else "")
                + (f": {k['where']}" if k["landed"] and k["where"] else "")
                + ("" if k["landed"] else "never landed: the run finished first")
                for k in kills(result)
                if k["planned"] == kind
            ]
            why = "; ".join(went) or "no kill of this kind landed"
        if kind == "after-checkpoint":
            why += _plain_resume_seen(result.analysis.resumes)
        out.append({"kind": kind, "reason": why})
    return out


def _plain_resume_seen(resumes: list[ResumeVerdict]) -> str:
    """What a resume after a kill inside a write showed of a plain resume: it loaded the
    complete checkpoint before the write and recomputed steps from it."""
    for r in resumes:
        if r.trial == "inside-write" and r.from_step and r.recomputed and _held(r):
            return (
                f" (the restart after the kill inside a write, resume {r.index}, resumed from "
                f"the complete checkpoint at step {r.from_step} and recomputed "
                f"{r.recomputed_steps} steps exactly, as a plain resume does)"
            )
    return ""


def _resume(r: ResumeVerdict) -> dict[str, Any]:
    return {
        "index": r.index,
        "trial": r.trial,
        "kill": r.kill,
        "replay_of": r.replay_of,
        "compared_with": r.compared_with,
        "killed_at_step": r.killed_at_step,
        "kill_in_checkpoint_write": r.kill_in_write,
        "from_step": r.from_step,
        "first_step": r.first_step,
        "recomputed": (
            {"first": r.recomputed[0], "last": r.recomputed[1], "steps": r.recomputed_steps}
            if r.recomputed
            else None
        ),
        "points": r.points,
        "max_abs_delta": _num(r.max_abs_delta, 0),
        "mean_abs_delta": _num(r.mean_abs_delta, 0),
        "first_divergent_step": r.first_divergent_step,
        "first_divergent_rank": (
            {"rank": rank.rank, "step": rank.step, "ranks": rank.ranks}
            if (rank := r.first_divergent_rank)
            else None
        ),
        "bit_identical": r.bit_identical,
        "within_tolerance": r.within_tolerance,
        "restarted_from_start": r.restarted_from_start,
        "checkpoint_existed": r.progress_saved,
        "latency_s": _num(r.latency_s, 3),
        "outcome": r.outcome,
        "verdict": r.verdict,
        "resume_outcome": r.resume_outcome.value,
        "resume_args": r.resume_args,
        "differing": differing(r.fields),
        "fields": [f.to_json() for f in r.fields],
    }


def to_json(result: DrillResult) -> dict[str, Any]:
    ev, an = result.evidence, result.analysis
    ref, segs = ev.reference, ev.crashed
    fp = ev.final_params
    return {
        "schema": SCHEMA,
        "mode": result.mode,
        "target": result.target.describe(),
        "seed": result.seed,
        "kills_requested": result.kills_requested,
        "kills": kills(result),
        "trials": trials(result),
        "unexercised": unexercised(result),
        "resumes": [_resume(r) for r in an.resumes],
        "stops": [s.to_json() for s in result.stops],  # --preempt: one per SIGTERM that landed
        "reference": {
            "points": len(ref.points),
            "first_step": ref.first_step,
            "last_step": ref.last_step,
            "exit_code": ref.exit_code,
            "seconds": _num(ref.ended - ref.started, 3),
            "cpu_seconds": _num(ref.cpu_s, 3),
        },
        "crashed": {
            "segments": len(segs),
            "exit_code": segs[-1].exit_code if segs else None,
            "last_step": last_step_trained(segs),
            "seconds": _num(segs[-1].ended - segs[0].started, 3) if segs else None,
            "cpu_seconds": _num(sum(s.cpu_s or 0.0 for s in segs), 3) if segs else None,
        },
        "ranks": ranks_read(result.target.rank, sorted(ref.rank_points)),
        "precision": {
            "kind": an.precision.kind,
            "digits": an.precision.digits,
            "exact": an.precision.exact,
            "text": an.precision.describe(),
        },
        "final_state": (
            {
                "method": fp.method,
                "items": fp.items,
                "equal": fp.equal,
                "mismatched": fp.mismatched,
                "error": fp.error,
            }
            if fp
            else None
        ),
        "verdict": an.verdict,
        "exit_code": an.exit_code,
        "diagnosis": [
            {
                "code": f.code,
                "fails": f.fails,
                "resume": f.resume,
                "text": f.text,
                "evidence": list(f.evidence),
            }
            for f in an.findings
        ],
        "wall_seconds": _num(result.wall_s, 3),
        "drill": result.limits.to_json() if result.limits else None,
        "checkpoint_files": result.target.files.to_json() if result.target.files else None,
    }


def write_json(result: DrillResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(result), indent=2) + "\n", encoding="utf-8")


def _delta(x: float | None) -> str:
    if x is None:
        return "—"
    return "0" if x == 0 else f"{x:.3g}"


def table(result: DrillResult) -> str:
    ev, an = result.evidence, result.analysis
    ref = ev.reference
    what = result.target.describe()
    if result.mode == "preset":
        title = f"preset {what.get('preset')}, run {what.get('run')}"
        settings = what.get("set")
        if isinstance(settings, list) and settings:
            title += ", set " + " ".join(map(str, settings))
    else:
        command = what.get("command")
        title = " ".join(map(str, command)) if isinstance(command, list) else "a command"
    lines = [f"crashdrill verify · {title} · seed {result.seed} · {result.kills_requested} kills"]
    steps = (
        f"{len(ref.points)} steps ({ref.first_step}–{ref.last_step})"
        if ref.points
        else "no step seen"
    )
    ended = f"exit {ref.exit_code}" if ref.exit_code is not None else "did not finish"
    lines.append(f"  reference   {steps} in {ref.ended - ref.started:.1f} s, {ended}")
    for k in kills(result):
        where = (
            f"inside a checkpoint write after step {k['step']}"
            if k["in_checkpoint_write"]
            else f"at step {k['step']}"
        )
        if k["during_write"] and k["where"] and not k["in_checkpoint_write"]:
            where += f" ({k['where']})"  # aimed at a write, landed after it
        if k["recovery"]:
            where += " (added: a plain kill after the write, from the copy before it)"
        if k["preempt"]:
            where = f"a SIGTERM, the process ended at step {k['step']}"
        if k["landed"]:
            took = f", {k['processes']} processes" if (k["processes"] or 1) > 1 else ""
            after = [r for r in an.resumes if r.kill == k["index"]]  # its resume, if any
            tested = f": {_group_text(k['kind'], after)}" if k["kind"] in TRIAL_KINDS else ""
            lines.append(f"  kill {k['index']:<6} {where} (t {k['t']:.2f} s{took}){tested}")
        else:
            lines.append(f"  kill {k['index']:<6} planned {k['planned_step']}: never landed")
    if an.resumes:
        lines.append("")
        head = (
            f"  {'resume':>6}  {'killed at':>9}  {'from':>5}  {'recomputed':<16}  {'compared':>8}  "
            f"{'max|Δ|':>8}  {'mean|Δ|':>8}  {'first div':>9}  {'latency':>7}  verdict"
        )
        lines.append(head)
        for r in an.resumes:
            rec = "—"
            if r.recomputed:
                rec = f"{r.recomputed[0]}–{r.recomputed[1]} ({r.recomputed_steps})"
            lat = f"{r.latency_s:.2f} s" if r.latency_s is not None else "—"
            div = str(r.first_divergent_step) if r.first_divergent_step is not None else "—"
            lines.append(
                f"  {r.index:>6}  {_opt(r.killed_at_step):>9}  {_opt(r.from_step):>5}  "
                f"{rec:<16}  {r.points:>8}  {_delta(r.max_abs_delta):>8}  "
                f"{_delta(r.mean_abs_delta):>8}  {div:>9}  {lat:>7}  {r.verdict}"
            )
        lines.append(f"  {COMPARED}")
    for r in an.resumes:
        if r.replay_of is not None:
            at = ev.crashed[r.replay_of].copy_step
            found = (
                f"as it was at step {at} of resume {r.replay_of}, before the write the kill "
                "landed in,"
                if at is not None
                else f"as resume {r.replay_of} found it"
            )
            lines.append(
                f"  resume {r.index}: the restart after a damaging kill failed, so the "
                f"checkpoint dir was put back {found} and the run started again from there "
                "(the kills after it land on undamaged state)"
            )
    groups = trials(result)
    if groups:
        lines.append(
            "  trials: "
            + "; ".join(
                f"{_group_text(g['kind'], [r for r in an.resumes if r.index in g['resumes']])}"
                ": resume(s) "
                f"{', '.join(map(str, g['resumes']))} " + _trial_verdict(g)
                for g in groups
            )
        )
    for gap in unexercised(result):
        lines.append(f"  not exercised: {_KIND_TEXT[gap['kind']]}: {gap['reason']}")
    for stop in result.stops:
        lines.append(f"  {stop.text}")
    for r in an.resumes:
        if len(r.fields) > 1:  # the run records were compared, not only the printed loss
            lines.append(f"  resume {r.index} records: {fields_summary(r.fields)}")
        if (rank := r.first_divergent_rank) is not None:
            lines.append(f"  resume {r.index} ranks: {rank.words()}")
    given = [r.index for r in an.resumes if r.resume_args]
    if any(r.resume_args is not None for r in an.resumes):
        without = [str(r.index) for r in an.resumes if r.resume_args is False]
        lines.append(
            f"  resume args: given to restart(s) {', '.join(map(str, given)) or 'none'}"
            + (f"; not to {', '.join(without)} (checkpoint dir still empty)" if without else "")
        )
    lines.append("")
    if what.get("loss_lines"):  # the shape (or regex) the reference's lines matched
        lines.append(f"  loss lines: {what['loss_lines_text']}")
    lines.append(f"  losses: {an.precision.describe()}")
    if result.mode == "command" and (ref.rank_points or result.target.rank is not None):
        ranks = ranks_read(result.target.rank, sorted(ref.rank_points))["text"]
        if (world := what.get("resume_world_size")) is not None:
            ranks = f"the reduced loss compared (the restarts ran at {world} rank(s))"
        lines.append(f"  ranks: {ranks}")
    fp = ev.final_params
    if fp is not None:
        state = "equal" if fp.equal else "DIFFER"
        lines.append(f"  final state: {fp.items} item(s) compared with {fp.method}: {state}")
    for f in an.findings:
        mark = "✗" if f.fails else "!"
        lines.append(f"  {mark} [{f.code}] {f.text}")
        lines.extend(f"      evidence: {e}" for e in f.evidence)
    lines.extend(_drill_lines(result))
    if an.verdict == "pass":
        summary = "PASS: every resume is bit-identical"
        if not an.resumes:
            summary = "PASS: the run reproduced bit for bit (no kill landed)"
    elif an.verdict == "incomplete" and result.limits is not None:
        stopped = result.limits.signal or "the deadline"
        summary = f"INCOMPLETE: stopped by {stopped}, the report holds what was seen until then"
    else:
        summary = "FAIL" if an.exit_code == 1 else "ERROR"
    lines.append(f"  seed: {_replays(result)}")
    lines.append(f"{summary} · wall {result.wall_s:.1f} s · replay with --seed {result.seed}")
    return "\n".join(lines)


_CHAIN_END = {
    "no-progress": "it crashed with no checkpoint advanced since it started, so a restart "
    "would fail the same way",
    "same-failure": "it failed the same way as the restart before it, getting no further",
    "deadline": "the drill's deadline ran out",
}
LISTED = 6  # files named per list in the table (the JSON has them all)


def _drill_lines(result: DrillResult) -> list[str]:
    """The drill's own bounds and which files it took as checkpoints."""
    out = []
    lim = result.limits
    if lim is not None:
        deadline = "none"
        if lim.deadline_s is not None:
            deadline = f"{lim.deadline_s:.0f} s" + (
                " (default, from the reference run's time)" if lim.deadline_default else ""
            )
        out.append(
            f"  drill: {lim.restarts} restart(s) of at most {lim.max_restarts}; deadline {deadline}"
        )
        segs = result.evidence.crashed
        if lim.chain_end and segs:
            why = _CHAIN_END.get(lim.chain_end, "the restart cap was reached")
            out.append(f"  drill: no restart after process {segs[-1].index}: {why}")
    files = result.target.files
    if files is not None:
        taken = sorted(files.taken)
        ignored = sorted(files.ignored)
        out.append(
            f"  checkpoint files: took {len(taken)}"
            + (f" ({_names(taken)})" if taken else "")
            + (f"; ignored {len(ignored)} ({_names(ignored, files.ignored)})" if ignored else "")
            + (f"; {len(files.temps)} temp file(s) of writes seen" if files.temps else "")
            + (f"; only --checkpoint-glob {' '.join(files.globs)}" if files.globs else "")
        )
    return out


def _names(paths: list[str], why: dict[str, str] | None = None) -> str:
    """The first few names; with `why`, grouped by it: `why: a, b (+3 more)`."""
    if why is None:
        more = f", … {len(paths) - LISTED} more" if len(paths) > LISTED else ""
        return ", ".join(paths[:LISTED]) + more
    groups: dict[str, list[str]] = {}
    for p in paths:
        groups.setdefault(why[p], []).append(p)
    return "; ".join(
        f"{reason}: {', '.join(names[:2])}"
        + (f" (+{len(names) - 2} more)" if len(names) > 2 else "")
        for reason, names in groups.items()
    )


def _replays(result: DrillResult) -> str:
    """What `--seed` replays of this drill and what depends on timing (docs/verify.md,
    "What a seed replays")."""
    seed = result.seed
    if result.mode == "preset":
        return (
            f"--seed {seed} replays this plan exactly, the write kill too (the trainer holds "
            "the write open for it); a plain kill lands at its step or a little later"
        )
    return (
        f"--seed {seed} replays this plan (which kills, armed at which steps); where a kill "
        "lands in a write depends on timing: the same seed can land inside the write or "
        "just after it (then it is judged like a plain kill), and a plain kill at its step "
        "or a little later"
    )


def _trial_verdict(g: dict[str, Any]) -> str:
    if g["passed"]:
        return "passed"
    if not g["judged"]:  # nothing to compare: the run had left the reference before them
        return "not judged (an earlier resume had diverged)"
    return f"FAILED ({', '.join(g['codes']) or 'differ'})"


def _held(r: ResumeVerdict) -> bool:
    """The resume matched (to the precision printed: too few digits is a finding about
    the whole run, not about one trial) or had nothing left to train."""
    return r.held


_KIND_TEXT: dict[str, str] = {
    **TRIAL_KINDS,
    "restart-after-crash": "a restart after a crash that had saved",
    "replay": "a start again from a copy of the state",
}


def _group_text(kind: str, resumes: list[ResumeVerdict]) -> str:
    """A trial kind as the table names it, saying what the restarts resumed from where
    the kind alone would leave it open (a kill before the first checkpoint after the
    start, resumed from the step-0 checkpoint)."""
    text = _KIND_TEXT.get(kind, kind)
    froms = {r.from_step for r in resumes}
    if kind == "before-first-checkpoint" and froms == {0}:
        text += " (it resumes from the step-0 checkpoint)"
    elif kind == "before-first-checkpoint" and froms == {None} and resumes[0].first_step:
        text += f" (it starts again at step {resumes[0].first_step}: nothing to resume from)"
    return text


def _opt(x: int | None) -> str:
    return "—" if x is None else str(x)
