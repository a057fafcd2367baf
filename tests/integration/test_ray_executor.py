"""The supervisor's policy on a Ray cluster (127.0.0.1 only): real nodes, real trainers;
a node removed under a run. One cluster for the module (a head that takes no runs, two
worker nodes). The lab on a cluster, and crash tests there, are test_ray_lab.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ray_cluster

ray = pytest.importorskip("ray")

from crashdrill.workers.ray_executor import RayExecutor  # noqa: E402
from crashdrill.workers.run_dir import RunDir  # noqa: E402
from crashdrill.workers.supervisor import Change, Launch, Supervisor  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    c = ray_cluster.start_cluster(nodes=2)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture
def executor(cluster: Any, tmp_path: Path) -> RayExecutor:
    return RayExecutor.connect(cluster.address, mirror=str(tmp_path / "mirror"))


class Changes:
    def __init__(self) -> None:
        self.items: list[Change] = []
        self.cond = threading.Condition()

    def __call__(self, change: Change) -> None:
        with self.cond:
            self.items.append(change)
            self.cond.notify_all()

    def wait_for_end(self, timeout: float = 180) -> Change:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not any(c.state in ("finished", "failed") for c in self.items):
                left = deadline - time.monotonic()
                assert left > 0, [c.state for c in self.items]
                self.cond.wait(left)
            return self.items[-1]


def records(rd: RunDir) -> list[dict[str, Any]]:
    return [json.loads(line) for line in rd.records.read_text().splitlines() if line.strip()]


def wait_until(what: str, ok: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def last_step(rd: RunDir) -> int:
    return max((r["step"] for r in records(rd) if r["kind"] == "step"), default=-1)


def assert_each_resume_bit_identical(rd: RunDir) -> int:
    """Every step a later segment recomputed has the loss bits of the first time; each
    (segment, step) once (nothing shipped twice). Returns how many steps were compared."""
    seen: dict[tuple[int, int], int] = {}
    first: dict[int, int] = {}
    compared = 0
    for r in records(rd):
        if r["kind"] != "step":
            continue
        key = (r["segment"], r["step"])
        assert key not in seen, f"step record {key} twice"
        seen[key] = r["loss_bits"]
        if r["step"] in first:
            assert r["loss_bits"] == first[r["step"]], f"step {r['step']} differs"
            compared += 1
        else:
            first[r["step"]] = r["loss_bits"]
    return compared


def supervise(tmp_path: Path, executor: RayExecutor) -> tuple[Supervisor, Changes]:
    changes = Changes()
    launch = Launch(tmp_path / "runs" / tmp_path.name, "quick", "A")
    sup = Supervisor(launch, changes, mirror=executor.mirror, executor=executor)
    return sup, changes


def test_a_run_whose_node_is_removed_resumes_on_the_other_from_the_mirror(
    tmp_path: Path, executor: RayExecutor, cluster: Any
) -> None:
    sup, changes = supervise(tmp_path, executor)
    sup.start()
    mirrored = tmp_path / "mirror" / tmp_path.name
    wait_until(
        "a mirrored checkpoint",
        lambda: any(mirrored.glob("step-*/MANIFEST.json")) and last_step(sup.run_dir) >= 60,
    )
    lost = executor.host(sup.launch.run_dir)
    assert lost is not None
    cluster.remove_node(ray_cluster.node_of(cluster, lost.node_id))
    end = changes.wait_for_end()
    assert end.state == "finished", end.text
    event = next(r for r in records(sup.run_dir) if r.get("code") == "lost_host")
    new = executor.host(sup.launch.run_dir)
    assert new is not None and new.node_id != lost.node_id
    n, m = event["at_step"], event["resume_from"]
    assert event["text"] == (
        f"Lost host {lost.name} at step {n}; resumed on host {new.name} from the mirror at"
        f" step {m} — {n - m} steps recomputed."
    )
    assert assert_each_resume_bit_identical(sup.run_dir) >= n - m > 0
    assert not (sup.launch.run_dir / "ckpt").exists()  # the server's copy: records only
