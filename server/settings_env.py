"""The lab's settings as the environment gives them: each CRASHDRILL_* (and SUPABASE_*)
variable read and parsed into the value of its Settings field, or a SettingsError naming
the variable, its value and what is allowed. `Settings.from_env` applies them over the
defaults; docs/server.md lists every variable (a test checks that).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path


class SettingsError(ValueError):
    """A setting with a value that cannot work; the message names it."""


def values_from_env() -> dict[str, object]:
    """Every setting the environment sets, by Settings field name."""
    values: dict[str, object] = {}
    env = os.environ
    if env.get("CRASHDRILL_INSTRUCTOR_TOKEN"):
        values["instructor_token"] = env["CRASHDRILL_INSTRUCTOR_TOKEN"]
    if env.get("CRASHDRILL_MAX_WRONG_TOKENS"):
        values["max_wrong_tokens"] = _int("CRASHDRILL_MAX_WRONG_TOKENS")
    if env.get("CRASHDRILL_SECRET_KEY"):
        values["secret_key"] = env["CRASHDRILL_SECRET_KEY"]
    if env.get("CRASHDRILL_MAX_CONCURRENT"):
        values["max_concurrent"] = _int("CRASHDRILL_MAX_CONCURRENT")
    if env.get("CRASHDRILL_ALLOW_OVERCOMMIT", "").strip():
        values["allow_overcommit"] = _bool("CRASHDRILL_ALLOW_OVERCOMMIT")
    if env.get("CRASHDRILL_TRAINER_NICE", "").strip():
        values["trainer_nice"] = _int("CRASHDRILL_TRAINER_NICE")
    if env.get("CRASHDRILL_TRAINER_COMMAND"):
        values["trainer_command"] = tuple(shlex.split(env["CRASHDRILL_TRAINER_COMMAND"]))
    if env.get("CRASHDRILL_INSTRUCTOR_PRESETS_DIR"):
        values["presets_dir"] = Path(env["CRASHDRILL_INSTRUCTOR_PRESETS_DIR"]).expanduser()
    values.update(_supabase_env())
    values.update(_class_env())
    if env.get("CRASHDRILL_TELEMETRY"):
        values["telemetry"] = env["CRASHDRILL_TELEMETRY"].lower() not in ("0", "false", "no")
    if env.get("CRASHDRILL_MIRROR", "").strip():
        values["mirror"] = env["CRASHDRILL_MIRROR"].strip()
    if env.get("CRASHDRILL_EXECUTOR", "").strip():
        values["executor"] = env["CRASHDRILL_EXECUTOR"].strip()
    if env.get("CRASHDRILL_RAY_ADDRESS", "").strip():
        values["ray_address"] = env["CRASHDRILL_RAY_ADDRESS"].strip()
    if env.get("CRASHDRILL_DATABASE_URL", "").strip():
        values["database_url"] = env["CRASHDRILL_DATABASE_URL"].strip()
    values.update(_hardening_env())
    return values


def allowed_hosts_from_environ() -> tuple[str, ...]:
    """CRASHDRILL_ALLOWED_HOSTS: host names, separated by commas or spaces (the
    `allowed_hosts` setting's default, so a Settings built in code reads it too)."""
    text = os.environ.get("CRASHDRILL_ALLOWED_HOSTS", "")
    return tuple(n for n in re.split(r"[\s,]+", text.strip()) if n)


def _supabase_env() -> dict[str, object]:
    """SUPABASE_URL, SUPABASE_ANON_KEY, SUPABASE_SERVICE_KEY (the names Supabase's own
    examples use) and the CRASHDRILL_SUPABASE_* limits."""
    env = os.environ
    values: dict[str, object] = {}
    for name in ("SUPABASE_URL", "SUPABASE_ANON_KEY", "SUPABASE_SERVICE_KEY"):
        if env.get(name):
            values[name.lower()] = env[name].strip()
    if env.get("CRASHDRILL_SUPABASE_TICK_S"):
        values["supabase_tick_s"] = _float("CRASHDRILL_SUPABASE_TICK_S")
    if env.get("CRASHDRILL_SUPABASE_MAX_PAYLOAD_BYTES"):
        values["supabase_max_payload_bytes"] = _int("CRASHDRILL_SUPABASE_MAX_PAYLOAD_BYTES")
    if env.get("CRASHDRILL_SUPABASE_MAX_MESSAGES_PER_S"):
        values["supabase_max_messages_per_s"] = _float("CRASHDRILL_SUPABASE_MAX_MESSAGES_PER_S")
    return values


def _hardening_env() -> dict[str, object]:
    """The settings of docs/server.md "Running a lab for a class" from the environment
    (CRASHDRILL_TRAINER_ENV_PASS and CRASHDRILL_ALLOWED_HOSTS are read by their defaults)."""
    env = os.environ
    values: dict[str, object] = {}
    if env.get("CRASHDRILL_CORPORA_DIR", "").strip():
        values["corpora_dir"] = Path(env["CRASHDRILL_CORPORA_DIR"].strip()).expanduser()
    if env.get("CRASHDRILL_INSTRUCTOR_SESSION_S"):
        values["instructor_session_s"] = _float("CRASHDRILL_INSTRUCTOR_SESSION_S")
    if env.get("CRASHDRILL_HTTPS"):
        values["https"] = env["CRASHDRILL_HTTPS"].strip().lower() in ("1", "true", "yes", "on")
    for name in ("CRASHDRILL_TRUSTED_PROXIES", "CRASHDRILL_ALLOWED_ORIGINS"):
        if env.get(name, "").strip():
            values[name[11:].lower()] = tuple(re.split(r"[\s,]+", env[name].strip()))
    if env.get("CRASHDRILL_STREAM_MAX_PER_ADDRESS"):
        values["stream_max_per_address"] = _int("CRASHDRILL_STREAM_MAX_PER_ADDRESS")
    if env.get("CRASHDRILL_STREAM_MAX_TOTAL"):
        values["stream_max_total"] = _int("CRASHDRILL_STREAM_MAX_TOTAL")
    for variable, (name, parse) in {
        "CRASHDRILL_MAX_CONNECTIONS": ("max_connections", _int),
        "CRASHDRILL_MAX_CONNECTIONS_PER_ADDRESS": ("max_connections_per_address", _int),
        "CRASHDRILL_REQUEST_READ_TIMEOUT_S": ("request_read_timeout_s", _float),
        "CRASHDRILL_KEEP_ALIVE_TIMEOUT_S": ("keep_alive_timeout_s", _float),
        "CRASHDRILL_LISTEN_BACKLOG": ("listen_backlog", _int),
    }.items():
        if env.get(variable, "").strip():
            values[name] = parse(variable)
    return values


def _class_env() -> dict[str, object]:
    """The CRASHDRILL_* variables of a lab for a class (docs/server.md)."""
    env = os.environ
    values: dict[str, object] = {}
    for variable, (name, parse) in {
        "CRASHDRILL_MAX_PAIRS_PER_SESSION": ("max_pairs_per_session", _int),
        "CRASHDRILL_MAX_PAIRS_PER_ADDRESS": ("max_pairs_per_address", _int),
        "CRASHDRILL_MAX_QUEUED_RUNS": ("max_queued_runs", _int),
        "CRASHDRILL_IDLE_STOP_S": ("idle_stop_s", _float),
        "CRASHDRILL_MAX_PARAMS_PER_RUN": ("max_params_per_run", _bytes),
        "CRASHDRILL_MAX_TOKENS_PER_RUN": ("max_tokens_per_run", _bytes),
        "CRASHDRILL_MAX_CHECKPOINT_BYTES_PER_RUN": ("max_checkpoint_bytes_per_run", _bytes),
        "CRASHDRILL_MAX_DISK_BYTES_PER_RUN": ("max_disk_bytes_per_run", _bytes),
        "CRASHDRILL_MAX_DISK_BYTES_PER_ADDRESS": ("max_disk_bytes_per_address", _bytes),
        "CRASHDRILL_CHECKPOINT_RETENTION_S": ("checkpoint_retention_s", _float),
        "CRASHDRILL_DISK_BUDGET_BYTES": ("disk_budget_bytes", _bytes),
        "CRASHDRILL_MIN_FREE_DISK_BYTES": ("min_free_disk_bytes", _bytes),
    }.items():
        if env.get(variable, "").strip():
            values[name] = parse(variable)
    if env.get("CRASHDRILL_STUDENT_UNLOCKABLE", "").strip():
        raw = env["CRASHDRILL_STUDENT_UNLOCKABLE"].replace(",", " ").split()
        values["student_unlockable"] = tuple(raw)
    return values


_SUFFIXES = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _bytes(name: str) -> int:
    """A whole number, optionally with a binary suffix: 500M, 20G (also 20GiB)."""
    raw = os.environ[name].strip().lower().removesuffix("ib").removesuffix("b")
    scale = _SUFFIXES.get(raw[-1:], 1)
    try:
        return int(float(raw[:-1] if scale > 1 else raw) * scale)
    except ValueError:
        raise SettingsError(
            f"{name} = {os.environ[name]!r}: a whole number, optionally with K, M, G or T"
        ) from None


def _float(name: str) -> float:
    try:
        return float(os.environ[name])
    except ValueError:
        raise SettingsError(f"{name} = {os.environ[name]!r}: a number") from None


def _int(name: str) -> int:
    try:
        return int(os.environ[name])
    except ValueError:
        raise SettingsError(f"{name} = {os.environ[name]!r}: a whole number") from None


def _bool(name: str) -> bool:
    raw = os.environ[name].strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name} = {os.environ[name]!r}: 1, true, yes, on or 0, false, no, off")
