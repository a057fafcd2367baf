"""`crashdrill doctor gcs gs://BUCKET[/PREFIX]`: can this machine use that bucket as the
checkpoint mirror?

    crashdrill doctor gcs gs://my-bucket/crashdrill
    STORAGE_EMULATOR_HOST=http://127.0.0.1:9023 crashdrill doctor gcs gs://test/x   # emulator

Each step prints its time: the library, the credentials, writing a test object (crc32c
checked by the client on the way up), reading it back (crc32c checked on the way down,
then its sha256 compared with what was written), listing the prefix (a restore lists
it), deleting the object. A failed step says what is wrong and what to do.
Exit 0: the bucket works; 1: a step failed; 2: bad usage (not a gs:// URL, library
missing).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from crashdrill.trainer.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from crashdrill.workers.mirror_backends import (
    CREDENTIALS_HELP,
    GcsBackend,
    MirrorError,
    MirrorURLError,
    RetryPolicy,
    parse_mirror_url,
)

T = TypeVar("T")
TEST_BYTES = 256 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the mirror to check, gs://BUCKET[/PREFIX]")
    parser.description = (
        "Write a test object to the bucket, read it back, compare checksums, list, delete;"
        " print each step with its time and, when one fails, why."
    )


class _Failed(Exception):
    pass


class _Steps:
    def __init__(self, out: Any) -> None:
        self.out = out

    def run(self, name: str, fn: Callable[[], tuple[T, str]]) -> T:
        t0 = time.perf_counter()
        try:
            value, detail = fn()
        except Exception as e:
            seconds = time.perf_counter() - t0
            text = str(e) if isinstance(e, MirrorError) else f"{type(e).__name__}: {e}"
            print(f"  FAIL  {name:<12} {seconds:6.2f}s  {text}", file=self.out, flush=True)
            raise _Failed(text) from e
        seconds = time.perf_counter() - t0
        print(f"  ok    {name:<12} {seconds:6.2f}s  {detail}", file=self.out, flush=True)
        return value


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    url = str(args.url)
    if not url.startswith("gs://"):
        print(f"crashdrill doctor gcs: {url!r} is not a gs://BUCKET[/PREFIX] URL", file=sys.stderr)
        return EXIT_USAGE
    try:
        parsed = parse_mirror_url(url)
        backend = GcsBackend(parsed, RetryPolicy(attempts=2, base_s=0.5), time.sleep)
    except (MirrorURLError, MirrorError) as e:
        print(f"crashdrill doctor gcs: {e}", file=sys.stderr)
        return EXIT_USAGE
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    print(f"crashdrill doctor gcs: checking {parsed} via {backend.endpoint}", file=out)
    steps = _Steps(out)
    name = f".crashdrill-doctor/{secrets.token_hex(6)}"
    data = secrets.token_bytes(TEST_BYTES)
    sha = hashlib.sha256(data).hexdigest()
    wrote = False
    try:
        steps.run("library", _library)
        steps.run("credentials", lambda: (None, _credentials(emulator, parsed.bucket)))
        steps.run("write", lambda: _write(backend, name, data))
        wrote = True
        steps.run("read back", lambda: _read_back(backend, name, sha))
        steps.run("list", lambda: _list(backend, name))
        steps.run("delete", lambda: _delete(backend, name))
        wrote = False
    except _Failed as e:
        if wrote:
            try:
                backend.delete(name)
            except MirrorError:
                print(f"  note: could not delete the test object {backend.url_of(name)}", file=out)
        print(f"\nDiagnosis: {e}", file=out)
        return EXIT_FAILED
    print(
        f"\nThe bucket works as a checkpoint mirror. Use it with:\n"
        f"  CRASHDRILL_MIRROR={parsed} crashdrill serve",
        file=out,
    )
    return EXIT_OK


def _library() -> tuple[None, str]:
    from importlib.metadata import version

    return None, f"google-cloud-storage {version('google-cloud-storage')}"


def _credentials(emulator: str | None, bucket: str) -> str:
    if emulator:
        return f"anonymous, against the emulator at {emulator} (STORAGE_EMULATOR_HOST)"
    import google.auth
    from google.auth import exceptions as aexc

    try:
        creds, project = google.auth.default(
            scopes=["https://www.googleapis.com/auth/devstorage.read_write"]
        )
    except aexc.DefaultCredentialsError:
        raise MirrorError(f"no Google credentials found: {CREDENTIALS_HELP}") from None
    who = getattr(creds, "service_account_email", None)
    if who:
        kind = f"service account {who}"
    elif os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        kind = f"from GOOGLE_APPLICATION_CREDENTIALS ({type(creds).__name__})"
    else:
        kind = f"Application Default Credentials ({type(creds).__name__})"
    return kind + (f", project {project}" if project else "")


def _write(backend: GcsBackend, name: str, data: bytes) -> tuple[None, str]:
    backend.put(name, io.BytesIO(data), len(data))
    return None, f"{backend.url_of(name)} ({len(data) // 1024} KiB, crc32c checked on upload)"


def _read_back(backend: GcsBackend, name: str, sha: str) -> tuple[None, str]:
    got = backend.read(name)
    if hashlib.sha256(got).hexdigest() != sha:
        raise MirrorError(
            f"the object read back differs from what was written ({len(got)} bytes,"
            " sha256 mismatch): something between here and the bucket changes data"
        )
    return None, "crc32c checked on download; sha256 matches what was written"


def _list(backend: GcsBackend, name: str) -> tuple[None, str]:
    folder = name.rsplit("/", 1)[0] + "/"
    names = backend.list(folder)
    if name not in names:
        raise MirrorError(
            f"listing {backend.url_of(folder)} does not show the test object: a restore"
            " could not find the checkpoints (is the account allowed storage.objects.list?)"
        )
    return None, f"the test object is listed under {backend.url_of(folder)}"


def _delete(backend: GcsBackend, name: str) -> tuple[None, str]:
    backend.delete(name)
    return None, "the test object is gone"
