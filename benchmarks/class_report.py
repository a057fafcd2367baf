"""The figures and checks of benchmarks/class_load.py from what its students saw.

    figures = summarize(students, base_url, data_dir)   # after the class, the server still up
    report(figures)                                      # the rows it prints
    checks(figures)                                      # the failed checks ([]: all held)

Percentiles are nearest-rank over every value the students measured (p99 of 60 runs is
the second largest). `--json` gets the figures and one row per student.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from class_audit import audit_run  # siblings: benchmarks run as scripts
from class_student import Student


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def spread(values: list[float], scale: float = 1.0) -> dict[str, Any]:
    """p50, p99 and max (None when nothing was measured), times `scale`, and the count."""
    out: dict[str, Any] = {"n": len(values)}
    for name, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0)):
        v = pct(values, q)
        out[name] = None if v is None else v * scale
    return out


def student_row(s: Student) -> dict[str, Any]:
    """What one student saw, for --json: its times relative to when it pressed Start."""

    def rel(t: float | None) -> float | None:
        return None if t is None or s.posted_at is None else round(t - s.posted_at, 3)

    runs = {
        label: {
            "id": r.id,
            "state": r.state,
            "left_queue": rel(r.left_queue_at),
            "first_step": rel(r.first_step_at),
            "first_ckpt_step": r.first_ckpt_step,
            "crash_target": r.crash_target,
            "crash_sent": rel(r.crash_sent_at),
            "crash_status": r.crash_status,
            "crash_missed": r.crash_missed,
            "recomputed": rel(r.recomputed_at),
            "verdict": rel(r.verdict_at),
            "bit_identical": r.verdict["bit_identical"] if r.verdict else None,
            "records": len(r.records),
            "gaps": r.gaps,
        }
        for label, r in s.runs.items()
    }
    return {
        "index": s.index,
        "address": s.address,
        "arrive_s": s.arrive_s,
        "pair": s.pair,
        "error": s.error,
        "runs": runs,
    }


def summarize(students: list[Student], base_url: str, data_dir: Path) -> dict[str, Any]:
    runs = [r for s in students for r in s.runs.values()]
    a_runs = [s.runs["A"] for s in students if "A" in s.runs]
    with_verdict = [r for r in a_runs if r.verdict is not None]
    audits = {}
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for r in runs:
            records = client.get(f"/api/runs/{r.id}/records", params={"limit": 20000}).json()[
                "records"
            ]
            audits[r.id] = audit_run(data_dir / "runs" / r.id, r, records)
    counted = ("stream_lost", "stream_repeated", "api_lost", "api_repeated")
    totals = {k: sum(a[k] for a in audits.values()) for k in counted}
    statuses: dict[int, int] = {}
    for s in students:
        for code, n in s.statuses.items():
            statuses[code] = statuses.get(code, 0) + n
    return {
        "pairs_started": sum(1 for s in students if s.pair),
        "student_errors": [f"student {s.index}: {s.error}" for s in students if s.error],
        "failed_runs": [f"{r.id} ({r.label}): {r.state}" for r in runs if r.state != "finished"],
        "statuses": dict(sorted(statuses.items())),
        "http_5xx": sum(n for code, n in statuses.items() if code >= 500),
        "crashes": sum(1 for r in a_runs if r.crash_status == 202),
        "missed_crashes": [f"{r.id}: {r.crash_missed}" for r in a_runs if r.crash_missed],
        "cost_no_step": sum(1 for r in a_runs if r.cost_no_step),
        "verdicts": len(with_verdict),
        "bit_identical": sum(1 for r in with_verdict if r.verdict["bit_identical"]),  # type: ignore[index]
        "queue_wait_s": spread(
            [
                r.left_queue_at - s.posted_at
                for s in students
                for r in s.runs.values()
                if r.left_queue_at is not None and s.posted_at is not None
            ]
        ),
        "start_to_first_step_s": spread(
            [
                r.first_step_at - r.left_queue_at
                for r in runs
                if r.first_step_at is not None and r.left_queue_at is not None
            ]
        ),
        "crash_to_recomputed_s": spread(
            [
                r.recomputed_at - r.crash_sent_at
                for r in a_runs
                if r.recomputed_at is not None and r.crash_sent_at is not None
            ]
        ),
        "crash_to_verdict_s": spread(
            [r.verdict_at - r.crash_sent_at for r in with_verdict if r.crash_sent_at is not None]  # type: ignore[operator]
        ),
        "record_to_stream_ms": spread([d for r in runs for d in r.delays], 1000),
        "pair_get_ms": spread([d for s in students for d in s.pair_get_s], 1000),
        "records": totals,
        "stream_gaps": sum(r.gaps for r in runs),
        "file_problems": [f"{rid}: {p}" for rid, a in audits.items() for p in a["file"]],
        "lost_examples": {
            rid: a["lost_examples"] for rid, a in audits.items() if a["lost_examples"]
        },
        "per_student": [student_row(s) for s in students],
    }


def checks(r: dict[str, Any]) -> list[str]:
    """The failed checks of one executor's class (empty: all held)."""
    failed = [f"{r['http_5xx']} answers were 5xx"] if r["http_5xx"] else []
    failed += r["student_errors"] + [f"run {x}, not finished" for x in r["failed_runs"]]
    for what, n in r["records"].items():
        if n:
            failed.append(f"{n} records {what.replace('_', ' ')}")
    failed += [f"records.jsonl of {p}" for p in r["file_problems"]]
    if r["bit_identical"] < r["verdicts"]:
        failed.append(f"{r['verdicts'] - r['bit_identical']} resumes not bit-identical")
    if not r["verdicts"]:
        failed.append("measured nothing: no student got a verdict")
    return failed


