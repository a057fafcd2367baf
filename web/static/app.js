// The lab page: start a lesson, then follow both runs live. State flows one way:
// history from the API and the SSE stream -> PairModel -> render (at most twice a second,
// the charts once a second).
//
// The pair shown is the one in the URL (?pair=ID), else the last one this browser started.

import { api } from "./api.js";
import { CadencePanel } from "./cadence.js";
import { RunCard, StageList } from "./cards.js";
import { createCharts } from "./chart_specs.js";
import { uPlotLoaded } from "./charts.js";
import { countdownKey, renderEvents } from "./events.js";
import { foldForPhone, pickerText, renderHeader, renderProbes, renderResumeChecks, renderSamples } from "./lesson.js";
import { LessonSettings, ShareLink, lessonFromPath } from "./lesson_link.js";
import { clusterBanner, pairNodes } from "./cluster.js";
import { EnergyLedger, MachinePanel } from "./machine.js";
import { PairModel } from "./model.js";
import { showLessonPicker, stopPair } from "./pair_actions.js";
import { PredictionPanel } from "./predict.js";
import { followLive } from "./realtime.js";
import { followWarmUp } from "./warm_up.js";
import { TERMINAL } from "./run_states.js";

const $ = (sel) => document.querySelector(sel);
const STORE_KEY = "crashdrill.pair";
// Text at most twice a second and charts once: on a small machine the page shares the
// CPU with the trainers it shows (scripts/page_cpu.py measures what it costs them).
const RENDER_EVERY_MS = 500;
const CHARTS_EVERY_MS = 1000;

const page = {
  pair: null,
  cards: [],
  stages: [],
  charts: null,
  machine: null,
  nodes: new Map(), // Ray node id -> its newest telemetry sample (none on one machine)
  ledger: null,
  stream: null,
  dirty: false,
  lastRender: 0,
  chartsAt: 0, // when the charts were last redrawn
  finalDrawn: false, // the charts' last draw of a finished pair, off-screen ones included
  eventCount: -1,
  countdown: "", // the log's countdown notes when last drawn (events.js countdownKey)
  loaded: false,
  cadence: null, // the cadence calculator (cadence.js)
  settings: null, // the settings a student may change (lesson_link.js)
  share: null, // the lesson's link and Copy button
  predict: null, // "Your prediction" (predict.js)
};

function status(text, kind = "info") {
  const s = $("#status");
  s.textContent = text;
  s.dataset.kind = kind;
}

const memo = new Map();

/** Run `draw` only when `signature` changed since the last time (keeps text selectable). */
function once(key, signature, draw) {
  if (memo.get(key) === signature) return;
  memo.set(key, signature);
  draw();
}

function scheduleRender() {
  if (page.dirty) return;
  page.dirty = true;
  const wait = Math.max(0, RENDER_EVERY_MS - (performance.now() - page.lastRender));
  setTimeout(() => requestAnimationFrame(render), wait);
}

function render() {
  page.dirty = false;
  page.lastRender = performance.now();
  const pair = page.pair;
  if (!pair) return;
  for (const c of page.cards) c.update(pair, page.ledger.forRun(c.run.id));
  for (const s of page.stages) s.update(pair.view.preset?.crash?.wall_step ?? 0);
  page.machine.updateNodes(pairNodes(page.nodes, pair.ordered().map((r) => r.host())));
  page.machine.update(pair.machine, page.ledger);
  const runs = pair.ordered();
  once("probes", runs.map((r) => `${r.probe?.id}:${r.probe?.step}`).join(), () => renderProbes(pair));
  once("samples", runs.map((r) => `${r.sample?.id}:${r.sample?.step}`).join(), () => renderSamples(pair));
  const checks = JSON.stringify(runs.map((r) => [pair.checks.get(r.id) || [], r.crashes().map((c) => c.refused)]));
  once("checks", checks, () => renderResumeChecks(pair));
  page.predict.update(pair);
  page.predict.refresh(pair, `${checks}|${runs.map((r) => r.view.state).join()}`);
  const done = pair.ordered().every((r) => TERMINAL.has(r.view.state));
  const total = pair.ordered().reduce((n, r) => n + r.events.length, 0);
  const ticking = countdownKey(pair); // a blind launcher's survivors waiting: it counts down
  if (total !== page.eventCount || ticking !== page.countdown) {
    page.countdown = ticking;
    page.eventCount = renderEvents(pair);
  }
  const last = done && page.loaded && !page.finalDrawn; // the end, history in: every chart, in view or not
  if (page.charts && (last || !page.loaded || page.lastRender - page.chartsAt >= CHARTS_EVERY_MS)) {
    page.chartsAt = page.lastRender;
    page.charts.update(pair, last);
  }
  if (last) page.finalDrawn = true;
  page.cadence.update(pair);
  showAnswer(answerState(pair, done), pair.view.preset?.predict?.answer_after_outcome !== false);
  $("#again").hidden = !done;
  $("#stop-pair").hidden = done || !pair.view.owner;
  document.body.dataset.pairState = done ? "done" : "running";
  document.body.dataset.loaded = String(page.loaded);
}

