"""Check the reverse proxy in front of a running lab (docker/test.sh; docs/docker.md#the-proxy).

    python3 docker/proxy_check.py forwarded --url http://127.0.0.1:8000 --lab-url http://127.0.0.1:8001
    python3 docker/proxy_check.py flood --url http://127.0.0.1:8000 --sockets 2000 --seconds 15
    python3 docker/proxy_check.py tls --url https://127.0.0.1:8000 --cafile cert.pem

forwarded: the lab counts students by the address the proxy saw, and nobody can choose
it. From 127.0.0.30 through the proxy, three browsers (no shared cookie) start a pair each
and a fourth gets 429 naming the per-address limit (`max_pairs_per_address`, 3); the same
address sending its own X-Forwarded-For through the proxy, and straight to the lab
(`--lab-url`, a peer the lab does not trust), gets 429 too; 127.0.0.31 through the proxy
starts a pair (the lab does not count the class as the proxy's one address). The last
pair's event stream (GET /api/stream) sends its first frame through the proxy at once.
Every pair is stopped at the end.

flood: benchmarks/socket_flood.py (idle and half-sent sockets from 127.0.0.10 and up,
bounded in count and time) against the proxy, GET /api/health from 127.0.0.1 every 0.1 s
on a new connection, as a new visitor would, and once the flood holds its sockets
docker/lab_check.py's crash test (a pair, run A crashed, its resume check
bit-identical). Prints the sockets the attacker held, health p50/p99/max against the goal
of 1 s, and the crash test's lines.

tls: GET /api/health over https with the proxy's certificate (`--cafile`): 200, the
lab's cookie Secure (it believes X-Forwarded-Proto from the proxy), HSTS set.

Exit 0 when the check held, 1 when not (FAILED <what>: why), 2 for bad arguments. Only the
standard library, as docker/lab_check.py.
"""

from __future__ import annotations

import argparse
import http.client
import queue
import ssl
import statistics
import sys
import threading
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from lab_check import Client, StepFailed, crash_test  # a sibling script
from socket_flood import EXTRA_S, FloodSize, FloodSummary, start_flood

ADDRESS_A, ADDRESS_B = "127.0.0.30", "127.0.0.31"
SPOOFED = "198.51.100.7"  # TEST-NET-2: nobody's
HEALTH_GOAL_S = 1.0


def _new_browser(url: str, source: str) -> Client:
    return Client(url, source=source)


def forwarded(url: str, lab_url: str, limit: int) -> None:
    pairs: list[tuple[Client, list[str]]] = []
    try:
        step = f"{limit} pairs from {ADDRESS_A} through the proxy"
        for _ in range(limit):
            browser = _new_browser(url, ADDRESS_A)
            status, body = browser.call("POST", "/api/pairs", {"preset": "quick"})
            if status != 201:
                raise StepFailed(step, f"a pair was refused: {status} {body}")
            pairs.append((browser, [r["id"] for r in body["runs"]]))
        print(f"ok   {limit} pairs started from {ADDRESS_A} (each in a browser of its own)")

        refusals = {
            "one more through the proxy": (url, {}),
            f"one more through the proxy, sending X-Forwarded-For: {SPOOFED}": (
                url,
                {"X-Forwarded-For": SPOOFED, "Forwarded": f"for={SPOOFED}"},
            ),
            f"one more straight to the lab, sending X-Forwarded-For: {SPOOFED}": (
                lab_url,
                {"X-Forwarded-For": SPOOFED, "X-Real-IP": SPOOFED},
            ),
        }
        for what, (base, headers) in refusals.items():
            browser = _new_browser(base, ADDRESS_A)
            status, body = browser.call("POST", "/api/pairs", {"preset": "quick"}, headers)
            if status == 201:
                pairs.append((browser, [r["id"] for r in body["runs"]]))
            if status != 429 or "your address" not in str(body):
                raise StepFailed(
                    f"{ADDRESS_A}: {what}",
                    f"expected 429 (the per-address limit), got {status}: {body}",
                )
            print(f"ok   {what}: 429 (the lab counted {ADDRESS_A})")

        step = f"a pair from {ADDRESS_B} through the proxy"
        browser = _new_browser(url, ADDRESS_B)
        status, body = browser.call("POST", "/api/pairs", {"preset": "quick"})
        if status != 201:
            raise StepFailed(step, f"{status}: {body} (does the lab trust the proxy's address?)")
        pairs.append((browser, [r["id"] for r in body["runs"]]))
        print(f"ok   {step}: 201 (the lab told the two addresses apart)")
        first_frame(url, browser, body["pair"])
    finally:
        for browser, runs in pairs:
            for run in runs:
                browser.call("POST", f"/api/runs/{run}/stop")
        if pairs:
            print(f"ok   stopped the {len(pairs)} pairs' runs")


def first_frame(url: str, browser: Client, pair: str) -> None:
    """The pair's event stream through the proxy: its first frame (`hello`) within 5 s."""
    step = "the event stream's first frame through the proxy"
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
    cookie = "; ".join(f"{c.name}={c.value}" for c in browser.jar)
    t0 = time.perf_counter()
    try:
        conn.request("GET", f"/api/stream?pair={pair}", headers={"Cookie": cookie})
        r = conn.getresponse()
        if r.status != 200:
            raise StepFailed(step, f"GET /api/stream answered {r.status}: {r.read(300)!r}")
        line = r.readline()
    except OSError as e:
        raise StepFailed(step, f"nothing within 5 s: {e}") from None
    finally:
        conn.close()
    if not line.startswith(b"event: hello") and not line.startswith(b"id:"):
        raise StepFailed(step, f"the first line was {line!r}")
    print(f"ok   {step} after {(time.perf_counter() - t0) * 1000:.0f} ms")


