"""Where the kills land: drawn from a seed, so that `--seed S` replays a failure.

The plan is a list of KillPoints in the order the crashed run meets them:

- the first kill lands before the first checkpoint after the start (a resume from
  nothing, or from the step-0 checkpoint, must work too);
- with two kills or more, one lands *while a checkpoint is being written* (a torn write
  must not be loadable); in a soak (10 kills or more) one in five does, each in a
  different write;
- the others are spread over the run, one per equal slice of it.

Each kill is one **trial** of a kind (`KillPoint.kind`, TRIAL_KINDS): a kill before the
first checkpoint, a plain kill after a complete checkpoint, a kill inside a write, a
preemption. The engine keeps a copy of the checkpoint dir from before every kill that may
damage it (inside a write, a preemption) and, when the restart after it fails, restores
that copy and adds a plain kill after the write (`recovery`), so that a torn write does
not hide what a plain resume would have shown (drill/engine.py, `run_crashed`).

With `--preempt` (`preempt_plan`) kills become preemptions, as spot VMs and SLURM do it:
SIGTERM, then SIGKILL after the grace. "all" turns every kill into one (a kill planned
inside a write becomes a SIGTERM at that step); "mixed" draws, from the same seed, which
ones, with at least one of each when there are two or more.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# What a trial tests; the report names each (docs/verify.md, "Trials").
TRIAL_KINDS = {
    "before-first-checkpoint": "a kill before the first checkpoint",
    "after-checkpoint": "a plain kill after a complete checkpoint",
    "inside-write": "a kill inside a checkpoint write",
    "preemption": "a preemption (SIGTERM, then SIGKILL after the grace)",
}
SOAK_KILLS = 10  # from this many kills on, a plan is a soak:
WRITES_EVERY = 5  # one kill in this many lands inside a checkpoint write


@dataclass(frozen=True)
class KillPoint:
    """Kill the crashed run once it has printed `step` (or a later one). With
    `during_write`, wait from `step` on for the next checkpoint write and kill inside it."""

    step: int
    during_write: bool = False
    preempt: bool = False  # SIGTERM, then SIGKILL after `grace_s` unless it has exited
    grace_s: float = 0.0
    before_first: bool = False  # drawn before the first checkpoint
    # Added by the engine after a damaging trial whose restart failed: a plain kill at the
    # first step line after that write, from a copy of the state before it.
    recovery: bool = False

    @property
    def kind(self) -> str:
        """The trial this kill was planned as (a key of TRIAL_KINDS); where it landed is
        judged from evidence afterwards (drill/landing.py)."""
        if self.preempt:
            return "preemption"
        if self.during_write:
            return "inside-write"
        return "before-first-checkpoint" if self.before_first else "after-checkpoint"

    def describe(self) -> str:
        if self.recovery:
            return f"a plain kill after the checkpoint write, at step {self.step}"
        if self.preempt:
            return f"a SIGTERM at step {self.step} ({self.grace_s:g} s grace)"
        if self.during_write:
            return f"during the checkpoint write after step {self.step}"
        return f"at step {self.step}"


def draw_kills(
    rng: random.Random,
    kills: int,
    candidates: Sequence[int],
    first_ckpt: int | None,
    write_steps: Sequence[int] | None = None,
) -> list[KillPoint]:
    """`kills` kill points among `candidates` (the steps a kill may follow, in order).

    first_ckpt: the step of the first checkpoint after the start, when known; the first
    kill lands before it. write_steps: steps whose checkpoint write can be caught exactly
    (the built-in trainer's pause hook); None when the write is recognised only by the
    checkpoint dir changing, after some step; empty when there is no write to catch."""
    cands = sorted(set(candidates))
    if kills <= 0 or not cands:
        return []
    # A fixed number of draws in a fixed order, each mapped onto its list by position: a
    # list one step shorter (a first checkpoint observed a step earlier on a busy machine)
    # moves a kill by at most a step instead of reshuffling the whole plan.
    u = [rng.random() for _ in range(kills + 2)]
    points: list[KillPoint] = []
    used: set[int] = set()

    early = [s for s in cands if first_ckpt is not None and s < first_ckpt]
    if early:
        points.append(KillPoint(_pick(early, u[0]), before_first=True))
        used.add(points[-1].step)

    if kills >= 2:
        after = max(used, default=cands[0] - 1)
        if write_steps is not None:
            choices = [c for c in write_steps if c > after]
        else:
            # Armed after the first checkpoint's step: the write it lands in is a later one,
            # so a complete checkpoint exists to fall back on (or to find torn in place).
            choices = [s for s in cands if s > after and (first_ckpt is None or s > first_ckpt)]
        if choices:
            points.append(KillPoint(_pick(choices, u[1]), during_write=True))
            used.add(points[-1].step)
        rest = [c for c in choices if c not in used]
        n = min(kills // WRITES_EVERY - 1 if kills >= SOAK_KILLS else 0, len(rest))
        more = [rng.random() for _ in range(n)]  # after the others: small plans unchanged
        for i in range(n):  # a soak: one kill in five inside a write, spread over them
            lo, hi = i * len(rest) // n, (i + 1) * len(rest) // n
            points.append(KillPoint(_pick(rest[lo:hi], more[i]), during_write=True))
            used.add(points[-1].step)

    pool = [s for s in cands if s not in used]
    remaining = min(kills - len(points), len(pool))
    for i in range(remaining):  # one kill per equal slice of the run
        lo, hi = i * len(pool) // remaining, (i + 1) * len(pool) // remaining
        points.append(KillPoint(_pick(pool[lo:hi], u[2 + i])))
    return sorted(points, key=lambda p: p.step)


def _pick(items: Sequence[int], u: float) -> int:
    return items[min(int(u * len(items)), len(items) - 1)]


PREEMPT_MODES = ("all", "mixed")


def preempt_plan(
    rng: random.Random, plan: Sequence[KillPoint], mode: str, grace_s: float
) -> list[KillPoint]:
    """The plan with its kills turned into preemptions: every one ("all"), or a draw
    from `rng` ("mixed": at least one preemption and, with two kills or more, one kill)."""
    if mode not in PREEMPT_MODES:
        raise ValueError(f"--preempt {mode!r}: one of {', '.join(PREEMPT_MODES)}")
    if mode == "all":
        chosen = set(range(len(plan)))
    else:
        draws = [rng.random() < 0.5 for _ in plan]
        if len(plan) >= 2 and all(draws):
            draws[rng.randrange(len(plan))] = False
        if plan and not any(draws):
            draws[rng.randrange(len(plan))] = True
        chosen = {i for i, d in enumerate(draws) if d}
    return [
        KillPoint(k.step, preempt=True, grace_s=grace_s) if i in chosen else k
        for i, k in enumerate(plan)
    ]
