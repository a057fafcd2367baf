"""The training loop of a run with several data-parallel ranks (`ranks = N`, N > 1).

    crashdrill run quick --run-dir runs/q --set ranks=2    # two ranks, gloo on CPU

The trainer process forks its ranks (trainer/ranks.py); each trains the same model in
DistributedDataParallel on batches of its own (trainer/rank_batches.py) and checkpoints
through torch.distributed.checkpoint (trainer/dcp_checkpoint.py). Rank 0 writes the
group's records: each step record holds the reduced loss (the mean of the ranks' float32
losses, in rank order: what the chart draws) and `rank_loss_bits`, every rank's own loss
bits, which the resume check compares rank by rank. Evaluation, probes and samples run on
rank 0's copy of the model (every rank holds the same weights).

It is the one-rank loop (trainer/loop.py) step for step, with the rank-specific parts
apart: the same cadences, the same records and loud start lines. Not here yet: async or
in-place checkpoints, weights-only teaching mode and graceful stops (a SIGTERM stops the
group at once; the next start resumes from the last complete checkpoint).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch._dynamo  # DDP's constructor imports it: imported here, a warm process pays it
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from crashdrill.trainer import checkpoint as ck
from crashdrill.trainer import determinism, evaluate, metrics, run_start
from crashdrill.trainer import loop as one_rank
from crashdrill.trainer.checkpoint_layout import (
    RANK_OWN_PARTS,
    CheckpointInfo,
    ckpt_root,
    part_description,
    rank_part,
)
from crashdrill.trainer.config import ConfigError, TrainConfig
from crashdrill.trainer.data import BatchSampler, Dataset, load_dataset
from crashdrill.trainer.dcp_checkpoint import (
    check_world,
    fill_from,
    held_ranks,
    load_group,
    rank_key,
    save_group,
)
from crashdrill.trainer.divergence import diverged_line, nonfinite, record_divergence
from crashdrill.trainer.exit_codes import EXIT_DIVERGED, EXIT_OK, EXIT_USAGE
from crashdrill.trainer.global_batches import GlobalBatchSampler, resharded_rng_seed
from crashdrill.trainer.model import GPT, lr_at
from crashdrill.trainer.optim import AdamW
from crashdrill.trainer.rank_batches import RankBatchSampler, rank_stream_seed
from crashdrill.trainer.rank_files_checkpoint import (
    RANK_FILES_LAYOUT,
    load_rank_file,
    save_rank_files,
)
from crashdrill.trainer.rank_read_ahead import ReadAhead, read_ahead
from crashdrill.trainer.ranks import (
    LAUNCHER,
    LOST_WAITING_CODE,
    NodeSpec,
    RankGroup,
    crash_rank_of,
    join_group,
    keep_connections,
    phase,
    rank_store,
    run_group,
)
from crashdrill.trainer.records import CHECKPOINT_REFUSED_CODE as REFUSED_CODE
from crashdrill.trainer.records import RecordWriter, float32_bits
from crashdrill.trainer.run_files import RANKS_FILE
from crashdrill.trainer.stages import Stage
from crashdrill.trainer.start_line import FRESH_LINE, resumed_line
from crashdrill.trainer.train_state import CheckpointMismatch, TrainState

# DDP's forward opens a record_function, whose first use imports the profiler's CUPTI
# monitor (5 ms on the 2-core machine): imported here, a warm process pays it, not each rank.
with contextlib.suppress(ImportError):
    import torch.profiler._cupti_monitor


class _NoRecords:
    """The records of a rank other than 0: rank 0 writes the group's, once."""

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {}

    def event(self, code: str, text: str, level: str | None = None, **f: Any) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def _check_supported(cfg: TrainConfig) -> None:
    """What the multi-rank loop does not do yet is refused, never silently ignored."""
    for name, value, wanted in (
        ("ckpt_write", cfg.ckpt_write, "atomic"),
        ("ckpt_mode", cfg.ckpt_mode, "sync"),
        ("ckpt_state", cfg.ckpt_state, "full"),
    ):
        if value != wanted:
            raise ConfigError(name, value, f"{wanted!r} with ranks = {cfg.ranks} (ranks > 1)")


