// What each chart of the lesson draws, built from the pair's records. All charts share the
// x axis the loss chart's control picks (optimizer step or elapsed time), so one cursor
// moves across all of them.

import { ChartPanel, debiasedEma } from "./charts.js";
import { bytes, compact, isNum, loss as fmtLoss, sci } from "./format.js";
import { buildLossTime } from "./loss_time.js";
import { firstStepTime, metricSeries } from "./metric_series.js";

const NOISY_SMOOTHING = 0.9; // throughput and MFU jump step to step: A and B drawn smoothed

const CUBLAS_WORKSPACE_BYTES = 8 * 4096 * 1024; // CUBLAS_WORKSPACE_CONFIG=:4096:8

/** x = 1..the furthest step either run reached. */
function stepAxis(pair) {
  let max = 0;
  for (const run of pair.runs.values()) max = Math.max(max, run.maxStep);
  return Array.from({ length: max }, (_, i) => i + 1);
}

function column(x, byStep, pick) {
  return x.map((step) => {
    const r = byStep.get(step);
    const v = r ? pick(r) : null;
    return isNum(v) ? v : null;
  });
}

/** EMA like debiasedEma, but starting from another series' state at index `start`
 * so that a recomputed segment equal to the original is drawn exactly on top of it. */
function emaContinuing(raw, a, start, end, values) {
  const out = new Array(values.length).fill(null);
  let ema = 0;
  let n = 0;
  for (let i = 0; i <= start && i < raw.length; i += 1) {
    if (!isNum(raw[i])) continue;
    ema = a * ema + (1 - a) * raw[i];
    n += 1;
  }
  if (n > 0 && start >= 0) out[start] = a > 0 ? ema / (1 - a ** n) : raw[start];
  for (let i = start + 1; i <= end && i < values.length; i += 1) {
    if (!isNum(values[i])) continue;
    ema = a * ema + (1 - a) * values[i];
    n += 1;
    out[i] = a > 0 ? ema / (1 - a ** n) : values[i];
  }
  return out;
}

function lossControls(state, onChange) {
  const wrap = document.createElement("div");
  wrap.className = "chart-controls";
  wrap.innerHTML = `
    <label><input type="checkbox" id="loss-log"> log loss</label>
    <label for="loss-smooth">smoothing</label>
    <input type="range" id="loss-smooth" min="0" max="0.99" step="0.01" value="${state.smoothing}"
      aria-describedby="loss-smooth-out">
    <output id="loss-smooth-out" for="loss-smooth">${state.smoothing.toFixed(2)}</output>
    <span class="loss-x" role="radiogroup" aria-label="x axis">x axis:
      <label><input type="radio" name="loss-x" value="step" checked> step</label>
      <label><input type="radio" name="loss-x" value="time"> elapsed time</label></span>
    <span class="chart-key">thick = A, thin = B (train, smoothed) · ● A / ○ B = validation ·
      dashed dark = recomputed after a crash-test resume · wide pale = trained again after a fresh
      start from step 0, and a steep line at the crash = its loss back at ln(vocab) · ✕ crash · ↺ resume · ⟲ fresh start · against time, grey = restarting</span>`;
  for (const radio of wrap.querySelectorAll('input[name="loss-x"]')) {
    radio.addEventListener("change", () => {
      state.x = radio.value;
      onChange(true, true);
    });
  }
  const log = wrap.querySelector("#loss-log");
  const smooth = wrap.querySelector("#loss-smooth");
  const out = wrap.querySelector("#loss-smooth-out");
  log.addEventListener("change", () => {
    state.log = log.checked;
    onChange(true);
  });
  smooth.addEventListener("input", () => {
    state.smoothing = Number(smooth.value);
    out.textContent = state.smoothing.toFixed(2);
    onChange(false);
  });
  return wrap;
}

