"""The checkpoint mirror: uploads (local directory and the GCS emulator), manifest last,
checksums, a bounded queue where newer supersedes older, keep-k, an unreachable mirror,
and pulling the newest verified copy back."""

from __future__ import annotations

import base64
import contextlib
import io
import itertools
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from crashdrill.workers.mirror import CheckpointMirror, newest_local, restore_latest
from crashdrill.workers.mirror_backends import (
    LocalBackend,
    MirrorURLError,
    RetryPolicy,
    open_backend,
    parse_mirror_url,
)
from tests.support.extras import require_extra
from tests.support.gcs_emulator import (
    BUCKET,
    free_port,
    gcs_emulator,
    write_checkpoint,
    write_run_json,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

FAST = RetryPolicy(attempts=2, base_s=0.01, cap_s=0.02)


def mirror_log(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "mirror.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def uploaded_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in mirror_log(run_dir) if r["kind"] == "mirror"]


def step_uploaded(run_dir: Path, step: int) -> Callable[[], bool]:
    """wait_until's condition, bound to this step (not to the loop's variable)."""
    return lambda: step in uploaded_steps(run_dir)


class Recording:
    """A backend wrapper that records each put and can hold the first one open."""

    def __init__(self, inner: Any, hold_first: bool = False) -> None:
        self.inner = inner
        self.url = inner.url
        self.puts: list[str] = []
        self.gate = threading.Event()
        self.holding = threading.Event()
        if not hold_first:
            self.gate.set()

    def put(self, name: str, src: IO[bytes], size: int) -> None:
        if not self.gate.is_set():
            self.holding.set()
            self.gate.wait(10)
        self.puts.append(name)
        self.inner.put(name, src, size)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "runs" / "run1"
    write_run_json(d, keep=2, mirror="on")
    return d


@pytest.fixture
def emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with gcs_emulator() as host:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
        yield host


def started(mirror: CheckpointMirror, run_dir: Path) -> CheckpointMirror:
    mirror.start()
    mirror.watch(run_dir)
    return mirror


def test_a_complete_checkpoint_is_copied_with_its_manifest_last(
    run_dir: Path, tmp_path: Path
) -> None:
    backend = Recording(LocalBackend(tmp_path / "mirror", FAST, time.sleep))
    mirror = started(CheckpointMirror("unused", backend=backend, poll_s=0.02), run_dir)
    try:
        (run_dir / "ckpt" / "step-00000200.tmp").mkdir(parents=True)  # a write in progress
        src = write_checkpoint(run_dir, 100)
        wait_until(lambda: uploaded_steps(run_dir) == [100], "the upload")
    finally:
        mirror.stop()
    copy = tmp_path / "mirror" / "run1" / "step-00000100"
    assert backend.puts[-1] == "run1/step-00000100/MANIFEST.json"
    assert len(backend.puts) == 4
    for f in src.iterdir():
        assert (copy / f.name).read_bytes() == f.read_bytes()
    assert not (tmp_path / "mirror" / "run1" / "step-00000200.tmp").exists()
    record, event = mirror_log(run_dir)
    assert record["kind"] == "mirror" and record["bytes"] > 3 * 4096 and record["seconds"] >= 0
    assert event["kind"] == "event" and event["level"] == "info"
    assert event["text"].startswith(f"Checkpoint step 100 copied to the mirror {copy} in ")
    assert event["text"].endswith("(in the background; training didn't wait).")


def test_gcs_uploads_are_checksummed_and_the_event_says_off_the_machine(
    run_dir: Path, emulator: str
) -> None:
    import google_crc32c
    from google.cloud import storage

    mirror = started(CheckpointMirror(f"gs://{BUCKET}/lab", poll_s=0.02, retry=FAST), run_dir)
    try:
        src = write_checkpoint(run_dir, 300, size=300_000)
        wait_until(lambda: uploaded_steps(run_dir) == [300], "the upload")
    finally:
        mirror.stop()
    bucket = storage.Client().bucket(BUCKET)
    for f in src.iterdir():
        blob = bucket.get_blob(f"lab/run1/step-00000300/{f.name}")
        assert blob is not None
        crc = google_crc32c.Checksum(f.read_bytes()).digest()
        assert blob.crc32c == base64.b64encode(crc).decode()
        assert blob.download_as_bytes() == f.read_bytes()
    text = mirror_log(run_dir)[-1]["text"]
    assert text.startswith(
        f"Checkpoint step 300 copied off the machine to gs://{BUCKET}/lab/run1/step-00000300 in "
    )


def test_a_newer_checkpoint_supersedes_one_not_yet_uploaded(run_dir: Path, tmp_path: Path) -> None:
    backend = Recording(LocalBackend(tmp_path / "mirror", FAST, time.sleep), hold_first=True)
    mirror = started(CheckpointMirror("unused", backend=backend, poll_s=3600), run_dir)
    try:
        mirror.offer(run_dir, _local(write_checkpoint(run_dir, 100)))
        assert backend.holding.wait(10), "the first upload never began"
        for step in (150, 200, 250):
            t0 = time.monotonic()
            mirror.offer(run_dir, _local(write_checkpoint(run_dir, step)))
            assert time.monotonic() - t0 < 0.5  # offering never waits for an upload
            assert mirror.pending_count() == 1  # bounded: one waiting per run
        backend.gate.set()
        wait_until(lambda: uploaded_steps(run_dir) == [100, 250], "both uploads")
    finally:
        mirror.stop()
    assert not any("step-00000150" in p or "step-00000200" in p for p in backend.puts)
    last = mirror_log(run_dir)[-1]
    assert "Skipped step 150, 200: superseded by a newer checkpoint" in last["text"]


def _local(path: Path) -> Any:
    ckpt = newest_local(path.parent.parent)
    assert ckpt is not None and ckpt.path == path
    return ckpt


@pytest.mark.parametrize("keep", [2, 3])
def test_the_mirror_keeps_the_last_k_copies(run_dir: Path, tmp_path: Path, keep: int) -> None:
    write_run_json(run_dir, keep=keep)
    mirror = started(CheckpointMirror(str(tmp_path / "mirror"), poll_s=0.02), run_dir)
    try:
        for step in (50, 100, 150, 200, 250):
            write_checkpoint(run_dir, step)
            wait_until(step_uploaded(run_dir, step), f"step {step}")
    finally:
        mirror.stop()
    left = sorted(p.name for p in (tmp_path / "mirror" / "run1").iterdir())
    assert left == [f"step-{s:08d}" for s in (50, 100, 150, 200, 250)[-keep:]]


def test_a_checkpoint_that_fails_its_sha256_is_not_copied(run_dir: Path, tmp_path: Path) -> None:
    path = write_checkpoint(run_dir, 100)
    (path / "model.pt").write_bytes(b"x" * 4096)  # same size, other bytes
    mirror = started(CheckpointMirror(str(tmp_path / "mirror"), poll_s=0.02), run_dir)
    try:
        wait_until(lambda: mirror_log(run_dir), "the warning")
    finally:
        mirror.stop()
    (event,) = mirror_log(run_dir)
    assert event["level"] == "warn"
    assert "step 100 on this machine fails its sha256 check (model.pt)" in event["text"]
    assert not (tmp_path / "mirror" / "run1" / "step-00000100" / "MANIFEST.json").exists()


def test_a_run_with_mirror_off_is_not_copied(run_dir: Path, tmp_path: Path) -> None:
    write_run_json(run_dir, mirror="off")
    write_checkpoint(run_dir, 100)
    mirror = started(CheckpointMirror(str(tmp_path / "mirror"), poll_s=0.02), run_dir)
    try:
        mirror.release("run1")
        wait_until(lambda: not mirror.busy("run1"), "the release")
    finally:
        mirror.stop()
    assert not (tmp_path / "mirror").exists() and not mirror_log(run_dir)


def test_a_released_run_gets_its_last_checkpoint_copied_then_is_dropped(
    run_dir: Path, tmp_path: Path
) -> None:
    mirror = CheckpointMirror(str(tmp_path / "mirror"), poll_s=0.02)
    mirror.watch(run_dir)
    write_checkpoint(run_dir, 300)
    mirror.release("run1")
    assert mirror.busy("run1")
    mirror.start()
    try:
        wait_until(lambda: not mirror.busy("run1"), "the release")
    finally:
        mirror.stop()
    assert uploaded_steps(run_dir) == [300]


def released(mirror: CheckpointMirror) -> Callable[[], bool]:
    """wait_until's condition: this mirror has nothing of run1 left to copy."""
    return lambda: not mirror.busy("run1")


def test_a_restarted_mirror_does_not_copy_the_same_checkpoint_again(
    run_dir: Path, tmp_path: Path
) -> None:
    write_checkpoint(run_dir, 100)
    for _ in range(2):
        mirror = CheckpointMirror(str(tmp_path / "mirror"), poll_s=0.02)
        mirror.watch(run_dir)
        mirror.release("run1")
        mirror.start()
        try:
            wait_until(released(mirror), "the release")
        finally:
            mirror.stop()
    assert uploaded_steps(run_dir) == [100]


def grown_by(items: list[float], more: int) -> Callable[[], bool]:
    """wait_until's condition: `items` has `more` entries beyond the ones it has now."""
    target = len(items) + more
    return lambda: len(items) >= target


def test_an_unreachable_mirror_warns_once_retries_with_backoff_and_recovers(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_extra("gcs")
    port = free_port()  # nothing listens here yet
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    mirror = CheckpointMirror(f"gs://{BUCKET}/lab", poll_s=0.02, retry=FAST, backoff_s=(0.05, 0.2))
    attempts: list[float] = []  # each backend call: the first of each round deletes
    delete = mirror.backend.delete

    def counting_delete(name: str) -> None:
        attempts.append(time.monotonic())
        delete(name)

    monkeypatch.setattr(mirror.backend, "delete", counting_delete)
    started(mirror, run_dir)
    try:
        for step in (100, 150, 200):
            retried = grown_by(attempts, 2)  # two more than before this checkpoint
            write_checkpoint(run_dir, step)
            wait_until(retried, "retries")
            assert mirror.pending_count() <= 1
        warnings = [r for r in mirror_log(run_dir) if r["level"] == "warn"]
        assert len(warnings) == 1, warnings  # once, not one per retry
        assert warnings[0]["code"] == "mirror_failed"
        assert f"network: cannot reach http://127.0.0.1:{port}" in warnings[0]["text"]
        assert "Training continues on the checkpoints on this machine" in warnings[0]["text"]
        gaps = [b - a for a, b in itertools.pairwise(attempts)]
        assert max(gaps) < 2.0  # bounded backoff (cap 0.2 s here)
        with gcs_emulator(port):
            wait_until(lambda: uploaded_steps(run_dir) == [200], "the upload after recovery")
    finally:
        mirror.stop()
    last = mirror_log(run_dir)[-1]
    assert last["text"].startswith("The mirror is reachable again. Checkpoint step 200 copied")


# ---------------------------------------------------------------- pulling back


def _fill_mirror(url: str, run_dir: Path, steps: tuple[int, ...]) -> dict[int, dict[str, bytes]]:
    """Checkpoints written and copied to the mirror; then the local ones wiped (returned
    as {step: {file: bytes}})."""
    mirror = started(CheckpointMirror(url, poll_s=0.02, retry=FAST), run_dir)
    written = {}
    try:
        for step in steps:
            path = write_checkpoint(run_dir, step)
            written[step] = {f.name: f.read_bytes() for f in path.iterdir()}
            wait_until(step_uploaded(run_dir, step), f"step {step}")
    finally:
        mirror.stop()
    shutil.rmtree(run_dir / "ckpt")
    return written


@pytest.mark.parametrize("kind", ["local", "gcs"])
def test_restore_pulls_the_newest_copy_that_verifies(
    run_dir: Path, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with gcs_emulator() if kind == "gcs" else contextlib.nullcontext("") as host:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
        url = str(tmp_path / "mirror") if kind == "local" else f"gs://{BUCKET}/lab"
        written = _fill_mirror(url, run_dir, (100, 150))
        backend = open_backend(url)
        backend.put("run1/step-00000150/model.pt", _bytes(b"y" * 4096), 4096)  # bit rot
        rejected: list[str] = []
        restored = restore_latest(url, run_dir, on_rejected=rejected.append)
    assert restored is not None and restored.step == 100
    assert restored.url == backend.url_of("run1/step-00000100")
    assert len(rejected) == 1 and "step 150" in rejected[0] and "model.pt" in rejected[0]
    local = run_dir / "ckpt" / "step-00000100"
    assert restored.path == local
    for name, data in written[100].items():
        assert (local / name).read_bytes() == data
    assert sorted(p.name for p in (run_dir / "ckpt").iterdir()) == ["step-00000100"]
    # The mirror, watching again, does not send the pulled copy back up.
    before = mirror_log(run_dir)
    mirror = CheckpointMirror(str(tmp_path / "mirror"), poll_s=0.02)
    mirror.watch(run_dir)
    mirror.release("run1")
    mirror.start()
    try:
        wait_until(lambda: not mirror.busy("run1"), "the release")
    finally:
        mirror.stop()
    assert mirror_log(run_dir) == before


def _bytes(data: bytes) -> IO[bytes]:
    return io.BytesIO(data)


def test_restore_returns_none_when_the_mirror_has_nothing(run_dir: Path, tmp_path: Path) -> None:
    assert restore_latest(str(tmp_path / "mirror"), run_dir) is None
    assert not (run_dir / "ckpt").exists() or not any((run_dir / "ckpt").iterdir())


def test_restore_refuses_a_manifest_that_names_a_path_outside_the_checkpoint(
    run_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "mirror"
    copy = root / "run1" / "step-00000100"
    copy.mkdir(parents=True)
    (copy / "x").write_bytes(b"evil")
    entry = {"sha256": "0" * 64, "bytes": 4}
    manifest = {"format": 1, "step": 100, "files": {"../../../escaped": entry}}
    (copy / "MANIFEST.json").write_text(json.dumps(manifest))
    rejected: list[str] = []
    assert restore_latest(str(root), run_dir, on_rejected=rejected.append) is None
    assert "not a plain name" in rejected[0]
    assert not list(tmp_path.rglob("escaped"))


def test_mirror_urls_are_parsed_and_bad_ones_named() -> None:
    assert str(parse_mirror_url("gs://my-bucket/a/b/")) == "gs://my-bucket/a/b"
    assert str(parse_mirror_url("gs://my-bucket")) == "gs://my-bucket"
    assert parse_mirror_url("file:///srv/m").path == Path("/srv/m")
    assert parse_mirror_url("/srv/m").scheme == "file"
    for bad in ("s3://bucket/x", "gs://", "gs://UPPER/x", ""):
        with pytest.raises(MirrorURLError, match="mirror = "):
            parse_mirror_url(bad)
