"""Crash-test a running lab through its HTTP API, the way a student's browser does.

    python3 docker/lab_check.py --url http://127.0.0.1:8000            # wait, pair, crash, check
    python3 docker/lab_check.py --url http://127.0.0.1:8000 --ready-only
    python3 docker/lab_check.py --url … --kill-worker-of-a CONTAINER CONTAINER   # Ray nodes

Steps: the lab says it is ready (GET /api/health); a pair of the `quick` preset starts
with a student's setting (400 steps: the runs train a frozen preset, which on a cluster
each worker gets its own copy of); run A is crash-tested once it has passed its first
checkpoint (again, should the kill land just after a checkpoint and cost no step); both
runs finish all 400 steps; A's resume check is bit-identical, complete and has points.
Prints one line per step; on the first step that does not hold prints `FAILED <step>:
why` and exits 1. Only the standard library (and the docker CLI for --kill-worker-of-a),
so that docker/test.sh runs it with any python3.

--kill-worker-of-a: a longer pair (lesson-1.7-fast) on a lab served with `--ray`; once run
A has passed a checkpoint, the worker container that holds A's node dir is killed (`docker
kill`), and A must resume on another node from the mirror ("Lost host … resumed on host
…"), its resume checks bit-identical, and both runs finish.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import http.cookiejar
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

STEPS = 400  # the student's setting of the crash test's quick pair (quick has 300)
CRASH_TRIES = 3


class StepFailed(Exception):
    def __init__(self, step: str, why: str) -> None:
        super().__init__(f"FAILED {step}: {why}")


class Client:
    """JSON over HTTP with one cookie jar: the lab ties a pair to the browser's session.
    `source`: connect from this local address (127.0.0.30: another client on loopback)."""

    def __init__(self, url: str, source: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.jar = http.cookiejar.CookieJar()
        bind = (source, 0) if source else None

        class FromSource(urllib.request.HTTPHandler):
            def http_open(self, req: Any) -> Any:
                conn = functools.partial(http.client.HTTPConnection, source_address=bind)
                return self.do_open(conn, req)

        cookies = urllib.request.HTTPCookieProcessor(self.jar)
        self._open = urllib.request.build_opener(FromSource(), cookies).open

    def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            req.add_header(name, value)
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
    # A student's setting (steps): the runs train a frozen preset, the file the server
    # writes into each run dir; on Ray a worker container trains its own copy of it.
    pair, run_a = start_pair(client, "quick", {"steps": STEPS})
    crashes = 0
    for _ in range(CRASH_TRIES):
        crashes += 1
        check = crash_a(client, pair, run_a, crashes, timeout_s)
        if check["expected_points"] > 0:
            break
        # The kill landed just after a checkpoint (in the evaluation after the write): it
        # cost no step and the check has nothing to compare. Correct, but not this test.
        print(f"ok   crash {crashes} cost no step (it landed just after a checkpoint): again")
    else:
        raise StepFailed("crash run A", f"{CRASH_TRIES} kills in a row cost no step")

    runs = wait_pair(
        client,
        pair,
        lambda rs: all(r["state"] == "finished" for r in rs),
        "both runs finish",
        timeout_s,
    )
    a = runs[0]
    if (a["crashes"], a["segment"], a["step"]) != (crashes, crashes, STEPS):
        why = f"run A: crashes {a['crashes']}, segment {a['segment']}, step {a['step']}"
        raise StepFailed("both runs finish", f"{why} (expected {crashes}, {crashes}, {STEPS})")
    print(f"ok   both runs finished {STEPS} steps (the student's setting); A resumed {crashes}×")

    step = "resume check of A is bit-identical"
    status, body = client.call("GET", f"/api/runs/{run_a}/resume-checks")
    checks = body.get("checks") if status == 200 else None
    if not checks or len(checks) != crashes:
        raise StepFailed(step, f"expected {crashes} resume check(s), got {status}: {body}")
    check = checks[-1]
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


def crash_a(
    client: Client, pair: str, run_a: str, crashes: int, timeout_s: float
) -> dict[str, Any]:
    """Crash run A (its `crashes`-th time) once it is training past its first checkpoint;
    A's resume check of the new segment, once its restart has resumed."""

    def crashable(runs: list[Any]) -> bool:
        a = runs[0]
        return bool(a["can_crash"]) and a["segment"] == crashes - 1 and (a["step"] or 0) >= 60

    wait_pair(client, pair, crashable, f"run A passes step 60 (crash {crashes})", timeout_s)
    status, body = client.call("POST", f"/api/runs/{run_a}/crash")
    if status != 202:
        raise StepFailed("crash run A (POST /api/runs/A/crash)", f"{status}: {body}")
    at, pid = body.get("at_step"), body.get("killed_pid")
    print(f"ok   crashed run A at step {at} (SIGKILL to pid {pid})")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, body = client.call("GET", f"/api/runs/{run_a}/resume-checks")
        found = [c for c in body.get("checks", []) if c["segment"] == crashes]
        if status == 200 and found:
            return dict(found[0])
        time.sleep(0.2)
    raise StepFailed("run A resumes", f"no resume check of segment {crashes}: {body}")