def fmt(d: dict[str, Any], unit: str, digits: int = 2) -> str:
    if not d["n"]:
        return "—"
    p50, p99, top = (f"{d[k]:.{digits}f}" for k in ("p50", "p99", "max"))
    return f"{p50} / {p99} {unit} (max {top}, n={d['n']})"


def target(value: float | None, limit: float) -> str:
    if value is None:
        return "not measured"
    return "met" if value <= limit else "missed"


def report(r: dict[str, Any]) -> None:
    crash, pair_get = r["crash_to_recomputed_s"], r["pair_get_ms"]
    rows = [
        ("students, pairs started", f"{r['students']}, {r['pairs_started']} ({r['run_limit']})"),
        ("queue wait p50 / p99", fmt(r["queue_wait_s"], "s")),
        ("start → first step p50 / p99", fmt(r["start_to_first_step_s"], "s")),
        ("crash → first recomputed step p50 / p99", fmt(crash, "s")),
        ("crash → verdict p50 / p99", fmt(r["crash_to_verdict_s"], "s")),
        ("record written → on the stream p50 / p99", fmt(r["record_to_stream_ms"], "ms", 0)),
        ("GET /api/pairs/{id} p50 / p99", fmt(pair_get, "ms", 0)),
        (
            "crash tests, missed, cost no step",
            f"{r['crashes']}, {len(r['missed_crashes'])}, {r['cost_no_step']}",
        ),
        ("verdicts bit-identical", f"{r['bit_identical']} of {r['verdicts']}"),
        ("5xx answers", f"{r['http_5xx']} (all answers: {r['statuses']})"),
        (
            "records lost / repeated, page (first load + stream)",
            f"{r['records']['stream_lost']} / {r['records']['stream_repeated']}"
            f" ({r['stream_gaps']} gaps refetched)",
        ),
        (
            "records lost / repeated, records API",
            f"{r['records']['api_lost']} / {r['records']['api_repeated']}",
        ),
        ("records.jsonl step problems", str(len(r["file_problems"]))),
        (
            "server CPU over the class",
            f"{r['server_cpu_pct']:.1f} % of a core ({r['class_s']:.0f} s)",
        ),
        (
            "peak RSS server / all trainers",
            f"{r['server_peak_rss_mb']:.0f} / {r['trainers_peak_rss_mb']:.0f} MB"
            f" (at most {r['most_trainers']} trainer processes)",
        ),
        ("load average at start / end", "{:.1f} / {:.1f}".format(*r["load_average"])),
        ("target: crash → recomputed p99 ≤ 3 s", target(crash["p99"], 3.0)),
        ("target: GET /api/pairs/{id} p99 ≤ 500 ms", target(pair_get["p99"], 500.0)),
    ]
    print(f"\n== {r['executor']} ==")
    for name, value in rows:
        print(f"  {name:<42} {value}")
    for miss in r["missed_crashes"]:
        print(f"  missed crash: {miss}")
