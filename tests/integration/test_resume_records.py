"""Real trainer, real SIGKILL: a resume reproduces every record the run's reports depend
on — val loss and its train mean, every probe, the sample — not only the loss; and the
resume check (the lab's, and `crashdrill verify --preset`) names a field that a resume
does not reproduce."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crashdrill.server.lessons.resume_checks import ResumeCheck, resume_checks
from crashdrill.trainer.records import read_records
from crashdrill.trainer.resume_compare import COMPARED_KINDS, compare_records, differing
from tests.conftest import crashdrill_cmd

pytestmark = pytest.mark.slow

# Evals, probes and samples every 20 steps, checkpoints every 50: the eval at step 60 takes
# the mean of steps 41-60, a window that a resume from step 50 must get back.
SETTINGS = {
    "steps": 90, "ckpt_every": 50, "eval_every": 20, "probe_every": 20,
    "sample_every": 20, "sample_tokens": 8, "log_every": 1,
}  # fmt: skip
ARGS = ["run", "quick", "--jsonl", "--quiet"]
ARGS += [arg for k, v in SETTINGS.items() for arg in ("--set", f"{k}={v}")]
KILL_AFTER = 61  # the step-60 val, probe and sample records are written before step 61's

# A trainer whose probes depend on state no checkpoint holds: a call counter that starts
# over in every process, as a probe generator that is not restored would.
BROKEN_PROBES = """
import itertools, sys
from crashdrill.trainer import evaluate
calls, probes = itertools.count(), evaluate.probes
def counted(*args, **kwargs):
    out = probes(*args, **kwargs)
    out["paris"] = round(out["paris"] + 0.001 * next(calls), 4)
    return out
evaluate.probes = counted
from crashdrill.cli import main
sys.exit(main(sys.argv[1:]))
"""


def command(run_dir: Path, *, broken: bool, restart: bool) -> list[str]:
    args = [*ARGS, "--run-dir", str(run_dir), *(["--require-checkpoint"] if restart else [])]
    return [sys.executable, "-c", BROKEN_PROBES, *args] if broken else crashdrill_cmd(*args)


def crash_and_resume(run_dir: Path, *, broken: bool = False) -> None:
    """Run, SIGKILL after step KILL_AFTER, resume to the end."""
    proc = subprocess.Popen(
        command(run_dir, broken=broken, restart=False),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if json.loads(line)["step"] >= KILL_AFTER:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    done = subprocess.run(
        command(run_dir, broken=broken, restart=True), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed at step 50" in done.stderr


def compared_records(run_dir: Path) -> list[tuple[int, int, dict[str, Any]]]:
    recs, _ = read_records(run_dir / "records.jsonl")
    return [(r["segment"], r["step"], r) for r in recs if r["kind"] in COMPARED_KINDS]


def lab_check(run_dir: Path) -> ResumeCheck:
    recs, _ = read_records(run_dir / "records.jsonl")
    resumes = {r["segment"]: r["from_step"] for r in recs if r["kind"] == "resume"}
    [check] = resume_checks(compared_records(run_dir), resumes)
    return check


def test_a_resume_after_an_eval_probe_and_sample_step_reproduces_every_record(
    tmp_path: Path,
) -> None:
    reference = tmp_path / "reference"
    subprocess.run(
        command(reference, broken=False, restart=False),
        check=True,
        capture_output=True,
        timeout=300,
    )
    crashed = tmp_path / "crashed"
    crash_and_resume(crashed)

    check = lab_check(crashed)  # the resumed steps against the ones the kill lost
    assert check.from_step == 50 and check.bit_identical is True and check.differing == []
    fields = {f.field: f for f in check.fields}
    for name in ("val.train_loss", "val.val_loss", "probe.probes.paris", "sample.text"):
        assert fields[name].points == 1 and fields[name].identical, name  # the step-60 ones

    ref = {(r["kind"], s): r for _, s, r in compared_records(reference)}
    resumed = [(s, ref[(r["kind"], s)], r) for seg, s, r in compared_records(crashed) if seg == 1]
    against_reference = compare_records(resumed)  # every record the resumed process wrote
    assert differing(against_reference) == []
    train = next(f for f in against_reference if f.field == "val.train_loss")
    assert train.points == 3 and train.identical  # steps 60, 80 and the last, 90


def test_the_resume_check_names_a_field_that_the_checkpoint_does_not_restore(
    tmp_path: Path,
) -> None:
    crashed = tmp_path / "crashed"
    crash_and_resume(crashed, broken=True)
    check = lab_check(crashed)
    assert check.loss.identical is True  # the losses alone say nothing is wrong
    assert check.bit_identical is False and check.differing == ["probe.probes.paris"]
    paris = next(f for f in check.fields if f.field == "probe.probes.paris")
    assert paris.first_divergent_step == 60 and paris.max_abs_delta == pytest.approx(0.002)
    assert json.loads(json.dumps(check.to_dict(), allow_nan=False))["differing"] == [
        "probe.probes.paris"
    ]


def preset_file(path: Path, settings: dict[str, int]) -> Path:
    """The quick preset with `settings`, as a preset file `crashdrill verify` takes."""
    shown = subprocess.run(
        crashdrill_cmd("presets", "show", "quick"), capture_output=True, text=True, check=True
    ).stdout.replace('id = "quick"', 'id = "broken-probes"')
    lines = [ln for ln in shown.splitlines() if ln.split(" = ")[0] not in settings]
    at = lines.index("[run]") + 1
    lines[at:at] = [f"{k} = {v}" for k, v in settings.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_crashdrill_verify_preset_fails_and_names_the_field(tmp_path: Path) -> None:
    """The drill on the same broken trainer: every process it starts has the counter (a
    sitecustomize on PYTHONPATH), and every resume from a checkpoint after step 0 redoes a
    probe step with the counter started over."""
    site = tmp_path / "site"
    site.mkdir()
    patch = BROKEN_PROBES.split("from crashdrill.cli import main")[0].strip()
    (site / "sitecustomize.py").write_text(
        "import os\n\nif os.environ.get('CRASHDRILL_TEST_BREAK_PROBES'):\n"
        + "".join(f"    {line}\n" for line in patch.splitlines())
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "CRASHDRILL_TEST_BREAK_PROBES": "1",
    }
    preset = preset_file(tmp_path / "broken.toml", {**SETTINGS, "steps": 200})
    out = tmp_path / "report.json"
    argv = ["verify", "--preset", str(preset), "--kills", "3", "--seed", "5", "--json", str(out)]
    drill = subprocess.run(
        crashdrill_cmd(*argv), capture_output=True, text=True, timeout=600, env=env
    )
    assert drill.returncode == 1, drill.stdout + drill.stderr
    report = json.loads(out.read_text())
    named = [r for r in report["resumes"] if "probe.probes.paris" in r["differing"]]
    assert named and all(r["from_step"] for r in named), drill.stdout
    assert all(r["verdict"].startswith("probe.probes.paris differs") for r in named)
    assert "fields-differ" in {d["code"] for d in report["diagnosis"]}
    assert "probe.probes.paris (from step" in drill.stdout
