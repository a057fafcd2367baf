"""A bounded attacker against a lab in which an honest student trains: what gets through?

    python benchmarks/abuse.py                 # every attack, a few hundred requests each
    python benchmarks/abuse.py --rounds 2      # twice as many
    python benchmarks/abuse.py --smoke         # CI size: every attack, a few requests each
    python benchmarks/abuse.py --flood-sockets 5000 --flood-addresses 4 --flood-seconds 60

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
- cross-origin posts: starting pairs and crash tests with another site's Origin/Referer;
- disk hogs: lesson-1.13 with steps and ckpt_every that would write gigabytes of
  checkpoints, each within its range (benchmarks/abuse_bounds.py): refused up front.
All the while a poller reads GET /api/pairs/{honest pair} every 0.1 s. It prints, per attack,
the requests sent and how they were answered (refused with 4xx, 5xx, or got through), then
whether the honest pair finished with a bit-identical resume and the p50/p99/max of the
poller's latency during the attack.

Once the honest pair has finished, a browser of its own starts lesson-1.7-fast with
settings that diverge (lr 1.0, weight_decay 10, warmup 0, grad_clip 1000; abuse_bounds.py):
both runs must end "diverged", and what its page reads must be valid JSON with no
traceback and no path of the server's.

Before that comes the socket flood (benchmarks/socket_flood.py, a child process): up to
`--flood-sockets` idle or half-sent (`GET / HTTP/1.1\r\n`) sockets from `--flood-addresses`
loopback addresses of its own, reopened as the lab closes them, for `--flood-seconds`. Once
the flood holds its sockets, the honest browser starts a second pair and presses Crash test
on its run A; the flood goes on until it has (at most 120 s past `--flood-seconds`).
GET /api/health is polled every 0.1 s from 127.0.0.1 throughout. It prints the sockets
the attacker held and how the others ended, health p50/p99/max, and whether that crash
test's resume was bit-identical. Run-time numbers vary with the machine; the tests assert
the behaviour (tests/integration/test_server_hardening.py, test_front_door.py). Exit 1
when an honest pair did not finish with a bit-identical resume, a request got a 5xx, a
disk hog got through, the diverging pair did not end diverged or leaked, a health request
failed during the flood, the server logged a traceback or ran out of open
files, or a poller (or the flood) measured nothing.
"""

from __future__ import annotations

import argparse
import os
import queue
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

from abuse_bounds import disk_hogs, diverging_pair, repo_paths  # noqa: E402
from abuse_student import (  # noqa: E402  siblings: benchmarks run as scripts
    CRASH_MARGIN,
    ENDED,
    FINISH_TIMEOUT_S,
    CrashTest,
    Poller,
    compared_identically,
    pct,
    wait_runs,
)
from socket_flood import EXTRA_S as FLOOD_EXTRA_S  # noqa: E402
from socket_flood import FloodSize, FloodSummary, start_flood  # noqa: E402

from tests.support.lab import free_port, spawn_server  # noqa: E402

