"""The lab's web app, built by a factory (never at import time).

    from crashdrill.server.app import create_app
    from crashdrill.server.settings import Settings
    app = create_app(Settings(data_dir=Path("/tmp/lab")))   # then: uvicorn.run(app)

`crashdrill serve` does exactly that on 127.0.0.1:8000. Routes: docs/server.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount

import crashdrill
from crashdrill.server.api import health, instructor, live, pairs, runs
from crashdrill.server.api.schemas import problems
from crashdrill.server.door import instructor_sessions
from crashdrill.server.door.browser_guard import BrowserGuardMiddleware
from crashdrill.server.door.sessions import BodyLimitMiddleware, SessionMiddleware
from crashdrill.server.errors import LabError
from crashdrill.server.lab import Lab
from crashdrill.server.lessons.catalog import Catalog
from crashdrill.server.settings import Settings
from crashdrill.server.storage.db import DatabaseUnavailable
from crashdrill.server.stream.realtime import page_config
from crashdrill.server.stream.slots import StreamSlots
from crashdrill.server.stream.telemetry_feed import Sampler, default_sampler

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
RETRY_AFTER_S = 5  # what a 503 asks a client to wait while the database is unreachable
DESCRIPTION = (
    "Two small GPT runs train side by side, identical except for one knob. A crash test "
    "SIGKILLs one; it resumes from its last complete checkpoint, and the resume check "
    "compares the recomputed losses with the originals bit for bit."
)


def create_app(
    settings: Settings | None = None,
    *,
    sampler_factory: Callable[[Settings], Sampler | None] = default_sampler,
) -> FastAPI:
    settings = settings or Settings.from_env()
    lab = Lab(settings, sampler_factory=sampler_factory)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await lab.start()
        try:
            yield
        finally:
            await lab.stop()

    app = FastAPI(
        title="crashdrill lab",
        version=crashdrill.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        # Any route: 400 for a Host that is not the lab's or a Content-Length that is not a
        # number, 413 for a body over max_body_bytes (the middlewares answer before the
        # route), 503 while the database is unreachable.
        responses=problems(400, 413, 503),
    )
    app.state.lab = lab
    secret_key = settings.resolve_secret_key()
    instructor_sessions.install(app.state, settings, secret_key)
    app.state.settings = settings
    app.state.stream_slots = StreamSlots(settings.stream_max_per_address, settings.stream_max_total)
    app.state.catalog = Catalog(settings.instructor_presets_dir, settings.corpora)
    app.include_router(pairs.router)
    app.include_router(runs.router)
    app.include_router(live.router)
    app.include_router(instructor.router)
    app.include_router(health.router)
    app.add_exception_handler(LabError, _lab_error)
    app.add_exception_handler(DatabaseUnavailable, _database_unavailable)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    # Innermost of ours: it sees the scope that check_token marks.
    app.add_middleware(instructor_sessions.WrongTokenDelay)
    app.add_middleware(SessionMiddleware, secret_key=secret_key, settings=settings)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(BrowserGuardMiddleware, settings=settings)  # outermost
    _mount_web(app)
    return app


async def _lab_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LabError)
    return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=exc.headers)


async def _database_unavailable(request: Request, exc: Exception) -> Response:
    """503 while the database is unreachable; the log says why, once per outage (the
    page shows the detail and tries again)."""
    request.app.state.lab.outage.failed(exc)
    return JSONResponse(
        {"detail": "the lab's database is unreachable right now; try again in a few seconds"},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    """FastAPI's answer, but a 405 names in Allow every method the path answers to: each
    method of a path is a route of its own (GET and POST /api/instructor/presets), and
    Starlette's Allow names only the first route whose path matched."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        methods = allowed_methods(request)
        if methods:
            exc = StarletteHTTPException(405, exc.detail, headers={"Allow": ", ".join(methods)})
    return await http_exception_handler(request, exc)


def allowed_methods(request: Request) -> list[str]:
    """The methods some route of the app fully matches for the request's path, asked of
    each route with a fresh scope per method (routes matched by FastAPI's included routers
    too; a static mount answers GET and HEAD only)."""
    from starlette.staticfiles import StaticFiles

    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Mount):
            probe = {"type": "http", "path": request.url.path, "root_path": "", "method": "GET"}
            if isinstance(route.app, StaticFiles) and route.matches(probe)[0] == Match.FULL:
                methods |= {"GET", "HEAD"}
            continue
        for method in HTTP_METHODS:
            probe = {"type": "http", "path": request.url.path, "root_path": "", "method": method}
            if route.matches(probe)[0] == Match.FULL:
                methods.add(method)
    return sorted(methods)


async def _invalid_request(_request: Request, exc: Exception) -> Response:
    """400 for a body that is not JSON, 422 naming the field otherwise."""
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"type": e.get("type"), "loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg")}
        for e in exc.errors()
    ]
    if any(e["type"] == "json_invalid" for e in errors):
        return JSONResponse(
            {"detail": "the request body is not valid JSON", "errors": errors}, status_code=400
        )
    parts = []
    for e in errors[:5]:
        where = ".".join(p for p in e["loc"] if p not in ("body", "query", "path"))
        parts.append(f"{where}: {e['msg']}" if where else str(e["msg"]))
    return JSONResponse({"detail": "; ".join(parts), "errors": errors}, status_code=422)


def _mount_web(app: FastAPI) -> None:
    """The page at / (web/templates/index.html) and /static, when the web part exists."""
    try:
        import crashdrill.web as web
    except ImportError:
        web_dir = None
    else:
        web_dir = Path(web.__file__).parent
    index = web_dir / "templates" / "index.html" if web_dir else None
    static = web_dir / "static" if web_dir else None
    if static is not None and static.is_dir():
        from fastapi.staticfiles import StaticFiles

        app.mount("/static", StaticFiles(directory=static), name="static")
    if index is not None and index.is_file():
        from fastapi.templating import Jinja2Templates

        templates = Jinja2Templates(directory=index.parent)
        # What the page may know of the setup (Realtime: URL and anon key, never the
        # service key), as JSON in <script id="lab-config"> of index.html.
        templates.env.globals["lab_config"] = page_config(app.state.settings)

        @app.get("/", include_in_schema=False)
        async def page(request: Request) -> Any:
            return templates.TemplateResponse(request, "index.html", {})

        @app.get("/lesson/{preset}", include_in_schema=False)
        async def lesson_page(preset: str, request: Request) -> Any:
            """A lesson's shareable link: the lesson, ready to start (404 when a student may
            not see it)."""
            status = pairs.lesson_link_status(preset, request)  # 404, 403, 422
            return templates.TemplateResponse(request, "index.html", {}, status_code=status)

        @app.get("/instructor", include_in_schema=False)
        async def instructor_page(request: Request) -> Any:
            return templates.TemplateResponse(request, "instructor.html", {})

        @app.get("/class", include_in_schema=False)
        async def class_page(request: Request) -> Any:
            return templates.TemplateResponse(request, "class.html", {})

    else:

        @app.get("/", include_in_schema=False)
        async def no_page() -> HTMLResponse:
            return HTMLResponse(
                "<!doctype html><title>crashdrill lab</title><h1>crashdrill lab</h1>"
                "<p>The web page is not installed; the API is at <a href=/docs>/docs</a>.</p>"
            )
