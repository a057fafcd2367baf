"""Processes, kills and restarts: the mechanics of the drill, for any training command.

A run is a chain of segments. Segment 0 is the first process; each SIGKILL from the plan
ends a segment and the next one is the same command started again (with the target's
resume arguments). A kill takes down the process and every descendant, whatever session
or process group each made for itself (crashdrill/processes/process_tree.py), and every
process is bounded by the target's timeout. A preemption (KillPoint.preempt) sends SIGTERM to the
process group instead and follows the process through its grace: it ends the segment when
the process exits, or SIGKILLs the tree when the grace runs out.

    seg = run_segment(target, ckpt_dir, 0, None)      # one process, to its end
    segments = run_crashed(target, ckpt_dir, plan)    # the crashed run, kill by kill

What a target is and what a segment records: drill/target.py.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import selectors
import shutil
import signal
import time
from collections import deque
from pathlib import Path

from crashdrill.drill.drill_end import restart_cap, same_failure
from crashdrill.drill.interrupt import DrillInterrupted
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.rank_kill import PEER_UNREACHABLE, RankKill, kill_rank
from crashdrill.drill.rank_kill import POLL_SECONDS as POLL_SECONDS_RANK
from crashdrill.drill.rank_output import line_of_rank, split_rank
from crashdrill.drill.snapshot import Snapshot, appeared_incomplete, modified_in_place
from crashdrill.drill.target import Child, Segment, Target
from crashdrill.drill.trace import LineReader
from crashdrill.drill.write_evidence import POLL_SECONDS, WriteObserver
from crashdrill.processes.process_tree import kill_tree, tree_marker
from crashdrill.trainer.checkpoint_pause import ENV as PAUSE_ENV

STDERR_TAIL_LINES = 40
STDERR_HEAD_LINES = 20
DRAIN_SECONDS = 3.0  # after a kill, how long to wait for the pipes to close

_LIVE: dict[Child, str] = {}  # started and not yet reaped → the marker of its tree
_MARKERS = itertools.count(1)


def _kill_tree(proc: Child) -> int:
    """SIGKILL the process and everything it started, whatever session or process group
    they made (torchrun's ranks make their own): how many processes that took down."""
    return kill_tree(proc.pid, marker=_LIVE.get(proc))


def kill_all() -> None:
    """Kill every process tree this module started and has not reaped (on Ctrl-C, or
    when the drill stops early)."""
    for proc in list(_LIVE):
        _kill_tree(proc)


def run_segment(
    target: Target,
    ckpt_dir: Path,
    index: int,
    kill: KillPoint | None,
    *,
    observe_checkpoints: bool = False,
    nice: int = 0,
    copy_to: Path | None = None,
) -> Segment:
    """Start the target once and follow it until it exits, is killed by the plan, or
    runs out of time. `nice` lowers its CPU priority (for a process off the critical
    path); its children inherit it. `copy_to`, with a kill inside a write: copy the
    checkpoint dir there as that write will find it (`Segment.state_copy`)."""
    resume_args = target.gets_resume_args(ckpt_dir, restart=index > 0)
    argv = target.command(ckpt_dir, restart=index > 0)
    marker = f"{os.getpid()}-{next(_MARKERS)}"
    env = {**os.environ, **target.environ(ckpt_dir, kill), **tree_marker(marker)}
    if kill is None or not kill.during_write:
        env.pop(PAUSE_ENV, None)
    seg = Segment(index, argv, kill, started=time.monotonic(), resume_args=resume_args)
    try:
        proc = target.start(argv, env, target.cwd)
    except DrillInterrupted as e:  # while it was starting (a fork server still importing)
        seg.ended = time.monotonic()
        e.running = seg
        raise
    _LIVE[proc] = marker
    if nice:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
    try:
        _follow(proc, seg, target, ckpt_dir, kill, observe_checkpoints, copy_to)
    except DrillInterrupted as e:
        seg.ended = time.monotonic()
        e.running = seg  # what the drill saw of it, for the report
        raise
    finally:
        _kill_tree(proc)  # when it has exited: whatever it left running in the background
        proc.wait()
        _LIVE.pop(proc, None)
    if seg.rank_kill is not None and seg.rank_kill.pid is not None:
        # The rank's SIGKILL ends the segment whatever the launcher did after it: exited
        # (the drill restarts it), restarted the group (its lines are split off as the
        # resume: split_restarted_group) or hung until the timeout (stopped there).
        rk = seg.rank_kill
        rk.ended(seg.exit_code, seg.ended, hung=seg.hung)
        # A restarted group's own end (its exit, a hang) goes with its lines when they are
        # split off; otherwise the launcher's exit or hang after the kill is the kill's.
        if seg.group_restart_t is None and not seg.out_of_drill_time:
            seg.killed, seg.hung, seg.kill_time = True, False, rk.t
        if seg.snapshot_after_kill is None:
            seg.snapshot_after_kill = target.snapshot(ckpt_dir)
        return seg
    if seg.term_time is not None:
        seg.killed = True  # a preemption ends the segment whichever way the process went
        seg.kill_time = seg.kill_time or seg.ended
    elif seg.killed and seg.exit_code is not None and seg.exit_code >= 0:
        # It exited on its own before the SIGKILL reached it (the kill came too late on a
        # busy machine): no crash happened, so there is nothing to resume from it.
        seg.killed = False
    if seg.killed:
        seg.snapshot_after_kill = target.snapshot(ckpt_dir)
    return seg


def _follow(
    proc: Child,
    seg: Segment,
    target: Target,
    ckpt_dir: Path,
    kill: KillPoint | None,
    observe_checkpoints: bool,
    copy_to: Path | None = None,
) -> None:
    watch = target.write_watch(ckpt_dir, kill) if kill and kill.during_write else None
    reader = target.parser.for_process()  # a counted loss-line shape counts per process
    rank_readers: dict[int, LineReader] = {}  # every rank's lines: each rank counts its own
    tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
    deadline = seg.started + target.timeout
    drill_deadline = target.deadline  # the whole drill's: it ends the drill, not a hang
    if drill_deadline is not None and drill_deadline < deadline:
        deadline = drill_deadline
    bufs = {"out": b"", "err": b""}
    seen: dict[str, Snapshot] = {}  # observe_checkpoints: the dir at the last change
    changed_at: list[int] = []  # observe_checkpoints: how many lines were read at each change
    two_lines = {"last write": False}  # observe_checkpoints: the last write showed at two
    # observe_checkpoints: how the writes look while they happen (in place or renamed)
    writes = WriteObserver(target.checkpoint_root(ckpt_dir)) if observe_checkpoints else None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")

    def do_kill(in_write: bool) -> None:
        before = watch.snapshot_before() if watch else None
        seg.snapshot_before_kill = before if before is not None else target.snapshot(ckpt_dir)
        if kill is not None and kill.rank is not None and not in_write:
            # --kill-rank: that rank's process alone; the launcher's reaction is watched
            pid = kill_rank(proc.pid, kill.rank)
            seg.rank_kill = RankKill(kill.rank, pid, seg.last_step, time.monotonic())
            if pid is not None:
                seg.processes_killed = 1
                return
        seg.processes_killed = _kill_tree(proc)
        seg.kill_time = time.monotonic()
        seg.killed = True
        seg.in_write = in_write

    def do_term(now: float) -> None:
        """A preemption: SIGTERM to its process group; the SIGKILL waits for the grace."""
        seg.snapshot_before_kill = target.snapshot(ckpt_dir)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        seg.term_time = now

    def on_line(name: str, raw: bytes, now: float) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if name == "err":
            tail.append(line)
            seg.stderr_lines += 1
            if len(seg.stderr_head) < STDERR_HEAD_LINES:
                seg.stderr_head.append(line)
            if len(seg.peer_errors) < 4 and any(p in line for p in PEER_UNREACHABLE):
                seg.peer_errors.append(line)
            if watch and not seg.killed and watch.on_stderr(line):
                do_kill(True)
            return
        if target.rank is not None:  # --rank R: that rank's lines only
            ranked = line_of_rank(line, target.rank)
            if ranked is None:
                return  # another rank's line
            point = reader.parse(ranked, now)
        else:  # every rank's: rank 0's (and lines that say no rank) are the run's trace
            rank, ranked = split_rank(line)
            if rank:
                own = rank_readers.setdefault(rank, target.parser.for_process())
                if (rp := own.parse(ranked, now)) is not None:
                    seg.rank_points.setdefault(rank, []).append(rp)
                return
            point = reader.parse(ranked, now)
            if rank == 0 and point is not None:
                seg.rank_points.setdefault(0, []).append(point)
        if point is None:
            if len(seg.other_stdout) < 5 and line.strip():
                seg.other_stdout.append(line[:200])
            return
        seg.points.append(point)  # lines read after the kill were printed before it
        if len(seg.points) == 1:
            seg.snapshot_first_step = seen["dir"] = target.snapshot(ckpt_dir)
        elif observe_checkpoints:
            snap = target.snapshot(ckpt_dir)
            if snap != seen["dir"]:  # a write came after the previous step line
                # One write can show at two lines in a row: begun when one line was read
                # (a script that writes right after printing), finished at the next one.
                # Two, not more: a script that writes at every step has a write per line.
                adjacent = bool(changed_at) and changed_at[-1] == len(seg.points) - 1
                if adjacent and not two_lines["last write"]:
                    seg.write_steps[-1] = seg.points[-2].step
                    two_lines["last write"] = True
                else:
                    seg.write_steps.append(seg.points[-2].step)
                    two_lines["last write"] = False
                changed_at.append(len(seg.points))
                if seg.first_ckpt_step is None:  # where the first change showed
                    seg.first_ckpt_step = seg.points[-2].step
                seen["dir"] = snap
        if kill is None or seg.killed or seg.term_time is not None or seg.rank_kill:
            return
        if watch:
            watch.on_step(point.step)
            if copy_to is not None and watch.shows_state_before(point.step):
                _copy_before_write(target, ckpt_dir, copy_to, seg, point.step)
        elif point.step >= kill.step:
            if kill.preempt:
                do_term(now)
            else:
                do_kill(False)

    stopped: float | None = None  # when we killed it (plan or timeout)
    while sel.get_map():
        now = time.monotonic()
        if stopped is None and seg.killed:
            stopped = now
        if stopped is not None and now > stopped + DRAIN_SECONDS:
            break  # something outside the group holds the pipes open
        if stopped is None and now > deadline:
            _kill_tree(proc)
            seg.hung = True
            seg.out_of_drill_time = drill_deadline is not None and now > drill_deadline
            stopped = now
        if seg.term_time is not None and not seg.killed and kill is not None:
            left = seg.term_time + kill.grace_s - now
            if left <= 0:  # the grace ran out: the platform's SIGKILL
                at_term = seg.snapshot_before_kill
                do_kill(False)
                seg.snapshot_before_kill = at_term  # the stop is judged from its SIGTERM
                seg.grace_expired = True
        interval = watch.interval if watch and stopped is None else 0.05
        if seg.rank_kill is not None and not seg.rank_kill.launcher:
            interval = min(interval, POLL_SECONDS_RANK)
        if writes is not None:
            writes.poll(now)
            interval = min(interval, POLL_SECONDS)
        if stopped is None:
            interval = min(interval, max(0.001, deadline - now))
        if seg.term_time is not None and not seg.killed and kill is not None:
            interval = min(interval, max(0.001, seg.term_time + kill.grace_s - now))
        for key, _ in sel.select(timeout=interval):
            name = str(key.data)
            chunk = os.read(key.fd, 1 << 16)
            now = time.monotonic()
            if not chunk:
                sel.unregister(key.fileobj)
                if bufs[name] and stopped is None and not seg.killed:
                    on_line(name, bufs[name], now)  # a last line without its newline
                bufs[name] = b""
                continue
            data = bufs[name] + chunk
            if name == "out":  # a progress bar (tqdm) redraws its line with "\r"
                data = data.replace(b"\r", b"\n")
            *lines, bufs[name] = data.split(b"\n")
            for raw in lines:
                on_line(name, raw, now)
        if watch and not seg.killed and watch.poll():
            do_kill(True)
        rk = seg.rank_kill
        if rk is not None and stopped is None and rk.poll(proc.pid, time.monotonic()):
            seg.group_restart_t = time.monotonic()  # the old group is down: the dir as left
            seg.snapshot_after_kill = target.snapshot(ckpt_dir)
    sel.close()
    if not _reap(proc, seg, max(deadline, time.monotonic() + 0.1)):
        _kill_tree(proc)  # closed its pipes but kept running
        seg.hung = True
        _reap(proc, seg, math.inf)
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    seg.ended = time.monotonic()
    seg.stderr_tail = list(tail)
    if writes is not None:
        seg.writes_in_place = writes.sentences()


def split_restarted_group(seg: Segment) -> Segment | None:
    """A launcher that restarted the group after a rank's SIGKILL (torchrun
    --max-restarts): the restarted group's lines, from `group_restart_t` on, become a
    segment of their own, the resume of `seg`, which ends at the restart. None when the
    launcher did not restart the group."""
    t = seg.group_restart_t
    if t is None or seg.rank_kill is None:
        return None
    after = Segment(seg.index + 1, seg.argv, None, started=t, resume_args=seg.resume_args)
    after.launcher_restart = True
    after.points = [p for p in seg.points if p.t >= t]
    seg.points = [p for p in seg.points if p.t < t]
    for r, pts in seg.rank_points.items():
        after.rank_points[r] = [p for p in pts if p.t >= t]
        seg.rank_points[r] = [p for p in pts if p.t < t]
    after.ended, after.exit_code, after.cpu_s = seg.ended, seg.exit_code, seg.cpu_s
    after.hung, after.out_of_drill_time = seg.hung, seg.out_of_drill_time
    after.stderr_tail, after.stderr_lines = seg.stderr_tail, seg.stderr_lines
    after.peer_errors = seg.peer_errors  # read from the one process: the restarted group's
    after.snapshot_start = after.snapshot_first_step = seg.snapshot_after_kill
    seg.ended, seg.exit_code, seg.hung, seg.out_of_drill_time = t, None, False, False
    seg.killed, seg.kill_time = True, seg.rank_kill.t
    if after.points:
        seg.rank_kill.first_step_s = after.points[0].t - seg.rank_kill.t
    return after


def _reap(proc: Child, seg: Segment, deadline: float) -> bool:
    """Wait for the process until `deadline`, keeping its exit status and CPU time. False
    when it is still running."""
    while True:
        code = proc.poll()
        if code is not None:
            seg.exit_code = code
            seg.cpu_s = proc.cpu_s
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)