/** Whether the answer may open: "ready" once the outcome the lesson's question is about is
 * in (the server's prediction status, else every asked run's crash shown), "none" when the
 * runs ended without a crash test (nothing to compare: said so, and the answer opens),
 * else null (it waits). */
function answerState(pair, done) {
  const q = pair.view.preset?.predict;
  const made = pair.view.prediction;
  if (made && !made.skipped && made.status) {
    if (made.status === "measured" || made.status === "partly") return "ready";
    if (made.status === "none") return "none";
  }
  const asked = q?.runs?.length ? pair.ordered().filter((r) => q.runs.includes(r.label)) : pair.ordered();
  if (outcomeIsIn(asked, pair)) return "ready";
  if (!done) return null;
  const crashed = asked.some((r) => r.crashes().length || (pair.checks.get(r.id) || []).length);
  return crashed ? "ready" : "none";
}

/** Every run was crash-tested and what its crash shows is there: a finished resume check,
 * or the run failed, or its check's outcome is a fresh start (a lesson's outcome; with the
 * pair done, its answer). */
function outcomeIsIn(runs, pair) {
  return runs.every((r) => {
    const checks = pair.checks.get(r.id) || [];
    if (!r.crashes().length && !checks.length) return false;
    const last = checks[checks.length - 1];
    return TERMINAL.has(r.view.state) || Boolean(last && (last.complete || last.outcome === "fresh"));
  });
}

/** "What happened, and why" stays folded, marked as the answer, until the outcome is in
 * (`ready`: "ready", or "none" when there was none); with `hold` (the lesson's
 * answer_after_outcome, the default) it cannot be opened before. */
function showAnswer(ready, hold = true) {
  const answer = $("#answer");
  const state = ready || (hold ? "held" : "waiting");
  if (answer.dataset.outcome === state) return;
  answer.dataset.outcome = state;
  if (state === "held") answer.open = false;
  answer.querySelector(".answer-note").textContent = {
    ready: "the outcome is in: open the answer",
    none: "the runs finished without a crash test: no outcome to compare; the answer is open",
    held: "opens once the outcome is in: predict, crash, watch first",
    waiting: "the answer: open it once you have seen the outcome",
  }[state];
}

// ---- starting a lesson ------------------------------------------------------------

async function showStart(message) {
  document.body.dataset.view = "start";
  if (message) status(message, "warn");
  const select = $("#preset");
  let presets;
  try {
    presets = await api.presets();
  } catch (e) {
    status(`Could not load the lessons: ${e.message}`, "error");
    return;
  }
  const lessonId = lessonFromPath(location.pathname);
  const linked = lessonId ? await loadLinked(lessonId) : null;
  if (linked && !presets.some((p) => p.id === linked.id)) presets.push(linked); // an instructor's preview
  const wanted = lessonId || new URLSearchParams(location.search).get("preset");
  select.replaceChildren(...presets.map((p) => {
    const o = document.createElement("option");
    o.value = p.id;
    o.textContent = pickerText(p);
    o.title = `${p.number} · ${p.title}`;
    return o;
  }));
  // The first lesson in course order (Quick) unless a link or the address names one.
  const pick = linked || presets.find((p) => p.id === wanted) || presets[0];
  if (pick) {
    select.value = pick.id;
    showLesson(pick, Boolean(lessonId));
  }
  select.onchange = () => {
    const p = presets.find((x) => x.id === select.value);
    if (!p) return;
    if (lessonId) history.replaceState(null, "", `/lesson/${encodeURIComponent(p.id)}`);
    page.predict.closeBeforeStart();
    showLesson(p, false);
  };
  page.settings.onchange = () => page.share.show(select.value, page.settings.overrides());
  $("#start").disabled = !presets.length;
  followWarmUp($("#warm-up"));
  $("#start-form").onsubmit = async (ev) => {
    ev.preventDefault();
    const lesson = presets.find((x) => x.id === select.value) || linked;
    if (page.predict.asksBeforeStart(lesson)) {
      // Its crash comes by itself (a session wall): the question comes first.
      page.predict.askBeforeStart(lesson, (answer) => startPair(select.value, answer));
      return;
    }
    await startPair(select.value, null);
  };
}

