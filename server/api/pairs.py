"""Lessons and pairs: what a student may start, starting a pair, and its state.

A student sees only published presets (an unpublished one answers 404, as if it did not
exist) and may change only the settings a preset leaves unlocked: the server enforces both,
whatever the page shows.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from crashdrill.server.api.schemas import (
    HoldIn,
    HoldResult,
    NewPair,
    PairCreated,
    PairStatus,
    PredictionIn,
    PredictionOut,
    StopPairResult,
    problems,
)
from crashdrill.server.door.forwarded import client_address
from crashdrill.server.door.sessions import is_instructor, session_of
from crashdrill.server.errors import BadInput, Conflict, Forbidden, LabError, NotFound
from crashdrill.server.lab import Lab
from crashdrill.server.lessons.bounds import LabLimits, budget_problems
from crashdrill.server.lessons.catalog import Catalog, Lesson
from crashdrill.server.lessons.policy import LockedSetting, apply_student_overrides, public_view
from crashdrill.server.lessons.predictions import record_prediction
from crashdrill.server.storage.store import LIVE_STATES
from crashdrill.trainer.presets import KNOB, Preset, PresetError, dump_preset

router = APIRouter(prefix="/api", tags=["pairs"])

MAX_OVERRIDES = 20


class NewPairWithSettings(NewPair):
    overrides: dict[str, Any] | None = Field(
        default=None,
        description='unlocked settings to change, e.g. {"steps": 600, "knob": {"a": 50}}',
    )


def lab_of(request: Request) -> Lab:
    lab: Lab = request.app.state.lab
    return lab


def catalog_of(request: Request) -> Catalog:
    catalog: Catalog = request.app.state.catalog
    return catalog


def instructor_of(request: Request) -> bool:
    return is_instructor(request, request.app.state.settings.instructor_token)


def address_of(request: Request) -> str:
    """The client's address (a trusted proxy's X-Forwarded-For, server/door/forwarded.py):
    pairs are counted per address as well as per browser."""
    return client_address(request.scope, request.app.state.settings)


def limits_of(request: Request) -> LabLimits:
    """The server's bounds on lessons: what students may unlock, the budget, the machine."""
    return LabLimits.from_settings(request.app.state.settings)


def lesson_public(
    lesson: Lesson, preset: Preset | None = None, limits: LabLimits | None = None
) -> dict[str, Any]:
    """What a page shows of a lesson (optionally with a student's settings applied)."""
    p = preset or lesson.preset
    return {
        **(public_view(p, limits) if limits else public_view(p)),
        "origin": lesson.origin,
        "share_path": f"/lesson/{lesson.preset.id}",
    }


def with_overrides(preset: Preset, overrides: dict[str, Any], limits: LabLimits) -> Preset:
    """The preset with a student's settings: 403 for a setting the lesson locks, 422 for
    a wrong type, a setting the server locks, a value out of range or over the budget."""
    if len(overrides) > MAX_OVERRIDES:
        raise BadInput(f"overrides: {len(overrides)} settings; at most {MAX_OVERRIDES}")
    try:
        return apply_student_overrides(preset, overrides, limits)
    except LockedSetting as e:
        raise Forbidden(
            str(e).replace(" is locked in ", " is locked by the instructor in ")
        ) from None
    except PresetError as e:
        raise BadInput(f"overrides: {e}") from None


def within_budget(preset: Preset, limits: LabLimits) -> None:
    """422 naming each of the lab's limits that the preset's runs go over."""
    problems = budget_problems(preset, limits)
    if problems:
        raise BadInput(f"{preset.id} is over this lab's budget: " + "; ".join(problems))


def query_overrides(params: dict[str, str]) -> dict[str, Any]:
    """`?steps=600&knob.a=50` → {"steps": 600, "knob": {"a": 50}} (numbers and booleans as
    such, anything else as text)."""
    out: dict[str, Any] = {}
    for key, raw in params.items():
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if isinstance(value, (dict, list)):
            value = raw
        if key == KNOB:
            raise BadInput(
                f"{KNOB} = {raw!r} is not allowed in a query: set each run's value as"
                f" {KNOB}.a=… or {KNOB}.b=…"
            )
        if key.startswith(f"{KNOB}."):
            out.setdefault(KNOB, {})[key[len(KNOB) + 1 :]] = value
        else:
            out[key] = value
    return out


