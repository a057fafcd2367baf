"""The deterministic training loop: resume first, then train, checkpointing as it goes.

    crashdrill run quick --run-dir runs/q      # trains; run it again after a kill: resumes

The resume block sits before the loop, so the same command works in session one and in
session four, and it says loudly which of the two it did.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from crashdrill.trainer import checkpoint as ck
from crashdrill.trainer import determinism, evaluate, metrics
from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.data import BatchSampler, Dataset, load_dataset
from crashdrill.trainer.divergence import diverged_line, nonfinite, record_divergence
from crashdrill.trainer.exit_codes import EXIT_DIVERGED, EXIT_OK, EXIT_STOPPED
from crashdrill.trainer.model import GPT, lr_at
from crashdrill.trainer.preemption import (
    GracefulStop,
    check_previous_stop,
    parse_duration,
    process_age_s,
    stop_and_save,
)
from crashdrill.trainer.record_contract import to_json
from crashdrill.trainer.records import RecordWriter, float32_bits
from crashdrill.trainer.run_start import (
    RunDirError,
    find_checkpoint,
    refuse_to_start,
    resume_or_fresh,
    start_run_dir,
)
from crashdrill.trainer.stages import Stage
from crashdrill.trainer.train_state import (
    CheckpointMismatch,
    TrainState,
    state_files,
    state_map,
)

__all__ = ["CheckpointMismatch", "RunDirError", "RunOptions", "train"]


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


def _startup_s() -> float | None:
    """Seconds from this process's start (a fork of the warm process, or an exec) to
    now; None where /proc does not say."""
    age = process_age_s()
    return round(age, 3) if age > 0 else None


def train(cfg: TrainConfig, run_dir: str | Path, opts: RunOptions | None = None) -> int:
    """Train (or resume) one run in `run_dir`. Returns the process exit code."""
    opts = opts or RunOptions()
    run_dir = Path(run_dir)
    # A group of data-parallel ranks: its own loop (trainer/rank_loop.py); so is a run of the
    # global data layout on one rank, a group of one that resumes any world size's DCP.
    if cfg.ranks > 1 or cfg.data_layout == "global":
        from crashdrill.trainer.rank_loop import train_ranks

        return train_ranks(cfg, run_dir, opts)
    segment = start_run_dir(run_dir, opts.label, opts.preset, cfg)
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
        rec.write("stage", stage=Stage.FAILED, progress=1.0)
        # The message and its traceback go to stderr (the lab's log, the instructor's
        # view); the records, which students read, name only the kind of error.
        rec.event("trainer_error", f"The run failed: {type(e).__name__}.", error=type(e).__name__)
        raise
    finally:
        stop.restore()
        rec.close()


def print_loss_line(step: int, loss: float, segment: int, **extras: Any) -> None:
    """The one writer of the --jsonl stdout line (a logged step, and the step that
    diverged): step, loss, its float32 bits and the segment, which the drill reads.
    `extras`: what a run of several ranks adds (trainer/rank_loop.py: every rank's bits)."""
    line = {"step": step, "loss": loss, "loss_bits": float32_bits(loss), **extras}
    sys.stdout.write(to_json({**line, "segment": segment}) + "\n")
    sys.stdout.flush()


def _train(
    cfg: TrainConfig,
    run_dir: Path,
    opts: RunOptions,
    segment: int,
    rec: RecordWriter,
    stop: GracefulStop,
) -> int:
    """The run's life in the order it happens. The order is the contract: every RNG
    draw (the model's init, each batch, each eval) happens in this sequence in every
    session, which is what makes a resumed run bit-identical to an uninterrupted one."""
    run = _Training(cfg, run_dir, opts, segment, rec, stop)
    if run.info is None and opts.require_checkpoint and cfg.on_missing_checkpoint != "fresh":
        return refuse_to_start(run_dir, rec)
    resume_or_fresh(
        run.info,
        cfg,
        opts.require_checkpoint,
        segment,
        rec,
        run.fingerprints,
        run.model,
        run.opt,
        run.sampler,
        run.st,
    )
    check_previous_stop(run_dir, run.st.step, rec)
    run.announce()
    run.open_writer()
    if run.info is None and cfg.ckpt_policy == "every":
        run.save()  # step 0: a crash before the first cadence point still has somewhere to go
    if stop.due():
        return run.stop_now()
    return run.train()


@dataclass(frozen=True)
class _Update:
    """What one optimizer step measured, for its step record and the progress callback."""

    loss: float
    lr: float
    grad_norm: float | None


class _Training:
    """One process's training of one run: what the steps of `_train` share (the model,
    optimizer, sampler and train state a checkpoint holds, the records, the writer).

    Built, it has set up the device, data and model and found the checkpoint to resume
    from (`info`, None: none). Then `announce`, `open_writer`, and `train`, whose loop is
    `_update` → `_log_step` → `_reports` → `_checkpoint_if_due`, ending in `_finish`,
    `stop_now` (a graceful stop) or `_diverged`."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        opts: RunOptions,
        segment: int,
        rec: RecordWriter,
        stop: GracefulStop,
    ) -> None:
        self.cfg, self.run_dir, self.opts = cfg, run_dir, opts
        self.segment, self.rec, self.stop = segment, rec, stop
        self.device = _pick_device(cfg)
        determinism.configure(cfg.threads, self.device)
        self.data: Dataset = load_dataset(cfg, lambda s, p: rec.write("stage", stage=s, progress=p))
        self.vocab = cfg.vocab or self.data.vocab_size
        self.fingerprints = {"config": cfg.fingerprint(), "dataset": self.data.sha256[:16]}

        rec.write("stage", stage=Stage.BUILD, progress=0.0)
        determinism.seed_all(cfg.seed)  # a fresh start's init; a resume overwrites all of it
        self.model = GPT(cfg, self.vocab).to(self.device)
        self.opt = self.model.configure_optimizer(cfg)
        self.sampler = BatchSampler(self.data.train, cfg)
        self.st = TrainState()
        rec.write("stage", stage=Stage.BUILD, progress=1.0)

        self.info = find_checkpoint(run_dir, rec)
        self.saved_step = self.info.step if self.info is not None else None
        self.tokens_per_step = cfg.batch * cfg.ctx
        self.peak: float | None = None
        self.logged = False  # a step record of this process written yet
        self.window_t, self.window_steps = 0.0, 0

    def announce(self) -> None:
        """The warmup stage and the run record (device, peak FLOPs for MFU); on a fresh
        start also the events that say what is about to train and what loss to expect."""
        cfg, rec, device = self.cfg, self.rec, self.device
        rec.write("stage", stage=Stage.WARMUP, progress=0.0)
        if device.type == "cuda":
            peak, peak_src = metrics.gpu_peak(torch.cuda.get_device_name(device), cfg.precision)
        else:
            peak, peak_src = metrics.cpu_peak(cfg.threads)
        self.peak = peak
        rec.write("stage", stage=Stage.WARMUP, progress=1.0)
        n_params = self.model.num_params()
        rec.write(
            "run",
            params=n_params,
            config=cfg.to_dict(),
            dataset=self.data.name,
            device=str(device),
            device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            precision=cfg.precision,
            threads=cfg.threads,
            vocab=self.vocab,
            label=self.opts.label,
            preset=self.opts.preset,
            fingerprints=self.fingerprints,
            mfu_peak_flops=peak,
            mfu_peak_source=peak_src,
        )
        if self.info is not None:
            return
        rec.event(
            "training_started",
            f"Training {n_params / 1e6:.2f}M params on {self.data.name} for {cfg.steps} steps "
            f"({cfg.precision}, batch {cfg.batch}, ctx {cfg.ctx}, {cfg.threads} thread(s)).",
            params=n_params,
            dataset=self.data.name,
            steps=cfg.steps,
            precision=cfg.precision,
            batch=cfg.batch,
            ctx=cfg.ctx,
            threads=cfg.threads,
        )
        rec.event(
            "expected_loss",
            f"Expected loss before training ≈ ln(vocab) = {math.log(self.vocab):.2f}.",
            loss=math.log(self.vocab),
            vocab=self.vocab,
        )

    def open_writer(self) -> None:
        """The checkpoint writer (it reads the pause hook from the environment and clears
        interrupted temp dirs, so it opens here, after the run record, as it always has)."""
        cfg = self.cfg
        self.writer = ck.CheckpointWriter(
            self.run_dir,
            keep=cfg.keep,
            write=cfg.ckpt_write,
            mode=cfg.ckpt_mode,
            on_error=lambda m: self.rec.event("checkpoint_write_failed", m),
            on_saved=self._on_saved,
        )

    def _on_saved(self, r: ck.SaveResult) -> None:
        """A checkpoint is complete on disk: its record, its event, and its write time for
        the graceful stop's margin."""
        cfg = self.cfg
        words = ", ".join(ck.PART_WORDS[p] for p in r.parts)
        how = (
            f"snapshot in {r.seconds:.2f}s, written in the background in {r.persist_seconds:.2f}s"
            if cfg.ckpt_mode == "async"
            else f"in {r.seconds:.2f}s"
        )
        self.rec.write(
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
        self.rec.event(
            "checkpoint",
            f"Checkpoint at step {r.step}: {_fmt_bytes(r.bytes)} ({words}) {how}.",
            step=r.step,
            bytes=r.bytes,
            seconds=round(r.seconds, 4),
            persist_seconds=round(r.persist_seconds, 4),
            mode=cfg.ckpt_mode,
            parts=list(r.parts),
        )
        self.stop.note_save(r.persist_seconds)  # sizes the time budget's margin

    def save(self) -> None:
        """A checkpoint of this step (the writer decides sync or in the background)."""
        cfg, st = self.cfg, self.st
        states = state_map(cfg, self.model, self.opt, self.sampler, st)
        files, parts = state_files(cfg, states, st, self.fingerprints)
        meta = {"parts": parts, "fingerprints": self.fingerprints, "tokens": st.tokens}
        self.writer.save(st.step, files, meta)
        self.saved_step = st.step

    def stop_now(self) -> int:
        """Finish with a complete checkpoint of this step (unless it has one) and exit 75."""
        previous = self.saved_step
        stop_and_save(
            self.stop,
            self.st.step,
            self.run_dir,
            self.rec,
            self._save_this_step,
            previous,
            self.opts.flush,
        )
        return EXIT_STOPPED

    def _save_this_step(self) -> Path | None:
        """The graceful stop's save: the directory of a complete checkpoint of this step,
        written now unless it was already, None when none could be had."""
        step = self.st.step
        if self.saved_step != step:
            self.save()
        done = self.writer.wait()  # an async write must be on disk before the process ends
        if done is not None and done.step == step:
            return done.path
        return self.info.path if self.info is not None and self.info.step == step else None

    def train(self) -> int:
        """Update after update until cfg.steps; the exit code of how it ended."""
        cfg, st = self.cfg, self.st
        self.rec.write("stage", stage=Stage.TRAIN, progress=st.step / cfg.steps)
        self.autocast = evaluate._autocast(self.device, cfg)
        self.flops_per_token = self.model.flops_per_token()
        self.window_t, self.window_steps = time.perf_counter(), 0
        self.model.train()
        while st.step < cfg.steps:
            step_t = time.perf_counter()
            update = self._update()
            if isinstance(update, int):
                return update
            self._log_step(update)
            self._reports()
            self._checkpoint_if_due()
            if st.step % 25 == 0:
                self.rec.write("stage", stage=Stage.TRAIN, progress=round(st.step / cfg.steps, 4))
            self.stop.note_step(time.perf_counter() - step_t)
            if (
                st.step < cfg.steps and self.stop.due()
            ):  # at a step boundary, reports and saves done
                return self.stop_now()
        return self._finish()

    def _update(self) -> _Update | int:
        """One optimizer step on the next batch; the exit code instead when its loss or
        gradient is not finite (the weights then stay as they were)."""
        cfg, st, device, opt = self.cfg, self.st, self.device, self.opt
        lr = lr_at(st.step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = self.sampler.next_batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with self.autocast:
            _, loss = self.model(x, y)
        assert loss is not None
        loss_f = float(loss.detach())  # a CPU-GPU sync point; we log every step on purpose
        grad_norm: float | None = None
        opt.zero_grad(set_to_none=True)
        if math.isfinite(loss_f):  # checked before backward: no NaN reaches the weights
            loss.backward()
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            )
        what = nonfinite(loss_f, grad_norm)
        if what is not None:  # checked before the update: the weights stay as they were
            self.writer.wait()  # a checkpoint of an earlier step still being written completes
            return self._diverged(st.step + 1, what, loss_f, lr, grad_norm)
        opt.step()
        st.step += 1
        st.tokens += self.tokens_per_step
        st.loss_window = [*st.loss_window, loss_f][-cfg.eval_every :]  # checkpointed
        return _Update(loss_f, lr, grad_norm)

    def _log_step(self, u: _Update) -> None:
        """The step record (every log_every steps and the last), its stdout line under
        --jsonl, and the progress callback (every step)."""
        cfg, st = self.cfg, self.st
        self.window_steps += 1
        if st.step % cfg.log_every == 0 or st.step == cfg.steps:
            now = time.perf_counter()
            dt = (now - self.window_t) / self.window_steps
            tps = self.tokens_per_step / dt if dt > 0 else 0.0
            mem, mem_kind = metrics.memory_bytes(self.device)
            # The first step record of this process says how long its start took (the
            # lab shows starts' median while a student waits for one); timing, not compared.
            startup = {} if self.logged else {"startup_s": _startup_s()}
            self.logged = True
            peak = self.peak
            self.rec.write(
                "step",
                step=st.step,
                loss=u.loss,
                loss_bits=float32_bits(u.loss),
                lr=u.lr,
                grad_norm=u.grad_norm,
                tokens=st.tokens,
                tokens_per_s=round(tps, 1),
                mfu=round(self.flops_per_token * tps / peak, 5) if peak else None,
                mem_bytes=mem,
                mem_kind=mem_kind,
                dt=round(dt, 5),
                **startup,
            )
            self._print_loss_line(st.step, u.loss)
            self.window_t, self.window_steps = now, 0
        if self.opts.progress:
            self.opts.progress(st.step, cfg.steps, u.loss)

    def _print_loss_line(self, step: int, loss: float) -> None:
        if self.opts.jsonl:
            print_loss_line(step, loss, self.segment)

    def _reports(self) -> None:
        """Val loss, probes and a sample when their cadence (or the last step) comes; each
        uses its own generator, never the training RNG."""
        cfg, st, rec, model, device = self.cfg, self.st, self.rec, self.model, self.device
        if st.step % cfg.eval_every == 0 or st.step == cfg.steps:
            v = evaluate.val_loss(model, self.data.val, cfg, device)
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
            rec.write(
                "probe", step=st.step, probes=evaluate.probes(model, self.data.tokenizer, device)
            )
        if cfg.sample_tokens and (st.step % cfg.sample_every == 0 or st.step == cfg.steps):
            text = evaluate.sample(model, self.data.tokenizer, cfg, device)
            rec.write("sample", step=st.step, prompt=evaluate.SAMPLE_PROMPT, text=text)

    def _checkpoint_if_due(self) -> None:
        """A checkpoint at the last step and, under ckpt_policy "every", each ckpt_every."""
        cfg, step = self.cfg, self.st.step
        if step == cfg.steps or (cfg.ckpt_policy == "every" and step % cfg.ckpt_every == 0):
            self.save()  # its time lands in the next step's dt: the stall shows in throughput

    def _diverged(
        self, step: int, what: str, loss_f: float, lr: float, grad_norm: float | None
    ) -> int:
        """Stop loudly at update `step`, whose loss or gradient is not finite; no
        checkpoint after it (trainer/divergence.py)."""
        st = self.st
        record_divergence(
            self.rec,
            step=step,
            what=what,
            loss=loss_f,
            lr=lr,
            grad_norm=grad_norm,
            tokens=st.tokens + self.tokens_per_step,
            mem_kind=metrics.memory_bytes(self.device)[1],
            checkpoint_step=self.saved_step,
            progress=round(st.step / self.cfg.steps, 4),
        )
        self._print_loss_line(step, loss_f)
        print(diverged_line(step, what), file=sys.stderr)
        return EXIT_DIVERGED

    def _finish(self) -> int:
        """The last checkpoint on disk, then the finished stage and event."""
        cfg, st, rec = self.cfg, self.st, self.rec
        self.writer.wait()
        rec.write("stage", stage=Stage.TRAIN, progress=1.0)
        rec.write("stage", stage=Stage.FINISHED, progress=1.0)
        best = f" Best val loss {st.best_val:.3f}." if st.best_val is not None else ""
        rec.event(
            "finished", f"Finished {cfg.steps} steps.{best}", steps=cfg.steps, best_val=st.best_val
        )
        return EXIT_OK
