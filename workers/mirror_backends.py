"""Where checkpoint copies go: a local directory, or a Google Cloud Storage bucket.

    backend = open_backend("gs://my-bucket/crashdrill")    # or "/mnt/shared/mirror"
    backend.put("RUN/step-00000100/model.pt", f, size)     # f: an open binary file
    backend.get("RUN/step-00000100/model.pt", out)
    backend.list("RUN/")  ->  ["RUN/step-00000100/model.pt", ...]

Names are relative to the mirror's root and always use "/". Every backend call is retried
with bounded exponential backoff (`RetryPolicy`) when the failure may pass (network,
timeouts, 429, 5xx, a checksum mismatch in transit); one that will not pass (no
credentials, no bucket, permission denied) fails at once. Either way the caller gets a
`MirrorError` whose text is a diagnosis a person can act on.

google-cloud-storage is imported only when a gs:// mirror is opened (`pip install
'crashdrill[gcs]'`). With STORAGE_EMULATOR_HOST set, the client talks to that emulator
with anonymous credentials.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from crashdrill.trainer.file_primitives import fsync_dir

T = TypeVar("T")

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
MIRROR_URL_HELP = "a local directory (/path or file:///path) or gs://BUCKET[/PREFIX]"
CREDENTIALS_HELP = (
    "set GOOGLE_APPLICATION_CREDENTIALS=/path/to/service-account-key.json, or run"
    " `gcloud auth application-default login` on this machine"
)


class MirrorError(Exception):
    """The mirror failed (after retries where retrying could help); the text says why."""

    def __init__(self, text: str, *, transient: bool = True) -> None:
        super().__init__(text)
        self.transient = transient


class MirrorURLError(ValueError):
    """A mirror setting that is neither a local directory nor a gs:// URL."""


@dataclass(frozen=True)
class MirrorURL:
    scheme: str  # "file" or "gs"
    bucket: str = ""  # gs only
    prefix: str = ""  # gs only: "" or "a/b" (no slashes at the ends)
    path: Path | None = None  # file only: absolute

    def __str__(self) -> str:
        if self.scheme == "gs":
            return f"gs://{self.bucket}/{self.prefix}".rstrip("/")
        return str(self.path)


def parse_mirror_url(text: str) -> MirrorURL:
    """`gs://bucket/prefix`, `file:///abs/path` or a path (made absolute)."""
    if not isinstance(text, str) or not text.strip():
        raise MirrorURLError(f"mirror = {text!r} is not allowed: {MIRROR_URL_HELP}")
    text = text.strip()
    if text.startswith("gs://"):
        bucket, _, prefix = text[5:].partition("/")
        if not _BUCKET.match(bucket):
            raise MirrorURLError(
                f"mirror = {text!r}: {bucket!r} is not a bucket name (3-222 characters of"
                " a-z, 0-9, '.', '_', '-'); give gs://BUCKET[/PREFIX]"
            )
        return MirrorURL("gs", bucket=bucket, prefix=prefix.strip("/"))
    if text.startswith("file://"):
        text = text[7:]
    elif "://" in text:
        raise MirrorURLError(f"mirror = {text!r} is not allowed: {MIRROR_URL_HELP}")
    return MirrorURL("file", path=Path(text).expanduser().absolute())


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff: `attempts` tries, waits base, 2·base, … ≤ cap."""

    attempts: int = 4
    base_s: float = 0.5
    cap_s: float = 8.0

    def delay(self, attempt: int) -> float:
        return float(min(self.cap_s, self.base_s * 2**attempt))

    def call(
        self,
        fn: Callable[[], T],
        what: str,
        diagnose: Callable[[BaseException], MirrorError],
        sleep: Callable[[float], object] = time.sleep,
    ) -> T:
        for attempt in range(self.attempts):
            try:
                return fn()
            except Exception as e:
                err = diagnose(e)
                if not err.transient or attempt == self.attempts - 1:
                    raise MirrorError(f"{what}: {err}", transient=err.transient) from e
                sleep(self.delay(attempt))
        raise AssertionError("unreachable")


class Backend(Protocol):
    url: str

    def url_of(self, name: str) -> str: ...
    def put(self, name: str, src: IO[bytes], size: int) -> None: ...
    def get(self, name: str, dst: IO[bytes]) -> None: ...
    def read(self, name: str) -> bytes: ...
    def list(self, prefix: str) -> list[str]: ...
    def delete(self, name: str) -> None: ...


def open_backend(
    url: str | MirrorURL,
    *,
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], object] = time.sleep,
) -> Backend:
    """The backend for a mirror URL; google-cloud-storage is imported only for gs://."""
    parsed = url if isinstance(url, MirrorURL) else parse_mirror_url(url)
    policy = retry or RetryPolicy()
    if parsed.scheme == "gs":
        return GcsBackend(parsed, policy, sleep)
    assert parsed.path is not None
    return LocalBackend(parsed.path, policy, sleep)


