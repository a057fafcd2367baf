"""A run's stages, the one home of their names: where its process is, as the `stage` record
says (trainer/record_contract.py) and a run's view carries it (`stage`). The trainer writes
the stages of its own life; the lab adds the ones before and between trainers (queued,
starting, restarting) and after a stop. The page's stage list (web/static/cards.js
`STAGES`) shows them in words; GET /api/record-kinds serves them as `stages`, and
tests/unit/test_stages.py holds the page's list equal to this one.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Stage(StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    RESTARTING = "restarting"
    DOWNLOAD = "download"
    TOKENIZE = "tokenize"
    BUILD = "build"
    WARMUP = "warmup"
    TRAIN = "train"
    FINISHED = "finished"
    FAILED = "failed"
    DIVERGED = "diverged"
    STOPPED = "stopped"


# What a trainer process writes in its `stage` records, in the order it lives them.
TRAINER_STAGES = (
    Stage.DOWNLOAD,
    Stage.TOKENIZE,
    Stage.BUILD,
    Stage.WARMUP,
    Stage.TRAIN,
    Stage.FINISHED,
    Stage.FAILED,
    Stage.DIVERGED,
)
# Before its trainer trains (and "train" before its first step record): a crash test
# pressed then is armed for the first step (server/run_control.py).
BEFORE_TRAINING = (
    Stage.QUEUED,
    Stage.STARTING,
    Stage.RESTARTING,
    Stage.DOWNLOAD,
    Stage.TOKENIZE,
    Stage.BUILD,
    Stage.WARMUP,
)
AFTER_TRAINING = (Stage.FINISHED, Stage.FAILED, Stage.DIVERGED)

# The page's stage list, in order, with its words (web/static/cards.js STAGES).
LISTED: tuple[tuple[Stage, str], ...] = (
    (Stage.QUEUED, "Queued"),
    (Stage.DOWNLOAD, "Download data"),
    (Stage.TOKENIZE, "Tokenize"),
    (Stage.BUILD, "Build and compile"),
    (Stage.WARMUP, "Warm up"),
    (Stage.TRAIN, "Train"),
    (Stage.FINISHED, "Finished"),
)


def phase(stage: str) -> str:
    """ "before", "train" or "after" training."""
    if stage == Stage.TRAIN:
        return "train"
    return "after" if stage in AFTER_TRAINING else "before"


def stages_json() -> list[dict[str, Any]]:
    """Every stage, its words where the page lists it, and its phase (GET /api/record-kinds)."""
    words = dict(LISTED)
    return [
        {
            "name": s.value,
            "words": words.get(s),
            "listed": s in words,
            "phase": phase(s),
            "written_by_trainer": s in TRAINER_STAGES,
        }
        for s in Stage
    ]