function buildLoss(pair, opts) {
  if (opts.x === "time") return buildLossTime(pair, opts);
  const x = stepAxis(pair);
  const series = [];
  const markers = [];
  const bands = [];
  const a = opts.smoothing;
  for (const run of pair.ordered()) {
    const L = run.label;
    const raw = column(x, run.originalByStep(), (r) => r.loss);
    if (a > 0) series.push({ label: `${L} train (raw)`, run: L, style: "ghost", values: raw });
    const smoothed = debiasedEma(raw, a);
    series.push({ label: `${L} train`, run: L, style: "line", endLabel: L, values: smoothed });
    series.push({ label: `${L} val`, run: L, style: "dots",
      values: column(x, run.val, (r) => r.val_loss) });
    for (const c of run.crashes()) {
      const rows = run.steps.get(c.segment) || new Map();
      if (!rows.size) {
        markers.push({ x: c.reached, run: L, kind: c.kind, text: c.refused
          ? `Run ${L} ${what(c)} at step ${c.reached}: the restart refused to start without a checkpoint`
          : `Run ${L} ${what(c)} at step ${c.reached} (resume ${c.segment})` });
        continue;
      }
      if (c.fresh) {
        // Not a resume: the same steps trained again from scratch (drawn wide and pale, as
        // it lies on the original when the seed is the same; the time axis shows the cost).
        const again = x.map((s) => (s <= c.reached && rows.has(s) ? rows.get(s).loss : null));
        series.push({ label: `${L} fresh start ${c.segment}`, run: L, style: "fresh",
          values: emaContinuing(again, a, -1, Math.min(c.reached, x.length) - 1, again) });
        bands.push({ x0: 1, x1: c.reached, run: L });
        // The jump itself, on the step axis too: from the loss the run had reached to the
        // first loss of the model that started over (ln(vocab): it has seen no token).
        const first = rows.get(Math.min(...rows.keys()));
        if (first && isNum(first.loss) && c.reached >= 1 && c.reached < x.length) {
          const jump = x.map(() => null);
          jump[c.reached - 1] = smoothed[c.reached - 1];
          jump[c.reached] = first.loss;
          series.push({ label: `${L} back to step 0 (loss ${fmtLoss(first.loss)})`, run: L, style: "jump", values: jump });
        }
        markers.push({ x: c.reached, run: L, kind: c.kind,
          text: `Run ${L} ${what(c)} at step ${c.reached}: no checkpoint left` });
        markers.push({ x: 1, run: L, kind: "fresh",
          text: `Run ${L} started over from step 0 (a fresh start, not a resume)` });
        continue;
      }
      const lo = (c.from ?? 0) + 1;
      const recomputed = x.map((s) => (s >= lo && s <= c.reached && rows.has(s) ? rows.get(s).loss : null));
      const start = (c.from ?? 0) - 1; // index of from_step in x (x[i] = i + 1)
      series.push({
        label: `${L} resume ${c.segment}`,
        run: L,
        style: "dash",
        values: emaContinuing(raw, a, start, Math.min(c.reached, x.length) - 1, recomputed),
      });
      bands.push({ x0: Math.max(c.from ?? 0, 1), x1: c.reached, run: L });
      markers.push({ x: c.reached, run: L, kind: c.kind,
        text: `Run ${L} ${what(c)} at step ${c.reached} (resume ${c.segment})` });
      if (isNum(c.from)) {
        markers.push({ x: Math.max(c.from, 1), run: L, kind: "resume",
          text: `Run ${L} resumed from the checkpoint at step ${c.from}` });
      }
    }
  }
  for (const run of pair.ordered()) { // a NaN loss is null, a gap in the line: say where
    if (run.view.state === "diverged" && isNum(run.view.step)) {
      markers.push({ x: run.view.step, run: run.label, kind: "diverged",
        text: `Run ${run.label} diverged at step ${run.view.step}: its loss or gradient was no longer a finite number` });
    }
  }
  const wall = pair.view.preset?.crash?.wall_step;
  if (isNum(wall) && wall > 0) {
    markers.push({ x: wall, run: "", kind: "wall",
      text: `The session wall at step ${wall}: the lab sends SIGTERM, then SIGKILL after the grace` });
  }
  return { x, series, markers, bands };
}

/** What ended a segment, for a marker: a crash test (SIGKILL) or a preemption (SIGTERM). */
function what(restart) {
  return restart.kind === "preempt" ? "preempted" : "crash test";
}

/** Peak memory estimate of one run from its `run` record (weights + grads + AdamW in
 * fp32, activations as in Korthikanti et al. 2022, logits, cuBLAS workspace on CUDA). */
export function memoryEstimate(runRecord) {
  const cfg = runRecord && runRecord.config;
  if (!cfg || !isNum(runRecord.params)) return null;
  const { n_layer: L, d_model: d, n_head: h, ctx: T, batch: B } = cfg;
  if (![L, d, h, T, B].every(isNum)) return null;
  const V = runRecord.vocab || cfg.vocab || 256;
  const half = /bf16|fp16/.test(runRecord.precision || cfg.precision || "");
  const states = 16 * runRecord.params;
  const acts = L * B * T * d * (34 + (5 * h * T) / d) * (half ? 1 : 2);
  const logits = B * T * V * 8;
  const cuda = String(runRecord.device || "").startsWith("cuda");
  return states + acts + logits + (cuda ? CUBLAS_WORKSPACE_BYTES : 0);
}

