"""Instructor mode: log in with CRASHDRILL_INSTRUCTOR_TOKEN, write lesson presets (create,
validate as you type, edit, duplicate, lock knobs, publish), and watch the whole class.

Every route but login/logout/me needs an instructor: the token in a header, or the
`crashdrill_instructor` cookie that login sets (server/door/instructor_sessions.py).
The class view's crash and stop buttons call the ordinary run routes, which let an
instructor act on any run.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.convertors import register_url_convertor

from crashdrill.server.api.pairs import (
    catalog_of,
    lab_of,
    lesson_public,
    limits_of,
    within_budget,
)
from crashdrill.server.api.schemas import problems
from crashdrill.server.door.instructor_sessions import (
    check_token,
    is_instructor,
    login_cookie,
    logout_cookie,
)
from crashdrill.server.door.sessions import session_of
from crashdrill.server.errors import BadInput, Forbidden, LabError
from crashdrill.server.lessons.catalog import (
    ID_RULE,
    MAX_TEXT,
    Catalog,
    Lesson,
    PresetIdConvertor,
    parse_text,
)
from crashdrill.server.lessons.predictions import class_predictions
from crashdrill.server.storage.store import LIVE_STATES, RunState
from crashdrill.server.views import pair_view, queue_positions, restart_counts
from crashdrill.trainer.config import SECTIONS, section_fields
from crashdrill.trainer.presets import KNOB, SETTINGS, PresetError
from crashdrill.workers.restart_events import RESTART_KINDS

# /presets/{preset:preset_id}: any preset id, never a reserved word such as "validate"
register_url_convertor("preset_id", PresetIdConvertor())
router = APIRouter(prefix="/api/instructor", tags=["instructor"])

CLASS_PAGE = 50  # pairs on a page of the class view, unless asked for another size
CLASS_PAGE_MAX = 200


class Unauthorized(LabError):
    status = 401


class Login(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=500)


class PresetText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(max_length=MAX_TEXT, description="the preset as TOML")

    @field_validator("text")
    @classmethod
    def _utf16_length(cls, text: str) -> str:
        # Count as the browser's editor (and a JSON schema validator working on UTF-16)
        # does: a character outside the BMP is two. Python's len() would let it in as one.
        units = len(text.encode("utf-16-le", "surrogatepass")) // 2
        if units > MAX_TEXT:
            raise ValueError(f"{units} UTF-16 code units; at most {MAX_TEXT}")
        return text


class Duplicate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    new_id: str | None = Field(
        default=None, pattern=ID_RULE.pattern, description="default: ID-copy"
    )


class Locked(BaseModel):
    model_config = ConfigDict(extra="forbid")
    locked: list[str] = Field(max_length=100, description="settings a student may not change")


class Published(BaseModel):
    model_config = ConfigDict(extra="forbid")
    published: bool


def instructor_token(request: Request) -> str:
    """The server's instructor token; 403 when instructor mode is off."""
    token: str | None = request.app.state.settings.instructor_token
    if not token:
        raise Forbidden(
            "instructor mode is off on this server: start it with CRASHDRILL_INSTRUCTOR_TOKEN set"
        )
    return token


def require_instructor(request: Request) -> None:
    if not is_instructor(request, instructor_token(request)):
        raise Unauthorized("log in as an instructor first (POST /api/instructor/login)")


def instructor_catalog(request: Request) -> Catalog:
    """The lesson catalog, for an instructor only (401/403 otherwise)."""
    require_instructor(request)
    return catalog_of(request)


def budgeted(request: Request, text: str) -> str:
    """`text`, once its preset is within the lab's budget: 422 naming each limit it goes
    over (a preset that does not parse is left to the catalog, which names the problem)."""
    try:
        preset = parse_text(text)
    except PresetError:
        return text
    within_budget(preset, limits_of(request))
    return text


def detail(lesson: Lesson) -> dict[str, Any]:
    return {**lesson.summary(), "text": lesson.text, "public": lesson_public(lesson)}


# ---- who ----------------------------------------------------------------------------


