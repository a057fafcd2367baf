"""`crashdrill verify`: kill a training run at seeded random points, resume it, and fail
unless the resumed trace equals an uninterrupted reference bit for bit.

    crashdrill verify --preset quick --kills 2                 the built-in trainer
    crashdrill verify --kills 3 --seed 7 -- {python} train.py --out {ckpt_dir}
    crashdrill verify --resume-args=--resume -- python train.py   `iter N: loss X` read as is
    crashdrill verify --loss-regex 'it=(?P<step>\\d+) L=(?P<loss>\\S+)' -- python train.py
    crashdrill verify                        the options of [tool.crashdrill] in pyproject.toml
    crashdrill verify --print-config         … the options in effect and where each came from
    crashdrill verify --preempt --grace 30 -- python train.py    SIGTERM, SIGKILL after 30 s
    python -m crashdrill.drill …                                the same, standalone

Exit codes: 0 every resume is bit-identical, 1 it is not (or the script failed, or with
--preempt a stop lost steps, or the drill's deadline ran out), 2 bad usage or input,
130/143 stopped by SIGINT/SIGTERM (the report so far, marked incomplete). Full reference:
docs/verify.md.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
from typing import Any

from crashdrill.closed_output import quiet_when_output_closed
from crashdrill.drill.checkpoint_files import check_globs
from crashdrill.drill.interrupt import DrillInterrupted, exit_code, stop_on_signals
from crashdrill.drill.plan import PREEMPT_MODES
from crashdrill.drill.project_config import ConfigFileError, mark_defaults
from crashdrill.drill.target import StartError
from crashdrill.drill.trace import TraceError
from crashdrill.processes.process_tree import become_subreaper
from crashdrill.trainer.exit_codes import EXIT_USAGE

MAX_KILLS = 100
# Options that apply to one kind of target only (a table's are dropped for the other).
COMMAND_ONLY = (
    "loss_regex",
    "resume_args",
    "resume_args_always",
    "compare_file",
    "rank",
    "kill_rank",
    "resume_world_size",
    "tolerance",
    "checkpoint_glob",
)
PRESET_ONLY = ("run", "no_fork_server")


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The verify options, on a parser of the caller's making."""
    p.add_argument("--preset", help="drill the built-in trainer on this preset (e.g. quick)")
    p.add_argument("--run", choices=["A", "B"], help="which run of the preset (default A)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="with --preset: override a setting of the run, as `crashdrill run --set` does"
        " (e.g. ckpt_every=20); the kills are planned for the overridden cadence",
    )
    p.add_argument("--kills", type=int, default=2, help="how many SIGKILLs (default 2)")
    p.add_argument("--seed", type=int, help="draws the kill points; printed, so it replays")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON ('-': stdout)")
    p.add_argument(
        "--junit",
        metavar="FILE",
        help="also write the report as JUnit XML, one test case per resume (for CI)",
    )
    p.add_argument(
        "--loss-regex",
        metavar="RE",
        help="read losses with this regex (named groups step and loss) instead of the loss-line "
        "shapes recognised without it (JSON, nanoGPT's iter N: loss X, step N | loss X, …)",
    )
    p.add_argument(
        "--resume-args",
        metavar="ARGS",
        help="appended to COMMAND on a restart whose checkpoint dir holds a checkpoint (write "
        "--resume-args=--resume for one flag)",
    )
    p.add_argument(
        "--resume-args-always",
        action="store_true",
        help="add --resume-args on every restart, even when the checkpoint dir is still empty "
        "(default: only when it holds a checkpoint)",
    )
    p.add_argument(
        "--rank",
        type=int,
        help="a multi-process script (torchrun): read steps from this rank's lines only "
        "(default: every rank's lines that say their rank, each compared on its own; rank 0's "
        "are the run's trace)",
    )
    p.add_argument(
        "--kill-rank",
        type=int,
        nargs="?",
        const=-1,
        metavar="R",
        help="a multi-process script: one more trial, after the plan's kills: SIGKILL rank R's "
        "process only (the launcher's descendant whose environment says RANK=R; R drawn from "
        "the seed when omitted) and report what the launcher did: restarted the group, "
        "exited, or hung until --timeout",
    )
    p.add_argument(
        "--resume-world-size",
        type=int,
        metavar="M",
        help="a torchrun command: every restart runs at M ranks (its --nproc_per_node value "
        "replaced), judged by the reduced loss within --tolerance (bits cannot match)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        metavar="T",
        help="with --resume-world-size: the largest |Δ| of the reduced loss a resume may show",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds any one process may run before it counts as hung (default 600)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="seconds the whole drill may take; then it stops and reports what it saw, "
        "marked incomplete (default: from the reference run's time, at least 120)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        help="restarts one drill may make; past them it stops, a finding (default 3 x kills + 10)",
    )
    p.add_argument(
        "--checkpoint-glob",
        action="append",
        metavar="GLOB",
        help="only files matching this glob (relative to the checkpoint dir; repeatable) are "
        "checkpoints (default: recognised by name and content, never the logs beside them)",
    )
    p.add_argument(
        "--compare-file",
        action="append",
        metavar="NAME",
        help="a file both runs leave in their checkpoint dir, compared byte for byte at the end",
    )
    p.add_argument(
        "--preempt",
        nargs="?",
        const="all",
        choices=PREEMPT_MODES,
        help="preempt instead of killing, as spot VMs and SLURM do: SIGTERM, then SIGKILL"
        " after --grace; 'all' (the default) every kill, 'mixed' some, drawn from the seed."
        " A stop that loses steps fails the drill: the script could have saved them",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="with --preempt: seconds between the SIGTERM and the SIGKILL (default 30)",
    )
    p.add_argument("--work-dir", metavar="DIR", help="keep both runs' dirs here (default: temp)")
    p.add_argument(
        "--no-fork-server",
        action="store_true",
        help="start every trainer process with exec, not forked from a server that has "
        "imported torch (presets only; also CRASHDRILL_FORK_SERVER=0)",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the options in effect (the command line over [tool.crashdrill] in the "
        "nearest pyproject.toml, over the defaults) with where each came from, and exit 0",
    )
    p.add_argument(
        "script",
        nargs="*",
        metavar="-- COMMAND",
        help="any training script; {ckpt_dir} in it (and $CRASHDRILL_CKPT_DIR) is its "
        "checkpoint dir, {python} the interpreter crashdrill runs in",
    )
    mark_defaults(p)  # a flag given on the command line is told apart from the table's
    return p


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `verify` on the `crashdrill` command's subparsers."""
    doc = __doc__ or ""
    p = subparsers.add_parser(
        "verify",
        help="kill a run at random points, resume, compare bits",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1] if "\n\n" in doc else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return configure(p)


def _usage(message: str) -> int:
    print(f"crashdrill verify: {message}", file=sys.stderr)
    return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    """Run the drill; the exit code is the verdict (0 pass, 1 fail, 2 usage, 128 + the
    signal when SIGINT/SIGTERM stopped it: 130, 143)."""
    from crashdrill.drill import project_config, report

    known = project_config.options(configure(argparse.ArgumentParser(add_help=False)))
    try:
        config = project_config.load(known)
    except ConfigFileError as e:
        return _usage(str(e))
    source = project_config.resolve(args, config, known, COMMAND_ONLY, PRESET_ONLY)
    if args.print_config:
        where = config.where if config.path else "no pyproject.toml with [tool.crashdrill]"
        print(f"crashdrill verify: the options in effect ({where}; the command line wins)")
        print(project_config.effective(args, known, source))
        return 0
    # A command from the table runs where the table is: the project's root.
    cwd = str(config.path.parent) if config.path and source["script"] == config.where else None
    script = list(args.script or [])
    if script and script[0] == "--":
        script = script[1:]
    if bool(args.preset) == bool(script):
        return _usage(
            "give either --preset NAME or -- COMMAND… (one of them; or `command` / `preset` in"
            " [tool.crashdrill] of the project's pyproject.toml)"
        )
    if not 0 <= args.kills <= MAX_KILLS:
        return _usage(f"--kills {args.kills}: a whole number in [0, {MAX_KILLS}]")
    if args.rank is not None and args.rank < 0:
        return _usage(f"--rank {args.rank}: a rank is a whole number >= 0")
    if args.kill_rank is not None and args.kill_rank < -1:
        return _usage(f"--kill-rank {args.kill_rank}: a rank is a whole number >= 0")
    if args.kill_rank is not None and args.preempt:
        return _usage("--kill-rank and --preempt: one kind of stop per drill")
    if args.resume_world_size is not None:
        if args.resume_world_size < 1:
            return _usage(f"--resume-world-size {args.resume_world_size}: a number of ranks >= 1")
        if args.tolerance is None or not args.tolerance >= 0:
            return _usage(
                "--resume-world-size needs --tolerance T (a |Δ| >= 0): on another world size "
                "the bits cannot match, so the drill judges the reduced loss within T"
            )
    elif args.tolerance is not None:
        return _usage("--tolerance applies to --resume-world-size M")
    if args.timeout <= 0:
        return _usage(f"--timeout {args.timeout:g}: a number of seconds > 0")
    if not args.grace > 0:
        return _usage(f"--grace {args.grace:g}: a number of seconds > 0")
    if args.deadline is not None and not args.deadline > 0:
        return _usage(f"--deadline {args.deadline:g}: a number of seconds > 0")
    if args.max_restarts is not None and args.max_restarts < 0:
        return _usage(f"--max-restarts {args.max_restarts}: a whole number >= 0")
    try:
        globs = check_globs(args.checkpoint_glob or [])
    except ValueError as e:
        return _usage(str(e))
    if args.preset:
        extra = [f"--{n.replace('_', '-')}" for n in COMMAND_ONLY if getattr(args, n)]
        if extra:
            return _usage(f"{', '.join(extra)} apply to a COMMAND, not to --preset")
    elif args.resume_args_always and not args.resume_args:
        return _usage("--resume-args-always needs --resume-args ARGS")
    elif args.run or args.no_fork_server or args.set:
        flag = "--run" if args.run else "--set" if args.set else "--no-fork-server"
        return _usage(f"{flag} applies to --preset, not to a COMMAND")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    # Orphans of a run (a launcher's child whose parent died) are re-parented to the drill,
    # not to init: they stay findable, and the drill reaps what it kills.
    become_subreaper()
    try:
        with stop_on_signals():
            result = _drill(args, script, seed, globs, cwd)
    except DrillInterrupted as e:  # before the drill had anything to report, or after it
        print(f"crashdrill verify: {e.name}: stopped, no report", file=sys.stderr)
        return exit_code(e.signum)
    except (TraceError, StartError, FileExistsError, ValueError) as e:
        return _usage(str(e))
    if isinstance(result, int):
        return result
    if args.junit:
        from crashdrill.drill.junit import write_junit

        write_junit(result, args.junit)
    if args.json == "-":
        print(json.dumps(report.to_json(result), indent=2))
    else:
        if args.json:  # first: a closed stdout (`| head`) must not cost the report file
            report.write_json(result, args.json)
        print(report.table(result))
    sys.stdout.flush()
    return int(result.analysis.exit_code)


def _drill(
    args: argparse.Namespace, script: list[str], seed: int, globs: list[str], cwd: str | None
) -> Any:
    """The drill the arguments ask for: its DrillResult, or an exit code (a bad preset)."""
    from crashdrill.drill.trace import LossParser
    from crashdrill.drill.verify import verify_command, verify_preset

    if args.preset:
        from crashdrill.trainer.config import ConfigError
        from crashdrill.trainer.presets import PresetError

        try:
            return verify_preset(
                args.preset,
                args.run or "A",
                kills=args.kills,
                seed=seed,
                timeout=args.timeout,
                work_dir=args.work_dir,
                fork_server=False if args.no_fork_server else None,
                preempt=args.preempt,
                grace=args.grace,
                max_restarts=args.max_restarts,
                deadline=args.deadline,
                overrides=args.set or [],
            )
        except (PresetError, ConfigError) as e:
            return _usage(str(e))
    return verify_command(
        script,
        parser=LossParser(args.loss_regex),
        kills=args.kills,
        seed=seed,
        resume_args=shlex.split(args.resume_args) if args.resume_args else None,
        resume_args_always=args.resume_args_always,
        rank=args.rank,
        timeout=args.timeout,
        work_dir=args.work_dir,
        compare_files=args.compare_file,
        cwd=cwd,
        preempt=args.preempt,
        grace=args.grace,
        checkpoint_globs=globs,
        max_restarts=args.max_restarts,
        deadline=args.deadline,
        kill_rank=args.kill_rank,
        resume_world_size=args.resume_world_size,
        tolerance=args.tolerance,
    )


def main(argv: list[str] | None = None) -> int:
    return quiet_when_output_closed(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    parser = configure(
        argparse.ArgumentParser(
            prog="crashdrill verify",
            description=(__doc__ or "").split("\n\n")[0],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    try:
        return run(parser.parse_args(argv))
    except KeyboardInterrupt:  # outside the drill (stop_on_signals covers the drill itself)
        return 130
