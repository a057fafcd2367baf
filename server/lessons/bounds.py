"""Bounds on lessons: the type and range of each setting a student may be let change, and
the lab's budget on what one run may cost. The lesson policy (server/lessons/policy.py)
applies them; the numbers come from the server's settings (server/settings.py).

    limits = LabLimits.from_settings(settings)      # the budget and the machine
    student_range("keep", preset, config, limits)   # Range: "a whole number from 2 to 10"
    type_problem("keep", "x")                       # "keep = 'x' is not allowed: a whole number"
    budget_problems(preset, limits)                 # each limit a preset's run goes over
    run_cost(config, mirrored=True)                 # parameters, tokens, checkpoint bytes
    pair_disk_bytes(preset, limits)                 # what a pair's runs write, both of them

Types come from TrainConfig's defaults (a whole number, a number, text). Ranges come from
the lesson (a student may lengthen a lesson up to STUDENT_MAX_STEPS_FACTOR times, never
take it below its own cadences) and from the machine (threads up to its cores, the GPT-2
tokenizer only where tiktoken is installed, `device = "cuda"` only where a GPU is).

SERVER_LOCKED settings (the corpus, the tokenizer, the mirror, the model's shape and its
precision) stay locked for students whatever a preset's `locked` list says, unless the
server's `student_unlockable` setting names them.

The budget bounds every run the lab starts, a student's changes included, and every
instructor preset it publishes: parameters, tokens per run (steps × batch × ctx),
checkpoint bytes per run (one checkpoint × keep; a checkpoint holds the fp32 weights and
AdamW's two moments, CHECKPOINT_BYTES_PER_PARAM bytes a parameter) and disk bytes per
run: what it writes over its life, one checkpoint × the checkpoints it saves (step 0, every
`ckpt_every`, the last), twice when the lab copies them to its mirror. The bytes a
client's live pairs write together are bounded per address (server/door/quotas.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from crashdrill.trainer.config import (
    CKPT_LAYOUTS,
    CKPT_MODES,
    CKPT_POLICIES,
    CKPT_STATES,
    CKPT_WRITES,
    DATA_LAYOUTS,
    LAUNCHERS,
    MIRROR_CHOICES,
    ON_MISSING_CHECKPOINT,
    PLACEMENTS,
    PRECISIONS,
    RANK_STATES,
    TrainConfig,
)
from crashdrill.trainer.presets import LABELS, Preset

if TYPE_CHECKING:
    from crashdrill.server.settings import Settings

SERVER_LOCKED = frozenset(
    {"data", "tokenizer", "mirror", "n_layer", "d_model", "n_head", "ctx", "vocab", "precision"}
)
STUDENT_MAX_STEPS_FACTOR = 4
MIN_CKPT_EVERY = 10  # a student's cadence: a checkpoint every step would only fill the disk
MAX_KEEP = 10
SHAPE_FACTOR = 4  # an unlocked model size: at most this many times the lesson's
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights + AdamW's exp_avg and exp_avg_sq
TOKENIZER_VOCAB = {"byte": 256, "gpt2": 50257}
MAX_TEXT = 1024  # a text setting's length (a corpus name)

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name != "extra"}


@dataclass(frozen=True)
class LabLimits:
    """What the server allows: settings it lets instructors open to students, the budget
    of one run, and the machine (cores, GPUs, whether tiktoken is installed). The lab's
    come from its settings (`from_settings`); LabLimits() opens nothing and counts no
    budget."""

    unlockable: frozenset[str] = frozenset()
    # The budget (the server's settings say how much; None: no limit).
    max_params: int | None = None
    max_tokens: int | None = None
    max_checkpoint_bytes: int | None = None
    max_disk_bytes: int | None = None
    mirrored: bool = False  # the lab copies checkpoints to a mirror: they count twice
    cores: int = 1
    gpus: int = 0
    gpt2_tokenizer: bool = False
    cluster: bool = False  # runs execute on a cluster's nodes, not on this one machine

    @classmethod
    def from_settings(cls, settings: Settings) -> LabLimits:
        return _limits(
            frozenset(settings.student_unlockable),
            settings.max_params_per_run,
            settings.max_tokens_per_run,
            settings.max_checkpoint_bytes_per_run,
            settings.max_disk_bytes_per_run,
            settings.mirror_url is not None,
            settings.on_cluster,
        )

    @property
    def server_locked(self) -> frozenset[str]:
        """Settings no student may change on this lab, whatever a preset unlocks."""
        return SERVER_LOCKED - self.unlockable


@functools.lru_cache(maxsize=16)
def _limits(
    unlockable: frozenset[str],
    params: int,
    tokens: int,
    ckpt: int,
    disk: int | None,
    mirrored: bool,
    cluster: bool = False,
) -> LabLimits:
    from crashdrill.server.settings import count_gpus

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return LabLimits(
        unlockable=unlockable,
        max_params=params,
        max_tokens=tokens,
        max_checkpoint_bytes=ckpt,
        max_disk_bytes=disk,
        mirrored=mirrored,
        cores=cores,
        gpus=count_gpus(),
        gpt2_tokenizer=importlib.util.find_spec("tiktoken") is not None,
        cluster=cluster,
    )


# ---------------------------------------------------------------- types


def kind_of(name: str) -> str:
    """A setting's type in words: "a whole number", "a number" or "text"."""
    default = _DEFAULTS[name]
    if isinstance(default, int):
        return "a whole number"
    if isinstance(default, float):
        return "a number"
    return "text"


