"""The drill as a new user meets it: a nanoGPT-style script drilled with no --loss-regex,
and `crashdrill` installed alone from its wheel into a fresh venv, with nothing of the
lab's server stack, where `crashdrill verify` drills a script and `crashdrill inspect`
reads its checkpoint."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
RESEARCH = Path(__file__).with_name("research")
SERVER_STACK = ("fastapi", "starlette", "uvicorn", "pydantic", "itsdangerous", "tomlkit")


@pytest.mark.timeout(600)  # four processes import torch: ~25 s each on a loaded 2-core machine
def test_a_nanogpt_style_script_passes_with_no_loss_regex() -> None:
    cmd = [sys.executable, "-m", "crashdrill", "verify", "--kills", "2", "--seed", "3"]
    cmd += ["--resume-args=--init_from=resume", "--json", "-", "--"]
    cmd += ["{python}", str(RESEARCH / "adopt_nanogpt_style.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["target"]["loss_lines"] == "nanogpt"
    assert report["reference"]["points"] == 40  # the eval lines are not steps
    assert report["precision"]["exact"] and report["resumes"]
    assert all(r["bit_identical"] for r in report["resumes"])


# ---------------------------------------------------------------- installed alone

TINY = """\
import json, os, sys
ckpt = os.path.join(os.environ["CRASHDRILL_CKPT_DIR"], "state.json")
step, w = 0, 1.0
if os.path.exists(ckpt):
    with open(ckpt) as f:
        s = json.load(f)
    step, w = s["step"], s["w"]
import time
while step < 30:
    w = w * 0.9 + 0.05
    step += 1
    print(f"step {step} | loss {w!r}", flush=True)
    time.sleep(0.03)
    if step % 5 == 0:
        with open(ckpt + ".tmp", "w") as f:
            json.dump({"step": step, "w": w}, f)
        os.replace(ckpt + ".tmp", ckpt)
"""


def _requirement_names(dist: str) -> list[str]:
    """The distributions `dist` requires (no extras), from its installed metadata."""
    from packaging.requirements import Requirement

    out = []
    for text in metadata.requires(dist) or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req.name)
    return out


def _closure(names: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        todo += _requirement_names(name)
    return seen


def _link_distributions(names: set[str], into: Path) -> None:
    """Symlink each installed distribution's top-level files (its packages and its
    .dist-info) into `into`: those and nothing else of this environment become visible."""
    into.mkdir()
    for name in names:
        dist = metadata.distribution(name)
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            src = base / top
            if src.exists() and not (into / top).exists():
                (into / top).symlink_to(src)


def _wheel(tmp: Path) -> Path:
    """`pip wheel --no-deps` of this repo's source (copied: a build writes into its tree)."""
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "node_modules", "build")
    for d in ("crashdrill", "trainer", "drill", "workers", "server", "web"):
        shutil.copytree(ROOT / d, src / d, ignore=ignore)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / f, src / f)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    proc = subprocess.run([*cmd, "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp / "dist").glob("crashdrill-*.whl")
    return wheel


def _base_requirements(wheel: Path) -> set[str]:
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = [
        Requirement(x.split(":", 1)[1].strip()) for x in lines if x.startswith("Requires-Dist:")
    ]
    return {r.name for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})}


def test_the_drill_installs_alone_from_its_wheel_and_drills_a_script_in_a_fresh_venv(
    tmp_path: Path,
) -> None:
    pytest.importorskip("packaging", reason="needs packaging to read the wheel's requirements")
    pytest.importorskip("setuptools", reason="needs setuptools to build the wheel offline")
    pip_version = tuple(int(x) for x in metadata.version("pip").split(".")[:2])
    if pip_version < (22, 3):
        pytest.skip(f"needs pip >= 22.3 (`pip --python`) for a venv without pip: {pip_version}")
    wheel = _wheel(tmp_path)
    base = _base_requirements(wheel)
    assert base == {"torch", "numpy", "psutil"}, f"the wheel's base requirements: {base}"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    proc = subprocess.run([*pip, "--no-index", str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The base requirements and theirs, from this environment, and nothing else of it.
    deps = tmp_path / "deps"
    _link_distributions(_closure(sorted(base)), deps)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "crashdrill-test-deps.pth").write_text(f"{deps}\n")
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin", "HOME": str(tmp_path)}

    def run(*args: str, cwd: Path = tmp_path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), capture_output=True, text=True, env=env, cwd=cwd, timeout=200
        )

    for module in SERVER_STACK:  # not pulled in, and not needed
        code = f"import importlib.util as u; print(u.find_spec('{module}'))"
        found = run(str(python), "-c", code)
        assert found.stdout.strip() == "None", f"{module} is importable in the fresh venv"
    # Every requirement of what is installed there is met: the wheel needs nothing more.
    check = run(sys.executable, "-m", "pip", "--python", str(python), "check")
    assert check.returncode == 0, check.stdout + check.stderr

    crashdrill = str(venv / "bin" / "crashdrill")
    helped = run(crashdrill, "verify", "--help")
    assert helped.returncode == 0 and "--loss-regex" in helped.stdout, helped.stderr
    (tmp_path / "train.py").write_text(TINY)
    drill = run(crashdrill, "verify", "--kills", "2", "--seed", "1", "--work-dir", "w",
                "--json", "-", "--", "{python}", "train.py")  # fmt: skip
    assert drill.returncode == 0, drill.stdout + drill.stderr
    report = json.loads(drill.stdout)
    assert report["verdict"] == "pass" and report["target"]["loss_lines"] == "step-bar"
    assert report["target"]["command"][0] == "{python}"
    inspected = run(crashdrill, "inspect", str(tmp_path / "w" / "crashed" / "state.json"))
    assert inspected.returncode == 0, inspected.stderr
    assert "step counters" in inspected.stdout
