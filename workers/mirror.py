"""The checkpoint mirror: complete checkpoints copied off the machine in the background,
and pulled back when a restart finds none on the machine.

    mirror = CheckpointMirror("gs://my-bucket/crashdrill")    # or a local directory
    mirror.start()
    mirror.watch(run_dir)            # the lab does this for every run it starts or adopts
    mirror.release(run_dir.name)     # the run ended: copy its last checkpoint, then forget it
    mirror.settled(run_dir.name)     # True once that last copy was made or tried
    mirror.stop()

    restore_latest("gs://my-bucket/crashdrill", run_dir)   # -> Restored(step=…) or None

Each run mirrors under `<mirror>/<run dir name>/step-XXXXXXXX/` (mirror_layout.py), the
same files as the checkpoint (which checkpoints count: trainer/checkpoint_layout.py; the
in-place slot is never copied) with `MANIFEST.json` uploaded last (and deleted first when
a step is copied again), so a copy without its manifest does not exist for the restore,
exactly as on disk. The last `keep` (≥ 2, the run's own `keep`) copies are kept.

Why a poller: the trainer is another process, and the trainer's contract already says
when a checkpoint is complete (its directory has MANIFEST.json). Polling `DIR/ckpt/`
(one directory listing per run every `poll_s`) needs nothing from the server's ingest,
works the same for a run adopted after a server restart, and keeps the blocking
uploads off the server's event loop. The trainer never waits for any of this.

The queue is bounded: each run has at most one checkpoint waiting; a newer one
supersedes it (the copy of the newest is what a restore needs). One uploader thread
serves every run. A failing mirror is retried with bounded exponential backoff and
reported once per outage, not once per retry.

What the mirror did goes to `DIR/mirror.jsonl` (a `mirror` record and an `event` per
copy), written only by this uploader thread: `records.jsonl` keeps its single writer.
The server ingests both files. Nothing here imports torch. Pulling back (verified, never
unpickled) is in mirror_restore.py; the backends (local directory, GCS) in
mirror_backends.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from crashdrill.trainer.checkpoint_layout import (
    MANIFEST,
    CheckpointInfo,
    find_latest,
)
from crashdrill.trainer.event_record import event as build_event
from crashdrill.trainer.file_primitives import sha256_of
from crashdrill.trainer.run_files import MIRROR_LOG, read_records
from crashdrill.workers.mirror_backends import Backend, MirrorError, RetryPolicy, open_backend
from crashdrill.workers.mirror_layout import copy_base, delete_copy, mirror_key, mirrored_files
from crashdrill.workers.mirror_restore import Restored, pull_for_restart, restore_latest
from crashdrill.workers.run_dir import RunDir

__all__ = [
    "CheckpointMirror",
    "Restored",
    "newest_local",
    "pull_for_restart",
    "restore_latest",
]

log = logging.getLogger(__name__)

_REMEMBER = 8  # identities of recent copies kept per run (a pulled-back one is not resent)


class LocalGone(Exception):
    """The local checkpoint vanished (pruned by the trainer) or does not match its
    manifest; `corrupt` tells the two apart."""

    def __init__(self, text: str, *, corrupt: bool = False) -> None:
        super().__init__(text)
        self.corrupt = corrupt


# ---------------------------------------------------------------- local checkpoints


def newest_local(run_dir: Path) -> CheckpointInfo | None:
    """The checkpoint to copy now: the newest step directory whose manifest lists its
    files (their hashes are checked while they are copied)."""
    return find_latest(run_dir, check="listed", slot=False)


def _append_log(run_dir: Path, records: list[dict[str, Any]]) -> None:
    now = round(time.time(), 3)
    body = "".join(
        json.dumps({"v": 1, "t": now, **r}, separators=(",", ":")) + "\n" for r in records
    )
    fd = os.open(Path(run_dir) / MIRROR_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, body.encode())
    finally:
        os.close(fd)


def _mirrored_before(run_dir: Path) -> list[tuple[int, float | None]]:
    """Identities of the copies this run's mirror.jsonl reports (after a restart)."""
    try:
        records, _ = read_records(Path(run_dir) / MIRROR_LOG)
    except OSError:
        return []
    out = []
    for rec in records[-4 * _REMEMBER :]:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            if rec.get("kind") == "mirror":
                out.append((int(rec["step"]), rec.get("created")))
    return out[-_REMEMBER:]


