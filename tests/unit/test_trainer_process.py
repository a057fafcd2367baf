"""The supervisor's handle on a trainer: a crash test kills everything the trainer started,
even a child that made a session of its own (as torchrun's ranks do)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from crashdrill.processes import process_tree
from crashdrill.workers.trainer_process import TrainerProcess

pytestmark = pytest.mark.skipif(not process_tree.supported(), reason="needs /proc (Linux)")

# A stand-in "trainer" that starts a grandchild in a new session (out of its process group)
# and writes the grandchild's pid, then sleeps.
SPAWNER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         start_new_session=True)
open(sys.argv[-1] + "/grandchild.pid", "w").write(str(child.pid))
time.sleep(60)
"""


def _start(run_dir: Path) -> tuple[TrainerProcess, int]:
    argv = [sys.executable, "-c", SPAWNER, "--run-dir", str(run_dir)]
    with open(os.devnull, "wb") as out:
        proc = TrainerProcess.start(argv, dict(os.environ), stdout=out, stderr=out)
    pid_file = run_dir / "grandchild.pid"
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline, "the stand-in never started its grandchild"
        time.sleep(0.02)
    return proc, int(pid_file.read_text())


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sigkill_takes_down_a_grandchild_in_its_own_session(tmp_path: Path) -> None:
    proc, grandchild = _start(tmp_path)
    assert os.getpgid(grandchild) != os.getpgid(proc.pid)  # killpg alone would miss it
    proc.signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    assert _gone(grandchild)


def test_an_adopted_trainer_is_killed_with_its_orphaned_children(tmp_path: Path) -> None:
    proc, grandchild = _start(tmp_path)
    # As after a server restart: a handle made from the pid alone, the trainer not our child.
    adopted = TrainerProcess(proc.pid)
    assert adopted.marker == str(tmp_path)
    adopted.signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    assert _gone(grandchild)


def test_signalling_an_ended_trainer_says_so(tmp_path: Path) -> None:
    proc, grandchild = _start(tmp_path)
    proc.signal(signal.SIGKILL)
    proc.wait(10)
    with pytest.raises(ProcessLookupError):
        proc.signal(signal.SIGKILL)
    assert _gone(grandchild)


# A stand-in group as a blind launcher's is: the "trainer" forks a rank, which forks a
# keeper that outlives it (trainer/ranks.py keep_connections); the trainer never waits,
# so a killed rank stays a zombie and its keeper is re-parented away from the trainer.
KEEPER_TREE = """
import os, sys, time
rank = os.fork()
if rank == 0:
    keeper = os.fork()
    if keeper == 0:
        time.sleep(60)
        os._exit(0)
    open(sys.argv[-1] + "/pids", "w").write(f"{os.getpid()} {keeper}")
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def test_a_sigcont_continues_what_the_sigstop_stopped_even_once_it_left_the_tree(
    tmp_path: Path,
) -> None:
    """A prediction hold stops the whole tree; a crash test then kills one rank while it is
    held; the release must continue that rank's keeper, which is no longer under the
    trainer, or it stays stopped forever (found in state T, outliving its lab). No marker
    (no --run-dir): the tree is found by parentage alone, as for a forked trainer whose
    marker is not in its /proc environ."""
    argv = [sys.executable, "-c", KEEPER_TREE, str(tmp_path)]
    with open(os.devnull, "wb") as out:
        proc = TrainerProcess.start(argv, dict(os.environ), stdout=out, stderr=out)
    pids = tmp_path / "pids"
    deadline = time.monotonic() + 30
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the stand-in never started its keeper"
        time.sleep(0.02)
    rank, keeper = (int(p) for p in pids.read_text().split())
    try:
        proc.signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while psutil.Process(keeper).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "the hold never stopped the keeper"
            time.sleep(0.01)
        os.kill(rank, signal.SIGKILL)  # the crash test's rank kill, while held
        deadline = time.monotonic() + 5
        while psutil.Process(keeper).ppid() == rank:
            assert time.monotonic() < deadline, "the keeper was never re-parented"
            time.sleep(0.01)
        proc.signal(signal.SIGCONT)
        deadline = time.monotonic() + 5
        while psutil.Process(keeper).status() == psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "the keeper was left stopped"
            time.sleep(0.01)
    finally:
        for pid in (keeper, rank):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.signal(signal.SIGKILL)
        proc.wait(10)