# ---------------------------------------------------------------- a local directory


class LocalBackend:
    """A directory (a mounted disk that outlives the machine, or, by default, one beside
    the lab's data dir). Each file: temp name → fsync → os.replace → fsync the directory."""

    def __init__(self, root: Path, retry: RetryPolicy, sleep: Callable[[float], object]) -> None:
        self.root = root
        self.url = str(root)
        self._retry = retry
        self._sleep = sleep

    def url_of(self, name: str) -> str:
        return str(self.root / name)

    def _call(self, fn: Callable[[], T], what: str) -> T:
        return self._retry.call(fn, what, _diagnose_local, self._sleep)

    def put(self, name: str, src: IO[bytes], size: int) -> None:
        dest = self.root / name

        def write() -> None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp")
            try:
                src.seek(0)
                with open(tmp, "wb") as f:
                    shutil.copyfileobj(src, f, 1 << 20)
                    f.flush()
                    os.fsync(f.fileno())
                if tmp.stat().st_size != size:
                    raise OSError(f"wrote {tmp.stat().st_size} bytes of {size}")
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
            fsync_dir(dest.parent)

        self._call(write, f"writing {dest}")

    def get(self, name: str, dst: IO[bytes]) -> None:
        def copy() -> None:
            dst.seek(0)
            dst.truncate()
            with open(self.root / name, "rb") as f:
                shutil.copyfileobj(f, dst, 1 << 20)

        self._call(copy, f"reading {self.root / name}")

    def read(self, name: str) -> bytes:
        return self._call((self.root / name).read_bytes, f"reading {self.root / name}")

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix

        def walk() -> list[str]:
            if not base.is_dir():
                return []
            return sorted(
                p.relative_to(self.root).as_posix()
                for p in base.rglob("*")
                if p.is_file() and not p.name.startswith(".")
            )

        return self._call(walk, f"listing {base}")

    def delete(self, name: str) -> None:
        path = self.root / name

        def remove() -> None:
            path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                path.parent.rmdir()  # only once it is empty

        self._call(remove, f"deleting {path}")


