// One chart on the page: a uPlot plot over steps, a visually hidden data table for screen
// readers, and drawn labels so that nothing is told by colour alone (run letters at the
// line ends, dashes, filled vs hollow markers, crash ✕ and resume ↺ markers with text).
//
// A spec says what to draw:  { key, title, note, yLabel, height, log, yFmt,
//   build(pair) -> { x: [steps], series: [{ label, run, values, style, width }],
//                    markers: [{ x, run, kind: "crash" | "preempt" | "resume" | "fresh" | "wall" | "diverged", text }],
//                    bands: [{ x0, x1, run, kind? }], xMode: "step" | "time" (x in seconds) } }
// style: "line" (solid; A thick, B thin), "dash" (dashed: recomputed), "fresh" (wide and
// pale: trained again after a fresh start), "dots" (A filled, B hollow), "ghost" (thin).

import { isNum } from "./format.js";
import { elapsed } from "./loss_time.js";

export const RUN_COLORS = { A: "#1d5fbf", B: "#c0510a" };
// Recomputed segments are dashed in a darker shade, so the dashes show on top of the
// original line they should cover exactly.
const DARK = { A: "#0a2a5c", B: "#5c2200" };
const SYNC_KEY = "crashdrill-steps";
const TABLE_ROWS = 30;
const OFFSCREEN_EVERY_MS = 2000; // a chart out of view redraws at most this often

export const uPlotLoaded = () => typeof window.uPlot === "function";

function el(tag, attrs = {}, text = "") {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text) e.textContent = text;
  return e;
}

export class ChartPanel {
  constructor(container, spec) {
    this.spec = spec;
    this.plot = null;
    this.signature = "";
    this.last = null;
    this.tableAt = 0;
    this.figure = el("figure", { class: "chart", id: `chart-${spec.key}` });
    const cap = el("figcaption");
    cap.append(el("span", { class: "chart-title" }, spec.title));
    this.note = el("span", { class: "chart-note" }, typeof spec.note === "string" ? spec.note : "");
    cap.append(this.note);
    this.figure.append(cap);
    if (spec.controls) this.figure.append(spec.controls);
    this.box = el("div", { class: "plot", "aria-hidden": "true" });
    this.empty = el("p", { class: "chart-empty" }, "No data yet.");
    // Visually hidden (not display:none) so that screen readers read it; the wrapper
    // clips it, since a table never shrinks to the 1 px of .sr-only by itself.
    this.tableBox = el("div", { class: "sr-only chart-data" });
    this.table = el("table", { class: "chart-table" });
    this.tableBox.append(this.table);
    this.figure.append(this.box, this.empty, this.tableBox);
    container.append(this.figure);
    if (typeof ResizeObserver === "function") {
      this.resizer = new ResizeObserver(() => this.resize());
      this.resizer.observe(this.box);
    }
    // Off screen, a chart is redrawn less often: it keeps the newest pair and draws it when
    // it scrolls into view (drawing every chart 4 times a second cost the trainers CPU).
    this.visible = true;
    this.pending = null;
    this.offscreenAt = 0;
    if (typeof IntersectionObserver === "function") {
      this.visible = false;
      this.watcher = new IntersectionObserver((entries) => {
        this.visible = entries[entries.length - 1].isIntersecting;
        if (this.visible && this.pending) this.update(...this.pending);
      }, { rootMargin: "200px 0px" });
      this.watcher.observe(this.figure);
    }
  }

  width() {
    return Math.max(240, Math.floor(this.box.clientWidth || this.figure.clientWidth || 600));
  }

  resize() {
    if (this.plot) {
      const w = this.width();
      if (Math.abs(w - this.plot.width) > 2) this.plot.setSize({ width: w, height: this.spec.height || 220 });
    }
  }

