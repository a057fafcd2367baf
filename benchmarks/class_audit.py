"""The records check of benchmarks/class_load.py: did every line a run wrote reach its
student's page (the records its first load fetched, then the stream: `stream_*`) and the
records API, once each, and did the trainer write every step?

    problems = audit_run(run_dir, seen, api_records)   # {"stream_lost": 0, …, "file": [...]}

The run's records.jsonl and mirror.jsonl (in the server's data dir: on a Ray cluster the
server's copy, to which the records are shipped) are the source of truth. A record is
known by (kind, segment, step, t) in all three (class_student.record_key). The file
itself must hold, per segment, every step once, from 1 (segment 0) or the resumed
checkpoint's step + 1 (a later segment), with no gap; a finished run's last segment ends
at its last step.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from class_student import RunSeen, file_keys, record_key  # a sibling: benchmarks run as scripts

from crashdrill.trainer.run_files import RECORDS_FILE, read_complete_lines


def step_problems(run_dir: Path, state: str, steps: int | None) -> list[str]:
    """What is wrong with the step records of each segment in records.jsonl."""
    by_segment: dict[int, list[int]] = {}
    resumed_from: dict[int, int] = {}
    for _offset, line in read_complete_lines(run_dir / RECORDS_FILE).lines():
        rec = json.loads(line)
        segment = rec.get("segment", 0)
        if rec.get("kind") == "step":
            by_segment.setdefault(segment, []).append(rec["step"])
        elif rec.get("kind") == "resume":
            resumed_from[segment] = rec.get("from_step") or 0
    out = []
    for segment, got in sorted(by_segment.items()):
        first = resumed_from.get(segment, 0) + 1
        twice = [s for s, n in Counter(got).items() if n > 1]
        missing = sorted(set(range(first, max(got) + 1)) - set(got))
        if twice:
            out.append(f"segment {segment}: steps written twice {twice[:5]}")
        if missing:
            out.append(f"segment {segment}: steps missing {missing[:5]} (of {len(missing)})")
        if min(got) != first:
            out.append(f"segment {segment}: starts at step {min(got)}, not {first}")
    if state == "finished" and by_segment:
        last = max(by_segment)
        if steps is not None and max(by_segment[last]) != steps:
            out.append(f"finished at step {max(by_segment[last])}, not {steps}")
    return out


def audit_run(run_dir: Path, seen: RunSeen, api_records: list[dict[str, Any]]) -> dict[str, Any]:
    """Records lost and repeated on the stream and in the API against the files."""
    expected = file_keys(run_dir)
    received = seen.received_keys()
    api = Counter(record_key(r) for r in api_records)
    lost = (expected - received) + (expected - api)
    return {
        "lost_examples": [list(k) for k in list(lost)[:5]],
        "stream_lost": sum((expected - received).values()),
        "stream_repeated": seen.repeated_ids + sum((received - expected).values()),
        "api_lost": sum((expected - api).values()),
        "api_repeated": sum((api - expected).values()),
        "file": step_problems(run_dir, seen.state, seen.steps),
    }
