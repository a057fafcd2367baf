"""`crashdrill inspect`: real checkpoint files in each format, recognised by their contents
(never by key names alone), opened without running pickled code."""

from __future__ import annotations

import io
import json
import pickle
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from crashdrill.drill.checkpoint_inspect import (
    InspectError,
    Inventory,
    inspect,
    inventory,
    missing_words,
)
from crashdrill.drill.checkpoint_open import describe
from crashdrill.drill.file_sniff import sniff


def read(path: Path) -> Inventory:
    """In this process (torch is imported here anyway); the CLI tests use the child."""
    return inventory(describe(path))


def statuses(inv: Inventory) -> dict[str, str]:
    return {name: p.status for name, p in inv.parts.items()}


def trained(
    steps: int = 2,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    for _ in range(steps):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        sched.step()
    return model, opt, sched


def test_a_weights_only_dict_lacks_the_optimizer_rng_and_data_position(tmp_path: Path) -> None:
    model, _, _ = trained()
    torch.save({"net": model.state_dict(), "iter_num": 7}, tmp_path / "ckpt.pt")
    inv = read(tmp_path / "ckpt.pt")
    assert statuses(inv)["model"] == "present" and statuses(inv)["step"] == "present"
    assert inv.lacks == ["optimizer", "rng", "data"]
    assert missing_words(inv) == "optimizer state, RNG states, data position"
    assert "4 tensor(s), 49 numbers (float32)" in inv.parts["model"].found[0].detail


def test_contents_are_recognised_whatever_their_keys_are_called(tmp_path: Path) -> None:
    model, opt, sched = trained()
    scaler = {"scale": 65536.0, "growth_factor": 2.0, "_growth_tracker": 0}
    blob = {
        "a": model.state_dict(),
        "b": opt.state_dict(),
        "c": sched.state_dict(),
        "d": torch.get_rng_state(),
        "e": random.getstate(),
        "f": np.random.get_state(),
        "g": [torch.zeros(16, dtype=torch.uint8), torch.zeros(16, dtype=torch.uint8)],
        "h": torch.Generator().manual_seed(3),  # a private generator, saved as itself
        "sampler": {"cursor": 12},
        "iteration": 2,
        "k": scaler,
    }
    torch.save(blob, tmp_path / "x.bin")
    inv = read(tmp_path / "x.bin")
    assert inv.lacks == []
    assert all(s == "present" for s in statuses(inv).values()), statuses(inv)
    opt_found = inv.parts["optimizer"].found[0]
    assert opt_found.where == "x.bin:b" and not opt_found.by_name
    assert "exp_avg, exp_avg_sq, step for 4 of 4 parameters" in opt_found.detail
    assert inv.streams == {"python": 1, "numpy": 1, "torch": 2, "cuda": 2}
    assert inv.parts["data"].found[0].by_name  # a data position has no shape: said so


def test_a_scheduler_that_ran_but_was_not_saved_is_missing(tmp_path: Path) -> None:
    model, opt, _ = trained()
    torch.save({"m": model.state_dict(), "o": opt.state_dict()}, tmp_path / "c.pt")
    inv = read(tmp_path / "c.pt")
    assert inv.parts["scheduler"].status == "missing"  # initial_lr in the param groups
    assert "scheduler" in inv.lacks
    model2 = torch.nn.Linear(2, 1)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    model2(torch.ones(1, 2)).sum().backward()
    opt2.step()
    torch.save({"m": model2.state_dict(), "o": opt2.state_dict()}, tmp_path / "d.pt")
    inv2 = read(tmp_path / "d.pt")
    assert inv2.parts["scheduler"].status == "unknown" and "scheduler" not in inv2.lacks
    assert "SGD momentum" in inv2.parts["optimizer"].found[0].detail


class Trap:
    """Unpickling this would create a file: the inspector must never do it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def test_a_pickle_that_needs_arbitrary_globals_is_flagged_not_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    d = tmp_path / "ck"
    d.mkdir()
    torch.save({"w": torch.ones(3)}, d / "model.pt")
    torch.save({"evil": Trap(str(marker))}, d / "extra.pt")
    inv = read(d)
    extra = next(f for f in inv.files if f["name"] == "extra.pt")
    assert not extra["read"] and [g.rsplit(".", 1)[1] for g in extra["unsafe_globals"]] == ["open"]
    assert any("extra.pt: not loaded" in c for c in inv.cannot_tell)
    assert not marker.exists()
    with pytest.raises(InspectError, match=r"could be read safely \(needs globals .*open"):
        read(d / "extra.pt")
    assert not marker.exists()


def test_a_script_s_plain_pickle_is_read_and_one_naming_a_global_is_not_loaded(
    tmp_path: Path,
) -> None:
    # pickle.dump of plain Python, as research scripts save: no torch magic, so torch's
    # weights-only loader refuses it; builtins need no global, so nothing can run.
    plain = tmp_path / "model.pt"
    plain.write_bytes(pickle.dumps({"w": [0.5, 1.0], "b": 0.25, "step": 40}, protocol=4))
    inv = read(plain)
    assert [f["read"] for f in inv.files] == [True]
    assert statuses(inv)["step"] == "present" and statuses(inv)["optimizer"] == "missing"
    marker = tmp_path / "code-ran"
    trap = tmp_path / "trap.pt"
    trap.write_bytes(pickle.dumps({"evil": Trap(str(marker))}, protocol=4))
    with pytest.raises(InspectError, match=r"could be read safely \(needs globals .*open"):
        read(trap)
    assert not marker.exists()


def test_safetensors_headers_are_read_without_the_library(tmp_path: Path) -> None:
    header = {"fc.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
    raw = json.dumps(header).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(24))
    inv = read(path)
    assert inv.format == "safetensors" and inv.parts["model"].status == "present"
    assert inv.lacks == ["optimizer", "rng", "data", "step"]


def test_a_hugging_face_output_dir_reads_its_newest_checkpoint(tmp_path: Path) -> None:
    model, opt, sched = trained()
    for step in (2, 4):
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        torch.save(model.state_dict(), d / "pytorch_model.bin")
        torch.save(opt.state_dict(), d / "optimizer.pt")
        torch.save(sched.state_dict(), d / "scheduler.pt")
        rng = {"python": random.getstate(), "numpy": np.random.get_state(),
               "cpu": torch.get_rng_state()}  # fmt: skip
        torch.save(rng, d / "rng_state.pth")
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 1.0}))
    inv = read(tmp_path)
    assert inv.format == "huggingface" and inv.checkpoint.endswith("checkpoint-4")
    assert inv.parts["data"].status == "derived" and inv.lacks == []
    assert inv.streams["numpy"] == 1 and inv.streams["cuda"] == 0
    assert "CUDA" in inv.parts["rng"].note


def test_a_distributed_checkpoint_is_read_from_its_metadata(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    model, opt, _ = trained()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 2}
    with pytest.warns(UserWarning):  # DCP warns that no process group is initialised
        dcp.save(state, checkpoint_id=str(tmp_path / "dcp"))
    inv = read(tmp_path / "dcp")
    assert inv.format == "torch.distributed.checkpoint"
    assert statuses(inv)["model"] == "present" and statuses(inv)["optimizer"] == "present"
    assert inv.parts["step"].status == "present" and inv.parts["step"].found[0].by_name
    assert "rng" in inv.lacks
    assert any("pickled into the data files" in c for c in inv.cannot_tell)


def test_the_project_s_own_checkpoint_holds_everything(tmp_path: Path) -> None:
    from crashdrill.trainer import checkpoint as ck
    from crashdrill.trainer.data import BatchSampler
    from crashdrill.trainer.model import GPT
    from crashdrill.trainer.presets import get_preset
    from crashdrill.trainer.train_state import TrainState, state_files, state_map

    cfg = get_preset("quick").config_for("A")
    model = GPT(cfg, 64)
    opt = model.configure_optimizer(cfg)
    sampler = BatchSampler(np.arange(1000, dtype=np.uint16) % 64, cfg)
    x, y = sampler.next_batch()
    model(x, y)[1].backward()
    opt.step()
    st = TrainState(step=1)
    files, parts = state_files(cfg, state_map(cfg, model, opt, sampler, st), st, {"config": "c"})
    ck.CheckpointWriter(tmp_path).save(1, files, {"parts": parts})
    inv = read(tmp_path)
    assert inv.format == "crashdrill" and inv.checkpoint.endswith("step-00000001")
    assert inv.lacks == [], inv.parts
    assert inv.streams["python"] == 1 and inv.streams["numpy"] == 1
    assert inv.streams["torch"] == 2  # the global generator and the sampler's own


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "crashdrill", "inspect", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # four processes that import torch
def test_the_cli_exit_codes_say_read_lacking_and_bad_input(tmp_path: Path) -> None:
    model, _, _ = trained()
    torch.save({"model": model.state_dict()}, tmp_path / "w.pt")
    ok = cli(str(tmp_path / "w.pt"))
    assert ok.returncode == 0, ok.stderr
    assert "lacks: optimizer state, RNG states, data position, step counters" in ok.stdout
    strict = cli(str(tmp_path / "w.pt"), "--require", "full", "--json")
    assert strict.returncode == 1 and "lacks optimizer state" in strict.stderr
    assert json.loads(strict.stdout)["lacks"] == ["optimizer", "rng", "data", "step"]
    bad = cli(str(tmp_path / "w.pt"), "--require", "weights")
    assert bad.returncode == 2 and "'weights' is not 'full' or one of model" in bad.stderr
    gone = cli(str(tmp_path / "nothing.pt"))
    assert gone.returncode == 2 and "no such file or directory" in gone.stderr
    (tmp_path / "junk.pt").write_bytes(b"PK\x03\x04 torn")
    torn = cli(str(tmp_path / "junk.pt"))
    assert torn.returncode == 2 and "nothing in it could be read safely" in torn.stderr


def test_inspect_runs_the_reader_in_a_child_with_a_timeout(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "a.pt")
    assert inspect(tmp_path / "a.pt", timeout=60).parts["model"].status == "present"


# ---------------------------------------------------------------- files that are not checkpoints


def _not_a_checkpoint(path: Path) -> str:
    with pytest.raises(InspectError) as e:
        read(path)
    text = str(e.value)
    assert "not a checkpoint" in text and "not a torch.save file" in text
    return text


def test_a_raw_weights_export_is_named_for_what_it_might_be_not_torch_s_error(
    tmp_path: Path,
) -> None:
    np.arange(1024, dtype=np.float32).tofile(tmp_path / "model.bin")
    text = _not_a_checkpoint(tmp_path / "model.bin")
    assert "raw float32 array of 1,024 values?" in text and "weights_only" not in text


@pytest.mark.parametrize(
    ("name", "write", "words"),
    [
        ("a.bin", lambda p: p.write_bytes(_npy_bytes()), "numpy .npy array"),
        ("b.bin", lambda p: p.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64)), "GGUF"),
        ("c.bin", lambda p: p.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(64)), "HDF5"),
        ("d.bin", lambda p: p.write_text("hello weights\n"), "plain text"),
        ("e.bin", lambda p: p.write_bytes(b"\x01\x02\x03"), "raw bytes (3 bytes)"),
        ("f.bin", lambda p: p.write_bytes(b""), "an empty file"),
    ],
)
def test_inspect_sniffs_the_magic_bytes_of_a_file_that_is_not_a_checkpoint(
    tmp_path: Path, name: str, write: Any, words: str
) -> None:
    write(tmp_path / name)
    assert words in _not_a_checkpoint(tmp_path / name)


def test_checkpoints_are_recognised_by_their_bytes_whatever_their_name(tmp_path: Path) -> None:
    model, _, _ = trained()
    torch.save(model.state_dict(), tmp_path / "weights.data")  # a zip with data.pkl
    torch.save(model.state_dict(), tmp_path / "old.bin", _use_new_zipfile_serialization=False)
    assert sniff(tmp_path / "weights.data").kind == "torch-zip"
    assert sniff(tmp_path / "old.bin").kind == "pickle"
    assert read(tmp_path / "old.bin").parts["model"].status == "present"
    (tmp_path / "st.bin").write_bytes(_safetensors_bytes())
    assert sniff(tmp_path / "st.bin").kind == "safetensors"
    assert read(tmp_path / "st.bin").parts["model"].status == "present"


def _npy_bytes() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ones(3))
    return buf.getvalue()


def _safetensors_bytes() -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    return len(header).to_bytes(8, "little") + header + bytes(8)


def test_notes_say_which_checkpoints_were_found_and_which_is_read(tmp_path: Path) -> None:
    for step in (200, 300):
        d = tmp_path / "ckpt" / f"step-{step:08d}"
        d.mkdir(parents=True)
        torch.save({"w": torch.ones(2), "rng": torch.get_rng_state()}, d / "state.pt")
    inv = read(tmp_path / "ckpt")
    assert inv.notes == [
        "2 checkpoints in ckpt/ (step-00000200, step-00000300); reading the newest, step-00000300"
    ]
    assert inv.parts["rng"].note.split("; ")[-1] == (
        "CUDA RNG: not saved (needed only when the loop draws random numbers on the GPU)"
    )
