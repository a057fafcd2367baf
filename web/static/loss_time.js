// The loss chart against wall-clock time (the "relative time" of TensorBoard and W&B):
// x = seconds since the pair's first step. Each segment of a run is its own line, so a
// crash shows its real cost: the gap while the run restarts (shaded grey) and the stretch
// spent recomputing lost steps (shaded in the run's colour); a silent fresh start shows
// the loss jumping back to ln(vocab) long after the run had learned.

import { isNum } from "./format.js";

/** EMA of one segment's losses (debiased like debiasedEma), continuing from the state
 * of the original trace at `from` so that a resumed segment starts where its checkpoint
 * left the curve; a fresh start (from 0) starts a new EMA. */
export function smoothSegment(original, rows, from, a) {
  if (!(a > 0)) return rows.map((r) => r.loss);
  let ema = 0;
  let n = 0;
  for (let step = 1; step <= from; step += 1) {
    const v = original.get(step)?.loss;
    if (!isNum(v)) continue;
    ema = a * ema + (1 - a) * v;
    n += 1;
  }
  return rows.map((r) => {
    if (!isNum(r.loss)) return null;
    ema = a * ema + (1 - a) * r.loss;
    n += 1;
    return ema / (1 - a ** n);
  });
}

/** "1:05" for 65 s (the x axis and its cursor). */
export function elapsed(s) {
  if (!isNum(s)) return "–";
  const t = Math.max(0, Math.round(s));
  return `${Math.floor(t / 60)}:${String(t % 60).padStart(2, "0")}`;
}

/** The loss chart's data over time: { x (seconds), series, markers, bands, xMode }. */
export function buildLossTime(pair, opts) {
  let t0 = Infinity;
  for (const run of pair.ordered()) {
    for (const rows of run.steps.values()) for (const r of rows.values()) if (isNum(r.t) && r.t < t0) t0 = r.t;
  }
  if (!Number.isFinite(t0)) return { x: [], series: [], markers: [], bands: [], xMode: "time" };
  const lines = []; // [label, run, style, endLabel, [[x, y]...]]
  const markers = [];
  const bands = [];
  for (const run of pair.ordered()) {
    const L = run.label;
    const original = run.originalByStep();
    const crashes = new Map(run.crashes().map((c) => [c.segment, c]));
    for (const c of crashes.values()) {
      if (run.steps.has(c.segment) || !isNum(c.t)) continue; // a restart that never trained
      markers.push({ x: c.t - t0, run: L, kind: "crash", text: c.refused
        ? `Run ${L} crash test at step ${c.reached}: the restart refused to start without a checkpoint`
        : `Run ${L} crash test at step ${c.reached}` });
    }
    for (const seg of run.segments()) {
      const rows = [...run.steps.get(seg).values()].filter((r) => isNum(r.t)).sort((p, q) => p.step - q.step);
      if (!rows.length) continue;
      const c = crashes.get(seg);
      const from = c ? (c.fresh ? 0 : c.from ?? 0) : 0;
      const y = smoothSegment(original, rows, from, opts.smoothing);
      const label = !c ? `${L} train` : c.fresh ? `${L} fresh start ${seg}` : `${L} after resume ${seg}`;
      lines.push([label, L, c?.fresh ? "fresh" : "line", seg === Math.max(...run.segments()) ? L : null,
        rows.map((r, i) => [r.t - t0, y[i]])]);
      if (!c) continue;
      const first = rows[0].t - t0;
      let lastBefore = null;
      for (const [s, prev] of run.steps) {
        if (s >= seg) continue;
        for (const r of prev.values()) if (isNum(r.t) && (lastBefore === null || r.t - t0 > lastBefore)) lastBefore = r.t - t0;
      }
      if (lastBefore !== null) {
        bands.push({ x0: lastBefore, x1: first, run: "", kind: "gap" });
        markers.push({ x: lastBefore, run: L, kind: "crash",
          text: `Run ${L} crash test at step ${c.reached}, ${elapsed(lastBefore)} in` });
      }
      const caughtUp = rows.find((r) => r.step >= c.reached);
      bands.push({ x0: first, x1: (caughtUp ?? rows[rows.length - 1]).t - t0, run: L });
      markers.push({ x: first, run: L, kind: c.fresh ? "fresh" : "resume",
        text: c.fresh ? `Run ${L} started over from step 0 at ${elapsed(first)}: no checkpoint was resumed`
          : `Run ${L} resumed from the checkpoint at step ${c.from} at ${elapsed(first)}` });
    }
    const val = [...run.val.values()].filter((r) => isNum(r.t) && isNum(r.val_loss));
    lines.push([`${L} val`, L, "dots", null, val.map((r) => [r.t - t0, r.val_loss])]);
  }
  // One shared x (uPlot's aligned data): every line's times, each line null elsewhere.
  const xs = [...new Set(lines.flatMap((l) => l[4].map((p) => Math.round(p[0] * 100) / 100)))].sort((p, q) => p - q);
  const index = new Map(xs.map((v, i) => [v, i]));
  const series = lines.map(([label, run, style, endLabel, points]) => {
    const values = new Array(xs.length).fill(null);
    for (const [px, py] of points) values[index.get(Math.round(px * 100) / 100)] = py;
    return { label, run, style, endLabel, values };
  });
  return { x: xs, series, markers, bands, xMode: "time" };
}