function buildMemory(pair, opts) {
  const data = metricSeries(pair, "mem_bytes", "measured", { x: opts.x });
  const estimates = pair.ordered().map((r) => [r.label, memoryEstimate(r.runRecord)]);
  const same = estimates.length === 2 && estimates[0][1] === estimates[1][1];
  for (const [label, est] of same ? estimates.slice(0, 1) : estimates) {
    if (!isNum(est) || data.x.length === 0) continue;
    data.series.push({ label: same ? "estimate (A and B)" : `${label} estimate`, run: same ? "" : label,
      style: "dash", values: data.x.map(() => est) });
  }
  return { ...data, markers: crashMarkers(pair, data.xMode) };
}

function memoryNote(pair) {
  const kinds = pair.ordered().map((r) => r.latestStep()?.mem_kind).filter(Boolean);
  const where = kinds.includes("rss")
    ? "process RSS on this CPU (Python and torch included)"
    : "peak allocated by torch on the GPU";
  return `${where} · dashed = estimate: weights, gradients, AdamW state, activations + workspace`;
}

function mfuNote(pair) {
  const src = pair.ordered().map((r) => r.runRecord?.mfu_peak_source).find(Boolean);
  return src ? `share of the peak: ${src}` : "share of this precision's peak FLOP/s";
}

function simple(opts, key, title, note, field, yLabel, yFmt, extra = {}) {
  const smoothing = extra.smoothing || 0;
  return {
    key, title, note, yLabel, yFmt, height: 200, ...extra,
    build: (pair) => {
      const data = metricSeries(pair, field, yLabel, { x: opts.x, smoothing });
      return { ...data, markers: crashMarkers(pair, data.xMode) };
    },
  };
}

/** Each run's crash tests and preemptions as markers, at their step or elapsed time. */
function crashMarkers(pair, xMode = "step") {
  const out = [];
  const t0 = xMode === "time" ? firstStepTime(pair) : null;
  for (const run of pair.ordered()) {
    for (const c of run.crashes()) {
      const x = xMode === "time" ? (isNum(c.t) && t0 !== null ? c.t - t0 : null) : c.reached;
      if (!isNum(x)) continue;
      out.push({ x, run: run.label, kind: c.kind, text: `Run ${run.label} ${what(c)} at step ${c.reached}` });
    }
  }
  return out;
}

/** Create every chart in `container`; returns { update(pair, force) }. */
export function createCharts(lossBox, gridBox) {
  const opts = { log: false, smoothing: 0.6, x: "step" };
  let current = null;
  const charts = [];
  // The loss chart's x axis control moves every chart (step or elapsed time); its log and
  // smoothing controls are the loss chart's own.
  const controls = lossControls(opts, (force, all) => {
    if (!current) return;
    for (const c of all ? charts : [lossChart]) c.update(current, force);
  });
  const lossChart = new ChartPanel(lossBox, {
    key: "loss", title: "Loss", note: "lower is better · starts near ln(vocab)",
    yLabel: "loss", yFmt: fmtLoss, axisFmt: (v) => (v < 1 ? v.toPrecision(2) : v.toFixed(1)),
    height: 320, controls,
    log: () => opts.log, xMode: () => opts.x, build: (pair) => buildLoss(pair, opts),
  });
  charts.push(lossChart);
  const smoothed = (what) => `${what} · smoothed (pale: each step)`;
  charts.push(new ChartPanel(gridBox, simple(opts, "lr", "Learning rate", "warmup, then cosine", "lr", "lr", sci)));
  charts.push(new ChartPanel(gridBox, simple(opts, "grad", "Gradient norm", "before clipping · log scale",
    "grad_norm", "grad norm", (v) => (v >= 100 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v.toPrecision(2)),
    { log: () => true })));
  charts.push(new ChartPanel(gridBox, simple(opts, "throughput", "Throughput", smoothed("tokens per second"),
    "tokens_per_s", "tokens/s", compact, { smoothing: NOISY_SMOOTHING })));
  charts.push(new ChartPanel(gridBox, simple(opts, "mfu", "MFU", (pair) => smoothed(mfuNote(pair)), "mfu", "MFU",
    (v) => `${(v * 100).toFixed(v < 0.1 ? 1 : 0)}%`, { smoothing: NOISY_SMOOTHING })));
  charts.push(new ChartPanel(gridBox, {
    key: "memory", title: "Memory (measured)", note: memoryNote, yLabel: "bytes", yFmt: bytes,
    axisFmt: (v) => (v >= 1e9 ? `${(v / 1e9).toFixed(1)} GB` : `${Math.round(v / 1e6)} MB`),
    height: 200, build: (pair) => buildMemory(pair, opts),
  }));
  return {
    charts,
    /** Redraw the charts whose data changed since they were last drawn (all with `force`);
     * a chart out of view waits until it scrolls in (ChartPanel.update). */
    update(pair, force = false) {
      current = pair;
      const version = pair.ordered().map((r) => `${r.id}:${r.version}`).join();
      for (const c of charts) c.update(pair, force, version);
    },
  };
}