/** Create the pair of lesson `id` (with the answer given before Start, if any) and follow it. */
async function startPair(id, answer) {
  $("#start").disabled = true;
  status("Starting both runs…");
  try {
    const created = await api.createPair(id, page.settings.overrides());
    if (answer) {
      // Straight after the start, long before any crash: stored with the pair.
      await api.predict(created.pair, answer).catch((e) => status(`Your prediction was not saved: ${e.message}`, "warn"));
    }
    localStorage.setItem(STORE_KEY, created.pair);
    history.replaceState(null, "", `/?pair=${encodeURIComponent(created.pair)}`);
    await openPair(created.pair);
  } catch (e) {
    status(`Could not start the lesson: ${e.message}`, "error");
    $("#start").disabled = false;
  }
}

/** The lesson of a /lesson/ID link with the link's settings (checked by the server);
 * without them when they are refused, null when the lesson cannot be seen. */
async function loadLinked(id) {
  try {
    return await api.lesson(id, location.search);
  } catch (e) {
    if (location.search && (e.status === 403 || e.status === 422)) {
      status(`The link's settings were not applied: ${e.message}`, "error");
      return api.lesson(id).catch(() => null);
    }
    status(e.status === 404 ? `There is no lesson “${id}” here (or it is not published yet).`
      : `Could not load the lesson: ${e.message}`, "error");
    return null;
  }
}

/** The start view of one lesson: header, its settings, its link, the calculator. */
function showLesson(preset, open) {
  renderHeader(preset, preset.knob_text);
  page.settings.show(preset, open);
  page.share.show(preset.id, page.settings.overrides());
  page.cadence.setPreset(preset);
}

// ---- following a pair ---------------------------------------------------------------

async function openPair(pairId) {
  let view;
  let contract;
  try {
    [view, contract] = await Promise.all([api.pair(pairId), api.recordKinds()]);
  } catch (e) {
    if (e.status === 404) {
      localStorage.removeItem(STORE_KEY);
      history.replaceState(null, "", location.pathname);
      return showStart("That lesson is gone (the server's data was reset). Start a new one.");
    }
    status(`Could not load the lesson: ${e.message}`, "error");
    return undefined;
  }
  document.body.dataset.view = "pair";
  const pair = new PairModel(view, contract);
  page.pair = pair;
  page.nodes = new Map();
  page.ledger = new EnergyLedger(pair.id);
  renderHeader(view.preset, view.knob?.text);
  if (view.preset?.id) page.share.show(view.preset.id);
  const cards = $("#cards");
  const controls = $("#control-bar");
  const stages = $("#stage-lists");
  cards.replaceChildren();
  controls.replaceChildren();
  stages.replaceChildren();
  memo.clear();
  page.finalDrawn = false;
  page.cards = pair.ordered().map((r) => new RunCard(cards, controls, r, askFirst(crash), askFirst(preempt)));
  page.predict.show(pair);
  showLessonPicker(view.preset?.id);
  page.stages = pair.ordered().map((r) => new StageList(stages, r));
  page.machine ||= new MachinePanel($("#machine"));
  if (!page.charts) page.charts = createCharts($("#loss-chart"), $("#chart-grid"));
  if (!view.owner) status("Watching a lesson another browser started: you can follow it, not crash it.", "info");
  else status("");
  render();

  // Live first, so nothing that happens while the history loads is missed.
  page.stream?.close();
  page.stream = followLive(pair.id, {
    hello: (d) => {
      if (d.pair) pair.setView(d.pair);
      if (d.machine) onTelemetry(d.machine);
      for (const s of d.nodes || []) onTelemetry(s);
      if (d.cluster) onTelemetry({ cluster: d.cluster });
      scheduleRender();
    },
    records: (d) => onRecords(d),
    run: (v) => {
      pair.setView({ runs: [v] });
      scheduleRender();
    },
    resume_checks: (d) => {
      pair.checks.set(d.run, d.checks || []);
      scheduleRender();
    },
    telemetry: (s) => onTelemetry(s),
    status: (s, transport) => {
      $("#live").textContent = s === "live" ? "live" : "reconnecting…";
      $("#live").dataset.state = s;
      $("#live").dataset.transport = transport || "sse";
      $("#live").title = transport === "realtime" ? "via Supabase Realtime" : "via the server's event stream";
    },
    reopened: () => catchUpAll(),
    live: () => !pair.ordered().every((r) => TERMINAL.has(r.view.state)),
  });
  await loadHistory(pair);
  return undefined;
}

