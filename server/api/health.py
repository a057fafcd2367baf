"""Is the lab ready? One route for load balancers, `docker compose` and the image's
HEALTHCHECK (docker/server.Dockerfile):

    curl -fsS http://127.0.0.1:8000/api/health     # exit 0 only when the lab is ready

200 once the lab has started (uvicorn answers only after the lab's startup: runs of before
adopted or resumed, queue and ingest running) and its database answers a query; 503 with
`Retry-After` while the database is unreachable (the same answer every route gives then).
It reads nothing a student could not see, and needs no cookie.

`cluster` says where runs execute and whether that answers (server/cluster.py): the
local executor is always reachable; on a Ray cluster that stops answering the lab stays
ready (200, `reachable: false`): its runs keep training on their nodes and their records
catch up when it is back.

`trainers` says how trainers start (workers/warm.py): forked from a warm process, or with
exec where there is none (and why), so a lab whose crash tests got slow says so;
`start_times` how long they take, as the trainers measured it (server/start_times.py).
`warm_trainers` is "warming" from the lab's start until the warm process has imported
torch (a Start meanwhile waits for it: 2–3 s on a small machine, then ~0.4 s), "ready"
after, "none" where starts exec or a Ray cluster's nodes keep their own; the page shows
"warming up" while it is "warming".
`admission` how many runs train at once (server/admission.py): what this machine carries,
and the warning when a `max_concurrent` above it was clamped.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

import crashdrill
from crashdrill.server.api.schemas import StartTimes, problems
from crashdrill.server.cluster import cluster_status
from crashdrill.server.lab import Lab
from crashdrill.workers.warm import NONE

router = APIRouter(prefix="/api", tags=["health"])


class Cluster(BaseModel):
    kind: str = Field(description="local (this machine) or ray")
    address: str | None = Field(description="the Ray cluster's address; null on local")
    reachable: bool = Field(description="false while calls to the cluster fail")
    since: float | None = Field(description="unix time the cluster stopped answering")
    last_ok: float | None = Field(description="unix time of the last call that answered")
    error: str | None = Field(description="the last failed call's error, while unreachable")


class TrainerStarts(BaseModel):
    mode: str = Field(
        description="fork: trainers fork from a warm process that imported torch once;"
        " exec: each start imports it again (no warm process: see error); node: each Ray"
        " node's run actor keeps its own"
    )
    pid: int | None = Field(description="the warm process, while there is one")
    forked: int = Field(description="starts forked from the warm process since the lab started")
    exec: int = Field(description="starts of the built-in trainer that fell back to exec")
    error: str | None = Field(description="why starts exec instead of forking, if they do")


class Admission(BaseModel):
    max_concurrent: int | None = Field(
        description="the setting as configured; null on a cluster (its nodes are the queue)"
    )
    machine_runs: int = Field(description="runs this machine carries at full pace, always let in")
    ceiling: int | None = Field(
        description="the most runs at once: max_concurrent, or the machine's ceiling it was"
        " clamped to"
    )
    limit: int | None = Field(description="runs at once as the newest scheduling pass admitted")
    keeps_pace: bool | None = Field(
        description="whether the runs training then kept the pace measured when the machine"
        " had room (null before a pass)"
    )
    clamped: bool = Field(description="max_concurrent was above the machine's ceiling")
    allow_overcommit: bool = Field(description="a max_concurrent above the ceiling is kept")
    warning: str | None = Field(description="what the start line said of a clamp; null if none")


class Health(BaseModel):
    ready: bool = Field(description="true: the lab takes requests and its database answers")
    version: str = Field(description="the crashdrill release")
    database: str = Field(description="sqlite or postgres (never the URL: it may hold a password)")
    schema_version: int = Field(description="the database schema the lab migrated to")
    cluster: Cluster = Field(description="where runs execute, and whether it answers")
    trainers: TrainerStarts = Field(description="how trainers start: forked warm, or exec")
    warm_trainers: Literal["warming", "ready", "none"] = Field(
        description="warming: the warm trainer process is still importing torch (a Start"
        " waits for it); ready: starts fork from it; none: no warm process on this machine"
    )
    start_times: StartTimes = Field(
        description="how long starts take: the median of the newest trainers' own figure"
        " (process start to first step record) and how many"
    )
    admission: Admission = Field(description="how many runs train at once, and why")


@router.get(
    "/health",
    response_model=Health,
    summary="Ready: the lab has started and its database answers (503 while it does not)",
    responses=problems(503),
)
def health(request: Request) -> dict[str, Any]:
    # A plain def: the database's round trip runs on a worker thread, not the event loop.
    lab: Lab = request.app.state.lab
    # A real read (no write, no lock): DatabaseUnavailable becomes the app's 503.
    row = lab.db.one("SELECT MAX(version) AS v FROM schema_migrations")
    lab.outage.ok()
    starts = lab.executor.starts()
    return {
        "ready": True,
        "version": crashdrill.__version__,
        "database": lab.db.dialect,
        "schema_version": int(row["v"]) if row and row["v"] is not None else 0,
        "cluster": cluster_status(lab.executor),
        "trainers": starts,
        "warm_trainers": starts.get("warm", NONE),
        "start_times": lab.start_times.summary(),
        "admission": lab.admission.status(),
    }