def _diagnose_local(e: BaseException) -> MirrorError:
    if isinstance(e, FileNotFoundError):
        return MirrorError(f"not found ({e})", transient=False)
    if isinstance(e, PermissionError):
        return MirrorError(f"permission denied ({e})", transient=False)
    return MirrorError(f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------- Google Cloud Storage

# (connect, read) seconds per request: an unreachable endpoint fails fast, and the retry
# policy (not the library's two-minute default) decides how long to keep trying.
GCS_TIMEOUT = (5.0, 120.0)


class GcsBackend:
    """A bucket through google-cloud-storage: uploads and downloads with crc32c checked
    end to end by the client, our own bounded retries (the library's are off)."""

    def __init__(
        self, url: MirrorURL, retry: RetryPolicy, sleep: Callable[[float], object]
    ) -> None:
        try:
            from google.cloud import storage
        except ImportError:
            raise MirrorError(
                "a gs:// mirror needs google-cloud-storage: pip install 'crashdrill[gcs]'",
                transient=False,
            ) from None
        self._storage = storage
        self.bucket_name = url.bucket
        self.prefix = url.prefix
        self.url = str(url)
        self._retry = retry
        self._sleep = sleep
        self._client: Any = None

    @property
    def endpoint(self) -> str:
        return os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"

    def _bucket(self) -> Any:
        if self._client is None:
            # Finds Application Default Credentials; with STORAGE_EMULATOR_HOST set it
            # uses anonymous credentials against the emulator.
            self._client = self._storage.Client()
        return self._client.bucket(self.bucket_name)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def url_of(self, name: str) -> str:
        return f"gs://{self.bucket_name}/{self._key(name)}"

    def _call(self, fn: Callable[[], T], what: str) -> T:
        return self._retry.call(fn, what, self.diagnose, self._sleep)

    def put(self, name: str, src: IO[bytes], size: int) -> None:
        def upload() -> None:
            src.seek(0)
            blob = self._bucket().blob(self._key(name))
            blob.upload_from_file(
                src, size=size, checksum="crc32c", retry=None, timeout=GCS_TIMEOUT
            )

        self._call(upload, f"uploading {self.url_of(name)}")

    def get(self, name: str, dst: IO[bytes]) -> None:
        def download() -> None:
            dst.seek(0)
            dst.truncate()
            blob = self._bucket().blob(self._key(name))
            blob.download_to_file(dst, checksum="crc32c", retry=None, timeout=GCS_TIMEOUT)

        self._call(download, f"downloading {self.url_of(name)}")

    def read(self, name: str) -> bytes:
        def download() -> bytes:
            blob = self._bucket().blob(self._key(name))
            return bytes(blob.download_as_bytes(checksum="crc32c", retry=None, timeout=GCS_TIMEOUT))

        return self._call(download, f"downloading {self.url_of(name)}")

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix)
        cut = len(self.prefix) + 1 if self.prefix else 0

        def names() -> list[str]:
            self._bucket()  # creates the client
            blobs = self._client.list_blobs(
                self.bucket_name, prefix=full, retry=None, timeout=GCS_TIMEOUT
            )
            return sorted(b.name[cut:] for b in blobs)

        return self._call(names, f"listing gs://{self.bucket_name}/{full}")

    def delete(self, name: str) -> None:
        from google.api_core import exceptions as gexc

        def remove() -> None:
            with contextlib.suppress(gexc.NotFound):
                self._bucket().blob(self._key(name)).delete(retry=None, timeout=GCS_TIMEOUT)

        self._call(remove, f"deleting {self.url_of(name)}")

    def diagnose(self, e: BaseException) -> MirrorError:
        """What went wrong, in words, and whether trying again may help."""
        return diagnose_gcs(e, self.bucket_name, self.endpoint)


def diagnose_gcs(e: BaseException, bucket: str, endpoint: str) -> MirrorError:
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc

    try:
        from google.resumable_media.common import DataCorruption, InvalidResponse
    except ImportError:  # pragma: no cover - bundled with google-cloud-storage
        DataCorruption = InvalidResponse = ()  # type: ignore[assignment,misc]
    import requests

    status = getattr(e, "code", None)
    if isinstance(e, InvalidResponse) and e.response is not None:
        status = getattr(e.response, "status_code", None)
    if isinstance(e, aexc.DefaultCredentialsError):
        return MirrorError(f"no Google credentials found: {CREDENTIALS_HELP}", transient=False)
    if isinstance(e, aexc.RefreshError):
        return MirrorError(
            f"the Google credentials were refused ({e}); they may have expired: {CREDENTIALS_HELP}",
            transient=False,
        )
    if isinstance(e, gexc.Unauthorized) or status == 401:
        return MirrorError(f"not authenticated (401): {CREDENTIALS_HELP}", transient=False)
    if isinstance(e, gexc.Forbidden) or status == 403:
        return MirrorError(
            f"permission denied (403) on bucket {bucket!r}: the account needs"
            " roles/storage.objectAdmin (create, read, delete objects) on it",
            transient=False,
        )
    if isinstance(e, gexc.NotFound) or status == 404:
        return MirrorError(
            f"not found (404): bucket {bucket!r} does not exist, or the object is gone"
            f" (create the bucket: gcloud storage buckets create gs://{bucket})",
            transient=False,
        )
    if isinstance(e, DataCorruption):
        return MirrorError(f"checksum mismatch in transit ({e})")
    if isinstance(e, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return MirrorError(f"network: cannot reach {endpoint} ({type(e).__name__})")
    if isinstance(e, gexc.TooManyRequests | gexc.ServerError) or (
        isinstance(status, int) and (status == 429 or status >= 500)
    ):
        return MirrorError(f"the storage service answered {status or type(e).__name__}; busy")
    if isinstance(e, TimeoutError | ConnectionError):
        return MirrorError(f"network: {type(e).__name__} talking to {endpoint}")
    return MirrorError(f"{type(e).__name__}: {e}", transient=False)
