"""The lab at http://127.0.0.1:8000, with embedded defaults (`crashdrill serve`).

    crashdrill serve                                   SQLite + runs under the data dir
    crashdrill serve --port 8080 --data-dir /srv/lab --max-concurrent 4
    crashdrill serve --executor ray --ray-address HEAD:6379 --mirror gs://BUCKET/lab
    crashdrill serve --ray HEAD:6379 --mirror …         the same, shorter
    python -m crashdrill.server …                      the same, without the main CLI

Settings also come from CRASHDRILL_* environment variables (docs/server.md); the flags are
the ones the settings' sections declare (server/settings_sections/).
"""

from __future__ import annotations

import argparse
import errno
import gc
import logging
import socket
import sys
from typing import TYPE_CHECKING, Any

from crashdrill.trainer.exit_codes import EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from crashdrill.server.setting_schema import Declared
    from crashdrill.server.settings import Settings


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `serve` on the main CLI's subparsers; `run` is its handler."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve", help="the lab in a browser", description=__doc__.split("\n\n")[0]
    )
    _add_arguments(p)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag a section declares (server/settings_sections/), grouped by section, then
    the flags that are no setting: --ray and --log-level."""
    from crashdrill.server.setting_schema import SWITCH, declared_fields, flag_type
    from crashdrill.server.settings_sections import SECTIONS, ClusterSection, LabSection

    for section in SECTIONS:
        flagged = [(n, d) for n, d in declared_fields(section) if d.flag]
        if not flagged:
            continue
        g = p if section is LabSection else p.add_argument_group(section.TITLE.lower())
        for name, declared in flagged:
            assert declared.flag is not None and declared.parse is not None
            if declared.parse is SWITCH:
                g.add_argument(
                    declared.flag,
                    dest=name,
                    action="store_true",
                    default=None,
                    help=_help(declared),
                )
                continue
            g.add_argument(
                declared.flag,
                dest=name,
                type=flag_type(declared.parse),
                metavar=declared.metavar,
                help=_help(declared),
            )
        if section is ClusterSection:
            g.add_argument(
                "--ray",
                metavar="ADDRESS",
                help="shorthand for --executor ray --ray-address ADDRESS",
            )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _help(declared: Declared) -> str:
    """A flag's help: its own words, else the docs' (argparse's % escaped)."""
    return (declared.help or declared.what).replace("%", "%%")


def setting_flags(args: argparse.Namespace) -> dict[str, object]:
    """The settings the flags gave, by Settings field name (None: not given)."""
    from crashdrill.server.setting_schema import declared_fields
    from crashdrill.server.settings_sections import SECTIONS

    return {
        name: getattr(args, name)
        for section in SECTIONS
        for name, declared in declared_fields(section)
        if declared.flag
    }


def executor_options(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(executor, ray_address) from the flags, `--ray ADDRESS` unfolded; ValueError when
    they disagree."""
    executor, address = args.executor, args.ray_address
    if args.ray is None:
        return executor, address
    if executor not in (None, "ray") or address not in (None, args.ray):
        raise ValueError(
            f"--ray {args.ray} is short for --executor ray --ray-address {args.ray}: it"
            " cannot go with --executor or --ray-address naming something else"
        )
    return "ray", args.ray


def run_limit_text(settings: Settings) -> str:
    """The start line's run limit (server/admission.py), with its warning when clamped."""
    from crashdrill.server.admission import Admission

    return Admission.from_settings(settings).describe()


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from crashdrill.server.app import create_app
    from crashdrill.server.door.front_door import ConnectionLimits, FrontDoor, open_files_limit
    from crashdrill.server.settings import Settings, SettingsError
    from crashdrill.server.storage.db import DatabaseUnavailable

    try:
        executor, ray_address = executor_options(args)
    except ValueError as e:
        print(f"crashdrill serve: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        flags = setting_flags(args) | {"executor": executor, "ray_address": ray_address}
        settings = Settings.from_env(**flags)
        # Before anything opens a file: the soft limit up to the hard one, then the caps
        # fitted below it with a reserve for the database, runs and telemetry.
        door = FrontDoor(ConnectionLimits.fit(settings, open_files_limit()))
    except SettingsError as e:
        print(f"crashdrill serve: {e}", file=sys.stderr)
        return EXIT_USAGE
    problem = _port_problem(settings.host, settings.port)
    if problem:
        print(f"crashdrill serve: {problem}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(settings)
    except (SettingsError, DatabaseUnavailable) as e:
        print(f"crashdrill serve: {e}", file=sys.stderr)
        return EXIT_USAGE
    # Everything imported so far lives as long as the process: keep it out of the
    # collector's full passes, which otherwise stall every stream for ~100 ms.
    gc.collect()
    gc.freeze()
    print(
        f"crashdrill: the lab is at http://{settings.host}:{settings.port}"
        f" (data in {settings.data_dir}; database: {app.state.lab.db.describe()};"
        f" {run_limit_text(settings)}; {door.limits.describe()};"
        f" {warm_text(app.state.lab.executor.starts())}; {instructor_mode(settings)})",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=3,  # open SSE streams never finish by themselves
        # X-Forwarded-* are believed only from the `trusted_proxies` setting
        # (server/door/forwarded.py), not from every loopback peer as uvicorn would.
        proxy_headers=False,
        **door.uvicorn_options(settings),  # timeouts, caps, backlog: server/door/front_door.py
    )
    uvicorn.Server(config).run()
    return EXIT_OK


def warm_text(starts: dict[str, Any]) -> str:
    """The start line's word on how trainers start (workers/warm.py's status)."""
    from crashdrill.workers.warm import WARMING

    if starts.get("warm") == WARMING:
        return "warm trainers warming up (importing torch; /api/health says when ready)"
    if starts.get("mode") == "node":
        return "trainers fork from each Ray node's warm process"
    why = starts.get("error")
    return f"trainers start with exec ({why})" if why else "trainers start with exec"


def instructor_mode(settings: Settings) -> str:
    """The start line's word on instructor mode: where to log in, or how to turn it on."""
    if settings.instructor_token:
        return f"instructor mode on: log in at http://{settings.host}:{settings.port}/instructor"
    return "instructor mode off: python3 quickstart.py lab --instructor turns it on"


def _port_problem(host: str, port: int) -> str | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use; choose another with --port"
            return f"cannot listen on {host}:{port}: {e.strerror}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="crashdrill serve", description=__doc__.split("\n\n")[0])
    _add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except KeyboardInterrupt:
        return 130
