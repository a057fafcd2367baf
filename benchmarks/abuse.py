"""A bounded attacker against a lab in which an honest student trains: what gets through?

    python benchmarks/abuse.py                 # every attack, a few hundred requests each
    python benchmarks/abuse.py --rounds 2      # twice as many
    python benchmarks/abuse.py --smoke         # CI size: every attack, a few requests each

A fresh `python -m crashdrill.server` on loopback (the real trainer, an instructor token,
its own data dir). An honest browser starts a `quick` pair (steps = `--steps`, a student's
override, so it still trains when the crash comes), and once run A has written a checkpoint
past step 0 with at least 100 steps still to train, it presses Crash test on it (a crash
the lab refuses is printed with its reason). Meanwhile, from the same machine (one
address, as a class behind a NAT would be), the attacker plays, one after the other:
- cookie-less pair floods: POST /api/pairs with no cookie, again and again;
- oversized overrides: steps, vocab, keep, ckpt_every beyond bounds, wrong types, a body
  over max_body_bytes, a data = file:/proc/self/environ it may not set;
- token guessing: wrong instructor tokens at login and in a header, then the right one;
- SSE floods: as many event streams as it can hold open;
- cross-origin posts: starting pairs and crash tests with another site's Origin/Referer.
All the while a poller reads GET /api/pairs/{honest pair} every 0.1 s. It prints, per attack,
the requests sent and how they were answered (refused with 4xx, 5xx, or got through), then
whether the honest pair finished with a bit-identical resume and the p50/p99/max of the
poller's latency during the attack. Run-time numbers vary with the machine; the tests
assert the behaviour (tests/integration/test_server_hardening.py). Exit 1 when the
honest pair did not finish with a bit-identical resume, a request got a 5xx, or the
poller measured nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support is not installed

from tests.support.lab import free_port, spawn_server  # noqa: E402

TOKEN = "abuse-benchmark-instructor-token"
EVIL = "https://evil.example"
FINISH_TIMEOUT_S = 600
ENDED = ("finished", "failed", "stopped")  # server/schemas.py RunState
CRASH_MARGIN = 100  # steps run A must have left when it is crashed
# Requests per attack and round: (full, --smoke). The smoke sizes still pass every limit
# they probe: 3 pairs per address, 10 wrong tokens a minute, 64 streams per address.
SIZES = {"pairs": (40, 8), "tokens": (40, 12), "streams": (100, 70), "origins": (20, 8)}


class Poller(threading.Thread):
    """GET /api/pairs/{pair} every `every_s`; latencies in seconds (timeouts count 10 s)."""

    def __init__(self, base_url: str, pair: str, every_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url = f"{base_url}/api/pairs/{pair}"
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


def answer(code: int) -> str:
    if code >= 500:
        return "5xx"
    if code >= 400:
        return "refused"
    return "through"


def flood_pairs(base: str, n: int) -> tuple[Counter[str], Counter[int]]:
    """Cookie-less POST /api/pairs; stops what got through afterwards (with the token)."""
    outcomes: Counter[str] = Counter()
    codes: Counter[int] = Counter()
    made = []
    for _ in range(n):
        r = httpx.post(f"{base}/api/pairs", json={"preset": "quick"}, timeout=30)
        outcomes[answer(r.status_code)] += 1
        codes[r.status_code] += 1
        if r.status_code == 201:
            made.append(r.json())
    teacher = {"Authorization": f"Bearer {TOKEN}"}
    for pair in made:
        for run in pair["runs"]:
            httpx.post(f"{base}/api/runs/{run['id']}/stop", headers=teacher, timeout=30)
    return outcomes, codes


OVERRIDES: list[Any] = [
    {"steps": 10**9},
    {"steps": "x"},
    {"keep": 100_000_000},
    {"keep": "x"},
    {"ckpt_every": 1},
    {"ckpt_every": -5},
    {"vocab": 2_000_000_000},
    {"tokenizer": "gpt2"},
    {"data": "file:/proc/self/environ"},
    {"dropout": "x"},
    {"seed": 1e300},
    {"knob": {"a": 10**12}},
    {f"x{i}": i for i in range(100)},
    [1, 2, 3],
    "not an object",
]


def oversized_overrides(base: str, rounds: int) -> tuple[Counter[str], Counter[int]]:
    outcomes: Counter[str] = Counter()
    codes: Counter[int] = Counter()
    with httpx.Client(base_url=base, timeout=30) as c:
        for _ in range(rounds):
            for overrides in OVERRIDES:
                r = c.post("/api/pairs", json={"preset": "quick", "overrides": overrides})
                outcomes[answer(r.status_code)] += 1
                codes[r.status_code] += 1
                if r.status_code == 201:
                    for run in r.json()["runs"]:
                        c.post(f"/api/runs/{run['id']}/stop")
            big = {"preset": "quick", "overrides": {"pad": "x" * 200_000}}
            r = c.post("/api/pairs", json=big)
            outcomes[answer(r.status_code)] += 1
            codes[r.status_code] += 1
    return outcomes, codes


def guess_tokens(base: str, n: int) -> tuple[Counter[str], Counter[int], str]:
    """Wrong tokens from many threads (login and header), then the right one."""
    outcomes: Counter[str] = Counter()
    codes: Counter[int] = Counter()
    lock = threading.Lock()

    def one(i: int) -> None:
        if i % 2:
            r = httpx.post(f"{base}/api/instructor/login", json={"token": f"guess-{i}"}, timeout=30)
        else:
            h = {"Authorization": f"Bearer guess-{i}"}
            r = httpx.get(f"{base}/api/instructor/presets", headers=h, timeout=30)
        with lock:
            outcomes[answer(r.status_code)] += 1
            codes[r.status_code] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    right = httpx.post(f"{base}/api/instructor/login", json={"token": TOKEN}, timeout=30)
    return outcomes, codes, f"right token afterwards: {right.status_code}"


def flood_streams(base: str, pair: str, n: int) -> tuple[Counter[str], Counter[int]]:
    """Open up to `n` event streams at once from this address, then close them all."""
    outcomes: Counter[str] = Counter()
    codes: Counter[int] = Counter()
    with ExitStack() as stack:
        client = stack.enter_context(
            httpx.Client(base_url=base, timeout=30, limits=httpx.Limits(max_connections=n + 10))
        )
        for _ in range(n):
            r = stack.enter_context(client.stream("GET", f"/api/stream?pair={pair}"))
            outcomes[answer(r.status_code)] += 1
            codes[r.status_code] += 1
    return outcomes, codes


def cross_origin(base: str, run: str, n: int) -> tuple[Counter[str], Counter[int]]:
    outcomes: Counter[str] = Counter()
    codes: Counter[int] = Counter()
    requests: list[Callable[[], httpx.Response]] = [
        lambda: httpx.post(
            f"{base}/api/pairs", json={"preset": "quick"}, headers={"Origin": EVIL}, timeout=30
        ),
        lambda: httpx.post(f"{base}/api/runs/{run}/crash", headers={"Origin": EVIL}, timeout=30),
        lambda: httpx.post(
            f"{base}/api/runs/{run}/stop", headers={"Referer": EVIL + "/x"}, timeout=30
        ),
        lambda: httpx.post(
            f"{base}/api/instructor/login",
            json={"token": TOKEN},
            headers={"Origin": "null"},
            timeout=30,
        ),
    ]
    for i in range(n):
        r = requests[i % len(requests)]()
        outcomes[answer(r.status_code)] += 1
        codes[r.status_code] += 1
    return outcomes, codes


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1, help="multiply every attack's requests")
    p.add_argument("--steps", type=int, default=1200, help="steps of the honest runs (quick: 300)")
    p.add_argument("--smoke", action="store_true", help="CI size: fewer requests, 400 steps")
    args = p.parse_args()
    if args.smoke:
        args.steps = 400
    if args.rounds < 1 or args.steps <= CRASH_MARGIN:
        p.error(f"--rounds ≥ 1, --steps > {CRASH_MARGIN}")
    with tempfile.TemporaryDirectory(prefix="crashdrill-abuse-") as tmp:
        port = free_port()
        env = {**os.environ, "CRASHDRILL_INSTRUCTOR_TOKEN": TOKEN, "CRASHDRILL_TELEMETRY": "0"}
        log = Path(tmp) / "server.log"
        server = spawn_server(port, env, log, "--data-dir", str(Path(tmp) / "lab"))
        base = f"http://127.0.0.1:{port}"
        try:
            return run_attacks(base, args.rounds, args.steps, args.smoke)
        finally:
            server.terminate()
            server.wait(30)


def checkpoints_past_zero(c: httpx.Client, run: str) -> bool:
    page = c.get(f"/api/runs/{run}/records", params={"limit": 5000}).json()["records"]
    return any(r["kind"] == "ckpt" and (r.get("step") or 0) > 0 for r in page)


def run_attacks(base: str, rounds: int, steps: int, smoke: bool) -> int:
    size = {name: n[1] if smoke else n[0] for name, n in SIZES.items()}
    honest = httpx.Client(base_url=base, timeout=30)  # its cookie: the honest browser
    made = honest.post("/api/pairs", json={"preset": "quick", "overrides": {"steps": steps}})
    made.raise_for_status()
    pair = made.json()["pair"]
    run_a = made.json()["runs"][0]["id"]
    poller = Poller(base, pair)
    poller.start()
    rows: list[tuple[str, Counter[str], Counter[int], str]] = []
    crashed = threading.Event()
    crash_note: list[str] = []  # why there was no crash test, when there was none

    def crash_when_ready() -> None:
        deadline = time.monotonic() + FINISH_TIMEOUT_S
        while time.monotonic() < deadline:
            a = honest.get(f"/api/pairs/{pair}").json()["runs"][0]
            if a["state"] in ENDED:
                crash_note.append(f"run A ended ({a['state']}) before a checkpoint past 0")
                return
            if a["stage"] == "train" and checkpoints_past_zero(honest, run_a):
                if (a["step"] or 0) > steps - CRASH_MARGIN:
                    crash_note.append(f"run A was at step {a['step']} of {steps}: too late")
                    return
                r = honest.post(f"/api/runs/{run_a}/crash")
                if r.status_code == 202:
                    crashed.set()
                else:
                    crash_note.append(f"refused ({r.status_code}): {r.text[:200]}")
                return
            time.sleep(0.1)
        crash_note.append(f"run A wrote no checkpoint past 0 within {FINISH_TIMEOUT_S} s")

    crasher = threading.Thread(target=crash_when_ready, daemon=True)
    crasher.start()
    t0 = time.monotonic()
    o, c = flood_pairs(base, size["pairs"] * rounds)
    rows.append(("cookie-less pair flood", o, c, ""))
    o, c = oversized_overrides(base, rounds)
    rows.append(("oversized overrides", o, c, ""))
    o, c, note = guess_tokens(base, size["tokens"] * rounds)
    rows.append(("token guessing", o, c, note))
    o, c = flood_streams(base, pair, size["streams"] * rounds)
    rows.append(("SSE flood (one address)", o, c, ""))
    o, c = cross_origin(base, run_a, size["origins"] * rounds)
    rows.append(("cross-origin posts", o, c, ""))
    attack_s = time.monotonic() - t0
    attack_latencies = list(poller.latencies)
    crasher.join(FINISH_TIMEOUT_S)
    runs = wait_runs(
        honest, pair, lambda rs: all(r["state"] in ("finished", "failed") for r in rs), "the end"
    )
    poller.stop_flag.set()
    checks = honest.get(f"/api/runs/{run_a}/resume-checks").json()["checks"]

    print(f"{'attack':<26} {'sent':>5} {'refused':>8} {'5xx':>4} {'through':>8}  statuses")
    for name, outcomes, codes, note in rows:
        statuses = " ".join(f"{k}×{v}" for k, v in sorted(codes.items()))
        print(
            f"{name:<26} {sum(outcomes.values()):>5} {outcomes['refused']:>8}"
            f" {outcomes['5xx']:>4} {outcomes['through']:>8}  {statuses}  {note}".rstrip()
        )
    identical = bool(checks) and all(ch["bit_identical"] is True for ch in checks)
    print()
    crash = "pressed" if crashed.is_set() else f"none: {'; '.join(crash_note) or 'not yet'}"
    print(f"honest pair: {[r['state'] for r in runs]}, crash test on A: {crash},")
    print(f"  resume checks of A: {len(checks)}, bit-identical: {identical}")
    ms = [x * 1000 for x in attack_latencies]
    print(
        f"GET /api/pairs/{{id}} during the attack ({attack_s:.0f} s, {len(ms)} requests,"
        f" {poller.errors} failed): p50 {pct(ms, 0.5):.0f} ms, p99 {pct(ms, 0.99):.0f} ms,"
        f" max {max(ms, default=float('nan')):.0f} ms"
        + (f", mean {statistics.fmean(ms):.0f} ms" if ms else "")
    )
    five_xx = sum(o["5xx"] for _, o, _, _ in rows)
    if not ms:
        print("the poller took no sample during the attack: nothing measured")
        return 1
    ok = identical and all(r["state"] == "finished" for r in runs) and five_xx == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