def lesson_link_status(preset: str, request: Request) -> int:
    """The HTTP status of a lesson's shareable link, /lesson/ID?…: 404 when this person may
    not see the lesson, 403 or 422 when the query sets a locked or a wrong value (the page
    shows the lesson either way, and its API call names the problem), else 200."""
    try:
        lesson = catalog_of(request).get(preset, instructor=instructor_of(request))
        overrides = query_overrides(dict(request.query_params))
        if overrides:
            with_overrides(lesson.preset, overrides, limits_of(request))
    except LabError as e:
        return e.status
    return 200


@router.get("/presets", summary="Lesson presets a student may start (published ones)")
async def presets(request: Request) -> list[dict[str, Any]]:
    lessons = catalog_of(request).visible(instructor=False)
    limits = limits_of(request)
    return [lesson_public(x, None, limits) for x in lessons]


@router.get(
    "/presets/{preset}",
    summary="One lesson, with optional unlocked settings from the query (?steps=600&knob.a=50)",
    responses=problems(403, 404, 422, 429),
)
async def one_preset(preset: str, request: Request) -> dict[str, Any]:
    lesson = catalog_of(request).get(preset, instructor=instructor_of(request))
    limits = limits_of(request)
    overrides = query_overrides(dict(request.query_params))
    changed = with_overrides(lesson.preset, overrides, limits) if overrides else None
    return {**lesson_public(lesson, changed, limits), "overrides": overrides}


@router.post(
    "/pairs",
    status_code=201,
    response_model=PairCreated,
    summary="Start a pair of runs (A and B) of a preset; they start or queue together",
    responses=problems(400, 403, 404, 413, 422, 429, 503),
)
def create_pair(body: NewPairWithSettings, request: Request) -> dict[str, Any]:
    # A plain def: FastAPI runs it on a worker thread, where the database's round trips
    # stall nothing; the runs start from the lab's scheduler task.
    instructor = instructor_of(request)
    lesson = catalog_of(request).get(body.preset, instructor=instructor)
    limits = limits_of(request)
    preset = lesson.preset
    frozen: str | None = None
    if body.overrides:
        preset = with_overrides(preset, body.overrides, limits)
    else:
        within_budget(preset, limits)
    if body.overrides or lesson.origin == "instructor":
        # The runs train exactly this text, even when the instructor edits the lesson
        # later or a crash restarts them: a resume must see the same config.
        frozen = dump_preset(preset)
    return lab_of(request).create_pair(
        body.preset,
        session_of(request),
        instructor,
        preset=preset,
        # The student's changes stay with the pair: a run that diverges names them.
        public={**lesson_public(lesson, preset, limits), "overrides": body.overrides or {}},
        frozen_text=frozen,
        client=address_of(request),
    )


@router.get(
    "/pairs/{pair}",
    response_model=PairStatus,
    summary="Both runs' state, stage, step, latest metrics and the knob that differs",
    responses=problems(404, 422),
)
def get_pair(pair: str, request: Request) -> dict[str, Any]:
    return lab_of(request).pair(pair, session_of(request))


@router.post(
    "/pairs/{pair}/prediction",
    response_model=PredictionOut,
    summary="The owner's prediction, before the pair's first crash test (or skip: true)",
    responses=problems(400, 403, 404, 409, 413, 422, 429),
)
def predict(pair: str, body: PredictionIn, request: Request) -> dict[str, Any]:
    lab = lab_of(request)
    row = lab.store.pair(pair)
    if row is None:
        raise NotFound(f"no pair {pair!r}")
    return record_prediction(lab.store, row, session_of(request), body.model_dump())


@router.post(
    "/pairs/{pair}/hold",
    response_model=HoldResult,
    summary="Hold both training runs where they are while the owner answers (or let them go)",
    responses=problems(403, 404, 413, 422, 429),
)
def hold_pair(pair: str, body: HoldIn, request: Request) -> dict[str, Any]:
    return lab_of(request).hold_pair(pair, session_of(request), instructor_of(request), body.hold)


@router.post(
    "/pairs/{pair}/stop",
    status_code=202,
    response_model=StopPairResult,
    summary="Stop both runs of a pair for good (its owner or an instructor): frees the quota",
    responses=problems(403, 404, 409, 413, 429),
)
async def stop_pair(pair: str, request: Request) -> dict[str, Any]:
    lab = lab_of(request)
    if lab.store.pair(pair) is None:
        raise NotFound(f"no pair {pair!r}")
    session, instructor = session_of(request), instructor_of(request)
    stopped = []
    for run in lab.store.runs_of_pair(pair):
        if run["state"] not in LIVE_STATES:
            continue
        try:
            lab.stop_run(run["id"], session, instructor)
        except Conflict:
            continue  # it ended (or is being taken off the queue) meanwhile
        stopped.append(run["id"])
    return {"pair": pair, "stopped": stopped}
