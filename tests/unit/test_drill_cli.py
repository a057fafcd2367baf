"""`crashdrill verify` options: usage errors exit 2, and the parser the lead's CLI mounts."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from crashdrill.drill import verify_cli
from crashdrill.drill.target import Segment


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--preset", "quick", "--", "python", "train.py"],
        ["--preset", "no-such-preset"],
        ["--preset", "quick", "--kills", "-1"],
        ["--preset", "quick", "--timeout", "0"],
        ["--preset", "quick", "--loss-regex", "x"],
        ["--run", "B", "--", "python", "train.py"],
        ["--no-fork-server", "--", "python", "train.py"],
        ["--loss-regex", "iter (\\d+)", "--", "python", "train.py"],
        ["--loss-regex", "(?P<step>", "--", "python", "train.py"],
        ["--", "/no/such/program-crashdrill"],
    ],
)
def test_bad_usage_exits_2_with_a_message(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert verify_cli.main(argv) == 2
    assert "crashdrill verify:" in capsys.readouterr().err


def test_argparse_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as e:
        verify_cli.main(["--kills", "many"])
    assert e.value.code == 2


def test_add_parser_registers_verify_on_subparsers() -> None:
    top = argparse.ArgumentParser(prog="crashdrill")
    sub = top.add_subparsers(dest="command")
    verify_cli.add_parser(sub)
    args = top.parse_args(
        ["verify", "--kills", "3", "--resume-args=--resume", "--", "python", "t.py", "--lr", "3"]
    )
    assert args.script == ["python", "t.py", "--lr", "3"] and args.kills == 3
    assert args.resume_args == "--resume"


def test_a_segment_without_steps_has_no_first_or_last_and_crashed_means_nonzero_exit() -> None:
    seg = Segment(0, ["x"], None, 0.0)
    assert seg.first_step is None and seg.last_step is None and not seg.crashed
    seg.exit_code = 1
    assert seg.crashed


def test_every_option_is_documented() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "verify.md").read_text()
    options = [
        opt
        for action in verify_cli.configure(argparse.ArgumentParser())._actions
        for opt in action.option_strings
        if opt.startswith("--") and opt != "--help"
    ]
    assert "--no-fork-server" in options
    for opt in options:
        assert f"`{opt}" in text, f"docs/verify.md does not document {opt}"


def test_every_command_of_the_github_actions_recipe_works_today() -> None:
    """The recipe in docs/verify.md: a YAML workflow whose `crashdrill verify` options all
    exist, that never installs crashdrill by a bare name (it is not on PyPI), and whose
    torch comes as a CPU build."""
    import shlex

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "verify.md").read_text()
    block = text.split("### GitHub Actions", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    steps = yaml.safe_load(block)["jobs"]["drill"]["steps"]
    runs = [s["run"] for s in steps if "run" in s]
    installs = [shlex.split(r) for r in runs if r.startswith("pip install")]
    assert any("https://download.pytorch.org/whl/cpu" in words for words in installs)
    for words in installs:
        assert "crashdrill" not in words, "crashdrill is not on PyPI: a git URL or a wheel"
    # A git URL names a ref that exists: the branch main or a commit (the repo has no tags).
    refs = [w.rsplit("@", 1)[1] for ws in installs for w in ws if "git+" in w]
    assert refs and all(r == "main" or re.fullmatch(r"[0-9a-f]{40}", r) for r in refs), refs
    drill = next(r for r in runs if r.startswith("crashdrill verify"))
    words = shlex.split(drill.replace("${{ github.run_number }}", "7"))
    args = verify_cli.configure(argparse.ArgumentParser()).parse_args(words[2:])
    assert (args.kills, args.json, args.junit) == (3, "drill.json", "drill.xml")
    assert args.script[0] == "{python}"