def type_problem(name: str, value: Any) -> str | None:
    """The problem when `value` is not of setting `name`'s type (a finite number for a
    number, text of at most MAX_TEXT characters), else None."""
    kind = kind_of(name)
    if kind == "a whole number":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "a number":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and math.isfinite(value)
    else:
        ok = isinstance(value, str) and len(value) <= MAX_TEXT
        kind = f"text of at most {MAX_TEXT} characters"
    return None if ok else f"{name} = {_show(value)} is not allowed: {kind}"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------- ranges


@dataclass(frozen=True)
class Range:
    """The values a student may give a setting: lo..hi (numbers) or one of `choices`."""

    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    why: str = ""  # where the bound comes from, said after it

    def allows(self, value: Any) -> bool:
        if self.choices:
            return isinstance(value, str) and value in self.choices
        if self.lo is not None and value < self.lo:
            return False
        return self.hi is None or value <= self.hi

    def text(self, name: str) -> str:
        if self.choices:
            allowed = "one of " + ", ".join(repr(c) for c in self.choices)
        else:
            allowed = f"{kind_of(name)} from {_num(self.lo)} to {_num(self.hi)}"
        return allowed + (f" ({self.why})" if self.why else "")


def _num(x: float | None) -> str:
    if x is None:
        return "any"
    return str(int(x)) if float(x).is_integer() else repr(x)


def lesson_values(preset: Preset, name: str) -> list[Any]:
    """The values a lesson gives `name` in its four configs (A, B; plain and CUDA)."""
    return [
        getattr(preset.config_for(label, cuda=c), name) for label in LABELS for c in (False, True)
    ]


# (lo, hi) of the float settings; the config refines an open end (lr > 0, dropout < 1).
_NUMBER_RANGES = {
    "lr": (0.0, 1.0),
    "min_lr": (0.0, 1.0),
    "dropout": (0.0, 0.9),
    "weight_decay": (0.0, 10.0),
    "beta1": (0.0, 0.9999),
    "beta2": (0.0, 0.9999),
    "grad_clip": (0.0, 1000.0),
    "val_fraction": (0.0, 0.5),
}
_CADENCES = ("eval_every", "probe_every", "sample_every")