def train_ranks(cfg: TrainConfig, run_dir: Path, opts: one_rank.RunOptions) -> int:
    """Train (or resume) `run_dir` on cfg.ranks ranks; returns the group's exit code."""
    _check_supported(cfg)
    try:  # a node's launcher of a group spread over nodes (torchrun's PET_* names)
        node = NodeSpec.from_env(os.environ, cfg.ranks)
    except ValueError as e:
        print(f"crashdrill run: {e}", file=sys.stderr)
        return EXIT_USAGE
    segment = run_start.start_run_dir(run_dir, opts.label, opts.preset, cfg)
    data = _load_data(cfg, run_dir, segment)
    ahead = read_ahead(cfg, run_dir)  # the checkpoint the ranks resume, read once for all
    phase(LAUNCHER, "read")
    return run_group(
        cfg.ranks,
        lambda group: _rank_main(cfg, run_dir, opts, segment, group, data, ahead),
        ranks_file=Path(run_dir) / RANKS_FILE,
        crash_rank=crash_rank_of(cfg.crash_rank, cfg.seed, cfg.ranks),
        blind=cfg.launcher == "blind",
        timeout_s=cfg.collective_timeout_s,
        on_event=lambda code, fields: _launcher_event(run_dir, segment, code, fields),
        node=node,
    )


def _load_data(cfg: TrainConfig, run_dir: Path, segment: int) -> Dataset:
    """The dataset, loaded once by the launcher before it forks the ranks, which inherit it
    (the tokens are a read-only memmap), instead of by every rank at once after the fork:
    on 2 cores that was the second-largest part of a restarted group's start. Its stage
    records are the group's, as rank 0 wrote them."""
    rec = RecordWriter(run_dir, segment)
    try:
        return load_dataset(cfg, lambda s, p: rec.write("stage", stage=s, progress=p))
    finally:
        rec.close()


def _launcher_event(run_dir: Path, segment: int, code: str, fields: dict[str, Any]) -> None:
    """An event the blind launcher writes into the group's records (one O_APPEND line, as
    rank 0's are): a rank lost while the survivors wait, and their collective's timeout."""
    if code == LOST_WAITING_CODE:
        text = (
            f"Rank {fields['lost_rank']} was lost (status {fields['status']}). The launcher does"
            " not watch its ranks, so the others wait in their next collective until it times"
            f" out after {fields['timeout_s']:g} s."
        )
        level = "warn"
    else:
        text = (
            f"Rank {fields['rank']}'s collective timed out after waiting"
            f" {fields['waited_s']:.1f} s for rank {fields['lost_rank']}; only now does the"
            " group end and restart."
        )
        level = "error"
    rec = RecordWriter(run_dir, segment)
    try:
        rec.event(code, text, level, **fields)
    finally:
        rec.close()


def _rank_main(
    cfg: TrainConfig,
    run_dir: Path,
    opts: one_rank.RunOptions,
    segment: int,
    group: RankGroup,
    data: Dataset,
    ahead: ReadAhead | None = None,
) -> int:
    rec: Any = RecordWriter(run_dir, segment) if group.leader else _NoRecords()
    try:
        return _RankRun(cfg, run_dir, opts, segment, group, rec, data, ahead).run()
    except CheckpointMismatch as e:  # what `crashdrill run` says of a one-rank run's too
        if group.leader:
            print(f"crashdrill run: {e}", file=sys.stderr)
        rec.write("stage", stage=Stage.FAILED, progress=1.0)
        written = getattr(e, "written", None)  # a WorldSizeMismatch says who wrote it
        more = {"written_ranks": written} if isinstance(written, int) else {}
        rec.event(REFUSED_CODE, f"Refused to resume: {e}.", ranks=group.world, **more)
        return EXIT_USAGE
    except Exception as e:
        rec.write("stage", stage=Stage.FAILED, progress=1.0)
        rec.event("trainer_error", f"The run failed: {type(e).__name__}.", error=type(e).__name__)
        raise
    finally:
        rec.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _device(cfg: TrainConfig, group: RankGroup) -> torch.device:
    """One GPU per rank where its node has enough of them, else the CPU (gloo)."""
    device = one_rank._pick_device(cfg)
    local = group.rank if group.local_rank is None else group.local_rank
    here = group.world // group.nodes  # ranks on this node
    if device.type == "cuda" and torch.cuda.device_count() >= here:
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


@dataclass
class _Step:
    loss: float  # the reduced loss, float32
    rank_bits: dict[str, int]
    lr: float
    grad_norm: float | None


