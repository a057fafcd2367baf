"""`[tool.crashdrill]` in a project's pyproject.toml (drill/project_config.py): the drill's
options without flags, the command line over the table, and bad keys refused by name."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from crashdrill.drill.verify_cli import main

TRAIN = """\
import os
for step in range(1, 6):
    print(f"step {step} | loss {1.0 / step!r}")
open(os.path.join(os.environ["CRASHDRILL_CKPT_DIR"], "ckpt.json"), "w").write("{}")
"""


def _project(root: Path, table: str) -> Path:
    (root / "pyproject.toml").write_text('[project]\nname = "p"\n\n' + textwrap.dedent(table))
    sub = root / "src" / "deep"
    sub.mkdir(parents=True)
    return sub


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_print_config_shows_each_value_and_where_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sub = _project(
        tmp_path,
        """
        [tool.crashdrill]
        command = "{python} train.py --out {ckpt_dir}"
        resume_args = ["--resume"]
        kills = 3
        timeout = 90
        """,
    )
    monkeypatch.chdir(sub)  # found upward from the cwd
    assert main(["--print-config", "--kills", "2"]) == 0
    out = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    table = f"{tmp_path / 'pyproject.toml'} [tool.crashdrill]"
    assert out["command"].endswith(table) and '"{python}", "train.py"' in out["command"]
    assert out["kills"].split()[1:] == ["2", "command", "line"]  # the flag wins
    assert out["timeout"].split()[1] == "90" and out["timeout"].endswith(table)
    assert out["resume-args"].split()[1] == '"--resume"'
    assert out["grace"].endswith("default")


def test_a_command_on_the_command_line_replaces_the_table_s_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(_project(tmp_path, '[tool.crashdrill]\ncommand = "python a.py"\n'))
    assert main(["--print-config", "--", "python", "b.py"]) == 0
    command = capsys.readouterr().out.splitlines()[1]
    assert '"b.py"' in command and command.endswith("command line")
    assert main(["--print-config", "--preset", "quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "(none)" in lines[1] and any("quick" in line for line in lines)


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ("kill = 3", ["unknown key 'kill'", "allowed:", "kills", "loss-regex", "command"]),
        ('kills = "3"', ["kills = '3' is a string", "kills must be a whole number"]),
        ("resume-args-always = 1", ["resume-args-always = 1", "must be true or false"]),
        ('preempt = "some"', ["preempt = 'some'", "must be one of 'all', 'mixed'"]),
        ("command = 3", ["command = 3 is an integer", "a string (split like a shell)"]),
    ],
)
def test_an_unknown_key_or_a_wrong_type_is_exit_2_naming_the_key(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    table: str,
    words: list[str],
) -> None:
    monkeypatch.chdir(_project(tmp_path, f"[tool.crashdrill]\n{table}\n"))
    err = _usage_error(capsys, ["--print-config"])
    assert "pyproject.toml [tool.crashdrill]" in err
    for w in words:
        assert w in err


def test_a_pyproject_without_the_table_is_not_a_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.other]\nkills = 'x'\n")
    monkeypatch.chdir(tmp_path)
    assert "give either --preset NAME or -- COMMAND" in _usage_error(capsys, [])


def test_verify_alone_runs_the_table_s_command_in_the_project_s_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    monkeypatch.chdir(
        _project(tmp_path, '[tool.crashdrill]\ncommand = "{python} train.py"\nkills = 0\n')
    )
    main(["--json", "-"])
    report = json.loads(capsys.readouterr().out)
    assert report["target"]["command"] == ["{python}", "train.py"]
    assert report["kills_requested"] == 0
    assert report["reference"]["points"] == 5  # train.py was found: it ran in the root
    assert report["target"]["loss_lines"] == "step-bar"
