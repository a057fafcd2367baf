"""The environment a trainer gets: an allowlist, never the server's whole environment.

    env = trainer_environment(os.environ, {PAUSE_ENV: "100:1"})

A lab's server holds secrets (the instructor token, the cookie key, a database URL with a
password, Supabase's service key); a lesson's trainer is code that a student's settings
steer, and its samples and records are shown on a page. So a trainer gets only what torch,
the trainer and a mirror need: the exact names below, the `extra` the supervisor sets (the
crash pause, the corpora directory), and the names the operator adds with
CRASHDRILL_TRAINER_ENV_PASS (`NAME` or `PREFIX*`, separated by commas or spaces: what a
custom trainer command needs). The allowlist itself has no prefixes: `KMP_*` or
`TORCH_*` would let through any name someone gives a secret under them (`KMP_AUTH`), and
no prefix is a namespace that only harmless names use. SERVER_SECRETS never pass, whoever
asks; a name that looks like a secret (…TOKEN, …_KEY, …PASSWORD, …AUTH…) passes only when
named exactly, never by an operator's prefix. GCS credentials pass only to a trainer that
writes to a gs:// mirror itself.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping

from crashdrill.trainer.checkpoint_pause import ENV as PAUSE_ENV

ENV_PASS_VARIABLE = "CRASHDRILL_TRAINER_ENV_PASS"

# Exact names a trainer may inherit.
TRAINER_ENV_NAMES = frozenset(
    {
        # the process itself
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "TZ",
        "LANG",
        "LANGUAGE",
        # the locale categories (POSIX and glibc)
        "LC_ALL",
        "LC_CTYPE",
        "LC_COLLATE",
        "LC_MESSAGES",
        "LC_MONETARY",
        "LC_NUMERIC",
        "LC_TIME",
        "LC_ADDRESS",
        "LC_IDENTIFICATION",
        "LC_MEASUREMENT",
        "LC_NAME",
        "LC_PAPER",
        "LC_TELEPHONE",
        # the interpreter (Python's documented variables that a trainer may want)
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPYCACHEPREFIX",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONWARNINGS",
        "PYTHONFAULTHANDLER",
        "PYTHONNOUSERSITE",
        "PYTHONSAFEPATH",
        "PYTHONDEVMODE",
        "PYTHONMALLOC",
        "TMPDIR",
        "TEMP",
        "TMP",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "XDG_CACHE_HOME",
        "XDG_DATA_HOME",
        "XDG_CONFIG_HOME",
        # threads (a run's thread count is fixed and recorded), OpenMP/MKL tuning, torch
        # and NCCL diagnostics, and determinism and memory on CUDA
        "OMP_NUM_THREADS",
        "OMP_DYNAMIC",
        "OMP_PROC_BIND",
        "OMP_PLACES",
        "OMP_SCHEDULE",
        "OMP_STACKSIZE",
        "OMP_WAIT_POLICY",
        "OMP_MAX_ACTIVE_LEVELS",
        "OMP_THREAD_LIMIT",
        "OMP_DISPLAY_ENV",
        "MKL_NUM_THREADS",
        "MKL_DYNAMIC",
        "MKL_CBWR",
        "MKL_THREADING_LAYER",
        "MKL_ENABLE_INSTRUCTIONS",
        "MKL_VERBOSE",
        "KMP_AFFINITY",
        "KMP_BLOCKTIME",
        "KMP_DUPLICATE_LIB_OK",
        "KMP_INIT_AT_FORK",
        "KMP_SETTINGS",
        "KMP_WARNINGS",
        "OPENBLAS_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "TORCH_HOME",
        "TORCH_LOGS",
        "TORCH_CPP_LOG_LEVEL",
        "TORCH_SHOW_CPP_STACKTRACES",
        "TORCH_USE_CUDA_DSA",
        "TORCH_DISTRIBUTED_DEBUG",
        "NCCL_DEBUG",
        "NCCL_SOCKET_IFNAME",
        "NCCL_IB_DISABLE",
        "NCCL_P2P_DISABLE",
        "PYTORCH_CUDA_ALLOC_CONF",
        "CUBLAS_WORKSPACE_CONFIG",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_HOME",
        "NVIDIA_VISIBLE_DEVICES",
        # the trainer's own settings (trainer/presets.py, data.py, checkpoint.py)
        "CRASHDRILL_PRESETS_DIR",
        "CRASHDRILL_CACHE_DIR",
        PAUSE_ENV,
        "CRASHDRILL_TRAINER_NICE",
        "CRASHDRILL_CORPORA_DIR",
        # datasets for FineWeb-Edu (offline switches and where the cache lives)
        "HF_HOME",
        "HF_DATASETS_CACHE",
        "HF_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
    }
)
# What a trainer that writes to a gs:// mirror itself needs (google-cloud-storage).
GCS_ENV_NAMES = frozenset(
    {
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_CLOUD_PROJECT",
        "STORAGE_EMULATOR_HOST",
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
    }
)
# The server's secrets (server/settings.py reads them): never in a trainer's environment.
SERVER_SECRETS = frozenset(
    {
        "CRASHDRILL_INSTRUCTOR_TOKEN",
        "CRASHDRILL_SECRET_KEY",
        "CRASHDRILL_DATABASE_URL",
        "SUPABASE_URL",
        "SUPABASE_ANON_KEY",
        "SUPABASE_SERVICE_KEY",
    }
)
# Names that look like a secret never pass through CRASHDRILL_TRAINER_ENV_PASS either.
_SECRET_LOOKING = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL|COOKIE|PRIVATE|DATABASE_URL|_KEY$|^SUPABASE_",
    re.I,
)


def parse_env_pass(text: str) -> tuple[str, ...]:
    """`NAME` and `PREFIX*` patterns, separated by commas or whitespace."""
    return tuple(p for p in re.split(r"[\s,]+", text.strip()) if p)


def env_pass_from_environ() -> tuple[str, ...]:
    """The operator's extra names, from CRASHDRILL_TRAINER_ENV_PASS."""
    return parse_env_pass(os.environ.get(ENV_PASS_VARIABLE, ""))


