"""The engine on tiny Python one-liners: kills, timeouts, process groups, write watches.
Each process lives well under a second."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from crashdrill.drill.command import CommandTarget
from crashdrill.drill.engine import run_crashed, run_segment
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.target import StartError
from crashdrill.drill.trace import LossParser

pytestmark = pytest.mark.timeout(60)

STEPS = """
import json, os, sys, time
for step in range(1, 201):
    print(json.dumps({"step": step, "loss": 1.0 / step}), flush=True)
    time.sleep(0.005)
"""


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def target(code: str, timeout: float = 20.0) -> CommandTarget:
    return CommandTarget([sys.executable, "-c", code], parser=LossParser(), timeout=timeout)


def test_a_kill_lands_once_the_planned_step_is_printed(tmp_path: Path) -> None:
    seg = run_segment(target(STEPS), tmp_path, 0, KillPoint(10))
    assert seg.killed and not seg.hung and seg.exit_code == -9
    assert seg.last_step is not None and 10 <= seg.last_step < 40
    assert seg.kill_time is not None and seg.cpu_s is not None
    assert [p.step for p in seg.points] == list(range(1, seg.last_step + 1))


def test_a_process_past_its_timeout_is_hung(tmp_path: Path) -> None:
    code = 'import time; print(\'{"step": 1, "loss": 2.0}\', flush=True); time.sleep(30)'
    t0 = time.monotonic()
    seg = run_segment(target(code, timeout=0.5), tmp_path, 0, None)
    assert seg.hung and not seg.killed and seg.last_step == 1
    assert time.monotonic() - t0 < 10


def test_the_kill_reaches_the_scripts_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    code = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n" + STEPS
    )
    seg = run_segment(target(code), tmp_path, 0, KillPoint(3))
    assert seg.killed
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"child {child} outlived the kill")


def test_the_kill_reaches_children_that_made_their_own_session(tmp_path: Path) -> None:
    """As torchrun starts its ranks: a process group kill would leave them running."""
    pidfile = tmp_path / "child.pid"
    sleeper = "[sys.executable, '-c', 'import time; time.sleep(30)']"
    code = (
        "import subprocess, sys\n"
        f"a = subprocess.Popen({sleeper}, start_new_session=True)\n"
        f"b = subprocess.Popen({sleeper}, start_new_session=True)\n"
        f"open({str(pidfile)!r}, 'w').write(f'{{a.pid}} {{b.pid}}')\n" + STEPS
    )
    seg = run_segment(target(code), tmp_path, 0, KillPoint(3))
    assert seg.killed and seg.processes_killed == 3
    assert all(_dead(pid) for pid in map(int, pidfile.read_text().split()))


def test_what_a_finished_process_left_running_does_not_outlive_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    code = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'],"
        " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        'print(\'{"step": 1, "loss": 1.5}\')\n'
    )
    seg = run_segment(target(code), tmp_path, 0, None)
    assert seg.exit_code == 0 and not seg.killed
    assert _dead(int(pidfile.read_text()))


def test_a_last_line_without_a_newline_counts_when_the_process_exits(tmp_path: Path) -> None:
    code = "print('{\"step\": 1, \"loss\": 1.5}', end='')"
    seg = run_segment(target(code), tmp_path, 0, None)
    assert seg.exit_code == 0 and [p.step for p in seg.points] == [1]


def test_stderr_and_other_stdout_are_kept(tmp_path: Path) -> None:
    code = "import sys; print('hello'); print('boom', file=sys.stderr); sys.exit(4)"
    seg = run_segment(target(code), tmp_path, 0, None)
    assert seg.crashed and seg.exit_code == 4
    assert seg.other_stdout == ["hello"] and seg.stderr_tail == ["boom"]


def test_the_checkpoint_dir_reaches_the_script(tmp_path: Path) -> None:
    code = "import os, sys; print(os.environ['CRASHDRILL_CKPT_DIR'] + '|' + sys.argv[1])"
    t = CommandTarget([sys.executable, "-c", code, "{ckpt_dir}"], parser=LossParser(), timeout=20)
    seg = run_segment(t, tmp_path, 0, None)
    assert seg.other_stdout == [f"{tmp_path}|{tmp_path}"]


def test_a_command_that_cannot_start_raises(tmp_path: Path) -> None:
    t = CommandTarget(["/no/such/crashdrill-program"], parser=LossParser(), timeout=5)
    with pytest.raises(StartError, match="cannot start"):
        run_segment(t, tmp_path, 0, None)


def test_a_write_kill_lands_inside_the_next_checkpoint_write(tmp_path: Path) -> None:
    code = """
