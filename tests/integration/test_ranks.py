"""Real 2-rank groups (gloo on CPU, forked by the trainer): DDP training, DCP checkpoints
under the atomic contract, a SIGKILL of the whole group and a bit-identical resume of
every rank's loss."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from crashdrill.trainer.checkpoint_layout import checkpoints, dcp_shard_rank
from crashdrill.trainer.exit_codes import EXIT_USAGE
from crashdrill.trainer.presets import Crash, Knob, dump_preset, get_preset
from crashdrill.trainer.records import bits_to_float32, float32_bits, read_records
from crashdrill.trainer.run_files import RANKS_FILE
from crashdrill.workers.launch import Launch
from crashdrill.workers.run_dir import RunDir
from crashdrill.workers.supervisor import Supervisor
from tests.conftest import crashdrill_cmd, run_cli
from tests.support.supervising import Changes, wait_for_step

pytestmark = pytest.mark.slow
SETTINGS = ["--set", "steps=30", "--set", "ckpt_every=10", "--set", "eval_every=10"]
TWO_RANKS = ["run", "quick", "--quiet", "--set", "ranks=2", *SETTINGS]


def _steps(run_dir: Path) -> dict[tuple[int, int], dict]:
    recs, _ = read_records(run_dir / "records.jsonl")
    return {(r["segment"], r["step"]): r for r in recs if r["kind"] == "step"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted 2-rank run, shared by the tests here."""
    ref = tmp_path_factory.mktemp("ranks-ref")
    run_cli(*TWO_RANKS, "--run-dir", str(ref), check=True, timeout=300)
    return ref


def test_two_ranks_record_the_reduced_loss_and_each_rank_s_own_bits(reference: Path) -> None:
    steps = _steps(reference)
    assert sorted(s for _, s in steps) == list(range(1, 31))
    for rec in steps.values():
        bits = rec["rank_loss_bits"]
        assert sorted(bits) == ["0", "1"]
        assert bits["0"] != bits["1"]  # each rank trains on batches of its own
        mean = torch.tensor([bits_to_float32(bits["0"]), bits_to_float32(bits["1"])]).mean()
        assert rec["loss_bits"] == float32_bits(float(mean))


def test_a_dcp_checkpoint_lists_every_rank_s_files_with_hashes_and_keeps_k(
    reference: Path,
) -> None:
    kept = list(checkpoints(reference))  # verified: every file's size and sha256
    assert [c.step for c in kept] == [30, 20]  # keep = 2
    m = kept[0].manifest
    assert m["layout"] == "dcp" and m["world_size"] == 2
    assert {dcp_shard_rank(n) for n in m["rank_files"]["1"]} == {1}
    assert ".metadata" in m["files"] and all(len(e["sha256"]) == 64 for e in m["files"].values())
    assert not list((reference / "ckpt").glob("*.tmp"))


def test_rank_0_writes_the_replicated_state_so_its_best_val_is_the_one_resumed(
    reference: Path,
) -> None:
    # Only rank 0 evaluates: rank 1's train_state holds best_val None. DCP keeps one copy of
    # each item every rank holds; balanced by size, that copy can be rank 1's.
    import torch.distributed.checkpoint as dcp

    info = next(iter(checkpoints(reference)))
    meta = dcp.FileSystemReader(str(info.path)).read_metadata()
    shared = ("model.", "optimizer.", "train_state.")
    writers = {i.fqn: s.relative_path for i, s in meta.storage_data.items()}
    assert {dcp_shard_rank(w) for k, w in writers.items() if k.startswith(shared)} == {0}
    assert {dcp_shard_rank(w) for k, w in writers.items() if k.startswith("rank1.")} == {1}
    recs, _ = read_records(reference / "records.jsonl")
    vals = [r["val_loss"] for r in recs if r["kind"] == "val"]
    best = {"train_state.best_val": None}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(best, storage_reader=dcp.FileSystemReader(str(info.path)), no_dist=True)
    assert best["train_state.best_val"] == min(vals)


def _live_in_group(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies (a dead rank awaiting its reaper)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(stat.parent.name))
    return live


