"""quickstart.py loaded as a module (it is a script at the repo's root, not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def quickstart() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quickstart", ROOT / "quickstart.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
