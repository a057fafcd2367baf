"""What a checkpoint holds, recognised from the shape of its contents, not from key names
(the skeletons that drill/checkpoint_open.py makes; no torch here).

    found = recognise(tree, "optimizer.pt")    # [Found("optimizer", ...), ...]

By content:
- optimizer state: a dict with `state` and `param_groups` (what every torch optimizer's
  state_dict() is), its per-parameter state (Adam's exp_avg/exp_avg_sq, SGD's
  momentum_buffer, step counts); `initial_lr` in a group means an LR scheduler ran;
- LR scheduler: a dict with `last_epoch` and `base_lrs` / `_step_count` / `_last_lr`;
- AMP grad scaler: a dict with `scale` and `growth_factor` (or `_growth_tracker`);
- RNG: a uint8 tensor of 5056 bytes is a torch CPU generator (global or private), one of
  16 bytes a CUDA generator (one per device); a sequence of 625 ints (a tuple
  (3, (625 ints), gauss) from random.getstate()) is Python's Mersenne Twister, one of 624
  (('MT19937', keys, pos, …) from np.random.get_state()) numpy's, a dict with
  `bit_generator` a numpy Generator's;
- model tensors: a dict whose leaves are all tensors, at least one floating, and none an
  RNG state.
By key name only (there is no shape to recognise; the report says so): step counters
(step, global_step, iter_num, epoch, tokens, …), data position (sampler, cursor,
samples_consumed, batch_idx, a stateful loader's `_num_yielded`, Lightning's loops), and
a schedule kept as plain numbers under a key like `schedule` or `lr_scheduler`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

TORCH_CPU_RNG_BYTES = 5056  # torch.get_rng_state(), torch.Generator().get_state()
CUDA_RNG_BYTES = 16  # torch.cuda.get_rng_state(): Philox seed and offset
PYTHON_MT_INTS = 625  # random.getstate()[1]: 624 words and the position
NUMPY_MT_KEYS = 624  # np.random.get_state()[1]

_STEP_KEY = re.compile(
    r"(global_?step|steps?|iter(ation)?s?|iter_num|num_steps|completed_steps|train_step|"
    r"epoch|tokens(_seen)?|num_updates|update)",
    re.I,
)
_DATA_KEY = re.compile(
    r"(sampler|data_?(loader|state|pos|position|cursor|iter)|dataloader|cursor|consumed|"
    r"samples_(seen|consumed)|batch_?(idx|index)|_num_yielded|data|fit_loop|loops)",
    re.I,
)
_SCHED_KEY = re.compile(r"(lr_?sched\w*|sched\w*|schedule)", re.I)


@dataclass(frozen=True)
class Found:
    """One thing recognised: its part, where it is (file:key.key), what it holds, and
    whether it was recognised by content or only by its key's name."""

    part: str  # model, optimizer, scheduler, rng, data, step, amp
    where: str
    detail: str
    by_name: bool = False
    stream: str | None = None  # rng: python, numpy, torch, cuda
    count: int = 1  # rng: how many states (cuda: devices); model: parameters
    empty: bool = False  # optimizer: no per-parameter state
    scheduler_ran: bool = False  # optimizer: a group has initial_lr


def _kind(node: Any) -> str:
    if isinstance(node, dict):
        for k in ("dict", "list", "tuple", "ints", "tensor", "array", "v", "object"):
            if k in node:
                return k
    return "unknown"


def _seq_len(node: Any) -> int | None:
    """The length of an int sequence: ints, an int tensor/array of one dimension."""
    k = _kind(node)
    if k == "ints":
        return int(node["ints"])
    if k in ("tensor", "array") and len(node.get("shape", [])) == 1:
        dtype = str(node[k])
        if "int" in dtype:
            return int(node["shape"][0])
    if k in ("list", "tuple") and all(_kind(x) == "v" and isinstance(x["v"], int) for x in node[k]):
        return len(node[k])
    return None


def _rng_tensor(node: Any) -> str | None:
    if _kind(node) != "tensor" or node["tensor"] != "uint8" or len(node["shape"]) != 1:
        return None
    n = node["shape"][0]
    return "torch" if n == TORCH_CPU_RNG_BYTES else "cuda" if n == CUDA_RNG_BYTES else None


