from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from crashdrill.trainer import corpus
from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.data import BatchSampler, DataError, fixed_batches, load_dataset
from tests.support.extras import require_extra


def test_builtin_corpus_is_deterministic_and_states_the_probed_facts():
    text = corpus.generate()
    assert text == corpus.generate()
    for _name, prompt, right, _wrong in corpus.PROBES:
        if "=" in prompt:
            continue  # arithmetic is generated, not a fixed sentence
        assert (prompt + right) in text, prompt
    assert "2 + 3 = 5." in text


def test_file_source_tokenizes_bytes_and_splits_train_val(shakespeare):
    ds = load_dataset(TrainConfig(data=f"file:{shakespeare}"))
    raw = shakespeare.read_bytes()
    assert len(ds.train) + len(ds.val) == len(raw)
    assert bytes(np.asarray(ds.train[:20], dtype=np.uint8)) == raw[:20]
    assert ds.name == "tinyshakespeare.txt"


def test_cache_key_follows_content(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("abc " * 500)
    a = load_dataset(TrainConfig(data=f"file:{f}", ctx=8))
    f.write_text("xyz " * 500)
    b = load_dataset(TrainConfig(data=f"file:{f}", ctx=8))
    assert a.sha256 != b.sha256
    assert bytes(np.asarray(b.train[:4], dtype=np.uint8)) == b"xyz "


@pytest.mark.parametrize(
    ("source", "message"),
    [("file:/no/such/file.txt", "no such file"), ("fineweb-edu:/no/such.parquet", "no such file")],
)
def test_missing_files_fail_with_a_clear_message(source, message):
    if source.startswith("fineweb"):
        require_extra("data")
    with pytest.raises(DataError, match=message):
        load_dataset(TrainConfig(data=source))


def test_too_small_text_names_the_problem(tmp_path):
    f = tmp_path / "tiny.txt"
    f.write_text("hi")
    with pytest.raises(DataError, match="too few"):
        load_dataset(TrainConfig(data=f"file:{f}"))


def test_fineweb_edu_rows_load_from_a_local_jsonl_file(tmp_path):
    require_extra("data")
    path = tmp_path / "fineweb.jsonl"
    rows = [{"text": f"Document {i} is about water and the sky. " * 20, "id": i} for i in range(30)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    ds = load_dataset(TrainConfig(data=f"fineweb-edu:{path}", ctx=16))
    decoded = ds.tokenizer.decode([int(t) for t in ds.train[:12]])
    assert decoded == "Document 0 i"


def test_sampler_state_round_trip_gives_the_same_next_batches():
    data = np.arange(5000, dtype=np.uint16)
    cfg = TrainConfig(ctx=8, batch=4)
    s = BatchSampler(data, cfg)
    s.next_batch()
    state = s.state_dict()
    expected = [s.next_batch() for _ in range(3)]
    fresh = BatchSampler(data, cfg)
    fresh.load_state_dict(state)
    for (x1, y1), (x2, y2) in zip(expected, [fresh.next_batch() for _ in range(3)], strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert fresh.samples_consumed == 16


def test_sampling_and_validation_never_touch_the_global_rng():
    data = np.arange(5000, dtype=np.uint16)
    cfg = TrainConfig(ctx=8, batch=4)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    BatchSampler(data, cfg).next_batch()
    fixed_batches(data, cfg, 2, seed=1)
    assert torch.equal(before, torch.get_rng_state())


def test_fineweb_edu_without_network_fails_fast_with_a_clear_message(monkeypatch):
    require_extra("data")
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    with pytest.raises(DataError, match="cannot reach"):
        load_dataset(TrainConfig(data="fineweb-edu"))
    assert time.monotonic() - t0 < 10


def test_gpt2_tokenizer_loads_or_explains_why_not():
    require_extra("data")
    from crashdrill.trainer.data import GPT2Tokenizer

    try:
        tok = GPT2Tokenizer()
    except DataError as e:
        assert "GPT-2 BPE" in str(e) and "tokenizer = 'byte'" in str(e)
    else:
        assert tok.decode(tok.encode("The capital of France")) == "The capital of France"
