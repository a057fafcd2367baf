"""The fork server on tiny modules (no torch preloaded, so each server starts in a blink):
real forked processes, real SIGKILL, exit statuses relayed by the server, and no process
left behind when the server closes or dies."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from crashdrill.drill.command import CommandTarget
from crashdrill.drill.engine import run_segment
from crashdrill.drill.final_state import compare_final_params_forked
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.target import Child
from crashdrill.drill.trace import LossParser
from crashdrill.drill.verify import fork_server_wanted
from crashdrill.processes.forkserver import ForkServer, ForkServerError, supported

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not supported(), reason="no fork server on this platform"),
]

WHOAMI = """
import json, os, sys
print(json.dumps({
    "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "ppid": os.getppid(),
    "argv": sys.argv[1:], "env": os.environ.get("FORK_TEST"), "cwd": os.getcwd(),
    "stdin": sys.stdin.read(), "name": __name__,
}))
print("to stderr", file=sys.stderr)
"""

STEPS = """
import json, sys, time
for step in range(1, 2001):
    print(json.dumps({"step": step, "loss": 1.0 / step}), flush=True)
    time.sleep(0.005)
"""

SLEEPER = """
import subprocess, sys, time
kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(kid.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def server() -> Iterator[ForkServer]:
    with ForkServer(preload=["json"]) as s:
        yield s


def module(tmp_path: Path, name: str, code: str) -> list[str]:
    (tmp_path / f"{name}.py").write_text(code)
    return [sys.executable, "-m", name]


def finish(child: Child) -> tuple[bytes, bytes, int]:
    out, err = child.stdout.read(), child.stderr.read()
    child.stdout.close()
    child.stderr.close()
    return out, err, child.wait()


def gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def test_a_forked_child_runs_the_module_as_python_dash_m_would(
    server: ForkServer, tmp_path: Path
) -> None:
    argv = [*module(tmp_path, "whoami", WHOAMI), "--x", "1"]
    env = {**os.environ, "FORK_TEST": "yes"}
    child = server.spawn_piped(argv, env, str(tmp_path))
    out, err, code = finish(child)
    seen = json.loads(out)
    assert code == 0 and err.decode() == "to stderr\n"
    assert seen["pid"] == child.pid != server.pid and seen["ppid"] == server.pid
    assert seen["pgid"] == seen["sid"] == child.pid  # its own session and process group
    assert seen["argv"] == ["--x", "1"] and seen["name"] == "__main__"
    assert seen["env"] == "yes" and seen["cwd"] == str(tmp_path) and seen["stdin"] == ""
    assert child.cpu_s is not None and child.cpu_s >= 0


def test_the_environment_is_the_requested_one_not_the_servers(
    server: ForkServer, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FORK_TEST"}
    child = server.spawn_piped(module(tmp_path, "whoami", WHOAMI), env, str(tmp_path))
    assert json.loads(finish(child)[0])["env"] is None


def test_exit_codes_and_tracebacks_are_relayed(server: ForkServer, tmp_path: Path) -> None:
    child = server.spawn_piped(module(tmp_path, "seven", "raise SystemExit(7)"), {}, str(tmp_path))
    assert finish(child)[2] == 7
    child = server.spawn_piped(module(tmp_path, "boom", "1 / 0"), {}, str(tmp_path))
    _, err, code = finish(child)
    assert code == 1 and b"ZeroDivisionError" in err


LATE_WORK = """
import atexit, sys, threading, time
def later():
    time.sleep(0.2)
    print("thread done", flush=True)
threading.Thread(target=later).start()
atexit.register(lambda: print("atexit ran"))
class Freed:
    def __del__(self):
        print("freed at teardown")
kept = Freed()
sys.stdout.write("buffered, never flushed by the module")
sys.exit(sys.argv[1] if sys.argv[1:] else None)
"""


def test_a_child_ends_as_the_interpreter_would_without_its_teardown(
    server: ForkServer, tmp_path: Path
) -> None:
    # The server ends a child with os._exit (no freeing of torch's objects): threads are
    # joined, atexit handlers run and buffered output is flushed first, as at a normal end.
    out, err, code = finish(
        server.spawn_piped(module(tmp_path, "late", LATE_WORK), {}, str(tmp_path))
    )
    assert code == 0 and err == b""
    assert out.decode().splitlines() == [
        "buffered, never flushed by the modulethread done",
        "atexit ran",
    ]  # and no "freed at teardown": the objects die with the process, unfreed
    argv = [*module(tmp_path, "late", LATE_WORK), "the reason"]
    out, err, code = finish(server.spawn_piped(argv, {}, str(tmp_path)))
    assert code == 1 and err == b"the reason\n" and b"atexit ran" in out


def test_sigkill_is_reported_as_minus_9_and_poll_does_not_block(
    server: ForkServer, tmp_path: Path
) -> None:
    child = server.spawn_piped(module(tmp_path, "sleeper", SLEEPER), {**os.environ}, str(tmp_path))
    grandchild = int(child.stdout.readline())
    assert child.poll() is None
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL and child.poll() == -9
    assert gone(child.pid) and gone(grandchild)
    child.stdout.close()
    child.stderr.close()


def test_closing_the_server_kills_what_it_still_runs(tmp_path: Path) -> None:
    s = ForkServer(preload=[])
    child = s.spawn_piped(module(tmp_path, "sleeper", SLEEPER), {**os.environ}, str(tmp_path))
    grandchild = int(child.stdout.readline())
    s.close()  # the drill is done (or dead): nothing it started may keep running
    assert gone(s.pid) and gone(child.pid) and gone(grandchild)
    assert child.wait() == -signal.SIGKILL
    child.stdout.close()
    child.stderr.close()


def test_a_server_that_dies_raises_and_takes_no_process_with_it(tmp_path: Path) -> None:
    s = ForkServer(preload=[])
    child = s.spawn_piped(module(tmp_path, "sleeper", SLEEPER), {**os.environ}, str(tmp_path))
    child.stdout.readline()
    os.kill(s.pid, signal.SIGKILL)
    with pytest.raises(ForkServerError, match="before reporting"):
        child.wait()
    with pytest.raises(ForkServerError, match="before reporting"):
        child.poll()  # and again: the status will never come
    assert gone(child.pid)  # the handle killed the orphan
    with pytest.raises(ForkServerError, match="exit -9"):
        s.spawn_piped(module(tmp_path, "whoami", WHOAMI), {}, str(tmp_path))
    s.close()
    child.stdout.close()
    child.stderr.close()


def test_a_server_whose_imports_fail_says_why(tmp_path: Path) -> None:
    s = ForkServer(preload=["crashdrill_no_such_module"])
    with s, pytest.raises(ForkServerError, match="crashdrill_no_such_module"):
        s.spawn_piped(module(tmp_path, "whoami", WHOAMI), {}, str(tmp_path))


def test_only_python_dash_m_commands_are_forked(server: ForkServer) -> None:
    with pytest.raises(ValueError, match="-m MODULE"):
        server.spawn(["/bin/echo", "hi"], {}, None)


def test_the_engine_kills_a_forked_process_at_the_planned_step(
    server: ForkServer, tmp_path: Path
) -> None:
    class Forked(CommandTarget):
        def start(self, argv: list[str], env: dict[str, str], cwd: str | None) -> Child:
            return server.spawn_piped(argv, env, cwd)

    argv = module(tmp_path, "steps", STEPS)
    target = Forked(argv, parser=LossParser(), timeout=20, cwd=str(tmp_path))
    seg = run_segment(target, tmp_path / "ckpt", 0, KillPoint(10))
    assert seg.killed and not seg.hung and seg.exit_code == -9
    assert seg.last_step is not None and 10 <= seg.last_step < 100
    assert seg.cpu_s is not None


def test_the_fork_server_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRASHDRILL_FORK_SERVER", raising=False)
    assert fork_server_wanted() and not fork_server_wanted(False)
    monkeypatch.setenv("CRASHDRILL_FORK_SERVER", "0")
    assert not fork_server_wanted() and fork_server_wanted(True)


def test_global_random_streams_are_fresh_in_every_child(tmp_path: Path) -> None:
    code = "import random, numpy; print(random.random(), numpy.random.random())"
    with ForkServer(preload=["numpy.random"]) as s:
        argv = module(tmp_path, "draw", code)
        draws = [finish(s.spawn_piped(argv, {**os.environ}, str(tmp_path)))[0] for _ in range(2)]
    assert draws[0] != draws[1]
    first = draws[0].split()
    assert all(x not in draws[1].split() for x in first)


def test_the_final_weights_are_compared_in_a_forked_process(
    server: ForkServer, tmp_path: Path
) -> None:
    final = compare_final_params_forked(
        server, tmp_path / "ref", tmp_path / "crashed", {**os.environ}, 60
    )
    assert not final.equal and final.method == "torch.equal"
    assert final.error is not None and "could not load the final weights" in final.error


def test_a_drill_killed_by_sigkill_leaves_no_process_behind(tmp_path: Path) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    owner = f"""
import os, sys
from crashdrill.processes.forkserver import ForkServer
s = ForkServer(preload=[])
child = s.spawn_piped([sys.executable, "-m", "sleeper"], dict(os.environ), {str(tmp_path)!r})
grandchild = child.stdout.readline().decode().strip()
print(s.pid, child.pid, grandchild, flush=True)
sys.stdin.read()  # until the test kills it
"""
    drill = subprocess.Popen(
        [sys.executable, "-c", owner], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert drill.stdout is not None
    pids = [int(x) for x in drill.stdout.readline().split()]
    assert len(pids) == 3 and not any(gone(p, within=0.1) for p in pids)
    drill.kill()  # no chance to clean up: the server sees its control socket close
    drill.wait()
    assert all(gone(p) for p in pids)  # the sleepers print nothing: no broken pipe kills them
    drill.stdout.close()
    assert drill.stdin is not None
    drill.stdin.close()


def test_a_child_is_waited_on_when_this_process_holds_over_1024_descriptors(
    server: ForkServer, tmp_path: Path
) -> None:
    """The lab server holds connections by the thousand, so a restart's status socket is
    numbered past select()'s FD_SETSIZE: waiting on it must not raise (issue #24)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard open-files limit is {hard}: no room past 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.dup(0) for _ in range(1100)]  # the next descriptors are numbered past 1024
    try:
        child = server.spawn_piped(
            module(tmp_path, "whoami", WHOAMI), {**os.environ}, str(tmp_path)
        )
        out, _, code = finish(child)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert code == 0 and json.loads(out)["pid"] == child.pid