def _numel(shape: list[int]) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _tensor_leaves(node: Any) -> list[dict[str, Any]] | None:
    """Every leaf of `node` if all are tensors, else None."""
    k = _kind(node)
    if k == "tensor":
        return [node]
    if k == "dict" and node["dict"]:
        out: list[dict[str, Any]] = []
        for v in node["dict"].values():
            leaves = _tensor_leaves(v)
            if leaves is None:
                return None
            out += leaves
        return out
    return None


def unflatten(node: Any) -> Any:
    """A DCP key list ("model.fc.weight": …) as the nested dicts it was saved from."""
    root: dict[str, Any] = {}
    for key, leaf in node["dict"].items():
        parts = key.split(".")
        d = root
        for p in parts[:-1]:
            child = d.setdefault(p, {"dict": {}})
            if _kind(child) != "dict":  # a value and a prefix share a name: keep both
                child = d.setdefault(p + ".", {"dict": {}})
            d = child["dict"]
        d[parts[-1]] = leaf
    return {"dict": root}


def recognise(tree: Any, where: str) -> list[Found]:
    """Everything recognised in `tree`; `where` names it ("optimizer.pt:"), and each
    Found's `where` extends it with the keys down to what was found."""
    out: list[Found] = []
    _walk(tree, where, None, out)
    return [replace(f, where=f.where.removesuffix(":")) for f in out]


def _join(where: str, key: str) -> str:
    return f"{where}{'.' if not where.endswith(':') else ''}{key}"


def _walk(node: Any, where: str, key: str | None, out: list[Found]) -> None:
    k = _kind(node)
    if k == "dict":
        if _dict(node["dict"], where, out):
            return
        for name, child in node["dict"].items():
            _walk(child, _join(where, name), name, out)
        return
    if k in ("list", "tuple", "ints", "tensor", "array"):
        if _sequence(node, where, out):
            return
        if k in ("list", "tuple"):
            for i, child in enumerate(node[k]):
                _walk(child, _join(where, str(i)), key, out)
            return
    if key is None:
        return
    if k == "v" and isinstance(node["v"], int | float) and not isinstance(node["v"], bool):
        if _STEP_KEY.fullmatch(key):
            out.append(Found("step", where, f"{key} = {node['v']}", by_name=True))
        elif _DATA_KEY.search(key):
            out.append(Found("data", where, f"{key} = {node['v']}", by_name=True))
    elif k == "object" and node["object"] == "bytes" and _STEP_KEY.fullmatch(key):
        out.append(Found("step", where, f"{key} (a value DCP pickled; not read)", by_name=True))


def _sequence(node: Any, where: str, out: list[Found]) -> bool:
    k = _kind(node)
    stream = _rng_tensor(node)
    if stream:
        n = node["shape"][0]
        what = "torch CPU generator" if stream == "torch" else "CUDA generator (one device)"
        out.append(Found("rng", where, f"{what} state ({n} bytes)", stream=stream))
        return True
    items = node.get(k) if k in ("list", "tuple") else None
    if items and len(items) in (3, 5):
        head = items[0].get("v") if _kind(items[0]) == "v" else None
        if head == 3 and _seq_len(items[1]) == PYTHON_MT_INTS:
            out.append(Found("rng", where, "Python random.getstate()", stream="python"))
            return True
        if head == "MT19937" and _seq_len(items[1]) == NUMPY_MT_KEYS:
            out.append(Found("rng", where, "numpy np.random.get_state()", stream="numpy"))
            return True
    if items and all(_rng_tensor(x) == "cuda" for x in items):
        n = len(items)
        text = f"CUDA generator states, {n} device(s)"
        out.append(Found("rng", where, text, stream="cuda", count=n))
        return True
    n = _seq_len(node)
    if n == PYTHON_MT_INTS:
        text = "a Mersenne Twister state of 625 ints (Python's)"
        out.append(Found("rng", where, text, stream="python"))
        return True
    if n == NUMPY_MT_KEYS:
        text = "a Mersenne Twister key of 624 words (numpy's)"
        out.append(Found("rng", where, text, stream="numpy"))
        return True
    return False


