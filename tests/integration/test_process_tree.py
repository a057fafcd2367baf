"""kill_tree on real process trees whose members make their own sessions, or leave the
tree: nothing of them is left alive, and the count says how many died."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from crashdrill.processes import process_tree
from crashdrill.processes.process_tree import kill_tree, members, tree_marker

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not process_tree.supported(), reason="needs /proc (Linux)"),
]

# Starts two children in new sessions (as torchrun starts its ranks), one of which starts
# a grandchild in yet another session; writes every pid, then waits (or exits).
LAUNCHER = """
import json, subprocess, sys, time
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
SPAWN = [sys.executable, "-c",
         "import subprocess, sys, time; p = subprocess.Popen(%r, start_new_session=True);"
         " print(p.pid, flush=True); time.sleep(60)" % (SLEEP,)]
a = subprocess.Popen(SLEEP, start_new_session=True)
b = subprocess.Popen(SPAWN, start_new_session=True, stdout=subprocess.PIPE, text=True)
grandchild = int(b.stdout.readline())
open(sys.argv[1], "w").write(json.dumps([a.pid, b.pid, grandchild]))
if sys.argv[2:] != ["exit"]:  # exit: leave the children behind as orphans
    time.sleep(60)
"""


def _wait_for(path: Path) -> list[int]:
    deadline = time.monotonic() + 20
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "the launcher never wrote its pids"
        time.sleep(0.02)
    return list(json.loads(path.read_text()))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_kill_tree_takes_down_children_in_their_own_sessions(tmp_path: Path) -> None:
    pids = tmp_path / "pids.json"
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(pids)], start_new_session=True)
    others = _wait_for(pids)
    assert members(proc.pid) == {proc.pid, *others}
    assert kill_tree(proc.pid) == 4
    assert proc.wait(timeout=10) == -9
    assert not [p for p in others if _alive(p)]
    assert kill_tree(proc.pid) == 0  # nothing left: a second kill finds nobody


def test_a_marked_process_that_left_the_tree_is_killed_with_it(tmp_path: Path) -> None:
    """The launcher exits, so its children are orphans (re-parented to init, or to a
    subreaper): only the marker still ties them to the run."""
    pids = tmp_path / "pids.json"
    token = f"test-orphans-{uuid.uuid4()}"  # unique: no other run's process carries it
    env = {**os.environ, **tree_marker(token)}
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(pids), "exit"], env=env)
    others = _wait_for(pids)
    assert proc.wait(timeout=10) == 0
    assert all(_alive(p) for p in others)
    assert members(proc.pid) == set()  # without the marker: nothing left to find
    assert kill_tree(proc.pid, marker=token) == 3
    deadline = time.monotonic() + 5
    while [p for p in others if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [p for p in others if _alive(p)]


def test_a_subreaper_adopts_the_orphans_of_what_it_started(tmp_path: Path) -> None:
    """In a fresh process (a subreaper stays one for life): a child starts a grandchild in
    its own session and exits; the grandchild becomes the subreaper's, is killed through
    the marker and reaped, so no zombie is left either."""
    code = """
import json, os, subprocess, sys, time
from crashdrill.processes.process_tree import adopted, become_subreaper, kill_tree, tree_marker
ok = become_subreaper()
env = {**os.environ, **tree_marker(sys.argv[1])}
inner = (
    "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; "
    "time.sleep(60)'], start_new_session=True, stdout=-3, stderr=-3); print(p.pid)"
)
child = subprocess.run([sys.executable, "-c", inner], env=env, capture_output=True, text=True)
orphan = int(child.stdout)
time.sleep(0.2)
found = sorted(adopted([]))
killed = kill_tree(999999999, marker=sys.argv[1])
left = sorted(adopted([]))
try:
    os.kill(orphan, 0)
    gone = False
except ProcessLookupError:
    gone = True
print(json.dumps({"ok": ok, "orphan": orphan, "found": found, "killed": killed,
                  "left": left, "gone": gone}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code, f"sub-{uuid.uuid4()}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["ok"] and r["found"] == [r["orphan"]]
    assert r["killed"] == 1 and r["left"] == [] and r["gone"]  # killed and reaped


def test_a_process_of_the_run_started_after_the_kill_began_is_not_part_of_its_tree() -> None:
    """A supervisor restarts a run's trainer (same marker) as soon as the old one dies,
    while the kill may still walk /proc: the new trainer must not be taken down too (a
    lost-host test saw its restarts killed one after another until the run failed).
    kill_tree walks with born_by = the instant it began."""
    token = f"run-{uuid.uuid4()}"
    env = {**os.environ, **tree_marker(token)}
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    old = subprocess.Popen(sleep, env=env, start_new_session=True)
    try:
        time.sleep(0.05)
        began = process_tree._ticks_before_now()
        time.sleep(0.1)  # several clock ticks later: the run's next trainer
        new = subprocess.Popen(sleep, env=env, start_new_session=True)
        try:
            assert {old.pid, new.pid} <= members(old.pid, token)
            walked = members(old.pid, token, born_by=began)
            assert old.pid in walked and new.pid not in walked
            assert members(new.pid, token, born_by=began) == {old.pid, new.pid}  # its root
        finally:
            new.kill()
            new.wait()
    finally:
        old.kill()
        old.wait()


def test_a_restart_the_moment_the_root_dies_survives_the_kill_that_is_still_walking() -> None:
    """The supervisor blocks on the trainer's end (a pidfd) and starts the next trainer,
    same marker, within the same clock tick as the kill's start: the kill, still walking
    /proc for the rest of the tree, must leave it alone. Repeated: it is a race."""
    import threading

    token = f"run-{uuid.uuid4()}"
    env = {**os.environ, **tree_marker(token)}
    sleep = ["sleep", "60"]
    for _ in range(20):
        old = subprocess.Popen(sleep, env=env, start_new_session=True)
        fd = os.pidfd_open(old.pid)
        killer = threading.Thread(target=kill_tree, args=(old.pid,), kwargs={"marker": token})
        killer.start()
        select.select([fd], [], [], 10)  # dead: restart at once, as the supervisor does
        os.close(fd)
        new = subprocess.Popen(sleep, env=env, start_new_session=True)
        try:
            killer.join(10)
            old.wait(10)
            assert new.poll() is None, "the kill took the run's next process too"
        finally:
            new.kill()
            new.wait()
