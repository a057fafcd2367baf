"""`crashdrill verify --preset …` on the built-in trainer: real trainer processes, real
SIGKILL, one kill inside a checkpoint write. The trainer's teaching modes (checkpoints
that hold only the weights, checkpoints written in place) must fail with the right
diagnosis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from crashdrill.drill import verify
from crashdrill.drill.builtin import FORK_SERVER_PRELOAD, PresetTarget
from crashdrill.drill.engine import run_segment
from crashdrill.processes.forkserver import ForkServer, supported
from tests.conftest import crashdrill_cmd, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SMALL = """\
id = "drill-{name}"
title = "Drill test: {name}"
[run]
n_layer = 1
d_model = 32
n_head = 2
ctx = 32
batch = 8
steps = 60
warmup = 5
ckpt_every = 15
eval_every = 1000
probe_every = 1000
sample_every = 1000
threads = 1
{extra}
[knob]
name = "ckpt_every"
a = 15
b = 30
"""


def drill(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "report.json"
    proc = run_cli("verify", *args, "--json", str(out), timeout=280)
    assert out.is_file(), f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, json.loads(out.read_text()), proc.stdout


def small_preset(tmp_path: Path, name: str, extra: str = "") -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(SMALL.format(name=name, extra=extra))
    return str(path)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_quick_drill_is_bit_identical(tmp_path: Path, seed: int) -> None:
    rc, rep, out = drill(tmp_path, "--preset", "quick", "--kills", "2", "--seed", str(seed))
    assert rc == 0, out
    assert rep["verdict"] == "pass" and rep["seed"] == seed and rep["precision"]["kind"] == "bits"
    first, write = rep["kills"]
    assert 1 <= first["planned_step"] < 50  # before the first checkpoint after step 0
    assert write["in_checkpoint_write"] and write["step"] % 50 == 0
    assert [r["bit_identical"] for r in rep["resumes"]] == [True, True]
    assert rep["resumes"][0]["from_step"] == first["step"] // 50 * 50
    assert rep["resumes"][1]["from_step"] == write["step"] - 50  # the torn write never counts
    assert rep["resumes"][1]["recomputed"]["steps"] == 50
    assert all(r["latency_s"] > 0 for r in rep["resumes"])
    assert rep["final_state"]["method"] == "torch.equal" and rep["final_state"]["equal"]
    assert rep["final_state"]["items"] > 0
    assert "PASS" in out


def test_more_kills_on_a_small_preset_are_bit_identical(tmp_path: Path) -> None:
    rc, rep, out = drill(tmp_path, "--preset", small_preset(tmp_path, "ok"), "--kills", "3")
    assert rc == 0, out
    assert len(rep["resumes"]) == 3 and all(r["bit_identical"] for r in rep["resumes"])


def test_weights_only_checkpoints_are_missing_state(tmp_path: Path) -> None:
    preset = small_preset(tmp_path, "weights", 'ckpt_state = "weights"')
    rc, rep, out = drill(tmp_path, "--preset", preset, "--seed", "1")
    assert rc == 1, out
    codes = [d["code"] for d in rep["diagnosis"]]
    assert "state-missing" in codes and "final-state-differs" in codes


def test_in_place_checkpoints_killed_mid_write_are_torn(tmp_path: Path) -> None:
    preset = small_preset(tmp_path, "inplace", 'ckpt_write = "inplace"')
    rc, rep, out = drill(tmp_path, "--preset", preset, "--seed", "1")
    assert rc == 1, out
    assert [d["code"] for d in rep["diagnosis"]] == ["torn-checkpoint"]
    assert "latest/model.pt" in rep["diagnosis"][0]["text"]
    assert rep["resumes"][0]["bit_identical"]  # the kill before any write still resumes


def test_set_overrides_the_run_and_the_plan_follows_its_cadence(tmp_path: Path) -> None:
    preset = small_preset(tmp_path, "set")
    rc, rep, out = drill(tmp_path, "--preset", preset, "--set", "ckpt_every=20", "--seed", "1")
    assert rc == 0, out
    assert rep["target"]["set"] == ["ckpt_every=20"] and rep["target"]["ckpt_every"] == 20
    write = next(k for k in rep["kills"] if k["in_checkpoint_write"])
    assert write["step"] % 20 == 0  # the trainer wrote every 20 steps, as the plan said
    assert "set ckpt_every=20" in out


def test_a_bad_set_is_bad_usage_naming_the_setting() -> None:
    proc = run_cli("verify", "--preset", "quick", "--set", "ckpt_every=often", timeout=60)
    assert proc.returncode == 2 and "ckpt_every" in proc.stderr and "int" in proc.stderr
    proc = run_cli("verify", "--set", "steps=5", "--", "true", timeout=60)
    assert proc.returncode == 2 and "--set applies to --preset" in proc.stderr


def test_an_unknown_preset_is_bad_usage(tmp_path: Path) -> None:
    proc = run_cli("verify", "--preset", "no-such-lesson", timeout=60)
    assert proc.returncode == 2 and "known presets" in proc.stderr


needs_fork = pytest.mark.skipif(not supported(), reason="no fork server on this platform")


@needs_fork
def test_a_forked_trainer_computes_the_bits_of_an_execd_one(tmp_path: Path) -> None:
    preset = small_preset(tmp_path, "bits")
    execd = run_segment(PresetTarget(preset), tmp_path / "exec", 0, None)
    with ForkServer(FORK_SERVER_PRELOAD) as server:
        forked = run_segment(PresetTarget(preset, fork_server=server), tmp_path / "fork", 0, None)
    assert execd.exit_code == forked.exit_code == 0
    assert len(forked.points) == 60
    assert [p.bits for p in forked.points] == [p.bits for p in execd.points]


def already_running() -> set[int]:
    """Our descendants (other tests may leave shared servers running, e.g. PostgreSQL)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


