"""The deterministic training loop: resume first, then train, checkpointing as it goes.

    crashdrill run quick --run-dir runs/q      # trains; run it again after a kill: resumes

The resume block sits before the loop, so the same command works in session one and in
session four, and it says loudly which of the two it did.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from crashdrill.trainer import checkpoint as ck
from crashdrill.trainer import checkpoint_layout as layout
from crashdrill.trainer import determinism, evaluate, metrics
from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.data import BatchSampler, Dataset, load_dataset
from crashdrill.trainer.divergence import diverged_line, nonfinite, record_divergence
from crashdrill.trainer.exit_codes import EXIT_DIVERGED, EXIT_NO_CHECKPOINT, EXIT_OK, EXIT_STOPPED
from crashdrill.trainer.model import GPT, lr_at
from crashdrill.trainer.optim import AdamW
from crashdrill.trainer.preemption import (
    GracefulStop,
    check_previous_stop,
    parse_duration,
    process_age_s,
    stop_and_save,
)
from crashdrill.trainer.record_contract import to_json
from crashdrill.trainer.records import NO_CHECKPOINT_CODE, RecordWriter, float32_bits
from crashdrill.trainer.run_files import RUN_JSON
from crashdrill.trainer.start_line import FRESH_LINE, refusal, refused_line, resumed_line
from crashdrill.trainer.train_state import (
    CheckpointMismatch,
    TrainState,
    restore,
    state_files,
    state_map,
)

__all__ = ["CheckpointMismatch", "RunDirError", "RunOptions", "train"]


class RunDirError(ValueError):
    pass


@dataclass
class RunOptions:
    label: str = "A"
    preset: str = ""
    require_checkpoint: bool = False
    jsonl: bool = False
    progress: Callable[[int, int, float], None] | None = None
    # On a graceful stop: copy the last checkpoint to the mirror within the seconds given
    # (the grace left); True when it got there. None: no mirror.
    flush: Callable[[float], bool] | None = None


def _fmt_bytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} KB"


def _pick_device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def _start_run_dir(run_dir: Path, label: str, preset: str, cfg: TrainConfig) -> int:
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


def _startup_s() -> float | None:
    """Seconds from this process's start (a fork of the warm process, or an exec) to
    now; None where /proc does not say."""
    age = process_age_s()
    return round(age, 3) if age > 0 else None


def _find_checkpoint(run_dir: Path, rec: RecordWriter) -> layout.CheckpointInfo | None:
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


def _refuse_to_start(run_dir: Path, rec: RecordWriter) -> int:
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
    rec.write("stage", stage="failed", progress=1.0)
    return EXIT_NO_CHECKPOINT


def _resume_or_fresh(
    info: layout.CheckpointInfo | None,
    cfg: TrainConfig,
    opts: RunOptions,
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
        if segment > 0 and not opts.require_checkpoint:
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


def train(cfg: TrainConfig, run_dir: str | Path, opts: RunOptions | None = None) -> int:
    """Train (or resume) one run in `run_dir`. Returns the process exit code."""
    opts = opts or RunOptions()
    run_dir = Path(run_dir)
    if cfg.ranks > 1:  # a group of data-parallel ranks: its own loop (trainer/rank_loop.py)
        from crashdrill.trainer.rank_loop import train_ranks

        return train_ranks(cfg, run_dir, opts)
    segment = _start_run_dir(run_dir, opts.label, opts.preset, cfg)
    rec = RecordWriter(run_dir, segment)
    stop = GracefulStop(
        grace_s=float(cfg.stop_grace),
        stop_after_s=parse_duration(cfg.stop_after) if cfg.stop_after else None,
        enabled=cfg.graceful_stop == "on",
    )
    stop.install()  # from here a SIGTERM waits for a step boundary (graceful_stop "on")
    try:
        return _train(cfg, run_dir, opts, segment, rec, stop)
    except Exception as e:
        rec.write("stage", stage="failed", progress=1.0)
        # The message and its traceback go to stderr (the lab's log, the instructor's
        # view); the records, which students read, name only the kind of error.
        rec.event("trainer_error", f"The run failed: {type(e).__name__}.", error=type(e).__name__)
        raise
    finally:
        stop.restore()
        rec.close()


def _train(
    cfg: TrainConfig,
    run_dir: Path,
    opts: RunOptions,
    segment: int,
    rec: RecordWriter,
    stop: GracefulStop,
) -> int:
    device = _pick_device(cfg)
    determinism.configure(cfg.threads, device)
    data: Dataset = load_dataset(cfg, lambda s, p: rec.write("stage", stage=s, progress=p))
    vocab = cfg.vocab or data.vocab_size
    fingerprints = {"config": cfg.fingerprint(), "dataset": data.sha256[:16]}

    rec.write("stage", stage="build", progress=0.0)
    determinism.seed_all(cfg.seed)  # a fresh start's init; a resume overwrites all of it
    model = GPT(cfg, vocab).to(device)
    opt = model.configure_optimizer(cfg)
    sampler = BatchSampler(data.train, cfg)
    st = TrainState()
    rec.write("stage", stage="build", progress=1.0)

    info = _find_checkpoint(run_dir, rec)
    if info is None and opts.require_checkpoint and cfg.on_missing_checkpoint != "fresh":
        return _refuse_to_start(run_dir, rec)
    _resume_or_fresh(info, cfg, opts, segment, rec, fingerprints, model, opt, sampler, st)
    check_previous_stop(run_dir, st.step, rec)

    rec.write("stage", stage="warmup", progress=0.0)
    if device.type == "cuda":
        peak, peak_src = metrics.gpu_peak(torch.cuda.get_device_name(device), cfg.precision)
    else:
        peak, peak_src = metrics.cpu_peak(cfg.threads)
    rec.write("stage", stage="warmup", progress=1.0)
    n_params = model.num_params()
    rec.write(
        "run",
        params=n_params,
        config=cfg.to_dict(),
        dataset=data.name,
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        precision=cfg.precision,
        threads=cfg.threads,
        vocab=vocab,
        label=opts.label,
        preset=opts.preset,
        fingerprints=fingerprints,
        mfu_peak_flops=peak,
        mfu_peak_source=peak_src,
    )
    if info is None:
        rec.event(
            "training_started",
            f"Training {n_params / 1e6:.2f}M params on {data.name} for {cfg.steps} steps "
            f"({cfg.precision}, batch {cfg.batch}, ctx {cfg.ctx}, {cfg.threads} thread(s)).",
            params=n_params,
            dataset=data.name,
            steps=cfg.steps,
            precision=cfg.precision,
            batch=cfg.batch,
            ctx=cfg.ctx,
            threads=cfg.threads,
        )
        rec.event(
            "expected_loss",
            f"Expected loss before training ≈ ln(vocab) = {math.log(vocab):.2f}.",
            loss=math.log(vocab),
            vocab=vocab,
        )

    def on_saved(r: ck.SaveResult) -> None:
        words = ", ".join(ck.PART_WORDS[p] for p in r.parts)
        how = (
            f"snapshot in {r.seconds:.2f}s, written in the background in {r.persist_seconds:.2f}s"
            if cfg.ckpt_mode == "async"
            else f"in {r.seconds:.2f}s"
        )
        rec.write(
            "ckpt",
            step=r.step,
            bytes=r.bytes,
            seconds=round(r.seconds, 4),
            persist_seconds=round(r.persist_seconds, 4),
            path=str(r.path),
            parts=list(r.parts),
            mode=cfg.ckpt_mode,
            write=cfg.ckpt_write,
        )
        rec.event(
            "checkpoint",
            f"Checkpoint at step {r.step}: {_fmt_bytes(r.bytes)} ({words}) {how}.",
            step=r.step,
            bytes=r.bytes,
            seconds=round(r.seconds, 4),
            persist_seconds=round(r.persist_seconds, 4),
            mode=cfg.ckpt_mode,
            parts=list(r.parts),
        )
        stop.note_save(r.persist_seconds)  # sizes the time budget's margin

    writer = ck.CheckpointWriter(
        run_dir,
        keep=cfg.keep,
        write=cfg.ckpt_write,
        mode=cfg.ckpt_mode,
        on_error=lambda m: rec.event("checkpoint_write_failed", m),
        on_saved=on_saved,
    )

    saved = {"step": info.step if info is not None else None}

    def save() -> None:
        files, parts = state_files(cfg, state_map(cfg, model, opt, sampler, st), st, fingerprints)
        meta = {"parts": parts, "fingerprints": fingerprints, "tokens": st.tokens}
        writer.save(st.step, files, meta)
        saved["step"] = st.step

    def stop_now() -> int:
        """Finish with a complete checkpoint of this step (unless it has one) and exit 75."""
        previous = saved["step"]

        def save_this_step() -> Path | None:
            if saved["step"] != st.step:
                save()
            done = writer.wait()  # an async write must be on disk before the process ends
            if done is not None and done.step == st.step:
                return done.path
            return info.path if info is not None and info.step == st.step else None

        stop_and_save(stop, st.step, run_dir, rec, save_this_step, previous, opts.flush)
        return EXIT_STOPPED

    def diverged(step: int, what: str, loss_f: float, lr: float, grad_norm: float | None) -> int:
        """Stop loudly at update `step`, whose loss or gradient is not finite; no
        checkpoint after it (trainer/divergence.py)."""
        record_divergence(
            rec,
            step=step,
            what=what,
            loss=loss_f,
            lr=lr,
            grad_norm=grad_norm,
            tokens=st.tokens + tokens_per_step,
            mem_kind=metrics.memory_bytes(device)[1],
            checkpoint_step=saved["step"],
            progress=round(st.step / cfg.steps, 4),
        )
        if opts.jsonl:
            line = {"step": step, "loss": loss_f, "loss_bits": float32_bits(loss_f)}
            sys.stdout.write(to_json({**line, "segment": segment}) + "\n")
            sys.stdout.flush()
        print(diverged_line(step, what), file=sys.stderr)
        return EXIT_DIVERGED

    tokens_per_step = cfg.batch * cfg.ctx
    if info is None and cfg.ckpt_policy == "every":
        save()  # step 0: a crash before the first cadence point still has somewhere to go
    if stop.due():
        return stop_now()

    rec.write("stage", stage="train", progress=st.step / cfg.steps)
    autocast = evaluate._autocast(device, cfg)
    flops_per_token = model.flops_per_token()
    window_t, window_steps = time.perf_counter(), 0
    logged = False  # a step record of this process written yet
    model.train()
    while st.step < cfg.steps:
        step_t = time.perf_counter()
        lr = lr_at(st.step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = sampler.next_batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast:
            _, loss = model(x, y)
        assert loss is not None
        loss_f = float(loss.detach())  # a CPU-GPU sync point; we log every step on purpose
        grad_norm: float | None = None
        opt.zero_grad(set_to_none=True)
        if math.isfinite(loss_f):  # checked before backward: no NaN reaches the weights
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
        what = nonfinite(loss_f, grad_norm)
        if what is not None:  # checked before the update: the weights stay as they were
            writer.wait()  # a checkpoint of an earlier step still being written completes
            return diverged(st.step + 1, what, loss_f, lr, grad_norm)
        opt.step()
        st.step += 1
        st.tokens += tokens_per_step
        st.loss_window = [*st.loss_window, loss_f][-cfg.eval_every :]  # checkpointed
        window_steps += 1

        if st.step % cfg.log_every == 0 or st.step == cfg.steps:
            now = time.perf_counter()
            dt = (now - window_t) / window_steps
            tps = tokens_per_step / dt if dt > 0 else 0.0
            mem, mem_kind = metrics.memory_bytes(device)
            # The first step record of this process says how long its start took (the
            # lab shows starts' median while a student waits for one); timing, not compared.
            startup = {} if logged else {"startup_s": _startup_s()}
            logged = True
            rec.write(
                "step",
                step=st.step,
                loss=loss_f,
                loss_bits=float32_bits(loss_f),
                lr=lr,
                grad_norm=grad_norm,
                tokens=st.tokens,
                tokens_per_s=round(tps, 1),
                mfu=round(flops_per_token * tps / peak, 5) if peak else None,
                mem_bytes=mem,
                mem_kind=mem_kind,
                dt=round(dt, 5),
                **startup,
            )
            if opts.jsonl:
                line = {
                    "step": st.step,
                    "loss": loss_f,
                    "loss_bits": float32_bits(loss_f),
                    "segment": segment,
                }
                sys.stdout.write(to_json(line) + "\n")
                sys.stdout.flush()
            window_t, window_steps = now, 0
        if opts.progress:
            opts.progress(st.step, cfg.steps, loss_f)

        if st.step % cfg.eval_every == 0 or st.step == cfg.steps:
            v = evaluate.val_loss(model, data.val, cfg, device)
            train_mean = sum(st.loss_window) / len(st.loss_window)
            st.best_val = v if st.best_val is None else min(st.best_val, v)
            rec.write("val", step=st.step, val_loss=v, train_loss=train_mean)
            rec.event(
                "evaluated",
                f"Step {st.step}: val {v:.3f}, train {train_mean:.3f} (gap {v - train_mean:+.3f}).",
                step=st.step,
                val_loss=v,
                train_loss=train_mean,
            )
        if st.step % cfg.probe_every == 0 or st.step == cfg.steps:
            rec.write("probe", step=st.step, probes=evaluate.probes(model, data.tokenizer, device))
        if cfg.sample_tokens and (st.step % cfg.sample_every == 0 or st.step == cfg.steps):
            text = evaluate.sample(model, data.tokenizer, cfg, device)
            rec.write("sample", step=st.step, prompt=evaluate.SAMPLE_PROMPT, text=text)
        due = st.step == cfg.steps or (cfg.ckpt_policy == "every" and st.step % cfg.ckpt_every == 0)
        if due:
            save()  # its time lands in the next step's dt: the stall shows in throughput
        if st.step % 25 == 0:
            rec.write("stage", stage="train", progress=round(st.step / cfg.steps, 4))
        stop.note_step(time.perf_counter() - step_t)
        if st.step < cfg.steps and stop.due():  # at a step boundary, reports and saves done
            return stop_now()

    writer.wait()
    rec.write("stage", stage="train", progress=1.0)
    rec.write("stage", stage="finished", progress=1.0)
    best = f" Best val loss {st.best_val:.3f}." if st.best_val is not None else ""
    rec.event(
        "finished", f"Finished {cfg.steps} steps.{best}", steps=cfg.steps, best_val=st.best_val
    )
    return EXIT_OK