async function loadHistory(pair) {
  const t0 = performance.now();
  const jobs = pair.ordered().map(async (run) => {
    await api.records(run.id, 0, (recs) => {
      run.add(recs);
      scheduleRender();
    });
    pair.checks.set(run.id, (await api.resumeChecks(run.id)).checks);
  });
  jobs.push(api.machine(pair.id).then((m) => {
    if (m.sample) onTelemetry(m.sample);
    for (const s of m.nodes || []) onTelemetry(s);
    if (m.cluster) onTelemetry({ cluster: m.cluster });
  }).catch(() => {}));
  try {
    await Promise.all(jobs);
  } catch (e) {
    status(`Could not load the history: ${e.message}`, "error");
  }
  page.loaded = true;
  document.body.dataset.historyMs = String(Math.round(performance.now() - t0));
  scheduleRender();
}

/** Refetch a run's records after record id `after` (a stream gap or a reconnect). The
 * cursor is taken when the gap is seen, before newer records move run.lastId past the hole. */
function catchUp(run, after = run.lastId) {
  return api.records(run.id, after, (recs) => {
    run.add(recs);
    scheduleRender();
  }).catch((e) => status(`Could not refetch records: ${e.message}`, "warn"));
}

/** The pair's views now (after a hold): the cards follow without waiting for the stream. */
async function catchUpViews() {
  const pair = page.pair;
  const view = pair ? await api.pair(pair.id).catch(() => null) : null;
  if (view) pair.setView(view);
  scheduleRender();
}

async function catchUpAll() {
  const pair = page.pair;
  if (!pair) return;
  const view = await api.pair(pair.id).catch(() => null);
  if (view) pair.setView(view);
  await Promise.all(pair.ordered().map(async (run) => {
    await catchUp(run);
    pair.checks.set(run.id, (await api.resumeChecks(run.id).catch(() => ({ checks: [] }))).checks);
  }));
  scheduleRender();
}

function onRecords(d) {
  const run = page.pair?.runs.get(d.run);
  if (!run) return;
  const missed = run.missedBefore(d);
  if (missed !== null) {
    // Records were dropped for us, or the stream skipped some: fetch the hole, and keep
    // these meanwhile.
    page.gapsRefetched = (page.gapsRefetched || 0) + 1;
    document.body.dataset.gapsRefetched = String(page.gapsRefetched);
    catchUp(run, missed);
  }
  run.add(d.records || []);
  if ((d.records || []).some((r) => r.kind === "step" && Object.hasOwn(r, "startup_s"))) refreshStarts();
  scheduleRender();
}

/** A `telemetry` message: the server's machine sample, a Ray node's (with `node`), or the
 * cluster's reachability (`{"cluster": …}`, the banner). */
function onTelemetry(sample) {
  if (sample.cluster) {
    const text = clusterBanner(sample.cluster);
    const banner = $("#cluster-banner");
    banner.textContent = text || "";
    banner.hidden = !text;
    return;
  }
  const pair = page.pair;
  if (!pair) return;
  if (sample.node) {
    const newest = page.nodes.get(sample.node.node_id);
    if (!newest || sample.t > newest.t) page.nodes.set(sample.node.node_id, sample);
    scheduleRender();
    return;
  }
  pair.addTelemetry(sample);
  page.ledger.add(sample, pair);
  scheduleRender();
}