def student_range(name: str, preset: Preset, config: TrainConfig, limits: LabLimits) -> Range:
    """What a student may give setting `name` in `preset`, whose changed run is `config`
    (a bound that depends on another setting, like ckpt_every ≤ steps, reads it there)."""
    own = lesson_values(preset, name)
    if name == "steps":
        base = preset.run.get("steps", TrainConfig().steps)
        most = max(own) * STUDENT_MAX_STEPS_FACTOR
        why = f"{STUDENT_MAX_STEPS_FACTOR}× the lesson's {base}; ask the instructor for more"
        return Range(1, most, why=why)
    if name == "seed":
        return Range(0, 2**63 - 1)
    if name == "ckpt_every":
        lo = min(MIN_CKPT_EVERY, *own)
        return Range(lo, max(lo, config.steps), why="at most the run's steps")
    if name == "keep":
        return Range(2, max(MAX_KEEP, *own))
    if name in _CADENCES:
        return Range(min(MIN_CKPT_EVERY, *own), max(config.steps, *own))
    if name == "log_every":
        return Range(1, max(config.steps, *own))
    if name == "warmup":
        return Range(0, config.steps, why="at most the run's steps")
    if name == "eval_batches":
        return Range(1, max(16, *own))
    if name == "sample_tokens":
        return Range(0, max(256, *own))
    if name == "threads":
        return Range(1, max(limits.cores, *own), why="the cores of the lab's machine")
    if name in ("batch", "n_layer", "d_model", "n_head", "ctx"):
        return Range(1, max(own) * SHAPE_FACTOR, why=f"{SHAPE_FACTOR}× the lesson's")
    if name == "vocab":
        tokenizers = lesson_values(preset, "tokenizer")
        largest = max(v or TOKENIZER_VOCAB[t] for v, t in zip(own, tokenizers, strict=True))
        why = f"0: the tokenizer's; {SHAPE_FACTOR}× the lesson's"
        return Range(0, largest * SHAPE_FACTOR, why=why)
    if name in _NUMBER_RANGES:
        lo, hi = _NUMBER_RANGES[name]
        return Range(lo, hi)
    if name == "data":  # when the server unlocks it: whatever corpus the config accepts
        return Range()
    if kind_of(name) == "text":
        return Range(choices=_choices(name, limits, own))
    # A setting this table does not know yet: only the lesson's own values.
    return Range(min(own), max(own), why="the lesson's; this lab knows no wider range")


def _choices(name: str, limits: LabLimits, own: list[Any]) -> tuple[str, ...]:
    """The allowed values of a text setting on this machine (the lesson's own always)."""
    choices: tuple[str, ...] = {
        "precision": PRECISIONS,
        "device": ("auto", "cpu", "cuda") if limits.gpus else ("auto", "cpu"),
        "tokenizer": ("byte", "gpt2") if limits.gpt2_tokenizer else ("byte",),
        "ckpt_state": CKPT_STATES,
        "ckpt_write": CKPT_WRITES,
        "ckpt_mode": CKPT_MODES,
        "ckpt_policy": CKPT_POLICIES,
        "on_missing_checkpoint": ON_MISSING_CHECKPOINT,
        "mirror": MIRROR_CHOICES,
        "rank_state": RANK_STATES,
        "launcher": LAUNCHERS,
        "data_layout": DATA_LAYOUTS,
        "ckpt_layout": CKPT_LAYOUTS,
        "placement": PLACEMENTS,
    }.get(name, ())
    return tuple(dict.fromkeys([*choices, *(str(v) for v in own)]))


def range_problem(
    name: str, value: Any, preset: Preset, config: TrainConfig, limits: LabLimits
) -> str | None:
    """The problem when a student's `value` for `name` is out of its range, else None."""
    allowed = student_range(name, preset, config, limits)
    if allowed.allows(value):
        return None
    return f"{name} = {_show(value)} is not allowed: {allowed.text(name)}"


# ---------------------------------------------------------------- the budget


@dataclass(frozen=True)
class RunCost:
    params: int
    tokens: int
    checkpoint_bytes: int  # one checkpoint × keep
    checkpoints: int  # checkpoints it saves without a crash (a crash test may add one)
    copies: int  # 2: each checkpoint is copied to the lab's mirror too
    disk_bytes: int  # one checkpoint × checkpoints × copies


def param_count(config: TrainConfig) -> int:
    """The model's parameters (trainer/model.py: tied head, biases, LayerNorms)."""
    d, layers = config.d_model, config.n_layer
    vocab = config.vocab or TOKENIZER_VOCAB.get(config.tokenizer, 0)
    per_layer = 12 * d * d + 13 * d  # qkv, proj, fc, proj with biases; two LayerNorms
    return vocab * d + config.ctx * d + layers * per_layer + 2 * d