@router.get(
    "/me",
    summary="Whether instructor mode is on and this browser is logged in",
    responses=problems(429),
)
async def me(request: Request) -> dict[str, bool]:
    token = request.app.state.settings.instructor_token
    return {"enabled": bool(token), "instructor": is_instructor(request, token)}


@router.post(
    "/login",
    summary="Log this browser in as instructor (sets an HttpOnly cookie)",
    responses=problems(400, 401, 403, 413, 422, 429),
)
async def login(body: Login, request: Request, response: Response) -> dict[str, bool]:
    token = instructor_token(request)
    if not check_token(request, body.token, token):  # a wrong one answered late (WrongTokenDelay)
        raise Unauthorized("token: that is not the instructor token of this server")
    response.headers.append("set-cookie", login_cookie(request))
    return {"instructor": True}


@router.post(
    "/logout",
    summary="Log this browser out of instructor mode (its session is revoked on the server)",
)
async def logout(request: Request, response: Response) -> dict[str, bool]:
    response.headers.append("set-cookie", logout_cookie(request))
    return {"instructor": False}


# ---- presets ------------------------------------------------------------------------


@router.get("/presets", summary="Every preset, published or not", responses=problems(401, 403, 429))
async def all_presets(request: Request) -> dict[str, Any]:
    return {
        "presets": [x.summary() for x in instructor_catalog(request).visible(instructor=True)],
        "lockable": [KNOB, *SETTINGS],
        "lock_groups": lock_groups(),
        "always_locked": sorted(limits_of(request).server_locked),
    }


def lock_groups() -> list[dict[str, Any]]:
    """The lockable names grouped as the config's sections are (trainer/config.py
    SECTIONS), the knob first: the editor's lock panel shows one group each."""
    groups = [{"section": KNOB, "names": [KNOB]}]
    for section in SECTIONS:
        names = [n for n in section_fields(section) if n in SETTINGS]
        if names:
            groups.append({"section": section.name, "names": names})
    return groups


@router.get(
    "/presets/{preset:preset_id}",
    summary="One preset: its TOML text, state and what a student sees",
    responses=problems(401, 403, 404, 429),
)
async def one_preset(preset: str, request: Request) -> dict[str, Any]:
    return detail(instructor_catalog(request).get(preset, instructor=True))


@router.post(
    "/presets/validate",
    summary="Check preset text as it is typed: ok, or its problems (field, value, allowed)",
    responses=problems(400, 401, 403, 413, 422, 429),
)
async def validate(body: PresetText, request: Request) -> dict[str, Any]:
    # 200 either way: a check asked at every pause in typing is answered, not refused, so
    # the editor's console holds no failed request per keystroke (saving still says 422).
    try:
        preset = instructor_catalog(request).checked(body.text)
        within_budget(preset, limits_of(request))
    except BadInput as e:
        return {"ok": False, "detail": e.message}
    return {
        "ok": True,
        "id": preset.id,
        "knob_text": preset.knob_text(),
        "predict": preset.predict.question if preset.predict is not None else None,
    }


@router.post(
    "/presets",
    status_code=201,
    summary="Create an instructor preset from TOML text (unpublished unless it says so)",
    responses=problems(400, 401, 403, 409, 413, 422, 429),
)
async def create(body: PresetText, request: Request) -> dict[str, Any]:
    return detail(instructor_catalog(request).create(budgeted(request, body.text)))


@router.put(
    "/presets/{preset:preset_id}",
    summary="Replace an instructor preset's text (built-ins are read-only: 403)",
    responses=problems(400, 401, 403, 404, 413, 422, 429),
)
async def update(preset: str, body: PresetText, request: Request) -> dict[str, Any]:
    return detail(instructor_catalog(request).update(preset, budgeted(request, body.text)))


@router.delete(
    "/presets/{preset:preset_id}",
    status_code=204,
    summary="Delete an instructor preset (running pairs keep their copy)",
    responses=problems(401, 403, 404, 429),
)
async def delete(preset: str, request: Request) -> Response:
    instructor_catalog(request).delete(preset)
    return Response(status_code=204)


