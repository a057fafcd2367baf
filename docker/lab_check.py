"""Crash-test a running lab through its HTTP API, the way a student's browser does.

    python3 docker/lab_check.py --url http://127.0.0.1:8000            # wait, pair, crash, check
    python3 docker/lab_check.py --url http://127.0.0.1:8000 --ready-only

Steps: the lab says it is ready (GET /api/health); a pair of the `quick` preset starts;
run A is crash-tested once it has passed its first checkpoint; both runs finish; A's
resume check is bit-identical, complete and has points. Prints one line per step; on the
first step that does not hold prints `FAILED <step>: why` and exits 1. Only the standard
library, so that docker/test.sh runs it with any python3.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any


class StepFailed(Exception):
    def __init__(self, step: str, why: str) -> None:
        super().__init__(f"FAILED {step}: {why}")


class Client:
    """JSON over HTTP with one cookie jar: the lab ties a pair to the browser's session."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        jar = http.cookiejar.CookieJar()
        self._open = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar)).open

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with self._open(req, timeout=30) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, text


def wait_ready(client: Client, timeout_s: float) -> dict[str, Any]:
    step = "lab ready (GET /api/health)"
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            status, body = client.call("GET", "/api/health")
        except OSError as e:  # not listening yet
            last = e
        else:
            if status == 200 and body.get("ready") is True:
                return dict(body)
            last = (status, body)
        time.sleep(0.5)
    raise StepFailed(step, f"not ready after {timeout_s:.0f} s; last answer: {last}")


def wait_pair(client: Client, pair: str, ok: Any, what: str, timeout_s: float) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    runs: list[Any] = []
    while time.monotonic() < deadline:
        status, body = client.call("GET", f"/api/pairs/{pair}")
        if status != 200:
            raise StepFailed(what, f"GET /api/pairs/{pair} answered {status}: {body}")
        runs = body["runs"]
        if ok(runs):
            return runs
        if any(r["state"] in ("failed", "stopped") for r in runs):
            break
        time.sleep(0.02)
    states = [(r["label"], r["state"], r["stage"], r["step"], r["message"]) for r in runs]
    raise StepFailed(what, f"runs (label, state, stage, step, message): {states}")


def crash_test(client: Client, timeout_s: float) -> None:
    status, created = client.call("POST", "/api/pairs", {"preset": "quick"})
    if status != 201:
        raise StepFailed("start a quick pair (POST /api/pairs)", f"{status}: {created}")
    pair = created["pair"]
    run_a = created["runs"][0]["id"]
    print(f"ok   started pair {pair}")

    def past_first_checkpoint(runs: list[Any]) -> bool:
        a = runs[0]
        return bool(a["can_crash"]) and a["segment"] == 0 and (a["step"] or 0) >= 60

    wait_pair(client, pair, past_first_checkpoint, "run A passes step 60", timeout_s)
    status, body = client.call("POST", f"/api/runs/{run_a}/crash")
    if status != 202:
        raise StepFailed("crash run A (POST /api/runs/A/crash)", f"{status}: {body}")
    at, pid = body.get("at_step"), body.get("killed_pid")
    print(f"ok   crashed run A at step {at} (SIGKILL to pid {pid})")

    runs = wait_pair(
        client,
        pair,
        lambda rs: all(r["state"] == "finished" for r in rs),
        "both runs finish",
        timeout_s,
    )
    a = runs[0]
    if (a["crashes"], a["segment"]) != (1, 1):
        why = f"run A: crashes {a['crashes']}, segment {a['segment']} (expected 1, 1)"
        raise StepFailed("both runs finish", why)
    print("ok   both runs finished; A resumed once")

    step = "resume check of A is bit-identical"
    status, body = client.call("GET", f"/api/runs/{run_a}/resume-checks")
    checks = body.get("checks") if status == 200 else None
    if not checks or len(checks) != 1:
        raise StepFailed(step, f"expected one resume check, got {status}: {body}")
    check = checks[0]
    holds = (
        check["bit_identical"] is True
        and check["complete"]
        and check["max_abs_delta"] == 0.0
        and check["points"] == check["expected_points"] > 0
    )
    if not holds:
        raise StepFailed(step, json.dumps(check))
    lo, hi = check["steps"]
    print(f"ok   resume check: steps {lo}..{hi}, {check['points']} points, bit-identical")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--ready-timeout", type=float, default=180.0)
    parser.add_argument("--run-timeout", type=float, default=240.0)
    parser.add_argument("--ready-only", action="store_true", help="only wait for /api/health")
    args = parser.parse_args(argv)
    client = Client(args.url)
    try:
        health = wait_ready(client, args.ready_timeout)
        print(f"ok   lab ready at {args.url}: database {health['database']}")
        if not args.ready_only:
            crash_test(client, args.run_timeout)
    except StepFailed as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
