"""Data: sources, tokenizers, a token cache, and the batch sampler.

Sources (TrainConfig.data):
  builtin              the generated corpus (trainer/corpus.py), no download
  file:PATH            any UTF-8 text file (inside CRASHDRILL_CORPORA_DIR when that is set:
                       trainer/corpus_files.py)
  fineweb-edu          FineWeb-Edu (sample-10BT) through `datasets`, streamed; needs network
  fineweb-edu:PATH     the same rows from a local .parquet or .jsonl file (column "text")

Tokens are cached as a flat memmap under a key that includes the sha256 of the text and
the tokenizer, so a changed file is never served stale tokens.

The sampler draws batch offsets from its own torch.Generator, never the global RNG, and
its state (generator + samples consumed) is part of every checkpoint: that is the data
cursor. A DataLoader that reseeds from the global RNG on every iter() is one of the traps
this project exists to catch.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from crashdrill.trainer import corpus
from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.corpus_files import CorpusPathError, corpora_dir_from_environ, open_corpus
from crashdrill.trainer.stages import Stage

FINEWEB_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_NAME = "sample-10BT"
FINEWEB_MAX_CHARS = 20_000_000


class DataError(RuntimeError):
    """The data source cannot be used; the message says why and what to do."""


def cache_dir() -> Path:
    base = os.environ.get("CRASHDRILL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "crashdrill"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------- tokenizers


class ByteTokenizer:
    name = "byte"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class GPT2Tokenizer:
    """GPT-2 BPE through tiktoken. tiktoken fetches its merge table once and caches it;
    offline and uncached we fail fast instead of hanging on a socket."""

    name = "gpt2"
    vocab_size = 50257

    def __init__(self) -> None:
        try:
            import tiktoken
        except ImportError:
            raise DataError(
                "tokenizer 'gpt2' needs tiktoken: pip install 'crashdrill[data]'"
            ) from None
        try:
            self._enc = tiktoken.get_encoding("gpt2")
        except Exception as e:
            raise DataError(
                f"could not load the GPT-2 BPE tables ({type(e).__name__}: {e}). tiktoken "
                "downloads them once; offline, set TIKTOKEN_CACHE_DIR to a directory that "
                "has them, or use tokenizer = 'byte'"
            ) from None

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)


Tokenizer = ByteTokenizer | GPT2Tokenizer


def get_tokenizer(name: str) -> Tokenizer:
    return GPT2Tokenizer() if name == "gpt2" else ByteTokenizer()


# ---------------------------------------------------------------- sources


def _reachable(host: str, port: int = 443, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _fineweb_rows(path: str | None) -> Any:
    try:
        import datasets
    except ImportError:
        raise DataError("FineWeb-Edu needs `datasets`: pip install 'crashdrill[data]'") from None
    if path:
        p = Path(path)
        if not p.is_file():
            raise DataError(f"fineweb-edu:{path}: no such file")
        fmt = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}.get(p.suffix)
        if fmt is None:
            raise DataError(f"fineweb-edu:{path}: use a .parquet or .jsonl file")
        return datasets.load_dataset(fmt, data_files=str(p), split="train")
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not _reachable("huggingface.co"):
        raise DataError(
            "FineWeb-Edu is streamed from the Hugging Face Hub, which this machine cannot "
            "reach (checked huggingface.co:443 with a 3 s timeout). Use data = 'builtin', "
            "a local file with 'file:PATH', or 'fineweb-edu:PATH' for a downloaded shard"
        )
    return datasets.load_dataset(FINEWEB_REPO, name=FINEWEB_NAME, split="train", streaming=True)


def load_text(source: str) -> str:
    if source == "builtin":
        return corpus.generate()
    if source.startswith("file:"):
        try:
            return open_corpus(source, corpora_dir_from_environ()).decode("utf-8")
        except CorpusPathError as e:
            raise DataError(str(e)) from None
        except FileNotFoundError:
            raise DataError(f"data = {source!r}: no such file") from None
        except UnicodeDecodeError as e:
            raise DataError(f"data = {source!r}: not UTF-8 text ({e})") from None
        except IsADirectoryError:
            raise DataError(f"data = {source!r}: is a directory, not a text file") from None
    if source.startswith("fineweb-edu"):
        rows = _fineweb_rows(source.split(":", 1)[1] if ":" in source else None)
        parts, size = [], 0
        for row in rows:
            text = row.get("text") if isinstance(row, dict) else None
            if not text:
                continue
            parts.append(text)
            size += len(text)
            if size >= FINEWEB_MAX_CHARS:
                break
        if not parts:
            raise DataError(f"data = {source!r}: no rows with a 'text' column")
        return "\n\n".join(parts)
    raise DataError(f"unknown data source {source!r}")


@dataclass
class Dataset:
    train: np.ndarray  # 1-D token ids (memmap)
    val: np.ndarray
    sha256: str  # of the source text and the tokenizer: the dataset fingerprint
    tokenizer: Tokenizer
    name: str

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def load_dataset(
    cfg: TrainConfig, on_stage: Callable[[str, float], object] | None = None
) -> Dataset:
    stage = on_stage or (lambda _s, _p: None)
    stage(Stage.DOWNLOAD, 0.0)
    text = load_text(cfg.data)
    stage(Stage.DOWNLOAD, 1.0)
    tok = get_tokenizer(cfg.tokenizer)
    sha = hashlib.sha256(text.encode("utf-8") + b"\0" + tok.name.encode()).hexdigest()
    dtype = np.uint16 if tok.vocab_size < 2**16 else np.uint32
    path = cache_dir() / f"tokens-{sha[:24]}.{np.dtype(dtype).name}"
    stage(Stage.TOKENIZE, 0.0)
    if not path.exists():
        ids = np.asarray(tok.encode(text), dtype=dtype)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        ids.tofile(tmp)
        os.replace(tmp, path)  # other runs may read this file concurrently
    tokens = np.memmap(path, dtype=dtype, mode="r")
    stage(Stage.TOKENIZE, 1.0)
    n_val = int(len(tokens) * cfg.val_fraction)
    if len(tokens) - n_val <= cfg.ctx + 1 or n_val <= cfg.ctx + 1:
        raise DataError(
            f"data = {cfg.data!r} has {len(tokens)} tokens: too few for ctx = {cfg.ctx} "
            f"with a {cfg.val_fraction:.0%} validation split"
        )
    name = cfg.data if not cfg.data.startswith("file:") else Path(cfg.data[5:]).name
    return Dataset(tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :], sha, tok, name)


# ---------------------------------------------------------------- sampling


def _window_batch(
    data: np.ndarray, ix: torch.Tensor, ctx: int
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = np.stack([np.asarray(data[i : i + ctx + 1], dtype=np.int64) for i in ix.tolist()])
    t = torch.from_numpy(rows)
    return t[:, :-1], t[:, 1:]  # (B, T) inputs, (B, T) next-token targets


class BatchSampler:
    """Random windows from the train split, drawn from a private generator."""

    def __init__(self, data: np.ndarray, cfg: TrainConfig) -> None:
        self.data = data
        self.ctx = cfg.ctx
        self.batch = cfg.batch
        self.seed = cfg.seed
        self.generator = torch.Generator().manual_seed(cfg.seed * 2 + 1)
        self.samples_consumed = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(self.data) - self.ctx - 1, (self.batch,), generator=self.generator)
        self.samples_consumed += self.batch
        return _window_batch(self.data, ix, self.ctx)

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "samples_consumed": self.samples_consumed,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.samples_consumed = int(state["samples_consumed"])


def fixed_batches(
    data: np.ndarray, cfg: TrainConfig, n: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same n batches every time (for validation): a fresh generator each call, so
    evaluating never moves any RNG that training uses."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ix = torch.randint(len(data) - cfg.ctx - 1, (cfg.batch,), generator=g)
        out.append(_window_batch(data, ix, cfg.ctx))
    return out
