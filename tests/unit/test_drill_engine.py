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
from crashdrill.drill.engine import StartError, run_segment
from crashdrill.drill.plan import KillPoint
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
        with open(ckpt, "wb") as f:
            for _ in range(20):
                f.write(b"x" * 1000); f.flush(); time.sleep(0.01)
"""
    seg = run_segment(target(code), tmp_path, 0, KillPoint(12, during_write=True))
    assert seg.killed and seg.in_write
    assert seg.last_step == 20  # armed at 12, the next write follows step 20
    before, after = seg.snapshot_before_kill or {}, seg.snapshot_after_kill or {}
    assert before["ckpt.bin"][1] == 20_000 and after["ckpt.bin"][1] < 20_000  # torn
    assert os.path.getsize(tmp_path / "ckpt.bin") < 20_000
