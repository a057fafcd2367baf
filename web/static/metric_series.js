// One step-record field of both runs as chart data, against the step or the elapsed time
// (the x axis the loss chart's control picks: every chart follows it), optionally smoothed
// with a pale raw line under it, so that A and B stay apart where each step's value is
// noisy (throughput, MFU).

import { debiasedEma } from "./charts.js";
import { isNum } from "./format.js";

/** The first step record's time of either run (the elapsed axis's 0), or null. */
export function firstStepTime(pair) {
  let t0 = Infinity;
  for (const run of pair.ordered()) {
    for (const rows of run.steps.values()) for (const r of rows.values()) if (isNum(r.t) && r.t < t0) t0 = r.t;
  }
  return Number.isFinite(t0) ? t0 : null;
}

/** `{x, series, xMode}` of `field` for every run. `opts`: {x: "step" | "time", smoothing}
 * (0: raw only). Against steps, each run's original trace (its earliest segment per step);
 * against time, each segment of each run its own line, so a restart shows as a gap. */
export function metricSeries(pair, field, label, opts = {}) {
  const a = opts.smoothing || 0;
  const lines = []; // [label, run, style, endLabel, [[x, y]]]
  if (opts.x === "time") {
    const t0 = firstStepTime(pair);
    if (t0 === null) return { x: [], series: [], xMode: "time" };
    for (const run of pair.ordered()) {
      const segments = run.segments();
      for (const seg of segments) {
        const rows = [...run.steps.get(seg).values()].filter((r) => isNum(r.t)).sort((p, q) => p.step - q.step);
        const raw = rows.map((r) => (isNum(r[field]) ? r[field] : null));
        const points = (values) => rows.map((r, i) => [r.t - t0, values[i]]);
        const name = seg === 0 ? `${run.label} ${label}` : `${run.label} ${label} (segment ${seg})`;
        if (a > 0) lines.push([`${name} raw`, run.label, "ghost", null, points(raw)]);
        lines.push([name, run.label, "line", seg === segments[segments.length - 1] ? run.label : null,
          points(a > 0 ? debiasedEma(raw, a) : raw)]);
      }
    }
    return { ...aligned(lines), xMode: "time" };
  }
  let max = 0;
  for (const run of pair.ordered()) max = Math.max(max, run.maxStep);
  const x = Array.from({ length: max }, (_, i) => i + 1);
  const series = [];
  for (const run of pair.ordered()) {
    const byStep = run.originalByStep();
    const raw = x.map((s) => {
      const v = byStep.get(s)?.[field];
      return isNum(v) ? v : null;
    });
    if (a > 0) series.push({ label: `${run.label} ${label} raw`, run: run.label, style: "ghost", values: raw });
    series.push({ label: `${run.label} ${label}`, run: run.label, style: "line", endLabel: run.label,
      values: a > 0 ? debiasedEma(raw, a) : raw });
  }
  return { x, series, xMode: "step" };
}

/** uPlot's aligned data from lines of [x, y] points: one shared x, each line null elsewhere. */
function aligned(lines) {
  const key = (v) => Math.round(v * 100) / 100;
  const xs = [...new Set(lines.flatMap((l) => l[4].map((p) => key(p[0]))))].sort((p, q) => p - q);
  const index = new Map(xs.map((v, i) => [v, i]));
  const series = lines.map(([label, run, style, endLabel, points]) => {
    const values = new Array(xs.length).fill(null);
    for (const [px, py] of points) values[index.get(key(px))] = py;
    return { label, run, style, endLabel, values };
  });
  return { x: xs, series };
}

/** The run's throughput and MFU as the card shows them: over the last `n` step records of
 * its newest segment, time-weighted (Σ value·dt / Σ dt, each record's dt its own steps'
 * time). Only the work this process did counts: never a record of an earlier segment (the
 * steps a resume restored or recomputes are not new work of this one), and not the
 * process's first record (its `startup_s` says it is: written at start priority,
 * trainer/priority.py, while the lab's other trainers yield). `{tokensPerS, mfu, steps}`,
 * nulls until the segment has a step record after its first. */
export function recentRates(run, n = 10) {
  const seg = run.newestStepSegment();
  const rows = seg === null ? [] : [...(run.steps.get(seg)?.values() || [])].sort((a, b) => a.step - b.step);
  const own = rows.length && Object.hasOwn(rows[0], "startup_s") ? rows.slice(1) : rows;
  const recent = own.slice(-n).filter((r) => isNum(r.dt) && r.dt > 0);
  const mean = (field) => {
    let num = 0;
    let den = 0;
    for (const r of recent) {
      if (!isNum(r[field])) continue;
      num += r[field] * r.dt;
      den += r.dt;
    }
    return den > 0 ? num / den : null;
  };
  return { tokensPerS: mean("tokens_per_s"), mfu: mean("mfu"), steps: recent.length };
}
