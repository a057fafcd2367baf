"""The run-record contract: every kind of record a run writes, each kind's fields, and
how an exact float is written. The trainer owns it; the server, the drill and (through
GET /api/record-kinds) the page read it from here, and docs/run-contract.md spells it out
(a test keeps the page and this module in step, and checks a real run against it).

    from crashdrill.trainer.record_contract import KINDS, kind, float32_bits
    kind("step").deterministic()   # ('step', 'loss', 'loss_bits', 'lr', 'grad_norm', 'tokens')
    float32_bits(2.5)              # 1075838976: compare these, not printed decimals

A record is one JSON object a line: `{"v": VERSION, "kind": KIND, "t": unix_seconds,
"segment": k, ...}`. A field marked deterministic is training state: a resume that is
bit-identical reproduces it exactly, and the resume check (trainer/resume_compare.py, in
the lab and in `crashdrill verify --preset`) compares every one of them by its exact
value; a field that is `bits_of` another holds that one's exact bits (the check reads the
loss through `loss_bits`). Timing and machine fields are not compared.

A number that is not finite (NaN, ±inf: a run that diverged, trainer/divergence.py) is
written as null, since JSON has none: `to_json` does it for every record, so the files,
the database, API answers, stream frames and Realtime payloads stay valid JSON. A field
with `bits_of` keeps the exact value (`loss_bits` of a NaN loss is 2143289344); readers
take null in a float field as "not a number here", and `finite_or_null` turns an older
file's bare `NaN` token (Python's json wrote one) into null the same way.

Imports nothing but the standard library: the drill and the server use it without torch.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from crashdrill.trainer.stages import TRAINER_STAGES

VERSION = 1  # the "v" of every record


def float32_bits(x: float) -> int:
    """The IEEE-754 bits of x rounded to float32, as an unsigned int: compare these,
    not printed decimals."""
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def bits_to_float32(bits: int) -> float:
    """The float32 whose bits are the low 32 bits of `bits` (as a Python float)."""
    return float(struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0])


def round_to_float32(x: float) -> float:
    """x rounded to the nearest float32 (as a Python float)."""
    return bits_to_float32(float32_bits(x))


def finite_or_null(value: Any) -> Any:
    """`value` (a record, or any part of one) with every float that is not finite made
    None: what a non-finite number is in JSON here (null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(v) for v in value]
    return value


