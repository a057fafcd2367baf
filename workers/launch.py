"""How the lab starts one run's trainer (`Launch`), and what a supervisor tells its owner
about the run (`Change`): the data both sides of the supervisor agree on, kept apart
from its restart policy (workers/supervisor.py).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from crashdrill.workers.trainer_env import env_pass_from_environ

DEFAULT_COMMAND = (sys.executable, "-m", "crashdrill", "run")
State = Literal["running", "restarting", "finished", "failed", "stopped", "diverged"]
ENDED: tuple[State, ...] = ("finished", "failed", "stopped", "diverged")


@dataclass(frozen=True)
class Launch:
    """How to start the trainer of one run."""

    run_dir: Path
    preset: str
    label: str
    command: tuple[str, ...] = DEFAULT_COMMAND
    env: Mapping[str, str] = field(default_factory=dict)
    # Names or PREFIX* patterns the trainer inherits beyond the allowlist (workers/trainer_env.py).
    env_pass: tuple[str, ...] = field(default_factory=env_pass_from_environ)
    # The run's config says on_missing_checkpoint = "fresh": a restart that finds no
    # checkpoint trains from scratch instead of refusing (its restart event says so).
    fresh_start_allowed: bool = False
    # Settings the trainer is started with beyond its preset's (`--set KEY=VALUE` each), and
    # those a crash test's restart switches to for good: a lesson's `[crash] restart_ranks`
    # resumes the run on another world size (server/lessons/crash_effects.py).
    settings: tuple[str, ...] = ()
    crash_settings: tuple[str, ...] = ()

    def argv(self, *, require_checkpoint: bool, run_dir: Path | None = None) -> list[str]:
        """The command line; `run_dir`: where the trainer keeps its files, when that is
        not the server's copy (a cluster node's own disk). A preset file kept in the run
        dir (a frozen preset) is named at that place too: it travels with the run dir."""
        where = run_dir or self.run_dir
        preset = self.preset
        kept = Path(preset)
        if run_dir is not None and kept.is_absolute() and kept.parent == self.run_dir:
            preset = str(run_dir / kept.name)
        args = [*self.command, preset, "--run-dir", str(where), "--label", self.label]
        for setting in self.settings:
            args += ["--set", setting]
        if require_checkpoint:
            args.append("--require-checkpoint")
        return args

    def after_crash(self) -> Launch:
        """The launch of every start after a crash test: its crash settings taken on."""
        if not self.crash_settings:
            return self
        return replace(self, settings=(*self.settings, *self.crash_settings), crash_settings=())

    def ranks(self) -> int | None:
        """The world size its settings set (the last `ranks=N`); None: the preset's."""
        for setting in reversed(self.settings):
            key, _, value = setting.partition("=")
            if key.strip() == "ranks" and value.strip().isdigit():
                return int(value)
        return None

    def with_ranks(self, ranks: int) -> Launch:
        """The launch of every start from now on on `ranks` ranks (a restart on fewer ranks
        where no node has room for the group any more)."""
        kept = tuple(s for s in self.settings if s.partition("=")[0].strip() != "ranks")
        return replace(self, settings=(*kept, f"ranks={ranks}"))


@dataclass(frozen=True)
class Change:
    """What the supervisor tells its owner, from whichever thread noticed it."""

    state: State
    pid: int | None = None
    pid_started: float | None = None
    exit_code: int | None = None
    text: str = ""  # for everyone who sees the run: no path, no traceback
    detail: str = ""  # a failure's stderr tail: the lab's log and the instructor's view only


class NotRunning(RuntimeError):
    """The run has no live trainer process to signal."""
