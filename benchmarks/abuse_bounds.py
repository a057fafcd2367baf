"""The edges of the numbers, for benchmarks/abuse.py (issue #24, items 2 and 3): settings a
lesson allows that make a run diverge, and settings within every bound that would write
gigabytes of checkpoints.

- diverging settings: POST /api/pairs lesson-1.7-fast with lr 1.0, weight_decay 10,
  warmup 0, grad_clip 1000 (all inside the lesson's ranges). Both runs must end
  "diverged" (never "failed"), and nothing a student's page reads of them — the pair, every
  run's records, events and resume checks — may hold a NaN, a traceback or a path of the
  server's (`leaks`). It prints the step each run diverged at and how long it took.
- disk hogs: lesson-1.13 (a 39 MB checkpoint) with steps 800 and ckpt_every 10 (81
  checkpoints, 6.3 GB with the mirror's copies), and two more over 4 GiB; each must be
  refused up front (4xx naming max_disk_bytes_per_run) and nothing may start.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

DIVERGING = {"lr": 1.0, "weight_decay": 10.0, "warmup": 0, "grad_clip": 1000.0}
DISK_HOGS: list[dict[str, Any]] = [  # each over 4 GiB a run (max_disk_bytes_per_run)
    {"steps": 800, "ckpt_every": 10},  # the case: 81 checkpoints, 6.3 GB
    {"steps": 600, "ckpt_every": 10},  # 61: 4.7 GB
    {"steps": 700, "ckpt_every": 12},  # 60: 4.7 GB
]
DIVERGE_TIMEOUT_S = 300
LEAK_MARKERS = ("Traceback", 'File "')


def _strict(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


@dataclass
class DivergeOutcome:
    states: list[str] = field(default_factory=list)
    steps: list[int | None] = field(default_factory=list)
    seconds: float = 0.0
    leaks: list[str] = field(default_factory=list)  # what a student could read that it may not
    answers: int = 0

    def ok(self) -> bool:
        return self.states == ["diverged", "diverged"] and not self.leaks

    def report(self) -> bool:
        print(
            f"diverging settings {DIVERGING}: runs {self.states} at steps {self.steps}"
            f" after {self.seconds:.1f} s; {self.answers} student answers read,"
            f" {len(self.leaks)} with a NaN, a traceback or a server path"
        )
        for leak in self.leaks[:5]:
            print(f"  leak: {leak}")
        return self.ok()


def diverging_pair(base: str, secret_paths: list[str]) -> DivergeOutcome:
    """Start the diverging pair from a browser of its own, wait for both runs to end and
    read everything its page reads; `secret_paths`: paths no answer may hold."""
    out = DivergeOutcome()
    with httpx.Client(base_url=base, timeout=30) as c:
        t0 = time.monotonic()
        r = c.post("/api/pairs", json={"preset": "lesson-1.7-fast", "overrides": DIVERGING})
        if r.status_code != 201:
            out.leaks.append(f"the pair was not started: {r.status_code} {r.text[:200]}")
            return out
        pair = r.json()["pair"]
        deadline = t0 + DIVERGE_TIMEOUT_S
        while True:
            runs = c.get(f"/api/pairs/{pair}").json()["runs"]
            if all(x["state"] in ("finished", "failed", "stopped", "diverged") for x in runs):
                break
            if time.monotonic() > deadline:
                for x in runs:
                    c.post(f"/api/runs/{x['id']}/stop")
                break
            time.sleep(0.2)
        out.seconds = time.monotonic() - t0
        out.states = [x["state"] for x in runs]
        out.steps = [x["step"] for x in runs]
        urls = [f"/api/pairs/{pair}"] + [
            f"/api/runs/{x['id']}/{what}"
            for x in runs
            for what in ("records?limit=5000", "events", "resume-checks")
        ]
        for url in urls:
            text = c.get(url).text
            out.answers += 1
            try:
                _strict(text)
            except ValueError as e:
                out.leaks.append(f"{url}: {e}")
            for marker in (*LEAK_MARKERS, *secret_paths):
                if marker in text:
                    out.leaks.append(f"{url}: holds {marker!r}")
    return out


def disk_hogs(base: str, rounds: int) -> tuple[Counter[str], Counter[int], str]:
    """POST each disk hog; what got through is stopped. The note: the first refusal."""
    outcomes: Counter[str] = Counter()
    codes: Counter[int] = Counter()
    note = ""
    with httpx.Client(base_url=base, timeout=30) as c:
        for _ in range(rounds):
            for overrides in DISK_HOGS:
                r = c.post("/api/pairs", json={"preset": "lesson-1.13", "overrides": overrides})
                codes[r.status_code] += 1
                if r.status_code >= 500:
                    outcomes["5xx"] += 1
                elif r.status_code >= 400:
                    outcomes["refused"] += 1
                    detail = r.json().get("detail", "")
                    if not note and "max_disk_bytes_per_run" in detail:
                        note = "e.g. " + detail[detail.find("run A has") :]
                else:
                    outcomes["through"] += 1
                    for run in r.json()["runs"]:
                        c.post(f"/api/runs/{run['id']}/stop")
    return outcomes, codes, note


def repo_paths() -> list[str]:
    """The repository's path: a traceback would name it."""
    return [str(Path(__file__).resolve().parents[1])]
