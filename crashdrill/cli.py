"""The `crashdrill` command.

    crashdrill serve                                  the lab at http://127.0.0.1:8000
    crashdrill run quick --run-dir runs/q             one headless run; again after a kill: resumes
    crashdrill run quick --run-dir runs/q --mirror gs://BUCKET/runs   … its checkpoints copied off
    crashdrill run quick --run-dir runs/q --stop-after 11h30m   stop and save before a 12 h wall
    crashdrill verify --preset quick --kills 2        the kill-and-resume drill
    crashdrill verify -- python train.py              the drill on any training script
    crashdrill inspect ckpt.pt                        what a checkpoint holds, what it lacks
    crashdrill presets list|show NAME|validate FILE
    crashdrill presets show quick > mine.toml         start a preset of your own from a built-in
    crashdrill doctor gcs gs://BUCKET/PREFIX          check a checkpoint mirror bucket
    crashdrill doctor supabase                        check a Supabase project's Realtime

Exit codes (trainer/exit_codes.py): 0 ok, 1 a check failed, 2 bad usage or input, 3 a run
was told a checkpoint must exist and none did, 4 a run diverged, 75 a run stopped
gracefully (SIGTERM, SIGINT or --stop-after) with a complete checkpoint: run the same
command to resume, 141 our output was closed (`crashdrill … | head`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path
from typing import Any

from crashdrill.closed_output import quiet_when_output_closed
from crashdrill.trainer.exit_codes import (
    EXIT_DIVERGED,
    EXIT_NO_CHECKPOINT,
    EXIT_OK,
    EXIT_STOPPED,
    EXIT_USAGE,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own exit code is already 2
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _progress_printer(label: str) -> Any:
    tty = sys.stderr.isatty()
    state = {"last": 0.0, "t0": time.perf_counter(), "pct": -1}

    def show(step: int, total: int, loss: float) -> None:
        now = time.perf_counter()
        pct = int(100 * step / total)
        if tty:
            if now - state["last"] < 0.2 and step != total:
                return
            state["last"] = now
            bar = "#" * (pct // 4) + "-" * (25 - pct // 4)
            end = "\n" if step == total else ""
            sys.stderr.write(
                f"\r{label} [{bar}] {step}/{total} loss {loss:.4f} {now - state['t0']:.1f}s{end}"
            )
        elif pct // 10 != state["pct"] // 10 or step == total:
            state["pct"] = pct
            sys.stderr.write(f"{label} step {step}/{total} loss {loss:.4f} ({pct}%)\n")
        sys.stderr.flush()

    return show


def _cmd_run(args: argparse.Namespace) -> int:
    from crashdrill.trainer.checkpoint_pause import PauseError
    from crashdrill.trainer.config import ConfigError, parse_override
    from crashdrill.trainer.data import DataError
    from crashdrill.trainer.loop import CheckpointMismatch, RunDirError, RunOptions, train
    from crashdrill.trainer.presets import PresetError, get_preset

    try:
        preset = get_preset(args.preset)
        cfg = preset.config_for(args.label, cuda=_cuda_available())
        if args.set:
            cfg = cfg.with_overrides(dict(parse_override(s) for s in args.set))
        if args.stop_after is not None:
            cfg = cfg.with_overrides({"stop_after": args.stop_after})
    except (PresetError, ConfigError) as e:
        print(f"crashdrill run: {e}", file=sys.stderr)
        return EXIT_USAGE
    opts = RunOptions(
        label=args.label,
        preset=preset.id,
        require_checkpoint=args.require_checkpoint,
        jsonl=args.jsonl,
        progress=None if args.quiet else _progress_printer(f"{preset.id}/{args.label}"),
    )
    try:
        if not args.mirror:
            return train(cfg, args.run_dir, opts)
        return _train_mirrored(args.mirror, Path(args.run_dir), cfg, opts)
    except (RunDirError, DataError, CheckpointMismatch, ConfigError, PauseError) as e:
        print(f"crashdrill run: {e}", file=sys.stderr)
        return EXIT_USAGE


def _train_mirrored(url: str, run_dir: Path, cfg: Any, opts: Any) -> int:
    from crashdrill.trainer.loop import train
    from crashdrill.workers.mirror_backends import MirrorError, MirrorURLError
    from crashdrill.workers.run_mirror import mirrored_run

    def say(text: str) -> None:
        print(f"crashdrill run: {text}", file=sys.stderr, flush=True)

    if run_dir.exists() and not run_dir.is_dir():
        say(f"--run-dir {str(run_dir)!r} is a file; give a directory")
        return EXIT_USAGE
    try:
        with mirrored_run(url, run_dir, say) as mirrored:
            opts.flush = mirrored.flush  # a graceful stop copies its checkpoint before exiting
            return train(cfg, run_dir, opts)
    except (MirrorURLError, MirrorError) as e:
        say(f"--mirror {url!r}: {e}")
        return EXIT_USAGE


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _cmd_presets(args: argparse.Namespace) -> int:
    import json

    from crashdrill.server.lessons.policy import public_view
    from crashdrill.trainer.crash_modes import DEFAULT as DEFAULT_CRASH_MODE
    from crashdrill.trainer.presets import (
        PresetError,
        dump_preset,
        get_preset,
        list_presets,
        load_preset_file,
    )

    try:
        if args.action == "list":
            for p in list_presets():
                flags = "" if p.published else "  [unpublished]"
                mode = "" if p.crash.mode == DEFAULT_CRASH_MODE else f", crash {p.crash.mode}"
                print(f"{p.id:<16} {p.number:<6} {p.title}  ({p.knob_text()}{mode}){flags}")
            return EXIT_OK
        if not args.name:
            what = "name a preset" if args.action == "show" else "give a preset file"
            print(f"crashdrill presets {args.action}: {what}", file=sys.stderr)
            return EXIT_USAGE
        if args.action == "show":
            preset = get_preset(args.name)
            if args.json:
                print(json.dumps(public_view(preset), indent=2))
            else:  # the TOML that `presets validate` reads: a start for a preset of one's own
                sys.stdout.write(dump_preset(preset))
            return EXIT_OK
        p = load_preset_file(args.name)
    except PresetError as e:
        if args.action == "validate":
            print(f"{args.name}: invalid preset", file=sys.stderr)
            for problem in e.problems:
                print(f"  - {problem}", file=sys.stderr)
        else:
            print(f"crashdrill presets: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{args.name}: ok — {p.id} · {p.title} · {p.knob_text()} · crash {p.crash.mode}")
    if args.action == "validate":
        from crashdrill.trainer.presets import window_warnings

        for warning in window_warnings(p):
            print(f"  warning: {warning}", file=sys.stderr)
    return EXIT_OK


def _optional(module: str, name: str, help_text: str, sub: Any, selected: bool) -> None:
    """Subcommands whose code lives elsewhere (drill, server) register themselves, and are
    imported only when chosen: `crashdrill run` must not pay for importing a web stack.
    A missing optional dependency becomes a clear message instead of a traceback."""
    if not selected:
        sub.add_parser(name, help=help_text, add_help=False)
        return
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        missing = e.name or module
        p = sub.add_parser(name, help=help_text)

        def unavailable(_args: argparse.Namespace) -> int:
            print(
                f"crashdrill {name} needs {missing}: pip install 'crashdrill[server]'",
                file=sys.stderr,
            )
            return EXIT_USAGE

        p.set_defaults(func=unavailable)
        return
    p = mod.add_parser(sub)
    p.set_defaults(func=mod.run)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="crashdrill", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser(
        "run",
        help="one headless training run (resumes when run again)",
        epilog=f"exit status: {EXIT_OK} finished; {EXIT_USAGE} bad preset, setting or run dir;"
        f" {EXIT_NO_CHECKPOINT} no checkpoint and --require-checkpoint; {EXIT_DIVERGED}"
        " diverged (the loss or gradient norm turned NaN or infinite; nothing saved after"
        f" it); {EXIT_STOPPED} stopped gracefully (SIGTERM, SIGINT or --stop-after) with a"
        " complete checkpoint of its last step: run the same command to resume",
    )
    run.add_argument("preset", help="a preset id (see `crashdrill presets list`) or a TOML file")
    run.add_argument("--run-dir", required=True, help="where checkpoints and records live")
    run.add_argument("--label", default="A", choices=["A", "B"], help="which run of the pair")
    run.add_argument(
        "--require-checkpoint",
        action="store_true",
        help="exit 3 without training when no usable checkpoint exists",
    )
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a setting")
    run.add_argument(
        "--mirror",
        metavar="URL",
        help="copy each checkpoint off the machine in the background (a directory, or"
        " gs://BUCKET[/PREFIX]); a run dir without a checkpoint resumes from the newest"
        " copy there that verifies",
    )
    run.add_argument(
        "--stop-after",
        metavar="DURATION",
        help="a time budget such as 11h30m, 45m or 90s: stop gracefully before it runs out,"
        " leaving a margin sized from the measured checkpoint time. SIGTERM and SIGINT stop"
        " the same way at once: the step in flight finishes, a complete checkpoint is saved,"
        " and the exit status is 75 (run the same command to resume)",
    )
    run.add_argument("--jsonl", action="store_true", help="print one JSON line per step to stdout")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=_cmd_run)

    presets = sub.add_parser("presets", help="list, show or validate lesson presets")
    presets.add_argument("action", choices=["list", "show", "validate"])
    presets.add_argument("name", nargs="?", help="preset id (show) or TOML file (validate)")
    presets.add_argument(
        "--json",
        action="store_true",
        help="show: the preset as JSON (what a lesson page gets) instead of TOML",
    )
    presets.set_defaults(func=_cmd_presets)

    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    _optional(
        "crashdrill.drill.verify_cli",
        "verify",
        "kill a run at random points, resume, compare bits",
        sub,
        command == "verify",
    )
    _optional(
        "crashdrill.drill.checkpoint_inspect",
        "inspect",
        "what a checkpoint holds and what a full resume needs but it lacks",
        sub,
        command == "inspect",
    )
    _optional(
        "crashdrill.server.serve_cli", "serve", "the lab in a browser", sub, command == "serve"
    )
    _optional(
        "crashdrill.doctor",
        "doctor",
        "check a production part (gcs, supabase) against your own account",
        sub,
        command == "doctor",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    return quiet_when_output_closed(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
