"""Open a checkpoint without running any of its code, and describe its files as skeletons:
the child process of `crashdrill inspect` (drill/checkpoint_inspect.py runs it with a
timeout and reads its JSON from stdout).

    python -m crashdrill.drill.checkpoint_open PATH     # one JSON object on stdout

A skeleton is the shape of what a file holds, with no tensor data: dicts, lists and
scalars as they are, tensors and arrays as dtype + shape, a long run of ints as its
length, anything else as its type name. Loading rules:

- torch.save files (`.pt`, `.pth`, `.bin`, Lightning `.ckpt`): `torch.load(weights_only=
  True)`, with numpy's array reconstruction allowed (numpy RNG states are arrays; the
  Hugging Face Trainer allows the same). A file that needs any other global is not
  loaded: its globals are listed instead (loading it would import and call them).
- safetensors: the JSON header only (names, dtypes, shapes).
- PyTorch Distributed Checkpoint (`.metadata`): unpickled with only DCP's own metadata
  classes and torch's dtype constants allowed; the `.distcp` data files are not read.
- JSON files (`trainer_state.json`, a script's own JSON checkpoint): parsed.
- Anything else: named, not read, with what its first bytes say it might be (a numpy
  .npy, GGUF, HDF5, text, a raw float32 array of N values: drill/file_sniff.py).

A file's format comes from its first bytes unless its name says `.safetensors` / `.json`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from crashdrill.drill.file_sniff import not_a_checkpoint, sniff
from crashdrill.drill.safe_unpicklers import DCPMetadataUnpickler, PlainUnpickler
from crashdrill.trainer.checkpoint_layout import dcp_shard_rank
from crashdrill.trainer.exit_codes import EXIT_OK, EXIT_USAGE

MAX_FILES = 64  # files of one checkpoint described at most
MAX_DEPTH = 4  # how far down a directory of checkpoints is searched
LONG_INTS = 16  # a list/tuple of more ints than this becomes {"ints": n}
MAX_ITEMS = 4096  # items of one dict or list described at most
TORCH_EXT = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".pkl", ".pickle")
KNOWN_EXT = (*TORCH_EXT, ".safetensors", ".json", ".metadata")
SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}  # fmt: skip
_TEMP = re.compile(r"(^|/)(tmp[^/]*|[^/]*\.(tmp|temp|part|partial|new)|[^/]*~)(/|$)")
_NUM = re.compile(r"\d+")


# ---------------------------------------------------------------- skeletons


def skeleton(obj: Any, depth: int = 0) -> Any:
    """The shape of a loaded object, JSON-able, without tensor data."""
    import torch

    if depth > 40:
        return {"object": "too deep"}
    if isinstance(obj, torch.Tensor):
        return {"tensor": str(obj.dtype).removeprefix("torch."), "shape": list(obj.shape)}
    if type(obj).__module__ == "numpy" and hasattr(obj, "dtype") and hasattr(obj, "shape"):
        return {"array": str(obj.dtype), "shape": list(obj.shape)}
    if isinstance(obj, bool | float | str) or obj is None:
        return {"v": obj[:200] if isinstance(obj, str) else obj}
    if isinstance(obj, int):
        return {"v": int(obj)}
    if type(obj).__module__ == "numpy" and hasattr(obj, "item"):  # a numpy scalar
        return {"v": obj.item()}
    if isinstance(obj, dict):
        items = list(obj.items())[:MAX_ITEMS]
        return {"dict": {str(k): skeleton(v, depth + 1) for k, v in items}, "n": len(obj)}
    if isinstance(obj, list | tuple):
        kind = "list" if isinstance(obj, list) else "tuple"
        if len(obj) > LONG_INTS and all(isinstance(x, int) for x in obj):
            return {"ints": len(obj), "seq": kind}
        return {kind: [skeleton(x, depth + 1) for x in obj[:MAX_ITEMS]], "n": len(obj)}
    if isinstance(obj, torch.Generator):
        return {"tensor": "uint8", "shape": [len(obj.get_state())], "generator": True}
    return {"object": f"{type(obj).__module__}.{type(obj).__qualname__}"}


# ---------------------------------------------------------------- one file


def data_safe_globals() -> list[Any]:
    """What a numpy array or a torch.Generator needs to be rebuilt by the weights-only
    unpickler: data constructors, no code of the checkpoint's choosing."""
    import torch

    try:
        import numpy as np
    except ImportError:
        return [torch.Generator]
    core = getattr(np, "_core", None) or np.core
    out: list[Any] = [core.multiarray._reconstruct, np.ndarray, np.dtype]
    out += [type(np.dtype(t)) for t in ("uint32", "int64", "float64", "float32", "uint8")]
    if hasattr(core.multiarray, "scalar"):
        out.append(core.multiarray.scalar)
    return [*out, torch.Generator]


