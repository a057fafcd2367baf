"""The page's "warming up" note (web/static/warm_up.js), run in node: shown while GET
/api/health says the warm trainer process is still importing torch, gone once it is ready
(or where there is none)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

MODULE = Path(__file__).resolve().parents[2] / "web" / "static" / "warm_up.js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the page's module")


def notes(healths: list[Any]) -> list[str | None]:
    module = json.dumps(MODULE.as_uri())
    body = f"{json.dumps(healths)}.map((h) => m.warmUpNote(h))"
    code = f"import({module}).then((m) => {{ console.log(JSON.stringify({body})); }})"
    assert NODE is not None
    out = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    result: list[str | None] = json.loads(out.stdout)
    return result


def test_the_note_shows_while_the_warm_process_imports_and_goes_once_it_is_ready() -> None:
    warming, ready, none = (
        {"ready": True, "warm_trainers": w} for w in ("warming", "ready", "none")
    )
    shown = notes([warming, ready, none, None])
    assert shown[0] is not None and shown[0].startswith("Warming up")
    assert shown[1:] == [None, None, None]
