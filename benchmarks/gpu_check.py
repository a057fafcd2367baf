"""GPU truth: the lab's CUDA paths run and measured on one GPU, in one prepared check that
finishes in under 10 minutes.

    python benchmarks/gpu_check.py --out gpu.json                  # on a machine with CUDA
    python benchmarks/gpu_check.py --out gpu.json --only nvml,lab  # some parts only
    python benchmarks/gpu_check.py --device cpu --smoke --out s.json  # every code path, CPU

Five parts, each with its own time budget (seconds, CUDA sizes; the total is 540 s):
  versions    (15)  device, driver, CUDA, cuDNN and torch versions
  throughput (105)  the CUDA variants of `quick` and `lesson-1.7` (6L·384d, ctx 256, batch
                    32, bf16): tokens/s and MFU against the card's dense bf16 peak
  verify     (200)  `crashdrill verify` on a CUDA copy of `quick` in fp32 and in bf16, three
                    kills each, one of them inside a checkpoint write; bit-identical or fail
  nvml        (50)  every NVML field of the machine panel sampled for 30 s while lesson 1.7
                    trains; which are supported, their values, the energy counter's delta
                    against ∫ power dt
  lab        (170)  `crashdrill serve` on a free loopback port, a lesson-1.7 pair with one
                    Crash test per run through the API, and the lab's resume checks
A part that fails records its error and the others still run; a part that runs out of
its budget is stopped and keeps what it measured so far.

Exit codes: 0 every part ran and every resume was bit-identical; 0 as well, with
`"status": "skipped"` in the JSON, when there is no CUDA device and `--device cpu` was not
given (so a CI without a GPU can run it); 1 a resume was not bit-identical or a part
failed; 2 bad usage. Results and how to read them: docs/gpu.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_check_common import SIZES, SMOKE, Check  # siblings: benchmarks run as scripts
from gpu_check_live import part_lab, part_nvml
from gpu_check_runs import part_throughput, part_verify, part_versions

SCHEMA = "crashdrill.gpu_check/1"
PARTS = ("versions", "throughput", "verify", "nvml", "lab")
# Caps, not expectations: a part that is done early ends early. 540 s in all, so that a
# machine's 10-minute slot also holds the setup and the interpreter's start.
BUDGETS_S = {"versions": 15.0, "throughput": 105.0, "verify": 200.0, "nvml": 50.0, "lab": 170.0}
SMOKE_BUDGETS_S = {"versions": 20.0, "throughput": 60.0, "verify": 90.0, "nvml": 30.0, "lab": 90.0}
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


# ------------------------------------------------------------------ running the parts


def run_parts(
    check: Check,
    names: list[str],
    budgets: dict[str, float],
    after_each: Callable[[dict[str, Any]], None] = lambda results: None,
) -> dict[str, Any]:
    """Each part in turn within its budget; `after_each(results so far)` after every one."""
    funcs: dict[str, Callable[[Check], dict[str, Any]]] = {
        "versions": part_versions,
        "throughput": part_throughput,
        "verify": part_verify,
        "nvml": part_nvml,
        "lab": part_lab,
    }
    results: dict[str, Any] = {}
    for name in names:
        t0 = time.monotonic()
        check.deadline = t0 + budgets[name]
        print(f"== {name} (budget {budgets[name]:.0f} s)", flush=True)
        try:
            result = funcs[name](check)
        except Exception as exc:
            result = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=6),
            }
        result.setdefault("ok", "error" not in result)
        result.update(seconds=round(time.monotonic() - t0, 1), budget_s=budgets[name])
        results[name] = result
        for line in describe(name, result):
            print(f"  {line}", flush=True)
        after_each(results)
    return results


def describe(name: str, r: dict[str, Any]) -> list[str]:
    """A part's result in a few lines for the terminal (the JSON file has all of it)."""
    lines: list[str] = []
    if name == "versions":
        skip = ("nvidia_smi", "ok", "error", "seconds", "budget_s")
        lines = [f"{k}: {v}" for k, v in r.items() if k not in skip]
    elif name == "throughput":
        for preset, p in r.get("presets", {}).items():
            lines.append(
                f"{preset} ({p.get('shape')}, {p.get('precision')}, {p.get('device_name')}): "
                f"{p.get('tokens_per_s_median')} tokens/s median over {p.get('timed_steps')} "
                f"steps; MFU {p.get('mfu_trainer_median')} of the {p.get('precision')} peak, "
                f"{p.get('mfu_bf16_peak')} of the dense bf16 peak"
            )
            lines += [f"{preset}: {p['error']}"] if p.get("error") else []
    elif name == "verify":
        for precision, p in r.get("precisions", {}).items():
            lines.append(
                f"{precision}: {p.get('verdict')}, resumes bit-identical "
                f"{[x['bit_identical'] for x in p.get('resumes', [])]}, kill inside a "
                f"checkpoint write: {p.get('kill_in_checkpoint_write')}, final weights equal: "
                f"{p.get('final_state_equal')}, {p.get('wall_seconds')} s"
            )
            lines += [f"{precision}: {p['error']}"] if p.get("error") else []
    elif name == "nvml" and "fields" in r:
        lines.append(f"{r['gpu_name']} ({r['gpu_state']}; {r['gpu_reason'] or 'ok'})")
        for field, f in r["fields"].items():
            seen = f"{f['median']} ({f['min']} .. {f['max']})" if f["supported"] else "unsupported"
            lines.append(f"{field:<18} {seen}")
        lines.append(f"energy: {r['energy']}")
    elif name == "lab":
        for label, run in r.get("runs", {}).items():
            lines.append(f"run {label}: {run['state']}, bit-identical {run['bit_identical']}")
    lines.append(f"{'ok' if r['ok'] else 'FAILED'} in {r['seconds']} s of {r['budget_s']:.0f}")
    if r.get("error"):
        lines.append(f"error: {r['error']}")
    return lines


