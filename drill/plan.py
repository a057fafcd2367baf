"""Where the kills land: drawn from a seed, so that `--seed S` replays a failure.

The plan is a list of KillPoints in the order the crashed run meets them, placed from the
steps after which the run writes its checkpoints (`checkpoints`: what the reference run
was seen to write, or the built-in trainer's cadence), so that each trial lands where its
name says:

- the first kill lands before the first checkpoint after the start (a resume from
  nothing, or from the step-0 checkpoint, must work too), in the first quarter of the
  step lines before it (EARLY_SHARE): anywhere in that window tests the same resume, and
  every step before the kill is trained again, so a late one only costs time (a script
  whose first checkpoint comes after 1000 steps would recompute up to 999);
- with two kills or more, one lands *while a checkpoint is being written* (a torn write
  must not be loadable), in a write that is neither the first (a complete checkpoint
  must exist to fall back on) nor the last (a plain kill after it must still land); in a
  soak (10 kills or more) one in five does, each in a different write;
- the others are plain kills after a complete checkpoint and before the next write, with
  steps to recompute (never at a write's own step line), one per equal slice of those.

Each kill is one **trial** of a kind (`KillPoint.kind`, TRIAL_KINDS): a kill before the
first checkpoint, a plain kill after a complete checkpoint, a kill inside a write, a
preemption. What a kill tested is judged afterwards from evidence (drill/landing.py,
drill/judge.py); a plan that cannot hold a kind says why (`plan_gaps`), and the
report prints it. Before a kill inside a write the engine copies the checkpoint dir as
it stands just before that write (`KillPoint.after_write`: from the step line after the
write before it) and, when the restart after the kill fails, puts that copy back and adds
a plain kill after the write (`recovery`), so that a torn write does not hide what a plain
resume would have shown (drill/engine.py, `run_crashed`).

With `--preempt` (`preempt_plan`) kills become preemptions, as spot VMs and SLURM do it:
SIGTERM, then SIGKILL after the grace. "all" turns every kill into one (a kill planned
inside a write becomes a SIGTERM at that step); "mixed" draws, from the same seed, which
ones, with at least one of each when there are two or more.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# What a trial tests; the report names each (docs/verify.md, "Trials"). "The first
# checkpoint" is the first one after the start: a step-0 checkpoint (the built-in
# trainer writes one) is where a fresh run starts anyway, so a kill before the next one
# resumes from it.
TRIAL_KINDS = {
    "before-first-checkpoint": "a kill before the first checkpoint after the start",
    "after-checkpoint": "a plain kill after a complete checkpoint",
    "inside-write": "a kill inside a checkpoint write",
    "preemption": "a preemption (SIGTERM, then SIGKILL after the grace)",
    "rank-kill": "a SIGKILL to one rank's process, not the launcher",
}
ASKED_ONLY = ("preemption", "rank-kill")  # trial kinds a plan holds only when asked for
SOAK_KILLS = 10  # from this many kills on, a plan is a soak:
WRITES_EVERY = 5  # one kill in this many lands inside a checkpoint write
EARLY_SHARE = 4  # the first kill lands in the first 1/EARLY_SHARE of the steps before a checkpoint


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
    # during_write: the step after which the run wrote its checkpoint before the one this
    # kill is aimed at; from the step line after it the dir stands as that write will find
    # it (the engine copies it from there). None: from the process's first step line.
    after_write: int | None = None
    # --kill-rank: SIGKILL only this rank's process (drill/rank_kill.py), not the tree
    rank: int | None = None

    @property
    def kind(self) -> str:
        """The trial this kill was planned as (a key of TRIAL_KINDS); what it tested is
        judged from evidence afterwards (drill/landing.py, drill/judge.py)."""
        if self.preempt:
            return "preemption"
        if self.rank is not None:
            return "rank-kill"
        if self.during_write:
            return "inside-write"
        return "before-first-checkpoint" if self.before_first else "after-checkpoint"

    def describe(self) -> str:
        if self.recovery:
            return f"a plain kill after the checkpoint write, at step {self.step}"
        if self.preempt:
            return f"a SIGTERM at step {self.step} ({self.grace_s:g} s grace)"
        if self.rank is not None:
            return f"rank {self.rank}'s process at step {self.step}"
        if self.during_write:
            return f"during the checkpoint write after step {self.step}"
        return f"at step {self.step}"


def draw_kills(
    rng: random.Random,
    kills: int,
    candidates: Sequence[int],
    first_ckpt: int | None,
    write_steps: Sequence[int] | None = None,
    *,
    checkpoints: Sequence[int] | None = None,
) -> list[KillPoint]:
    """`kills` kill points among `candidates` (the steps a kill may follow, in order).

    first_ckpt: the step of the first checkpoint after the start, when known; the first
    kill lands before it. write_steps: the writes a kill may land in (each the step
    printed before it), neither the first nor the last; None when they are not known (a
    write kill is then armed after the first checkpoint and lands in the next write);
    empty when there is no such write. checkpoints: every step after which the run writes
    a checkpoint, when known: the plain kills then land after the first one, each between
    two writes (never at a write's own step line), so each has steps to recompute from a
    complete checkpoint; without it, after `first_ckpt`."""
    cands = sorted(set(candidates))
    if kills <= 0 or not cands:
        return []
    # A fixed number of draws in a fixed order, each mapped onto its list by position: a
    # list one step shorter (a first checkpoint observed a step earlier on a busy machine)
    # moves a kill by at most a step instead of reshuffling the whole plan.
    u = [rng.random() for _ in range(kills + 2)]
    points: list[KillPoint] = []
    used: set[int] = set()
    writes = sorted(set(checkpoints or ()))
    first = writes[0] if writes else first_ckpt

    early = [s for s in cands if first is not None and s < first]
    early = early[: -(-len(early) // EARLY_SHARE)]  # the first quarter, rounded up
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
            choices = [s for s in cands if s > after and (first is None or s > first)]
        if choices:
            points.append(_aimed(KillPoint(_pick(choices, u[1])), writes))
            used.add(points[-1].step)
        rest = [c for c in choices if c not in used]
        n = min(kills // WRITES_EVERY - 1 if kills >= SOAK_KILLS else 0, len(rest))
        more = [rng.random() for _ in range(n)]  # after the others: small plans unchanged
        for i in range(n):  # a soak: one kill in five inside a write, spread over them
            lo, hi = i * len(rest) // n, (i + 1) * len(rest) // n
            points.append(_aimed(KillPoint(_pick(rest[lo:hi], more[i]), True), writes))
            used.add(points[-1].step)

    remaining = kills - len(points)
    pool = [s for s in cands if s not in used and s not in writes and (first is None or s > first)]
    if len(pool) < remaining:  # more kills than plain steps after a checkpoint: any step
        pool = [s for s in cands if s not in used]
    remaining = min(remaining, len(pool))
    none = checkpoints is not None and not writes  # known to write no checkpoint at all
    for i in range(remaining):  # one kill per equal slice of the steps after a checkpoint
        lo, hi = i * len(pool) // remaining, (i + 1) * len(pool) // remaining
        step = _pick(pool[lo:hi], u[2 + i])
        points.append(KillPoint(step, before_first=none or (first is not None and step < first)))
    return sorted(points, key=lambda p: p.step)


def _before(writes: Sequence[int], step: int) -> int | None:
    """The newest of `writes` before `step`."""
    older = [w for w in writes if w < step]
    return older[-1] if older else None


def _aimed(kill: KillPoint, writes: Sequence[int]) -> KillPoint:
    """A write kill with the write before its own (`after_write`), when the writes are known."""
    return KillPoint(kill.step, during_write=True, after_write=_before(writes, kill.step))


def plan_gaps(
    plan: Sequence[KillPoint],
    kills: int,
    first_ckpt: int | None,
    checkpoints: Sequence[int] | None,
    write_steps: Sequence[int] | None,
) -> dict[str, str]:
    """The trial kinds (TRIAL_KINDS keys, not preemption) that the plan holds no kill of,
    each with why: what the run's checkpoints or `--kills` leave no room for."""
    kinds = {k.kind for k in plan}
    writes = sorted(set(checkpoints or ()))
    first = writes[0] if writes else first_ckpt
    saw = _wrote(writes)
    gaps: dict[str, str] = {}
    if kills <= 0:
        return {k: "no kill was asked for (--kills 0)" for k in TRIAL_KINDS if k not in ASKED_ONLY}
    if not (kinds & {"before-first-checkpoint", "preemption"}):
        gaps["before-first-checkpoint"] = (
            f"{_NONE}: every kill lands before the first one"
            if first is None
            else f"no step line comes before the first checkpoint (after step {first})"
        )
    if "after-checkpoint" not in kinds:
        if first is None:
            gaps["after-checkpoint"] = f"{_NONE}: there is nothing to resume from"
        elif len(plan) >= kills:
            gaps["after-checkpoint"] = (
                f"the {kills} kill(s) went to the other trials: --kills {max(kills + 1, 3)} adds "
                "a plain kill after a complete checkpoint"
            )
        else:
            gaps["after-checkpoint"] = f"no step line between writes follows {saw}"
    if "inside-write" not in kinds and "preemption" not in kinds:
        if kills < 2:
            gaps["inside-write"] = "one kill: a kill inside a write needs --kills 2 or more"
        elif first is None:
            gaps["inside-write"] = f"{_NONE}: there is no write to land in"
        elif write_steps is not None and not write_steps:
            gaps["inside-write"] = (
                f"the run wrote {saw}: a kill inside a write needs one that is neither the "
                "first (no complete checkpoint to fall back on) nor the last (no plain kill "
                "after it)"
            )
        else:
            gaps["inside-write"] = f"no write after the first kill's step could be aimed at ({saw})"
    return gaps


def preempt_gaps(
    plan: Sequence[KillPoint], preempted: list[KillPoint], gaps: dict[str, str]
) -> tuple[list[KillPoint], dict[str, str]]:
    """The plan after `preempt_plan`, with the trial kinds whose every kill became a
    preemption added to `gaps`."""
    left = {k.kind for k in preempted}
    turned = {k.kind for k in plan} - left
    why = "--preempt turned its kill into a preemption"
    return preempted, {**gaps, **{k: why for k in sorted(turned)}}


_NONE = "the run wrote no checkpoint that the drill saw between two step lines"


def _wrote(writes: Sequence[int]) -> str:
    if not writes:
        return "no checkpoint that the drill saw between two step lines"
    shown = ", ".join(map(str, writes[:6])) + (", …" if len(writes) > 6 else "")
    return f"{len(writes)} checkpoint(s), after step(s) {shown}"


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


def rank_kill_point(
    plan: Sequence[KillPoint], steps: Sequence[int], checkpoints: Sequence[int], rank: int
) -> KillPoint | None:
    """The `--kill-rank` trial, after every kill of the plan: a SIGKILL to `rank`'s process
    at a step line after the first checkpoint and after the plan's last kill, not a
    write's own line (so the restarted group has steps to recompute), the middle one of
    those. None when no such step line is left."""
    after = max([k.step for k in plan] + [checkpoints[0] if checkpoints else -1])
    room = [s for s in steps if s > after and s not in set(checkpoints)]
    if not room or not checkpoints:
        return None
    return KillPoint(room[len(room) // 2], rank=rank)


def draw_rank(rng: random.Random, printed: Sequence[int] | Mapping[int, object]) -> int:
    """`--kill-rank` without a rank: one of the ranks that printed step lines, rank 0
    aside (its lines are the run's trace), drawn from the seed; rank 1 when none did."""
    ranks = sorted(r for r in printed if r)
    return rng.choice(ranks) if ranks else 1
