"""Warm trainers (workers/warm.py) on tiny modules instead of the trainer (no torch
preloaded, so each warm process starts in a blink): a forked trainer is a real process in
its own session that shows its own command line, its exit status reaches the supervisor's
wait, it outlives a warm process that exits (for adoption), and a warm process that is
gone makes starts fall back to exec, saying why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from crashdrill.processes import forkserver
from crashdrill.workers.trainer_process import TrainerProcess, adopt_trainer, find_live_trainer
from crashdrill.workers.warm import ENV_SWITCH, WarmTrainers, forkable
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.warm,
    pytest.mark.timeout(60),
    pytest.mark.skipif(not forkserver.supported(), reason="no fork server on this platform"),
]

# A stand-in trainer: exits with the status in argv, or sleeps until it is killed.
TOY = """
import sys, time
print("toy", sys.argv[1:], flush=True)
code = sys.argv[sys.argv.index("--exit") + 1] if "--exit" in sys.argv else None
if code is not None:
    sys.exit(int(code))
time.sleep(60)
"""


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`python -m toytrainer` importable by the warm process (its cwd) and by exec."""
    (tmp_path / "toytrainer.py").write_text(TOY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def warm(toy: Path) -> Iterator[WarmTrainers]:
    w = WarmTrainers(keep_children=True, preload=["json"], command=["toytrainer"], enabled=True)
    yield w
    w.close()


def argv(run_dir: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "toytrainer", "--run-dir", str(run_dir), "--label", "A", *more]


def start(warm: WarmTrainers | None, run_dir: Path, *more: str) -> TrainerProcess:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "stdout.log", "ab") as out, open(run_dir / "stderr.log", "ab") as err:
        return TrainerProcess.start(
            argv(run_dir, *more), {**os.environ}, stdout=out, stderr=err, warm=warm
        )


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_only_the_trainer_command_of_this_python_is_forked() -> None:
    assert forkable([sys.executable, "-m", "crashdrill", "run", "quick", "--run-dir", "r"])
    assert not forkable(["/usr/bin/python3.9", "-m", "crashdrill", "run", "quick"])
    assert not forkable([sys.executable, "train.py", "--out", "x"])
    assert not forkable([sys.executable, "-m", "crashdrill", "verify"])


def test_a_forked_trainer_is_its_own_session_with_its_own_command_line(
    warm: WarmTrainers, toy: Path
) -> None:
    run_dir = toy / "runs" / "r1"
    proc = start(warm, run_dir)
    assert proc.forked is not None and proc.popen is None
    ps = psutil.Process(proc.pid)
    assert ps.ppid() == warm.status()["pid"]  # the warm process is its parent
    assert os.getsid(proc.pid) == proc.pid and os.getpgid(proc.pid) == proc.pid
    shown = [a for a in ps.cmdline() if a]
    assert shown == argv(run_dir)  # as `ps` and an adopting server read it
    assert find_live_trainer(run_dir, []) == proc.pid  # found by --run-dir, no pid given
    wait_until(lambda: "toy" in (run_dir / "stdout.log").read_text(), "its output in the file")
    assert "--run-dir" in (run_dir / "stdout.log").read_text()
    assert warm.status() | {"pid": None} == {
        "mode": "fork",
        "warm": "ready",
        "pid": None,
        "forked": 1,
        "exec": 0,
        "error": None,
    }
    proc.signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL


@pytest.mark.parametrize("code", [0, 3, 75, 1])
def test_the_exit_status_reaches_the_wait(warm: WarmTrainers, toy: Path, code: int) -> None:
    proc = start(warm, toy / "runs" / f"exit{code}", "--exit", str(code))
    assert proc.forked is not None
    assert proc.wait(10) == code
    with pytest.raises(ProcessLookupError):
        proc.signal(signal.SIGTERM)  # it has ended: nothing to signal


