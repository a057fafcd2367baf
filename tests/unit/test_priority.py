"""A trainer's priority in the lab (trainer/priority.py, crashdrill/processes/cpu_priority.py):
a trainer started with the lab's nice value yields the CPU from its first instruction — forked
from the warm process or exec'd — seen from /proc while it has not run a line of its own
past a sleep; every thread drops; nothing is ever raised; no variable, no change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crashdrill.processes import forkserver
from crashdrill.processes.cpu_priority import priority_of
from crashdrill.trainer.priority import NICE_VARIABLE, wanted_nice
from crashdrill.workers.trainer_process import TrainerProcess
from crashdrill.workers.warm import WarmTrainers

pytestmark = [
    pytest.mark.warm,
    pytest.mark.timeout(60),
    pytest.mark.skipif(not forkserver.supported(), reason="Linux: /proc, fork server"),
]

# A stand-in trainer whose first line blocks: whatever priority it has then, its starter
# gave it before it ran anything (no import, no first step).
SLEEPY = "import time; time.sleep(60)\n"

# In a child process (a nice value cannot be taken back): a thread started before the call
# and one after it both end at the asked value, under SCHED_BATCH; asking for less later
# changes nothing.
THREADS = """
import json, os, sys, threading
from crashdrill.processes.cpu_priority import yield_cpu
before, gate = threading.Event(), threading.Event()
seen = {}
def worker(name):
    before.set() if name == "early" else None
    gate.wait()
    seen[name] = [os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0)]
early = threading.Thread(target=worker, args=("early",)); early.start(); before.wait()
yield_cpu(int(sys.argv[1]))
late = threading.Thread(target=worker, args=("late",)); late.start()
gate.set(); early.join(); late.join()
yield_cpu(3)
seen["after_lower_ask"] = [os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0)]
print(json.dumps(seen))
"""


@pytest.fixture
def sleepy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "sleepytrainer.py").write_text(SLEEPY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def warm(sleepy: Path) -> Iterator[WarmTrainers]:
    w = WarmTrainers(preload=["json"], command=["sleepytrainer"], enabled=True)
    yield w
    w.close()


def start(run_dir: Path, env: dict[str, str], warm: WarmTrainers | None) -> TrainerProcess:
    argv = [sys.executable, "-m", "sleepytrainer", "--run-dir", str(run_dir)]
    with open(os.devnull, "wb") as out:
        return TrainerProcess.start(argv, env, stdout=out, stderr=out, warm=warm)


def settled(pid: int, want: tuple[int, str]) -> tuple[int, str]:
    """The process's priority once it shows its own command line (forked: at once)."""
    deadline = time.monotonic() + 10
    seen = priority_of(pid)
    while seen != want and time.monotonic() < deadline:
        time.sleep(0.02)
        seen = priority_of(pid)
    return seen


@pytest.mark.parametrize("how", ["forked", "exec"])
def test_a_trainer_yields_before_its_first_line_forked_or_execd(
    how: str, sleepy: Path, warm: WarmTrainers
) -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    want = (max(7, base), "batch")
    proc = start(sleepy, {**os.environ, NICE_VARIABLE: "7"}, warm if how == "forked" else None)
    try:
        assert (proc.forked is not None) == (how == "forked")
        assert settled(proc.pid, want) == want
    finally:
        proc.signal(9)
        proc.wait(10)


def test_without_the_variable_a_trainer_keeps_its_starters_priority(
    sleepy: Path, warm: WarmTrainers
) -> None:
    env = {k: v for k, v in os.environ.items() if k != NICE_VARIABLE}
    proc = start(sleepy, env, warm)
    try:
        time.sleep(0.3)
        assert priority_of(proc.pid) == (os.getpriority(os.PRIO_PROCESS, 0), "other")
    finally:
        proc.signal(9)
        proc.wait(10)


def test_every_thread_drops_to_the_asked_value_and_never_climbs_back() -> None:
    out = subprocess.run(
        [sys.executable, "-c", THREADS, "7"], capture_output=True, text=True, check=True
    ).stdout
    want = [max(7, os.getpriority(os.PRIO_PROCESS, 0)), os.SCHED_BATCH]
    assert json.loads(out) == {"early": want, "late": want, "after_lower_ask": want}


@pytest.mark.parametrize("raw", ["", "  ", "ten", "-1", "0", "20", "1.5"])
def test_no_value_zero_or_a_bad_one_asks_for_nothing(raw: str) -> None:
    assert wanted_nice({NICE_VARIABLE: raw}) is None


def test_a_value_in_range_is_asked_for() -> None:
    assert wanted_nice({NICE_VARIABLE: " 10 "}) == 10
    assert wanted_nice({}) is None
