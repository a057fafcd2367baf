"""The supervisor's policy above an executor: the local one, and a host that vanishes."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from crashdrill.workers.executor import ExecutorError, Host, StartCancelled, Trainer
from crashdrill.workers.launch import Launch
from crashdrill.workers.local_executor import LocalExecutor
from crashdrill.workers.supervisor import Supervisor
from tests.support.lab import STAND_IN
from tests.support.supervising import Changes, records, wait_for_step

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "40")
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEP_S", "0.02")
    monkeypatch.setenv("CRASHDRILL_STANDIN_CKPT_EVERY", "10")


class VanishingHost(LocalExecutor):
    """The local executor on two pretend hosts: `vanish()` SIGKILLs the trainer the way a
    machine that goes away does, and its next wait reports the host lost."""

    def __init__(self) -> None:
        super().__init__()
        self.current = Host("n1", "node-one")
        self.trainer: Trainer | None = None
        self.relocated = 0

    def start(self, launch: Launch, env: Mapping[str, str], *, require_checkpoint: bool) -> Trainer:
        self.trainer = super().start(launch, env, require_checkpoint=require_checkpoint)
        return self.trainer

    def adopt(self, run_dir: Path, pids: Iterable[int | None]) -> Trainer | None:
        return None

    def host(self, run_dir: Path) -> Host | None:
        return self.current

    def relocate(self, run_dir: Path) -> Host | None:
        self.relocated += 1
        self.current = Host("n2", "node-two")
        return self.current

    def vanish(self) -> None:
        assert self.trainer is not None
        self.trainer.lost_host = self.current
        self.trainer.signal(signal.SIGKILL)


def supervised(tmp_path: Path, executor: LocalExecutor) -> tuple[Supervisor, Changes]:
    """A stand-in run of quick, label A, supervised on `executor` (not started)."""
    changes = Changes()
    launch = Launch(tmp_path / "run", "quick", "A", command=STAND_IN)
    return Supervisor(launch, changes, poll_s=0.05, executor=executor), changes


def test_crash_mode_host_without_a_cluster_restarts_here_like_wipe_and_says_so(
    tmp_path: Path,
) -> None:
    changes = Changes()
    sup = Supervisor(Launch(tmp_path / "run", "quick", "A", command=STAND_IN), changes)
    sup.start()
    wait_for_step(sup.run_dir, 15)
    sup.crash("host")
    changes.wait_for("failed")  # the checkpoints went with the "disk": --require-checkpoint
    crash = next(r for r in records(sup.run_dir) if r.get("code") == "crash")
    text = str(crash["text"])
    assert "the run's checkpoint directory was deleted" in text
    assert "There is no other machine to move to" in text
    assert crash["crash_mode"] == "host"
    assert changes.items[-1].exit_code == 3


def test_a_lost_host_restarts_the_run_on_another_one_with_the_event_line(
    tmp_path: Path,
) -> None:
    executor = VanishingHost()
    sup, changes = supervised(tmp_path, executor)
    sup.start()
    wait_for_step(sup.run_dir, 25)
    executor.vanish()
    changes.wait_for("finished")
    assert changes.states() == ["running", "restarting", "running", "finished"]
    assert executor.relocated == 1
    recs = records(sup.run_dir)
    lost = next(r for r in recs if r.get("code") == "lost_host")
    n, m = lost["at_step"], lost["resume_from"]
    assert isinstance(n, int) and isinstance(m, int) and m <= n
    assert lost["text"] == (
        f"Lost host node-one at step {n}; restarting on host node-two from its disk's checkpoint"
        f" at step {m}, {n - m} steps back."
    )
    assert lost["lost_host"] == {"node_id": "n1", "name": "node-one"}
    assert lost["host"] == {"node_id": "n2", "name": "node-two"}
    resume = next(r for r in recs if r["kind"] == "resume")
    assert resume["segment"] == 1 and resume["from_step"] == m
    # Where the seconds went: noticed, then placed, then the event (benchmarks/ray_cluster.py).
    assert lost["noticed_t"] <= lost["placed_t"] <= lost["t"]


class NoRoomForTheRanks(VanishingHost):
    """A cluster whose live nodes cannot hold the run's ranks (RayExecutor.relocate)."""

    def relocate(self, run_dir: Path) -> Host | None:
        self.relocated += 1
        raise ExecutorError("no node left has 2 CPUs (2 ranks of 1 CPU) for its 2 ranks")


def test_a_lost_host_with_no_node_left_for_its_ranks_fails_at_once_saying_why(
    tmp_path: Path,
) -> None:
    executor = NoRoomForTheRanks()
    sup, changes = supervised(tmp_path, executor)
    sup.start()
    wait_for_step(sup.run_dir, 25)
    executor.vanish()
    changes.wait_for("failed")
    assert changes.states() == ["running", "failed"]
    failed = next(r for r in records(sup.run_dir) if r.get("code") == "failed")
    assert str(failed["text"]).startswith("Lost host node-one at step ")
    assert str(failed["text"]).endswith(
        ": no node left has 2 CPUs (2 ranks of 1 CPU) for its 2 ranks"
    )


def test_a_preset_kept_in_the_run_dir_is_named_where_the_run_dir_is_on_a_node(
    tmp_path: Path,
) -> None:
    """A frozen preset (a student's settings) lives in the run dir: a node trains its own
    copy; a built-in preset name or a file elsewhere is passed as it is."""
    server_dir, node_dir = tmp_path / "server" / "r1", tmp_path / "node" / "r1"
    frozen = Launch(run_dir=server_dir, preset=str(server_dir / "preset.toml"), label="A")
    here = frozen.argv(require_checkpoint=False)
    assert here[-5:] == [
        str(server_dir / "preset.toml"),
        "--run-dir",
        str(server_dir),
        "--label",
        "A",
    ]
    on_node = frozen.argv(require_checkpoint=True, run_dir=node_dir)
    assert on_node[-6:-1] == [
        str(node_dir / "preset.toml"),
        "--run-dir",
        str(node_dir),
        "--label",
        "A",
    ]
    assert on_node[-1] == "--require-checkpoint"
    for preset in ("quick", str(tmp_path / "presets" / "mine.toml")):
        built_in = Launch(run_dir=server_dir, preset=preset, label="B")
        assert built_in.argv(require_checkpoint=False, run_dir=node_dir)[-5] == preset


class WaitsForANode(LocalExecutor):
    """A start that waits for a node no cluster has, until the run is cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()
        self.cancelled = threading.Event()

    def start(self, launch: Launch, env: Mapping[str, str], *, require_checkpoint: bool) -> Trainer:
        self.waiting.set()
        if not self.cancelled.wait(20):
            raise AssertionError("the Stop never reached the waiting start")
        raise StartCancelled(f"run {launch.run_dir.name} was stopped while it waited for a node")

    def cancel(self, run_dir: Path) -> None:
        self.cancelled.set()


def test_a_stop_while_the_start_waits_for_a_node_ends_the_run_stopped_at_once(
    tmp_path: Path,
) -> None:
    executor = WaitsForANode()
    sup, changes = supervised(tmp_path, executor)
    starting = threading.Thread(target=sup.start)
    starting.start()
    assert executor.waiting.wait(10)
    t0 = time.monotonic()
    sup.stop("the instructor")
    stopped = changes.wait_for("stopped", timeout=10)
    starting.join(10)
    assert time.monotonic() - t0 < 5
    assert "the instructor" in stopped.text
    assert "failed" not in changes.states() and "running" not in changes.states()