class HealthPoller(threading.Thread):
    """GET /api/health every 0.1 s, each on a new connection; latencies in seconds."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "", parts.port or 80
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
            try:
                conn.request("GET", "/api/health")
                r = conn.getresponse()
                r.read()
                if r.status != 200:
                    self.errors.append(f"{r.status}")
            except OSError as e:
                self.errors.append(type(e).__name__)
            finally:
                conn.close()
            self.latencies.append(time.perf_counter() - t0)
            self.stop.wait(0.1)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def flood(url: str, size: FloodSize, run_timeout: float) -> None:
    port = urllib.parse.urlsplit(url).port or 80
    health = HealthPoller(url)
    health.start()
    child, results, stop = start_flood(port, size.sockets, size.addresses, size.seconds)
    time.sleep(min(3.0, size.seconds / 2))  # it ramps up at 1000 sockets a second
    crashed: StepFailed | None = None
    t0 = time.monotonic()
    try:
        crash_test(Client(url), run_timeout)
    except StepFailed as e:
        crashed = e
    crash_s = time.monotonic() - t0
    stop.set()
    try:  # before join: a child does not exit while its queue holds unread data
        summary: FloodSummary | None = FloodSummary(**results.get(timeout=size.seconds + EXTRA_S))
    except queue.Empty:
        summary = None
    child.join(30)
    health.stop.set()
    health.join(15)

    if summary is None or not summary.held:
        raise StepFailed("socket flood", "the attacker's process reported nothing")
    f = summary
    print(
        f"ok   socket flood: {f.sockets} sockets from {f.addresses} address(es) for"
        f" {f.seconds:.0f} s: opened {f.opened}, closed by the proxy {f.closed_silently},"
        f" 408 {f.closed_408}, 503 {f.refused_503}, connects failed {f.connect_failed}"
    )
    print(f"     sockets held by the attacker: {f.held_text()}")
    ms = [x * 1000 for x in health.latencies]
    p99 = pct(ms, 0.99)
    goal = "met" if p99 <= HEALTH_GOAL_S * 1000 and not health.errors else "MISSED"
    print(
        f"     GET /api/health during the flood ({len(ms)} requests on new connections,"
        f" {len(health.errors)} failed): p50 {pct(ms, 0.5):.0f} ms, p99 {p99:.0f} ms,"
        f" max {max(ms, default=float('nan')):.0f} ms, mean {statistics.fmean(ms):.0f} ms"
        f" (goal p99 within {HEALTH_GOAL_S:.0f} s: {goal})"
    )
    print(f"     the crash test took {crash_s:.0f} s under the flood")
    if crashed is not None:
        raise crashed
    if health.errors:
        raise StepFailed("GET /api/health during the flood", f"failed: {health.errors[:10]}")


def tls(url: str, cafile: str) -> None:
    step = "GET /api/health over https"
    context = ssl.create_default_context(cafile=cafile)
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPSConnection(
        parts.hostname or "", parts.port, context=context, timeout=10
    )
    try:
        conn.request("GET", "/api/health")
        r = conn.getresponse()
        r.read()
    except (OSError, ssl.SSLError) as e:
        raise StepFailed(step, str(e)) from None
    finally:
        conn.close()
    if r.status != 200:
        raise StepFailed(step, f"answered {r.status}")
    cookie = r.getheader("set-cookie") or ""
    if "secure" not in cookie.lower():
        raise StepFailed(step, f"the lab's cookie is not Secure over https: {cookie!r}")
    hsts = r.getheader("strict-transport-security")
    if not hsts:
        raise StepFailed(step, "no Strict-Transport-Security header")
    print(f"ok   {step}: 200, the lab's cookie Secure, HSTS {hsts}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=["forwarded", "flood", "tls"])
    parser.add_argument("--url", required=True, help="the lab through the proxy")
    parser.add_argument("--lab-url", help="forwarded: the lab itself, not through the proxy")
    parser.add_argument("--pairs-per-address", type=int, default=3, help="the lab's limit")
    parser.add_argument("--sockets", type=int, default=2000, help="flood: sockets (10-20000)")
    parser.add_argument("--addresses", type=int, default=4, help="flood: addresses (1-200)")
    parser.add_argument("--seconds", type=float, default=15, help="flood: at least (5-600 s)")
    parser.add_argument("--run-timeout", type=float, default=240.0)
    parser.add_argument("--cafile", help="tls: the certificate the proxy serves")
    args = parser.parse_args(argv)
    size = FloodSize(args.sockets, args.addresses, args.seconds)
    if args.check == "flood" and (problem := size.problem()):
        parser.error(problem.replace("--flood-", "--"))
    if args.check == "forwarded" and not args.lab_url:
        parser.error("forwarded needs --lab-url, the lab's own address (not the proxy's)")
    if args.check == "tls" and not args.cafile:
        parser.error("tls needs --cafile, the certificate the proxy serves")
    try:
        if args.check == "forwarded":
            forwarded(args.url, args.lab_url, args.pairs_per_address)
        elif args.check == "flood":
            flood(args.url, size, args.run_timeout)
        else:
            tls(args.url, args.cafile)
    except StepFailed as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