  /** Rebuild from the pair's state; `force` recreates the plot (log toggle, new series).
   * `version` names the pair's data: the same version as last time draws nothing. */
  update(pair, force = false, version = null) {
    if (!force && version !== null && version === this.drawn) return;
    if (!this.visible && !force) {
      // Out of view it still follows the records, every OFFSCREEN_EVERY_MS instead of every
      // render: a chart scrolled to (or in a full-page screenshot) is never minutes behind.
      this.pending = [pair, false, version];
      if (this.plot && performance.now() - this.offscreenAt < OFFSCREEN_EVERY_MS) return;
      this.offscreenAt = performance.now();
    }
    this.pending = null;
    this.drawn = version;
    const data = this.spec.build(pair);
    this.last = data;
    if (typeof this.spec.note === "function") this.note.textContent = this.spec.note(pair);
    const hasData = data.x.length > 0 && data.series.some((s) => s.values.some(isNum));
    this.figure.dataset.xMode = data.xMode || "step";
    this.figure.dataset.xMax = String(data.x.length ? data.x[data.x.length - 1] : ""); // what it drew up to
    this.figure.dataset.gaps = String((data.bands || []).filter((b) => b.kind === "gap").length);
    this.empty.hidden = hasData;
    this.figure.classList.toggle("has-data", hasData);
    const now = performance.now();
    if (force || now - this.tableAt > 2000) {
      this.tableAt = now;
      this.renderTable(data);
    }
    if (!uPlotLoaded() || !hasData) return;
    const sig = `${this.spec.log ? this.spec.log() : ""}|${data.xMode || "step"}|${data.series.map((s) => `${s.label}:${s.style}`).join(",")}`;
    const aligned = [data.x, ...data.series.map((s) => s.values)];
    if (force || !this.plot || sig !== this.signature) {
      if (this.plot) this.plot.destroy();
      this.signature = sig;
      this.plot = new window.uPlot(this.options(data), aligned, this.box);
    } else {
      this.plot.setData(aligned);
    }
  }

  options(data) {
    const spec = this.spec;
    const yFmt = spec.yFmt || ((v) => String(v));
    const axisFmt = spec.axisFmt || yFmt;
    const time = data.xMode === "time";
    const xText = (v) => (v == null ? "–" : time ? `${elapsed(v)} elapsed` : `step ${v}`);
    const series = [{ label: time ? "time" : "step", value: (u, v) => xText(v) }];
    for (const s of data.series) series.push(seriesOptions(s, yFmt));
    const log = spec.log ? spec.log() : false;
    return {
      width: this.width(),
      height: spec.height || 220,
      padding: [12, 22, 0, 0], // room on the right for the run letters at the line ends
      scales: { x: { time: false }, y: log ? { distr: 3, log: 10 } : { auto: true } },
      series,
      axes: [
        {
          label: time ? "elapsed (min:s)" : "step",
          size: 36,
          labelSize: 16,
          stroke: "#444",
          grid: { stroke: "#eee" },
          ...(time ? { values: (u, splits) => splits.map((v) => elapsed(v)) } : {}),
        },
        {
          label: spec.yLabel || "",
          size: 62,
          labelSize: 16,
          stroke: "#444",
          grid: { stroke: "#eee" },
          values: (u, splits) => splits.map((v) => (v == null ? "" : axisFmt(v))),
        },
      ],
      cursor: { sync: { key: time ? `${SYNC_KEY}-time` : SYNC_KEY, setSeries: false }, points: { size: 6 } },
      legend: {
        live: true,
        markers: {
          // The legend repeats each line's pattern: dashed, dotted (markers only) or solid.
          dash: (u, i) => (u.series[i].dash ? "dashed" : u.series[i].width === 0 ? "dotted" : "solid"),
        },
      },
      hooks: { draw: [(u) => drawOverlay(u, this.last)] },
    };
  }

