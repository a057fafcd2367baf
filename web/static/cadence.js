// The cadence calculator: how often to checkpoint, from the seed's rule
//   loss budget (minutes) × 60 ÷ seconds per step = save interval (steps)
// and, for the interval the run actually uses, what a crash costs against what saving costs.
// `cadence()` and the two `measured…()` functions are pure (unit-tested in the browser
// tier through page.evaluate); `CadencePanel` fills in the measured values of the lesson
// that runs and falls back to the typed ones when nothing runs.

import * as f from "./format.js";

const MEASURE_WINDOW = 60; // newest step records used for seconds per step
const SAVE_WINDOW = 10; // newest checkpoint records used for seconds per save

/** The cadence arithmetic. Inputs (numbers): budgetMin (minutes of work a crash may cost),
 * secondsPerStep, saveSeconds (one checkpoint's cost), ckptEvery (steps between saves).
 * Returns {error} naming the first bad input, else:
 *   suggestedEvery — the save interval the budget allows (whole steps, at least 1);
 *   avgLostSteps/avgLostS — expected work lost per crash (a crash lands anywhere in the
 *     interval: on average half of it); worstLostSteps/worstLostS — the whole interval;
 *   saveShare — time spent saving as a share of training time:
 *     saveSeconds / (ckptEvery × secondsPerStep);
 *   withinBudget — the worst case fits the budget. */
export function cadence({ budgetMin, secondsPerStep, saveSeconds, ckptEvery }) {
  const checks = [
    ["budgetMin", budgetMin, "minutes > 0"],
    ["secondsPerStep", secondsPerStep, "seconds > 0"],
    ["ckptEvery", ckptEvery, "a whole number of steps ≥ 1"],
  ];
  for (const [name, value, allowed] of checks) {
    if (!f.isNum(value) || value <= 0) return { error: `${name} = ${value}: ${allowed}` };
  }
  if (!Number.isInteger(ckptEvery)) return { error: `ckptEvery = ${ckptEvery}: a whole number of steps ≥ 1` };
  if (!f.isNum(saveSeconds) || saveSeconds < 0) return { error: `saveSeconds = ${saveSeconds}: seconds ≥ 0` };
  const budgetS = budgetMin * 60;
  return {
    suggestedEvery: Math.max(1, Math.floor(budgetS / secondsPerStep + 1e-9)),
    avgLostSteps: ckptEvery / 2,
    avgLostS: (ckptEvery / 2) * secondsPerStep,
    worstLostSteps: ckptEvery,
    worstLostS: ckptEvery * secondsPerStep,
    saveShare: saveSeconds / (ckptEvery * secondsPerStep),
    withinBudget: ckptEvery * secondsPerStep <= budgetS,
  };
}

