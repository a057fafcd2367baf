"""The students section of the settings: what anonymous students may do, their quotas
and the budget of one run (docs/server.md "Running a lab for a class")."""

from __future__ import annotations

from dataclasses import dataclass

from crashdrill.server.setting_schema import (
    GIB,
    NAMES,
    NUMBER,
    SECONDS_OFF,
    SIZE,
    WHOLE,
    WHOLE_OR_OFF,
    at_least,
    other_variables,
    setting,
)


@dataclass(frozen=True)
class StudentsSection:
    """What anonymous students may do: their quotas and the budget of one run
    (docs/server.md "Running a lab for a class"; server/lessons/bounds.py)."""

    TITLE = "Students"
    OTHER_VARIABLES = other_variables()

    max_pairs_per_session: int = setting(
        3,
        parse=WHOLE,
        env="CRASHDRILL_MAX_PAIRS_PER_SESSION",
        allowed=at_least(1),
        what="pairs one browser may have queued or training (429 past it; instructors are exempt)",
    )
    # Live pairs per client address too (0: by cookie alone, for a class behind one NAT).
    max_pairs_per_address: int = setting(
        3,
        parse=WHOLE,
        env="CRASHDRILL_MAX_PAIRS_PER_ADDRESS",
        allowed=WHOLE_OR_OFF,
        what="pairs one client address may have queued or training, whatever its cookies"
        " (429 past it; instructors are exempt); 0: counted by cookie alone, for a class"
        " behind one NAT ([quotas](#quotas))",
    )
    max_queued_runs: int = setting(
        200,
        parse=WHOLE,
        env="CRASHDRILL_MAX_QUEUED_RUNS",
        allowed=at_least(2),
        what="runs waiting in the queue before new pairs get 503 with `Retry-After`",
    )
    idle_stop_s: float = setting(
        1800.0,
        default_text="1800",
        parse=NUMBER,
        env="CRASHDRILL_IDLE_STOP_S",
        allowed=SECONDS_OFF,
        what="a pair that no event stream follows and nobody polled for this long is"
        " stopped; 0: never ([quotas](#quotas))",
    )
    max_body_bytes: int = setting(
        64 * 1024,
        allowed=at_least(1024, "at least 1024"),
        what="larger request bodies get 413",
    )
    # Settings instructors may open to students beyond the default (server/lessons/bounds.py).
    student_unlockable: tuple[str, ...] = setting(
        (),
        default_text="none",
        parse=NAMES,
        env="CRASHDRILL_STUDENT_UNLOCKABLE",
        how_note="(names, comma-separated)",
        what="settings of the server-locked list (`data`, `tokenizer`, `mirror`, `n_layer`,"
        " `d_model`, `n_head`, `ctx`, `vocab`, `precision`) that an instructor's `locked`"
        " list may open to students ([Running a lab for a class](#running-a-lab-for-a-class))",
    )
    max_params_per_run: int = setting(
        50_000_000,
        parse=SIZE,
        env="CRASHDRILL_MAX_PARAMS_PER_RUN",
        allowed=at_least(1),
        what="the budget: a run's model parameters",
    )
    max_tokens_per_run: int = setting(
        400_000_000,
        parse=SIZE,
        env="CRASHDRILL_MAX_TOKENS_PER_RUN",
        allowed=at_least(1),
        what="the budget: a run's tokens (steps × batch × ctx)",
    )
    max_checkpoint_bytes_per_run: int = setting(
        2 * GIB,
        default_text="2 GiB",
        parse=SIZE,
        env="CRASHDRILL_MAX_CHECKPOINT_BYTES_PER_RUN",
        allowed=at_least(1),
        how_note="(`2G`, `500M` work)",
        what="the budget: one checkpoint (12 bytes a parameter: fp32 weights and AdamW's two"
        " moments) × `keep`",
    )
    # None: from this machine (settings.default_disk_bytes_per_run; per address 3 × per run).
    max_disk_bytes_per_run: int | None = setting(
        None,
        default_text="4 GiB; 32 GiB where a GPU is",
        parse=SIZE,
        env="CRASHDRILL_MAX_DISK_BYTES_PER_RUN",
        allowed=at_least(1),
        how_note="(`4G`)",
        what="the budget: what a run writes over its life as this lab runs it (on CUDA where"
        " a GPU is), one checkpoint × the checkpoints it saves (step 0, every `ckpt_every`,"
        " the last), × 2 when the lab mirrors them ([the budget](#the-budget))",
    )
    max_disk_bytes_per_address: int | None = setting(
        None,
        default_text="3 × `max_disk_bytes_per_run`",
        parse=SIZE,
        env="CRASHDRILL_MAX_DISK_BYTES_PER_ADDRESS",
        allowed=WHOLE_OR_OFF,
        how_note="(`12G`)",
        what="what the live pairs of one client address will write together, counted the"
        " same way; 429 past it; 0: no limit; instructors are exempt ([quotas](#quotas))",
    )
