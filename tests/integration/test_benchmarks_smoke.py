"""Every benchmark at its `--smoke` size, as a user runs it (`python benchmarks/X.py
--smoke` in a subprocess): it exits 0 and prints its figure rows, so no benchmark rots
into one nobody can run. The figures' values are timings and are never asserted; what is
asserted is that each row is there with numbers in it, and the behaviour a row reports
where it is not a timing (a crash test pressed, a resume bit-identical). kill_soak.py and
gpu_check.py have their own tests (test_kill_soak.py, test_gpu_check_smoke.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.extras import require_extra
from tests.support.postgres import find_bin_dir, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RUN_TIMEOUT_S = 240
N = r"[\d.,]+"  # a figure, whatever its value

SMOKES = [
    pytest.param(
        "abuse.py",
        [],
        [
            rf"^cookie-less pair flood\s+{N}\s+{N}\s+0\s+{N}",
            rf"^SSE flood \(one address\)\s+{N}\s+{N}\s+0\s+{N}",
            r"^disk-hog overrides\s+3\s+3\s+0\s+0\s+422×3\s+e\.g\. .*max_disk_bytes_per_run",
            rf"^honest pair: \['finished', 'finished'\], crash test on A:"
            rf" pressed \(202 in {N} ms\),",
            r"resume checks of A: 1, bit-identical: True",
            rf"^GET /api/pairs/\{{id\}} during the attack .*: p50 {N} ms, p99 {N} ms",
            rf"^socket flood: 300 sockets from 1 address\(es\) for {N} s: opened {N}, refused"
            rf" with 503 [1-9]",
            rf"^  sockets held by the attacker: max {N}, mean {N}",
            rf"^GET /api/health during the flood \({N} requests, 0 failed\): p50 {N} ms,"
            rf" p99 {N} ms",
            r"^crash test during the flood: pressed .*\['finished', 'finished'\],",
            r"^  resume checks of A: 1, bit-identical: True",
            rf"^diverging settings .*: runs \['diverged', 'diverged'\] at steps \[{N}, {N}\]"
            rf" after {N} s; {N} student answers read, 0 with a NaN, a traceback or a server path",
        ],
        id="abuse",
    ),
    pytest.param(
        "class_load.py",
        [],
        [
            rf"^  queue wait p50 / p99\s+{N} / {N} s",
            rf"^  start → first step p50 / p99\s+{N} / {N} s",
            rf"^  crash → first recomputed step p50 / p99\s+{N} / {N} s",
            rf"^  crash → verdict p50 / p99\s+{N} / {N} s",
            rf"^  record written → on the stream p50 / p99\s+{N} / {N} ms",
            rf"^  GET /api/pairs/\{{id\}} p50 / p99\s+{N} / {N} ms",
            r"^  verdicts bit-identical\s+([1-9]\d*) of \1$",
            r"^  5xx answers\s+0 ",
            r"^  records lost / repeated, page \(first load \+ stream\)\s+0 / 0 ",
            r"^  records lost / repeated, records API\s+0 / 0$",
            rf"^  server CPU over the class\s+{N} % of a core",
            rf"^  peak RSS server / all trainers\s+{N} / {N} MB",
        ],
        id="class_load",
    ),
    pytest.param(
        "graceful_stop.py",
        [],
        [rf"^quick\s+{label}\s+{N}\s+{N} MB\s+{N}s\s+30s\s+\w+\s+{N}s$" for label in "AB"],
        id="graceful_stop",
    ),
    pytest.param(
        "ranks.py",
        [],
        [
            rf"^  1 rank\(s\):\s+{N} tokens/s · checkpoint save\s+{N} ms \(median\) · saves",
            rf"^  2 rank\(s\):\s+{N} tokens/s · checkpoint save\s+{N} ms",
            rf"^  kill, 1 rank\s+median {N} s",
            rf"^  kill, 2 ranks\s+median {N} s",
            rf"^  rank, 2 ranks\s+median {N} s",
            rf"^  rank, 2 ranks: the launcher noticed the lost rank in median {N} ms",
            rf"^  kill, 2 ranks / kill, 1 rank: {N}×",
            rf"^\s+{N} s\s+\(\s*[+-]{N}\)\s+init_process_group",
        ],
        id="ranks",
    ),
    pytest.param(
        "ray_cluster.py",
        [],
        [
            rf"^local\s+{N}s\s+—\s+{N}/{N} ms\s+{N} %$",
            rf"^local: checkpoint record written → in the records API: p50 {N} ms, max {N} ms",
        ],
        id="ray_cluster-local",
    ),
    pytest.param(
        "ray_cluster.py",
        ["--executors", "ray"],
        [
            rf"^ray\s+{N}s\s+{N}s\s+{N}/{N} ms\s+{N} %$",
            rf"^ray: checkpoint record written → in the records API: p50 {N} ms, max {N} ms",
        ],
        id="ray_cluster-ray",
        marks=pytest.mark.ray,
    ),
    pytest.param(
        "remote_db.py",
        [],
        [rf"^\s+5\s+10 \|(\s+{N}){{3}} \|(\s+{N}){{3}} \|(\s+{N}){{3}} \|\s+{N}\s+{N} \|\s+{N}%$"],
        id="remote_db",
    ),
    pytest.param(
        "stream_fanout.py",
        [],
        [rf"^\s+80\s+{N}\s+{N}/80\s+{N}(\s+{N}){{3}}\s+{N}%\s+{N}%$"],
        id="stream_fanout",
    ),
    pytest.param(
        "telemetry_overhead.py",
        [],
        [
            rf"^back to back, 20 samples: {N} µs CPU/sample, {N} µs wall/sample",
            rf"^live thread, {N} samples every 0.2 s: {N} µs CPU/sample",
            rf"^a run's 2 ranks, 20 reads: {N} µs CPU/read",
        ],
        id="telemetry_overhead",
    ),
    pytest.param(
        "trainer_throughput.py",
        [],
        [
            rf"^plain PyTorch loop :\s+{N} tokens/s$",
            rf"^crashdrill trainer :\s+{N} tokens/s\s+ratio {N}",
            rf"^checkpoint every 10 steps, sync : overhead [+-]{N} %",
            rf"^checkpoint every 10 steps, async: overhead [+-]{N} %",
            rf"^checkpoint size {N} MB",
        ],
        id="trainer_throughput",
    ),
    pytest.param(
        "verify_speed.py",
        [],
        [
            rf"^one uninterrupted run of quick\s+{N} s wall",
            r"^seed 1 \(.*\): .* exit 0, kills ",
            rf"^\[fork\] quick drill wall, 2 kills: median {N} s",
            rf"^\[fork\] crash → first resumed step record: median {N} s .*n 2\)$",
            rf"^plain `crashdrill run quick`, before each seed: median {N} s .*n {N}\)$",
            rf"^\[fork\] drill median / plain run median: {N}× \(target ≤ 1\.3×\)$",
        ],
        id="verify_speed",
    ),
]


def needs(script: str, args: list[str]) -> None:
    """Skip (or, for Postgres under CI=true, fail) when what the benchmark runs on is absent."""
    if script == "remote_db.py":
        try:
            import psycopg  # noqa: F401
        except ImportError:
            unavailable("psycopg is not installed: pip install 'crashdrill[postgres]'")
        if find_bin_dir() is None:
            unavailable("no PostgreSQL binaries in /usr/lib/postgresql/*/bin or on PATH")
    if "ray" in args:
        require_extra("ray")


@pytest.mark.parametrize(("script", "args", "rows"), SMOKES)
def test_the_benchmark_runs_at_its_smoke_size_and_prints_its_figures(
    script: str, args: list[str], rows: list[str]
) -> None:
    needs(script, args)
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--smoke", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    out = proc.stdout
    told = f"exit {proc.returncode}\n--- stdout\n{out[-4000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, told
    missing = [row for row in rows if not re.search(row, out, re.MULTILINE)]
    assert not missing, f"rows not printed: {missing}\n{told}"