def run_crashed(
    target: Target,
    ckpt_dir: Path,
    plan: list[KillPoint],
    copies: Path | None = None,
    *,
    max_restarts: int | None = None,
    segments: list[Segment] | None = None,
) -> list[Segment]:
    """The crashed run: one segment per kill in the plan, then one to the end. The
    segments go into `segments` as they end (the caller's list: an interrupt keeps them).

    A restart that crashes by itself ends the chain, unless a checkpoint advanced before
    it crashed (drill/checkpoint_files.py: a log beside the checkpoints is no progress):
    then the next restart starts from new state and the kills left in the plan still tell
    something, so the drill goes on with them (the crashed one's kill never landed). One
    that crashed without a checkpoint advancing would crash again; so would one that fails
    the same way as the restart before it without getting further. The chain also ends
    after `max_restarts` restarts (default restart_cap) and at the target's deadline. Why
    it ended is the last segment's `chain_end` (None: the run finished or a kill ended it).

    Trials stay independent: before a kill that may damage the checkpoint dir the dir is
    copied (under `copies`, default beside `ckpt_dir`): for a kill inside a write, at the
    step line before that write (where its write watch says the dir stands as the write
    will find it: the last write before it complete, so the copy holds it), for a
    preemption as the segment starts. When the restart after that kill fails (crashes,
    hangs), the damage would hide every trial after it: the copy is put back, the run is
    started again from it (it resumes from the write before the torn one and recomputes
    only the steps since), and a plain kill lands at the first step line after that write
    (a complete checkpoint), so a plain resume is judged too; the kills left in the plan
    follow. Once per damaging kill; a passing drill never pays more than the copies."""
    copies = copies if copies is not None else ckpt_dir.with_name(ckpt_dir.name + "-copies")
    segments = segments if segments is not None else []
    cap = max_restarts if max_restarts is not None else restart_cap(len(plan))
    left = list(plan)
    restore: Segment | None = None  # the segment whose start state comes back
    while True:
        i = len(segments)
        if i > cap:
            segments[-1].chain_end = f"restart-cap {cap}"
            break
        if i and target.deadline is not None and time.monotonic() >= target.deadline:
            segments[-1].chain_end = "deadline"
            break
        kill = left.pop(0) if left else None
        copy, copy_to = None, None
        if restore is not None:
            assert restore.state_copy is not None
            put_back(target, ckpt_dir, restore.state_copy)
            copy = restore.state_copy
        elif kill is not None and kill.preempt:
            copy = copy_state(target, ckpt_dir, copies / f"before-segment-{i}")
        elif kill is not None and kill.during_write:
            copy_to = copies / f"before-segment-{i}"  # taken at the step line before the write
        before = target.snapshot(ckpt_dir)
        seg = run_segment(target, ckpt_dir, i, kill, copy_to=copy_to)
        if copy is not None:
            seg.state_copy = copy
        seg.snapshot_start = before
        if restore is not None:
            seg.restored_from = restore.index
            restore = None
        segments.append(seg)
        restarted = split_restarted_group(seg)
        if restarted is not None:  # the launcher's own restart is the resume of the rank kill
            segments.append(restarted)
            seg, i = restarted, restarted.index
        if seg.killed:
            continue
        prev = segments[-2] if len(segments) >= 2 else None
        damaged = (
            (seg.crashed or seg.hung)
            and not target.refused(seg)  # it said why: a replay would say it again
            and prev is not None
            and prev.killed
            and prev.state_copy is not None
            and prev.kill_point is not None
            and not prev.kill_point.recovery
            and (prev.kill_point.during_write or prev.kill_point.preempt or prev.in_write)
            # Damaged: a file rewritten in place or one left under its final name. An
            # atomic writer's temp file damages nothing: its restart failed by itself.
            and bool(
                modified_in_place(prev.snapshot_before_kill, prev.snapshot_after_kill)
                or appeared_incomplete(prev.snapshot_before_kill, prev.snapshot_after_kill)
            )
        )
        if damaged and prev is not None and prev.last_step is not None:
            # The write the kill landed in came after prev's last printed step: the first
            # step line after it is printed once that write is complete.
            at = prev.last_step + 1
            recovery = KillPoint(at, recovery=True)
            rest = ([seg.kill_point] if seg.kill_point else []) + left
            left = [recovery] + [k for k in rest if k.step > at]
            restore = prev
            continue
        if seg.out_of_drill_time:
            seg.chain_end = "deadline"
            break
        after = target.snapshot(ckpt_dir)
        progressed = target.advanced(before, after)
        if not (seg.crashed and i > 0 and progressed) or target.diverged(seg) is not None:
            # finished, hung, or crashed where a restart would crash again; a diverged
            # process would diverge again from its checkpoint, bit for bit
            if seg.crashed and i > 0 and target.diverged(seg) is None:
                seg.chain_end = "no-progress"
            break
        if prev is not None and prev.crashed and same_failure(prev, seg):
            seg.chain_end = "same-failure"
            break
    # Keep only the copies that were put back (evidence, with --work-dir): a checkpoint
    # dir can be large, and a passing drill needs none of them.
    used = {s.state_copy for s in segments if s.restored_from is not None}
    for s in segments:
        if s.state_copy is not None and s.state_copy not in used:
            shutil.rmtree(s.state_copy, ignore_errors=True)
    with contextlib.suppress(OSError):
        copies.rmdir()  # only when empty
    return segments


