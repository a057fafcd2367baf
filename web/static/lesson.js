// The lesson's text parts: header, what's happening / what to watch, fact probes,
// samples and resume checks (the event log is events.js).

import * as f from "./format.js";
import { checkCost } from "./crash_words.js";
import { fieldsDetails, measuredWords, otherFieldsVerdict, rankWords } from "./resume_fields.js";

// The questions behind the probe names (trainer/corpus.py PROBES); unknown names show as is.
const PROBE_TEXT = {
  paris: ["The capital of France is", "Paris", "London"],
  water: ["Q: Is water a liquid at room temperature? A:", "Yes", "No"],
  planet: ["The largest planet in our solar system is", "Jupiter", "Mars"],
  ice: ["Q: Does ice float on water? A:", "Yes", "No"],
  sky: ["On a clear day the sky is", "blue", "green"],
  whale: ["A whale is a", "mammal", "fish"],
  arithmetic: ["2 + 3 =", "5", "6"],
  orbit: ["The Earth goes around the", "Sun", "Moon"],
  ocean: ["The largest ocean on Earth is the", "Pacific", "Atlantic"],
};

const $ = (sel) => document.querySelector(sel);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

const PHONE = "(max-width: 760px)"; // lab.css's narrow layout

/** A lesson's name in a picker: "1.15 · Lose the machine: local checkpoints vs mirrored";
 * on a phone only up to its colon ("1.15 · Lose the machine"), so the closed picker is not
 * cut mid-word (the page's title says the rest). */
export function pickerText(preset) {
  const title = String(preset.title || "");
  const short = window.matchMedia?.(PHONE).matches ? title.split(":")[0] : title;
  return `${preset.number} · ${short}`;
}

/** On a phone, the panels a student reads once (or rarely) start folded: their summaries
 * stay, and a tap opens each (`details[data-fold=phone]` in index.html). */
export function foldForPhone() {
  if (!window.matchMedia?.(PHONE).matches) return;
  for (const d of document.querySelectorAll("details[data-fold=phone]")) d.open = false;
}

export function renderHeader(preset, knobText) {
  $("#lesson-kicker").textContent = `lesson ${preset.number} · ${preset.chapter}`;
  $("#lesson-title").textContent = preset.title;
  $("#lesson-question").textContent = preset.question;
  $("#lesson-knob").textContent = knobText || preset.knob_text || "";
  $("#whats-happening").textContent = preset.whats_happening || "";
  $("#what-to-watch").textContent = preset.what_to_watch || "";
  const explanation = $("#lesson-explanation"); // the outcome's "what happened and why"
  if (explanation) explanation.textContent = preset.explanation || "";
  document.title = `${preset.title} · crashdrill`;
}

/** P(right) / (P(right) + P(wrong)) per question, A vs B, newest probe of each run. */
export function renderProbes(pair) {
  const runs = pair.ordered();
  const names = new Set();
  for (const r of runs) for (const k of Object.keys(r.probe?.probes || {})) names.add(k);
  const table = $("#probes");
  const head = table.querySelector("thead tr");
  head.replaceChildren(el("th", "", "question"));
  for (const r of runs) {
    const th = el("th", "", `Run ${r.label}${r.probe ? ` · step ${f.int(r.probe.step)}` : ""}`);
    th.scope = "col";
    head.append(th);
  }
  const body = table.querySelector("tbody");
  body.replaceChildren();
  if (!names.size) {
    const tr = el("tr");
    const td = el("td", "muted", "No probe yet: the first comes at the first evaluation.");
    td.colSpan = runs.length + 1;
    tr.append(td);
    body.append(tr);
    return;
  }
  for (const name of [...names].sort()) {
    const tr = el("tr");
    const th = el("th");
    th.scope = "row";
    const q = PROBE_TEXT[name];
    th.append(el("span", "probe-name", name));
    if (q) th.append(el("span", "probe-q", `“${q[0]}” ${q[1]} vs ${q[2]}`));
    tr.append(th);
    for (const r of runs) {
      const v = r.probe?.probes?.[name];
      const td = el("td", "probe-cell");
      td.append(el("span", "probe-v", f.isNum(v) ? v.toFixed(2) : "–"));
      const bar = el("span", `probe-bar run-${r.label}`);
      bar.style.setProperty("--p", f.isNum(v) ? v : 0);
      bar.setAttribute("aria-hidden", "true");
      td.append(bar);
      tr.append(td);
    }
    body.append(tr);
  }
}