  renderTable(data) {
    const spec = this.spec;
    const cols = data.series.filter((s) => s.style !== "ghost");
    const t = this.table;
    t.replaceChildren();
    const time = data.xMode === "time";
    const xCell = (v) => (time ? elapsed(v) : String(v));
    t.append(el("caption", {}, `${spec.title}: data (${spec.yLabel || "value"} by ${time ? "elapsed time" : "step"})`));
    const head = el("tr");
    head.append(el("th", { scope: "col" }, time ? "elapsed" : "step"));
    for (const s of cols) head.append(el("th", { scope: "col" }, s.label));
    const thead = el("thead");
    thead.append(head);
    const body = el("tbody");
    const fmt = spec.yFmt || ((v) => String(v));
    for (const i of tableRows(data.x, cols)) {
      const tr = el("tr");
      tr.append(el("th", { scope: "row" }, xCell(data.x[i])));
      for (const s of cols) tr.append(el("td", {}, isNum(s.values[i]) ? fmt(s.values[i]) : "–"));
      body.append(tr);
    }
    for (const m of data.markers || []) {
      const tr = el("tr");
      tr.append(el("th", { scope: "row" }, xCell(m.x)));
      const td = el("td", { colspan: String(Math.max(1, cols.length)) }, m.text);
      tr.append(td);
      body.append(tr);
    }
    t.append(thead, body);
  }
}

/** Which steps the data table lists: up to TABLE_ROWS of each line, every marker point
 * (validation), and a few of each dashed (recomputed) segment, first and last included. */
function tableRows(x, cols) {
  const keep = new Set();
  const pick = (idx, n) => {
    const every = Math.max(1, Math.ceil(idx.length / n));
    idx.forEach((i, k) => {
      if (k % every === 0 || k === idx.length - 1) keep.add(i);
    });
  };
  for (const s of cols) {
    const idx = [];
    for (let i = 0; i < x.length; i += 1) if (isNum(s.values[i])) idx.push(i);
    pick(idx, s.style === "dash" ? 8 : TABLE_ROWS);
  }
  return [...keep].sort((a, b) => a - b);
}

// A and B often coincide: A is drawn thick and B thin on top of it, so both stay visible
// (and tell apart without colour).
const RUN_WIDTH = { A: 3.5, B: 1.5 };

function seriesOptions(s, yFmt) {
  const color = RUN_COLORS[s.run] || "#555";
  const base = { label: s.label, stroke: color, width: s.width || RUN_WIDTH[s.run] || 2, spanGaps: s.spanGaps ?? true,
    value: (u, v) => (v == null ? "–" : yFmt(v)) };
  if (s.style === "dash") {
    // short thick dark dashes: beads on the original line they should cover exactly
    return { ...base, stroke: DARK[s.run] || "#333", dash: [4, 4], width: s.width || 4, spanGaps: false };
  }
  if (s.style === "fresh") return { ...base, width: 9, stroke: `${color}44`, spanGaps: false };
  if (s.style === "jump") return { ...base, width: 3, spanGaps: false, points: { show: true, size: 7 } }; // a fresh start's jump
  if (s.style === "ghost") return { ...base, width: 1, stroke: `${color}55` };
  if (s.style === "dots") {
    return {
      ...base,
      width: 0,
      paths: () => null,
      points: { show: true, space: 0, size: 8, width: 2, stroke: color, fill: s.run === "B" ? "#fff" : color },
    };
  }
  return { ...base, points: { show: false } };
}