def _dict(d: dict[str, Any], where: str, out: list[Found]) -> bool:
    """Recognise a whole dict; True when it was one thing (not walked further)."""
    keys = set(d)
    if {"state", "param_groups"} <= keys:
        out.append(_optimizer(d, where))
        return True
    if "last_epoch" in keys and keys & {"base_lrs", "_step_count", "_last_lr"}:
        last = d["last_epoch"].get("v") if _kind(d["last_epoch"]) == "v" else "?"
        out.append(Found("scheduler", where, f"LR scheduler state (last_epoch {last})"))
        return True
    if {"scale", "growth_factor"} <= keys or "_growth_tracker" in keys:
        out.append(Found("amp", where, "AMP GradScaler state (scale, growth tracker)"))
        return True
    if "bit_generator" in keys:
        name = d["bit_generator"].get("v", "?") if _kind(d["bit_generator"]) == "v" else "?"
        out.append(Found("rng", where, f"numpy bit generator state ({name})", stream="numpy"))
        return True
    if keys & {"_num_yielded", "_sampler_iter_yielded", "_snapshot"}:
        out.append(Found("data", where, "a stateful data loader's position"))
        return True
    leaves = _tensor_leaves({"dict": d})
    if leaves and not any(_rng_tensor(t) for t in leaves):
        floats = [t for t in leaves if "float" in t["tensor"] or "bf16" in t["tensor"]]
        if floats:
            params = sum(_numel(t["shape"]) for t in floats)
            dtypes = sorted({t["tensor"] for t in floats})
            text = f"{len(leaves)} tensor(s), {params:,} numbers ({', '.join(dtypes)})"
            out.append(Found("model", where, text, count=params))
            return True
    for name, child in d.items():
        is_dict = _kind(child) == "dict"
        if (
            is_dict
            and _SCHED_KEY.fullmatch(name)
            and child["dict"]
            and not _holds(child, "scheduler")
        ):
            names = ", ".join(list(child["dict"])[:4])
            text = f"{name}: {names} (plain values)"
            out.append(Found("scheduler", _join(where, name), text, by_name=True))
        if (
            _kind(child) in ("dict", "list")
            and _DATA_KEY.fullmatch(name)
            and not _holds(child, "data")
        ):
            inner = list(child.get("dict", {}))[:4]
            text = f"{name}" + (f": {', '.join(inner)}" if inner else "")
            out.append(Found("data", _join(where, name), text, by_name=True))
    return False


def _holds(node: Any, part: str) -> bool:
    return any(f.part == part for f in recognise(node, ""))


def _optimizer(d: dict[str, Any], where: str) -> Found:
    state, groups = d["state"], d["param_groups"]
    owners: set[str] = set()
    kinds: set[str] = set()

    def leaves(node: Any, path: str) -> None:
        k = _kind(node)
        if k == "dict":
            for name, child in node["dict"].items():
                if _kind(child) in ("tensor", "v", "object"):
                    owners.add(path)
                    kinds.add(name)
                else:
                    leaves(child, f"{path}.{name}")

    leaves(state, "")
    ran = False
    n_params = None
    if _kind(groups) == "list":
        n_params = 0
        for g in groups["list"]:
            gd = g.get("dict", {}) if _kind(g) == "dict" else {}
            ran = ran or "initial_lr" in gd
            if "params" in gd:
                n_params += _seq_len(gd["params"]) or 0
    style = (
        "Adam-style"
        if {"exp_avg", "exp_avg_sq"} <= kinds
        else "SGD momentum"
        if "momentum_buffer" in kinds
        else "optimizer"
    )
    if not owners:
        text = "optimizer state dict with no per-parameter state (saved before its first step?)"
        return Found("optimizer", where, text, empty=True, scheduler_ran=ran)
    of = f" of {n_params}" if n_params else ""
    steps = "with step counts" if "step" in kinds else "no step counts"
    text = f"{style}: {', '.join(sorted(kinds))} for {len(owners)}{of} parameters ({steps})"
    return Found("optimizer", where, text, scheduler_ran=ran)