def verdict(parts: dict[str, Any]) -> tuple[str, bool | None, int]:
    """(status, every resume bit-identical (None: no resume ran), exit code)."""
    flags = [p["bit_identical"] for p in parts.values() if p.get("bit_identical") is not None]
    identical = all(flags) if flags else None
    ok = all(p.get("ok") for p in parts.values()) and identical is not False
    return ("pass" if ok else "fail"), identical, (EXIT_OK if ok else EXIT_FAILED)


def cuda_missing() -> str | None:
    """Why this machine cannot run the CUDA check, or None when it can."""
    import torch

    if torch.version.cuda is None:
        return f"no CUDA device: torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none"
    return None


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", default="gpu.json", help="the JSON file with every result")
    ap.add_argument("--only", help=f"comma-separated parts: {', '.join(PARTS)} (default all)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: the code paths, no numbers")
    ap.add_argument("--work-dir", help="keep run dirs and logs here (default: a temp dir)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in (args.only or ",".join(PARTS)).split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown or not names:
        print(f"gpu_check: --only {args.only!r}: parts are {', '.join(PARTS)}", file=sys.stderr)
        return EXIT_USAGE
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": args.device,
        "smoke": args.smoke,
        "parts_requested": names,
    }
    missing = cuda_missing() if args.device == "cuda" else None
    if missing:
        print(f"skipped: {missing}; nothing was measured (--device cpu runs it on the CPU)")
        report.update(status="skipped", reason=missing, bit_identical=None, exit_code=EXIT_OK)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        return EXIT_OK
    budgets = SMOKE_BUDGETS_S if args.smoke else BUDGETS_S
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    check = Check(args.device, SMOKE if args.smoke else SIZES, work)
    t0 = time.monotonic()
    out = Path(args.out)
    report["budgets_s"] = {n: budgets[n] for n in names}

    def save_so_far(parts: dict[str, Any]) -> None:
        # Written after every part: a check stopped from outside keeps what it measured.
        report.update(status="running", parts=parts)
        out.write_text(json.dumps(report, indent=1, default=str) + "\n")

    try:
        parts = run_parts(check, names, budgets, save_so_far)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    status, identical, code = verdict(parts)
    report.update(
        status=status,
        reason=None,
        bit_identical=identical,
        exit_code=code,
        wall_seconds=round(time.monotonic() - t0, 1),
        parts=parts,
    )
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    failed = [n for n, p in parts.items() if not p.get("ok")]
    print(
        f"gpu_check: {status}; bit-identical: {identical}; failed parts: {failed or 'none'}; "
        f"{report['wall_seconds']} s; written to {args.out}"
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