def open_torch(path: Path) -> dict[str, Any]:
    import torch

    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception:  # a legacy (non-zip) file: the load below says what it needs
        unsafe = []
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in data_safe_globals()}
    unsafe = [g for g in unsafe if g not in allowed and not g.startswith("numpy.")]
    if unsafe:
        return {"error": "needs globals that loading would import and call", "unsafe": unsafe}
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals(data_safe_globals()):
            warnings.simplefilter("ignore")  # torch's notes on old formats: not ours to show
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        text = str(e).strip().splitlines()
        found = re.findall(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        if found:
            return {"error": "needs globals that loading would import and call", "unsafe": found}
        return {"error": f"{type(e).__name__}: {text[0] if text else ''}"[:300]}
    return {"tree": skeleton(obj)}


def open_safetensors(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return {"error": "shorter than a safetensors header (torn?)"}
        n = int.from_bytes(head, "little")
        if n > 100_000_000:
            return {"error": "not a safetensors file (header length out of range)"}
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            return {"error": f"safetensors header unreadable (torn?): {e}"}
    tensors = {
        k: {"tensor": SAFETENSORS_DTYPES.get(str(v.get("dtype")), "?"), "shape": v.get("shape", [])}
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict)
    }
    return {"tree": {"dict": tensors, "n": len(tensors)}}


def open_json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        return {"error": f"unreadable JSON (torn?): {e}"[:300]}
    return {"tree": _json_skeleton(obj)}


def _json_skeleton(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {"dict": {k: _json_skeleton(v) for k, v in obj.items()}, "n": len(obj)}
    if isinstance(obj, list):
        if len(obj) > LONG_INTS and all(isinstance(x, int) for x in obj):
            return {"ints": len(obj), "seq": "list"}
        return {"list": [_json_skeleton(x) for x in obj[:MAX_ITEMS]], "n": len(obj)}
    return {"v": obj}


def open_plain_pickle(path: Path) -> dict[str, Any] | None:
    """A plain pickle's skeleton; the globals it would need (not loaded); None when it is
    no plain pickle (a legacy torch.save file: torch's own error says more)."""
    try:
        with open(path, "rb") as f:
            return {"tree": skeleton(PlainUnpickler(f).load())}
    except Exception as e:
        found = re.findall(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        if found:
            return {"error": "needs globals that loading would import and call", "unsafe": found}
        return None


def open_dcp(path: Path) -> dict[str, Any]:
    """A DCP dir's `.metadata`: every saved key (flattened, dot-joined) with a tensor's
    dtype and shape, or "bytes" for a value DCP pickled into its data files."""
    try:
        with open(path / ".metadata", "rb") as f:
            meta = DCPMetadataUnpickler(f).load()
    except Exception as e:
        found = re.findall(r"GLOBAL ([\w.]+)", str(e))
        if found:
            return {"error": "needs globals that loading would import and call", "unsafe": found}
        return {"error": f"{type(e).__name__}: {str(e).strip()[:200]}"}
    sd = getattr(meta, "state_dict_metadata", None)
    if not isinstance(sd, dict):
        return {"error": ".metadata holds no state_dict_metadata"}
    flat = {}
    for key, m in sd.items():
        if hasattr(m, "size") and hasattr(m, "properties"):
            dtype = str(getattr(m.properties, "dtype", "?")).removeprefix("torch.")
            flat[str(key)] = {"tensor": dtype, "shape": list(m.size)}
        else:
            flat[str(key)] = {"object": "bytes"}  # a pickled value in the data files
    return {"tree": {"dict": flat, "n": len(flat)}, "flat": True}


def open_file(path: Path) -> dict[str, Any]:
    """By its name where the name says the format, else by its first bytes
    (drill/file_sniff.py): a `.bin` that is no torch.save file is named for what it might
    be, never handed to torch's unpickler."""
    name = path.name
    if name.endswith(".safetensors"):
        return open_safetensors(path)
    if name.endswith(".json"):
        return open_json(path)
    found = sniff(path)
    if found.kind == "pickle":  # torch's legacy format, or a script's own pickle.dump
        opened = open_torch(path)
        return open_plain_pickle(path) or opened if "error" in opened else opened
    if found.kind == "torch-zip":
        return open_torch(path)
    if found.kind == "safetensors":
        return open_safetensors(path)
    if found.kind == "json":
        return open_json(path)
    if found.kind == "torn-zip":  # a checkpoint, cut short
        return {"error": found.what}
    return {"error": not_a_checkpoint(found), "sniffed": found.kind}


# ---------------------------------------------------------------- finding the files


def _final_files(d: Path) -> list[Path]:
    try:
        entries = sorted(d.iterdir())
    except OSError:
        return []
    return [p for p in entries if p.is_file() and not _TEMP.search(p.name)]


def _numbered(paths: list[Path]) -> tuple[list[Path], list[str]]:
    """Paths that differ only by a number are either parts (per rank or shard: numbered
    0..n-1 or 1..n) or alternatives (steps, epochs): of alternatives keep the highest."""
    groups: dict[str, list[tuple[tuple[int, ...], Path]]] = {}
    for p in paths:
        nums = tuple(int(n) for n in _NUM.findall(p.name))
        groups.setdefault(_NUM.sub("#", p.name), []).append((nums, p))
    out, notes = [], []
    for members in groups.values():
        if len(members) == 1:
            out.append(members[0][1])
            continue
        firsts = sorted(m[0][0] for m in members if m[0])
        where = _in_dir(members[0][1])
        if firsts in (list(range(len(firsts))), list(range(1, len(firsts) + 1))):
            out += [m[1] for m in members]
            notes.append(
                f"{len(members)} files{where} ({_names(members)}) read together as the parts "
                "of one checkpoint (one per rank or shard)"
            )
            continue
        members.sort(key=lambda m: (m[0], m[1].stat().st_mtime))
        out.append(members[-1][1])
        notes.append(
            f"{len(members)} checkpoints{where} ({_names(members)}); reading the newest, "
            f"{members[-1][1].name}"
        )
    return sorted(out), notes


def _in_dir(path: Path) -> str:
    return f" in {path.parent.name}/" if path.parent.name else ""


def _names(members: list[tuple[tuple[int, ...], Path]], most: int = 4) -> str:
    names = [m[1].name for m in sorted(members, key=lambda m: m[0])]
    if len(names) > most:
        return ", ".join(names[: most - 1]) + f", … {names[-1]}"
    return ", ".join(names)


def _file_format(path: Path) -> str:
    if path.name.endswith(".safetensors"):
        return "safetensors"
    if path.name.endswith(".json"):
        return "json"
    return "torch.save"


def choose(path: Path, depth: int = 0) -> tuple[Path, str, list[Path], list[str]]:
    """(the checkpoint dir or file, its format, its files, notes) for PATH."""
    if path.is_file():
        return path, _file_format(path), [path], []
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    if ".metadata" in names:
        return path, "torch.distributed.checkpoint", [path / ".metadata"], []
    if "MANIFEST.json" in names:
        return path, "crashdrill", [p for p in _final_files(path) if p.suffix == ".pt"], []
    if "ckpt" in names and (path / "ckpt").is_dir():  # a crashdrill run dir
        from crashdrill.trainer.checkpoint_layout import find_latest

        bad: list[str] = []
        info = find_latest(path, on_corrupt=bad.append)
        if info is None:
            return path, "crashdrill", [], ["no complete checkpoint under ckpt/", *bad]
        files = [info.path / n for n in info.files]
        return info.path, "crashdrill", files, [f"newest complete: {info.path.name}", *bad]
    files = [p for p in _final_files(path) if p.name.endswith(KNOWN_EXT)]
    whole = [p for p in files if p.suffix == ".ckpt"]  # Lightning: each file is a checkpoint
    if len(whole) > 1:
        last = [p for p in whole if p.name == "last.ckpt"]
        pick = last[0] if last else max(whole, key=lambda p: p.stat().st_mtime)
        why = "last.ckpt, Lightning's newest" if last else "the newest"
        note = f"{len(whole)} .ckpt files{_in_dir(pick)}; reading {why}, {pick.name}"
        return pick, "torch.save", [pick], [note]
    if files:
        chosen, notes = _numbered(files)
        hf = {"trainer_state.json", "optimizer.pt", "scheduler.pt"} & names
        if hf or any(p.name.startswith("rng_state") for p in files):
            return path, "huggingface", chosen[:MAX_FILES], notes
        if len(chosen) == 1:  # one checkpoint file in the dir: that file is the checkpoint
            return chosen[0], _file_format(chosen[0]), chosen, notes
        return path, "dir", chosen[:MAX_FILES], notes
    subdirs = [p for p in sorted(path.iterdir()) if p.is_dir() and not _TEMP.search(p.name)]
    if subdirs and depth < MAX_DEPTH:
        kept, notes = _numbered(subdirs)
        if len(kept) < len(subdirs) or len(kept) == 1:
            newest = [p for p in kept if _NUM.search(p.name)] or kept
            chosen_dir, fmt, found, more = choose(newest[-1], depth + 1)
            return chosen_dir, fmt, found, notes + more
        for sub in kept:  # no numbered checkpoints: the first subdir that holds one
            chosen_dir, fmt, found, more = choose(sub, depth + 1)
            if found:
                return chosen_dir, fmt, found, more
    return path, "dir", [], []


def describe(path: Path) -> dict[str, Any]:
    where, fmt, files, notes = choose(path)
    out: dict[str, Any] = {"path": str(path), "checkpoint": str(where), "format": fmt}
    described = []
    for f in files:
        name = f.name if f == where else os.path.relpath(f, where)
        entry: dict[str, Any] = {"name": name, "bytes": None}
        if f.name == ".metadata":
            entry["name"] = ".metadata"
            data = [p for p in where.iterdir() if p.suffix == ".distcp"]
            entry["bytes"] = sum(p.stat().st_size for p in data)
            entry.update(open_dcp(where))
            entry["data_files"] = len(data)
            # Which ranks wrote shards (DCP's FileSystemWriter names them __RANK_N.distcp).
            ranks = {dcp_shard_rank(p.name) for p in data}
            entry["shard_ranks"] = sorted(r for r in ranks if r is not None)
        else:
            entry["bytes"] = f.stat().st_size
            entry.update(open_file(f))
        described.append(entry)
    out["files"] = described
    out["notes"] = notes
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m crashdrill.drill.checkpoint_open PATH", file=sys.stderr)
        return EXIT_USAGE
    path = Path(argv[0])
    if not path.exists():
        print(f"{path}: no such file or directory", file=sys.stderr)
        return EXIT_USAGE
    json.dump(describe(path), sys.stdout)
    sys.stdout.write("\n")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
