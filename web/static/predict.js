// "Your prediction" (issue #23): before the pair's first crash test the lesson asks its
// one question (the preset's [predict], trainer/prediction.py); the answer is stored with
// the pair (POST /api/pairs/{pair}/prediction) and shown beside what was measured once the
// outcome is in (the pair view's `prediction.outcome`, measured by the server).
//
//   const panel = new PredictionPanel(root, api);
//   panel.show(pair);                 // a pair opened (its view holds the question)
//   if (panel.mustAsk(pair)) panel.ask(() => crash(run, card));   // Crash test pressed first
//   panel.update(pair);               // every render

import * as f from "./format.js";

const REFRESH_MS = 2000; // how often the page may ask the server for the outcome

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

/** What a run's answer or outcome reads as ("40 steps", "starts over from step 0"). */
export function answerText(predict, value) {
  if (value === null || value === undefined) return "–";
  if (predict.kind === "choice") {
    const c = (predict.choices || []).find((x) => x.value === value);
    return c ? c.text : String(value);
  }
  return `${f.int(value)} step${value === 1 ? "" : "s"}`;
}

/** Whether an answer got the outcome right: the same choice, or a number within 10% of the
 * measured one (at least 1 step: a crash lands anywhere between two saves). */
export function answerRight(predict, answer, outcome) {
  if (outcome === null || outcome === undefined || answer === null || answer === undefined) return null;
  if (predict.kind === "choice") return answer === outcome;
  return Math.abs(answer - outcome) <= Math.max(1, Math.round(0.1 * outcome));
}

export class PredictionPanel {
  constructor(root, api) {
    this.root = root;
    this.api = api;
    this.pending = null; // the crash test (or preemption) waiting for the answer
    this.shown = "";
    this.fetching = false;
    this.refreshedAt = -Infinity;
    this.timer = null;
  }

  /** The lesson's question, or null when it asks none. */
  question(pair) {
    const p = pair?.view?.preset?.predict;
    return p && p.question ? p : null;
  }

  /** A restart happened: the outcome is underway, no prediction may be made any more. */
  restarted(pair) {
    return pair.ordered().some((r) => (r.view.crashes ?? 0) > 0 || (r.view.segment ?? 0) > 0 || r.signalled !== null);
  }

  /** The owner has not answered yet and may still: Crash test asks first. */
  mustAsk(pair) {
    return Boolean(this.question(pair)) && pair.view.owner && !pair.view.prediction && !this.restarted(pair);
  }

  /** Open the question for `then` (the crash test pressed): sent once answered or skipped. */
  ask(then) {
    this.pending = then;
    this.root.dataset.asking = "true";
    this.root.querySelector(".predict-why").textContent = "Predict first: your crash test is sent as soon as you answer (or skip).";
    this.root.scrollIntoView({ block: "center", behavior: "instant" });
    this.root.querySelector("input, select, button")?.focus();
  }

  show(pair) {
    this.shown = "";
    this.pending = null;
    this.update(pair);
  }

  update(pair) {
    const q = this.question(pair);
    const view = pair.view.prediction || null;
    const state = !q ? "none" : view ? (view.skipped ? "skipped" : "made") : this.mustAsk(pair) ? "ask" : "missed";
    this.root.hidden = state === "none" || (state === "missed" && !pair.view.owner);
    this.root.dataset.state = state;
    const signature = JSON.stringify([state, view, q?.question]);
    if (signature === this.shown) return;
    this.shown = signature;
    if (state === "none") return;
    this.root.querySelector(".predict-question").textContent = q.question;
    const body = this.root.querySelector(".predict-body");
    if (state === "ask") body.replaceChildren(this.form(pair, q));
    else if (state === "skipped") body.replaceChildren(el("p", "muted", "You skipped the prediction for this lesson."));
    else if (state === "missed") body.replaceChildren(el("p", "muted", "No prediction was made before the first crash."));
    else body.replaceChildren(this.result(q, view));
  }

  form(pair, q) {
    const form = el("form", "predict-form");
    form.setAttribute("aria-label", "Your prediction");
    const steps = pair.view.preset?.run?.steps;
    for (const run of q.runs) {
      const label = el("label", `predict-run run-${run}`);
      label.append(el("span", "run-name", `Run ${run}`));
      let input;
      if (q.kind === "choice") {
        input = el("select");
        input.append(new Option("choose…", ""));
        for (const c of q.choices) input.append(new Option(c.text, c.value));
      } else {
        input = el("input");
        Object.assign(input, { type: "number", min: 0, step: 1, inputMode: "numeric", placeholder: "steps" });
        if (f.isNum(steps)) input.max = steps;
      }
      input.name = run;
      input.required = true;
      label.append(input);
      form.append(label);
    }
    const submit = el("button", "predict-submit", "Save my prediction");
    submit.type = "submit";
    const skip = el("button", "predict-skip", "Skip");
    skip.type = "button";
    const note = el("p", "predict-why muted");
    note.setAttribute("aria-live", "polite");
    form.append(submit, skip, note);
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const answers = {};
      for (const run of q.runs) {
        const v = form.elements[run].value.trim();
        answers[run] = q.kind === "choice" ? v : Number(v);
      }
      this.send(pair, { answers }, note);
    });
    skip.addEventListener("click", () => this.send(pair, { skip: true }, note));
    return form;
  }

  async send(pair, body, note) {
    note.textContent = "Saving…";
    try {
      pair.view.prediction = await this.api.predict(pair.id, body);
    } catch (e) {
      note.textContent = `Not saved: ${e.message}`;
      return;
    }
    this.root.dataset.asking = "false";
    this.update(pair);
    const then = this.pending;
    this.pending = null;
    if (then) then();
  }

  result(q, view) {
    const table = el("table", "predict-result");
    const head = el("tr");
    for (const h of ["run", "you predicted", "measured", ""]) head.append(el("th", "", h));
    table.append(el("thead"));
    table.tHead.append(head);
    const body = el("tbody");
    for (const run of q.runs) {
      const answer = view.answers?.[run];
      const outcome = view.outcome?.[run];
      const right = answerRight(q, answer, outcome);
      const tr = el("tr", `run-${run}`);
      tr.dataset.run = run;
      tr.append(el("th", "run-name", `Run ${run}`), el("td", "predicted", answerText(q, answer)),
        el("td", "measured", outcome === null || outcome === undefined ? "waiting for its first restart…" : answerText(q, outcome)),
        el("td", "verdict", right === null ? "" : right ? "✓ as predicted" : "✗ not as predicted"));
      body.append(tr);
    }
    table.append(body);
    return table;
  }

  /** The outcome is measured by the server: ask for it again while a predicted run's is
   * missing and something that may decide it changed (`signature`: the resume checks). */
  refresh(pair, signature) {
    const view = pair.view.prediction;
    const q = this.question(pair);
    if (!q || !view || view.skipped || this.fetching || signature === this.refreshedFor) return;
    if (q.runs.every((r) => view.outcome?.[r] !== null && view.outcome?.[r] !== undefined)) return;
    // Each ask measures on the server: at most every REFRESH_MS, the last change included.
    const wait = REFRESH_MS - (performance.now() - this.refreshedAt);
    if (wait > 0) {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.refresh(pair, signature), wait);
      return;
    }
    this.refreshedFor = signature;
    this.refreshedAt = performance.now();
    this.fetching = true;
    this.api.pair(pair.id).then((v) => {
      if (v.prediction) pair.view.prediction = v.prediction;
      this.update(pair);
    }).catch(() => {}).finally(() => {
      this.fetching = false;
    });
  }
}