/** Crash test and Preempt ask the lesson's prediction first, once: the action is sent as
 * soon as the owner answers or skips (predict.js). */
function askFirst(action) {
  return (run, card, ...more) => {
    if (page.predict.mustAsk(page.pair)) page.predict.ask(page.pair, () => action(run, card, ...more));
    else action(run, card, ...more);
  };
}

/** `mode`: a crash mode the lesson offers besides its own (crash_offer.js); none: its own. */
async function crash(run, card, mode = null) {
  card.busy = true;
  card.say(`Sending SIGKILL to run ${run.label}…`);
  render();
  try {
    const res = await api.crash(run.id, mode);
    card.killed(res, run.view.segment ?? 0);
    signalled(run, "crash");
    page.pair.setView({ runs: [{ ...run.view, id: run.id, state: res.state, can_crash: false }] });
    card.busy = false;
    render(); // the restart's wait shows now: a forked trainer is back in under a second
  } catch (e) {
    card.say(e.status === 409 ? `Not now: ${e.message}` : `The crash test failed: ${e.message}`);
  } finally {
    card.busy = false;
    scheduleRender();
  }
}

/** A crash test or preemption of `run` went through: Crash test waits for a step record
 * of the segment after the one it hit, whatever views still in flight say. */
function signalled(run, kind) {
  run.signalled = Math.max(run.newestStepSegment() ?? 0, run.view.segment ?? 0);
  run.signalledKind = kind;
}

let startsFetch = null;

/** One of this pair's trainers measured its start (a step record with startup_s): fetch
 * the lab's figure again, so the next wait for a start says how long starts take now. */
function refreshStarts() {
  const pair = page.pair;
  if (!pair || startsFetch) return;
  startsFetch = api.pair(pair.id).then((view) => {
    if (page.pair === pair && view.start_times) pair.view.start_times = view.start_times;
    scheduleRender();
  }).catch(() => {}).finally(() => {
    startsFetch = null;
  });
}

async function preempt(run, card) {
  card.busy = true;
  card.say(`Sending SIGTERM to run ${run.label}…`);
  render();
  try {
    const res = await api.preempt(run.id);
    card.preempted(res, run.view.segment ?? 0);
    signalled(run, "preempt");
    graceTicks(card);
  } catch (e) {
    card.say(e.status === 409 ? `Not now: ${e.message}` : `The preemption failed: ${e.message}`);
  } finally {
    card.busy = false;
    scheduleRender();
  }
}

/** Redraw once a second while a preemption's grace counts down. */
function graceTicks(card) {
  const timer = setInterval(() => {
    if (!card.grace) clearInterval(timer);
    scheduleRender();
  }, 1000);
}

function boot() {
  if (!uPlotLoaded()) document.body.classList.add("no-charts");
  foldForPhone();
  page.cadence = new CadencePanel($("#cadence"));
  page.settings = new LessonSettings($("#lesson-settings"));
  page.share = new ShareLink();
  page.predict = new PredictionPanel($("#predict"), api);
  page.predict.onHeld = () => catchUpViews(); // the cards say "held" at once
  $("#stop-pair").addEventListener("click", () => stopPair(page.pair, status).finally(scheduleRender));
  $("#answer summary").addEventListener("click", (ev) => {
    if ($("#answer").dataset.outcome === "held") ev.preventDefault(); // not before the outcome
  });
  $("#again").addEventListener("click", () => {
    localStorage.removeItem(STORE_KEY);
    page.stream?.close();
    const lesson = page.pair?.view.preset?.id; // the same lesson stays selected
    location.href = `${location.pathname}?new=1${lesson ? `&preset=${encodeURIComponent(lesson)}` : ""}`;
  });
  setInterval(() => page.pair && scheduleRender(), 1000); // clocks: elapsed, "sampled 2 s ago"
  const params = new URLSearchParams(location.search);
  const linked = lessonFromPath(location.pathname) !== null; // a lesson link opens that lesson
  const pairId = params.get("pair") || (params.has("new") || linked ? null : localStorage.getItem(STORE_KEY));
  if (pairId) {
    if (!params.get("pair")) history.replaceState(null, "", `?pair=${encodeURIComponent(pairId)}`);
    openPair(pairId);
  } else {
    showStart();
  }
}

boot();