TOKEN = "abuse-benchmark-instructor-token"
EVIL = "https://evil.example"
# Requests per attack and round: (full, --smoke). The smoke sizes still pass every limit
# they probe: 3 pairs per address, 10 wrong tokens a minute, 64 streams per address.
SIZES = {"pairs": (40, 8), "tokens": (40, 12), "streams": (100, 70), "origins": (20, 8)}


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1, help="multiply every attack's requests")
    p.add_argument("--steps", type=int, default=1200, help="steps of the honest runs (quick: 300)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="CI size: fewer requests, 400 steps, a flood of 300 sockets from 1 address for 8 s",
    )
    p.add_argument(
        "--flood-sockets", type=int, default=2000, help="sockets the flood keeps open (10-20000)"
    )
    p.add_argument("--flood-addresses", type=int, default=4, help="its loopback addresses (1-200)")
    p.add_argument("--flood-seconds", type=float, default=30, help="how long it floods (5-600 s)")
    args = p.parse_args()
    if args.smoke:
        args.steps = 400
        args.flood_sockets, args.flood_addresses, args.flood_seconds = 300, 1, 8.0
    if args.rounds < 1 or args.steps <= CRASH_MARGIN:
        p.error(f"--rounds ≥ 1, --steps > {CRASH_MARGIN}")
    flood = FloodSize(args.flood_sockets, args.flood_addresses, args.flood_seconds)
    if problem := flood.problem():
        p.error(problem)
    with tempfile.TemporaryDirectory(prefix="crashdrill-abuse-") as tmp:
        port = free_port()
        env = {**os.environ, "CRASHDRILL_INSTRUCTOR_TOKEN": TOKEN, "CRASHDRILL_TELEMETRY": "0"}
        log = Path(tmp) / "server.log"
        server = spawn_server(port, env, log, "--data-dir", str(Path(tmp) / "lab"))
        base = f"http://127.0.0.1:{port}"
        try:
            secret = [str(Path(tmp).resolve()), *repo_paths()]
            code = run_attacks(base, args.rounds, args.steps, args.smoke, flood, secret)
        finally:
            server.terminate()
            server.wait(30)
        text = log.read_text(errors="replace")
        tracebacks, emfile = text.count("Traceback"), text.count("Too many open files")
        print(f"server log: {tracebacks} tracebacks, {emfile} × Too many open files")
        return code if tracebacks == emfile == 0 else 1


def run_attacks(
    base: str, rounds: int, steps: int, smoke: bool, flood_size: FloodSize, secret: list[str]
) -> int:
    """`secret`: paths of the server's that no student answer may hold."""
    size = {name: n[1] if smoke else n[0] for name, n in SIZES.items()}
    honest = httpx.Client(base_url=base, timeout=30)  # its cookie: the honest browser
    made = honest.post("/api/pairs", json={"preset": "quick", "overrides": {"steps": steps}})
    made.raise_for_status()
    pair = made.json()["pair"]
    run_a = made.json()["runs"][0]["id"]
    poller = Poller(f"{base}/api/pairs/{pair}")
    poller.start()
    rows: list[tuple[str, Counter[str], Counter[int], str]] = []
    crash = CrashTest(honest, pair, run_a, steps)
    crasher = threading.Thread(target=crash.when_ready, daemon=True)
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
    o, c, note = disk_hogs(base, rounds)
    rows.append(("disk-hog overrides", o, c, note))
    hogs_through = o["through"]
    attack_s = time.monotonic() - t0
    attack_latencies = list(poller.latencies)
    crasher.join(FINISH_TIMEOUT_S)
    flood = flood_phase(base, honest, steps, flood_size)
    runs = wait_runs(
        honest, pair, lambda rs: all(r["state"] in ("finished", "failed") for r in rs), "the end"
    )
    poller.stop_flag.set()
    checks = honest.get(f"/api/runs/{run_a}/resume-checks").json()["checks"]
    diverged = diverging_pair(base, secret)

    print(f"{'attack':<26} {'sent':>5} {'refused':>8} {'5xx':>4} {'through':>8}  statuses")
    for name, outcomes, codes, note in rows:
        statuses = " ".join(f"{k}×{v}" for k, v in sorted(codes.items()))
        print(
            f"{name:<26} {sum(outcomes.values()):>5} {outcomes['refused']:>8}"
            f" {outcomes['5xx']:>4} {outcomes['through']:>8}  {statuses}  {note}".rstrip()
        )
    identical = compared_identically(checks)
    print()
    print(f"honest pair: {[r['state'] for r in runs]}, crash test on A: {crash.text()},")
    print(f"  resume checks of A: {len(checks)}, bit-identical: {identical}")
    for ch in checks:
        if ch["expected_points"] and ch["bit_identical"] is not True:  # say what it measured
            shown = {k: v for k, v in ch.items() if not isinstance(v, dict | list)}
            print(f"  not bit-identical: {shown}")
    ms = [x * 1000 for x in attack_latencies]
    print(
        f"GET /api/pairs/{{id}} during the attack ({attack_s:.0f} s, {len(ms)} requests,"
        f" {poller.errors} failed): p50 {pct(ms, 0.5):.0f} ms, p99 {pct(ms, 0.99):.0f} ms,"
        f" max {max(ms, default=float('nan')):.0f} ms"
        + (f", mean {statistics.fmean(ms):.0f} ms" if ms else "")
    )
    five_xx = sum(o["5xx"] for _, o, _, _ in rows)
    flood_ok = flood.report()
    diverge_ok = diverged.report()
    if not ms:
        print("the poller took no sample during the attack: nothing measured")
        return 1
    ok = identical and all(r["state"] == "finished" for r in runs) and five_xx == 0
    return 0 if ok and flood_ok and diverge_ok and hogs_through == 0 else 1


