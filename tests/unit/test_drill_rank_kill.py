"""The --kill-rank trial's parts: which process is rank R (its environment, torch's
launcher contract), where the trial lands in the plan, and what the report says the
launcher did."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from crashdrill.drill.command import CommandTarget
from crashdrill.drill.plan import KillPoint, rank_kill_point
from crashdrill.drill.rank_kill import (
    OWN_STORE_ENV,
    RankKill,
    kill_rank,
    rank_pid,
    stale_store_hint,
)
from crashdrill.drill.target import Segment
from crashdrill.drill.trace import LossParser

# A launcher: starts rank 0 and rank 1 (RANK in their environment); rank 1 starts a
# child of its own (a DataLoader worker, say) that inherits RANK=1.
LAUNCHER = """
import os, subprocess, sys, time
sleeper = "[sys.executable, '-c', 'import time; time.sleep(60)']"
code = "import os, subprocess, sys, time\\n" \\
    f"if os.environ['RANK'] == '1': subprocess.Popen({sleeper})\\n" \\
    "time.sleep(60)"
for r in (0, 1):
    subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "RANK": str(r)})
time.sleep(60)
"""


def test_the_rank_s_process_is_the_topmost_descendant_whose_environment_says_its_rank() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], env=env)
    try:
        deadline = time.monotonic() + 30
        pid = None
        while pid is None and time.monotonic() < deadline:
            pid = rank_pid(launcher.pid, 1)
            time.sleep(0.05)
        assert pid is not None
        proc = psutil.Process(pid)
        assert proc.ppid() == launcher.pid and proc.environ()["RANK"] == "1"
        assert rank_pid(launcher.pid, 0) not in (None, pid)
        assert rank_pid(launcher.pid, 5) is None
        assert kill_rank(launcher.pid, 1) == pid
        while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.05)
        assert launcher.poll() is None  # the launcher itself was not touched
    finally:
        for p in psutil.Process(launcher.pid).children(recursive=True):
            p.kill()
        launcher.kill()
        launcher.wait()


def test_the_rank_kill_lands_after_the_plan_s_kills_and_the_first_checkpoint() -> None:
    steps = list(range(1, 40))
    plan = [KillPoint(3, before_first=True), KillPoint(16)]
    extra = rank_kill_point(plan, steps, [8, 16, 24, 32], 1)
    assert extra is not None and extra.rank == 1 and extra.kind == "rank-kill"
    assert extra.step > 16 and extra.step not in (24, 32)
    assert rank_kill_point([], steps, [8, 16], 1) is not None  # --kills 0
    assert rank_kill_point(plan, steps, [], 1) is None  # nothing to resume from
    assert rank_kill_point([KillPoint(39)], steps, [8], 1) is None  # no step line left


def test_the_report_says_what_the_launcher_did_and_how_long_it_took() -> None:
    rk = RankKill(1, 4242, 9, t=100.0)
    assert rk.poll(-1, 100.05) is False  # no such launcher: nothing restarted
    rk.ended(1, 100.5, hung=False)
    assert rk.launcher == "exited" and rk.exit_code == 1
    assert "the launcher exited (status 1) 0.50 s later" in rk.words()
    hung = RankKill(1, 4242, 9, t=100.0)
    hung.ended(None, 160.0, hung=True)
    assert hung.launcher == "hung" and "hung 60.00 s" in hung.words()
    assert hung.to_json()["launcher"] == "hung"


# What gloo printed when torchrun's restarted group dialed the killed group's ports (a
# 2-rank torchrun --max-restarts 1 on this machine, torch 2.13).
MESH = (
    "[default1]:RuntimeError: Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party"
    "/gloo/gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused,"
    " remote=[127.0.0.1]:42369$1"
)


def test_a_restarted_group_that_cannot_reach_its_peers_is_told_about_the_shared_store() -> None:
    lines = ["[default0]:step 9 | loss 0.1", MESH, "ChildFailedError:"]
    hint = stale_store_hint(lines, {})
    assert hint is not None
    assert "pytorch/pytorch#135712" in hint and f"{OWN_STORE_ENV}=1" in hint
    assert "Gloo connectFullMesh failed" in hint  # the line that showed it
    # Already opted out, or another failure: no such hint.
    assert stale_store_hint(lines, {OWN_STORE_ENV: "1"}) is None
    assert stale_store_hint(["ValueError: bad shape"], {}) is None


def test_only_a_group_the_launcher_restarted_gets_the_shared_store_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(OWN_STORE_ENV, raising=False)
    target = CommandTarget(["torchrun", "train.py"], parser=LossParser())
    seg = Segment(1, ["torchrun", "train.py"], None, started=0.0, peer_errors=[MESH])
    assert target.failure_hint(seg) is None  # a launcher the drill restarted: a new store
    seg.launcher_restart = True
    hint = target.failure_hint(seg)
    assert hint is not None and OWN_STORE_ENV in hint