@needs_fork
def test_the_drill_leaves_no_process_behind(tmp_path: Path) -> None:
    before = already_running()
    result = verify.verify_preset(small_preset(tmp_path, "orphans"), kills=2, seed=3)
    assert result.analysis.exit_code == 0
    assert result.target.describe()["starts"] == "fork-server"
    assert result.evidence.final_params is not None and result.evidence.final_params.equal
    assert already_running() == before


@needs_fork
def test_a_fork_server_that_cannot_start_falls_back_to_exec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(verify, "FORK_SERVER_PRELOAD", ["crashdrill_no_such_module"])
    before = already_running()
    work = tmp_path / "work"
    result = verify.verify_preset(small_preset(tmp_path, "fallback"), seed=1, work_dir=work)
    assert result.analysis.exit_code == 0
    assert result.target.describe()["starts"] == "exec"
    assert "every trainer process started with exec" in capsys.readouterr().err
    assert sorted(p.name for p in work.iterdir()) == ["crashed", "reference"]
    assert already_running() == before


def test_no_fork_server_starts_every_process_with_exec(tmp_path: Path) -> None:
    preset = small_preset(tmp_path, "exec")
    rc, rep, out = drill(tmp_path, "--preset", preset, "--seed", "2", "--no-fork-server")
    assert rc == 0, out
    assert rep["target"]["starts"] == "exec"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@needs_fork
def test_an_interrupt_of_a_preset_drill_kills_the_fork_server_and_its_trainers(
    tmp_path: Path,
) -> None:
    report = tmp_path / "report.json"
    cmd = crashdrill_cmd("verify", "--preset", small_preset(tmp_path, "sigint"), "--kills", "2",
                         "--seed", "1", "--json", str(report))  # fmt: skip
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: dict[int, str] = {}  # every descendant of the drill: pid → its command line
    deadline = time.monotonic() + 120
    while not (any("forkserver" in c for c in seen.values())
               and any(" run " in c for c in seen.values())):  # fmt: skip
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        for p in psutil.Process(proc.pid).children(recursive=True):
            with_cmdline = p.as_dict(["cmdline"])["cmdline"] or []
            seen.setdefault(p.pid, " ".join(with_cmdline))
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, f"{out}\n{err}"
    data = json.loads(report.read_text())
    assert data["verdict"] == "incomplete" and data["drill"]["interrupted_by"] == "SIGINT"
    left = [f"{pid}: {c}" for pid, c in seen.items() if _alive(pid)]
    assert left == [], left  # the fork server and every trainer it forked
    assert list(tmp_path.glob("crashdrill-verify-*")) == []
