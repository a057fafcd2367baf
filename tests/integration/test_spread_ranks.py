"""A 2-rank group spread over two "nodes" on this machine: one launcher per node, each with
a run dir of its own (a disk of its own), told its place by torchrun's PET_* names, as
the Ray executor starts a spread run. It trains exactly what one machine's group trains,
every node holds the whole checkpoint, and a lost node's group resumes bit-identically."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from crashdrill.trainer.checkpoint_layout import checkpoints
from crashdrill.trainer.exit_codes import EXIT_USAGE
from tests.conftest import crashdrill_cmd, run_cli
from tests.integration.test_ranks import TWO_RANKS, _steps  # the same group, packed there

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node_env(node_rank: int, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "PET_NNODES": "2",
        "PET_NODE_RANK": str(node_rank),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
    }


def _start_nodes(dirs: list[Path], *more: str) -> list[subprocess.Popen[bytes]]:
    port = _free_port()
    return [
        subprocess.Popen(
            crashdrill_cmd(*TWO_RANKS, "--run-dir", str(d), *more),
            env=_node_env(k, port),
            stdout=subprocess.DEVNULL,
            stderr=open(d.parent / f"{d.name}.stderr", "ab"),
            start_new_session=True,
        )
        for k, d in enumerate(dirs)
    ]


def _wait(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    return [p.wait(timeout=timeout) for p in procs]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same group on one machine, uninterrupted."""
    ref = tmp_path_factory.mktemp("packed")
    run_cli(*TWO_RANKS, "--run-dir", str(ref), check=True, timeout=300)
    return ref


def test_a_spread_group_trains_what_a_packed_one_does_and_each_node_holds_every_file(
    packed: Path, tmp_path: Path
) -> None:
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    assert _wait(_start_nodes(dirs), 300) == [0, 0]
    ref, got = _steps(packed), _steps(dirs[0])
    assert sorted(got) == sorted(ref)
    for key, rec in got.items():
        for field in ("loss_bits", "rank_loss_bits", "grad_norm"):
            assert rec[field] == ref[key][field], (key, field)
    assert not (dirs[1] / "records.jsonl").exists() or not _steps(dirs[1])  # rank 0's only
    for d in dirs:  # verified on each node's own disk: every file, its sha256
        kept = list(checkpoints(d))
        assert [c.step for c in kept] == [30, 20]
        assert set(kept[0].manifest["rank_files"]) == {"0", "1"}
        assert {p.name for p in kept[0].path.iterdir()} == set(kept[0].manifest["files"]) | {
            "MANIFEST.json"
        }


def test_a_lost_node_ends_the_group_and_both_nodes_resume_bit_identically(
    packed: Path, tmp_path: Path
) -> None:
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    procs = _start_nodes(dirs)
    deadline = time.monotonic() + 240
    while not any(c.step >= 10 for c in checkpoints(dirs[1], check="manifest")):
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.1)
    os.killpg(procs[1].pid, signal.SIGKILL)  # node 1 is gone: its launcher and its rank
    lost = time.monotonic()
    code = procs[0].wait(timeout=60)  # rank 0's collective sees the connection close
    ended_s = time.monotonic() - lost
    procs[1].wait()
    assert code != 0 and ended_s < 20, (code, ended_s)
    codes = _wait(_start_nodes(dirs, "--require-checkpoint"), 300)
    assert codes == [0, 0]
    ref, resumed = _steps(packed), _steps(dirs[0])
    recomputed = [s for seg, s in resumed if seg == 1]
    assert recomputed and min(recomputed) >= 11 and max(recomputed) == 30
    for step in recomputed:
        for field in ("loss_bits", "rank_loss_bits", "grad_norm", "lr", "tokens"):
            assert resumed[(1, step)][field] == ref[(0, step)][field], (step, field)


def test_a_node_told_a_place_that_cannot_be_exits_2_naming_the_variable(tmp_path: Path) -> None:
    env = {"PET_NNODES": "3", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "127.0.0.1",
           "PET_MASTER_PORT": "29500"}  # fmt: skip
    out = run_cli(*TWO_RANKS, "--run-dir", str(tmp_path / "r"), env=env, timeout=120)
    assert out.returncode == EXIT_USAGE
    assert "PET_NNODES = '3': a whole number in [1, 2] for a group of 2 ranks" in out.stderr