export function renderSamples(pair) {
  const box = $("#samples");
  const runs = pair.ordered();
  const steps = runs.map((r) => r.sample?.step).filter(f.isNum);
  $("#samples-step").textContent = steps.length ? runs.map((r) => `${r.label} step ${f.int(r.sample?.step)}`).join(" · ") : "no sample yet";
  box.replaceChildren();
  for (const r of runs) {
    const fig = el("figure", `sample run-${r.label}`);
    fig.append(el("figcaption", "", `Run ${r.label}${r.sample ? ` · step ${f.int(r.sample.step)}` : ""}`));
    const pre = el("pre");
    if (r.sample) {
      const text = r.sample.text || "";
      const prompt = r.sample.prompt || "";
      if (prompt && text.startsWith(prompt)) {
        pre.append(el("strong", "", prompt), document.createTextNode(text.slice(prompt.length)));
      } else pre.textContent = text;
    } else pre.textContent = "No sample yet.";
    fig.append(pre);
    box.append(fig);
  }
}

/** The look (its check-* class) of each outcome a lab check can have: the check's
 * `outcome`, decided by the server (trainer/resume_outcome.py), never again here. */
const OUTCOME_LOOK = {
  waiting: "pending",
  identical_so_far: "pending",
  identical: "identical",
  nothing_left: "identical",
  different: "different",
  fresh: "fresh",
};

/** One line per resume, as the seed lab writes it, with a plain-language verdict picked
 * by the check's `outcome`; the numbers in the words are the check's own. */
export function resumeCheckText(label, c) {
  const head = `${label} · resume ${c.segment}`;
  const from = `${head} from step ${f.int(c.from_step)}`;
  if (c.outcome === "fresh" && !c.points) return [head, "No checkpoint existed yet, so the run started over from step 0.", "fresh"];
  if (c.outcome === "nothing_left") {  // a graceful stop saved its last step
    return [from, "Nothing to recompute: the checkpoint was of the last step trained, so the restart lost nothing.", "identical"];
  }
  if (c.outcome === "waiting") return [from, "Waiting for the recomputed steps…", "pending"];
  const [lo, hi] = c.steps || [null, null];
  const progress = c.complete ? "" : ` (${c.points} of ${c.expected_points} lost steps recomputed so far)`;
  const line = `${head} steps ${lo}–${hi} (${c.points} points): max |Δloss| ${c.infinite_delta ? "∞" : f.sci(c.max_abs_delta)}, mean ${f.sci(c.mean_abs_delta)}${progress}`;
  // A resume on another world size cannot be bit-identical: within the tolerance the
  // server states it is what the lesson promised, not a red "different".
  const look = c.resharded?.within_tolerance && c.outcome === "different" ? "tolerance" : OUTCOME_LOOK[c.outcome];
  if (!look) return [c.points ? line : head, `The server said the outcome is “${c.outcome ?? "none"}”, which this page does not know: reload it.`, "pending"];
  return [line, outcomeWords(c), look];
}

/** The verdict sentence of a check with recomputed steps, by its outcome. */
function outcomeWords(c) {
  if (c.outcome === "fresh") {
    // Not a resume: what was compared is a new model's steps with the original's at the
    // same steps (equal when the seed is), and the work before the crash is gone.
    return `No checkpoint was resumed: a new model trained from step 0 again, compared here with the original at the same steps; the ${f.int(c.expected_points)} steps trained before the crash were lost.`;
  }
  if (c.outcome === "identical_so_far") {
    return `Bit-identical so far: the ${f.int(c.points)} recomputed steps match exactly; ${f.int(c.expected_points - c.points)} lost steps are still to recompute.`;
  }
  if (c.outcome === "identical") return "Bit-identical: the resume reproduced the lost steps exactly.";
  if (c.resharded) return reshardWords(c);
  const other = otherFieldsVerdict(c); // different: say what was measured to differ
  if (other) return other;
  if (c.missing?.length) {
    // Say what was measured to differ (and what matched), then what the checkpoint lacked:
    // a part it lacked whose metrics still matched is not claimed to have "started over".
    return `Not bit-identical from step ${f.int(c.first_divergent_step)}: ${measuredWords(c)}${rankWords(c)} `
      + `The checkpoint did not hold ${c.missing.join(", ")}, so the resumed run is a different run, even when its curve looks close.`;
  }
  return `Not bit-identical: the recomputed losses differ from the originals by up to ${f.sci(c.max_abs_delta)}.${rankWords(c)} `
    + "The checkpoint missed part of the training state (AdamW moments, the schedule position, an RNG stream "
    + "or the data position), or a kernel is not deterministic; the resumed run is a different run, "
    + "even when its curve looks close.";
}

/** A resume on another world size (the check's `resharded`): not bit-identical by
 * construction, so the verdict is max |Δloss| against the tolerance the server states. */