function median(xs) {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** Seconds per training step from step records ({step, t}, one segment, any order): the
 * median over consecutive records of Δt/Δstep, so that a checkpoint or an evaluation
 * between two records does not count as training time. Null with fewer than 2 records. */
export function measuredSecondsPerStep(steps) {
  const rows = steps.filter((r) => f.isNum(r.t) && Number.isInteger(r.step))
    .sort((a, b) => a.step - b.step).slice(-MEASURE_WINDOW);
  const rates = [];
  for (let i = 1; i < rows.length; i += 1) {
    const ds = rows[i].step - rows[i - 1].step;
    const dt = rows[i].t - rows[i - 1].t;
    if (ds > 0 && dt >= 0) rates.push(dt / ds);
  }
  return median(rates);
}

/** Seconds per checkpoint from ckpt records ({step, seconds}): the median of the newest
 * few, skipping step 0 (its model has no optimizer moments yet). Null without any. */
export function measuredSaveSeconds(ckpts) {
  const rows = ckpts.filter((r) => f.isNum(r.seconds));
  const later = rows.filter((r) => r.step !== 0);
  const use = (later.length ? later : rows).sort((a, b) => (a.step ?? 0) - (b.step ?? 0));
  return median(use.slice(-SAVE_WINDOW).map((r) => r.seconds));
}

function secs(s) {
  if (!f.isNum(s)) return f.DASH;
  if (s < 1) return `${s >= 0.01 ? Math.round(s * 1000) : (s * 1000).toPrecision(2).replace(/\.0+$/, "")} ms`;
  if (s < 90) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 5400) return `${(s / 60).toFixed(s < 600 ? 1 : 0)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function num(input) {
  const v = Number.parseFloat(input.value);
  return Number.isFinite(v) ? v : NaN;
}

/** The panel in #cadence. update(pair) on every render; setPreset(preset) on the start view. */
export class CadencePanel {
  constructor(root) {
    this.root = root;
    this.form = root.querySelector("form");
    this.inputs = {
      budget: this.form.elements.budget,
      sps: this.form.elements.sps,
      save: this.form.elements.save,
      every: this.form.elements.every,
    };
    this.runSelect = this.form.elements.run;
    this.touched = new Set(); // fields the user typed into: never overwritten by measurements
    for (const [name, input] of Object.entries(this.inputs)) {
      input.addEventListener("input", () => {
        this.touched.add(name);
        this.draw();
      });
    }
    this.runSelect.addEventListener("change", () => {
      this.touched.delete("every");
      this.touched.delete("sps");
      this.touched.delete("save");
      this.pair && this.update(this.pair, true);
    });
    root.querySelector(".cadence-measure").addEventListener("click", () => {
      this.touched.clear();
      if (this.pair) this.update(this.pair, true);
    });
    this.pair = null;
    this.signature = "";
    this.draw();
  }

  setPreset(preset) {
    const run = preset?.run || {};
    const every = preset?.knob?.name === "ckpt_every" ? preset.knob.a : run.ckpt_every;
    this.fill("every", Number.isInteger(every) ? every : null);
    this.root.querySelector(".cadence-source").textContent =
      "Nothing runs yet: type your own seconds per step and per save, or start the lesson to measure them.";
    this.draw();
  }

  update(pair, force = false) {
    this.pair = pair;
    const runs = pair.ordered();
    if (this.runSelect.options.length !== runs.length) {
      this.runSelect.replaceChildren(...runs.map((r) => new Option(`run ${r.label}`, r.label)));
    }
    const run = runs.find((r) => r.label === this.runSelect.value) || runs[0];
    if (!run) return;
    const signature = `${run.id}:${run.version}`;
    if (!force && signature === this.signature) return;
    this.signature = signature;
    const seg = Math.max(0, ...run.segments());
    const sps = measuredSecondsPerStep([...(run.steps.get(seg)?.values() || [])]);
    const save = measuredSaveSeconds(run.ckpts);
    const config = run.runRecord?.config || {};
    const every = Number.isInteger(config.ckpt_every) ? config.ckpt_every
      : run.view.knob?.name === "ckpt_every" ? run.view.knob.value : null;
    this.fill("sps", sps === null ? null : Number(sps.toPrecision(3)));
    this.fill("save", save === null ? null : Number(save.toPrecision(3)));
    this.fill("every", every);
    const parts = [];
    parts.push(sps === null ? "seconds per step: not measured yet" : `seconds per step measured on run ${run.label}: ${secs(sps)}`);
    parts.push(save === null ? "no checkpoint yet" : `seconds per save from its ckpt records: ${secs(save)}`);
    this.root.querySelector(".cadence-source").textContent = `${parts.join(" · ")}.`;
    this.draw();
  }

  fill(name, value) {
    if (this.touched.has(name) || value === null || value === undefined) return;
    this.inputs[name].value = String(value);
  }

  draw() {
    const budgetMin = num(this.inputs.budget);
    const secondsPerStep = num(this.inputs.sps);
    const saveSeconds = this.inputs.save.value.trim() === "" ? 0 : num(this.inputs.save);
    const ckptEvery = num(this.inputs.every);
    const out = this.root.querySelector(".cadence-out");
    const rule = this.root.querySelector(".cadence-rule");
    const c = cadence({ budgetMin, secondsPerStep, saveSeconds, ckptEvery });
    this.root.dataset.ok = String(!c.error);
    if (c.error) {
      rule.textContent = `Fill in the numbers (${c.error}).`;
      out.replaceChildren();
      return;
    }
    this.result = c;
    rule.textContent = `${budgetMin} min × 60 ÷ ${secs(secondsPerStep)} per step = save every ${f.int(c.suggestedEvery)} steps.`;
    const rows = [
      ["Work lost per crash, on average", `${f.int(c.avgLostSteps)} steps · ${secs(c.avgLostS)}`, "avg"],
      ["Work lost per crash, at worst", `${f.int(c.worstLostSteps)} steps · ${secs(c.worstLostS)}`
        + (c.withinBudget ? " (within the budget)" : " (over the budget)"), "worst"],
      ["Time spent saving", `${f.pctOfFraction(c.saveShare)} of training time (${secs(saveSeconds)} per save every ${f.int(ckptEvery)} steps)`, "share"],
    ];
    out.replaceChildren(...rows.flatMap(([k, v, cls]) => {
      const dt = document.createElement("dt");
      dt.textContent = k;
      const dd = document.createElement("dd");
      dd.className = `cadence-${cls}`;
      dd.textContent = v;
      return [dt, dd];
    }));
  }
}
