"""Where a run's checkpoint copies live in the mirror, and the order they are deleted in.

    key = mirror_key(run_dir)                       # the run dir's name
    base = copy_base(key, 1300)                     # "KEY/step-00001300"
    mirrored_files(backend, key)                    # {1300: {"MANIFEST.json", ...}, ...}
    delete_copy(backend, key, 1300, names)          # manifest first
    delete_copies(backend, key)                     # every copy of the run (housekeeping)

Layout: `<mirror>/<run dir name>/step-XXXXXXXX/` holds the checkpoint's files and its
`MANIFEST.json`, named and checked by the same rule as on disk
(trainer/checkpoint_layout.py). A copy without its manifest does not exist for a restore,
so the manifest is uploaded last (workers/mirror.py) and deleted first: a copy that is
half deleted, by a prune or by the lab's housekeeping, never counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from crashdrill.trainer.checkpoint_layout import MANIFEST, parse_step_dir, step_dir_name
from crashdrill.workers.mirror_backends import Backend


def mirror_key(run_dir: str | Path) -> str:
    """The run's key in the mirror: its run dir's name (the lab's run id)."""
    return Path(run_dir).name


def copy_base(key: str, step: int) -> str:
    """The mirror's name of the run's copy of step `step` (its files are under it)."""
    return f"{key}/{step_dir_name(step)}"


def mirrored_files(backend: Backend, key: str) -> dict[int, set[str]]:
    """{step: file names} of the run's copies in the mirror."""
    out: dict[int, set[str]] = {}
    for name in backend.list(f"{key}/"):
        parts = name.split("/")
        if len(parts) == 3 and (step := parse_step_dir(parts[1])) is not None:
            out.setdefault(step, set()).add(parts[2])
    return out


def delete_copy(backend: Backend, key: str, step: int, names: Iterable[str]) -> None:
    """Delete the files `names` of the run's copy of `step`, its manifest first."""
    base = copy_base(key, step)
    for name in sorted(names, key=lambda n: n != MANIFEST):
        backend.delete(f"{base}/{name}")


def delete_copies(backend: Backend, key: str) -> None:
    """Delete every copy of the run in the mirror (each one manifest first)."""
    for step, names in mirrored_files(backend, key).items():
        delete_copy(backend, key, step, names)