def test_a_killed_group_resumes_bit_identically_on_every_rank(
    reference: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen(
        crashdrill_cmd(*TWO_RANKS, "--run-dir", str(run)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while not any(c.step >= 10 for c in checkpoints(run, check="manifest")):
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint at 10"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks: one process group
    proc.wait()
    # SIGKILL is delivered to every member at once, but a rank may take a moment to be torn
    # down after its launcher was reaped: gone within seconds, none left behind.
    gone_by = time.monotonic() + 10
    while _live_in_group(proc.pid) and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert _live_in_group(proc.pid) == []
    run_cli(*TWO_RANKS, "--run-dir", str(run), "--require-checkpoint", check=True, timeout=300)
    ref, resumed = _steps(reference), _steps(run)
    recomputed = [s for seg, s in resumed if seg == 1]
    assert recomputed and min(recomputed) >= 11 and max(recomputed) == 30
    for step in recomputed:
        for field in ("loss_bits", "rank_loss_bits", "grad_norm", "lr", "tokens"):
            assert resumed[(1, step)][field] == ref[(0, step)][field], (step, field)


def _rank_crash_preset(tmp_path: Path) -> Path:
    """quick on two ranks, checkpoints every 10 steps, whose Crash test kills rank 1."""
    quick = get_preset("quick")
    run = {**quick.run, "ranks": 2, "crash_rank": 1, "steps": 40, "eval_every": 10}
    preset = replace(
        quick, id="ranks-crash", run=run, knob=Knob("ckpt_every", 10, 20), crash=Crash("rank")
    )
    path = tmp_path / "ranks-crash.toml"
    path.write_text(dump_preset(preset))
    return path


def test_a_rank_crash_kills_one_rank_and_the_group_resumes_bit_identically(
    tmp_path: Path,
) -> None:
    """Crash mode rank: the supervisor SIGKILLs rank 1 alone, the launcher takes the group
    down, the restart resumes the last checkpoint and recomputes every rank's losses bit
    for bit; the crash event names the rank and how long the launcher took to notice."""
    changes, rd = Changes(), RunDir(tmp_path / "run")
    sup = Supervisor(Launch(rd.path, str(_rank_crash_preset(tmp_path)), "A"), changes)
    sup.start()
    wait_for_step(rd, 13, timeout=180)
    said = json.loads((rd.path / RANKS_FILE).read_text())
    killed = sup.crash("rank")
    assert killed == said["pids"]["1"] and said["launcher"] == changes.items[0].pid != killed
    changes.wait_for("finished", timeout=240)
    assert changes.states() == ["running", "restarting", "running", "finished"]
    recs, _ = read_records(rd.records)
    (crash,) = [r for r in recs if r.get("code") == "crash"]
    assert crash["crash_mode"] == "rank" and crash["lost_rank"] == 1, crash
    assert crash["text"].startswith(f"Crash test: killed rank 1 of 2 (pid {killed})"), crash
    assert isinstance(crash["noticed_s"], float) and "its launcher noticed in" in crash["text"]
    steps = {(r["segment"], r["step"]): r for r in recs if r["kind"] == "step"}
    again = sorted(s for seg, s in steps if seg == 1 and (0, s) in steps)
    assert again and again[0] == crash["resume_from"] + 1, (again, crash)
    for step in again:
        for field in ("loss_bits", "rank_loss_bits", "grad_norm", "lr", "tokens"):
            assert steps[(1, step)][field] == steps[(0, step)][field], (step, field)


def test_a_one_rank_checkpoint_is_refused_by_a_two_rank_run_naming_both(tmp_path: Path) -> None:
    one = ["run", "quick", "--quiet", "--set", "steps=2", "--set", "warmup=0"]
    run_cli(*one, "--run-dir", str(tmp_path), check=True, timeout=300)
    two = run_cli(
        *one, "--set", "ranks=2", "--set", "steps=4", "--run-dir", str(tmp_path), timeout=300
    )
    assert two.returncode == EXIT_USAGE
    assert "written by a one-rank run, this run has 2 ranks" in two.stderr


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank")
def test_two_ranks_train_on_nccl_with_a_gpu_each(tmp_path: Path) -> None:
    run_cli(*TWO_RANKS, "--set", "device=cuda", "--run-dir", str(tmp_path), check=True)
    recs, _ = read_records(tmp_path / "records.jsonl")
    run = next(r for r in recs if r["kind"] == "run")
    assert run["device"].startswith("cuda") and run["ranks"] == 2
    assert json.dumps(_steps(tmp_path)[(0, 30)]["rank_loss_bits"])


def test_the_drill_on_two_ranks_is_bit_identical_rank_by_rank(tmp_path: Path) -> None:
    """`crashdrill verify --preset quick --set ranks=2`: a kill before the first checkpoint
    and one inside a DCP write (held open by the pause hook), each resume bit-identical in
    the reduced loss and in every rank's own loss bits, and the final weights equal."""
    out = tmp_path / "report.json"
    args = ["verify", "--preset", "quick", "--set", "ranks=2", *SETTINGS, "--set", "steps=40"]
    proc = run_cli(*args, "--kills", "2", "--seed", "1", "--json", str(out), timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(out.read_text())
    assert rep["verdict"] == "pass" and rep["target"]["set"][0] == "ranks=2"
    assert any(k["in_checkpoint_write"] for k in rep["kills"])
    for resume in rep["resumes"]:
        assert resume["bit_identical"]
        ranks = {f["field"]: f for f in resume["fields"] if "rank_loss_bits" in f["field"]}
        assert set(ranks) == {"step.rank_loss_bits.0", "step.rank_loss_bits.1"}, resume["fields"]
        assert all(f["equal"] and f["points"] > 0 for f in ranks.values())
    assert rep["final_state"]["equal"] and rep["final_state"]["items"] > 0


def test_inspect_says_which_ranks_wrote_a_dcp_checkpoint(reference: Path) -> None:
    newest = next(iter(checkpoints(reference, check="manifest"))).path
    proc = run_cli("inspect", str(newest), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "written by 2 rank(s): 0, 1" in proc.stdout
    assert "rank0.data" in proc.stdout and "rank1.data" in proc.stdout  # each rank's cursor


def test_lesson_1_16_s_broken_side_fails_the_drill_with_rank_1_named(tmp_path: Path) -> None:
    """`crashdrill verify --preset lesson-1.16 --run B`: rank 0 saves the RNG and data cursor
    for all, so after a kill rank 1 trains on rank 0's batches: the drill fails and its
    finding (and the JSON) name rank 1 at the first recomputed step."""
    out = tmp_path / "report.json"
    args = ["verify", "--preset", "lesson-1.16", "--run", "B", "--set", "steps=60"]
    proc = run_cli(*args, "--kills", "1", "--seed", "3", "--json", str(out), timeout=280)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rep = json.loads(out.read_text())
    (finding,) = [f for f in rep["diagnosis"] if f["code"] == "rank-state"]
    assert "differs on rank 1 while the other ranks' match" in finding["text"], finding
    (resume,) = rep["resumes"]
    assert resume["first_divergent_rank"]["rank"] == 1
    assert resume["first_divergent_rank"]["step"] == resume["first_divergent_step"]
    assert "resume 1 ranks: rank 1 first, at step" in proc.stdout


def test_a_checkpoint_holding_only_rank_0_s_state_is_refused_by_a_run_that_restores_its_own(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    base = [*TWO_RANKS, "--run-dir", str(run_dir), "--set", "steps=10", "--set", "warmup=5"]
    run_cli(*base, "--set", "rank_state=rank0", check=True, timeout=300)
    proc = run_cli(*base, "--set", "steps=20", timeout=300)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "holds no RNG states or data position of rank 1" in proc.stderr, proc.stderr


def _launcher_run(tmp_path: Path, label: str) -> tuple[list[dict], float, int]:
    """A 2-rank run of a launcher lesson's side `label` (A watches, B is blind; collective
    timeout 5 s) whose Crash test kills rank 1 at step 13; its records, the kill's time and
    the killed pid, once it finished."""
    quick = get_preset("quick")
    run = {**quick.run, "ranks": 2, "crash_rank": 1, "steps": 30, "eval_every": 10,
           "ckpt_every": 10, "collective_timeout_s": 5.0}  # fmt: skip
    preset = replace(
        quick, id="ranks-launcher", run=run, knob=Knob("launcher", "watch", "blind"),
        crash=Crash("rank"),
    )  # fmt: skip
    path = tmp_path / "ranks-launcher.toml"
    path.write_text(dump_preset(preset))
    changes, rd = Changes(), RunDir(tmp_path / label)
    sup = Supervisor(Launch(rd.path, str(path), label), changes)
    sup.start()
    wait_for_step(rd, 13, timeout=180)
    killed_at = time.time()
    killed = sup.crash("rank")
    changes.wait_for("finished", timeout=240)
    assert changes.states() == ["running", "restarting", "running", "finished"]
    recs, _ = read_records(rd.records)
    steps = {(r["segment"], r["step"]): r for r in recs if r["kind"] == "step"}
    again = sorted(s for seg, s in steps if seg == 1 and (0, s) in steps)
    assert again, "nothing was recomputed"
    for step in again:
        for field in ("loss_bits", "rank_loss_bits", "grad_norm", "lr", "tokens"):
            assert steps[(1, step)][field] == steps[(0, step)][field], (label, step, field)
    restarted = min(r["t"] for r in recs if r["segment"] == 1)
    print(f"launcher {label}: lost rank 1 → group restarted in {restarted - killed_at:.2f} s")
    return recs, killed_at, killed


def _codes(recs: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for r in recs:
        if r["kind"] == "event":
            found.setdefault(r["code"], []).append(r)
    return found


def test_a_launcher_that_watches_takes_the_group_down_when_a_rank_is_lost(
    tmp_path: Path,
) -> None:
    """Lesson 1.17's A: the launcher SIGKILLs the survivor at once, nobody waits for the
    collective timeout, and the group resumes bit-identically."""
    recs, _, killed = _launcher_run(tmp_path, "A")
    codes = _codes(recs)
    assert "rank_lost_waiting" not in codes and "collective_timed_out" not in codes
    (crash,) = codes["crash"]
    assert crash["lost_rank"] == 1 and "its launcher noticed in" in crash["text"], crash
    assert crash["text"].startswith(f"Crash test: killed rank 1 of 2 (pid {killed})"), crash


def test_a_blind_launcher_leaves_the_survivor_waiting_until_its_collective_times_out(
    tmp_path: Path,
) -> None:
    """Lesson 1.17's B: the launcher says the rank was lost and when the survivor's
    collective times out; the group ends only when it has, then resumes bit-identically."""
    recs, killed_at, killed = _launcher_run(tmp_path, "B")
    codes = _codes(recs)
    (waiting,) = codes["rank_lost_waiting"]
    assert waiting["lost_rank"] == 1 and waiting["timeout_s"] == 5.0, waiting
    assert waiting["level"] == "warn" and waiting["segment"] == 0
    noticed = waiting["deadline"] - waiting["timeout_s"]
    assert killed_at <= noticed + 0.01 and noticed <= waiting["t"] + 0.01, waiting
    (timed_out,) = codes["collective_timed_out"]
    assert timed_out["rank"] == 0 and timed_out["lost_rank"] == 1, timed_out
    # Not "Connection closed by peer" at once: the survivor waited for the timeout.
    assert timed_out["waited_s"] > waiting["timeout_s"] / 2, timed_out
    (crash,) = codes["crash"]
    assert crash["lost_rank"] == 1 and crash["text"].startswith(
        f"Crash test: killed rank 1 of 2 (pid {killed})"
    )
    assert "its launcher does not watch its ranks, so the others waited" in crash["text"]
    print(f"launcher B: the survivor waited {timed_out['waited_s']:.2f} s (timeout 5 s)")


def test_the_launcher_reads_ahead_only_a_checkpoint_every_rank_resumes_as_it_is(
    reference: Path,
) -> None:
    """read_ahead: the newest verified DCP checkpoint of this world size, every rank's own
    state in it; anything the ranks must decide (another world size, the teaching modes)
    is left to them."""
    from crashdrill.trainer.rank_read_ahead import read_ahead

    cfg = replace(get_preset("quick").config_for("A"), ranks=2)
    ahead = read_ahead(cfg, reference)
    assert ahead is not None and ahead.info.step == 30
    assert sorted(ahead.state) == ["model", "optimizer", "rank0", "rank1", "train_state"]
    assert ahead.state["train_state"]["step"] == 30
    assert read_ahead(replace(cfg, ranks=4), reference) is None  # a reshard or a refusal
    assert read_ahead(replace(cfg, rank_state="rank0"), reference) is None