def _copy_before_write(target: Target, ckpt_dir: Path, dest: Path, seg: Segment, step: int) -> None:
    """Copy the checkpoint dir of a running process at step line `step`, as the write a
    kill is aimed at will find it, unless the last copy holds it already. A copy during
    which the dir changed (a write under way: a file changed, or renamed or removed while it
    was copied) is dropped: the last good one stays, and the next line before the write
    tries again."""
    now = target.snapshot(ckpt_dir)
    if seg.state_copy is not None and now == seg.copy_snapshot:
        return
    taking = dest.with_name(dest.name + "-taking")
    try:
        fresh = copy_state(target, ckpt_dir, taking)
    except OSError:  # shutil.Error too: a file renamed or removed under it (a write)
        shutil.rmtree(taking, ignore_errors=True)
        return
    if target.snapshot(ckpt_dir) != now:
        shutil.rmtree(fresh, ignore_errors=True)
        return
    if dest.exists():
        shutil.rmtree(dest)
    fresh.rename(dest)
    seg.state_copy, seg.copy_step, seg.copy_snapshot = dest, step, now


def copy_state(target: Target, ckpt_dir: Path, dest: Path) -> Path:
    """A copy of the checkpoint dir as it is now: real bytes, not hard links, since an
    in-place writer would change a linked copy too."""
    root = target.checkpoint_root(ckpt_dir)
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if root.is_dir():
        shutil.copytree(root, dest, symlinks=True)
    else:
        dest.mkdir()
    return dest


def put_back(target: Target, ckpt_dir: Path, copy: Path) -> None:
    """The checkpoint dir as `copy` holds it, whatever the failed restart left there."""
    root = target.checkpoint_root(ckpt_dir)
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(copy, root, symlinks=True)
