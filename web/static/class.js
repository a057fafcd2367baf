// The class view: every pair in the lab, a page of PAGE pairs at a time (live ones first),
// refreshed every two seconds, with Crash test and Stop on each run (the ordinary run
// routes; the instructor cookie lets them act on any run).

import { request } from "./api.js";
import { $, el, status } from "./dom.js";
import { renderClassPredictions } from "./class_predictions.js";
import * as f from "./format.js";
import { TERMINAL } from "./run_states.js";

const enc = encodeURIComponent;
const REFRESH_MS = 2000;
const ENDED = TERMINAL;
const PAGE = 50;
const PREDICTIONS_EVERY_MS = 10000; // outcomes come once per crash: no need to ask often
let offset = 0;
let predictionsAt = -Infinity;

// What ended a run's segments, by kind (the class route's `restarts`), in words.
const RESTART_WORDS = [
  ["crash", "crash test", "crash tests"],
  ["preempt", "preemption", "preemptions"],
  ["lost_host", "lost host", "lost hosts"],
  ["killed", "unasked kill", "unasked kills"],
];

/** "1 crash test, 1 preemption", or "" when nothing ended a segment. Before the events
 * are stored, a crash test the lab counted (`crashes`) still shows. */
export function restartWords(run) {
  const counts = { ...(run.restarts || {}) };
  if ((counts.crash ?? 0) < (run.crashes ?? 0)) counts.crash = run.crashes;
  return RESTART_WORDS.filter(([k]) => counts[k] > 0)
    .map(([k, one, many]) => `${counts[k]} ${counts[k] === 1 ? one : many}`).join(", ");
}

/** Why Crash test is disabled for `run` (a run view), or "" when it may be pressed: a
 * kill the lab signalled whose restart has not written a step (`pending_kill`) first. */
export function crashWhy(run) {
  if (run.can_crash) return "";
  const p = run.pending_kill;
  if (p?.armed) return `Crash test armed at step ${p.at_step ?? "?"}: the SIGKILL lands when the next checkpoint write begins.`;
  if (p?.kind === "preempt") return "Preempted: it is restarting from its checkpoint; Crash test comes back with its first step.";
  if (p) return "Already crashed: it is restarting from its checkpoint; Crash test comes back with its first step.";
  if (ENDED.has(run.state)) return `It has ${run.state}: there is no training process left to kill.`;
  return "Not training yet: crash tests hit a run from its first step record.";
}

function runCell(run) {
  const td = el("td", { className: `class-run run-${run.label}` });
  td.dataset.run = run.id;
  td.dataset.state = run.state;
  const steps = f.isNum(run.steps) ? ` / ${f.int(run.steps)}` : "";
  const stage = run.stage && run.stage !== run.state ? ` (${run.stage})` : "";
  td.append(el("span", { className: "run-state" }, `${run.state}${stage}`));
  td.append(el("span", { className: "run-step" }, ` · step ${f.int(run.step ?? 0)}${steps}`));
  const counts = restartWords(run);
  if (counts) td.append(el("span", { className: "run-crashes" }, ` · ${counts}`));
  const crash = el("button", { type: "button", className: "crash", disabled: !run.can_crash }, "Crash test");
  const why = crashWhy(run);
  if (why) crash.title = why;
  crash.addEventListener("click", () => act(run, "crash"));
  const stop = el("button", { type: "button", className: "stop", disabled: ENDED.has(run.state) }, "Stop");
  stop.addEventListener("click", () => act(run, "stop"));
  const buttons = el("span", { className: "class-buttons" });
  buttons.append(crash, stop);
  td.append(buttons);
  if (run.detail) { // a failure's error output: shown to instructors only, never to students
    const more = el("details", { className: "run-detail" });
    more.append(el("summary", {}, "error output"), el("pre", {}, run.detail));
    td.append(more);
  }
  return td;
}

function render(data) {
  $("#class-count").textContent = `· ${data.total} pair${data.total === 1 ? "" : "s"}`;
  const rows = data.pairs.map((p) => {
    const tr = el("tr");
    tr.dataset.pair = p.pair;
    tr.dataset.active = String(p.active);
    tr.append(el("td", {}, p.owner_tag));
    const lesson = el("td");
    lesson.append(el("a", { href: `/?pair=${enc(p.pair)}` }, `${p.preset?.title || p.preset_id}`));
    lesson.append(el("span", { className: "muted" }, ` ${p.preset_id}`));
    tr.append(lesson, el("td", {}, f.clock(p.created_at)));
    for (const run of p.runs) tr.append(runCell(run));
    return tr;
  });
  if (!rows.length) {
    const tr = el("tr");
    tr.append(el("td", { colSpan: 5, className: "muted" }, "No pairs yet: nobody has started a lesson."));
    rows.push(tr);
  }
  $("#class-rows").replaceChildren(...rows);
  const last = Math.min(data.total, offset + data.pairs.length);
  $("#class-range").textContent = data.total ? `pairs ${offset + 1}–${last} of ${data.total}` : "";
  $("#class-newer").disabled = offset === 0;
  $("#class-older").disabled = last >= data.total;
}

function turn(delta) {
  offset = Math.max(0, offset + delta);
  refresh();
}

async function act(run, what) {
  try {
    const res = await request("POST", `/api/runs/${enc(run.id)}/${what}`);
    const armed = res.first_step
      ? `Crash test armed on run ${run.label}: it is still starting, the SIGKILL lands at its first step.`
      : `Crash test armed on run ${run.label} at step ${res.at_step ?? "?"}: the SIGKILL lands when the next checkpoint write begins.`;
    const killed = `Crash test: killed process ${res.killed_pid} of run ${run.label} at step ${res.at_step ?? "?"}.`;
    status(what === "crash" ? (res.armed ? armed : killed) : `Stopping run ${run.label}.`);
  } catch (e) {
    status(`Could not ${what} run ${run.label}: ${e.message}`, "error");
  }
  refresh();
}

async function refresh() {
  try {
    render(await request("GET", `/api/instructor/class?offset=${offset}&limit=${PAGE}`));
    if (performance.now() - predictionsAt >= PREDICTIONS_EVERY_MS) {
      predictionsAt = performance.now();
      const data = await request("GET", "/api/instructor/class/predictions");
      renderClassPredictions($("#class-predictions"), data.lessons);
    }
    document.body.dataset.auth = "in";
    $("#need-login").hidden = true;
  } catch (e) {
    if (e.status === 401 || e.status === 403) {
      document.body.dataset.auth = "out";
      $("#need-login").hidden = false;
      if (e.status === 403) status(e.message, "error");
      return false;
    }
    status(`Could not load the class: ${e.message}`, "warn");
  }
  document.body.dataset.loaded = "true";
  return true;
}

async function boot() {
  $("#logout").addEventListener("click", async () => {
    await request("POST", "/api/instructor/logout");
    location.href = "/instructor";
  });
  $("#class-newer").addEventListener("click", () => turn(-PAGE));
  $("#class-older").addEventListener("click", () => turn(PAGE));
  if ((await refresh()) === false) {
    document.body.dataset.loaded = "true";
    return;
  }
  setInterval(refresh, REFRESH_MS);
}

boot();
