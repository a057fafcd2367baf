"""The mirror's layout and delete order (workers/mirror_layout.py), which the mirror's
prune and the lab's housekeeping share."""

from __future__ import annotations

import io
import time
from pathlib import Path

from crashdrill.trainer.checkpoint_layout import MANIFEST
from crashdrill.workers.mirror_backends import LocalBackend, RetryPolicy
from crashdrill.workers.mirror_layout import (
    copy_base,
    delete_copies,
    delete_copy,
    mirror_key,
    mirrored_files,
)

FAST = RetryPolicy(attempts=1, base_s=0.0, cap_s=0.0)


class Deletes:
    """A backend wrapper that records each delete, in order."""

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner
        self.url = inner.url
        self.deleted: list[str] = []

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)

    def delete(self, name: str) -> None:
        self.deleted.append(name)
        self.inner.delete(name)


def _copy(backend: LocalBackend, key: str, step: int, names: list[str]) -> None:
    for name in names:
        data = name.encode()
        backend.put(f"{copy_base(key, step)}/{name}", io.BytesIO(data), len(data))


def test_a_run_s_copies_live_under_its_run_dir_name_one_folder_a_step(tmp_path: Path) -> None:
    assert mirror_key(tmp_path / "runs" / "r-1") == "r-1"
    assert mirror_key("/data/runs/r-1/") == "r-1"
    assert copy_base("r-1", 150) == "r-1/step-00000150"
    backend = LocalBackend(tmp_path / "mirror", FAST, time.sleep)
    _copy(backend, "r-1", 150, ["model.pt", MANIFEST])
    _copy(backend, "r-1", 200, ["model.pt"])  # its manifest not uploaded yet
    _copy(backend, "r-2", 50, ["model.pt", MANIFEST])
    assert mirrored_files(backend, "r-1") == {150: {"model.pt", MANIFEST}, 200: {"model.pt"}}


def test_a_copy_is_deleted_manifest_first_so_a_half_deleted_copy_never_counts(
    tmp_path: Path,
) -> None:
    inner = LocalBackend(tmp_path / "mirror", FAST, time.sleep)
    names = ["model.pt", "optimizer.pt", MANIFEST, "train_state.pt"]
    _copy(inner, "r-1", 150, names)
    backend = Deletes(inner)
    delete_copy(backend, "r-1", 150, set(names))  # type: ignore[arg-type]
    assert backend.deleted[0] == f"r-1/step-00000150/{MANIFEST}"
    assert sorted(backend.deleted) == sorted(f"r-1/step-00000150/{n}" for n in names)
    assert mirrored_files(inner, "r-1") == {}


def test_deleting_a_run_s_copies_takes_every_step_and_leaves_other_runs_alone(
    tmp_path: Path,
) -> None:
    inner = LocalBackend(tmp_path / "mirror", FAST, time.sleep)
    for step in (100, 150):
        _copy(inner, "r-1", step, ["model.pt", MANIFEST])
    _copy(inner, "r-2", 100, ["model.pt", MANIFEST])
    backend = Deletes(inner)
    delete_copies(backend, "r-1")  # type: ignore[arg-type]
    firsts = [backend.deleted[0], backend.deleted[2]]
    assert all(name.endswith(f"/{MANIFEST}") for name in firsts)
    assert mirrored_files(inner, "r-1") == {}
    assert mirrored_files(inner, "r-2") == {100: {"model.pt", MANIFEST}}
