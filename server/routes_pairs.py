"""Lessons and pairs: what a student may start, starting a pair, and its state."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from crashdrill.server.runs import Lab
from crashdrill.server.schemas import NewPair, PairCreated, PairStatus, problems
from crashdrill.server.sessions import is_instructor, session_of

router = APIRouter(prefix="/api", tags=["pairs"])


def lab_of(request: Request) -> Lab:
    lab: Lab = request.app.state.lab
    return lab


@router.get("/presets", summary="Lesson presets a student may start")
async def presets(request: Request) -> list[dict[str, Any]]:
    return lab_of(request).presets()


@router.post(
    "/pairs",
    status_code=201,
    response_model=PairCreated,
    summary="Start a pair of runs (A and B) of a preset; they start or queue together",
    responses=problems(400, 404, 413, 422, 429),
)
async def create_pair(body: NewPair, request: Request) -> dict[str, Any]:
    instructor = is_instructor(request, request.app.state.settings.instructor_token)
    return lab_of(request).create_pair(body.preset, session_of(request), instructor)


@router.get(
    "/pairs/{pair}",
    response_model=PairStatus,
    summary="Both runs' state, stage, step, latest metrics and the knob that differs",
    responses=problems(404, 422),
)
async def get_pair(pair: str, request: Request) -> dict[str, Any]:
    return lab_of(request).pair(pair, session_of(request))
