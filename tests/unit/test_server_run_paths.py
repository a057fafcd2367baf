"""Stored records show paths relative to the run (server/run_paths.py)."""

from __future__ import annotations

from crashdrill.server.ingest import parse_lines
from crashdrill.server.run_paths import RunPaths, run_relative

RUN = "/srv/lab/runs/r1a2"


def test_paths_inside_the_run_dir_become_relative_and_other_runs_stay_as_they_are() -> None:
    value = {
        "kind": "ckpt",
        "path": f"{RUN}/ckpt/step-100",
        "text": f"resumed at step 100 from {RUN}/ckpt/step-100.",
        "dir": RUN,
        "url": "/srv/lab-mirror/r1a2/step-100",
        "gcs": "gs://bucket/runs/r1a2/step-100",
        "other": "/srv/lab/runs/r1a2b/ckpt",
        "list": [f"{RUN}/x", 3],
    }
    assert run_relative(value, RUN) == {
        "kind": "ckpt",
        "path": "ckpt/step-100",
        "text": "resumed at step 100 from ckpt/step-100.",
        "dir": ".",
        "url": "r1a2/step-100",
        "gcs": "gs://bucket/runs/r1a2/step-100",
        "other": "/srv/lab/runs/r1a2b/ckpt",
        "list": ["x", 3],
    }


def test_ingest_stores_the_run_relative_text() -> None:
    line = f'{{"kind":"ckpt","step":10,"path":"{RUN}/ckpt/step-10"}}\n'.encode()
    parsed, _, _ = parse_lines(line, 0, paths=RunPaths(RUN))
    assert parsed[0].value["path"] == "ckpt/step-10"
    assert RUN not in parsed[0].record.data
