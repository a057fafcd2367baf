"""The drill as a function that fails like an assertion, for tests in any runner:

    from crashdrill.drill import assert_resumes_bit_identical
    assert_resumes_bit_identical(["python", "train.py"], kills=2, seed=1)   # DrillFailed

DrillFailed is an AssertionError whose message is the drill's report: the table, every
finding with its likely cause, and the seed that replays it. With pytest, the fixture in
crashdrill.drill.pytest_plugin does the same with the runs kept under tmp_path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from crashdrill.drill.verify import DrillResult, verify_command, verify_preset
from crashdrill.trainer.exit_codes import EXIT_OK


class DrillFailed(AssertionError):
    """The drill did not pass: the message is its report (table, findings, the seed)."""

    def __init__(self, result: DrillResult, text: str) -> None:
        super().__init__(text)
        self.result = result


def assert_resumes_bit_identical(
    command: Sequence[str] | None = None,
    *,
    preset: str | None = None,
    run: str = "A",
    kills: int = 2,
    seed: int = 0,
    loss_regex: str | None = None,
    resume_args: Sequence[str] | None = None,
    resume_args_always: bool = False,
    rank: int | None = None,
    timeout: float = 600.0,
    compare_files: Sequence[str] | None = None,
    cwd: str | Path | None = None,
    work_dir: str | Path | None = None,
    json_path: str | Path | None = None,
    junit_path: str | Path | None = None,
) -> DrillResult:
    """Run the drill on `command` (or on the built-in trainer's `preset`) and raise
    DrillFailed with its report unless every resume is bit-identical; the same options as
    `crashdrill verify`. A bad option or input (an unknown preset, a bad regex, a command
    that cannot start) raises ValueError/RuntimeError as the CLI's exit 2 would."""
    from crashdrill.drill import report
    from crashdrill.drill.trace import LossParser

    if (command is None) == (preset is None):
        raise ValueError("give either a command or preset=NAME (one of them)")
    if preset is not None:
        result = verify_preset(
            preset, run, kills=kills, seed=seed, timeout=timeout, work_dir=work_dir
        )
    else:
        result = verify_command(
            list(command or []),
            parser=LossParser(loss_regex),
            kills=kills,
            seed=seed,
            resume_args=list(resume_args) if resume_args else None,
            resume_args_always=resume_args_always,
            timeout=timeout,
            work_dir=work_dir,
            compare_files=list(compare_files) if compare_files else None,
            cwd=str(cwd) if cwd is not None else None,
            rank=rank,
        )
    if json_path is not None:
        report.write_json(result, json_path)
    if junit_path is not None:
        from crashdrill.drill.junit import write_junit

        write_junit(result, junit_path)
    if result.analysis.exit_code != EXIT_OK:
        raise DrillFailed(result, "crashdrill verify failed\n" + report.table(result))
    return result
