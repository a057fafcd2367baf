"""`crashdrill doctor gcs` against the Cloud Storage emulator, and its diagnoses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.support.extras import require_extra
from tests.support.gcs_emulator import BUCKET, free_port, gcs_emulator

pytestmark = pytest.mark.timeout(90)


def test_doctor_passes_against_a_working_bucket() -> None:
    with gcs_emulator() as host:
        proc = run_cli("doctor", "gcs", f"gs://{BUCKET}/lab", env={"STORAGE_EMULATOR_HOST": host})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for step in ("library", "credentials", "write", "read back", "list", "delete"):
        assert f"  ok    {step}" in proc.stdout
    assert "sha256 matches what was written" in proc.stdout
    assert f"CRASHDRILL_MIRROR=gs://{BUCKET}/lab crashdrill serve" in proc.stdout


def test_doctor_says_when_the_bucket_does_not_exist() -> None:
    with gcs_emulator() as host:
        env = {"STORAGE_EMULATOR_HOST": host}
        proc = run_cli("doctor", "gcs", "gs://no-such-bucket/x", env=env)
    assert proc.returncode == 1
    assert "  FAIL  write" in proc.stdout
    assert "Diagnosis:" in proc.stdout and "bucket 'no-such-bucket' does not exist" in proc.stdout


def test_doctor_says_when_the_network_is_down() -> None:
    host = f"http://127.0.0.1:{free_port()}"
    proc = run_cli("doctor", "gcs", f"gs://{BUCKET}/x", env={"STORAGE_EMULATOR_HOST": host})
    assert proc.returncode == 1
    assert f"network: cannot reach {host}" in proc.stdout


def test_doctor_says_how_to_get_credentials(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GOOGLE_APPLICATION_CREDENTIALS"}
    env.pop("STORAGE_EMULATOR_HOST", None)
    env.update(NO_GCE_CHECK="true", HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"))
    proc = subprocess.run(
        [sys.executable, "-m", "crashdrill", "doctor", "gcs", f"gs://{BUCKET}/x"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "  FAIL  credentials" in proc.stdout
    assert "GOOGLE_APPLICATION_CREDENTIALS=" in proc.stdout
    assert "gcloud auth application-default login" in proc.stdout


@pytest.mark.parametrize("url", ["s3://bucket/x", "/local/dir", "gs://"])
def test_doctor_refuses_what_is_not_a_gs_url(url: str) -> None:
    proc = run_cli("doctor", "gcs", url)
    assert proc.returncode == 2
    assert url in proc.stderr


def test_permission_denied_and_missing_credentials_are_diagnosed() -> None:
    require_extra("gcs")
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc

    from crashdrill.workers.mirror_backends import diagnose_gcs

    denied = diagnose_gcs(gexc.Forbidden("no"), "b", "https://storage.googleapis.com")
    assert not denied.transient and "permission denied (403) on bucket 'b'" in str(denied)
    assert "roles/storage.objectAdmin" in str(denied)
    nocreds = diagnose_gcs(aexc.DefaultCredentialsError("x"), "b", "e")
    assert not nocreds.transient and "gcloud auth application-default login" in str(nocreds)
    busy = diagnose_gcs(gexc.ServiceUnavailable("later"), "b", "e")
    assert busy.transient
