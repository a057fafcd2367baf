"""`python3 quickstart.py lab` (and `test`, `setup`) skips what is up to date: pip runs
once per change of the lock, pyproject, the set's extras or torch (a stamp in the venv),
the web build once per change of package.json / package-lock.json; a venv without a stamp
(a clean clone, as in CI) installs, and `--reinstall` always does. pip, npm and torch are
recorded here, not run."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.quickstart import quickstart

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def qs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, list[str]]:
    """quickstart with a repo copy of its inputs in tmp_path and every install recorded."""
    q = quickstart()
    repo = tmp_path / "repo"
    (repo / "requirements").mkdir(parents=True)
    for name in ("pyproject.toml", "package.json", "package-lock.json"):
        if (ROOT / name).is_file():
            shutil.copy(ROOT / name, repo / name)
    for lock in ("lab.txt", "test.txt"):
        shutil.copy(ROOT / "requirements" / lock, repo / "requirements" / lock)
    vendor = repo / "web" / "static" / "vendor"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()  # make_venv sees a venv
    calls: list[str] = []

    def build_web(*cmd: Any, check: bool = True, env: Any = None) -> int:
        calls.append("web " + " ".join(str(c) for c in cmd[1:]))
        vendor.mkdir(parents=True, exist_ok=True)
        for f in ("uPlot.iife.min.js", "uPlot.min.css"):
            (vendor / f).write_text("x")
        return 0

    def pip(*a: str, check: bool = True) -> int:
        calls.append("pip " + " ".join(a))
        return 0

    for name, value in {
        "ROOT": repo,
        "REQUIREMENTS": repo / "requirements",
        "VENDOR": vendor,
        "VENV": venv,
        "PY": venv / "bin" / "python",
        "pip": pip,
        "install_torch": lambda: calls.append("torch"),
        "torch_installed": lambda: True,
        "torch_present": lambda: True,
        "lock_problem": lambda name: None,
        "sh": build_web,
        "ensure_chromium": lambda: None,
    }.items():
        monkeypatch.setattr(q, name, value)
    return q, calls


def test_a_second_start_with_nothing_changed_installs_nothing(
    qs: tuple[ModuleType, list[str]],
) -> None:
    q, calls = qs
    q.setup(test=False)
    assert [c.split()[0] for c in calls] == ["torch", "pip", "web"]
    calls.clear()
    q.setup(test=False)
    assert calls == [], "nothing changed: no pip, no torch, no web build"


def test_a_changed_lock_pyproject_or_package_lock_installs_that_part_again(
    qs: tuple[ModuleType, list[str]],
) -> None:
    q, calls = qs
    q.setup(test=False)
    calls.clear()
    lock = q.REQUIREMENTS / "lab.txt"
    lock.write_text(lock.read_text() + "\n# a pin moved\n")
    q.setup(test=False)
    assert [c.split()[0] for c in calls] == ["torch", "pip"], calls
    calls.clear()
    pyproject = q.ROOT / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n# a dependency added\n")
    q.setup(test=False)
    assert [c.split()[0] for c in calls] == ["torch", "pip"], calls
    calls.clear()
    (q.ROOT / "package-lock.json").write_text("{}")
    q.setup(test=False)
    assert [c.split()[0] for c in calls] == ["web"], calls


def test_the_test_set_has_its_own_stamp_and_reinstall_always_installs(
    qs: tuple[ModuleType, list[str]],
) -> None:
    q, calls = qs
    q.setup(test=False)
    calls.clear()
    q.setup(test=True)  # another set: its extras were never installed
    assert [c.split()[0] for c in calls] == ["torch", "pip"], calls
    calls.clear()
    q.setup(test=True, reinstall=True)
    assert [c.split()[0] for c in calls] == ["torch", "pip", "web"], calls
    calls.clear()
    q.setup(test=True, unlocked=True)  # the newest versions: pip always asks
    assert [c.split()[0] for c in calls] == ["torch", "pip"], calls


def test_a_failed_install_leaves_no_stamp_so_the_next_start_installs(
    qs: tuple[ModuleType, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    q, _ = qs

    def failing_pip(*a: str, check: bool = True) -> int:
        raise SystemExit("pip failed")

    monkeypatch.setattr(q, "pip", failing_pip)
    with pytest.raises(SystemExit):
        q.setup(test=False)
    assert not (q.VENV / q.PIP_STAMP.format(name="lab")).exists()
