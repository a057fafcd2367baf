// "Your prediction" (issues #23, #37): the lesson asks its one question (the preset's
// [predict], trainer/prediction.py) when the student has time to think. A lesson whose
// crash comes by itself (predict.ask "start": a session wall) asks before Start and the
// answer goes with the new pair; every other lesson shows the question from Start and asks
// for it at the first Crash test. The training runs are held where they are (never inside
// a checkpoint write, workers/hold.py) from the student's first answer typed or their Crash
// test until they save or skip (POST /api/pairs/{pair}/hold, the cards say "held"); the
// note says which runs are held and until when, an answer typed holds them longer, and
// a hold that runs out with a whole answer typed saves it: an answer written before the
// outcome is never lost to runs that then finished. The answer is stored with the pair
// (POST /api/pairs/{pair}/prediction) and shown beside what the server measured and judged by the lesson's one rule (the
// prediction view's `results` and `rule`), or with why there is nothing to compare.
//
//   const panel = new PredictionPanel(root, api);
//   if (panel.asksBeforeStart(preset)) panel.askBeforeStart(preset, (body) => start(body));
//   panel.show(pair);                 // a pair opened (its view holds the question)
//   if (panel.mustAsk(pair)) panel.ask(pair, () => crash(run, card));   // Crash test first
//   panel.update(pair);               // every render

import * as f from "./format.js";
import { TERMINAL } from "./run_states.js";

const REFRESH_MS = 2000; // how often the page may ask the server for the outcome
const RENEW_MS = 15000; // an answer typed renews the hold at most this often
const RETRY_MS = 2000; // and asks again at most this often while no run could be held

/** What the note says of a hold: which runs are held (`held`, labels), until when, and
 * what sends or ends it (`pending`: a crash test waits for the answer). */
