"""One drill from start to verdict: reference, crashed run, comparison.

    result = verify_preset("quick", "A", kills=2, seed=7)       # the built-in trainer
    result = verify_command(["python", "train.py"], kills=2, seed=7, parser=LossParser())
    result = verify_preset("quick", kills=2, seed=7, preempt="all", grace=30)  # SIGTERMs
    result.analysis.exit_code                                   # 0 pass, 1 fail, 2 input

For the built-in trainer the cadence is known from the preset, so the reference and the
crashed run start together (one core each), and every trainer process is forked from a
fork server that has imported torch once (crashdrill/processes/forkserver.py;
`fork_server=False` or CRASHDRILL_FORK_SERVER=0 for plain exec). For any other script the
reference runs first: it tells the drill how many steps there are and when the first
checkpoint appears, which is what the kill plan needs.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from crashdrill.drill.builtin import FORK_SERVER_PRELOAD, PresetTarget, ranks_preload
from crashdrill.drill.command import CommandTarget
from crashdrill.drill.compare import analyse
from crashdrill.drill.drill_end import (
    DrillLimits,
    default_deadline,
    describe_running,
    end_findings,
    restart_cap,
)
from crashdrill.drill.engine import kill_all, run_crashed, run_segment
from crashdrill.drill.final_state import compare_final_params, compare_final_params_forked
from crashdrill.drill.interrupt import DrillInterrupted, exit_code
from crashdrill.drill.plan import (
    KillPoint,
    draw_kills,
    draw_rank,
    plan_gaps,
    preempt_gaps,
    preempt_plan,
    rank_kill_point,
)
from crashdrill.drill.preempt import StopVerdict, judge_stops, stop_findings
from crashdrill.drill.record_fields import RunRecords
from crashdrill.drill.snapshot import Snapshot
from crashdrill.drill.target import Segment, Target
from crashdrill.drill.trace import LossParser, classify_precision
from crashdrill.drill.verdicts import Analysis, Evidence, FinalParams
from crashdrill.processes import forkserver
from crashdrill.trainer.exit_codes import EXIT_FAILED

REFERENCE_NICE = 5


@dataclass
class DrillResult:
    target: Target
    mode: str  # "preset" or "command"
    seed: int
    kills_requested: int
    plan: list[KillPoint]
    evidence: Evidence
    analysis: Analysis
    t0: float  # time.monotonic() at the start
    wall_s: float
    stops: list[StopVerdict] = field(default_factory=list)  # one per preemption that landed
    # When each phase ended, seconds after t0 (benchmarks/verify_speed.py --phases); the
    # segments' own times are in evidence.
    phases: dict[str, float] = field(default_factory=dict)
    # The drill's own bounds (restart cap, deadline) and whether it ran to its end
    limits: DrillLimits | None = None
    # The trial kinds the plan holds no kill of, each with why (drill/plan.py, plan_gaps).
    plan_gaps: dict[str, str] = field(default_factory=dict)


@contextmanager
def _work_dirs(work_dir: str | Path | None) -> Iterator[tuple[Path, Path]]:
    """reference/ and crashed/ under a fresh temp dir (removed after), or under
    `work_dir` (kept, for a look at the checkpoints)."""
    if work_dir is not None:
        root = Path(work_dir)
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):
            raise FileExistsError(f"--work-dir {root} is not empty: give a new or empty dir")
    else:
        root = Path(tempfile.mkdtemp(prefix="crashdrill-verify-"))
    ref, crashed = root / "reference", root / "crashed"
    ref.mkdir()
    crashed.mkdir()
    try:
        yield ref, crashed
    finally:
        kill_all()
        if work_dir is None:
            shutil.rmtree(root, ignore_errors=True)


def fork_server_wanted(flag: bool | None = None) -> bool:
    """An explicit flag wins; else CRASHDRILL_FORK_SERVER (0/off/no/false: plain exec)."""
    if flag is not None:
        return flag
    return os.environ.get("CRASHDRILL_FORK_SERVER", "1").lower() not in ("0", "off", "no", "false")


def _note(text: str) -> None:
    print(f"crashdrill verify: note: {text}", file=sys.stderr, flush=True)


def verify_preset(
    preset: str,
    label: str = "A",
    *,
    kills: int = 2,
    seed: int = 0,
    timeout: float = 600.0,
    work_dir: str | Path | None = None,
    fork_server: bool | None = None,
    preempt: str | None = None,
    grace: float = 30.0,
    max_restarts: int | None = None,
    deadline: float | None = None,
    overrides: list[str] | None = None,
) -> DrillResult:
    """The drill on the built-in trainer (`overrides`: `KEY=VALUE` settings, as `crashdrill
    run --set` takes them; ConfigError names a bad one before anything runs). Its
    processes are forked from a fork server unless `fork_server` is False (None:
    CRASHDRILL_FORK_SERVER decides, default on); a server that cannot start, or dies
    during the drill, leaves the drill to plain exec: run again from the start, so that one
    drill never mixes the two. `preempt` ("all", "mixed"): kills become SIGTERMs, each
    followed by a SIGKILL after `grace` seconds."""
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    # The server first: its imports (torch, ~1.5 s of CPU) are the longest thing before
    # the first step, so they overlap with reading the preset and drawing the plan.
    server = None
    if fork_server_wanted(fork_server) and forkserver.supported():
        try:
            preload = [*FORK_SERVER_PRELOAD, *ranks_preload(preset, label, overrides)]
            server = forkserver.ForkServer(preload)
            marks["fork server started"] = server.started - t0
        except forkserver.ForkServerError as e:
            _note(f"{e}; starting every trainer process with exec")
    try:
        # PresetError, ConfigError: no trainer ran
        target = PresetTarget(preset, label, timeout=timeout, overrides=overrides)
    except BaseException:
        if server is not None:
            server.close()  # it never started anything: killed at once, mid-import or not
        raise
    marks["preset read"] = time.monotonic() - t0
    target.fork_server = server
    limits = _limits(target, t0, kills, max_restarts, deadline, work_dir)
    if target.fork_server is not None:
        try:
            with target.fork_server:
                args = (kills, seed, work_dir, t0, limits, preempt, grace, marks)
                return _verify_preset(target, *args)
        except forkserver.ForkServerError as e:
            _note(f"{e}; running the drill again, every trainer process started with exec")
            if work_dir is not None:
                # made by the first try in an empty dir
                for sub in ("reference", "crashed", "crashed-copies"):
                    shutil.rmtree(Path(work_dir) / sub, ignore_errors=True)
        target.fork_server = None
        marks.clear()
    return _verify_preset(target, kills, seed, work_dir, t0, limits, preempt, grace, marks)


def _verify_preset(
    target: PresetTarget,
    kills: int,
    seed: int,
    work_dir: str | Path | None,
    t0: float,
    limits: DrillLimits,
    preempt: str | None = None,
    grace: float = 30.0,
    marks: dict[str, float] | None = None,
) -> DrillResult:
    timeout = target.timeout
    marks = {} if marks is None else marks

    def mark(phase: str) -> None:
        marks[phase] = time.monotonic() - t0

    rng = random.Random(seed)
    plan = target.plan(rng, kills)
    gaps = target.plan_gaps(plan, kills)
    if preempt:
        plan, gaps = preempt_gaps(plan, preempt_plan(rng, plan, preempt, grace), gaps)
    mark("plan drawn")
    with _work_dirs(work_dir) as (ref_dir, crash_dir):
        box: dict[str, Segment] = {}
        errors: list[BaseException] = []
        crashed: list[Segment] = []

        def reference() -> None:
            try:
                # The crashed run's chain of restarts is the critical path: on a busy
                # machine the reference, which is not, yields the CPU to it.
                box["ref"] = ref = run_segment(target, ref_dir, 0, None, nice=REFERENCE_NICE)
                if limits.deadline_s is None and ref.exit_code == 0:  # from its time
                    limits.deadline_s = default_deadline(ref.ended - ref.started, len(plan))
                    limits.deadline_default = True
                    target.deadline = t0 + limits.deadline_s
                if target.fork_server is None:
                    # One core is free now: load torch for the final comparison meanwhile.
                    import crashdrill.trainer.checkpoint  # noqa: F401
            except BaseException as e:  # re-raised in the main thread
                errors.append(e)

        thread = threading.Thread(target=reference, name="crashdrill-reference", daemon=True)
        thread.start()
        try:
            run_crashed(target, crash_dir, plan, max_restarts=limits.max_restarts, segments=crashed)
        except DrillInterrupted as e:  # the reference must not outlive the drill
            kill_all()
            thread.join(timeout=30)
            ref = box.get("ref")
            limits.signal = e.name
            what = f"process {len(crashed)} of the crashed run"
            limits.running = describe_running(e.running, what)
            if ref is None or ref.exit_code != 0:  # it had not finished: nothing to judge
                limits.running = describe_running(ref, "the reference run") or limits.running
                ref = None
            # What the reference left is evidence too (its checkpoints: no false finding
            # that the script never writes one).
            seen = target.snapshot(ref_dir) if ref is not None else {}
            evidence = Evidence(target, ref or _nothing(t0), seen, crashed, plan)
            return _finish(
                target, "preset", seed, kills, plan, evidence, t0, marks, limits, e, gaps=gaps
            )
        except BaseException:  # a bug: the reference must not outlive the drill
            kill_all()
            raise
        finally:
            thread.join(timeout=timeout + 30)
        if errors:
            raise errors[0]
        mark("both runs ended")
        if target.fork_server is not None and target.fork_server.ready is not None:
            marks["fork server ready"] = target.fork_server.ready - t0
        ref = box["ref"]
        final = None
        if ref.exit_code == 0 and crashed[-1].exit_code == 0 and not crashed[-1].killed:
            if target.fork_server is None:
                final = compare_final_params(ref_dir, crash_dir)
            else:  # torch is imported there already: no import here, on the critical path
                server, env = target.fork_server, dict(os.environ)
                final = compare_final_params_forked(server, ref_dir, crash_dir, env, timeout)
            mark("final weights compared")
        records = RunRecords.read(ref_dir, crash_dir)  # every field, not only the loss
        mark("records compared")
        evidence = Evidence(target, ref, target.snapshot(ref_dir), crashed, plan, final, records)
    mark("work dirs removed")
    return _finish(target, "preset", seed, kills, plan, evidence, t0, marks, limits, gaps=gaps)


def verify_command(
    argv: list[str],
    *,
    parser: LossParser,
    kills: int = 2,
    seed: int = 0,
    resume_args: list[str] | None = None,
    resume_args_always: bool = False,
    timeout: float = 600.0,
    work_dir: str | Path | None = None,
    compare_files: list[str] | None = None,
    cwd: str | None = None,
    rank: int | None = None,
    preempt: str | None = None,
    grace: float = 30.0,
    checkpoint_globs: list[str] | None = None,
    max_restarts: int | None = None,
    deadline: float | None = None,
    kill_rank: int | None = None,
    resume_world_size: int | None = None,
    tolerance: float | None = None,
) -> DrillResult:
    """The drill on any command. `deadline`: seconds for the whole drill (None: derived
    from the reference run's time, drill/drill_end.py); `max_restarts` (None:
    drill_end.restart_cap); `checkpoint_globs`: only these files are checkpoints;
    `kill_rank`: add the --kill-rank trial on that rank's process (-1: a rank drawn from
    the seed among those that printed, rank 0 aside); `resume_world_size`: every restart
    at that many ranks, judged within `tolerance` (drill/world_size.py)."""
    t0 = time.monotonic()
    target = CommandTarget(
        argv,
        parser=parser,
        resume_args=resume_args,
        resume_args_always=resume_args_always,
        timeout=timeout,
        cwd=cwd,
        rank=rank,
        checkpoint_globs=checkpoint_globs,
        resume_world_size=resume_world_size,
        tolerance=tolerance,
    )
    limits = _limits(target, t0, kills, max_restarts, deadline, work_dir)
    with _work_dirs(work_dir) as (ref_dir, crash_dir):
        ref: Segment | None = None
        plan: list[KillPoint] = []
        gaps: dict[str, str] = {}
        crashed: list[Segment] = []
        ref_snapshot: Snapshot = {}
        try:
            ref = run_segment(target, ref_dir, 0, None, observe_checkpoints=True)
            ref_snapshot = target.snapshot(ref_dir)
            if ref.exit_code == 0 and ref.points and not ref.out_of_drill_time:
                steps = [p.step for p in ref.points][:-1]  # a kill must land before the end
                # The kills are placed from the reference's writes (each the step printed
                # before its checkpoint dir changed). A kill inside a write is aimed at
                # one, neither the first (a complete checkpoint must exist to fall back
                # on) nor the last (a plain kill after it must still land, should that
                # write be torn). No write seen: no write to land a kill in, all plain.
                done = ref.write_steps if target.has_checkpoint(ref_snapshot) else []
                writes = [s for s in done[1:-1] if s in steps]
                first = done[0] if done else None
                rng = random.Random(seed)
                plan = draw_kills(rng, kills, steps, first, writes, checkpoints=done)
                gaps = plan_gaps(plan, kills, first, done, writes)
                if kill_rank is not None:  # --kill-rank: one more trial, after the plan's
                    rank = kill_rank if kill_rank >= 0 else draw_rank(rng, ref.rank_points)
                    extra = rank_kill_point(plan, steps, done, rank)
                    if extra is not None:
                        plan.append(extra)
                    else:
                        gaps["rank-kill"] = (
                            "no step line after the first checkpoint and the plan's last kill "
                            "is left for it"
                        )
                if preempt:
                    plan, gaps = preempt_gaps(plan, preempt_plan(rng, plan, preempt, grace), gaps)
                if deadline is None:  # the default, from the reference's time
                    spent = time.monotonic() - t0
                    limits.deadline_s = spent + default_deadline(ref.ended - ref.started, len(plan))
                    limits.deadline_default = True
                    target.deadline = t0 + limits.deadline_s
                run_crashed(
                    target, crash_dir, plan, max_restarts=limits.max_restarts, segments=crashed
                )
        except DrillInterrupted as e:
            kill_all()
            limits.signal = e.name
            what = f"process {len(crashed)} of the crashed run" if ref else "the reference run"
            limits.running = describe_running(e.running, what)
            evidence = Evidence(target, ref or _nothing(t0), ref_snapshot, crashed, plan)
            return _finish(
                target, "command", seed, kills, plan, evidence, t0, None, limits, e, gaps=gaps
            )
        final = None
        if compare_files and crashed and crashed[-1].exit_code == 0 and not crashed[-1].killed:
            final = compare_bytes(ref_dir, crash_dir, compare_files)
        from crashdrill.drill.checkpoint_evidence import CheckpointLook

        look = CheckpointLook(target.checkpoint_root(crash_dir))  # read only if a finding asks
        evidence = Evidence(target, ref, ref_snapshot, crashed, plan, final, checkpoint=look)
        return _finish(target, "command", seed, kills, plan, evidence, t0, None, limits, gaps=gaps)


def _limits(
    target: Target,
    t0: float,
    kills: int,
    max_restarts: int | None,
    deadline: float | None,
    work_dir: str | Path | None,
) -> DrillLimits:
    """The drill's bounds as asked (None: the defaults of drill/drill_end.py; a deadline
    left None is derived from the reference's time once it ends), the target's deadline set."""
    limits = DrillLimits(
        max_restarts if max_restarts is not None else restart_cap(kills),
        deadline,
        work_dir=None if work_dir is None else str(work_dir),
    )
    if deadline is not None:
        target.deadline = t0 + deadline
    return limits


def _nothing(t0: float) -> Segment:
    """A reference run that never ended (the drill was stopped first): no steps."""
    return Segment(0, [], None, started=t0, ended=time.monotonic())


def _finish(
    target: Target,
    mode: str,
    seed: int,
    kills: int,
    plan: list[KillPoint],
    evidence: Evidence,
    t0: float,
    marks: dict[str, float] | None,
    limits: DrillLimits,
    interrupt: DrillInterrupted | None = None,
    *,
    gaps: dict[str, str] | None = None,
) -> DrillResult:
    segs = evidence.crashed
    if evidence.reference.out_of_drill_time:  # the deadline ran out in the reference
        limits.deadline_hit = True
        limits.running = describe_running(evidence.reference, "the reference run")
        evidence.reference = _nothing(t0)
    if segs and segs[-1].chain_end == "deadline":  # before a restart, or cutting one short
        limits.deadline_hit = True
    if segs and segs[-1].out_of_drill_time:  # cut short by the deadline: not judged
        cut = segs.pop()
        limits.running = describe_running(cut, f"process {cut.index} of the crashed run")
    # A group the launcher restarted itself (--kill-rank) is a segment, not a restart
    limits.restarts = max(0, len(segs) - 1 - sum(1 for s in segs if s.group_restart_t))
    if limits.incomplete and not evidence.reference.points:  # nothing to judge against
        precision = classify_precision([])
        analysis = Analysis([], [], precision, "incomplete", EXIT_FAILED)
        stops: list[StopVerdict] = []
    else:
        analysis = analyse(evidence)
        stops = judge_stops(evidence, analysis)
        lossy = stop_findings(stops)  # a stop that lost steps fails: the script could save them
        if lossy:
            analysis.findings.extend(lossy)
    analysis.findings.extend(end_findings(evidence, limits))
    if any(f.fails for f in analysis.findings) and analysis.exit_code == 0:
        analysis.verdict, analysis.exit_code = "fail", EXIT_FAILED
    if limits.incomplete:
        analysis.verdict = "incomplete"
        analysis.exit_code = exit_code(interrupt.signum) if interrupt else EXIT_FAILED
    wall = time.monotonic() - t0
    phases = {**(marks or {}), "analysed": wall}
    return DrillResult(
        target,
        mode,
        seed,
        kills,
        plan,
        evidence,
        analysis,
        t0,
        wall,
        stops,
        phases,
        limits,
        gaps or {},
    )


def compare_bytes(ref_dir: Path, crash_dir: Path, names: list[str]) -> FinalParams:
    """Files that both runs leave in their checkpoint dir, compared byte for byte."""
    bad, missing = [], []
    for name in names:
        a, b = ref_dir / name, crash_dir / name
        if not a.is_file() or not b.is_file():
            missing.append(name)
        elif a.read_bytes() != b.read_bytes():
            bad.append(name)
    error = f"not written by both runs: {', '.join(missing)}" if missing else None
    return FinalParams(not bad and not missing, len(names), bad, error, "bytes")
