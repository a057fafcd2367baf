"""`crashdrill verify` on a research-style script (tests/integration/research/
research_tb_resume.py): a new TensorBoard event file at every start, a CSV log and samples
beside `model.pt`, which is saved only when the test loss improves; `--resume` crashes
when there is none. The drill must end by itself, read only `model.pt` as a checkpoint,
and leave nothing behind when it is stopped (issue 33 §1–2). Its `step N | loss X` lines
are read without --loss-regex. Real processes, real kills."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SCRIPT = Path(__file__).resolve().parent / "research" / "research_tb_resume.py"


def drill(
    tmp_path: Path, *opts: str, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    script = tmp_path / SCRIPT.name  # a copy of our own: its processes are findable by path
    shutil.copy(SCRIPT, script)
    cmd = [sys.executable, "-m", "crashdrill.drill", "--json", str(tmp_path / "report.json")]
    cmd += [*opts, "--", sys.executable, str(script), *args]
    full_env = {**os.environ, "TMPDIR": str(tmp_path), **(env or {})}
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env
    )


def finish(tmp_path: Path, proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    out, err = proc.communicate(timeout=150)
    report = tmp_path / "report.json"
    assert report.is_file(), f"no report; exit {proc.returncode}\n{out}\n{err}"
    return proc.returncode, json.loads(report.read_text()), out


def leftovers(tmp_path: Path) -> tuple[list[Path], list[int]]:
    """Temp dirs the drill left, and processes of the script still alive."""
    dirs = list(tmp_path.glob("crashdrill-verify-*"))
    mine = str(tmp_path / SCRIPT.name)
    procs = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmdline = p.info["cmdline"] or []
        if mine in cmdline and p.info["status"] != psutil.STATUS_ZOMBIE:
            procs.append(p.pid)
    return dirs, procs


def test_a_resume_flag_with_nothing_to_resume_ends_the_drill_quoting_the_error(
    tmp_path: Path,
) -> None:
    t0 = time.monotonic()
    proc = drill(tmp_path, "--kills", "2", "--seed", "1", "--resume-args=--resume",
                 "--resume-args-always")  # fmt: skip
    code, data, out = finish(tmp_path, proc)
    assert time.monotonic() - t0 < 90  # ends by itself: the loop was 185 restarts
    assert code == 1 and data["verdict"] == "fail", out
    crashed = [f for f in data["diagnosis"] if f["code"] == "crashed"]
    assert crashed and "FileNotFoundError: --resume: no model.pt" in crashed[0]["text"], out
    assert data["drill"]["restarts"] == 1 and data["drill"]["chain_end"] == "no-progress"
    assert "no restart after process 1: it crashed with no checkpoint advanced" in out
    ignored = {f["path"]: f["why"] for f in data["checkpoint_files"]["ignored"]}
    events = [p for p in ignored if p.startswith("events.out.tfevents.")]
    assert len(events) >= 3 and all(ignored[p] == "a TensorBoard event log" for p in events)
    assert ignored["log.csv"] == "a log or text file (.csv)"
    assert [f["path"] for f in data["checkpoint_files"]["taken"]] == ["model.pt"]
    assert leftovers(tmp_path) == ([], [])


def test_kills_after_model_pt_exists_blame_neither_the_event_log_nor_a_fresh_start(
    tmp_path: Path,
) -> None:
    proc = drill(tmp_path, "--kills", "2", "--seed", "1", "--resume-args=--resume")
    code, data, out = finish(tmp_path, proc)
    assert code == 1, out  # the script keeps no momentum or batch order: a true failure
    texts = " ".join(f["text"] + " ".join(f["evidence"]) for f in data["diagnosis"])
    assert "tfevents" not in texts and "tfevents" not in " ".join(
        e for k in data["kills"] for e in k["evidence"]
    )
    codes = {f["code"] for f in data["diagnosis"]}
    assert not codes & {"silent-fresh-start", "torn-checkpoint", "never-checkpoints"}, out
    loaded = [r for r in data["resumes"] if r["checkpoint_existed"]]
    assert loaded and all(r["from_step"] is not None for r in loaded), out  # it loaded model.pt
    assert all(not k["in_checkpoint_write"] or k["evidence"] for k in data["kills"])
    assert [f["path"] for f in data["checkpoint_files"]["taken"]] == ["model.pt"]
    assert data["target"]["loss_lines"] == "step-bar", out  # no --loss-regex needed
    # No --deadline: the default, from the reference run's time, never under 120 s.
    assert data["drill"]["deadline_default"] is True and data["drill"]["deadline_s"] >= 120
    assert "(default, from the reference run's time)" in out


def test_a_weights_only_resume_is_named_by_the_optimizer_and_its_restarted_step_counter(
    tmp_path: Path,
) -> None:
    proc = drill(tmp_path, "--kills", "2", "--seed", "1", "--resume-args=--resume",
                 args=("--weights-only",))  # fmt: skip
    code, data, out = finish(tmp_path, proc)
    assert code == 1, out
    codes = [f["code"] for f in data["diagnosis"] if f["fails"]]
    assert "steps-restarted" in codes and "silent-fresh-start" not in codes, out
    text = next(f["text"] for f in data["diagnosis"] if f["code"] == "steps-restarted")
    assert "it loaded the weights and started counting steps from 1 again" in text, text
    lacks = text.split("it lacks ", 1)[1]
    assert lacks.startswith("optimizer state"), text  # the optimizer first


def test_the_checkpoint_glob_decides_what_is_a_checkpoint(tmp_path: Path) -> None:
    # Only the CSV log counts now: it changes at every step, so each kill finds "a
    # checkpoint" newer than the start, and the resume args go to every restart.
    proc = drill(tmp_path, "--kills", "1", "--seed", "1", "--resume-args=--resume",
                 "--checkpoint-glob", "log.csv")  # fmt: skip
    _, data, out = finish(tmp_path, proc)
    files = data["checkpoint_files"]
    assert files["globs"] == ["log.csv"] and [f["path"] for f in files["taken"]] == ["log.csv"]
    assert {f["why"] for f in files["ignored"]} == {"matches no --checkpoint-glob"}
    assert "model.pt" in {f["path"] for f in files["ignored"]}
    assert data["resumes"][0]["resume_args"] is True, out


def test_the_restart_cap_stops_the_drill_and_is_reported(tmp_path: Path) -> None:
    proc = drill(tmp_path, "--kills", "2", "--seed", "1", "--resume-args=--resume",
                 "--max-restarts", "1")  # fmt: skip
    code, data, out = finish(tmp_path, proc)
    assert code == 1 and data["drill"]["max_restarts"] == 1 and data["drill"]["restarts"] == 1
    assert any(f["code"] == "restart-cap" for f in data["diagnosis"]), out
    assert "drill: 1 restart(s) of at most 1" in out


def test_the_whole_drill_s_deadline_ends_it_incomplete(tmp_path: Path) -> None:
    slow = {"RESEARCH_STEP_SECONDS": "0.1"}  # 8 s a run: the deadline comes first
    t0 = time.monotonic()
    proc = drill(tmp_path, "--kills", "2", "--seed", "1", "--deadline", "4", env=slow)
    code, data, out = finish(tmp_path, proc)
    assert time.monotonic() - t0 < 30
    assert code == 1 and data["verdict"] == "incomplete", out
    assert data["drill"]["deadline_hit"] and data["drill"]["deadline_s"] == 4
    assert data["drill"]["running_when_stopped"].startswith("the reference run, at step")
    assert any(f["code"] == "deadline" for f in data["diagnosis"])
    assert "INCOMPLETE: stopped by the deadline" in out
    assert leftovers(tmp_path) == ([], [])


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_every_process_prints_the_report_so_far_and_leaves_no_temp_dir(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    slow = {"RESEARCH_STEP_SECONDS": "0.05"}
    proc = drill(tmp_path, "--kills", "2", "--seed", "1", "--resume-args=--resume", env=slow)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("crashdrill-verify-*/crashed/events.out.tfevents.*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.3)  # the crashed run is training
    proc.send_signal(sig)
    rc, data, out = finish(tmp_path, proc)
    assert rc == code, out
    assert data["verdict"] == "incomplete" and data["drill"]["interrupted_by"] == sig.name
    assert data["drill"]["running_when_stopped"].startswith("process ")
    assert data["reference"]["exit_code"] == 0  # what was seen: the reference, finished
    assert f"INCOMPLETE: stopped by {sig.name}" in out
    assert any(f["code"] == "interrupted" for f in data["diagnosis"])
    # The finished reference wrote model.pt: no finding may say the script never does.
    assert not any(f["code"] == "never-checkpoints" for f in data["diagnosis"]), out
    assert leftovers(tmp_path) == ([], [])


def test_an_interrupt_keeps_the_work_dir_and_names_it(tmp_path: Path) -> None:
    work = tmp_path / "evidence"
    slow = {"RESEARCH_STEP_SECONDS": "0.05"}
    proc = drill(tmp_path, "--kills", "2", "--seed", "1", "--resume-args=--resume",
                 "--work-dir", str(work), env=slow)  # fmt: skip
    deadline = time.monotonic() + 60
    while not list(work.glob("crashed/events.out.tfevents.*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.3)  # the crashed run is training
    proc.send_signal(signal.SIGINT)
    rc, data, out = finish(tmp_path, proc)
    assert rc == 130 and data["drill"]["work_dir"] == str(work), out
    text = next(f["text"] for f in data["diagnosis"] if f["code"] == "interrupted")
    assert f"the evidence is kept in --work-dir {work}" in text, text
    assert (work / "reference" / "model.pt").is_file()  # the finished reference's checkpoint
    assert list(work.glob("crashed/events.out.tfevents.*"))  # what the crashed run left
    assert leftovers(tmp_path) == ([], [])  # no temp dir, no process
