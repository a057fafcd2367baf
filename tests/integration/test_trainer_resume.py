"""Real subprocesses, real SIGKILL: a resumed run must equal an uninterrupted one bit for
bit — every step's float32 loss and the final parameters."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from crashdrill.trainer.checkpoint import ckpt_root, load_model_state
from crashdrill.trainer.checkpoint_pause import ENV as PAUSE_ENV
from crashdrill.trainer.checkpoint_pause import format_pause
from crashdrill.trainer.exit_codes import EXIT_USAGE
from crashdrill.trainer.records import read_records
from tests.conftest import crashdrill_cmd, run_cli

pytestmark = pytest.mark.slow
QUICK = ["run", "quick", "--jsonl", "--quiet"]


def _steps(run_dir: Path) -> list[dict]:
    recs, _ = read_records(run_dir / "records.jsonl")
    return [r for r in recs if r["kind"] == "step"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, int]]:
    """One uninterrupted quick run, shared by every test here."""
    ref = tmp_path_factory.mktemp("ref")
    run_cli(*QUICK, "--run-dir", str(ref), check=True)
    return ref, {r["step"]: r["loss_bits"] for r in _steps(ref)}


def _start(run_dir: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        crashdrill_cmd(*QUICK, "--run-dir", str(run_dir), *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _kill_at_step(proc: subprocess.Popen, step: int) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if json.loads(line)["step"] >= step:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def _kill_inside_checkpoint_write(proc: subprocess.Popen, run_dir: Path, step: int) -> None:
    tmp = ckpt_root(run_dir) / f"step-{step:08d}.tmp"
    deadline = time.monotonic() + 60
    while not tmp.is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, "never reached the write"
        time.sleep(0.005)
    time.sleep(0.05)  # payload written, manifest not yet: the pause holds it here
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("seed", [11, 12])
def test_sigkilled_twice_once_mid_checkpoint_resumes_bit_identical(tmp_path, seed, reference):
    ref_dir, ref = reference
    rng = random.Random(seed)
    run_dir = tmp_path / "crashed"
    write_step = rng.choice([100, 150, 200])
    proc = _start(run_dir, env={PAUSE_ENV: format_pause(write_step, 5)})
    _kill_inside_checkpoint_write(proc, run_dir, write_step)
    assert (ckpt_root(run_dir) / f"step-{write_step:08d}.tmp").is_dir()

    proc = _start(run_dir, "--require-checkpoint")
    _kill_at_step(proc, rng.randint(write_step + 5, 290))
    done = run_cli(*QUICK, "--run-dir", str(run_dir), "--require-checkpoint", check=True)
    assert "resumed at step" in done.stderr

    steps = _steps(run_dir)
    assert {r["segment"] for r in steps} == {0, 1, 2}
    mismatches = [r["step"] for r in steps if ref[r["step"]] != r["loss_bits"]]
    assert not mismatches, f"loss bits differ at steps {mismatches[:10]}"
    assert set(ref) == {r["step"] for r in steps}
    recs, _ = read_records(run_dir / "records.jsonl")
    resumes = [r for r in recs if r["kind"] == "resume"]
    assert resumes[0]["from_step"] == write_step - 50  # the torn write never counted
    a, b = load_model_state(ref_dir), load_model_state(run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_async_checkpoints_resume_bit_identical(tmp_path, reference):
    _, ref = reference
    run_dir = tmp_path / "async"
    proc = _start(run_dir, "--set", "ckpt_mode=async")
    _kill_at_step(proc, 130)
    run_cli(
        *QUICK,
        "--run-dir",
        str(run_dir),
        "--set",
        "ckpt_mode=async",
        "--require-checkpoint",
        check=True,
    )
    steps = _steps(run_dir)
    assert all(ref[r["step"]] == r["loss_bits"] for r in steps)
    assert max(r["segment"] for r in steps) == 1


def test_corrupt_latest_checkpoint_falls_back_to_previous_with_a_loud_event(tmp_path):
    run_dir = tmp_path / "r"
    run_cli(
        *QUICK, "--run-dir", str(run_dir), "--set", "steps=120", "--set", "warmup=10", check=True
    )
    latest = ckpt_root(run_dir) / "step-00000120" / "model.pt"
    data = bytearray(latest.read_bytes())
    data[len(data) // 3] ^= 0x40
    latest.write_bytes(bytes(data))
    again = run_cli(
        *QUICK, "--run-dir", str(run_dir), "--set", "steps=120", "--set", "warmup=10", check=True
    )
    assert "WARNING Checkpoint rejected: step-00000120: model.pt fails its sha256" in again.stderr
    assert "resumed at step 100" in again.stderr
    recs, _ = read_records(run_dir / "records.jsonl")
    assert any(r.get("code") == "ckpt_corrupt" and r["level"] == "warn" for r in recs)


def test_require_checkpoint_with_an_empty_dir_exits_3_and_trains_nothing(tmp_path):
    run_dir = tmp_path / "empty"
    proc = run_cli(*QUICK, "--run-dir", str(run_dir), "--require-checkpoint")
    assert proc.returncode == 3
    assert "no checkpoint found" in proc.stderr
    assert proc.stdout == ""
    assert not _steps(run_dir)
    assert not ckpt_root(run_dir).exists() or not any(ckpt_root(run_dir).iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "ctx=0"], "ctx = 0"),
        (["--set", "n_head=3"], "n_head = 3"),
        (["--set", "ckpt_every=0"], "ckpt_every = 0"),
        (["--set", "data=ftp://x"], "data = 'ftp://x'"),
    ],
)
def test_bad_config_exits_2_before_any_work(tmp_path, args, message):
    proc = run_cli("run", "quick", "--run-dir", str(tmp_path / "r"), *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_malformed_checkpoint_pause_exits_2_naming_it_before_any_step(tmp_path):
    run_dir = tmp_path / "r"
    proc = run_cli("run", "quick", "--run-dir", str(run_dir), env={PAUSE_ENV: "150:soon"})
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert f"{PAUSE_ENV}='150:soon'" in proc.stderr and "STEP:SECONDS" in proc.stderr
    assert not [r for r in read_records(run_dir / "records.jsonl")[0] if r["kind"] == "step"]


def test_run_dir_that_is_a_file_exits_2(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    proc = run_cli("run", "quick", "--run-dir", str(f))
    assert proc.returncode == 2 and "is a file" in proc.stderr


def test_checkpoint_from_a_different_config_is_refused_naming_the_fingerprint(tmp_path):
    run_dir = tmp_path / "r"
    run_cli(*QUICK, "--run-dir", str(run_dir), "--set", "steps=60", "--set", "warmup=5", check=True)
    proc = run_cli(
        *QUICK,
        "--run-dir",
        str(run_dir),
        "--set",
        "steps=60",
        "--set",
        "warmup=5",
        "--set",
        "seed=9",
    )
    assert proc.returncode == 2
    assert "fingerprint config" in proc.stderr


def test_weights_only_checkpoint_resumes_but_diverges_from_the_first_recomputed_step(
    tmp_path, reference
):
    _, ref = reference
    run_dir = tmp_path / "w"
    proc = _start(run_dir, "--set", "ckpt_state=weights")
    _kill_at_step(proc, 120)
    done = run_cli(
        *QUICK,
        "--run-dir",
        str(run_dir),
        "--set",
        "ckpt_state=weights",
        "--require-checkpoint",
        check=True,
    )
    assert "resumed at step 100" in done.stderr
    recomputed = [r for r in _steps(run_dir) if r["segment"] == 1]
    assert recomputed[0]["step"] == 101
    assert recomputed[0]["loss_bits"] != ref[101]
    recs, _ = read_records(run_dir / "records.jsonl")
    ev = [r["text"] for r in recs if r.get("code") == "resumed"]
    assert "AdamW state" in ev[0] and "RNG states" in ev[0] and "data position" in ev[0]


def _mirrored_steps(mirror: Path) -> list[int]:
    """Steps whose copy in the mirror is complete (its manifest, uploaded last, is there)."""
    return sorted(int(m.parent.name[5:]) for m in mirror.glob("step-*/MANIFEST.json"))


def test_a_headless_run_whose_disk_vanished_resumes_bit_identical_from_its_mirror(
    tmp_path, reference
):
    """`crashdrill run --mirror`: killed mid-run, its run dir deleted (a session's disk
    gone), run again on the same mirror: it pulls the newest verified copy and ends
    exactly as the run that was never interrupted."""
    ref_dir, ref = reference
    run_dir, mirror = tmp_path / "q", tmp_path / "mirror"
    proc = _start(run_dir, "--mirror", str(mirror))
    _kill_at_step(proc, 180)
    assert proc.stderr is not None and "copied to the mirror" in proc.stderr.read()
    copied = _mirrored_steps(mirror / "q")
    assert copied and copied[-1] >= 50, copied  # the copies run behind: any verified one
    shutil.rmtree(run_dir)

    done = run_cli(*QUICK, "--run-dir", str(run_dir), "--mirror", str(mirror), check=True)
    step = copied[-1]
    assert f"No checkpoint in {run_dir}; pulled step {step} from {mirror}" in done.stderr
    assert f"resumed at step {step} from" in done.stderr
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == list(range(step + 1, 301))
    assert all(ref[r["step"]] == r["loss_bits"] for r in steps)
    a, b = load_model_state(ref_dir), load_model_state(run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _mirrored_steps(mirror / "q")[-1] == 300, "the last checkpoint went to the mirror"


def test_a_mirror_url_of_no_known_kind_exits_2_naming_the_kinds(tmp_path):
    proc = run_cli(*QUICK, "--run-dir", str(tmp_path / "r"), "--mirror", "s3://bucket/x")
    assert proc.returncode == 2, proc.stderr
    assert "--mirror 's3://bucket/x'" in proc.stderr and "gs://" in proc.stderr
    assert not _steps(tmp_path / "r")
