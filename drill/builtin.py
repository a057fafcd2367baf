"""The built-in trainer as a drill target: `crashdrill verify --preset NAME [--run A|B]`.

It is the generic engine pointed at `python -m crashdrill run PRESET --jsonl`, with what
the trainer's contract (docs/run-contract.md) adds: exact `loss_bits`, the checkpoint
cadence from the preset, `--require-checkpoint` on every restart, the loud
`resumed at step N` line, and a pause hook that holds a checkpoint write open so that a
kill lands inside it.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from crashdrill.drill.diverged import Divergence
from crashdrill.drill.plan import KillPoint, draw_kills, plan_gaps
from crashdrill.drill.snapshot import Snapshot, scan
from crashdrill.drill.target import Child, Segment, Target, WriteWatch
from crashdrill.drill.trace import LossParser
from crashdrill.processes.forkserver import RANKS_PRELOAD, TRAINER_PRELOAD, ForkServer
from crashdrill.trainer import checkpoint_pause
from crashdrill.trainer.checkpoint_layout import (
    INPLACE_SLOT,
    ckpt_root,
    manifest_owner,
    parse_step_dir,
    temp_dir_name,
)
from crashdrill.trainer.divergence import parse_diverged_line
from crashdrill.trainer.exit_codes import EXIT_DIVERGED, EXIT_NO_CHECKPOINT
from crashdrill.trainer.start_line import resumed_step

PAUSE_SECONDS = 30  # the kill lands as soon as the pause begins; this only bounds a miss


class PauseWatch(WriteWatch):
    """The trainer announces the pause on stderr; the temp dir is the fallback signal.

    The evidence of what the write overwrote is the dir as it stood before the write: it
    is taken at the first step line after the previous checkpoint (whose write finished
    before that line was printed), not at the line just before the write, which the
    drill may read only once the write has begun."""

    interval = 0.02

    def __init__(self, root: Path, step: int, every: int) -> None:
        self.root = root
        self.step = step
        self.after_previous = step - every
        self.tmp = root / temp_dir_name(step)
        self.seen: float | None = None
        self.before: Snapshot | None = None

    def on_step(self, step: int) -> None:
        if self.before is None and self.after_previous < step <= self.step:
            self.before = scan(self.root)

    def shows_state_before(self, step: int) -> bool:
        # Between the previous checkpoint and the write: the engine copies at the first of
        # these lines and again only when the dir changed (an async write that finished).
        return self.after_previous < step < self.step

    def snapshot_before(self) -> Snapshot | None:
        return self.before

    def on_stderr(self, line: str) -> bool:
        return checkpoint_pause.paused_step(line) == self.step

    def poll(self) -> bool:
        if not self.tmp.is_dir():
            return False
        self.seen = self.seen or time.monotonic()
        return time.monotonic() - self.seen > 0.5  # sat there that long: it is the pause


# What the fork server imports once, so that a trainer start forked from it does not:
# code only (torch and everything `crashdrill run` imports), never a run's state.
FORK_SERVER_PRELOAD = [
    *TRAINER_PRELOAD,  # what the lab's warm trainers import too (workers/warm.py)
    "crashdrill.drill.final_state",  # the final comparison, run after the last step
]


def ranks_preload(preset: str, label: str, overrides: list[str] | None) -> list[str]:
    """What the fork server imports besides FORK_SERVER_PRELOAD: for a run of several ranks
    the rank loop (about 1.8 s of imports a one-rank drill need not wait for, and that each
    restarted group would pay without it), else nothing. A preset or setting that is wrong
    adds nothing: PresetTarget says what is wrong."""
    from crashdrill.trainer.config import parse_override
    from crashdrill.trainer.presets import get_preset

    try:
        changes = dict(parse_override(s) for s in overrides or [])
        ranks = get_preset(preset).config_for(label).with_overrides(changes).ranks
    except Exception:
        ranks = 1
    return list(RANKS_PRELOAD) if ranks > 1 else []


class PresetTarget(Target):
    rank = 0  # the trainer prints on rank 0 only; its records carry each rank's loss bits

    def __init__(
        self,
        preset: str,
        label: str = "A",
        *,
        timeout: float = 600.0,
        fork_server: ForkServer | None = None,
        overrides: list[str] | None = None,
    ) -> None:
        from crashdrill.trainer.config import parse_override
        from crashdrill.trainer.presets import get_preset

        p = get_preset(preset)  # PresetError names the known presets
        # Parsed and applied here, as the trainer will (ConfigError names a bad one): the
        # plan follows the cadence the trainer will really have.
        self.overrides = list(overrides or [])
        changes = dict(parse_override(s) for s in self.overrides)
        cfg = p.config_for(label).with_overrides(changes)
        on_cuda = p.config_for(label, cuda=True).with_overrides(changes)
        if (on_cuda.steps, on_cuda.ckpt_every, on_cuda.ckpt_policy) != (
            cfg.steps,
            cfg.ckpt_every,
            cfg.ckpt_policy,
        ) and _cuda_available():
            cfg = on_cuda  # the trainer will run the CUDA variant: plan for its cadence
        self.preset = p.id if not preset.endswith(".toml") else preset
        self.label = label
        self.steps = cfg.steps
        self.ckpt_every = cfg.ckpt_every
        self.ckpt_policy = cfg.ckpt_policy
        self.parser = LossParser(shape="json")
        self.timeout = timeout
        self.fork_server = fork_server  # None: every trainer start is a plain exec

    def command(self, ckpt_dir: Path, restart: bool) -> list[str]:
        argv = [sys.executable, "-m", "crashdrill", "run", self.preset, "--run-dir"]
        argv += [str(ckpt_dir), "--label", self.label, "--jsonl", "--quiet"]
        for setting in self.overrides:
            argv += ["--set", setting]
        return argv + (["--require-checkpoint"] if restart else [])

    def start(self, argv: list[str], env: dict[str, str], cwd: str | None) -> Child:
        if self.fork_server is None:
            return super().start(argv, env, cwd)
        return self.fork_server.spawn_piped(argv, env, cwd)  # ForkServerError: verify falls back

    def environ(self, ckpt_dir: Path, kill: KillPoint | None) -> dict[str, str]:
        if kill is not None and kill.during_write:
            return {checkpoint_pause.ENV: checkpoint_pause.format_pause(kill.step, PAUSE_SECONDS)}
        return {}

    def checkpoint_root(self, ckpt_dir: Path) -> Path:
        return ckpt_root(ckpt_dir)

    def has_checkpoint(self, snap: Snapshot | None) -> bool:
        # A snapshot holds names and file stats, not contents: a checkpoint directory
        # (checkpoint_layout.py's names) with its manifest is the most it can tell.
        return any(manifest_owner(k) for k in snap or {})

    def progress_saved(self, baseline: Snapshot | None, before_kill: Snapshot | None) -> bool:
        # The step-0 checkpoint is where a fresh run starts anyway: only a later one counts.
        # The in-place slot (`latest/`) holds whichever step it was last written for: it
        # counts once its manifest was rewritten after the run printed its first step.
        for k, stat in (before_kill or {}).items():
            owner = manifest_owner(k)
            if owner == INPLACE_SLOT and (baseline or {}).get(k) != stat:
                return True
            if owner and owner != INPLACE_SLOT and (parse_step_dir(owner) or 0) > 0:
                return True
        return False

    def write_watch(self, ckpt_dir: Path, kill: KillPoint) -> WriteWatch:
        every = self.ckpt_every if self.ckpt_policy == "every" else self.steps
        return PauseWatch(self.checkpoint_root(ckpt_dir), kill.step, every)

    def exit_meaning(self, code: int | None) -> str | None:
        if code == EXIT_NO_CHECKPOINT:
            return (
                "refused to start: no usable checkpoint"
                f" (exit {EXIT_NO_CHECKPOINT} under --require-checkpoint)"
            )
        if code == EXIT_DIVERGED:
            return f"diverged: its loss or gradient norm was not finite (exit {EXIT_DIVERGED})"
        return None

    def diverged(self, segment: Segment) -> Divergence | None:
        # The exit status says it diverged; the trainer's line says where and why.
        if segment.killed or segment.exit_code != EXIT_DIVERGED:
            return None
        for line in reversed(segment.stderr_tail + segment.stderr_head):
            said = parse_diverged_line(line)
            if said is not None:
                return Divergence(*said)
        meaning = self.exit_meaning(EXIT_DIVERGED) or ""
        return Divergence(segment.last_step or 0, meaning.split(": ", 1)[-1])

    def resumed_from(self, segment: Segment) -> int | None:
        return resumed_step("\n".join(segment.stderr_head))  # trainer/start_line.py

    def plan(self, rng: random.Random, kills: int) -> list[KillPoint]:
        """First kill before the first checkpoint after step 0; one inside the write of a
        checkpoint the trainer will write (a multiple of ckpt_every before the last step);
        the others between two writes."""
        first, writes, checkpoints = self._cadence()
        return draw_kills(rng, kills, self._candidates(), first, writes, checkpoints=checkpoints)

    def plan_gaps(self, plan: list[KillPoint], kills: int) -> dict[str, str]:
        """The trial kinds `plan` cannot exercise, and why (drill/plan.py, `plan_gaps`)."""
        first, writes, checkpoints = self._cadence()
        return plan_gaps(plan, kills, first, checkpoints, writes)

    def _cadence(self) -> tuple[int, list[int], list[int]]:
        """The first checkpoint after step 0, the writes a kill may land in, every write."""
        if self.ckpt_policy == "every":
            checkpoints = sorted({*range(self.ckpt_every, self.steps, self.ckpt_every), self.steps})
            writes = list(range(self.ckpt_every, self.steps, self.ckpt_every)) or [self.steps]
            return checkpoints[0], writes, checkpoints
        return self.steps, [self.steps], [self.steps]  # "end": the only write is the last one

    def _candidates(self) -> range:
        # Plain kills stay out of the last tenth: a kill decided on reading step N must
        # land before the run ends, even when the drill reads its output late.
        return range(1, max(2, self.steps - max(1, self.steps // 10)))

    def describe(self) -> dict[str, object]:
        return {
            "preset": self.preset,
            "run": self.label,
            "steps": self.steps,
            "ckpt_every": self.ckpt_every,
            "starts": "fork-server" if self.fork_server else "exec",
            "set": list(self.overrides),
        }


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())
