"""The honest student of benchmarks/abuse.py: a poller of one URL, waiting for a pair's
runs, and the crash test it presses once run A can be crashed (a checkpoint past step 0,
CRASH_MARGIN steps still to train)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

FINISH_TIMEOUT_S = 600
ENDED = ("finished", "failed", "stopped", "diverged")  # server/api/schemas.py RunState
CRASH_MARGIN = 100  # steps run A must have left when it is crashed


class Poller(threading.Thread):
    """GET `url` every `every_s`; latencies in seconds (failures count 10 s)."""

    def __init__(self, url: str, every_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.every_s = every_s
        self.latencies: list[float] = []
        self.errors = 0
        self.stop_flag = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop_flag.is_set():
                t0 = time.perf_counter()
                try:
                    ok = client.get(self.url).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.perf_counter() - t0 if ok else 10.0)
                self.errors += not ok
                self.stop_flag.wait(self.every_s)


def wait_runs(
    c: httpx.Client, pair: str, ok: Callable[[list[dict[str, Any]]], bool], what: str
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    while True:
        runs: list[dict[str, Any]] = c.get(f"/api/pairs/{pair}").json()["runs"]
        if ok(runs):
            return runs
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}: {runs}")
        time.sleep(0.2)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def checkpoints_past_zero(c: httpx.Client, run: str) -> bool:
    page = c.get(f"/api/runs/{run}/records", params={"limit": 5000}).json()["records"]
    return any(r["kind"] == "ckpt" and (r.get("step") or 0) > 0 for r in page)


def compared_identically(checks: list[dict[str, Any]]) -> bool:
    """The resume checks that compared something (a kill that cost steps) are all
    bit-identical, and there is at least one; a kill that cost no step compares nothing."""
    compared = [ch for ch in checks if ch["expected_points"]]
    return bool(compared) and all(ch["bit_identical"] is True for ch in compared)


class CrashTest:
    """The honest browser's crash test on run A of its pair: pressed once A has written a
    checkpoint past step 0 with CRASH_MARGIN steps still to train, within `deadline_s`, and
    again while a kill costs no step (it landed just after a checkpoint: no comparison)."""

    def __init__(
        self, honest: httpx.Client, pair: str, run_a: str, steps: int, deadline_s: float = 0
    ) -> None:
        self.honest, self.pair, self.run_a, self.steps = honest, pair, run_a, steps
        self.deadline = time.monotonic() + (deadline_s or FINISH_TIMEOUT_S)
        self.pressed = threading.Event()
        self.answer = ""  # the crash request's status and time
        self.notes: list[str] = []  # why there was no crash test, when there was none
        self.again = 0  # crash tests pressed again because a kill cost no step

    def cost_steps(self, segment: int) -> bool:
        """Whether the crash test that made `segment` cost steps to recompute (its resume
        check compares some); False when it cost none or no check came in time."""
        while time.monotonic() < self.deadline:
            checks = self.honest.get(f"/api/runs/{self.run_a}/resume-checks").json()["checks"]
            check = next((c for c in checks if c["segment"] == segment), None)
            if check is not None:
                return bool(check["expected_points"])
            time.sleep(0.1)
        return False

    def when_ready(self) -> None:
        while time.monotonic() < self.deadline:
            a = self.honest.get(f"/api/pairs/{self.pair}").json()["runs"][0]
            if a["state"] in ENDED:
                self.notes.append(f"run A ended ({a['state']}) before a checkpoint past 0")
                return
            if a["stage"] == "train" and checkpoints_past_zero(self.honest, self.run_a):
                if (a["step"] or 0) > self.steps - CRASH_MARGIN:
                    self.notes.append(f"run A was at step {a['step']} of {self.steps}: too late")
                    return
                segment = (a["segment"] or 0) + 1  # the segment its resume check compares
                t0 = time.perf_counter()
                r = self.honest.post(f"/api/runs/{self.run_a}/crash")
                self.answer = f"{r.status_code} in {(time.perf_counter() - t0) * 1000:.0f} ms"
                if r.status_code != 202:
                    self.notes.append(f"refused ({r.status_code}): {r.text[:200]}")
                    return
                self.pressed.set()
                if self.cost_steps(segment):
                    return
                # The kill landed just after a checkpoint and cost no step: nothing to
                # compare. A student would press again; so does the honest browser.
                self.again += 1
            time.sleep(0.1)
        self.notes.append("run A was not ready for a crash test in time")

    def text(self) -> str:
        if self.pressed.is_set():
            again = f", again {self.again}× (a kill cost no step)" if self.again else ""
            return f"pressed ({self.answer}){again}"
        return f"none: {'; '.join(self.notes) or 'not yet'}"
