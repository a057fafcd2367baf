"""The trainer's environment is an allowlist (workers/trainer_env.py)."""

from __future__ import annotations

import pytest

from crashdrill.trainer.checkpoint_pause import ENV as PAUSE_ENV
from crashdrill.workers.trainer_env import (
    GCS_ENV_NAMES,
    SERVER_SECRETS,
    parse_env_pass,
    trainer_environment,
    writes_gcs_mirror,
)

SERVER_ENV = {
    "PATH": "/usr/bin",
    "HOME": "/home/lab",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TMPDIR": "/tmp",
    "PYTHONPATH": "/srv/lab",
    "OMP_NUM_THREADS": "1",
    "CUDA_VISIBLE_DEVICES": "0",
    "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "CRASHDRILL_PRESETS_DIR": "/srv/presets",
    "CRASHDRILL_INSTRUCTOR_TOKEN": "a-very-long-instructor-token",
    "CRASHDRILL_SECRET_KEY": "cookie-key",
    "CRASHDRILL_DATABASE_URL": "postgresql://lab:pw@db/lab",
    "SUPABASE_URL": "https://x.supabase.co",
    "SUPABASE_ANON_KEY": "anon",
    "SUPABASE_SERVICE_KEY": "service",
    "GOOGLE_APPLICATION_CREDENTIALS": "/srv/gcs.json",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "PYTHON_API_TOKEN": "looks-like-a-secret",
    "SSH_AUTH_SOCK": "/tmp/ssh",
}


def test_a_trainer_gets_what_torch_and_the_trainer_need_and_none_of_the_servers_secrets():
    env = trainer_environment(SERVER_ENV)
    for name in (
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TMPDIR",
        "PYTHONPATH",
        "OMP_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES",
        "LD_LIBRARY_PATH",
        "CUBLAS_WORKSPACE_CONFIG",
        "CRASHDRILL_PRESETS_DIR",
    ):
        assert env[name] == SERVER_ENV[name], name
    assert env["PYTHONUNBUFFERED"] == "1"
    for name in (*SERVER_SECRETS, "AWS_SECRET_ACCESS_KEY", "SSH_AUTH_SOCK", "PYTHON_API_TOKEN"):
        assert name not in env, name
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in env


def test_gcs_credentials_pass_only_to_a_trainer_that_writes_a_gcs_mirror_itself():
    assert "GOOGLE_APPLICATION_CREDENTIALS" in GCS_ENV_NAMES
    env = trainer_environment(SERVER_ENV, gcs=True)
    assert env["GOOGLE_APPLICATION_CREDENTIALS"] == "/srv/gcs.json"
    assert "CRASHDRILL_DATABASE_URL" not in env
    assert writes_gcs_mirror(("crashdrill", "run", "--mirror", "gs://b/runs"))
    assert writes_gcs_mirror(("crashdrill", "run", "--mirror=gs://b/runs"))
    assert not writes_gcs_mirror(("crashdrill", "run"))


def test_the_operators_pass_list_adds_names_but_never_a_server_secret():
    passes = parse_env_pass("CRASHDRILL_STANDIN_*, WANDB_MODE AWS_*")
    assert passes == ("CRASHDRILL_STANDIN_*", "WANDB_MODE", "AWS_*")
    parent = {**SERVER_ENV, "CRASHDRILL_STANDIN_STEPS": "5", "WANDB_MODE": "offline"}
    env = trainer_environment(parent, passes=(*passes, "CRASHDRILL_*", "SUPABASE_SERVICE_KEY"))
    assert env["CRASHDRILL_STANDIN_STEPS"] == "5"
    assert env["WANDB_MODE"] == "offline"
    assert not SERVER_SECRETS & set(env)
    assert "AWS_SECRET_ACCESS_KEY" not in env  # a secret-looking name only when named exactly
    named = trainer_environment(parent, passes=("AWS_SECRET_ACCESS_KEY",))
    assert named["AWS_SECRET_ACCESS_KEY"] == "aws"


def test_the_supervisor_may_set_its_own_variables_but_never_a_secret():
    env = trainer_environment(SERVER_ENV, {PAUSE_ENV: "100:1"})
    assert env[PAUSE_ENV] == "100:1"
    with pytest.raises(ValueError, match="CRASHDRILL_SECRET_KEY"):
        trainer_environment(SERVER_ENV, {"CRASHDRILL_SECRET_KEY": "x"})


def test_names_under_a_tuning_prefix_pass_only_when_listed_exactly():
    parent = {
        **SERVER_ENV,
        "KMP_AUTH": "licence-server-credential",
        "KMP_AFFINITY": "granularity=fine",
        "OMP_PROC_BIND": "close",
        "OMP_ORG_ID": "org-1234",
        "TORCH_HOME": "/srv/torch",
        "TORCH_HUB_LOGIN": "someone",
        "LC_CTYPE": "C.UTF-8",
        "LC_SESSION": "abc",
        "PYTHONHASHSEED": "0",
        "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
        "NCCL_DEBUG": "WARN",
        "NCCL_CUSTOM": "x",
    }
    env = trainer_environment(parent)
    for name in ("KMP_AFFINITY", "OMP_PROC_BIND", "TORCH_HOME", "LC_CTYPE", "PYTHONHASHSEED"):
        assert env[name] == parent[name], name
    assert "NCCL_DEBUG" in env
    for name in (
        "KMP_AUTH",
        "OMP_ORG_ID",
        "TORCH_HUB_LOGIN",
        "LC_SESSION",
        "PYTHON_KEYRING_BACKEND",
        "NCCL_CUSTOM",
    ):
        assert name not in env, name
    # an operator's prefix adds names, but never one that looks like a credential
    widened = trainer_environment(parent, passes=parse_env_pass("KMP_* OMP_*"))
    assert widened["OMP_ORG_ID"] == "org-1234"
    assert "KMP_AUTH" not in widened
    assert trainer_environment(parent, passes=("KMP_AUTH",))["KMP_AUTH"] == parent["KMP_AUTH"]
