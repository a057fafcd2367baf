"""A script as a drill target (drill/command.py): `{python}` is crashdrill's interpreter,
and a first run that dies at an import is told which interpreter ran it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from crashdrill.drill.command import CommandTarget, interpreter_hint, interpreter_of
from crashdrill.drill.trace import LossParser
from crashdrill.drill.verify import verify_command

NO_TORCH = [
    "Traceback (most recent call last):",
    '  File "train.py", line 1, in <module>',
    "ModuleNotFoundError: No module named 'torch'",
]


def _fake_python(bin_dir: Path, name: str = "python") -> Path:
    """An interpreter on the PATH that is not crashdrill's: it fails like one without torch."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / name
    exe.write_text(
        "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
        "echo \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n"
    )
    exe.chmod(0o755)
    return exe


def test_python_placeholder_is_the_interpreter_crashdrill_runs_in(tmp_path: Path) -> None:
    t = CommandTarget(["{python}", "train.py"], parser=LossParser(), resume_args=["{python}"])
    (tmp_path / "ckpt.pt").write_bytes(b"PK\x03\x04" + b"\0" * 60)  # a torch.save zip
    assert t.command(tmp_path, restart=False) == [sys.executable, "train.py"]
    assert t.command(tmp_path, restart=True)[-1] == sys.executable


def test_an_import_error_names_the_interpreter_on_the_path_and_crashdrill_s(
    tmp_path: Path,
) -> None:
    other = _fake_python(tmp_path / "bin")
    hint = interpreter_hint(["python", "train.py"], str(tmp_path / "bin"), NO_TORCH)
    assert hint is not None
    assert str(other) in hint and sys.executable in hint and "{python}" in hint
    assert "No module named 'torch'" in hint
    assert "torch is installed for crashdrill's interpreter" in hint


def test_a_script_s_shebang_names_the_interpreter_that_ran(tmp_path: Path) -> None:
    other = _fake_python(tmp_path / "bin", "python3")
    script = tmp_path / "bin" / "train"
    script.write_text("#!/usr/bin/env python3\nimport torch\n")
    script.chmod(0o755)
    assert interpreter_of("train", str(tmp_path / "bin")) == (str(script), str(other))


@pytest.mark.parametrize(
    ("argv", "stderr"),
    [
        ([sys.executable, "train.py"], NO_TORCH),  # crashdrill's own: no other to blame
        (["python", "train.py"], ["RuntimeError: CUDA out of memory"]),  # not an import
    ],
)
def test_no_interpreter_hint_where_the_interpreter_is_not_the_cause(
    tmp_path: Path, argv: list[str], stderr: list[str]
) -> None:
    _fake_python(tmp_path / "bin")
    assert interpreter_hint(argv, str(tmp_path / "bin"), stderr) is None


def test_a_reference_that_dies_at_an_import_gets_the_interpreter_in_its_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = _fake_python(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    result = verify_command(["python", "train.py"], parser=LossParser(), kills=1, seed=1)
    crashed = [f for f in result.analysis.findings if f.code == "crashed"]
    assert result.analysis.exit_code == 1 and crashed
    assert "likely cause" in crashed[0].text and str(other) in crashed[0].text
    assert "{python}" in crashed[0].text


def test_no_steps_quotes_the_first_lines_and_names_loss_lines_found_on_stderr() -> None:
    code = (
        "import sys\n"
        "print('Epoch 1/1 starting')\n"
        "for i in range(1, 6):\n"
        "    print(f'{i}/5 [00:00<00:00, loss={1 + i / 10}]', file=sys.stderr)\n"
        "print('done')\n"
    )
    result = verify_command([sys.executable, "-c", code], parser=LossParser(), kills=0)
    (finding,) = result.analysis.findings
    assert result.analysis.exit_code == 2 and finding.code == "no-steps"
    assert "'Epoch 1/1 starting'; 'done'" in finding.text
    assert "Its stderr has loss lines ('1/5 [00:00<00:00, loss=1.1]')" in finding.text
    assert "file=sys.stdout" in finding.text


def test_a_progress_bar_redrawn_with_carriage_returns_is_read_at_every_redraw(
    tmp_path: Path,
) -> None:
    from crashdrill.drill.engine import run_segment

    code = (
        "import sys, time\n"
        "for i in range(1, 6):\n"
        "    sys.stdout.write(f'\\r{i * 20}%|##| {i}/5 [00:01<00:02, loss={1 / i!r}]')\n"
        "    sys.stdout.flush(); time.sleep(0.01)\n"
        "sys.stdout.write('\\n')\n"
    )
    target = CommandTarget([sys.executable, "-c", code], parser=LossParser(), timeout=30)
    seg = run_segment(target, tmp_path, 0, None)
    assert [p.step for p in seg.points] == [1, 2, 3, 4, 5]
    assert target.parser.matched == "progress" and seg.points[-1].text == "0.2"
