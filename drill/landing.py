"""Where a kill landed, from evidence: inside a checkpoint write, or after it.

    landing = judge_landing(killed, restart, from_step, target)
    landing.in_write        # True only with evidence that the write was incomplete
    landing.evidence        # the sentences that prove it, for the report

A kill armed for a write fires when the checkpoint dir changes; that alone does not
prove it landed inside the write (a small write can finish before the SIGKILL takes
effect). It counts as inside a write only with evidence:

- a file or dir of the write was incomplete when the kill landed: a temp file of the
  write still there, or (the built-in trainer) the trainer said it was paused inside it;
- the restart failed to load it (crashed, refused, hung);
- the restart loaded an older checkpoint than the one being written (it resumed from an
  earlier step), or went back to the start although a checkpoint existed, printing a fresh
  start's first loss. One that went back to the start with another first loss loaded the
  weights (a script that restores only them): the write had finished, the kill is plain.

The step being written is the newest step the reference run wrote a checkpoint after that
the killed process had reached (without a reference's writes, the last step it printed:
a process can print a step or two past a write that had already finished before the kill
took effect, as Lightning's next epoch does). A restart that resumed from that very step
proves the write had finished: that kill is judged like a plain one.
The write's files that were rewritten in place (same inode) or that appeared under their
final names stay evidence of a non-atomic writer, whichever way the kill landed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from crashdrill.drill.snapshot import Snapshot, appeared_incomplete, final_names, modified_in_place
from crashdrill.drill.target import Segment, Target


@dataclass
class Landing:
    """What the drill can prove about one kill."""

    in_write: bool  # landed inside a checkpoint write (with evidence)
    armed: bool  # the kill was aimed at a write and the checkpoint dir changed before it
    writing_step: int | None  # the last step printed before the write: what it saves
    evidence: list[str] = field(default_factory=list)
    in_place: list[str] = field(default_factory=list)  # rewritten in place (same inode)
    partial: list[str] = field(default_factory=list)  # appeared under final names
    restart_failed: bool = False

    @property
    def torn(self) -> bool:
        """Inside a write that left its checkpoint torn under a final name (not an
        atomic writer's temp file)."""
        return self.in_write and bool(self.in_place or self.partial)

    @property
    def where(self) -> str:
        if self.in_write:
            return "inside a checkpoint write"
        if self.armed:
            return "after the checkpoint write had finished"
        return "between checkpoint writes"


def _new_temp_files(before: Snapshot | None, after: Snapshot | None) -> list[str]:
    """Files under temp names that the write left (absent before it): work in progress."""
    if after is None:
        return []
    finals = set(final_names(after))
    return sorted(k for k in after if k not in finals and k not in (before or {}))


def writing_step(last_step: int | None, writes: Sequence[int] = ()) -> int | None:
    """The step whose checkpoint a process that printed up to `last_step` was writing
    last: the newest of the reference's `writes` (each the step printed before a write)
    at or before it, else `last_step` itself."""
    if last_step is None:
        return None
    reached = [w for w in writes if w <= last_step]
    return max(reached) if reached else last_step


def judge_landing(
    killed: Segment,
    restart: Segment | None,
    from_step: int | None,
    target: Target,
    writes: Sequence[int] = (),
    loaded_weights: bool = False,
) -> Landing:
    """Where the kill that ended `killed` landed, from what the checkpoint dir and the
    restart after it (`restart`, which resumed from `from_step`) show. `writes`: the steps
    the reference run wrote a checkpoint after; `loaded_weights`: the restart counted from
    the start again but its first loss is not a fresh start's."""
    before, after = killed.snapshot_before_kill, killed.snapshot_after_kill
    armed = bool(killed.in_write)
    writing = writing_step(killed.last_step, writes)
    in_place = modified_in_place(before, after)
    partial = appeared_incomplete(before, after)
    # A plain kill has no snapshot from before a write: a temp file that was not there
    # when the process started is one it was writing.
    temps = _new_temp_files(before if armed else killed.snapshot_start, after)
    evidence: list[str] = []
    # Failed to load: it crashed or hung before it printed a step (one that trained on
    # loaded something; from_step says what).
    failed = (
        restart is not None
        and not restart.points
        and not restart.killed
        and (restart.crashed or restart.hung)
    )
    wrote = bool(in_place or partial or temps)
    if not armed and not wrote:
        return Landing(False, False, writing)
    if temps:
        evidence.append(
            f"{', '.join(temps[:3])} was still being written under a temp name when the kill landed"
        )
    if in_place:
        were = "were" if len(in_place) > 1 else "was"
        evidence.append(f"{', '.join(in_place[:3])} {were} rewritten in place (the same file)")
    if partial:
        evidence.append(f"{', '.join(partial[:3])} appeared under its final name during the write")
    proof = bool(temps)
    if failed and restart is not None:
        how = "hung" if restart.hung else f"exited with status {restart.exit_code}"
        evidence.append(f"the restart failed to load it ({how})")
        proof = True
    elif from_step is not None and writing is not None and from_step < writing:
        evidence.append(
            f"the restart resumed from step {from_step}, older than the step being written "
            f"({writing})"
        )
        proof = True
    elif from_step is not None and writing is not None and from_step >= writing:
        evidence.append(
            f"the restart resumed from step {from_step}, the step being written: the write "
            "had finished before the kill took effect, so this kill is judged like a plain one"
        )
        proof = False
    elif (
        restart is not None
        and from_step is None
        and restart.first_step is not None
        and target.has_checkpoint(before)
        and wrote
    ):
        if loaded_weights:
            evidence.append(
                "the restart went back to the start, but its first loss is not a fresh "
                "start's: it loaded the checkpoint, so the write had finished before the kill "
                "took effect, and this kill is judged like a plain one"
            )
        else:
            evidence.append("the restart went back to the start although a checkpoint existed")
            proof = True
    return Landing(proof, armed, writing, evidence, in_place, partial, failed)