class FloodOutcome:
    def __init__(self, summary: FloodSummary | None, health: Poller, crash: CrashTest) -> None:
        self.summary, self.health, self.crash = summary, health, crash
        self.runs: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []

    def report(self) -> bool:
        """Print the flood's rows; True when it measured something and the lab held."""
        f = self.summary
        print()
        if f is None:
            print("socket flood: the attacker's process reported nothing: nothing measured")
            return False
        print(
            f"socket flood: {f.sockets} sockets from {f.addresses} address(es) for {f.seconds:.0f}"
            f" s: opened {f.opened}, refused with 503 {f.refused_503}, closed with 408"
            f" {f.closed_408}, closed silently {f.closed_silently}, connects failed"
            f" {f.connect_failed}"
        )
        print(f"  sockets held by the attacker: {f.held_text()}")
        ms = [x * 1000 for x in self.health.latencies]
        print(
            f"GET /api/health during the flood ({len(ms)} requests, {self.health.errors}"
            f" failed): p50 {pct(ms, 0.5):.0f} ms, p99 {pct(ms, 0.99):.0f} ms,"
            f" max {max(ms, default=float('nan')):.0f} ms"
        )
        identical = compared_identically(self.checks)
        print(
            f"crash test during the flood: {self.crash.text()}, flood pair"
            f" {[r['state'] for r in self.runs]},"
        )
        print(f"  resume checks of A: {len(self.checks)}, bit-identical: {identical}")
        finished = bool(self.runs) and all(r["state"] == "finished" for r in self.runs)
        return bool(f.held and ms) and self.health.errors == 0 and identical and finished


def flood_phase(base: str, honest: httpx.Client, steps: int, size: FloodSize) -> FloodOutcome:
    """The socket flood; once it holds its sockets, the honest browser starts a second pair
    and presses Crash test on its run A; the flood goes on until that is done."""
    health = Poller(f"{base}/api/health")
    health.start()
    port = int(base.rsplit(":", 1)[1])
    child, results, stop = start_flood(port, size.sockets, size.addresses, size.seconds)
    time.sleep(min(3.0, size.seconds / 2))  # the flood ramps up at 1000 sockets a second
    made = honest.post("/api/pairs", json={"preset": "quick", "overrides": {"steps": steps}})
    started = made.status_code == 201
    pair, run_a = (made.json()["pair"], made.json()["runs"][0]["id"]) if started else ("", "")
    crash = CrashTest(honest, pair, run_a, steps, deadline_s=FLOOD_EXTRA_S)
    if started:
        crash.when_ready()
    else:  # past max_connections every address is refused: the limit of a cap in all
        crash.notes.append(f"the pair was refused: {made.status_code} {made.text.strip()!r}")
    stop.set()
    try:  # before join: a child does not exit while its queue holds unread data
        summary: FloodSummary | None = FloodSummary(**results.get(timeout=size.seconds + 200))
    except queue.Empty:
        summary = None
    child.join(60)
    health.stop_flag.set()
    outcome = FloodOutcome(summary, health, crash)
    if started:
        outcome.runs = wait_runs(
            honest, pair, lambda rs: all(r["state"] in ENDED for r in rs), "the flood pair's end"
        )
        outcome.checks = honest.get(f"/api/runs/{run_a}/resume-checks").json()["checks"]
    return outcome


if __name__ == "__main__":
    sys.exit(main())
