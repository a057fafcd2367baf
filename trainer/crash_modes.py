"""Crash modes: what a lesson's **Crash test** button does, in one registry. A lesson names
one in its preset (`[crash] mode`, trainer/presets.py checks it against NAMES); the lab's
API offers exactly these (server/api/schemas.py derives its choices from NAMES); the
supervisor does what a mode's fields say (workers/supervisor.py), and the lab starts a
mode's runs with what it needs (server/lessons/crash_effects.py).

    mode_named("wipe")          # CrashMode(name="wipe", …, wipes_disk=True)
    mode_named("explode")       # CrashModeError: … one of 'kill', 'during_save', …
    NAMES                       # ("kill", "during_save", "wipe", "host", "rank"), in MODES' order
    DEFAULT                     # "kill": a lesson without `[crash] mode`
    HOST_LOSS                   # "host": the first mode that moves_host, as a lost host is told
    modes_json()                # [{"name", "summary", "waits_for_save", …}]: GET /api/record-kinds

Every mode starts with a SIGKILL (of the whole process tree, or of one rank's process:
no chance to save), followed by a restart with `--require-checkpoint` once the run has
saved one. What differs is said by a mode's fields:

- `waits_for_save`: the kill waits for the trainer to announce that it is inside a
  checkpoint write, and the lab starts the lesson's runs with the checkpoint-pause hook
  holding each cadence write open (trainer/checkpoint_pause.py), so the kill lands there;
  the crash route answers `armed` until it does.
- `wipes_disk`: after the kill the run's local checkpoint directory is deleted, like a
  disk that vanished with the session; the restart finds only what a mirror kept.
- `moves_host`: and the run restarts on another machine of the lab's Ray cluster, from the
  newest verified checkpoint in the mirror (a lab without Ray restarts it where it was,
  as `wipes_disk` alone does, and its event says so).
- `one_rank`: the SIGKILL takes one rank's process of a run with several ranks, not its
  launcher (the rank its `crash_rank` names, or one chosen by its seed; the pids are in
  the run dir's ranks file, trainer/ranks.py). The launcher sees the rank lost and takes
  the group down; the restart event names the rank and how long the launcher took to
  notice. A one-rank run refuses it (NotRunning, naming `ranks`).

The page reads the registry from GET /api/record-kinds (`crash_modes`, from modes_json) and
acts on a mode's fields, never on its name (tests/unit/test_crash_modes_registry.py checks
web/static), and so does every reader of an event's `crash_mode` field.

Adding a mode: a CrashMode in MODES (its name, its one-line summary, the fields that say
what it does), its row in docs/presets.md's table (tests/unit/test_crash_modes_registry.py
checks the table and the API's choices against this registry) and a test of what it
does. A behaviour that no field describes yet is a new field here and the one place in
the supervisor that reads it.

Imports nothing but the standard library: the supervisor, the server and the CLI read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class CrashMode:
    name: str
    summary: str  # what Crash test does, one line: the docs' table, the API's description
    waits_for_save: bool = False  # the kill lands inside the next checkpoint write
    wipes_disk: bool = False  # the run's local checkpoints are deleted after the kill
    moves_host: bool = False  # the run restarts on another machine, from the mirror
    one_rank: bool = False  # the kill takes one rank of a run with several, not the launcher


class CrashModeError(ValueError):
    """A crash mode that is not in the registry: names it and the modes allowed."""


MODES: tuple[CrashMode, ...] = (
    CrashMode("kill", "SIGKILL now"),
    CrashMode(
        "during_save",
        "SIGKILL in the middle of the next checkpoint write (the lab holds each write open"
        " for a second so that the kill lands there)",
        waits_for_save=True,
    ),
    CrashMode(
        "wipe",
        "SIGKILL, then the run's local checkpoint directory is deleted, like a disk that"
        " vanished with the session",
        wipes_disk=True,
    ),
    CrashMode(
        "host",
        "the same as wipe, and the run restarts on another machine of the lab's Ray cluster"
        " from the newest verified checkpoint in the mirror (without Ray: on the same"
        " machine, as wipe, and its event says so)",
        wipes_disk=True,
        moves_host=True,
    ),
    CrashMode(
        "rank",
        "SIGKILL of one rank's process of a run with several ranks (its crash_rank, or one"
        " chosen by its seed), not the launcher: the launcher sees the rank lost and takes"
        " the group down, and the run restarts from its last complete checkpoint",
        one_rank=True,
    ),
)
NAMES: tuple[str, ...] = tuple(m.name for m in MODES)
DEFAULT = "kill"
_BY_NAME = {m.name: m for m in MODES}
# A machine that vanished by itself ends the run as the first mode that `moves_host` does:
# the event of that restart names it in its crash_mode (workers/restart_events.py).
HOST_LOSS = next(m.name for m in MODES if m.moves_host)


def allowed() -> str:
    """The modes a message offers: "'kill', 'during_save', …"."""
    return ", ".join(repr(n) for n in NAMES)


def mode_named(name: str) -> CrashMode:
    """The mode called `name`; CrashModeError names it and the modes allowed."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise CrashModeError(f"crash mode {name!r} is not allowed: one of {allowed()}") from None


def modes_json() -> list[dict[str, Any]]:
    """Every mode with its fields, in MODES' order (GET /api/record-kinds `crash_modes`)."""
    return [asdict(m) for m in MODES]