def _handled(run: _Run, ckpt: CheckpointInfo) -> None:
    run.done = [*run.done, ckpt.identity][-_REMEMBER:]


def _run_config(run_dir: Path) -> dict[str, Any]:
    """The run's TrainConfig as its trainer wrote it into run.json ({} before that)."""
    config = RunDir(run_dir).run_json().get("config")
    return config if isinstance(config, dict) else {}


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds >= 0.95 else f"{seconds:.2f}s"


# ---------------------------------------------------------------- the uploader


@dataclass
class _Run:
    key: str
    run_dir: Path
    done: list[tuple[int, float | None]] = field(default_factory=list)  # recent, handled
    pending: CheckpointInfo | None = None
    in_flight: CheckpointInfo | None = None
    offered_at: float = 0.0
    superseded: list[int] = field(default_factory=list)
    released: bool = False
    final_scan: bool = False
    warned: bool = False
    failures: int = 0
    not_before: float = 0.0


class CheckpointMirror:
    """Copies each run's newest complete checkpoint to the mirror, in the background."""

    def __init__(
        self,
        url: str,
        *,
        poll_s: float = 0.5,
        keep: int = 2,
        retry: RetryPolicy | None = None,
        backoff_s: tuple[float, float] = (2.0, 60.0),
        backend: Backend | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self._stop = threading.Event()
        self._wake = threading.Event()  # a released run is scanned at once, not next poll
        self._on_event = on_event  # also told each event (a headless run prints them)
        self.backend = backend or open_backend(url, retry=retry, sleep=self._stop.wait)
        self.url = self.backend.url
        self.off_machine = self.url.startswith("gs://")
        self.poll_s = poll_s
        self.keep = max(2, keep)
        self.backoff_s = backoff_s
        self._runs: dict[str, _Run] = {}
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []

    # ---- the owner's side -----------------------------------------------------------

    def start(self) -> None:
        for name, target in (("poll", self._poll_loop), ("upload", self._upload_loop)):
            t = threading.Thread(target=target, name=f"mirror-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop both threads; an upload still in flight is abandoned (its copy has no
        manifest, so it does not count) and done again by the next start."""
        self._stop.set()
        self._wake.set()
        with self._cond:
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout)

    def watch(self, run_dir: Path) -> str:
        """Mirror this run's checkpoints from now on; returns its key in the mirror."""
        run_dir = Path(run_dir)
        key = mirror_key(run_dir)
        with self._cond:
            run = self._runs.get(key)
            if run is None:
                self._runs[key] = _Run(key, run_dir, done=_mirrored_before(run_dir))
            else:
                run.released = run.final_scan = False
        return key

    def release(self, key: str) -> None:
        """The run ended: copy its last checkpoint if it is new, then stop watching."""
        with self._cond:
            run = self._runs.get(key)
            if run is not None:
                run.released = True
        self._wake.set()

    def busy(self, key: str) -> bool:
        """True while the run is watched (its last copy may still be on its way)."""
        with self._cond:
            return key in self._runs

    def settled(self, key: str) -> bool:
        """True once a released run's last checkpoint was copied, found already copied,
        skipped, or tried and failed: what the mirror has to say of the run's end is in
        DIR/mirror.jsonl. (A failed copy is retried in the background; its failure was
        logged, the copy is logged when it lands.) True for a run not watched."""
        with self._cond:
            run = self._runs.get(key)
            if run is None:
                return True
            if not (run.released and run.final_scan) or run.in_flight is not None:
                return False
            return run.pending is None or run.failures > 0

    def pending_count(self) -> int:
        with self._cond:
            return sum(r.pending is not None for r in self._runs.values())

    # ---- finding checkpoints --------------------------------------------------------

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan_once()
            except Exception:
                log.exception("checkpoint mirror: scan failed")
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def scan_once(self) -> None:
        with self._cond:
            runs = list(self._runs.values())
        for run in runs:
            mirrored = _run_config(run.run_dir).get("mirror", "on") != "off"
            newest = newest_local(run.run_dir) if mirrored else None
            with self._cond:
                if newest is not None:
                    self._offer(run, newest)
                if run.released:
                    if run.final_scan and run.pending is None and run.in_flight is None:
                        self._runs.pop(run.key, None)
                    run.final_scan = True

    def offer(self, run_dir: Path, ckpt: CheckpointInfo) -> None:
        """Queue `ckpt` for upload (the poller's call, public for tests)."""
        with self._cond:
            self._offer(self._runs[mirror_key(run_dir)], ckpt)

    def _offer(self, run: _Run, ckpt: CheckpointInfo) -> None:
        for seen in (run.pending, run.in_flight):
            if seen is not None and seen.identity == ckpt.identity:
                return
        if ckpt.identity in run.done:
            return
        if run.pending is not None and run.pending.step < ckpt.step:
            run.superseded.append(run.pending.step)  # a newer one replaces it, unsent
        run.pending = ckpt
        run.offered_at = time.monotonic()
        self._cond.notify_all()

    # ---- copying them ---------------------------------------------------------------

    def _take(self) -> tuple[_Run, CheckpointInfo, list[int]] | None:
        with self._cond:
            now = time.monotonic()
            ready = [
                r
                for r in self._runs.values()
                if r.pending and r.in_flight is None and r.not_before <= now
            ]
            if not ready:
                waits = [r.not_before - now for r in self._runs.values() if r.pending]
                self._cond.wait(max(0.01, min([*waits, 1.0])))
                return None
            run = min(ready, key=lambda r: r.offered_at)
            ckpt, run.pending, run.in_flight = run.pending, None, run.pending
            superseded, run.superseded = run.superseded, []
            assert ckpt is not None
            return run, ckpt, superseded

    def _upload_loop(self) -> None:
        while not self._stop.is_set():
            job = self._take()
            if job is None:
                continue
            run, ckpt, superseded = job
            try:
                self._upload(run, ckpt, superseded)
            except Exception:
                log.exception("checkpoint mirror: upload of %s failed", ckpt.path)
            finally:
                with self._cond:
                    run.in_flight = None
                    self._cond.notify_all()

    def _upload(self, run: _Run, ckpt: CheckpointInfo, superseded: list[int]) -> None:
        base = copy_base(run.key, ckpt.step)
        t0 = time.perf_counter()
        try:
            nbytes = self._copy(base, ckpt)
        except LocalGone as e:
            with self._cond:
                _handled(run, ckpt)
            if e.corrupt:
                self._log(run, "mirror_skipped", ckpt.step, f"Not copied: {e}.")
            return
        except MirrorError as e:
            self._failed(run, ckpt, superseded, e)
            return
        seconds = time.perf_counter() - t0
        again = run.warned
        with self._cond:
            _handled(run, ckpt)
            run.failures, run.warned, run.not_before = 0, False, 0.0
        try:
            self._prune(run)
        except MirrorError as e:
            log.warning("checkpoint mirror: pruning %s failed: %s", run.key, e)
        url = self.backend.url_of(base)
        where = f"off the machine to {url}" if self.off_machine else f"to the mirror {url}"
        text = (
            f"Checkpoint step {ckpt.step} copied {where} in {_fmt_s(seconds)}"
            " (in the background; training didn't wait)."
        )
        if again:
            text = "The mirror is reachable again. " + text
        if superseded:
            steps = ", ".join(str(s) for s in superseded)
            text += f" Skipped step {steps}: superseded by a newer checkpoint before its upload."
        segment = RunDir(run.run_dir).last_seen()[0]
        mirror = {"kind": "mirror", "segment": segment, "step": ckpt.step}
        mirror.update(seconds=round(seconds, 4), bytes=nbytes, url=url, created=ckpt.created)
        mirror.update(files=len(ckpt.files) + 1, superseded=superseded)
        event = build_event(
            "mirror",
            text,
            segment=segment,
            step=ckpt.step,
            seconds=round(seconds, 4),
            bytes=nbytes,
            superseded=superseded,
        )
        self._append(run, [mirror, event])

    def _copy(self, base: str, ckpt: CheckpointInfo) -> int:
        """Upload the files, then the manifest; returns the bytes sent."""
        opened: dict[str, IO[bytes]] = {}
        try:
            for name, entry in ckpt.files.items():
                try:
                    f = opened[name] = open(ckpt.path / name, "rb")  # noqa: SIM115
                except FileNotFoundError:
                    raise LocalGone(f"step {ckpt.step} was pruned before its upload") from None
                # The open file outlives a prune of the directory: these bytes are the ones
                # that were hashed and will be sent.
                if (
                    os.fstat(f.fileno()).st_size != entry["bytes"]
                    or sha256_of(f) != entry["sha256"]
                ):
                    raise LocalGone(
                        f"checkpoint step {ckpt.step} on this machine fails its sha256 check"
                        f" ({name})",
                        corrupt=True,
                    )
            self.backend.delete(f"{base}/{MANIFEST}")  # an older copy of the step stops counting
            for name, src in opened.items():
                self.backend.put(f"{base}/{name}", src, ckpt.files[name]["bytes"])
            manifest = io.BytesIO(ckpt.manifest_bytes)
            self.backend.put(f"{base}/{MANIFEST}", manifest, len(ckpt.manifest_bytes))
        finally:
            for src in opened.values():
                src.close()
        return sum(int(e["bytes"]) for e in ckpt.files.values()) + len(ckpt.manifest_bytes)

    def _failed(
        self, run: _Run, ckpt: CheckpointInfo, superseded: list[int], err: MirrorError
    ) -> None:
        with self._cond:
            run.failures += 1
            lo, hi = self.backoff_s
            run.not_before = time.monotonic() + min(hi, lo * 2 ** (run.failures - 1))
            if run.pending is None:  # try this one again unless a newer one is waiting
                run.pending = ckpt
                run.superseded = superseded + run.superseded
            else:
                run.superseded = [*superseded, ckpt.step, *run.superseded]
            first = not run.warned
            run.warned = True
        log.log(logging.WARNING if first else logging.DEBUG, "checkpoint mirror: %s", err)
        if first:
            text = (
                f"Could not copy checkpoint step {ckpt.step} to the mirror {self.url}: {err}."
                " Training continues on the checkpoints on this machine; the copy is retried"
                " in the background."
            )
            self._log(run, "mirror_failed", ckpt.step, text)

    def _log(self, run: _Run, code: str, step: int, text: str) -> None:
        segment = RunDir(run.run_dir).last_seen()[0]
        self._append(run, [build_event(code, text, segment=segment, step=step)])

    def _append(self, run: _Run, records: list[dict[str, Any]]) -> None:
        _append_log(run.run_dir, records)
        if self._on_event is not None:
            for rec in records:
                if rec.get("kind") == "event":
                    self._on_event(rec)

    def _prune(self, run: _Run) -> None:
        """Keep the newest `keep` complete copies of the run; delete the rest, each
        manifest first (so a half-deleted copy never counts)."""
        keep = _run_config(run.run_dir).get("keep", 0)
        keep = max(self.keep, keep if isinstance(keep, int) else 0)
        by_step = mirrored_files(self.backend, run.key)
        complete = sorted((s for s, names in by_step.items() if MANIFEST in names), reverse=True)
        if not complete:
            return
        for step, names in by_step.items():
            if step in complete[:keep] or step > complete[0]:
                continue
            delete_copy(self.backend, run.key, step, names)
