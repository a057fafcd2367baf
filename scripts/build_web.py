"""Set up the lab page's only third-party code: uPlot, from the npm registry.

    python scripts/build_web.py               # npm ci when needed, copy to web/static/vendor/
    python scripts/build_web.py --no-install  # copy only (node_modules/ already there)

No bundler, no build step beyond the copy: the page is plain JS modules in web/static/.
uPlot's version is pinned in package.json (and package-lock.json); node_modules/ and
web/static/vendor/ are gitignored, never committed. Without the vendor files the page
still works and says that the charts are missing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "web" / "static" / "vendor"
FILES = ("uPlot.iife.min.js", "uPlot.min.css")


def pinned_version() -> str:
    return json.loads((ROOT / "package.json").read_text(encoding="utf-8"))["dependencies"]["uplot"]


def installed_version() -> str | None:
    try:
        meta = json.loads((ROOT / "node_modules" / "uplot" / "package.json").read_text("utf-8"))
    except FileNotFoundError:
        return None
    return str(meta.get("version"))


def npm_install() -> None:
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("build_web: npm is not installed (Debian: apt-get install -y npm)")
    lock = (ROOT / "package-lock.json").exists()
    cmd = [npm, "ci" if lock else "install", "--no-audit", "--no-fund", "--loglevel=error"]
    print("build_web:", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-install", action="store_true", help="copy only; never run npm")
    args = parser.parse_args(argv)
    want = pinned_version()
    if installed_version() != want:
        if args.no_install:
            print(f"build_web: node_modules/uplot is not {want}; run without --no-install")
            return 2
        npm_install()
    dist = ROOT / "node_modules" / "uplot" / "dist"
    VENDOR.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copyfile(dist / name, VENDOR / name)
    print(f"build_web: uPlot {want} -> {VENDOR.relative_to(ROOT)}/ ({', '.join(FILES)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