def checkpoints_saved(config: TrainConfig) -> int:
    """Checkpoints a run saves if nothing crashes it (trainer/loop.py): step 0, every
    `ckpt_every` steps and the last step; only the last with ckpt_policy "end"."""
    if config.ckpt_policy != "every":
        return 1
    return 1 + config.steps // config.ckpt_every + (1 if config.steps % config.ckpt_every else 0)


def run_cost(config: TrainConfig, *, mirrored: bool = False) -> RunCost:
    """What one run costs; `mirrored`: the lab copies its checkpoints to a mirror (its
    config's `mirror` decides whether this run is copied)."""
    params = param_count(config)
    one = params * CHECKPOINT_BYTES_PER_PARAM
    saved = checkpoints_saved(config)
    copies = 2 if mirrored and config.mirror == "on" else 1
    return RunCost(
        params=params,
        tokens=config.steps * config.batch * config.ctx,
        checkpoint_bytes=one * config.keep,
        checkpoints=saved,
        copies=copies,
        disk_bytes=one * saved * copies,
    )


def _configs(preset: Preset) -> dict[str, TrainConfig]:
    """The preset's four runs: A and B, plain and on CUDA."""
    return {
        f"run {label}{' on CUDA' if cuda else ''}": preset.config_for(label, cuda=cuda)
        for label in LABELS
        for cuda in (False, True)
    }


def pair_disk_bytes(preset: Preset, limits: LabLimits) -> int:
    """What a pair's two runs write to disk, as this lab runs them (on CUDA where it has
    a GPU)."""
    cuda = limits.gpus > 0
    return sum(
        run_cost(preset.config_for(label, cuda=cuda), mirrored=limits.mirrored).disk_bytes
        for label in LABELS
    )


_SMALLER = "make the run smaller"
# What is counted, RunCost's field, LabLimits' field, the setting, what to do. Parameters,
# tokens and checkpoint bytes hold for all four runs of a preset (A, B; plain and CUDA);
# disk bytes for the two this lab's machine runs (a GPU's larger configs write
# gigabytes that a CPU lab never will, and a GPU lab's limit is larger).
_LIMITS = (
    ("parameters", "params", "max_params", "max_params_per_run", _SMALLER),
    ("tokens (steps × batch × ctx)", "tokens", "max_tokens", "max_tokens_per_run", _SMALLER),
    (
        "checkpoint bytes (one checkpoint × keep)",
        "checkpoint_bytes",
        "max_checkpoint_bytes",
        "max_checkpoint_bytes_per_run",
        "lower keep or make the run smaller",
    ),
    (
        "disk bytes written (one checkpoint × the {checkpoints} checkpoints it saves{mirror})",
        "disk_bytes",
        "max_disk_bytes",
        "max_disk_bytes_per_run",
        "save fewer checkpoints (raise ckpt_every or lower steps) or make the run smaller",
    ),
)


def budget_problems(preset: Preset, limits: LabLimits) -> list[str]:
    """Each of the lab's limits that the preset's largest run goes over (A or B, plain or
    CUDA), and a tokenizer this machine cannot load; [] when it fits."""
    configs = _configs(preset)
    costs = {w: run_cost(c, mirrored=limits.mirrored) for w, c in configs.items()}
    here = {w: c for w, c in costs.items() if ("on CUDA" in w) == (limits.gpus > 0)}
    problems: list[str] = []
    for what, field, limit_field, setting, advice in _LIMITS:
        runs = here if field == "disk_bytes" else costs
        where, value = max(((w, getattr(c, field)) for w, c in runs.items()), key=lambda x: x[1])
        limit = getattr(limits, limit_field)
        if limit is not None and value > limit:
            cost = costs[where]
            mirror = " × 2 for the copies in the lab's mirror" if cost.copies > 1 else ""
            what = what.format(checkpoints=cost.checkpoints, mirror=mirror)
            problems.append(
                f"{where} has {value:,} {what}; this lab's limit is {limit:,} ({setting}): {advice}"
            )
    if not limits.gpt2_tokenizer and any(c.tokenizer == "gpt2" for c in configs.values()):
        problems.append(
            "tokenizer = 'gpt2' needs tiktoken, which this lab's machine does not have"
            " (.venv/bin/pip install -e '.[data]'); allowed: 'byte'"
        )
    return problems