/** Run letters at the line ends, and vertical crash / resume markers with text. */
function drawOverlay(u, data) {
  if (!data) return;
  const ctx = u.ctx;
  const px = window.devicePixelRatio || 1;
  const { left, top, width, height } = u.bbox;
  ctx.save();
  ctx.font = `${Math.round(12 * px)}px system-ui, sans-serif`;
  ctx.textBaseline = "middle";
  ctx.textAlign = "left"; // uPlot leaves its axis alignment behind
  for (const b of data.bands || []) {
    const x0 = Math.max(left, u.valToPos(b.x0, "x", true));
    const x1 = Math.min(left + width, u.valToPos(b.x1, "x", true));
    if (!(x1 > x0)) continue;
    ctx.fillStyle = b.kind === "gap" ? "#8888882e" : `${RUN_COLORS[b.run] || "#888888"}14`;
    ctx.fillRect(x0, top, x1 - x0, height);
  }
  const placed = [];
  data.series.forEach((s, i) => {
    if (!s.endLabel || !u.series[i + 1].show) return;
    let j = s.values.length - 1;
    while (j >= 0 && !isNum(s.values[j])) j -= 1;
    if (j < 0) return;
    const x = u.valToPos(data.x[j], "x", true);
    const y = u.valToPos(s.values[j], "y", true);
    if (!isNum(x) || !isNum(y) || y < top || y > top + height) return;
    // A and B often end on the same spot: stack the letters, upwards near the bottom.
    const dir = y > top + height - 20 * px ? -1 : 1;
    let ly = y;
    while (placed.some((p) => Math.abs(p - ly) < 13 * px)) ly += dir * 13 * px;
    placed.push(ly);
    ctx.fillStyle = RUN_COLORS[s.run] || "#333";
    ctx.fillText(s.endLabel, x + 5 * px, ly);
  });
  // Marker labels go in the first row where they overlap no other label (short ones on a
  // narrow chart), so crash and resume labels never cover each other on a phone.
  const narrow = width < 520 * px;
  const taken = [];
  for (const m of data.markers || []) {
    const x = u.valToPos(m.x, "x", true);
    if (!isNum(x) || x < left - 1 || x > left + width + 1) continue;
    const color = RUN_COLORS[m.run] || "#333";
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.5 * px;
    ctx.setLineDash(m.kind === "crash" || m.kind === "preempt" ? [2 * px, 3 * px]
      : m.kind === "wall" ? [] : [8 * px, 3 * px]);
    ctx.beginPath();
    ctx.moveTo(x, top);
    ctx.lineTo(x, top + height);
    ctx.stroke();
    ctx.setLineDash([]);
    const glyph = markerGlyph(m, narrow);
    const w = ctx.measureText(glyph).width;
    const tx = Math.min(x + 3 * px, left + width - w - 2 * px);
    let row = 0;
    while (taken.some((t) => t.row === row && tx < t.x1 + 4 * px && tx + w > t.x0 - 4 * px)) row += 1;
    taken.push({ row, x0: tx, x1: tx + w });
    const y = top + (8 + 15 * row) * px;
    ctx.fillStyle = "rgba(255,255,255,0.85)";
    ctx.fillRect(tx - 1 * px, y - 7 * px, w + 2 * px, 14 * px);
    ctx.fillStyle = color;
    ctx.fillText(glyph, tx, y);
  }
  ctx.restore();
}

function markerGlyph(m, narrow) {
  const [sign, word] = { crash: ["✕", "crash"], resume: ["↺", "resume"], fresh: ["⟲", "fresh start"],
    preempt: ["■", "preempted"], wall: ["▮", "session wall"], diverged: ["∞", "diverged"] }[m.kind] || ["•", m.kind];
  if (!m.run) return narrow ? sign : `${sign} ${word}`;
  return narrow ? `${sign}${m.run}` : `${sign} ${m.run} ${word}`;
}

/** TensorBoard's smoothing: EMA with weight `a`, debiased by 1 - a^n (no pull to 0). */
export function debiasedEma(values, a) {
  if (!(a > 0)) return values.slice();
  const out = new Array(values.length).fill(null);
  let ema = 0;
  let n = 0;
  for (let i = 0; i < values.length; i += 1) {
    const v = values[i];
    if (!isNum(v)) continue;
    ema = a * ema + (1 - a) * v;
    n += 1;
    out[i] = ema / (1 - a ** n);
  }
  return out;
}