def test_a_wait_returns_when_the_trainer_dies_not_at_its_timeout(
    warm: WarmTrainers, toy: Path
) -> None:
    proc = start(warm, toy / "runs" / "r2")
    with pytest.raises(TimeoutError):
        proc.wait(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    began = time.monotonic()
    assert proc.wait(30) == -signal.SIGKILL
    assert time.monotonic() - began < 25  # woken by the death, not by the 30 s timeout


def test_trainers_outlive_the_warm_process_and_are_adopted(warm: WarmTrainers, toy: Path) -> None:
    run_dir = toy / "runs" / "r3"
    proc = start(warm, run_dir)
    warm.close()  # the lab stops (or is killed): its trainers keep training
    time.sleep(0.2)
    assert not gone(proc.pid)
    adopted = adopt_trainer(run_dir, [None])  # the next server finds it by its command line
    assert adopted is not None and adopted.pid == proc.pid
    adopted.signal(signal.SIGKILL)
    wait_until(lambda: gone(proc.pid), "the adopted trainer was killed")


def test_a_trainer_whose_warm_process_died_is_still_watched(warm: WarmTrainers, toy: Path) -> None:
    proc = start(warm, toy / "runs" / "r4")
    os.kill(warm.status()["pid"], signal.SIGKILL)
    with pytest.raises(TimeoutError):
        proc.wait(0.3)  # its status will never be relayed, but it still runs
    assert not gone(proc.pid)
    proc.signal(signal.SIGKILL)
    assert proc.wait(10) is None  # ended; its exit status died with the warm process


def test_a_dead_warm_process_makes_starts_exec_and_says_why(warm: WarmTrainers, toy: Path) -> None:
    first = start(warm, toy / "runs" / "r5", "--exit", "0")
    assert first.forked is not None and first.wait(10) == 0
    os.kill(warm.status()["pid"], signal.SIGKILL)
    wait_until(lambda: warm.status()["mode"] == "exec", "the death noticed")
    proc = start(warm, toy / "runs" / "r6", "--exit", "3")
    assert proc.popen is not None and proc.wait(30) == 3  # exec'd: slower, but it starts
    status = warm.status()
    assert status["mode"] == "exec" and status["exec"] == 1 and status["forked"] == 1
    assert "the warm process exited" in status["error"]


def test_the_switch_turns_warm_trainers_off(toy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SWITCH, "0")
    w = WarmTrainers(keep_children=True, preload=["json"], command=["toytrainer"])
    proc = start(w, toy / "runs" / "r7", "--exit", "0")
    assert proc.popen is not None and proc.wait(30) == 0
    assert w.status()["mode"] == "exec" and ENV_SWITCH in w.status()["error"]


def test_another_command_is_exec_d(warm: WarmTrainers, toy: Path) -> None:
    run_dir = toy / "runs" / "r8"
    run_dir.mkdir(parents=True)
    script = [sys.executable, str(toy / "toytrainer.py"), "--run-dir", str(run_dir), "--exit", "0"]
    with open(os.devnull, "wb") as out:
        proc = TrainerProcess.start(script, dict(os.environ), stdout=out, stderr=out, warm=warm)
    assert proc.popen is not None and proc.wait(30) == 0
    assert warm.status()["exec"] == 0  # not a fallback: it was never the warm one's to start


OWNER = """
import json, os, sys, time
sys.path.insert(0, os.getcwd())
from crashdrill.workers.warm import WarmTrainers
w = WarmTrainers(die_with_parent=True, preload=["json"], command=["toytrainer"], enabled=True)
run_dir = sys.argv[1]
child = w.spawn([sys.executable, "-m", "toytrainer", "--run-dir", run_dir], dict(os.environ),
                stdout=sys.stderr.buffer, stderr=sys.stderr.buffer)
print(json.dumps({"warm": w.status()["pid"], "trainer": child.pid}), flush=True)
time.sleep(60)
"""


def test_with_die_with_parent_the_trainer_dies_with_its_owner(toy: Path) -> None:
    """A Ray node's actor: when it dies, its warm process and its trainer die too."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(toy / "runs" / "r9")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        import json

        assert owner.stdout is not None  # stdout=PIPE
        pids = json.loads(owner.stdout.readline())
        assert not gone(pids["trainer"])
        owner.kill()
        owner.wait()
        wait_until(lambda: gone(pids["warm"]), "the warm process died with its owner")
        wait_until(lambda: gone(pids["trainer"]), "the trainer died with its warm process")
    finally:
        owner.kill()
        owner.wait()


def test_a_command_too_long_to_show_execs_and_keeps_the_warm_process(
    warm: WarmTrainers, toy: Path
) -> None:
    first = start(warm, toy / "runs" / "r10", "--exit", "0")
    assert first.forked is not None and first.wait(10) == 0
    pid = warm.status()["pid"]
    deep = toy.joinpath("runs", *(["d" * 200] * 6))  # a run dir of 1,200+ characters
    proc = start(warm, deep, "--exit", "0")
    assert proc.popen is not None and proc.wait(30) == 0  # exec'd: its argv shows in full
    status = warm.status()
    assert status["mode"] == "fork" and status["pid"] == pid and status["exec"] == 1


def test_a_warm_process_says_warming_until_its_imports_are_done_then_ready(toy: Path) -> None:
    (toy / "slowimport.py").write_text("import time\ntime.sleep(1.5)\n")  # torch, slowly
    warm = WarmTrainers(
        keep_children=True, preload=["slowimport"], command=["toytrainer"], enabled=True
    )
    try:
        assert warm.status()["warm"] == "warming"  # about to start one
        warm.prewarm()
        assert warm.status()["warm"] == "warming"  # importing: a start now would wait
        wait_until(lambda: warm.status()["warm"] == "ready", "the imports", timeout=20)
        assert warm.status()["forked"] == 0  # ready before any start asked for it
    finally:
        warm.close()
    assert warm.status()["warm"] == "none"  # closed: starts exec


def test_a_warm_process_turned_off_says_none(toy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SWITCH, "0")
    warm = WarmTrainers(keep_children=True, preload=["json"], command=["toytrainer"])
    warm.prewarm()
    assert warm.status()["warm"] == "none"
    warm.close()
