"""What the lab page itself costs while a pair trains: the same lesson run twice on the
real server, once with nobody watching and once with Chromium showing the page.

    python scripts/build_web.py                       # uPlot first
    .venv/bin/python scripts/page_cpu.py              # lesson-1.7-fast (about two minutes)
    .venv/bin/python scripts/page_cpu.py --preset browser --width 390 --height 844

It prints the pair's wall time without and with the page, the CPU seconds Chromium's
processes used while the pair ran (all of them: browser, renderer, GPU process), and the
renderer's own busy time from the DevTools Performance domain (script, layout, style).
On a machine with two cores every CPU second the page takes is a second the trainers wait.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from web_screenshots import CHROMIUM_ARGS, start_server

TERMINAL = {"finished", "failed", "stopped"}
METRICS = ("TaskDuration", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration")


def headless_pair(url: str, preset: str, timeout_s: float) -> float:
    """Seconds from POST /api/pairs to both runs finished, with no page open."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    body = json.dumps({"preset": preset}).encode()
    req = urllib.request.Request(
        url + "/api/pairs",
        data=body,
        headers={"Content-Type": "application/json", "Origin": url},
        method="POST",
    )
    t0 = time.monotonic()
    with opener.open(req, timeout=30) as r:
        pair = json.load(r)["pair"]
    while time.monotonic() - t0 < timeout_s:
        with opener.open(f"{url}/api/pairs/{pair}", timeout=30) as r:
            runs = json.load(r)["runs"]
        if all(run["state"] in TERMINAL for run in runs):
            return time.monotonic() - t0
        time.sleep(0.25)
    raise SystemExit(f"the pair without a page did not finish within {timeout_s:.0f} s")


class ChromiumCpu:
    """CPU seconds of every Chromium process that is a descendant of this one; processes
    that exit in between keep their last reading."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}

    def sample(self) -> float:
        for p in psutil.Process().children(recursive=True):
            try:
                if "chrom" not in p.name():
                    continue
                t = p.cpu_times()
                self.seen[p.pid] = t.user + t.system
            except psutil.Error:
                continue
        return sum(self.seen.values())


def watched_pair(url: str, args: argparse.Namespace) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": args.width, "height": args.height})
        page = ctx.new_page()
        page.goto(f"{url}/?preset={args.preset}")
        page.locator("#start:not([disabled])").wait_for()
        cdp = ctx.new_cdp_session(page)
        cdp.send("Performance.enable")
        cpu = ChromiumCpu()
        before = cpu.sample()
        m0 = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        t0 = time.monotonic()
        page.locator("#start").click()
        deadline = t0 + args.timeout
        while page.evaluate("() => document.body.dataset.pairState") != "done":
            if time.monotonic() > deadline:
                raise SystemExit(f"the watched pair did not finish within {args.timeout:.0f} s")
            cpu.sample()
            page.wait_for_timeout(500)
        wall = time.monotonic() - t0
        used = cpu.sample() - before
        m1 = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        browser.close()
    out = {"wall_s": wall, "chromium_cpu_s": used}
    for name in METRICS:
        out[name] = m1.get(name, 0.0) - m0.get(name, 0.0)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="lesson-1.7-fast")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=800)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--skip-headless", action="store_true", help="only the watched pair")
    p.add_argument("--chromium", default=os.environ.get("CRASHDRILL_CHROMIUM", "/usr/bin/chromium"))
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    data_dir = Path(tempfile.mkdtemp(prefix="crashdrill-page-cpu-"))
    proc, url = start_server(data_dir)
    try:
        alone = None if args.skip_headless else headless_pair(url, args.preset, args.timeout)
        watched = watched_pair(url, args)
    finally:
        proc.terminate()
        proc.wait(20)
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"preset {args.preset} at {args.width}x{args.height}, {psutil.cpu_count()} cores")
    if alone is not None:
        print(f"pair with no page open: {alone:.1f} s")
    w = watched
    cpu = w["chromium_cpu_s"]
    print(
        f"pair with the page open: {w['wall_s']:.1f} s; Chromium used {cpu:.1f} CPU s"
        f" ({cpu / w['wall_s'] * 100:.0f}% of one core)"
    )
    print(
        "renderer main thread: busy {TaskDuration:.1f} s = script {ScriptDuration:.1f} s"
        " + layout {LayoutDuration:.1f} s + style {RecalcStyleDuration:.1f} s + other".format(**w)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
