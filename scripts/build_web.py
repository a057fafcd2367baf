"""Set up the lab page's third-party code from the npm registry: uPlot (the charts) and
supabase-js (only loaded when the server has Supabase Realtime configured), and the
linter of the page's own modules, eslint (package.json's devDependencies; eslint.config.mjs;
`python3 quickstart.py test` runs it).

    python scripts/build_web.py               # npm ci when needed, copy to web/static/vendor/
    python scripts/build_web.py --no-install  # copy only (node_modules/ already there)

No bundler, no build step beyond the copy: the page is plain JS modules in web/static/.
Versions are pinned in package.json (and package-lock.json); node_modules/ and
web/static/vendor/ are gitignored, never committed. Without the vendor files the page
still works: it says that the charts are missing, and follows the server's SSE stream
instead of Realtime.
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
# npm package -> (file in the package, name in web/static/vendor/)
VENDORED: dict[str, tuple[tuple[str, str], ...]] = {
    "uplot": (
        ("dist/uPlot.iife.min.js", "uPlot.iife.min.js"),
        ("dist/uPlot.min.css", "uPlot.min.css"),
    ),
    # The browser (UMD) bundle: a classic script that defines window.supabase.
    "@supabase/supabase-js": (("dist/umd/supabase.js", "supabase.js"),),
}
FILES = tuple(name for files in VENDORED.values() for _, name in files)
TOOLS = ("eslint",)  # installed with the rest, never copied anywhere


def pinned_version(package: str = "uplot") -> str:
    meta = json.loads((ROOT / "package.json").read_text(encoding="utf-8"))
    deps = {**meta.get("devDependencies", {}), **meta["dependencies"]}
    return str(deps[package])


def installed_version(package: str = "uplot") -> str | None:
    try:
        meta = json.loads((ROOT / "node_modules" / package / "package.json").read_text("utf-8"))
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
    # --no-install copies what is there: the vendored packages must be; the tools (a dev
    # dependency, left out of an image's `npm ci --omit=dev`) need not.
    wanted_here = tuple(VENDORED) if args.no_install else (*VENDORED, *TOOLS)
    stale = [p for p in wanted_here if installed_version(p) != pinned_version(p)]
    if args.no_install:
        for tool in TOOLS:
            if installed_version(tool) != pinned_version(tool):
                version = pinned_version(tool)
                print(f"build_web: no {tool} {version} in node_modules (not needed to copy)")
    if stale:
        if args.no_install:
            wanted = ", ".join(f"{p} {pinned_version(p)}" for p in stale)
            print(f"build_web: node_modules lacks {wanted}; run without --no-install")
            return 2
        npm_install()
    VENDOR.mkdir(parents=True, exist_ok=True)
    for package, files in VENDORED.items():
        for source, name in files:
            shutil.copyfile(ROOT / "node_modules" / package / source, VENDOR / name)
        names = ", ".join(name for _, name in files)
        where = VENDOR.relative_to(ROOT)
        print(f"build_web: {package} {pinned_version(package)} -> {where}/ ({names})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
