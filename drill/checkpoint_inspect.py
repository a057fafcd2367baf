"""`crashdrill inspect PATH`: what a checkpoint holds, and what a full resume needs but it
lacks.

    crashdrill inspect runs/q                     # a crashdrill run dir: its newest checkpoint
    crashdrill inspect out/checkpoint-500         # a Hugging Face Trainer checkpoint
    crashdrill inspect ckpt.pt --json             # any torch.save file, as JSON for CI
    crashdrill inspect last.ckpt --require full   # exit 1 when a resume part is missing

The checkpoint is opened in a child process with a timeout (drill/checkpoint_open.py),
never by unpickling code: `torch.load(weights_only=True)`, safetensors and DCP headers,
JSON. What it holds is recognised from contents (drill/checkpoint_parts.py).

Exit codes: 0 read (whatever it lacks, unless --require), 1 --require named a part it
lacks, 2 bad usage, a path that does not exist, a file that is not a checkpoint (named for
what its first bytes say it might be: drill/file_sniff.py), or nothing in it could be read.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashdrill.drill.checkpoint_parts import Found, recognise, unflatten
from crashdrill.trainer.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE

SCHEMA = "crashdrill.inspect/1"
DEFAULT_TIMEOUT = 120.0

# The parts of a full resume, in report order, with their words. `needed`: what a
# resume cannot do without; the others only when the run uses them (the report says so).
PARTS = {
    "model": "model tensors",
    "optimizer": "optimizer state",
    "scheduler": "LR scheduler",
    "rng": "RNG states",
    "data": "data position",
    "step": "step counters",
    "amp": "AMP grad scaler",
}
NEEDED = ("model", "optimizer", "rng", "data", "step")
STREAMS = {"python": "Python", "numpy": "numpy", "torch": "torch CPU", "cuda": "CUDA"}
# When a loop needs an RNG stream that its checkpoint does not hold.
STREAM_USE = {
    "python": "needed only when the loop calls Python's random module",
    "numpy": "needed only when the loop draws from numpy's global random state",
    "torch": "needed only when the loop draws random numbers on the CPU with torch",
    "cuda": "needed only when the loop draws random numbers on the GPU",
}
WHEN_USED = {
    "scheduler": "needed only if the LR changes on a schedule",
    "amp": "needed only when training in float16 with a GradScaler",
}


class InspectError(Exception):
    """The path does not exist, or the checkpoint could not be opened at all."""


@dataclass
class Part:
    name: str
    status: str  # present, missing, empty, derived, unknown
    found: list[Found] = field(default_factory=list)
    note: str = ""

    @property
    def lacking(self) -> bool:
        return self.status in ("missing", "empty")

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "what": PARTS[self.name],
            "found": [
                {"where": f.where, "detail": f.detail, "by_name": f.by_name}
                | ({"stream": f.stream} if f.stream else {})
                for f in self.found
            ],
            "note": self.note,
        }


@dataclass
class Inventory:
    path: str
    checkpoint: str
    format: str
    files: list[dict[str, Any]]
    parts: dict[str, Part]
    notes: list[str]
    cannot_tell: list[str]

    @property
    def lacks(self) -> list[str]:
        """The parts a full resume needs that this checkpoint does not hold."""
        return [p.name for p in self.parts.values() if p.lacking]

    @property
    def streams(self) -> dict[str, int]:
        out = dict.fromkeys(STREAMS, 0)
        for f in self.parts["rng"].found:
            if f.stream:
                out[f.stream] += f.count
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "path": self.path,
            "checkpoint": self.checkpoint,
            "format": self.format,
            "files": self.files,
            "parts": {name: p.to_json() for name, p in self.parts.items()},
            "rng_streams": self.streams,
            "lacks": self.lacks,
            "notes": self.notes,
            "cannot_tell": self.cannot_tell,
        }


def open_checkpoint(path: str | Path, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """The child's description of PATH. Raises InspectError."""
    if not Path(path).exists():
        raise InspectError(f"{path}: no such file or directory")
    cmd = [sys.executable, "-m", "crashdrill.drill.checkpoint_open", str(path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise InspectError(f"{path}: opening it took more than {timeout:g} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise InspectError(f"{path}: could not be opened: {tail}")
    try:
        out: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        raise InspectError(f"{path}: the reader printed no description") from None
    return out


def inspect(path: str | Path, timeout: float = DEFAULT_TIMEOUT) -> Inventory:
    return inventory(open_checkpoint(path, timeout))


def inventory(desc: dict[str, Any]) -> Inventory:
    """What the parts are, from the child's description."""
    found: list[Found] = []
    files, cannot = [], []
    for f in desc["files"]:
        entry = {k: f[k] for k in ("name", "bytes") if k in f}
        if "tree" in f:
            tree = unflatten(f["tree"]) if f.get("flat") else f["tree"]
            found += recognise(tree, f"{f['name']}:")
            entry["read"] = True
        else:
            entry["read"] = False
            entry["error"] = f.get("error", "not read")
            if f.get("unsafe"):
                entry["unsafe_globals"] = f["unsafe"]
                cannot.append(
                    f"{f['name']}: not loaded — it needs {', '.join(f['unsafe'][:4])}, and"
                    " loading it would import and call them; what it holds is unknown"
                )
            else:
                cannot.append(f"{f['name']}: not read ({entry['error']})")
        if f.get("flat"):
            entry["data_files"] = f.get("data_files")
            entry["shard_ranks"] = f.get("shard_ranks") or []
            cannot.append(
                f"{f['name']}: DCP values that are not tensors (step counters, Python RNG "
                "states, param_groups) are pickled into the data files and not read: only "
                "their names are known"
            )
        files.append(entry)
    if len(files) == 1 and desc["files"][0].get("sniffed"):  # one file, and not a checkpoint
        raise InspectError(f"{desc['path']}: {files[0]['error']}")
    if files and not any(f["read"] for f in files):
        first = files[0].get("error", "not read")
        if files[0].get("unsafe_globals"):
            first += ": " + ", ".join(files[0]["unsafe_globals"][:6])
        raise InspectError(f"{desc['path']}: nothing in it could be read safely ({first})")
    if not files:
        raise InspectError(f"{desc['path']}: no checkpoint files found in it")
    fmt = desc["format"]
    trees = [f.get("tree", {}).get("dict", {}) for f in desc["files"]]
    if any("pytorch-lightning_version" in t for t in trees):
        fmt = "lightning"
    parts = {name: Part(name, "missing") for name in PARTS}
    for f in found:
        parts[f.part].found.append(f)
    for p in parts.values():
        if p.found:
            p.status = "present"
    opt = parts["optimizer"]
    if opt.found and all(f.empty for f in opt.found):
        opt.status, opt.note = "empty", "its per-parameter state is empty"
    ran = any(f.scheduler_ran for f in opt.found)
    sched = parts["scheduler"]
    if sched.status == "missing" and not ran:
        sched.status, sched.note = "unknown", WHEN_USED["scheduler"]
    elif sched.status == "missing":
        sched.note = "the optimizer's param groups hold initial_lr: a scheduler ran"
    amp = parts["amp"]
    if amp.status == "missing":
        amp.status, amp.note = "unknown", WHEN_USED["amp"]
    data = parts["data"]
    if data.status == "missing" and fmt == "huggingface" and parts["step"].found:
        data.status = "derived"
        data.note = (
            "not stored: the Trainer skips global_step batches of a loader reshuffled from "
            "the seed each epoch (exact only when the order is a function of seed and epoch)"
        )
    rng = parts["rng"]
    streams = {s: sum(f.count for f in rng.found if f.stream == s) for s in STREAMS}
    absent = [s for s, n in streams.items() if not n]
    if rng.found and absent:
        rng.note = "; ".join(f"{STREAMS[s]} RNG: not saved ({STREAM_USE[s]})" for s in absent)
    for p in parts.values():
        named = [f for f in p.found if f.by_name]
        if named and len(named) == len(p.found):
            p.note = (p.note + "; " if p.note else "") + "recognised by key name only"
    cannot.append(
        "whether the script restores what it saves: `crashdrill verify` tests the restore"
    )
    return Inventory(
        desc["path"],
        desc.get("checkpoint", desc["path"]),
        fmt,
        files,
        parts,
        list(desc.get("notes", [])),
        cannot,
    )


def missing_words(inv: Inventory) -> str:
    """The lacking parts in words: "optimizer state, RNG states"."""
    return ", ".join(PARTS[p] for p in inv.lacks)


def _mark(p: Part) -> str:
    return {"present": "✓", "derived": "~", "unknown": "?"}.get(p.status, "✗")


def table(inv: Inventory) -> str:
    size = sum(f.get("bytes") or 0 for f in inv.files)
    lines = [f"crashdrill inspect · {inv.checkpoint} · {inv.format} · {size:,} bytes"]
    for note in inv.notes:
        lines.append(f"  note: {note}")
    for f in inv.files:
        state = "read" if f["read"] else f"NOT READ: {f.get('error')}"
        name = f["name"]
        if f.get("data_files") is not None:  # DCP: the bytes are its data files'
            name += f" and {f['data_files']} data file(s)"
            ranks = f.get("shard_ranks") or []
            if ranks:
                which = ", ".join(map(str, ranks))
                name += f", written by {len(ranks)} rank(s): {which}"
        lines.append(f"  file {name} ({(f.get('bytes') or 0):,} bytes): {state}")
    lines.append("")
    for p in inv.parts.values():
        head = f"  {_mark(p)} {PARTS[p.name]:<16}"
        if p.found:
            shown = p.found[:4]
            more = f" (+{len(p.found) - 4} more)" if len(p.found) > 4 else ""
            lines.append(f"{head} {shown[0].where} — {shown[0].detail}")
            for found in shown[1:]:
                lines.append(f"  {'':<18} {found.where} — {found.detail}")
            if more:
                lines.append(f"  {'':<18}{more}")
            for note in p.note.split("; ") if p.note else []:
                lines.append(f"  {'':<18} {note}")
        else:
            lines.append(f"{head} {p.status}" + (f" — {p.note}" if p.note else ""))
    lines.append("")
    if inv.lacks:
        lines.append(f"  a full resume needs, and this checkpoint lacks: {missing_words(inv)}")
    else:
        lines.append("  nothing a full resume needs is missing")
    for c in inv.cannot_tell:
        lines.append(f"  cannot tell: {c}")
    return "\n".join(lines)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    doc = __doc__ or ""
    p = subparsers.add_parser(
        "inspect",
        help="what a checkpoint holds and what a full resume needs but it lacks",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return configure(p)


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("path", help="a checkpoint file or directory")
    p.add_argument("--json", action="store_true", help="print the inventory as JSON")
    p.add_argument(
        "--require",
        metavar="PARTS",
        help="exit 1 unless the checkpoint holds these: 'full' (" + ", ".join(NEEDED) + ") or a"
        " comma-separated list of " + ", ".join(PARTS),
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds the reader may take (default {DEFAULT_TIMEOUT:g})",
    )
    return p


def required(spec: str | None) -> list[str]:
    """The parts --require names. Raises ValueError naming what is wrong."""
    if not spec:
        return []
    names = [s.strip() for s in spec.split(",") if s.strip()]
    out: list[str] = []
    for n in names:
        if n == "full":
            out += NEEDED
        elif n in PARTS:
            out.append(n)
        else:
            raise ValueError(f"--require {spec}: {n!r} is not 'full' or one of {', '.join(PARTS)}")
    return out


def run(args: argparse.Namespace) -> int:
    try:
        need = required(args.require)
    except ValueError as e:
        print(f"crashdrill inspect: {e}", file=sys.stderr)
        return EXIT_USAGE
    if not args.timeout > 0:
        print(f"crashdrill inspect: --timeout {args.timeout:g}: seconds > 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        inv = inspect(args.path, args.timeout)
    except InspectError as e:
        print(f"crashdrill inspect: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(inv.to_json(), indent=2) if args.json else table(inv))
    short = [n for n in need if inv.parts[n].status not in ("present", "derived")]
    if short:
        words = ", ".join(PARTS[n] for n in short)
        print(f"crashdrill inspect: --require: {inv.checkpoint} lacks {words}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    from crashdrill.closed_output import quiet_when_output_closed

    parser = configure(argparse.ArgumentParser(prog="crashdrill inspect"))
    return quiet_when_output_closed(lambda: run(parser.parse_args(argv)))
