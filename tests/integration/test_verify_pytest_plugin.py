"""The drill inside a user's own test suite: the fixture passes a correct script and fails
a broken one with the drill's diagnosis in the test's failure message; --junit gives CI
one test case per resume. Each inner drill takes ~2 s."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# 14 steps, an atomic JSON checkpoint every 4 (none at the last step); "fresh" never loads
# it.
SCRIPT = """\
import json, os, sys, time
ckpt = os.path.join(os.environ["CRASHDRILL_CKPT_DIR"], "ckpt.json")
step, x = 0, 1.0
if os.path.exists(ckpt) and sys.argv[1:] != ["fresh"]:
    step, x = json.load(open(ckpt))
while step < 14:
    x = x * 0.9 + 0.05 * step
    step += 1
    print(json.dumps({"step": step, "loss": x}), flush=True)
    if step % 4 == 0:
        with open(ckpt + ".tmp", "w") as f:
            json.dump([step, x], f)
            f.flush()
            time.sleep(0.2)  # a write that takes a while: the drill's kill lands inside it
        os.replace(ckpt + ".tmp", ckpt)
    time.sleep(0.03)
"""

USER_TESTS = """\
import sys
pytest_plugins = ["crashdrill.drill.pytest_plugin"]

def test_resumes_bit_identically(crashdrill_verify):
    crashdrill_verify(["python", {script!r}], kills=2, seed=7)

def test_ignoring_the_checkpoint_fails_with_the_diagnosis(crashdrill_verify):
    crashdrill_verify(["python", {script!r}, "fresh"], kills=2, seed=7)
"""


def test_the_fixture_fails_a_test_with_the_drills_diagnosis(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    tests = tmp_path / "test_user.py"
    tests.write_text(USER_TESTS.format(script=str(script)))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "1 failed, 1 passed" in out, out
    assert "DrillFailed: crashdrill verify failed" in out
    assert "[silent-fresh-start]" in out and "replay with --seed 7" in out


def test_junit_shows_each_resume_as_a_test_case(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    junit = tmp_path / "drill.xml"
    cmd = [sys.executable, "-m", "crashdrill.drill", "--seed", "7", "--junit", str(junit)]
    proc = subprocess.run(
        [*cmd, "--", sys.executable, str(script), "fresh"], capture_output=True, text=True
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "crashdrill verify"
    # a trial kind the drill could not exercise is a skipped case of its own
    cases = [c for c in suite.findall("testcase") if c.find("skipped") is None]
    assert [c.get("name", "").split(" (")[0] for c in cases] == ["resume 1", "resume 2"]
    failed = [c for c in cases if c.find("failure") is not None]
    assert failed and suite.get("failures") == str(len(failed))
    text = failed[0].findtext("failure") or ""
    assert "silent fresh start" in text and "silent-fresh-start" not in text
    assert "the step counter went back" in text
