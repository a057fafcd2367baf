"""How a drill ended when its run did not: the drill always ends, and says why.

    limits = DrillLimits(max_restarts=16, deadline_s=120.0, deadline_default=True)
    findings = end_findings(evidence, limits)       # restart loop, cap, deadline, signal
    limits.to_json()                                # the report's "drill" block

The engine (drill/engine.py run_crashed) ends the chain of restarts when a restart
crashed with no checkpoint advanced since it started, when two restarts in a row failed
the same way without getting further, after `max_restarts` restarts, and at the drill's
deadline; drill/interrupt.py stops it at a SIGINT or SIGTERM. A chain that ended for one
of the last four leaves a finding here that says so and quotes what the script said.
"""

from __future__ import annotations

from dataclasses import dataclass

from crashdrill.drill.finding_codes import DEADLINE, INTERRUPTED, RESTART_CAP, RESTART_LOOP
from crashdrill.drill.target import Segment
from crashdrill.drill.verdicts import Evidence, Finding, stderr_tail, step_text

MIN_DEADLINE_S = 120.0  # the default deadline is never shorter (a slow machine's start)
DEADLINE_PER_RUN = 4.0  # the default: this many reference runs' time per kill, plus one


def restart_cap(kills: int) -> int:
    """How many restarts one drill may make by default: one per kill, a recovery replay
    and its restart per damaging kill, and room for restarts after crashes that saved."""
    return 3 * kills + 10


def failure_line(seg: Segment) -> str:
    """The error a crashed process ended with: its last non-empty stderr line."""
    lines = [ln.strip() for ln in seg.stderr_tail if ln.strip()]
    return lines[-1] if lines else f"exit status {seg.exit_code}, stderr empty"


def same_failure(prev: Segment, seg: Segment) -> bool:
    """Two restarts that crashed with the same error and the same exit status, the
    second getting no further than the first: a third would do the same."""
    further = (seg.last_step or -1) > (prev.last_step or -1)
    same = seg.exit_code == prev.exit_code and failure_line(seg) == failure_line(prev)
    return same and not further


def default_deadline(reference_s: float, kills: int) -> float:
    """Seconds the crashed run may take after the reference by default: every kill costs
    at most a restart and the steps it lost, which is less than a whole run each; four
    runs' time per kill leaves room for a busy machine, and a replay."""
    return max(MIN_DEADLINE_S, DEADLINE_PER_RUN * (kills + 1) * reference_s)


@dataclass
class DrillLimits:
    """The drill's own bounds and how it ended (the report's `drill` block)."""

    max_restarts: int
    deadline_s: float | None = None  # seconds after the drill's start
    deadline_default: bool = False  # derived from the reference run's time
    work_dir: str | None = None  # --work-dir: kept; else a temp dir, removed
    restarts: int = 0
    deadline_hit: bool = False
    signal: str | None = None  # "SIGINT", "SIGTERM": interrupted
    running: str | None = None  # what was running when it was stopped
    chain_end: str | None = None  # Segment.chain_end of the last segment

    @property
    def incomplete(self) -> bool:
        return self.deadline_hit or self.signal is not None

    def to_json(self) -> dict[str, object]:
        return {
            "complete": not self.incomplete,
            "restarts": self.restarts,
            "max_restarts": self.max_restarts,
            "deadline_s": None if self.deadline_s is None else round(self.deadline_s, 1),
            "deadline_default": self.deadline_default,
            "deadline_hit": self.deadline_hit,
            "interrupted_by": self.signal,
            "running_when_stopped": self.running,
            "chain_end": self.chain_end,
            "work_dir": self.work_dir,
        }

    def evidence_left(self) -> str:
        if self.work_dir is not None:
            return f"the evidence is kept in --work-dir {self.work_dir}"
        return "its temp dirs are removed"


def describe_running(seg: Segment | None, what: str) -> str | None:
    """`what` (the reference, restart 2) and how far it got, for the report."""
    if seg is None:
        return None
    return f"{what}, at step {step_text(seg.last_step)}"


def end_findings(ev: Evidence, limits: DrillLimits) -> list[Finding]:
    """Why the drill ended before the run did, when the engine or a signal ended it."""
    segs = ev.crashed
    last = segs[-1] if segs else None
    out: list[Finding] = []
    why = last.chain_end if last is not None else None
    limits.chain_end = why
    if last is not None and why == "same-failure" and len(segs) >= 2:
        prev = segs[-2]
        out.append(
            Finding(
                RESTART_LOOP,
                f"restarts {prev.index} and {last.index} failed the same way, exit status "
                f"{last.exit_code} with {failure_line(last)!r}, the second getting no further "
                f"(step {step_text(last.last_step)}): another restart would fail again, so the "
                f"drill stopped restarting. stderr tail:{stderr_tail(last)}",
                resume=last.index,
            )
        )
    elif last is not None and why is not None and why.startswith("restart-cap"):
        out.append(
            Finding(
                RESTART_CAP,
                f"the drill made {limits.restarts} restarts, its cap (--max-restarts "
                f"{limits.max_restarts}), and stopped before the run finished (the last "
                f"process reached step {step_text(last.last_step)}): the script keeps "
                "needing restarts; raise the cap only if the kills asked for that many",
            )
        )
    if limits.deadline_hit:
        how = " (the default: from the reference run's time)" if limits.deadline_default else ""
        out.append(
            Finding(
                DEADLINE,
                f"the drill's deadline of {limits.deadline_s:g} s{how} ran out "
                + (
                    f"during {limits.running}: it was stopped"
                    if limits.running
                    else "before the next restart: none was started"
                )
                + ", and the report holds what was seen until then (incomplete). Give more "
                "with --deadline SECONDS",
            )
        )
    if limits.signal is not None:
        out.append(
            Finding(
                INTERRUPTED,
                f"{limits.signal} stopped the drill during "
                f"{limits.running or 'the start of its first processes'}: "
                f"every process it started was killed and {limits.evidence_left()}; the "
                "report holds what was seen until then (incomplete)",
            )
        )
    return out
