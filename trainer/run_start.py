"""How one process of a run begins, before it trains (trainer/loop.py calls these in order):
enter the run dir and learn its segment, find the newest checkpoint that verifies, then
refuse (--require-checkpoint and none left), resume or start fresh, printing the one loud
line that says which and writing its records.

    segment = start_run_dir(run_dir, label, preset, cfg)     # 0: the first start
    info = find_checkpoint(run_dir, rec)                      # None: none verifies
    resume_or_fresh(info, cfg, require, segment, rec, ...)    # state into model, opt, …
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from crashdrill.trainer import checkpoint as ck
from crashdrill.trainer import checkpoint_layout as layout
from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.data import BatchSampler
from crashdrill.trainer.exit_codes import EXIT_NO_CHECKPOINT
from crashdrill.trainer.model import GPT
from crashdrill.trainer.optim import AdamW
from crashdrill.trainer.records import NO_CHECKPOINT_CODE, RecordWriter
from crashdrill.trainer.run_files import RUN_JSON
from crashdrill.trainer.stages import Stage
from crashdrill.trainer.start_line import FRESH_LINE, refusal, refused_line, resumed_line
from crashdrill.trainer.train_state import TrainState, restore, state_map


class RunDirError(ValueError):
    """--run-dir names something that cannot be a run dir (a file)."""


def start_run_dir(run_dir: Path, label: str, preset: str, cfg: TrainConfig) -> int:
    """Create/enter the run dir; returns this process's segment (0 for the first start)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--run-dir {str(run_dir)!r} is a file; give a directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    info_path = run_dir / RUN_JSON
    try:
        starts = int(json.loads(info_path.read_text()).get("starts", 0))
    except (OSError, ValueError):
        starts = 0
    try:
        with open("/proc/self/stat") as f:
            proc_start = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        proc_start = None
    info = {
        "pid": os.getpid(),
        "proc_start": proc_start,
        "started_at": time.time(),
        "starts": starts + 1,
        "label": label,
        "preset": preset,
        "config": cfg.to_dict(),
    }
    tmp = info_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, info_path)
    return starts


def find_checkpoint(run_dir: Path, rec: RecordWriter) -> layout.CheckpointInfo | None:
    """The newest checkpoint that verifies; loud about each corrupt newer one, saying
    whether an older one is left to try (the event's `fallback_step`, null: none)."""
    found = layout.candidates(run_dir)
    for i, (_step, path) in enumerate(found):
        try:
            return layout.read_checkpoint(path, "verified")
        except layout.CorruptCheckpoint as e:
            older = found[i + 1][0] if i + 1 < len(found) else None
            at = f" at step {older}" if older is not None and older >= 0 else ""
            then = (
                f"Trying the older checkpoint{at}."
                if older is not None
                else "There is no older checkpoint to fall back to."
            )
            text = f"Checkpoint rejected: {e}. {then}"
            print(f"crashdrill: WARNING {text}", file=sys.stderr)
            rec.event("ckpt_corrupt", text, fallback_step=older)
    return None


def refuse_to_start(run_dir: Path, rec: RecordWriter) -> int:
    """--require-checkpoint and none is left: say so and exit, never train from scratch."""
    root = layout.ckpt_root(run_dir)
    print(refused_line(root), file=sys.stderr)
    rejected = len(layout.candidates(run_dir))  # each said so in its ckpt_corrupt event
    why = (
        f"no checkpoint in {root} passed its checks ({rejected} rejected)"
        f" and --require-checkpoint is set; not training from scratch"
        if rejected
        else refusal(root)
    )
    rec.event(NO_CHECKPOINT_CODE, f"Refused to start: {why}.")
    rec.write("stage", stage=Stage.FAILED, progress=1.0)
    return EXIT_NO_CHECKPOINT


def resume_or_fresh(
    info: layout.CheckpointInfo | None,
    cfg: TrainConfig,
    require_checkpoint: bool,
    segment: int,
    rec: RecordWriter,
    fingerprints: dict[str, str],
    model: GPT,
    opt: AdamW,
    sampler: BatchSampler,
    st: TrainState,
) -> None:
    """Resume from `info` (the state goes into model, opt, sampler and st) or start fresh
    when it is None; either way print the one loud line and write the records."""
    if info is None:
        print(FRESH_LINE, file=sys.stderr)
        if segment > 0:
            rec.write("resume", from_step=0, segment=segment, path=None)
        # Starting fresh under --require-checkpoint means on_missing_checkpoint = "fresh",
        # which stays silent here, as the scripts it imitates do; the lab points out the
        # loss back at ln(vocab) from the records.
        if segment > 0 and not require_checkpoint:
            rec.event(
                "fresh_start",
                "Restarted and found no checkpoint: training again from step 0 (everything "
                "since the start is lost).",
            )
        return
    parts = restore(info, cfg, fingerprints, state_map(cfg, model, opt, sampler, st), st)
    print(resumed_line(st.step, info.path), file=sys.stderr)
    absent = [p for p in ck.PARTS_FULL if p not in parts]
    rec.write(
        "resume",
        from_step=st.step,
        segment=segment,
        path=str(info.path),
        parts=parts,
        missing=absent,
    )
    missing = [ck.PART_WORDS[p] for p in absent]
    rec.event(
        "resumed",
        f"Resumed at step {st.step} from a checkpoint."
        + (f" It did not hold: {', '.join(missing)} — those start over." if missing else ""),
        level="warn" if missing else "info",
        step=st.step,
        missing=absent,
    )
