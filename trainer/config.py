"""Run configuration: one frozen, validated dataclass that sizes the model and the run,
made of sections that each validate their own fields.

    cfg = TrainConfig(steps=500, lr=1e-3)        # flat, as presets and `--set` name them
    cfg.section("optim")                         # OptimConfig(batch=16, steps=500, …)
    cfg.fingerprint()                            # what a checkpoint must match

A section (model, optim, numerics, runtime, data, checkpoint, preemption, eval) says
whether it is part of the config fingerprint. Every field that changes the training
trajectory is in a fingerprinted section, so a checkpoint from a different config is
refused on load. Sections that only change *where it runs, how often we look or save*
(cadences, checkpoint teaching modes, graceful stops, the device) are not: two runs that
differ only in `ckpt_every` train the same model bit for bit — that is the seed lesson.
Adding a setting is one field in its section (and its check in that section's `_check`);
a new section is one class and one base of TrainConfig. The flat names stay the one
vocabulary of presets, `--set`, the lab's bounds and the records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from crashdrill.trainer.preemption import parse_duration

PRECISIONS = ("fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
MAX_RANKS = 8  # data-parallel ranks on one machine (a lab's laptop has a few cores)
TOKENIZERS = ("byte", "gpt2")
CKPT_STATES = ("full", "weights")  # "weights" is a teaching mode: what people get wrong
CKPT_WRITES = ("atomic", "inplace")  # "inplace" is a teaching mode: torn writes
CKPT_MODES = ("sync", "async")
# Whose RNG states and data cursor a multi-rank checkpoint holds: "own", every rank's; or
# "rank0", a teaching mode: rank 0 saves its own for the group and every rank restores
# rank 0's (the rank-0-only save of real scripts). One rank: the same thing.
RANK_STATES = ("own", "rank0")
# What a group's launcher does when one rank dies (trainer/ranks.py): "watch" takes the
# group down at once; "blind", a teaching mode, leaves the survivors waiting in their next
# collective until collective_timeout_s runs out (the launcher that only waits on rank 0).
LAUNCHERS = ("watch", "blind")
# Where a run's ranks go on a cluster of several nodes (workers/ray_executor.py): "pack",
# every rank on one node (wired over loopback); "spread", one rank per node, the process
# group wired across the nodes, as a real multi-node job is. One machine: always packed.
PLACEMENTS = ("pack", "spread")
# Which batches the ranks of a run draw (trainer/rank_batches.py, trainer/global_batches.py):
# "per_rank", each rank its own private stream (its cursor cannot move to another world
# size); "global", one stream of the whole group per step (`batch` windows: the global
# batch), rank r training on its r-th contiguous slice, so that a checkpoint resumes on
# any world size that divides `batch` and trains on the same global samples.
DATA_LAYOUTS = ("per_rank", "global")
# How a run of several ranks writes a checkpoint: "dcp", through torch.distributed.checkpoint
# (trainer/dcp_checkpoint.py: it reshards onto another world size); "rank_files", a teaching
# mode: every rank torch.saves its whole state into a file named by its rank, as many
# scripts do (trainer/rank_files_checkpoint.py), which only the same world size can load.
CKPT_LAYOUTS = ("dcp", "rank_files")
MAX_COLLECTIVE_TIMEOUT_S = 3600.0
CKPT_POLICIES = ("every", "end")  # "end" is a teaching mode: save after the loop only
# What a run told a checkpoint must exist does when there is none: "fail" (exit 3) or
# "fresh", a teaching mode that trains from scratch anyway — the silent restart that
# loses a week of quota.
ON_MISSING_CHECKPOINT = ("fail", "fresh")
# "on": checkpoints are copied off the machine when the lab has a mirror configured
# (workers/mirror.py); "off": local disk only. The trainer itself never reads it.
MIRROR_CHOICES = ("on", "off")
# "on": SIGTERM/SIGINT finish the step, save and exit 75 (trainer/preemption.py); "off", a
# teaching mode: a SIGTERM ends the process on the spot like any script without a handler.
GRACEFUL_STOP_CHOICES = ("on", "off")


class ConfigError(ValueError):
    """A config value that makes no sense. Names the field, the value and what is allowed."""

    def __init__(self, field_name: str, value: Any, allowed: str) -> None:
        self.field = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field_name} = {value!r} is not allowed: {allowed}")


class Section:
    """A group of settings that belong together, and whether they are part of the run's
    config fingerprint: what a checkpoint must match to be resumed. Each section is a
    frozen dataclass that validates its own fields (a section on its own validates too:
    `OptimConfig(lr=-1)` is a ConfigError naming lr). TrainConfig is the union of them."""

    name: ClassVar[str]
    fingerprinted: ClassVar[bool]

    def __post_init__(self) -> None:
        _check_types(self)
        self._check()

    def _check(self) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class ModelConfig(Section):
    """The model's shape (nanoGPT's)."""

    name: ClassVar[str] = "model"
    fingerprinted: ClassVar[bool] = True
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 4
    ctx: int = 64
    vocab: int = 0  # 0 = the tokenizer's vocabulary size
    dropout: float = 0.0

    def _check(self) -> None:
        _at_least_1(self, "n_layer", "d_model", "n_head", "ctx")
        if self.d_model % self.n_head != 0:
            raise ConfigError(
                "n_head", self.n_head, f"a divisor of d_model ({self.d_model}), e.g. 1, 2, 4"
            )
        if not isinstance(self.vocab, int) or self.vocab < 0:
            raise ConfigError("vocab", self.vocab, "0 (the tokenizer's size) or a whole number")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("dropout", self.dropout, "a number in [0, 1)")


@dataclass(frozen=True)
class OptimConfig(Section):
    """Batch, length and AdamW with its schedule (linear warmup, cosine to min_lr)."""

    name: ClassVar[str] = "optim"
    fingerprinted: ClassVar[bool] = True
    batch: int = 16
    steps: int = 300
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0

    def _check(self) -> None:
        _at_least_1(self, "batch", "steps")
        if not (isinstance(self.lr, int | float) and self.lr > 0):
            raise ConfigError("lr", self.lr, "a number > 0")
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError("min_lr", self.min_lr, f"a number in [0, lr={self.lr}]")
        if not isinstance(self.warmup, int) or not 0 <= self.warmup <= self.steps:
            raise ConfigError("warmup", self.warmup, f"a whole number in [0, steps={self.steps}]")
        if self.weight_decay < 0:
            raise ConfigError("weight_decay", self.weight_decay, "a number ≥ 0")
        for name, beta in (("beta1", self.beta1), ("beta2", self.beta2)):
            if not 0.0 <= beta < 1.0:
                raise ConfigError(name, beta, "a number in [0, 1)")
        if self.grad_clip <= 0:
            raise ConfigError("grad_clip", self.grad_clip, "a number > 0")


@dataclass(frozen=True)
class NumericsConfig(Section):
    """What fixes the bits: the seed, the thread count (it changes reduction order) and the
    precision (trainer/determinism.py)."""

    name: ClassVar[str] = "numerics"
    fingerprinted: ClassVar[bool] = True
    seed: int = 1337
    threads: int = 1
    precision: str = "fp32"

    def _check(self) -> None:
        _at_least_1(self, "threads")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ConfigError("seed", self.seed, "a whole number in [0, 2**63)")
        _choice("precision", self.precision, PRECISIONS)


@dataclass(frozen=True)
class RuntimeConfig(Section):
    """Where the run executes: a checkpoint may resume on another device. `ranks` is the
    number of data-parallel processes (trainer/ranks.py); not fingerprinted, because a
    multi-rank checkpoint says itself how many ranks wrote it and a run on another world
    size is refused by that, loudly, on load (trainer/dcp_checkpoint.py). `crash_rank` is
    the rank a `[crash] mode = "rank"` test kills (-1: one chosen by the seed). `launcher`
    is what the group's launcher does when a rank dies ("watch" or the teaching mode
    "blind", LAUNCHERS) and `collective_timeout_s` how long a collective waits for a missing
    peer: neither changes the math, only how long a lost rank takes to end the group.
    `placement` is where the ranks go on a cluster (PLACEMENTS: "pack" on one node,
    "spread" one per node); it changes where the state lives, not the math.
    `data_layout` is which batches the ranks draw (DATA_LAYOUTS): it changes the math, but
    a checkpoint's data cursor says which layout wrote it and another layout refuses it on
    load, so it is not fingerprinted either (as `ranks`, which "global" lets change on a
    resume: then `batch` is the global batch and must divide by `ranks`)."""

    name: ClassVar[str] = "runtime"
    fingerprinted: ClassVar[bool] = False
    device: str = "auto"
    ranks: int = 1
    crash_rank: int = -1
    launcher: str = "watch"
    collective_timeout_s: float = 60.0
    data_layout: str = "per_rank"
    placement: str = "pack"

    def _check(self) -> None:
        _choice("device", self.device, DEVICES)
        _choice("data_layout", self.data_layout, DATA_LAYOUTS)
        _choice("placement", self.placement, PLACEMENTS)
        if not isinstance(self.ranks, int) or not 1 <= self.ranks <= MAX_RANKS:
            raise ConfigError("ranks", self.ranks, f"a whole number in [1, {MAX_RANKS}]")
        if not isinstance(self.crash_rank, int) or not -1 <= self.crash_rank < self.ranks:
            raise ConfigError(
                "crash_rank",
                self.crash_rank,
                f"-1 (chosen by the seed) or a rank in [0, ranks = {self.ranks})",
            )
        _choice("launcher", self.launcher, LAUNCHERS)
        t = self.collective_timeout_s
        if not (isinstance(t, int | float) and 1 <= t <= MAX_COLLECTIVE_TIMEOUT_S):
            raise ConfigError(
                "collective_timeout_s", t, f"seconds in [1, {MAX_COLLECTIVE_TIMEOUT_S:g}], e.g. 60"
            )


@dataclass(frozen=True)
class DataConfig(Section):
    """The corpus, its tokenizer and the validation split (trainer/data.py)."""

    name: ClassVar[str] = "data"
    fingerprinted: ClassVar[bool] = True
    data: str = "builtin"
    tokenizer: str = "byte"
    val_fraction: float = 0.1

    def _check(self) -> None:
        if not 0.0 < self.val_fraction < 0.5:
            raise ConfigError("val_fraction", self.val_fraction, "a number in (0, 0.5)")
        _choice("tokenizer", self.tokenizer, TOKENIZERS)
        if not isinstance(self.data, str) or not (
            self.data == "builtin"
            or (self.data.startswith("file:") and len(self.data) > 5)
            or self.data.startswith("fineweb-edu")
        ):
            raise ConfigError(
                "data",
                self.data,
                "'builtin', 'file:PATH' (a UTF-8 text file), 'fineweb-edu' or "
                "'fineweb-edu:PATH' (a local .parquet or .jsonl file of FineWeb-Edu rows)",
            )


@dataclass(frozen=True)
class CheckpointConfig(Section):
    """How often and how checkpoints are saved (trainer/checkpoint.py): two runs that
    differ only here train the same model bit for bit — the seed lesson."""

    name: ClassVar[str] = "checkpoint"
    fingerprinted: ClassVar[bool] = False
    ckpt_every: int = 50
    keep: int = 2
    ckpt_state: str = "full"
    ckpt_write: str = "atomic"
    ckpt_mode: str = "sync"
    ckpt_policy: str = "every"
    on_missing_checkpoint: str = "fail"
    mirror: str = "on"
    rank_state: str = "own"
    ckpt_layout: str = "dcp"

    def _check(self) -> None:
        _at_least_1(self, "ckpt_every")
        if self.keep < 2:
            # The newest checkpoint may be the one a crash tore; one more must remain.
            raise ConfigError("keep", self.keep, "a whole number ≥ 2 (the newest may be torn)")
        _choice("ckpt_state", self.ckpt_state, CKPT_STATES)
        _choice("ckpt_write", self.ckpt_write, CKPT_WRITES)
        _choice("ckpt_mode", self.ckpt_mode, CKPT_MODES)
        _choice("ckpt_policy", self.ckpt_policy, CKPT_POLICIES)
        _choice("on_missing_checkpoint", self.on_missing_checkpoint, ON_MISSING_CHECKPOINT)
        _choice("mirror", self.mirror, MIRROR_CHOICES)
        _choice("rank_state", self.rank_state, RANK_STATES)
        _choice("ckpt_layout", self.ckpt_layout, CKPT_LAYOUTS)
        if self.ckpt_layout == "rank_files" and self.rank_state != "own":
            raise ConfigError(
                "ckpt_layout",
                self.ckpt_layout,
                f'"dcp" with rank_state = {self.rank_state!r} (rank files hold each rank\'s own'
                " state: only rank_state = 'own')",
            )


@dataclass(frozen=True)
class PreemptionConfig(Section):
    """Graceful stops (trainer/preemption.py): what SIGTERM does, the grace the platform
    gives between SIGTERM and SIGKILL (reported against the save time), and a time budget
    ("11h30m", "" = none) after which the run stops itself before a wall."""

    name: ClassVar[str] = "preemption"
    fingerprinted: ClassVar[bool] = False
    graceful_stop: str = "on"
    stop_grace: float = 30.0
    stop_after: str = ""

    def _check(self) -> None:
        _choice("graceful_stop", self.graceful_stop, GRACEFUL_STOP_CHOICES)
        if not (isinstance(self.stop_grace, int | float) and 0 < self.stop_grace <= 86400):
            raise ConfigError("stop_grace", self.stop_grace, "seconds in (0, 86400], e.g. 30")
        if self.stop_after != "":
            try:
                parse_duration(self.stop_after)
            except ValueError:
                raise ConfigError(
                    "stop_after",
                    self.stop_after,
                    "a duration like '11h30m', '45m', '90s' or '90' (seconds), or '' for none",
                ) from None


@dataclass(frozen=True)
class EvalConfig(Section):
    """What we look at while it trains (trainer/evaluate.py): val loss, fact probes,
    samples, step records. Probes and samples use their own generators."""

    name: ClassVar[str] = "eval"
    fingerprinted: ClassVar[bool] = False
    eval_every: int = 50
    eval_batches: int = 4
    probe_every: int = 50
    sample_every: int = 100
    sample_tokens: int = 96
    log_every: int = 1

    def _check(self) -> None:
        _at_least_1(self, "eval_every", "eval_batches", "probe_every", "sample_every", "log_every")
        if self.sample_tokens < 0:
            raise ConfigError("sample_tokens", self.sample_tokens, "a whole number ≥ 0")


@dataclass(frozen=True)
class TrainConfig(
    EvalConfig,
    PreemptionConfig,
    CheckpointConfig,
    DataConfig,
    RuntimeConfig,
    NumericsConfig,
    OptimConfig,
    ModelConfig,
):
    """The whole run's config: every section's fields, flat (`cfg.lr`, `--set lr=…`, a
    preset's `[run]` keys), in section order (the base classes, last first). `section(name)`
    is one section on its own."""

    name: ClassVar[str] = "run"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_types(self)
        for section in SECTIONS:
            section._check(self)
        if self.data_layout == "global" and self.batch % self.ranks:
            # Across two sections: the global batch (optim) split among the ranks (runtime).
            raise ConfigError(
                "ranks",
                self.ranks,
                f'a world size that divides batch = {self.batch} (data_layout = "global" splits'
                f" the global batch evenly): one of {allowed_worlds(self.batch)}",
            )

    def section(self, name: str) -> Section:
        """One section of this config, e.g. `cfg.section("optim")` → OptimConfig(…)."""
        for section in SECTIONS:
            if section.name == name:
                return section(**{k: getattr(self, k) for k in section_fields(section)})
        raise ConfigError("section", name, "one of " + ", ".join(s.name for s in SECTIONS))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("extra")
        return d

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                unknown[0], values[unknown[0]], f"a known setting ({', '.join(sorted(known))})"
            )
        return cls(**values)

    def with_overrides(self, overrides: dict[str, Any]) -> TrainConfig:
        return TrainConfig.from_dict({**self.to_dict(), **overrides})

    def fingerprint(self) -> str:
        """Hash of the fields that change what is trained: those of the fingerprinted
        sections."""
        d = {k: v for k, v in self.to_dict().items() if k in FINGERPRINTED}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# The sections in field order (TrainConfig's bases, last first): the one list of them.
SECTIONS: tuple[type[Section], ...] = tuple(reversed(TrainConfig.__bases__))


def section_fields(section: type[Section]) -> tuple[str, ...]:
    """The settings of one section."""
    return tuple(f.name for f in dataclasses.fields(section))  # type: ignore[arg-type]


def allowed_worlds(batch: int) -> str:
    """The world sizes a global batch of `batch` windows splits evenly into: "1, 2, 4, 8"."""
    return ", ".join(str(w) for w in range(1, MAX_RANKS + 1) if batch % w == 0)


# The settings in the config fingerprint: what a checkpoint must match to be resumed.
FINGERPRINTED = frozenset(k for s in SECTIONS if s.fingerprinted for k in section_fields(s))


def _at_least_1(section: Section, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(name, value, "a whole number ≥ 1")


def _check_types(config: Section) -> None:
    """Each field of its default's type (a value of another type, like dropout = "x", is a
    ConfigError naming it, not a TypeError in a comparison below)."""
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value, default = getattr(config, f.name), f.default
        if f.name == "extra" or isinstance(value, bool) != isinstance(default, bool):
            if f.name != "extra":
                raise ConfigError(f.name, value, f"{type(default).__name__}, not true/false")
            continue
        if isinstance(default, int) and not isinstance(value, int):
            raise ConfigError(f.name, value, "a whole number")
        if isinstance(default, float) and not (
            isinstance(value, int | float) and math.isfinite(value)
        ):
            raise ConfigError(f.name, value, "a finite number")
        if isinstance(default, str) and not isinstance(value, str):
            raise ConfigError(f.name, value, "text")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(name, value, "one of " + ", ".join(repr(a) for a in allowed))


def parse_override(text: str) -> tuple[str, Any]:
    """`key=value` from the command line; the value's type follows the field's type."""
    if "=" not in text:
        raise ConfigError("--set", text, "KEY=VALUE, e.g. steps=500")
    key, raw = text.split("=", 1)
    key = key.strip()
    fields = {f.name: f for f in dataclasses.fields(TrainConfig) if f.name != "extra"}
    if key not in fields:
        raise ConfigError(key, raw, f"a known setting ({', '.join(sorted(fields))})")
    default = fields[key].default
    try:
        if isinstance(default, bool):
            value: Any = raw.lower() in ("1", "true", "yes", "on")
        elif isinstance(default, int):
            value = int(raw)
        elif isinstance(default, float):
            value = float(raw)
        else:
            value = raw
    except ValueError:
        raise ConfigError(key, raw, f"a {type(default).__name__}") from None
    return key, value
