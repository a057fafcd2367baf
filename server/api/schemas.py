"""Request and response bodies of the API (pydantic, the server's edge), for validation
and for the OpenAPI schema at /openapi.json."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from crashdrill.server.lessons.pending_kill import KINDS as PENDING_KILL_KINDS
from crashdrill.server.storage.store import RUN_STATES
from crashdrill.trainer import crash_modes
from crashdrill.trainer.record_contract import KIND_NAMES
from crashdrill.trainer.resume_outcome import ResumeOutcome
from crashdrill.workers.rank_states import rank_states_json

# Choices that have one home elsewhere, derived here so that the routes' validation and the
# OpenAPI schema list exactly those: the record kinds of the run-record contract
# (crashdrill.trainer.record_contract, in its order), a run's states
# (server/storage/store.py), the crash modes (crashdrill.trainer.crash_modes), a pending
# kill's kinds (server/lessons/pending_kill.py), a rank's states (workers/rank_states.py).
# A new one there needs no edit here.
if TYPE_CHECKING:
    RecordKind = str
    RunState = str
    CrashModeName = str
    PendingKillKind = str
    RankStateName = str
else:
    RecordKind = Literal[KIND_NAMES]
    RunState = Literal[RUN_STATES]
    CrashModeName = Literal[crash_modes.NAMES]
    PendingKillKind = Literal[PENDING_KILL_KINDS]
    RankStateName = Literal[tuple(rank_states_json())]


class Problem(BaseModel):
    """Every error: a sentence that says what was wrong."""

    detail: str
    errors: list[dict[str, Any]] | None = None


class NewPair(BaseModel):
    model_config = ConfigDict(extra="forbid")
    preset: str = Field(min_length=1, max_length=200, description="a preset id from /api/presets")


class RunRef(BaseModel):
    id: str
    label: Literal["A", "B"]


class PairCreated(BaseModel):
    pair: str
    runs: list[RunRef]


class Knob(BaseModel):
    name: str | None
    a: Any = None
    b: Any = None
    text: str | None = None


class RunKnob(BaseModel):
    name: str | None
    value: Any = None


class RunHost(BaseModel):
    node_id: str = Field(description="the Ray node id; the machine's name without Ray")
    name: str


class RunHeld(BaseModel):
    at_step: int | None = Field(description="the step record it was held after")
    since: float = Field(description="when the hold began (seconds since the epoch)")
    until: float = Field(description="when it ends by itself unless released before")


class PendingKill(BaseModel):
    kind: PendingKillKind = Field(
        description="crash: a crash test (SIGKILL); preempt: a preemption (SIGTERM, then SIGKILL)"
    )
    mode: str = Field(description='the crash test\'s crash mode, or "preempt"')
    armed: bool = Field(
        description="a crash mode that waits for a save (during_save) whose SIGKILL has not"
        " landed yet: the run trains on until its next checkpoint write begins"
    )
    first_step: bool = Field(
        False,
        description="a crash test pressed while the run was starting or restarting: armed"
        " until its trainer's first step record of `segment`, then signalled",
    )
    at_step: int | None = Field(description="the run's step when it was signalled")
    segment: int = Field(
        description="the segment it hit (it ends when a newer one writes a step); for"
        " first_step the segment whose first step fires it"
    )


class RankOut(BaseModel):
    rank: int
    state: RankStateName = Field(
        description="training, lost, waiting (a blind launcher's survivor in its collective"
        " until the timeout), restarting, starting, finished, stopped or failed"
        " (workers/rank_states.py)"
    )
    pid: int | None = Field(description="its process (null before its group forked it)")
    at: float | None = Field(description="lost: when its launcher noticed (epoch seconds)")
    until: float | None = Field(
        description="waiting: when the survivors' collective times out (epoch seconds)"
    )
    cpu_pct: float | None = Field(
        description="its process's CPU, % of one core, over the last second or so"
    )
    rss_bytes: int | None = Field(description="its process's resident memory")
    gpu_mem_bytes: int | None = Field(
        description="GPU memory its process holds (NVML); null without a GPU"
    )


class RunStatus(BaseModel):
    id: str
    label: str
    state: RunState
    stage: str | None = Field(
        description="queued, starting, download, tokenize, build, warmup, train, restarting,"
        " finished, failed, stopped or diverged (its loss or gradient turned NaN or"
        " infinite: trainer/divergence.py)"
    )
    stage_progress: float | None
    queue_position: int | None = Field(description="1-based place in the queue while queued")
    queue_wait_s: float | None = Field(
        None,
        description="while queued: seconds until it should start, estimated from the runs"
        " ahead (their steps left at their measured pace) over the lab's run limit; null when"
        " it cannot be told (no pace measured yet, no limit of the lab's on a cluster)",
    )
    step: int | None
    steps: int | None
    segment: int
    crashes: int
    knob: RunKnob
    can_crash: bool = Field(
        description="a crash test may hit it now: in stage train, its trainer of the newest"
        " segment has written a step record, and no kill is pending"
    )
    can_preempt: bool = Field(
        False, description="a preemption may hit it now (the same rule as can_crash)"
    )
    pending_kill: PendingKill | None = Field(
        None,
        description="a crash test or a preemption the lab signalled whose restart has written"
        " no step record yet (kept in the run's row: a server restart keeps it); null: none",
    )
    held: RunHeld | None = Field(
        None,
        description="the lab holds its trainer where it is while the lesson's question is"
        " open (POST /api/pairs/{pair}/hold); null: not held",
    )
    message: str | None
    exit_code: int | None
    latest: dict[str, Any] = Field(description="the newest record of each kind: step, val, …")
    host: RunHost | None = Field(
        None, description="where it trains (or last trained); null while queued"
    )
    ranks: list[RankOut] | None = Field(
        None,
        description="a run of several ranks: each rank's state and its process's CPU and"
        " memory; null for a run of one rank",
    )


class StartTimes(BaseModel):
    median_s: float | None = Field(
        description="median seconds from a trainer process's start to its first step record,"
        " over the lab's newest starts (null: none measured yet)"
    )
    count: int = Field(description="how many starts the median is of")


class PredictionOut(BaseModel):
    answers: dict[str, Any] | None = Field(
        description='the owner\'s answer per predicted run ({"A": 40, "B": 150}); null: skipped'
    )
    skipped: bool
    at: float | None = Field(description="when it was made (seconds since the epoch)")
    outcome: dict[str, Any] = Field(
        description="per predicted run, what its first restart measured in the question's"
        " terms (steps lost, or a choice's code); null while it is not in yet"
    )
    results: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description='per predicted run what became of its answer: {"status": "measured" |'
        ' "waiting" | "none", "outcome", "right" (by the lesson\'s rule, null unless'
        ' measured), "why" (for none: it finished without a crash test, or ended before its'
        " restart showed the outcome)}",
    )
    status: str = Field(
        "waiting",
        description='"measured" (every run\'s outcome is in), "waiting", "none" (the runs'
        ' ended without an outcome to compare) or "partly" (some measured, the rest none)',
    )
    rule: str = Field("", description="when an answer counts as right, in words")


class PredictionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    answers: dict[str, int | str] | None = Field(
        None,
        description='one answer per run the lesson asks about: {"A": 40, "B": 150} (steps)'
        ' or {"B": "yes"} (a choice\'s code from the lesson\'s predict.choices)',
    )
    skip: bool | None = Field(None, description="true: no prediction this time")


class PairStatus(BaseModel):
    pair: str
    preset: dict[str, Any]
    knob: Knob
    created_at: float
    owner: bool = Field(description="true when this browser created the pair")
    start_times: StartTimes = Field(description="how long trainer starts take on this lab")
    executor: str = Field(
        "local",
        description="where the runs execute: local (this one machine) or ray (a cluster's"
        " nodes); the page names a run's host only on a cluster or after it moved",
    )
    runs: list[RunStatus]
    prediction: PredictionOut | None = Field(
        None, description="the owner's prediction and its measured outcome; null: none made"
    )


class HoldIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hold: bool = Field(description="true: hold both training runs; false: let them go on")


class HoldResult(BaseModel):
    pair: str
    held: list[str] = Field(description="the labels of the runs held now (training ones only)")
    hold_s: float = Field(description="how long the hold lasts at most unless released")


class StopPairResult(BaseModel):
    pair: str
    stopped: list[str] = Field(description="the runs asked to stop (queued or active ones)")


class PreemptResult(BaseModel):
    run: str
    signalled_pid: int
    at_step: int | None
    grace_s: float = Field(
        description="seconds between the SIGTERM and the SIGKILL that follows if the trainer"
        " is still alive (the run's stop_grace)"
    )
    state: RunState


class CrashRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    crash_mode: CrashModeName | None = Field(
        None,
        description="a crash mode the lesson offers besides its own (its preset's [crash]"
        ' offer: "rank" kills one rank of a run of several instead of the whole group);'
        " null or absent: the lesson's [crash] mode",
    )


class CrashResult(BaseModel):
    run: str
    killed_pid: int | None = Field(
        description="the trainer signalled; null when armed for its first step (none yet)"
    )
    at_step: int | None
    state: RunState
    crash_mode: CrashModeName = Field(
        crash_modes.DEFAULT,
        description="the crash mode it used (the lesson's, or one it offers): "
        + "; ".join(f"{m.name}: {m.summary}" for m in crash_modes.MODES),
    )
    armed: bool = Field(
        False,
        description="the kill waits for the run's next checkpoint write (crash mode"
        " during_save): the run trains on, and its state stays as it was until the kill lands",
    )
    first_step: bool = Field(
        False,
        description="the run was starting or restarting: the kill is armed for its"
        " trainer's first step record and lands then (as a press then would)",
    )


class StopResult(BaseModel):
    run: str
    state: RunState
    stopping: bool


class RecordsPage(BaseModel):
    run: str
    records: list[dict[str, Any]] = Field(description="records with their `id`, oldest first")
    next_after: int = Field(description="pass as `after` to get the next page")


class FieldComparisonOut(BaseModel):
    """One deterministic field of the run records over the recomputed steps
    (docs/run-contract.md, "The resume check, field by field")."""

    field: str = Field(description='"kind.field": step.loss, val.train_loss, probe.probes.NAME…')
    equal: bool | None = Field(description="every pair the same; null when none was compared")
    points: int
    steps: list[int] | None = Field(description="[lo, hi] of the compared steps")
    first_divergent_step: int | None
    max_abs_delta: float | None = Field(description="null: no pairs, a text, or not finite")
    mean_abs_delta: float | None
    infinite_delta: bool = Field(description="|Δ| was not finite (a NaN or a missing value)")
    numeric: bool = Field(description="false for a text field (no |Δ|)")


class RankDivergenceOut(BaseModel):
    """The first rank whose own loss left the original (trainer/resume_compare.py)."""

    rank: int
    step: int = Field(description="the first recomputed step where its loss bits differ")
    ranks: int = Field(description="how many ranks' losses were compared")


class ReshardOut(BaseModel):
    from_ranks: int = Field(description="the world size that wrote the checkpoint")
    ranks: int = Field(description="the world size that resumed it")
    tolerance: float = Field(description="the bound on max |Δloss| the check states")
    within_tolerance: bool | None = Field(description="max |Δloss| ≤ tolerance (null: none yet)")
    why: str = Field(description="why a resume on another world size cannot be bit-identical")


class ResumeCheckOut(BaseModel):
    segment: int
    from_step: int | None
    steps: list[int] | None = Field(description="[lo, hi] of the compared steps")
    points: int
    expected_points: int
    complete: bool
    max_abs_delta: float | None = Field(description="of the loss; null when not finite")
    mean_abs_delta: float | None
    infinite_delta: bool = Field(
        False, description="max_abs_delta is null because |Δloss| was not finite (a NaN)"
    )
    bit_identical: bool | None = Field(
        description="every compared field equal; null until a loss is compared"
    )
    differing: list[str] = Field(
        default_factory=list, description="the compared fields that differ"
    )
    fields: list[FieldComparisonOut] = Field(
        default_factory=list,
        description="every deterministic field the run records, compared one by one",
    )
    first_divergent_step: int | None = Field(
        None, description="the first recomputed step whose loss bits differ"
    )
    first_divergent_rank: RankDivergenceOut | None = Field(
        None,
        description="a run of several ranks: the first rank whose own loss bits differ"
        " (null: one rank, or every rank the same)",
    )
    missing: list[str] = Field(
        default_factory=list, description="what the resumed checkpoint did not hold"
    )
    started_over: bool = Field(
        False, description="the segment trained from step 0 again (no checkpoint was resumed)"
    )
    outcome: ResumeOutcome = Field(
        description="what the resume came to, in one word (trainer/resume_outcome.py): the"
        " page picks its words by it"
    )
    resharded: ReshardOut | None = Field(
        None,
        description="a resume on another world size (data_layout global): not bit-identical"
        " by construction; max |Δloss| against a stated tolerance instead (null: same world)",
    )


class ResumeChecks(BaseModel):
    run: str
    checks: list[ResumeCheckOut]


class Event(BaseModel):
    id: int
    t: float | None
    segment: int
    level: str
    code: str | None
    text: str
    step: int | None
    fields: dict[str, Any] = Field(
        description="the code's own fields (docs/run-contract.md, Event codes); {} before codes"
    )


class Events(BaseModel):
    run: str
    events: list[Event]


class RecordField(BaseModel):
    name: str
    type: str = Field(description="in JSON terms; 'X or null' when it may be null")
    deterministic: bool = Field(description="a bit-identical resume reproduces it exactly")
    meaning: str


class RecordKindOut(BaseModel):
    name: str
    writers: list[str] = Field(description="trainer, supervisor, mirror or sampler")
    meaning: str
    keyed_by_step: bool = Field(description="at most one a (segment, step, kind)")
    state: bool = Field(description="its newest record is in a run's `latest`")
    fields: list[RecordField]
    more_fields: str | None = Field(description="where fields not listed are defined")


class EventField(BaseModel):
    name: str
    type: str
    meaning: str
    optional: bool = Field(description="may be absent")


class EventCodeOut(BaseModel):
    code: str
    writer: str = Field(description="trainer, supervisor, mirror or lab")
    levels: list[str] = Field(description="the levels it is written at; the first is the usual")
    weight: str = Field(description='"key" (the lesson\'s story), "info" or "routine" (muted)')
    meaning: str
    restart: str | None = Field(
        description="a supervisor's restart event: what ended the segment (crash, preempt,"
        " lost_host, killed); null for every other code"
    )
    fields: list[EventField] = Field(description="besides kind, segment, level, code, text")


class CrashModeOut(BaseModel):
    name: str = Field(description="what a preset's `[crash] mode` and an event's crash_mode say")
    summary: str = Field(description="what Crash test does, one line")
    waits_for_save: bool = Field(description="the kill lands inside the next checkpoint write")
    wipes_disk: bool = Field(description="the run's local checkpoints are deleted after the kill")
    moves_host: bool = Field(description="the run restarts on another machine, from the mirror")
    one_rank: bool = Field(description="the kill takes one rank of a run with several ranks")


class ResumeOutcomeOut(BaseModel):
    value: str = Field(description="a resume check's `outcome`")
    meaning: str
    held: bool = Field(description="the resume kept the run (it matched, or lost nothing)")
    pending: bool = Field(description="not final: more recomputed steps will decide")
    lab_check: bool = Field(description="a check of the lab's API can have it")


class StageOut(BaseModel):
    name: str
    words: str | None = Field(description="the page's words for it, where its stage list shows it")
    listed: bool = Field(description="in the page's stage list")
    phase: str = Field(description='"before", "train" or "after" training')
    written_by_trainer: bool = Field(description="a trainer writes it (else the lab does)")


class RunStatesOut(BaseModel):
    all: list[str] = Field(description="every state a run may be in, in the order it moves")
    live: list[str] = Field(description="not over: queued or active")
    active: list[str] = Field(description="a trainer is (being) started or trains")
    terminal: list[str] = Field(description="over for good")


class RecordKinds(BaseModel):
    version: int = Field(description='the "v" of every record')
    common: list[RecordField] = Field(description="fields of every record")
    kinds: list[RecordKindOut]
    events: list[EventCodeOut] = Field(description="every event code (trainer/event_codes.py)")
    crash_modes: list[CrashModeOut] = Field(
        description="every crash mode (trainer/crash_modes.py): the page acts on their fields"
    )
    resume_outcomes: list[ResumeOutcomeOut] = Field(
        default_factory=list,
        description="every outcome a resume check may have (trainer/resume_outcome.py)",
    )
    stages: list[StageOut] = Field(
        default_factory=list, description="every stage a run may be in (trainer/stages.py)"
    )
    run_states: RunStatesOut | None = Field(
        default=None,
        description=(
            "a run's states and their groups (server/storage/store.py; web/static/run_states.js)"
        ),
    )


class Machine(BaseModel):
    sample: dict[str, Any] | None = Field(description="the newest telemetry record, or null")
    nodes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="with ?pair=: the newest record of each Ray node the pair's runs are on",
    )
    cluster: dict[str, Any] | None = Field(
        default=None, description="the cluster's reachability, as in GET /api/health"
    )


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: these statuses answer a Problem."""
    return {s: {"model": Problem} for s in statuses}
