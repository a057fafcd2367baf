"""A student's prediction, stored with the pair, and the outcome it is checked against.

    record_prediction(store, pair_row, session, {"answers": {"A": 40, "B": 150}})
    record_prediction(store, pair_row, session, {"skip": True})
    prediction_view(store, pair_row)   # {"answers", "skipped", "at", "outcome", "results",
                                       #  "status", "rule"} or None
    class_predictions(store)           # per lesson: the class's answers against outcomes

What the question is and which answers it allows is the lesson's (its `[predict]` table,
trainer/prediction.py). The pair's owner answers before the pair's first crash test or
preemption (409 after it: the outcome is no prediction any more); an answer may be
changed until then. The outcome of each predicted run is read from its first restart
(segment 1): its resume check, or its refusal to start without a checkpoint. Once every
predicted run's outcome is final it is stored with the pair and not measured again.

What became of each answer (`results`, the one reading the page and the class view show):
"measured" with its verdict by the question's one rule (trainer/prediction.py
`answer_right`, `RULE_TEXT`), "waiting" while the run may still give its outcome, or
"none" when the run ended without one (it finished before any crash test, or ended
before its restart showed it): then there is nothing to compare, and the views say so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from crashdrill.server.errors import BadInput, Conflict, Forbidden
from crashdrill.server.ingest_loop import resume_checks
from crashdrill.server.storage.db import Row
from crashdrill.server.storage.store import TERMINAL_STATES, RunState, Store
from crashdrill.trainer.prediction import LABELS, RULE_TEXT, Prediction
from crashdrill.trainer.records import CHECKPOINT_REFUSED_CODE, NO_CHECKPOINT_CODE
from crashdrill.trainer.resume_outcome import PENDING, ResumeOutcome

CLASS_PAIRS = 500  # predictions per lab the class view reads, newest first


def lesson_prediction(preset: Mapping[str, Any]) -> Prediction | None:
    """The question of a pair's lesson, from its public view (None: it asks none)."""
    p = preset.get("predict")
    if not isinstance(p, Mapping) or not p.get("question"):
        return None
    runs = tuple(r for r in LABELS if r in (p.get("runs") or LABELS))
    return Prediction(
        str(p["question"]), str(p.get("measure")), runs, bool(p.get("answer_after_outcome", True))
    )


def record_prediction(
    store: Store, pair: Row, session: str, body: Mapping[str, Any]
) -> dict[str, Any]:
    """Store the owner's answers (or that they skipped); 403 for another browser, 409 when
    the lesson asks nothing or the first crash already happened, 422 for a bad answer."""
    if pair["owner"] != session:
        raise Forbidden("only the browser that started this lesson makes its prediction")
    preset = json.loads(pair["preset_json"])
    question = lesson_prediction(preset)
    if question is None:
        raise Conflict(f"lesson {pair['preset']!r} asks no prediction")
    runs = store.runs_of_pair(pair["id"])
    if any((r["crashes"] or 0) > 0 or (r["segment"] or 0) > 0 for r in runs):
        raise Conflict(
            "the first crash test already happened: a prediction is made before the outcome"
        )
    if runs and all(r["state"] in TERMINAL_STATES for r in runs):
        raise Conflict(
            "both runs have ended without a crash test: there is no outcome left to predict;"
            " start the lesson again to predict and crash it"
        )
    skipped = body.get("skip") is True
    answers = body.get("answers")
    if skipped and answers is not None:
        raise BadInput("give answers or skip: true, not both")
    if not skipped:
        steps = (preset.get("run") or {}).get("steps")
        problems = question.answer_problems(answers, steps if isinstance(steps, int) else None)
        if problems:
            raise BadInput("; ".join(problems))
    stored = {"answers": None if skipped else dict(answers or {}), "at": time.time()}
    store.set_prediction(pair["id"], json.dumps(stored))
    return prediction_view(store, {**pair, "prediction_json": json.dumps(stored)}) or {}