@router.post(
    "/presets/{preset:preset_id}/duplicate",
    status_code=201,
    summary="Copy a built-in or instructor preset into a new, unpublished instructor preset",
    responses=problems(400, 401, 403, 404, 409, 413, 422, 429),
)
async def duplicate(preset: str, body: Duplicate, request: Request) -> dict[str, Any]:
    return detail(instructor_catalog(request).duplicate(preset, body.new_id))


@router.put(
    "/presets/{preset:preset_id}/locked",
    summary='The settings a student may not change ("knob" = the A/B values)',
    responses=problems(400, 401, 403, 404, 413, 422, 429),
)
async def set_locked(preset: str, body: Locked, request: Request) -> dict[str, Any]:
    return detail(instructor_catalog(request).set_locked(preset, body.locked))


@router.put(
    "/presets/{preset:preset_id}/published",
    summary="Publish (students see it) or unpublish a preset",
    responses=problems(400, 401, 403, 404, 413, 422, 429),
)
async def set_published(preset: str, body: Published, request: Request) -> dict[str, Any]:
    catalog = instructor_catalog(request)
    if body.published:  # within the lab's budget, as it is now
        within_budget(catalog.get(preset, instructor=True).preset, limits_of(request))
    return detail(catalog.set_published(preset, body.published))


# ---- the class ----------------------------------------------------------------------


@router.get(
    "/class",
    summary="A page of the class's pairs, live ones first, then newest: owner, preset, runs",
    responses=problems(401, 403, 422, 429),
)
def class_view(
    request: Request,
    offset: int = Query(0, ge=0, le=10_000_000, description="pairs to skip"),
    limit: int = Query(CLASS_PAGE, ge=1, le=CLASS_PAGE_MAX, description="pairs on this page"),
) -> dict[str, Any]:
    require_instructor(request)
    lab = lab_of(request)
    me_ = session_of(request)
    page, total = lab.store.class_page(offset, limit)
    ids = [row["id"] for row in page]
    by_pair: dict[str, list[Any]] = {pair_id: [] for pair_id in ids}
    for row in lab.store.runs_of_pairs(ids):
        by_pair[row["pair_id"]].append(row)
    positions = queue_positions(lab.store.runs_in([RunState.QUEUED]))
    waits = lab.scheduler.waits.remaining(time.time())
    starts = lab.start_times.summary()
    stored = lab.store.pairs_by_id(ids)
    numbers = lab.store.student_numbers([p["owner"] for p in stored.values()])
    run_ids = [r["id"] for rows in by_pair.values() for r in rows]
    restarts = restart_counts(lab.store.restart_events(run_ids))
    none = dict.fromkeys(RESTART_KINDS, 0)
    pairs = []
    for pair_id, rows in by_pair.items():
        pair = stored.get(pair_id)
        if pair is None or not rows:
            continue
        runs = sorted(rows, key=lambda r: r["label"])
        view = pair_view(pair, runs, positions, is_owner=False, waits=waits, start_times=starts)
        for shown, row in zip(view["runs"], runs, strict=True):
            shown["detail"] = row.get("detail")  # a failure's error output: instructors only
        mine = pair["owner"] == me_
        view["owner_tag"] = "you" if mine else f"student {numbers.get(pair['owner'], '?')}"
        view["preset_id"] = pair["preset"]
        view["active"] = any(r["state"] in LIVE_STATES for r in rows)
        for run in view["runs"]:  # what ended each segment, by kind
            run["restarts"] = restarts.get(run["id"], none)
        pairs.append(view)
    return {"pairs": pairs, "total": total, "offset": offset, "limit": limit}


@router.get(
    "/class/predictions",
    summary="Per lesson: the class's predictions against the measured outcomes",
    responses=problems(401, 403, 422, 429),
)
def class_predictions_view(request: Request) -> dict[str, Any]:
    require_instructor(request)
    return {"lessons": class_predictions(lab_of(request).store)}
