"""What the `crashdrill` command prints: `presets show` as TOML that `presets validate`
takes back unchanged (JSON with --json), and a quiet exit when stdout is closed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crashdrill import cli
from crashdrill.closed_output import EXIT_OUTPUT_CLOSED
from crashdrill.server.lessons.policy import public_view
from crashdrill.trainer.presets import get_preset, list_presets, parse_preset_text

DRILL = [sys.executable, "-m", "crashdrill.drill"]


@pytest.mark.parametrize("preset", [p.id for p in list_presets()])
def test_presets_show_prints_toml_that_presets_validate_accepts_unchanged(
    preset: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["presets", "show", preset]) == 0
    text = capsys.readouterr().out
    assert parse_preset_text(text) == get_preset(preset)
    mine = tmp_path / "mine.toml"
    mine.write_text(text)
    assert cli.main(["presets", "validate", str(mine)]) == 0
    assert f"{mine}: ok — {preset}" in capsys.readouterr().out


def test_presets_show_json_prints_what_a_lesson_page_gets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["presets", "show", "quick", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == public_view(get_preset("quick"))


@pytest.mark.parametrize(
    "argv",
    [
        ["presets", "show", "quick"],
        ["presets", "show", "quick", "--json"],
        ["presets", "list"],
        ["verify", "--preset", "no-such-preset"],  # its message goes to stderr, still open
    ],
)
def test_a_command_whose_stdout_is_closed_exits_quietly(argv: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: every write fails
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "crashdrill", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    if argv[0] == "verify":
        assert proc.returncode == 2 and "no-such-preset" in proc.stderr
    else:
        assert proc.returncode == EXIT_OUTPUT_CLOSED and proc.stderr == ""


def test_the_drill_writes_its_report_file_and_exits_quietly_when_stdout_is_closed(
    tmp_path: Path,
) -> None:
    script = "for s in 1 2 3; do echo '{\"step\": '$s', \"loss\": 0.5}'; done"
    report = tmp_path / "report.json"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [*DRILL, "--json", str(report), "--kills", "0", "--", "sh", "-c", script],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == EXIT_OUTPUT_CLOSED and proc.stderr == ""
    assert json.loads(report.read_text())["schema"] == "crashdrill.verify/1"