def start_pair(
    client: Client, preset: str, overrides: dict[str, Any] | None = None
) -> tuple[str, str]:
    body: dict[str, Any] = {"preset": preset}
    if overrides:
        body["overrides"] = overrides
    status, created = client.call("POST", "/api/pairs", body)
    if status != 201:
        raise StepFailed(f"start a pair of {preset} (POST /api/pairs)", f"{status}: {created}")
    print(f"ok   started a pair of {preset} {overrides or ''}: {created['pair']}")
    return created["pair"], created["runs"][0]["id"]


def container_of_node(containers: list[str], node_id: str) -> str | None:
    """The container whose Ray node is `node_id`: the one whose node dir root
    (workers/ray_node.py's node_root, under CRASHDRILL_NODE_DIR) bears its name."""
    for container in containers:
        out = subprocess.run(
            ["docker", "exec", container, "ls", "/nodes/crashdrill-node"],
            capture_output=True,
            text=True,
        )
        if node_id[:16] in out.stdout.split():
            return container
    return None


def lost_worker(client: Client, containers: list[str], timeout_s: float) -> None:
    pair, run_a = start_pair(client, "lesson-1.7-fast")
    step = "run A passes step 150 on a worker"

    def placed(runs: list[Any]) -> bool:
        a = runs[0]
        return bool(a.get("host")) and a["segment"] == 0 and (a["step"] or 0) >= 150

    a = wait_pair(client, pair, placed, step, timeout_s)[0]
    node = a["host"]["node_id"]
    victim = container_of_node(containers, node)
    if victim is None:
        raise StepFailed(step, f"no container of {containers} holds node {node}")
    kill = subprocess.run(["docker", "kill", victim], capture_output=True, text=True)
    if kill.returncode != 0:
        raise StepFailed("docker kill A's worker", kill.stderr.strip())
    print(
        f"ok   killed worker container {victim[:12]} (node {a['host']['name']}) at step {a['step']}"
    )

    def moved(runs: list[Any]) -> bool:
        a = runs[0]
        return a["segment"] >= 1 and (a.get("host") or {}).get("node_id") not in (None, node)

    wait_pair(client, pair, moved, "run A resumes on another node", timeout_s)
    runs = wait_pair(
        client,
        pair,
        lambda rs: all(r["state"] == "finished" for r in rs),
        "both runs finish after the lost worker",
        timeout_s,
    )
    print(f"ok   A finished on {runs[0]['host']['name']}")
    step = "A's resume on the other node is bit-identical"
    status, body = client.call("GET", f"/api/runs/{run_a}/resume-checks")
    checks = body.get("checks") if status == 200 else None
    if not checks:
        raise StepFailed(step, f"no resume check: {status}: {body}")
    for check in checks:
        if not (check["bit_identical"] is True and check["complete"] and check["points"] > 0):
            raise StepFailed(step, json.dumps(check))
    status, body = client.call("GET", f"/api/runs/{run_a}/events")
    texts = [e["text"] for e in body.get("events", [])] if status == 200 else []
    lost = [t for t in texts if t.startswith("Lost host")]
    if not lost:
        raise StepFailed(step, f"no 'Lost host' event among {texts[-8:]}")
    print(f"ok   {lost[0]}")
    print(f"ok   {len(checks)} resume check(s) of A, all bit-identical")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--ready-timeout", type=float, default=180.0)
    parser.add_argument("--run-timeout", type=float, default=240.0)
    parser.add_argument("--ready-only", action="store_true", help="only wait for /api/health")
    parser.add_argument(
        "--kill-worker-of-a",
        nargs="+",
        metavar="CONTAINER",
        help="the worker containers of a lab served with --ray: kill run A's mid-run",
    )
    args = parser.parse_args(argv)
    client = Client(args.url)
    try:
        health = wait_ready(client, args.ready_timeout)
        print(f"ok   lab ready at {args.url}: database {health['database']}")
        if args.kill_worker_of_a:
            lost_worker(client, args.kill_worker_of_a, args.run_timeout)
        elif not args.ready_only:
            crash_test(client, args.run_timeout)
    except StepFailed as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