class _RankRun:
    """One rank's run: build, resume, train; collectives in the same order on every rank."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        opts: one_rank.RunOptions,
        segment: int,
        group: RankGroup,
        rec: Any,
        data: Dataset,
        ahead: ReadAhead | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.opts, self.segment = cfg, run_dir, opts, segment
        self.group, self.rec = group, rec
        self.ahead = ahead  # the checkpoint its launcher read for every rank (or None)
        self.device = _device(cfg, group)
        determinism.configure(cfg.threads, self.device)
        # What needs no peer comes before the group's rendezvous (run: _join): the model,
        # the checkpoint found, verified and loaded, while the other ranks are forked and
        # do the same; on 2 cores a restarted group waited for each step in turn.
        self.data = data  # loaded by the launcher before the fork (_load_data)
        phase(group.rank, "data")
        self.vocab = cfg.vocab or self.data.vocab_size
        self.fingerprints = {"config": cfg.fingerprint(), "dataset": self.data.sha256[:16]}
        rec.write("stage", stage=Stage.BUILD, progress=0.0)
        determinism.seed_all(cfg.seed)  # the same initial weights on every rank
        self.model = GPT(cfg, self.vocab).to(self.device)
        self.opt: AdamW = self.model.configure_optimizer(cfg)
        phase(group.rank, "model")
        # From here each rank's global streams (dropout) are its own.
        determinism.seed_all(rank_stream_seed(cfg.seed, group.rank, group.world) % 2**63)
        self.sampler: RankBatchSampler | GlobalBatchSampler = (
            GlobalBatchSampler(self.data.train, cfg, group.rank, group.world)
            if cfg.data_layout == "global"
            else RankBatchSampler(self.data.train, cfg, group.rank, group.world)
        )
        self.resharded_from: int | None = None  # the world size of a checkpoint resharded
        self.st = TrainState()
        self.saved_step: int | None = None
        rec.write("stage", stage=Stage.BUILD, progress=1.0)

    # ------------------------------------------------------------ state

    @property
    def _own_key(self) -> str:
        """The key of the RNG and data cursor this rank saves and restores: its own, or
        rank 0's for every rank in the teaching mode rank_state = "rank0"."""
        return rank_key(self.group.rank if self.cfg.rank_state == "own" else 0)

    def _state(self, saving: bool = False, resharded: bool = False) -> dict[str, Any]:
        """What a checkpoint of this rank holds (dcp_checkpoint.py's keys); in the teaching
        mode "rank0" only rank 0 saves a rank's own state, and every rank loads it. Loaded
        on another world size (`resharded`): the replicated keys and rank 0's data cursor,
        a global sample position that is the same on every rank."""
        state: dict[str, Any] = {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "train_state": {**self.st.state_dict(), "fingerprints": dict(self.fingerprints)},
        }
        if resharded:
            state[rank_key(0)] = {"data": self.sampler.state_dict()}
        elif not saving or self.cfg.rank_state == "own" or self.group.leader:
            state[self._own_key] = {
                "rng": determinism.get_rng_state(),
                "data": self.sampler.state_dict(),
            }
        return state

    def _lacking(self, info: CheckpointInfo) -> list[str]:
        """The ranks' own parts the checkpoint does not hold ("rank1.rng", …)."""
        held = held_ranks(info)
        return [rank_part(r, p) for r in range(self.group.world) if r not in held
                for p in RANK_OWN_PARTS]  # fmt: skip

    def _restore(self, info: CheckpointInfo) -> None:
        if self.ahead is not None and info is self.ahead.info:  # read by the launcher
            state = self._state()
            fill_from(info, state, self.ahead.state)
            self._restore_state(info, state, resharded=False)
            return
        if info.manifest.get("layout") == RANK_FILES_LAYOUT:
            state = load_rank_file(info, self.group)  # refuses another world size
            self._restore_state(info, state, resharded=False)
            return
        # Before reading its index (a one-rank checkpoint has none): True when it reshards.
        resharded = check_world(info, self.group.world, self.cfg.data_layout)
        # Decided alike on every rank (from the same index), so all refuse together
        # instead of one rank leaving the others in DCP's collective load.
        lacking = sorted(set(range(self.group.world)) - held_ranks(info))
        if self.cfg.rank_state == "own" and lacking and not resharded:
            raise CheckpointMismatch(
                f"checkpoint {info.path} holds no RNG states or data position of rank "
                f'{lacking[0]} (written with rank_state = "rank0"?); refusing to resume '
                'it: rank_state = "own" restores each rank\'s own'
            )
        state = self._state(resharded=resharded)
        load_group(info, self.group, state)
        self._restore_state(info, state, resharded)
        if resharded:
            self.resharded_from = int(info.manifest["world_size"])

    def _restore_state(self, info: CheckpointInfo, state: dict[str, Any], resharded: bool) -> None:
        """Take a loaded checkpoint's state: weights, AdamW, counters, cursor and RNG."""
        got = state["train_state"].get("fingerprints", {})
        for name, want in self.fingerprints.items():
            if got.get(name) != want:
                raise CheckpointMismatch(
                    f"checkpoint {info.path} was written by a different {name} (fingerprint "
                    f"{name}: checkpoint {got.get(name)}, this run {want}); refusing to resume it"
                )
        own = state[rank_key(0) if resharded else self._own_key]
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.st.load_state_dict(state["train_state"])
        if self.cfg.rank_state == "own" or isinstance(self.sampler, GlobalBatchSampler):
            self.sampler.load_state_dict(own["data"])
        else:  # the teaching mode: rank 0's cursor taken as it is, as such a script does
            BatchSampler.load_state_dict(self.sampler, own["data"])
        if self.sampler.samples_consumed != self.st.step * self.cfg.batch:
            raise ValueError(
                f"{info.path.name}: rank {self.group.rank}'s data cursor says "
                f"{self.sampler.samples_consumed} samples, step × batch = "
                f"{self.st.step * self.cfg.batch}"
            )
        if resharded:  # an old rank's RNG is no new rank's: derived (global_batches.py)
            g = self.group
            determinism.seed_all(resharded_rng_seed(self.cfg.seed, g.rank, g.world, self.st.step))
        else:
            determinism.set_rng_state(own["rng"])

    def _save(self) -> None:
        meta = {"parts": list(ck.PARTS_FULL), "fingerprints": self.fingerprints,
                "data_layout": self.cfg.data_layout}  # fmt: skip
        state = self._state(saving=True)
        save = save_rank_files if self.cfg.ckpt_layout == RANK_FILES_LAYOUT else save_group
        r = save(
            ckpt_root(self.run_dir), self.cfg.keep, self.group, self.st.step, state,
            {**meta, "tokens": self.st.tokens},
        )  # fmt: skip
        self.saved_step = r.step
        words = ", ".join(ck.PART_WORDS[p] for p in ck.PARTS_FULL)
        fields = {"step": r.step, "bytes": r.bytes, "seconds": round(r.seconds, 4)}
        fields["persist_seconds"] = fields["seconds"]
        self.rec.write("ckpt", **fields, path=str(r.path), parts=list(ck.PARTS_FULL),
                       mode="sync", write="atomic", ranks=self.group.world)  # fmt: skip
        self.rec.event(
            "checkpoint",
            f"Checkpoint at step {r.step} from {self.group.world} ranks: "
            f"{one_rank._fmt_bytes(r.bytes)} ({words}) in {r.seconds:.2f}s.",
            **fields, mode="sync", parts=list(ck.PARTS_FULL),
        )  # fmt: skip

    # ------------------------------------------------------------ start

    def _join(self, info: CheckpointInfo | None) -> None:
        """The group's rendezvous, once this rank has its state: every rank must have
        resumed the same checkpoint (each found and verified it alone), then DDP, whose
        constructor broadcasts rank 0's weights (the same ones, loaded on every rank)."""
        group, cfg = self.group, self.cfg
        join_group(group, rank_store(group), self.device.type, cfg.collective_timeout_s)
        if cfg.launcher == "blind":
            keep_connections()  # its peers wait for a lost rank until the timeout
        phase(group.rank, "joined")
        mine = torch.tensor([info.step if info is not None else -1])
        steps = [torch.zeros_like(mine) for _ in range(group.world)]
        dist.all_gather(steps, mine)
        if len({int(s) for s in steps}) != 1:
            raise RuntimeError(f"ranks found different checkpoints: {[int(s) for s in steps]}")
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(self.model, device_ids=ids)  # GPT has no buffers
        phase(group.rank, "ddp")

    def _start(self, info: CheckpointInfo | None) -> None:
        rec, st = self.rec, self.st
        if info is None:
            if self.group.leader:
                print(FRESH_LINE, file=sys.stderr)
            if self.segment > 0:
                rec.write("resume", from_step=0, segment=self.segment, path=None)
            return
        self._restore(info)
        lacking = self._lacking(info) if self.resharded_from is None else []
        self.saved_step = info.step
        if self.group.leader:
            print(resumed_line(st.step, info.path), file=sys.stderr)
        written = self.resharded_from or self.group.world
        rec.write("resume", from_step=st.step, segment=self.segment, path=str(info.path),
                  parts=list(ck.PARTS_FULL), missing=lacking, from_ranks=written,
                  ranks=self.group.world)  # fmt: skip
        took = ""
        if lacking:
            words = ", ".join(part_description(p) for p in lacking)
            took = (f" It did not hold {words}: every rank took rank 0's, and draws rank 0's "
                    "batches from here.")  # fmt: skip
        if self.resharded_from is not None:
            took = (f" Resharded onto {self.group.world} through torch.distributed.checkpoint:"
                    f" the same global samples from sample {self.sampler.samples_consumed},"
                    f" {self.cfg.batch // self.group.world} a rank a step; each rank's RNG"
                    " derived anew.")  # fmt: skip
        rec.event("resumed", f"Resumed at step {st.step} from a checkpoint of "
                  f"{written} ranks.{took}", level="warn" if lacking else "info",
                  step=st.step, missing=lacking)  # fmt: skip

    def _run_record(self) -> None:
        cfg, rec = self.cfg, self.rec
        name = "cpu"
        peak: float | None
        peak, peak_src = metrics.cpu_peak(cfg.threads * self.group.world)
        if self.device.type == "cuda":
            name = torch.cuda.get_device_name(self.device)
            peak, peak_src = metrics.gpu_peak(name, cfg.precision)
        self.peak = peak
        rec.write("run", params=self.model.num_params(), config=cfg.to_dict(),
                  dataset=self.data.name, device=str(self.device), precision=cfg.precision,
                  device_name=name,
                  threads=cfg.threads, vocab=self.vocab, label=self.opts.label,
                  preset=self.opts.preset, fingerprints=self.fingerprints, ranks=self.group.world,
                  mfu_peak_flops=peak, mfu_peak_source=peak_src)  # fmt: skip

    # ------------------------------------------------------------ train

    def run(self) -> int:
        cfg, st = self.cfg, self.st
        info = (  # verified: sha256 of each file, here or by the launcher
            self.ahead.info
            if self.ahead is not None
            else run_start.find_checkpoint(self.run_dir, self.rec)
        )
        phase(self.group.rank, "found")
        if info is None and self.opts.require_checkpoint and cfg.on_missing_checkpoint != "fresh":
            return run_start.refuse_to_start(self.run_dir, self.rec)
        self._start(info)
        phase(self.group.rank, "loaded")
        self._join(info)
        self._run_record()
        if info is None and cfg.ckpt_policy == "every":
            self._save()
        self.rec.write("stage", stage=Stage.TRAIN, progress=st.step / cfg.steps)
        window_t, window_steps, logged = time.perf_counter(), 0, False
        tokens_per_step = self.sampler.windows_per_step * cfg.ctx
        self.model.train()
        while st.step < cfg.steps:
            s = self._update()
            if window_steps == 0 and not logged:
                phase(self.group.rank, "first_step")
            what = nonfinite(s.loss, s.grad_norm)
            if what is not None:
                return self._diverged(s, what, tokens_per_step)
            st.step += 1
            st.tokens += tokens_per_step
            st.loss_window = [*st.loss_window, s.loss][-cfg.eval_every :]
            window_steps += 1
            if st.step % cfg.log_every == 0 or st.step == cfg.steps:
                now = time.perf_counter()
                self._step_record(s, (now - window_t) / window_steps, tokens_per_step, logged)
                logged, window_t, window_steps = True, now, 0
            if self.opts.progress and self.group.leader:
                self.opts.progress(st.step, cfg.steps, s.loss)
            if self.group.leader:
                self._reports()
            every = cfg.ckpt_policy == "every" and st.step % cfg.ckpt_every == 0
            if st.step == cfg.steps or every:
                self._save()
        self.rec.write("stage", stage=Stage.TRAIN, progress=1.0)
        self.rec.write("stage", stage=Stage.FINISHED, progress=1.0)
        best = f" Best val loss {st.best_val:.3f}." if st.best_val is not None else ""
        self.rec.event("finished", f"Finished {cfg.steps} steps.{best}", steps=cfg.steps,
                       best_val=st.best_val)  # fmt: skip
        return EXIT_OK

    def _update(self) -> _Step:
        """One optimizer update of the group: every rank's loss, gathered before backward
        so that all ranks skip the update together when any loss is not finite."""
        lr = lr_at(self.st.step, self.cfg)
        for g in self.opt.param_groups:
            g["lr"] = lr
        x, y = self.sampler.next_batch()
        x, y = x.to(self.device), y.to(self.device)
        with evaluate._autocast(self.device, self.cfg):
            _, loss = self.ddp(x, y)
        assert loss is not None
        mine = loss.detach().float().reshape(1)
        every = [torch.zeros_like(mine) for _ in range(self.group.world)]
        dist.all_gather(every, mine)  # a CPU-GPU sync point, every step on purpose
        losses = torch.cat(every).cpu()
        reduced = float(losses.mean())
        bits = {str(r): float32_bits(float(v)) for r, v in enumerate(losses.tolist())}
        grad_norm: float | None = None
        self.opt.zero_grad(set_to_none=True)
        if all(math.isfinite(v) for v in losses.tolist()):
            loss.backward()  # DDP averages the gradients over the ranks here
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                             self.cfg.grad_clip))  # fmt: skip
            if math.isfinite(grad_norm):
                self.opt.step()
        return _Step(reduced, bits, lr, grad_norm)

    def _step_record(self, s: _Step, dt: float, tokens_per_step: int, logged: bool) -> None:
        tps = tokens_per_step / dt if dt > 0 else 0.0
        mem, mem_kind = metrics.memory_bytes(self.device)
        flops = self.model.flops_per_token()
        startup = {} if logged else {"startup_s": one_rank._startup_s()}
        self.rec.write("step", step=self.st.step, loss=s.loss, loss_bits=float32_bits(s.loss),
                       rank_loss_bits=s.rank_bits, lr=s.lr, grad_norm=s.grad_norm,
                       tokens=self.st.tokens, tokens_per_s=round(tps, 1),
                       mfu=round(flops * tps / self.peak, 5) if self.peak else None,
                       mem_bytes=mem, mem_kind=mem_kind, dt=round(dt, 5), **startup)  # fmt: skip
        if self.opts.jsonl and self.group.leader:
            one_rank.print_loss_line(self.st.step, s.loss, self.segment,
                                     rank_loss_bits=s.rank_bits)  # fmt: skip

    def _reports(self) -> None:
        """Val, probes and samples, on rank 0's model (the same weights on every rank)."""
        cfg, st, rec, model, device = self.cfg, self.st, self.rec, self.model, self.device
        if st.step % cfg.eval_every == 0 or st.step == cfg.steps:
            v = evaluate.val_loss(model, self.data.val, cfg, device)
            train_mean = sum(st.loss_window) / len(st.loss_window)
            st.best_val = v if st.best_val is None else min(st.best_val, v)
            rec.write("val", step=st.step, val_loss=v, train_loss=train_mean)
            rec.event("evaluated", f"Step {st.step}: val {v:.3f}, train {train_mean:.3f} "
                      f"(gap {v - train_mean:+.3f}).", step=st.step, val_loss=v,
                      train_loss=train_mean)  # fmt: skip
        if st.step % cfg.probe_every == 0 or st.step == cfg.steps:
            rec.write("probe", step=st.step,
                      probes=evaluate.probes(model, self.data.tokenizer, device))  # fmt: skip
        if cfg.sample_tokens and (st.step % cfg.sample_every == 0 or st.step == cfg.steps):
            text = evaluate.sample(model, self.data.tokenizer, cfg, device)
            rec.write("sample", step=st.step, prompt=evaluate.SAMPLE_PROMPT, text=text)

    def _diverged(self, s: _Step, what: str, tokens_per_step: int) -> int:
        record_divergence(
            self.rec, step=self.st.step + 1, what=what, loss=s.loss, lr=s.lr,
            grad_norm=s.grad_norm, tokens=self.st.tokens + tokens_per_step,
            mem_kind=metrics.memory_bytes(self.device)[1], checkpoint_step=self.saved_step,
            progress=round(self.st.step / self.cfg.steps, 4),
        )  # fmt: skip
        if self.group.leader:
            print(diverged_line(self.st.step + 1, what), file=sys.stderr)
        return EXIT_DIVERGED