export function holdText(held, untilText, pending) {
  const then = pending ? "your crash test is sent as soon as you answer (or skip)" : "save or skip to let them go on";
  if (held.length === 0) {
    return pending ? "Predict first: no run is training now, so none is held; your crash test is sent as soon as you answer (or skip)."
      : "No run is training now, so none is held while you answer.";
  }
  const who = held.length > 1 ? "Both runs are held where they are" : `Run ${held[0]} is held where it is (the other is not training now)`;
  return `${who} (nothing trains) while you think, until ${untilText}; each answer you type holds them longer, and ${then}.`;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

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

/** What became of one run's answer, as the server measured and judged it (by the lesson's
 * one rule, trainer/prediction.py): [measured text, verdict text, status]. */
export function resultText(predict, result, run) {
  const r = result || { status: "waiting" };
  if (r.status === "measured") {
    return [answerText(predict, r.outcome), r.right === null ? "" : r.right ? "✓ as predicted" : "✗ not as predicted", "measured"];
  }
  if (r.status === "none") return [r.why || "no outcome to compare", "no outcome", "none"];
  const crashed = run && ((run.view.crashes ?? 0) > 0 || (run.view.segment ?? 0) > 0 || run.signalled !== null);
  // A lesson that asks before Start has no crash test to wait for: its wall comes by itself.
  const before = predict.ask === "start" ? "waiting for the wall…" : "waiting for a crash test…";
  return [crashed ? "waiting for its first restart…" : before, "", "waiting"];
}

/** The form's answers ({A: 40, B: 150}); null when one is still empty (unless `all`). */
function readAnswers(form, q, all = false) {
  const answers = {};
  for (const run of q.runs) {
    const v = form.elements[run].value.trim();
    if (v === "" && !all) return null;
    answers[run] = q.kind === "choice" ? v : Number(v);
  }
  return answers;
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
    this.holding = false; // runs held while the question is open (holdRuns)
    this.heldAt = -Infinity; // when a hold was last asked for (performance.now())
    this.holdAsked = null; // the hold request on its way
    this.expiry = null; // the timer of the hold running out
    this.onHeld = null; // called once the hold is in (the page fetches the runs' views)
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

  /** The owner has not answered yet and may still: runs left to crash, none crashed yet. */
  mustAsk(pair) {
    const ended = pair.ordered().every((r) => TERMINAL.has(r.view.state));
    return Boolean(this.question(pair)) && pair.view.owner && !pair.view.prediction && !this.restarted(pair) && !ended;
  }

  /** Whether `preset` (a lesson's public view) asks before Start: its crash comes by itself. */
  asksBeforeStart(preset) {
    return Boolean(preset?.predict?.question) && preset.predict.ask === "start";
  }

  /** The start view: ask the lesson's question before its runs start; `then(body)` starts
   * them with the answer ({answers} or {skip: true}) to store with the new pair. */
  askBeforeStart(preset, then) {
    const q = preset.predict;
    this.pending = null;
    this.shown = "";
    this.root.hidden = false;
    this.root.dataset.state = "ask";
    this.root.dataset.asking = "start";
    document.body.dataset.asking = "start";
    this.root.querySelector(".predict-question").textContent = q.question;
    const form = this.form(q, preset.run?.steps, (body) => {
      this.root.dataset.asking = "false";
      delete document.body.dataset.asking;
      then(body);
    });
    form.querySelector(".predict-submit").textContent = "Save my prediction and start";
    form.querySelector(".predict-skip").textContent = "Skip and start";
    form.querySelector(".predict-why").textContent = "This lesson's crash comes by itself, seconds after Start: predict now, then watch.";
    this.root.querySelector(".predict-body").replaceChildren(form);
    this.root.scrollIntoView({ block: "center", behavior: "instant" });
    form.querySelector("input, select")?.focus();
  }

  /** The start view went on to another lesson (or to a pair): no question is open there. */
  closeBeforeStart() {
    if (this.root.dataset.asking !== "start") return;
    this.root.dataset.asking = "false";
    delete document.body.dataset.asking;
    this.root.hidden = true;
  }

  /** Open the question for `then` (the crash test pressed), holding the training runs
   * where they are while it is open: `then` is sent once answered or skipped, then the
   * hold ends. */
  async ask(pair, then) {
    this.pending = then;
    this.root.dataset.asking = "true";
    const why = this.root.querySelector(".predict-why");
    why.textContent = "Predict first: holding the runs…";
    this.root.scrollIntoView({ block: "center", behavior: "instant" });
    this.root.querySelector("input, select, button")?.focus();
    await this.holdRuns(pair, why);
  }

  /** Hold the pair's training runs (or hold them longer) while its owner answers; the
   * note says which are held and until when, or why none is. */
  async holdRuns(pair, note) {
    if (this.holdAsked) return this.holdAsked;
    this.heldAt = performance.now();
    this.holdAsked = this.api.hold(pair.id, true).then((held) => {
      this.holding = held.held.length > 0;
      clearTimeout(this.expiry);
      const ms = held.hold_s * 1000;
      if (this.holding) this.expiry = setTimeout(() => this.holdRanOut(pair), ms);
      note.textContent = holdText(held.held, clock(Date.now() + ms), Boolean(this.pending));
      this.onHeld?.();
    }).catch((e) => {
      note.textContent = `The runs could not be held (${e.message}): they train on while you answer${this.pending ? "; your crash test is sent as soon as you answer" : ""}.`;
    }).finally(() => {
      this.holdAsked = null;
    });
    return this.holdAsked;
  }

  /** An answer typed: the runs are held from the first one, and held longer as the
   * student goes on (at most every RENEW_MS). */
  typed(pair, note) {
    if (this.root.dataset.state !== "ask" || this.root.dataset.asking === "start") return;
    if (performance.now() - this.heldAt < (this.holding ? RENEW_MS : RETRY_MS)) return;
    this.holdRuns(pair, note);
  }

  /** The server let the runs go (the hold's time ran out with no answer typed for that
   * long): a whole answer typed is saved as it stands, since it was written before the
   * outcome; else the note says the runs train on. */
  holdRanOut(pair) {
    this.holding = false;
    const form = this.root.querySelector(".predict-form");
    if (this.root.dataset.state !== "ask" || !form) return;
    const note = form.querySelector(".predict-why");
    const answers = readAnswers(form, this.question(pair));
    if (answers && form.checkValidity()) {
      this.pending = null; // the crash test waits for a press of its own
      this.send(pair, { answers }, note);
      return;
    }
    note.textContent = `The hold ran out at ${clock(Date.now())}: the runs train on. Type an answer to hold them again.`;
    this.onHeld?.();
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
    if (state === "ask") {
      const form = this.form(q, pair.view.preset?.run?.steps, (body, note) => this.send(pair, body, note),
        (note) => this.typed(pair, note));
      if (!this.pending) {
        form.querySelector(".predict-why").textContent = q.ask === "start" ? ""
          : "Answer now, or when you press Crash test: the runs train on until you type your first answer, then they are held where they are until you save.";
      }
      body.replaceChildren(form);
    } else if (state === "skipped") body.replaceChildren(el("p", "muted", "You skipped the prediction for this lesson."));
    else if (state === "missed") body.replaceChildren(el("p", "muted", this.restarted(pair) ? "No prediction was made before the first crash." : "No prediction was made: the runs ended before it."));
    else body.replaceChildren(this.result(q, view, pair));
  }

  /** The question's form; `onAnswer(body, note)` gets {answers} or {skip: true}, and
   * `onInput(note)` (if given) hears each answer typed. */
  form(q, steps, onAnswer, onInput) {
    const form = el("form", "predict-form");
    form.setAttribute("aria-label", "Your prediction");
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
      onAnswer({ answers: readAnswers(form, q, true) }, note);
    });
    if (onInput) form.addEventListener("input", () => onInput(note));
    skip.addEventListener("click", () => onAnswer({ skip: true }, note));
    if (q.kind === "number" && q.rule) form.append(el("p", "predict-rule muted", `How it is judged: ${q.rule}.`));
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
    try {
      if (then) await then(); // the crash test lands on the held run, at the step it was held
    } finally {
      clearTimeout(this.expiry);
      if (this.holding) {
        this.holding = false;
        await this.api.hold(pair.id, false).catch(() => {}); // its time runs out otherwise
      }
    }
  }

  result(q, view, pair) {
    const table = el("table", "predict-result");
    const head = el("tr");
    for (const h of ["run", "you predicted", "measured", ""]) head.append(el("th", "", h));
    table.append(el("thead"));
    table.tHead.append(head);
    const body = el("tbody");
    for (const run of q.runs) {
      const answer = view.answers?.[run];
      const [measured, verdict, status] = resultText(q, view.results?.[run], pair?.byLabel?.(run));
      const tr = el("tr", `run-${run}`);
      tr.dataset.run = run;
      tr.dataset.status = status;
      tr.append(el("th", "run-name", `Run ${run}`), el("td", "predicted", answerText(q, answer)),
        el("td", "measured", measured), el("td", "verdict", verdict));
      body.append(tr);
    }
    table.append(body);
    const box = el("div", "predict-outcome");
    box.append(table);
    if (view.status === "none") {
      box.append(el("p", "predict-none", "The runs finished without a crash test: no outcome to compare."));
    }
    if (view.rule) box.append(el("p", "predict-rule muted", `How it is judged: ${view.rule}.`));
    return box;
  }

  /** The outcome is measured by the server: ask for it again while a predicted run's is
   * missing and something that may decide it changed (`signature`: the resume checks). */
  refresh(pair, signature) {
    const view = pair.view.prediction;
    const q = this.question(pair);
    if (!q || !view || view.skipped || signature === this.refreshedFor) return;
    if (this.fetching) {
      this.again = signature; // asked again while an answer is on its way: once more after it
      return;
    }
    if (q.runs.every((r) => ["measured", "none"].includes(view.results?.[r]?.status))) return;
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
      const again = this.again;
      this.again = null;
      if (again) this.refresh(pair, again);
    });
  }
}
