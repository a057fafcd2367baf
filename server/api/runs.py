"""One run: crash test, stop, records for charts, resume checks, the human log; and the
run-record contract those records follow (GET /api/record-kinds)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from crashdrill.server.api.pairs import lab_of
from crashdrill.server.api.schemas import (
    CrashRequest,
    CrashResult,
    Events,
    PreemptResult,
    RecordKind,
    RecordKinds,
    RecordsPage,
    ResumeChecks,
    StopResult,
    problems,
)
from crashdrill.server.door.sessions import is_instructor, session_of
from crashdrill.server.storage.store import run_states_json
from crashdrill.server.views import event_view, record_json
from crashdrill.trainer.record_contract import contract_json

router = APIRouter(tags=["runs"])
RUN = "/api/runs/{run}"

MAX_PAGE = 20000


def _who(request: Request) -> tuple[str, bool]:
    token = request.app.state.settings.instructor_token
    return session_of(request), is_instructor(request, token)


@router.post(
    RUN + "/crash",
    status_code=202,
    response_model=CrashResult,
    summary="Crash test: SIGKILL the trainer now; it resumes from its last checkpoint",
    responses=problems(403, 404, 409, 413, 422, 429),
)
async def crash(run: str, request: Request, body: CrashRequest | None = None) -> dict[str, Any]:
    session, instructor = _who(request)
    asked = body.crash_mode if body is not None else None
    return lab_of(request).crash(run, session, instructor, asked)


@router.post(
    RUN + "/preempt",
    status_code=202,
    response_model=PreemptResult,
    summary="Preempt: SIGTERM the trainer, SIGKILL after its grace; it resumes from what it saved",
    responses=problems(403, 404, 409, 413, 429),
)
async def preempt(run: str, request: Request) -> dict[str, Any]:
    session, instructor = _who(request)
    return lab_of(request).preempt(run, session, instructor)


@router.post(
    RUN + "/stop",
    status_code=202,
    response_model=StopResult,
    summary="Stop a run for good (queued: leaves the queue)",
    responses=problems(403, 404, 409, 413, 429),
)
async def stop(run: str, request: Request) -> dict[str, Any]:
    session, instructor = _who(request)
    return lab_of(request).stop_run(run, session, instructor)


@router.get(
    RUN + "/records",
    response_model=RecordsPage,
    summary="Run records (history for charts), oldest first, after a record id",
    responses=problems(404, 422),
)
def records(
    run: str,
    request: Request,
    kind: Annotated[list[RecordKind] | None, Query(description="only these kinds")] = None,
    after: Annotated[int, Query(ge=0, le=2**62, description="records with id > after")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 5000,
) -> Response:
    lab = lab_of(request)
    lab.run_row(run)
    rows = lab.store.records(run, list(kind) if kind else None, after, limit)
    items = ",".join(record_json(r["id"], run, r["data"]) for r in rows)
    next_after = rows[-1]["id"] if rows else after
    body = f'{{"run":{json.dumps(run)},"records":[{items}],"next_after":{next_after}}}'
    return Response(body, media_type="application/json")


@router.get(
    RUN + "/resume-checks",
    response_model=ResumeChecks,
    summary="Per resume: the recomputed steps compared with the originals, bit for bit",
    responses=problems(404, 422),
)
def resume_checks(run: str, request: Request) -> dict[str, Any]:
    lab = lab_of(request)
    lab.run_row(run)
    return {"run": run, "checks": lab.resume_checks(run)}


@router.get(
    RUN + "/events",
    response_model=Events,
    summary="The human log of a run, in order",
    responses=problems(404, 422),
)
def events(run: str, request: Request) -> dict[str, Any]:
    lab = lab_of(request)
    lab.run_row(run)
    return {"run": run, "events": [event_view(r) for r in lab.store.records_of_kind(run, "event")]}


@router.get(
    "/api/record-kinds",
    response_model=RecordKinds,
    summary="The run-record contract: every record kind, its fields, which are deterministic",
)
def record_kinds() -> dict[str, Any]:
    return {**contract_json(), "run_states": run_states_json()}