def allowed(name: str, passes: Iterable[str] = (), *, gcs: bool = False) -> bool:
    """Whether a trainer may inherit the variable `name`: never a server secret; a name
    in the allowlist, the GCS names of a trainer that mirrors to GCS, or
    CRASHDRILL_TRAINER_ENV_PASS; a name that looks like a secret only when listed exactly,
    never by a prefix."""
    if name in SERVER_SECRETS:
        return False
    patterns = tuple(passes)
    if name in TRAINER_ENV_NAMES or name in patterns or (gcs and name in GCS_ENV_NAMES):
        return True
    if _SECRET_LOOKING.search(name):
        return False
    return any(fnmatch.fnmatchcase(name, p) for p in patterns if "*" in p or "?" in p)


def trainer_environment(
    parent: Mapping[str, str],
    extra: Mapping[str, str] | None = None,
    *,
    passes: Iterable[str] = (),
    gcs: bool = False,
) -> dict[str, str]:
    """What a trainer started from a process with environment `parent` gets: the allowed
    part of `parent`, then `extra` (set by the supervisor, never a secret), and
    PYTHONUNBUFFERED (its output reaches the run dir's files line by line)."""
    patterns = tuple(passes)
    env = {k: v for k, v in parent.items() if allowed(k, patterns, gcs=gcs)}
    env["PYTHONUNBUFFERED"] = "1"
    for name, value in (extra or {}).items():
        if name in SERVER_SECRETS:
            raise ValueError(f"{name} is one of the server's secrets: a trainer never gets it")
        env[name] = value
    return env


def writes_gcs_mirror(command: Iterable[str]) -> bool:
    """A trainer command that mirrors its checkpoints to GCS itself (`--mirror gs://…`)."""
    return any(a.startswith(("gs://", "--mirror=gs://")) for a in command)