import json, os, time
ckpt = os.path.join(os.environ["CRASHDRILL_CKPT_DIR"], "ckpt.bin")
for step in range(1, 50):
    print(json.dumps({"step": step, "loss": 1.0}), flush=True)
    time.sleep(0.01)
    if step % 10 == 0:
        with open(ckpt, "wb") as f:  # a zip's head first, as torch.save writes one
            for i in range(20):
                f.write(b"PK\\x03\\x04" + b"x" * 996 if i == 0 else b"x" * 1000)
                f.flush(); time.sleep(0.01)
"""
    seg = run_segment(target(code), tmp_path, 0, KillPoint(12, during_write=True))
    assert seg.killed and seg.in_write
    assert seg.last_step == 20  # armed at 12, the next write follows step 20
    before, after = seg.snapshot_before_kill or {}, seg.snapshot_after_kill or {}
    assert before["ckpt.bin"][1] == 20_000 and after["ckpt.bin"][1] < 20_000  # torn
    assert os.path.getsize(tmp_path / "ckpt.bin") < 20_000


TORN_ON_RESUME = """
import json, os, time
ckpt = os.path.join(os.environ["CRASHDRILL_CKPT_DIR"], "ckpt.json")
step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0  # a torn file: crash
while step < 30:
    step += 1
    print(json.dumps({"step": step, "loss": 1.0}), flush=True)
    time.sleep(0.01)
    if step % 10 == 0:
        with open(ckpt, "w") as f:  # in place
            text = json.dumps({"step": step, "pad": "x" * 2000})
            for i in range(10):
                f.write(text[i * len(text) // 10 : (i + 1) * len(text) // 10])
                f.flush()
                time.sleep(0.02)
"""


def test_a_torn_write_whose_restart_fails_is_followed_by_a_plain_kill_from_a_copy(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "crashed"
    ckpt.mkdir()
    plan = [KillPoint(3, before_first=True), KillPoint(18, during_write=True)]
    segs = run_crashed(target(TORN_ON_RESUME), ckpt, plan)
    assert [s.killed for s in segs] == [True, True, False, True, False], segs
    assert segs[1].last_step == 20 and segs[2].crashed  # the torn ckpt.json fails to load
    replay, recovery = segs[3], segs[3].kill_point
    # The copy was taken at a step line before the torn write (after the write of step
    # 10), not as segment 1 started (an empty dir then): the replay resumes from step 10.
    assert segs[1].copy_step is not None and 10 < segs[1].copy_step < 18, segs[1]
    assert replay.restored_from == 1 and replay.first_step == 11
    assert recovery is not None and recovery.recovery and recovery.step == 21
    assert replay.last_step is not None and replay.last_step >= 21
    assert segs[4].exit_code == 0 and segs[4].first_step == 21  # resumed from the write of 20
    copies = tmp_path / "crashed-copies"
    assert [p.name for p in copies.iterdir()] == ["before-segment-1"]  # the one put back


def test_copies_that_were_never_put_back_are_removed(tmp_path: Path) -> None:
    ckpt = tmp_path / "crashed"
    ckpt.mkdir()
    atomic = TORN_ON_RESUME.replace('open(ckpt, "w")', 'open(ckpt + ".tmp", "w")').replace(
        "time.sleep(0.02)\n", "time.sleep(0.02)\n        os.replace(ckpt + '.tmp', ckpt)\n"
    )
    segs = run_crashed(target(atomic), ckpt, [KillPoint(18, during_write=True)])
    assert [s.killed for s in segs] == [True, False] and segs[1].exit_code == 0, segs
    assert segs[0].state_copy is not None and not (tmp_path / "crashed-copies").exists()


def test_a_script_that_writes_at_every_step_has_its_first_checkpoint_at_the_start(
    tmp_path: Path,
) -> None:
    code = """
import json, os, time
ckpt = os.path.join(os.environ["CRASHDRILL_CKPT_DIR"], "ckpt.json")
for step in range(1, 31):
    print(json.dumps({"step": step, "loss": 1.0}), flush=True)
    with open(ckpt + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(ckpt + ".tmp", ckpt)
    time.sleep(0.02)
"""
    seg = run_segment(target(code), tmp_path, 0, None, observe_checkpoints=True)
    assert seg.first_ckpt_step is not None and seg.first_ckpt_step <= 2, seg.write_steps
    # A write per line: at most two lines make one write, so most writes stay apart.
    assert len(seg.write_steps) >= 10, seg.write_steps


def resuming(code: str, timeout: float = 20.0) -> CommandTarget:
    """A target whose every restart gets --resume."""
    return CommandTarget(
        [sys.executable, "-c", code],
        parser=LossParser(),
        timeout=timeout,
        resume_args=["--resume"],
        resume_args_always=True,
    )


# Every start opens a new event log in the checkpoint dir, as a SummaryWriter does.
EVENT_LOG = """
import json, os, sys, time
root = os.environ["CRASHDRILL_CKPT_DIR"]
open(os.path.join(root, f"events.out.tfevents.{time.time()}.host.{os.getpid()}"), "ab").write(b"x")
ckpt = os.path.join(root, "ckpt.json")
"""


def test_a_restart_that_crashes_leaving_only_a_new_log_ends_the_chain(tmp_path: Path) -> None:
    code = EVENT_LOG + (
        "if '--resume' in sys.argv and not os.path.exists(ckpt):\n"
        "    raise FileNotFoundError('--resume: no ckpt.json')\n" + STEPS.split("\n", 2)[2]
    )
    segs = run_crashed(resuming(code), tmp_path, [KillPoint(3), KillPoint(50)])
    assert [s.killed for s in segs] == [True, False] and segs[1].crashed
    assert segs[1].chain_end == "no-progress"  # the new event file is not progress
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2


def test_two_restarts_that_fail_the_same_way_end_the_chain(tmp_path: Path) -> None:
    # Each restart rewrites its checkpoint (progress by the files) and then fails the same way.
    code = EVENT_LOG + (
        "if '--resume' in sys.argv:\n"
        "    open(ckpt, 'w').write(json.dumps({'t': time.time()}))\n"
        "    raise RuntimeError('cannot restore the optimizer')\n" + STEPS.split("\n", 2)[2]
    )
    segs = run_crashed(resuming(code), tmp_path, [KillPoint(3)])
    assert [s.killed for s in segs] == [True, False, False], segs
    assert segs[2].chain_end == "same-failure"
    assert segs[2].stderr_tail[-1] == "RuntimeError: cannot restore the optimizer"


def test_the_restart_cap_ends_a_chain_that_keeps_crashing_further(tmp_path: Path) -> None:
    # Each restart gets one step further, saves and crashes with a new message: no loop
    # that the same-failure rule sees; the cap ends it.
    code = """
import json, os, sys
ckpt = os.path.join(os.environ["CRASHDRILL_CKPT_DIR"], "ckpt.json")
n = json.load(open(ckpt))["n"] if os.path.exists(ckpt) else 0
for step in range(1, n + 3):
    print(json.dumps({"step": step, "loss": 1.0}), flush=True)
open(ckpt, "w").write(json.dumps({"n": n + 1}))
if "--resume" in sys.argv:
    raise RuntimeError(f"broke after {n} restarts")
import time; time.sleep(5)
"""
    segs = run_crashed(resuming(code), tmp_path, [KillPoint(1)], max_restarts=3)
    assert len(segs) == 4 and all(s.crashed for s in segs[1:]), segs
    assert segs[-1].chain_end == "restart-cap 3"


def test_the_drill_s_deadline_stops_the_running_process_and_the_chain(tmp_path: Path) -> None:
    slow = STEPS.replace("time.sleep(0.005)", "time.sleep(0.2)")
    t = target(slow)
    t.deadline = time.monotonic() + 1.0
    t0 = time.monotonic()
    segs = run_crashed(t, tmp_path, [KillPoint(100)])
    assert len(segs) == 1 and segs[0].out_of_drill_time and segs[0].chain_end == "deadline"
    assert time.monotonic() - t0 < 8


def test_only_a_kill_armed_inside_a_write_copies_the_dir_once_after_the_write_before(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "crashed"
    ckpt.mkdir()
    plain = run_crashed(target(TORN_ON_RESUME), ckpt, [KillPoint(14)])
    assert all(s.state_copy is None for s in plain), plain  # a plain kill copies nothing
    for p in ckpt.iterdir():
        p.unlink()
    # Armed at 18 with the reference's write before it at 10: one copy, at the first step
    # line after 10 (the dir does not change again before the write), not at the start.
    segs = run_crashed(target(TORN_ON_RESUME), ckpt, [KillPoint(18, True, after_write=10)])
    assert segs[0].copy_step == 11 and segs[0].copy_snapshot is not None, segs[0]
    assert "ckpt.json" in segs[0].copy_snapshot
