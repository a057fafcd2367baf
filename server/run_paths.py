"""Records and events as the API shows them: paths relative to the run, never the server's.

    value = run_relative(value, "/srv/lab/runs/r1a2")   # {"path": "ckpt/step-100", …}

A trainer writes absolute paths into its records (a checkpoint's directory, the checkpoint
it resumed from, a local mirror's copy, sentences that name them). Shown to a student they
would give away the server's layout, so ingest stores every string with the run dir made
relative ("ckpt/step-100", "." for the run dir itself) and any other absolute path that
runs through the run's id cut to start there (a local mirror's copy: "r1a2/step-100").
The run's files keep the trainer's own text; only what the database serves changes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


class RunPaths:
    """Rewrites the strings of one run's records."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = str(run_dir).rstrip("/")
        run_id = Path(self.run_dir).name
        # An absolute path through /RUN_ID/ (a local mirror's copy): cut to RUN_ID/…
        self._elsewhere = re.compile(rf"(?<![\w:/.])/[^\s'\"]*?/(?={re.escape(run_id)}/)")

    def text(self, text: str) -> str:
        if "/" not in text:
            return text
        text = text.replace(self.run_dir + "/", "")
        text = re.sub(rf"{re.escape(self.run_dir)}(?![\w.-])", ".", text)
        return self._elsewhere.sub("", text)

    def value(self, value: Any) -> Any:
        """`value` (a parsed record) with every string rewritten."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value


def run_relative(value: Any, run_dir: str | Path) -> Any:
    return RunPaths(run_dir).value(value)