def prediction_view(store: Store, pair: Row) -> dict[str, Any] | None:
    """The pair's prediction and, per predicted run, the measured outcome (null until it is
    in); None when none was made."""
    if not pair.get("prediction_json"):
        return None
    stored = json.loads(pair["prediction_json"])
    answers = stored.get("answers")
    question = lesson_prediction(json.loads(pair["preset_json"]))
    outcome = json.loads(pair["outcome_json"]) if pair.get("outcome_json") else None
    if outcome is None and question is not None:
        outcome = measure_outcome(store, pair, question)
    outcome = outcome or {}
    results: dict[str, dict[str, Any]] = {}
    if question is not None:
        ended = {
            r["label"]: r for r in store.runs_of_pair(pair["id"]) if r["state"] in TERMINAL_STATES
        }
        for label in question.runs:
            value = outcome.get(label)
            answer = (answers or {}).get(label)
            results[label] = result_of(question, answer, value, ended.get(label))
    statuses = {r["status"] for r in results.values()}
    return {
        "answers": answers,
        "skipped": answers is None,
        "at": stored.get("at"),
        "outcome": outcome,
        "results": results,
        # "measured" once every run's outcome is in, "none" when none will come, else waiting
        "status": (
            "measured"
            if statuses == {"measured"}
            else "none"
            if statuses == {"none"}
            else "waiting"
            if "waiting" in statuses
            else "partly"
        ),
        "rule": RULE_TEXT[question.kind] if question is not None else "",
    }


NO_CRASH = "{ended} without a crash test: no outcome to compare"
NO_RESTART = "ended before its restart showed the outcome: nothing to compare"


def result_of(question: Prediction, answer: Any, value: Any, ended: Row | None) -> dict[str, Any]:
    """What became of one run's answer: its outcome and verdict, or why there is none."""
    if value is not None:
        right = question.answer_right(answer, value)
        return {"status": "measured", "outcome": value, "right": right}
    if ended is None:
        return {"status": "waiting", "outcome": None, "right": None}
    crashed = (ended["crashes"] or 0) > 0 or (ended["segment"] or 0) > 0
    ended_how = "was stopped" if ended["state"] == RunState.STOPPED else ended["state"]
    why = NO_RESTART if crashed else NO_CRASH.format(ended=ended_how)
    return {"status": "none", "outcome": None, "right": None, "why": why}


def measure_outcome(store: Store, pair: Row, question: Prediction) -> dict[str, Any] | None:
    """Each predicted run's outcome so far ({"A": 40, "B": None}); stored with the pair once
    every one is final."""
    runs = {r["label"]: r for r in store.runs_of_pair(pair["id"])}
    outcome = {
        label: run_outcome(store, runs[label], question.measure) if label in runs else None
        for label in question.runs
    }
    if all(v is not None for v in outcome.values()):
        store.set_outcome(pair["id"], json.dumps(outcome))
    return outcome


def run_outcome(store: Store, run: Row, measure: str) -> Any:
    """What the run's first restart did, as `measure` counts it; None until it is known."""
    if not (run["crashes"] or 0) and not (run["segment"] or 0):
        return None  # not crashed nor restarted yet: nothing to read (and no query)
    # A restart that refused to start: no checkpoint, or one it cannot load (another world
    # size that does not reshard, lesson 1.18's B).
    refused = any(
        json.loads(e["data"]).get("code") in (NO_CHECKPOINT_CODE, CHECKPOINT_REFUSED_CODE)
        and (e["segment"] or 0) == 1
        for e in store.records_of_kind(run["id"], "event")
    )
    check = next((c for c in resume_checks(store, run["id"]) if c["segment"] == 1), None)
    if measure == "lost_steps":
        if check is not None:
            return int(check["expected_points"])
        return int(run["step"] or 0) if refused else None
    if refused:
        kind = ResumeOutcome.REFUSED
    elif check is None:
        return None
    else:
        kind = ResumeOutcome(check["outcome"])
        if kind in PENDING:
            return None  # identical so far: wait until every lost step is recomputed
        if kind is ResumeOutcome.NOTHING_LEFT:
            kind = ResumeOutcome.IDENTICAL  # nothing was lost: it resumed, bit-identical
    if measure == "bit_identical":
        return "yes" if kind is ResumeOutcome.IDENTICAL else "no"
    return kind.value


def class_predictions(store: Store) -> list[dict[str, Any]]:
    """Per lesson (in the order first predicted): its question and, per prediction, the
    answers against the outcomes (skipped ones counted apart)."""
    lessons: dict[str, dict[str, Any]] = {}
    for pair in store.predicted_pairs(CLASS_PAIRS):
        preset = json.loads(pair["preset_json"])
        question = lesson_prediction(preset)
        view = prediction_view(store, pair)
        if question is None or view is None:
            continue
        lesson = lessons.setdefault(
            pair["preset"],
            {
                "preset_id": pair["preset"],
                "number": preset.get("number"),
                "title": preset.get("title"),
                "predict": question.to_dict(),
                "skipped": 0,
                "predictions": [],
            },
        )
        if view["skipped"]:
            lesson["skipped"] += 1
        else:
            lesson["predictions"].append(
                {
                    "pair": pair["id"],
                    "answers": view["answers"],
                    "outcome": view["outcome"],
                    "results": view["results"],
                }
            )
    return list(lessons.values())
