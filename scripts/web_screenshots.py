"""Screenshots of a finished lesson with one crash test per run, for the README, and the
page's first-render time and JS weight.

    python scripts/build_web.py                          # uPlot first
    python scripts/web_screenshots.py                    # lesson-1.7 -> docs/lab-*.png (minutes)
    python scripts/web_screenshots.py --preset quick --crash-a 80 --crash-b 200 --out /tmp/shots

It starts the real server (`crashdrill serve`) on a free port with a throwaway data dir,
drives Debian's Chromium (/usr/bin/chromium) through Playwright, crashes run A after
step --crash-a and run B after step --crash-b, waits for both to finish, and saves
lab-top.png (header, both runs' controls, resume checks, the lesson, the loss chart),
lab-laptop.png (the whole page at 1280 px) and lab-phone.png (390 px).
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "web" / "static"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def js_weight() -> tuple[int, int]:
    """(raw, gzipped) bytes of every script the page loads."""
    files = [*sorted(STATIC.glob("*.js")), STATIC / "vendor" / "uPlot.iife.min.js"]
    raw = sum(f.stat().st_size for f in files if f.exists())
    gz = sum(len(gzip.compress(f.read_bytes(), 9)) for f in files if f.exists())
    return raw, gz


def start_server(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(data_dir / "serve.log", "wb")  # noqa: SIM115 (lives as long as the server)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "crashdrill",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
            "--max-concurrent",
            "2",
            "--stop-runs-on-exit",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(150):
        if proc.poll() is not None:
            sys.exit((data_dir / "serve.log").read_text())
        try:
            urllib.request.urlopen(url + "/api/presets", timeout=2).close()
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    sys.exit("the server did not come up:\n" + (data_dir / "serve.log").read_text())


def wait_step(page, label: str, n: int) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_function(
        "([l, n]) => parseInt(document.querySelector(`.run-${l} .steps`)"
        ".textContent.replace(/,/g, ''), 10) >= n",
        arg=[label, n],
        timeout=900_000,
    )


def answer_prediction(page, predicted: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    """Answer the lesson's question as a student would: `predicted` holds a number per run
    (a choice lesson takes its first choice)."""
    for field in page.locator("#predict [name]").all():
        name = field.get_attribute("name") or ""
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_index(1)
        else:
            field.fill(predicted.get(name, "0"))
    page.click("#predict .predict-submit")
    page.locator("#predict[data-asking=false]").wait_for()


def crash(page, label: str, predicted: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_function(
        "(l) => !document.querySelector(`.run-${l} .crash`).disabled", arg=label, timeout=900_000
    )
    page.click(f".run-{label} .crash")
    if page.locator("#predict[data-asking=true]").count():  # the first crash asks first
        answer_prediction(page, predicted)
    print(
        f"crashed {label} at step {page.locator(f'.run-{label} .steps').inner_text()}", flush=True
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="lesson-1.7")
    p.add_argument("--crash-a", type=int, default=1130)
    p.add_argument("--crash-b", type=int, default=1450)
    p.add_argument("--predict", default="A=100,B=500", help="the prediction's numbers, run=steps,…")
    p.add_argument("--out", default=str(ROOT / "docs"))
    p.add_argument("--chromium", default=os.environ.get("CRASHDRILL_CHROMIUM", "/usr/bin/chromium"))
    args = p.parse_args()
    from playwright.sync_api import sync_playwright

    # A SIGTERM (timeout, kill) must still stop the server and its trainers: `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="crashdrill-shots-"))
    proc, url = start_server(data_dir)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            ctx = browser.new_context(viewport={"width": 1280, "height": 900})
            page = ctx.new_page()
            page.goto(f"{url}/?preset={args.preset}")
            page.locator("#start:not([disabled])").click()
            page.locator(".run-card.run-B").wait_for()
            wait_step(page, "A", args.crash_a)
            predicted = dict(kv.split("=", 1) for kv in args.predict.split(",") if "=" in kv)
            crash(page, "A", predicted)
            wait_step(page, "B", args.crash_b)
            crash(page, "B", predicted)
            page.wait_for_function(
                "() => document.body.dataset.pairState === 'done'", timeout=1_800_000
            )
            page.wait_for_timeout(3000)
            # First render of the finished lesson in a fresh tab: shell, then the history.
            fresh = ctx.new_page()
            t0 = time.perf_counter()
            fresh.goto(page.url)
            fresh.wait_for_function("() => document.body.dataset.loaded === 'true'")
            loaded_s = time.perf_counter() - t0
            fcp = fresh.evaluate(
                "() => (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime"
            )
            history_ms = fresh.evaluate("() => document.body.dataset.historyMs")
            fresh.wait_for_timeout(2500)
            fresh.screenshot(path=str(out / "lab-laptop.png"), full_page=True)
            loss = fresh.locator("#chart-loss").bounding_box()
            fresh.screenshot(
                path=str(out / "lab-top.png"),
                clip={"x": 0, "y": 0, "width": 1280, "height": loss["y"] + loss["height"] + 8},
                full_page=True,
            )
            fresh.set_viewport_size({"width": 390, "height": 844})
            fresh.wait_for_timeout(1000)
            fresh.screenshot(path=str(out / "lab-phone.png"), full_page=True)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(20)
        shutil.rmtree(data_dir, ignore_errors=True)
    raw, gz = js_weight()
    print(
        f"first contentful paint {fcp:.0f} ms; history loaded and drawn {loaded_s * 1000:.0f} ms"
        f" (fetch + ingest {history_ms} ms);"
        f" JS {raw / 1024:.1f} KiB raw, {gz / 1024:.1f} KiB gzipped"
    )
    print(f"saved lab-top.png, lab-laptop.png and lab-phone.png in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
