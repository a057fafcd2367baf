"""The drill's verdict on each preemption (`crashdrill verify --preempt`): did the script
save within the grace, how many steps did the stop lose, how long did it take?

    stops = judge_stops(evidence, analysis)   # one StopVerdict per SIGTERM that landed
    findings = stop_findings(stops)           # a failing finding per failed stop

A correct handler finishes its step, writes a checkpoint and exits within the grace, and
its restart resumes from the last step it printed: 0 steps lost. A stop that loses steps
fails the drill, because the script could have saved them; so does one the grace ran out
on (SIGKILLed) even when it lost nothing, because that was luck: its last checkpoint
happened to be of the last step it printed, and a stop a step later would have lost
steps. What went wrong, from what the drill saw between the SIGTERM and the end of the
process:

  ignores-sigterm       it trained on (or sat) until the SIGKILL at the grace
  saves-too-slowly      a write began after the SIGTERM and was not done at the grace
  exits-without-saving  it exited within the grace without writing a checkpoint
  torn-checkpoint       it wrote something after the SIGTERM that the restart did not
                        resume from
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crashdrill.drill.compare import executed_kills
from crashdrill.drill.finding_codes import (
    EXITS_WITHOUT_SAVING,
    IGNORES_SIGTERM,
    SAVES_TOO_SLOWLY,
    TORN_CHECKPOINT,
)
from crashdrill.drill.target import Segment, Target
from crashdrill.drill.verdicts import Analysis, Evidence, Finding


@dataclass(frozen=True)
class StopVerdict:
    index: int  # the plan's kill number (1-based)
    planned_step: int
    sigterm_step: int | None  # the last step printed when the SIGTERM went out
    last_step: int | None  # the last step the process printed
    exit_code: int | None  # None: ended by the SIGKILL at the grace
    stop_s: float | None  # SIGTERM to the end of the process
    grace_s: float
    wrote: bool  # the checkpoint dir changed after the SIGTERM
    resumed_from: int | None
    steps_lost: int | None
    diagnosis: str | None
    text: str

    @property
    def within_grace(self) -> bool:
        return self.exit_code is not None and (self.stop_s or 0.0) <= self.grace_s

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "planned_step": self.planned_step,
            "sigterm_step": self.sigterm_step,
            "last_step": self.last_step,
            "exit_code": self.exit_code,
            "stop_s": round(self.stop_s, 3) if self.stop_s is not None else None,
            "grace_s": self.grace_s,
            "within_grace": self.within_grace,
            "wrote_checkpoint": self.wrote,
            "resumed_from": self.resumed_from,
            "steps_lost": self.steps_lost,
            "diagnosis": self.diagnosis,
            "text": self.text,
        }


def judge_stops(ev: Evidence, analysis: Analysis) -> list[StopVerdict]:
    """One verdict per preemption of the plan that landed."""
    out = []
    resumes = {r.index: r for r in analysis.resumes}
    for n, (kp, seg) in enumerate(executed_kills(ev.plan, ev.crashed), 1):
        if not kp.preempt or seg is None or seg.term_time is None:
            continue
        i = seg.index
        nxt = ev.crashed[i + 1] if i + 1 < len(ev.crashed) else None
        resume = resumes.get(i + 1)
        resumed = resume.from_step if resume is not None else None
        if resumed is None and nxt is not None and nxt.first_step is not None:
            resumed = nxt.first_step - 1
        out.append(_judge(n, kp.step, kp.grace_s, seg, resumed, ev.target))
    return out


def _judge(
    index: int, planned: int, grace: float, seg: Segment, resumed: int | None, target: Target
) -> StopVerdict:
    assert seg.term_time is not None
    at_term = [p.step for p in seg.points if p.t <= seg.term_time]
    sigterm_step = at_term[-1] if at_term else None
    end = seg.kill_time if seg.grace_expired else seg.ended
    stop_s = (end - seg.term_time) if end else None
    wrote = seg.snapshot_after_kill != seg.snapshot_before_kill and target.has_checkpoint(
        seg.snapshot_after_kill
    )
    changed = seg.snapshot_after_kill != seg.snapshot_before_kill
    last = seg.last_step
    lost = last - resumed if last is not None and resumed is not None else None
    code = None if seg.grace_expired else seg.exit_code
    how = (
        f"SIGKILLed when the {grace:g} s grace ran out"
        if seg.grace_expired
        else f"exited with status {code} {stop_s or 0:.2f} s after it, within the {grace:g} s grace"
        if (stop_s or 0) <= grace
        else f"exited with status {code} {stop_s or 0:.2f} s after it, past the {grace:g} s grace"
    )
    head = f"stop {index}: SIGTERM at step {sigterm_step}; {how}"
    after = (
        f"resumed from step {resumed}, {lost} steps lost"
        if lost is not None
        else "the restart resumed from nothing it printed"
    )
    diagnosis = None
    if lost == 0 and seg.grace_expired:
        # Nothing lost only because its last checkpoint was of the last step it printed:
        # the handler still failed (the SIGKILL came), and a stop one step later would
        # lose steps. Judged like any stop the grace ran out on.
        after = (
            f"resumed from step {resumed}: 0 steps lost, but only by luck (its last"
            " checkpoint was of that step)"
        )
    if lost == 0 and not seg.grace_expired:
        text = f"{head}; it saved step {last} and resumed there: 0 steps lost"
    elif seg.grace_expired and changed and not _trained_on(sigterm_step, last):
        diagnosis = SAVES_TOO_SLOWLY
        text = (
            f"{head} in the middle of a checkpoint write that began after the SIGTERM: it saves"
            f" too slowly for the grace; {after}"
        )
    elif seg.grace_expired:
        diagnosis = IGNORES_SIGTERM
        went_on = f" (it trained on to step {last})" if last != sigterm_step else ""
        text = f"{head}; it ignores SIGTERM: nothing was saved after it{went_on}; {after}"
    elif not changed:
        diagnosis = EXITS_WITHOUT_SAVING
        text = f"{head} without writing a checkpoint: it exits without saving; {after}"
    else:
        diagnosis = TORN_CHECKPOINT
        text = (
            f"{head}, having written to its checkpoint dir, but the restart did not resume from"
            f" step {last}: the checkpoint it saved was torn or unusable; {after}"
        )
    return StopVerdict(
        index,
        planned,
        sigterm_step,
        last,
        code,
        stop_s,
        grace,
        wrote,
        resumed,
        lost,
        diagnosis,
        text,
    )


def _trained_on(sigterm_step: int | None, last: int | None) -> bool:
    """More than the step in flight after the SIGTERM: the script did not stop."""
    return last is not None and (sigterm_step is None or last > sigterm_step + 1)


def stop_findings(stops: list[StopVerdict]) -> list[Finding]:
    """A failing finding for each stop that lost steps (or left nothing to resume): the
    script could have saved them."""
    return [
        Finding(str(s.diagnosis), s.text, resume=s.index) for s in stops if s.diagnosis is not None
    ]
