"""The checkpoint mirror around one headless run: `crashdrill run PRESET --mirror URL`.

Before training, a run dir without a checkpoint (a wiped disk, a new machine) gets the
newest mirrored copy that verifies, pulled the way the lab's supervisor pulls one
(workers/mirror_restore.py), and the run resumes from it; while training, each new
checkpoint is copied off the machine by the mirror's background threads (training never
waits for a copy); at the end the last checkpoint is copied before the command returns,
for at most `wait_s`. A graceful stop (SIGTERM, --stop-after) copies it sooner, through
`MirroredRun.flush`, within what is left of its grace. Every mirror event is also printed
through `say`.

The lab does not use this: its server owns one mirror for all runs, and its trainers are
started without --mirror. Nothing here reads CRASHDRILL_MIRROR, so a lab's trainer never
starts a second mirror of its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from crashdrill.trainer.run_files import RUN_JSON
from crashdrill.workers.mirror import CheckpointMirror, newest_local, pull_for_restart
from crashdrill.workers.run_dir import RunDir

WAIT_S = 60.0  # how long the end of a run waits for its last copy


def next_segment(run_dir: Path) -> int:
    """The segment the next trainer start will have (the trainer counts starts)."""
    try:
        return int(json.loads((run_dir / RUN_JSON).read_text()).get("starts", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return 0


class MirroredRun:
    """One run dir watched by a mirror: what the block of `mirrored_run` gets."""

    def __init__(self, mirror: CheckpointMirror, key: str) -> None:
        self.mirror = mirror
        self.key = key

    def flush(self, timeout: float) -> bool:
        """Copy the newest checkpoint now (the run is ending) and wait for it for at most
        `timeout` seconds; True when it reached the mirror."""
        self.mirror.release(self.key)
        deadline = time.monotonic() + timeout
        while self.mirror.busy(self.key) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.mirror.busy(self.key)


@contextmanager
def mirrored_run(
    url: str, run_dir: Path, say: Callable[[str], None], wait_s: float = WAIT_S
) -> Iterator[MirroredRun]:
    """Pull if the run dir has no checkpoint, mirror while the block runs, copy the last
    checkpoint at the end. Raises MirrorURLError for a URL of no known kind."""
    run_dir = Path(run_dir)

    def on_event(event: dict[str, Any]) -> None:
        say(str(event.get("text", "")))

    mirror = CheckpointMirror(url, on_event=on_event)
    run_dir.mkdir(parents=True, exist_ok=True)
    if newest_local(run_dir) is None:
        pull = pull_for_restart(mirror.url, run_dir, next_segment(run_dir))
        for event in pull.events:
            say(event["text"])
        if pull.events:
            RunDir(run_dir).append_records(pull.events)
        got = pull.restored
        if got is not None:
            say(
                f"No checkpoint in {run_dir}; pulled step {got.step} from {got.url}"
                f" ({got.bytes} bytes, verified, in {got.seconds:.1f}s): the run resumes there."
            )
    key = mirror.watch(run_dir)
    mirror.start()
    try:
        yield MirroredRun(mirror, key)
    finally:
        mirror.release(key)
        deadline = time.monotonic() + wait_s
        told = False
        while mirror.busy(key) and time.monotonic() < deadline:
            if not told and time.monotonic() > deadline - wait_s + 2:
                say(f"Waiting up to {wait_s:.0f}s for the last checkpoint to reach {mirror.url}…")
                told = True
            time.sleep(0.05)
        if mirror.busy(key):
            say(
                f"The last checkpoint did not reach {mirror.url} within {wait_s:.0f}s; the"
                " mirror has the copies made before it (the next run with --mirror copies it)."
            )
        mirror.stop()
