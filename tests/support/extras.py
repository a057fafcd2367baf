"""One rule for every test that needs an optional extra of pyproject.toml (postgres, gcs,
supabase, ray, data, gpu, frameworks): without the extra it skips and names the extra to
install; with CI=true it fails instead, so a CI run, which installs every extra
(`python3 quickstart.py test`), never skips one silently.

    require_extra("gcs")                            # in a test, a fixture or a helper
    require_extra("supabase", module=True)          # at the top of a module: all of it

A new extra that tests need gets its modules in EXTRA_MODULES; tests/unit/test_lock.py
checks that every extra named here exists in pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import os
from typing import NoReturn

import pytest

# The modules whose presence says that an extra is installed (import names, not dists).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "postgres": ("psycopg",),
    "gcs": ("google.cloud.storage", "google_crc32c"),
    "supabase": ("supabase", "realtime"),
    "ray": ("ray",),
    "data": ("datasets", "tiktoken"),
    "gpu": ("pynvml",),
    "frameworks": ("transformers", "accelerate", "lightning"),
}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def unavailable(reason: str, *, module: bool = False) -> NoReturn:
    """Skip the test (the whole module with `module`), or fail it under CI=true."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: every optional part must run in CI)", pytrace=False)
    pytest.skip(reason, allow_module_level=module)


def missing_module(extra: str) -> str | None:
    """The first of the extra's modules that cannot be imported here, else None."""
    for name in EXTRA_MODULES[extra]:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package is missing, or half there
            found = False
        if not found:
            return name
    return None


def require_extra(extra: str, *, module: bool = False) -> None:
    """Go on only where `crashdrill[extra]` is installed (see the module docstring)."""
    name = missing_module(extra)
    if name is not None:
        unavailable(
            f"needs the {extra} extra ({name} is not installed): pip install 'crashdrill[{extra}]'",
            module=module,
        )
