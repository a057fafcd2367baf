"""Exit codes have one home (trainer/exit_codes.py): distinct values, and the places that
tell people what they mean (the README, `crashdrill run --help`) name every one."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from crashdrill.cli import build_parser
from crashdrill.trainer import exit_codes

ROOT = Path(__file__).resolve().parents[2]
CODES = {n: v for n, v in vars(exit_codes).items() if n.startswith("EXIT_")}
RUN_CODES = ("EXIT_OK", "EXIT_USAGE", "EXIT_NO_CHECKPOINT", "EXIT_DIVERGED", "EXIT_STOPPED")


def test_every_exit_code_has_its_own_value_and_they_are_the_published_ones():
    assert len(set(CODES.values())) == len(CODES)
    assert CODES == {
        "EXIT_OK": 0,
        "EXIT_FAILED": 1,
        "EXIT_USAGE": 2,
        "EXIT_NO_CHECKPOINT": 3,
        "EXIT_DIVERGED": 4,
        "EXIT_STOPPED": 75,
        "EXIT_SIGINT": 130,
        "EXIT_SIGTERM": 143,
    }


def test_the_readme_names_every_exit_code():
    readme = (ROOT / "README.md").read_text()
    paragraph = readme[readme.index("Exit codes everywhere") :].split("\n\n")[0]
    assert {int(n) for n in re.findall(r"\*\*(\d+)\*\*", paragraph)} == set(CODES.values())


def test_crashdrill_run_help_names_every_code_the_trainer_exits_with() -> None:
    parser = build_parser(["run", "--help"])
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub, argparse._SubParsersAction)
    epilog = sub.choices["run"].epilog
    assert epilog is not None
    said = {int(n) for n in re.findall(r"(?:^|; |: )(\d+) ", epilog)}
    assert said == {CODES[n] for n in RUN_CODES}