def to_json(record: dict[str, Any]) -> str:
    """One record as compact JSON text, non-finite numbers as null (never `NaN`)."""
    return json.dumps(finite_or_null(record), separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # in JSON terms (int, float, str, list[str], object…), "X or null" if nullable
    meaning: str
    deterministic: bool = False  # a bit-identical resume reproduces it exactly
    bits_of: str = ""  # the exact bits of that other field: compared as that field
    ranks_only: bool = False  # written only by a run of several ranks (trainer/rank_loop.py)


@dataclass(frozen=True)
class Kind:
    name: str
    writers: tuple[str, ...]  # who appends it: trainer, supervisor, mirror, sampler
    meaning: str
    fields: tuple[Field, ...]  # besides the common ones (COMMON)
    keyed_by_step: bool = False  # at most one a (segment, step): readers key it so
    state: bool = False  # its newest record says where the run stands (the run's `latest`)
    more_fields: str = ""  # where fields not listed here are defined, when some are not

    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def deterministic(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.deterministic)


COMMON = (
    Field("v", "int", f"the record format version ({VERSION})"),
    Field("kind", "str", "one of the kinds below"),
    Field("t", "float", "unix seconds when it was written"),
    Field(
        "segment", "int", "0 for the original process, k after the k-th restart (not in telemetry)"
    ),
)

_STEP = Field("step", "int", "optimizer updates done (steps run 1..steps)", deterministic=True)

KINDS: tuple[Kind, ...] = (
    Kind(
        "stage",
        ("trainer", "supervisor"),
        "where the process is; its progress within that stage",
        (
            Field("stage", "str", ", ".join(TRAINER_STAGES) + " (trainer/stages.py)"),
            Field("progress", "float", "0..1 within the stage"),
        ),
    ),
    Kind(
        "step",
        ("trainer",),
        "one logged optimizer update (every `log_every` steps and the last)",
        (
            _STEP,
            Field(
                "loss",
                "float or null",
                "the loss of the batch of update `step` (null: not finite, the run diverged;"
                " `loss_bits` says which)",
                deterministic=True,
            ),
            Field(
                "loss_bits",
                "int",
                "the float32 IEEE-754 bits of `loss` (unsigned): what the resume check compares",
                deterministic=True,
                bits_of="loss",
            ),
            Field(
                "rank_loss_bits",
                "object",
                'only in a run of several ranks: each rank\'s own loss bits by rank ({"0": …,'
                ' "1": …}); `loss` is their mean in float32. The resume check compares'
                " each rank's, so it names the first rank and step that differ",
                deterministic=True,
                ranks_only=True,
            ),
            Field("lr", "float", "the learning rate of this update", deterministic=True),
            Field(
                "grad_norm",
                "float or null",
                "the gradient norm before clipping (null: not finite, or not computed in a"
                " step whose loss was not)",
                deterministic=True,
            ),
            Field("tokens", "int", "tokens trained on so far", deterministic=True),
            Field("tokens_per_s", "float", "throughput since the previous step record"),
            Field(
                "mfu",
                "float or null",
                "share of the peak named in the `run` record (null: no peak known)",
            ),
            Field("mem_bytes", "int or null", "peak memory, see `mem_kind`"),
            Field("mem_kind", "str", '"cuda_peak_allocated" or "rss"'),
            Field("dt", "float", "seconds per step since the previous step record"),
            Field(
                "startup_s",
                "float or null",
                "only in the first step record a process writes: seconds from the process's"
                " start (fork or exec) to that record (null where /proc does not say)",
            ),
        ),
        keyed_by_step=True,
        state=True,
    ),
    Kind(
        "val",
        ("trainer",),
        "an evaluation on held-out data (every `eval_every` steps and the last)",
        (
            _STEP,
            Field("val_loss", "float", "mean loss on the validation batches", deterministic=True),
            Field(
                "train_loss",
                "float",
                "mean of the last `eval_every` step losses (checkpointed with the run)",
                deterministic=True,
            ),
        ),
        keyed_by_step=True,
        state=True,
    ),
    Kind(
        "probe",
        ("trainer",),
        "fact probes (every `probe_every` steps and the last)",
        (
            _STEP,
            Field(
                "probes",
                "object",
                "{name: P(right) / (P(right) + P(wrong))}",
                deterministic=True,
            ),
        ),
        keyed_by_step=True,
        state=True,
    ),
    Kind(
        "sample",
        ("trainer",),
        "generated text (every `sample_every` steps and the last, when `sample_tokens` > 0)",
        (
            _STEP,
            Field("prompt", "str", "the prompt", deterministic=True),
            Field("text", "str", "what the model wrote after it", deterministic=True),
        ),
        keyed_by_step=True,
        state=True,
    ),
    Kind(
        "ckpt",
        ("trainer",),
        "a checkpoint became complete (its manifest is written)",
        (
            _STEP,
            Field("bytes", "int", "size of its files"),
            Field("seconds", "float", "how long training was blocked"),
            Field("persist_seconds", "float", "how long the write took (background when async)"),
            Field("path", "str", "its directory"),
            Field(
                "parts",
                "list[str]",
                'what it holds: ["weights", "optimizer", "schedule", "rng", "data"] or less',
            ),
            Field("mode", "str", 'the config\'s `ckpt_mode` ("sync" or "async")'),
            Field("write", "str", "the config's `ckpt_write` (how the files are written)"),
            Field(
                "ranks",
                "int",
                "only from a run of several ranks: how many wrote their shard",
                ranks_only=True,
            ),
        ),
        keyed_by_step=True,
        state=True,
    ),
    Kind(
        "mirror",
        ("mirror",),
        "a checkpoint copied to the mirror (in DIR/mirror.jsonl, never records.jsonl)",
        (
            _STEP,
            Field("seconds", "float", "the upload, in the background"),
            Field("bytes", "int", "bytes sent"),
            Field("url", "str", "the copy"),
            Field("created", "float or null", "the manifest's creation time"),
            Field("files", "int", "files copied, the manifest included"),
            Field("superseded", "list[int]", "steps replaced by a newer one before their upload"),
        ),
        keyed_by_step=True,
        state=True,
    ),
    Kind(
        "resume",
        ("trainer",),
        "a restarted process (segment ≥ 1) resumed, or found no checkpoint and started over",
        (
            Field("from_step", "int", "the checkpoint's step (0 when it started over)"),
            Field("path", "str or null", "the checkpoint resumed (null: started over)"),
            Field("parts", "list[str]", "what that checkpoint held (absent when started over)"),
            Field(
                "missing",
                "list[str]",
                "the parts it lacked: they start over (absent when started over)",
            ),
            Field(
                "from_ranks",
                "int",
                "only from a run of several ranks: the world size that wrote the checkpoint"
                ' (another than `ranks` when it was resharded, data_layout = "global")',
                ranks_only=True,
            ),
            Field(
                "ranks", "int", "only from a run of several ranks: its world size", ranks_only=True
            ),
        ),
        state=True,
    ),
    Kind(
        "event",
        ("trainer", "supervisor", "mirror", "lab"),
        "something that happened, for the run's log: a registered code with typed fields,"
        " and a sentence for people",
        (
            Field("text", "str", "the sentence (for people and logs: no reader parses it)"),
            Field("level", "str", '"info", "warn" or "error" (those the code allows)'),
            Field("code", "str", "what happened: one of the event codes"),
        ),
        more_fields="each code's own fields, in the event codes (trainer/event_codes.py; the"
        " `events` of GET /api/record-kinds)",
    ),
    Kind(
        "run",
        ("trainer",),
        "once per process start, before training: what is running where",
        (
            Field("params", "int", "model parameters"),
            Field("config", "object", "the whole TrainConfig"),
            Field("dataset", "str", "the corpus's name"),
            Field("device", "str", 'torch device ("cpu", "cuda:0")'),
            Field("device_name", "str", 'the GPU\'s name, or "cpu"'),
            Field("precision", "str", "the config's precision"),
            Field("threads", "int", "torch threads (fixed per run)"),
            Field("vocab", "int", "vocabulary size"),
            Field("label", "str", "A or B"),
            Field("preset", "str", "the preset id"),
            Field("fingerprints", "object", '{"config", "dataset"}: what a checkpoint must match'),
            Field("mfu_peak_flops", "float or null", "what MFU divides by"),
            Field("mfu_peak_source", "str", "where that peak comes from"),
            Field(
                "ranks", "int", "only in a run of several ranks: the world size", ranks_only=True
            ),
        ),
        state=True,
    ),
    Kind(
        "telemetry",
        ("sampler",),
        "a machine sample (psutil + NVML), every few seconds, not per run",
        (
            Field(
                "node",
                "object or absent",
                '{"node_id", "name"}: the Ray node that sampled itself (absent: the server)',
            ),
        ),
        more_fields="the fields of crashdrill.workers.telemetry.TelemetrySample",
    ),
)

KIND_NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
STEP_KEYED_KINDS: frozenset[str] = frozenset(k.name for k in KINDS if k.keyed_by_step)
STATE_KINDS: tuple[str, ...] = tuple(k.name for k in KINDS if k.state)

_BY_NAME = {k.name: k for k in KINDS}


def kind(name: str) -> Kind:
    """The kind called `name`; KeyError names the known ones."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown record kind {name!r}; known: {', '.join(KIND_NAMES)}") from None


def contract_json() -> dict[str, Any]:
    """The contract as JSON (GET /api/record-kinds), the event codes, crash modes and
    resume outcomes included."""
    # event_codes builds on this module's Field: imported here, not at the top.
    from crashdrill.trainer.crash_modes import modes_json
    from crashdrill.trainer.event_codes import events_json
    from crashdrill.trainer.resume_outcome import outcomes_json
    from crashdrill.trainer.stages import stages_json

    def fields(fs: tuple[Field, ...]) -> list[dict[str, Any]]:
        return [
            {"name": f.name, "type": f.type, "deterministic": f.deterministic, "meaning": f.meaning}
            for f in fs
        ]

    return {
        "version": VERSION,
        "common": fields(COMMON),
        "kinds": [
            {
                "name": k.name,
                "writers": list(k.writers),
                "meaning": k.meaning,
                "keyed_by_step": k.keyed_by_step,
                "state": k.state,
                "fields": fields(k.fields),
                "more_fields": k.more_fields or None,
            }
            for k in KINDS
        ],
        "events": events_json(),
        "stages": stages_json(),  # trainer/stages.py: names, words, phases
        "crash_modes": modes_json(),  # what an event's crash_mode names does, by its fields
        "resume_outcomes": outcomes_json(),  # what a resume check's `outcome` may be
    }