function reshardWords(c) {
  const r = c.resharded;
  const ranks = (n) => `${f.int(n)} rank${n === 1 ? "" : "s"}`;
  const delta = c.infinite_delta ? "∞" : f.sci(c.max_abs_delta);
  const verdict = r.within_tolerance
    ? `within the stated tolerance of ${f.sci(r.tolerance)}`
    : `beyond the stated tolerance of ${f.sci(r.tolerance)}: a different run`;
  return `Resumed on ${ranks(r.ranks)} from a checkpoint of ${ranks(r.from_ranks)}, at the same global sample. `
    + `Not bit-identical, and it cannot be: ${r.why}. Max |Δloss| ${delta}, ${verdict}.`;
}

const openFieldLists = new Set(); // "run:segment" of the checks whose metric list is open

export function renderResumeChecks(pair) {
  const list = $("#resume-checks");
  // What the student has open right now, read from the page before it is rebuilt: a click
  // whose toggle event has not fired yet still counts.
  for (const d of list.querySelectorAll("details.check-fields")) {
    if (d.open) openFieldLists.add(d.dataset.key);
    else openFieldLists.delete(d.dataset.key);
  }
  list.replaceChildren();
  let n = 0;
  for (const r of pair.ordered()) {
    for (const c of pair.checks.get(r.id) || []) {
      const [line, verdict, kind] = resumeCheckText(r.label, c);
      const li = el("li", `check check-${kind} run-${r.label}`);
      li.dataset.bitIdentical = String(c.bit_identical);
      li.append(el("span", "check-line", line), el("span", "check-verdict", verdict));
      const fields = fieldsDetails(c);
      if (fields) {
        // The list is rebuilt on every new record: a metric list the student opened stays open.
        const key = `${r.id}:${c.segment}`;
        fields.dataset.key = key;
        fields.open = openFieldLists.has(key);
        fields.addEventListener("toggle", () => {
          if (fields.open) openFieldLists.add(key);
          else openFieldLists.delete(key);
        });
        li.append(fields);
      }
      const cost = checkCost(c, r.crashes().find((x) => x.segment === c.segment)?.kind);
      if (cost) li.append(el("span", "check-cost", cost));
      list.append(li);
      n += 1;
    }
    const refused = refusedRestart(r, pair.checks.get(r.id) || []);
    if (refused) {
      list.append(refused);
      n += 1;
    }
  }
  if (!n) list.append(el("li", "muted", "No resume yet. Press Crash test on a training run."));
}

/** The entry of a restart that refused to start (no checkpoint, and it required one): no
 * steps were recomputed, so the server has no check to report, yet it is the outcome. It
 * names the evidence the run's log holds: a checkpoint its manifest rejected (torn by the
 * kill), or none found at all; and every step trained before the crash is lost. */
export function refusedText(run) {
  const world = run.events.find((x) => x.code === "checkpoint_refused" && f.isNum(x.written_ranks));
  if (world) {  // a checkpoint of another world size that cannot be resharded
    const lost = run.crashes().find((c) => c.segment === (world.segment ?? 1))?.reached;
    const cost = f.isNum(lost) && lost > 0 ? `all ${f.int(lost)} steps it had trained are lost to it` : "the run cannot go on";
    return [world.segment ?? 1, "world_size",
      `Its checkpoint was written by ${f.int(world.written_ranks)} ranks, this run has ${f.int(world.ranks)}: `
      + "resuming it would drop a rank's state (or leave a rank without any), so the restart refused it (exit 2) "
      + `instead of resuming. Nothing was recomputed to compare, and ${cost}.`];
  }
  const e = run.events.find((x) => x.code === "no_checkpoint");
  if (!e) return null;
  const segment = e.segment ?? 1;
  const rejected = run.events.find((x) => x.code === "ckpt_corrupt" && (x.segment ?? 0) === segment);
  const lost = run.crashes().find((c) => c.segment === segment)?.reached;
  const why = rejected
    ? "Its newest checkpoint was torn by the kill: the manifest's sha256 check rejected it (see the log), and nothing older was left"
    : "No checkpoint was left where it restarted";
  const cost = f.isNum(lost) && lost > 0 ? `all ${f.int(lost)} steps it had trained were lost` : "every step it had trained was lost";
  return [segment, rejected ? "torn" : "none",
    `${why}. The restart required one, so it refused to train a new model from step 0 (exit 3): nothing was recomputed to compare, and ${cost}.`];
}

function refusedRestart(run, checks) {
  const got = refusedText(run);
  if (!got) return null;
  const [segment, evidence, text] = got;
  if (checks.some((c) => c.segment === segment)) return null;
  const li = el("li", `check check-refused run-${run.label}`);
  li.dataset.evidence = evidence;
  li.append(el("span", "check-line", `${run.label} · resume ${segment}: refused to start`),
    el("span", "check-verdict", text));
  return li;
}
