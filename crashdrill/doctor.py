"""`crashdrill doctor PART`: check a production part against the user's own account.

    crashdrill doctor gcs gs://bucket/prefix     write, read back, checksum, delete
    crashdrill doctor supabase                   publish, subscribe, round trip, diagnosis
    crashdrill doctor postgres                   connect, round trip, write, schema version

Each part lives beside the code it checks, in a module with `add_arguments(parser)` and
`run(args) -> int`; the module imports its optional client library inside `run`, so a
missing extra is a clear message (exit 2), not a traceback.
Exit codes: 0 the part works, 1 it does not (the diagnosis says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

PARTS: dict[str, tuple[str, str]] = {
    "gcs": ("crashdrill.workers.mirror_doctor", "check a checkpoint mirror bucket (gs://…)"),
    "supabase": ("crashdrill.server.stream.realtime_doctor", "check a Supabase project's Realtime"),
    "postgres": (
        "crashdrill.server.storage.db_doctor",
        "check a Postgres database (Supabase's too)",
    ),
}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "doctor", help="check a production part (gcs, supabase, postgres) against your own account"
    )
    parts = p.add_subparsers(dest="part", required=True, parser_class=type(p))
    for name, (module, help_text) in PARTS.items():
        part = parts.add_parser(name, help=help_text)
        mod = importlib.import_module(module)
        mod.add_arguments(part)
        part.set_defaults(doctor=mod.run)
    return p


def run(args: argparse.Namespace) -> int:
    return int(args.doctor(args))
