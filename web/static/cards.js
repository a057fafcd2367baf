// A card per run (state, shape, progress, metrics, cost, Crash test and Preempt) and the
// per-run stage lists. Built once, then updated in place so focus and screen-reader
// position survive live updates.

import { offerButtons } from "./crash_offer.js";
import { crashWindow, windowText } from "./crash_window.js";
import { crashHint, killText, restartingText } from "./crash_words.js";
import * as f from "./format.js";
import { recentRates } from "./metric_series.js";
import { showRanks } from "./ranks.js";
import { ACTIVE, TERMINAL } from "./run_states.js";

export const STAGES = [
  ["queued", "Queued"],
  ["download", "Download data"],
  ["tokenize", "Tokenize"],
  ["build", "Build and compile"],
  ["warmup", "Warm up"],
  ["train", "Train"],
  ["finished", "Finished"],
];
const ORDER = Object.fromEntries(STAGES.map(([k], i) => [k, i]));

/** Where a stage sits against training: "before" (queued … warm up), "train", or "after"
 * (the trainer said it finished, failed or diverged): a stage after training is never "starting". */
export function stagePhase(stage) {
  if (stage === "train") return "train";
  if (stage === "finished" || stage === "failed" || stage === "diverged") return "after";
  return "before";
}

/** The trainer of the run's newest segment said it finished (its `finished` stage record,
 * or the view's stage): the run is done, whatever state the supervisor reports a moment later. */
function trainerFinished(run) {
  const v = run.view;
  if (v.stage === "finished") return true;
  const rec = run.stages.get("finished");
  return Boolean(rec) && (rec.segment ?? 0) >= (v.segment ?? 0) && (rec.segment ?? 0) >= run.maxSegment;
}

/** How long starts take on this lab (the median the trainers measured), as said beside a
 * start: "a start usually takes ≈ 0.4 s on this lab", or "" before one was measured. */
export function startsNote(starts) {
  const median = starts && starts.count > 0 && f.isNum(starts.median_s) ? starts.median_s : null;
  return median === null ? "" : `a start usually takes ≈ ${f.seconds(median)} on this lab`;
}

/** The checkpoint step an armed crash test waits for: the next multiple of the run's
 * ckpt_every after `step`; null when the run's cadence is unknown. */
function nextCheckpoint(run, preset, step) {
  const cfg = run.runRecord?.config || {};
  let every = cfg.ckpt_every;
  if (!f.isNum(every)) {
    const knob = preset?.knob;
    every = knob?.name === "ckpt_every" ? (run.label === "A" ? knob.a : knob.b) : preset?.run?.ckpt_every;
  }
  if (!f.isNum(every) || every <= 0) return null;
  return (Math.floor((step ?? 0) / every) + 1) * every;
}

/** The crash test of this run that is armed and has not landed: the page's own (the
 * crash answer said `armed`: a mode that waits for a checkpoint write), or, after a reload, the run view's
 * `pending_kill` (the server keeps it until the restart writes a step); null when none. */
export function armedKill(run) {
  const v = run.view;
  if (!["running", "starting"].includes(v.state) || v.stage === "restarting") return null;
  const seg = v.segment ?? 0;
  if (run.restartEvent(seg) || run.maxSegment > seg) return null;
  if (run.armed && run.armed.segment === seg) return run.armed;
  const pending = v.pending_kill;
  if (pending?.armed && (pending.segment ?? seg) === seg) return { segment: seg, pid: null, step: pending.at_step ?? null };
  return null;
}

/** The lab's hold of the run while its student answers (view.held, until its time is out). */
export function heldNow(run) {
  const h = run.view.held;
  return h && h.until * 1000 > Date.now() ? h : null;
}

/** What a student calls the run's state: queued / starting / training / kill armed /
 * crashed / preempted / restarting / resuming / done / failed / stopped, and a sentence that says why.
 * `starts`: how long trainer starts take on this lab ({median_s, count} from the pair
 * view), said while a start is pending; nothing is said before one was measured. */
export function studentState(run, starts = null, preset = null) {
  const v = run.view;
  const crashes = run.crashes();
  const last = crashes[crashes.length - 1];
  const usual = startsNote(starts);
  const note = usual && run.startPending() ? ` ${usual[0].toUpperCase()}${usual.slice(1)}.` : "";
  const wall = preset?.crash?.wall_step ?? 0;
  const ended = () => {
    const seg = run.newestStepSegment() ?? 0; // the segment whose trainer ended
    const e = run.newestRestart(seg);
    if (run.endedBy(seg, wall) === "preempt") {
      return ["preempted", (e ? e.text : "Preempted: SIGTERM, then SIGKILL if it is still alive after its grace. Restarting; what it resumes from is said once the restart has loaded it.") + note];
    }
    return ["crashed", `Killed with SIGKILL (no chance to save). ${restartingText(e)}${note}`];
  };
  if (ACTIVE.has(v.state) && trainerFinished(run)) {
    return ["done", `Finished ${f.int(v.steps)} steps.`]; // the supervisor's report is on its way
  }
  if (ACTIVE.has(v.state) && v.stage === "diverged") {
    return ["diverged", `Diverged: the loss stopped being a finite number.${changedText(preset?.overrides)}`]; // likewise
  }
  if (ACTIVE.has(v.state) && v.stage === "failed") {
    return ["failed", "The trainer stopped with an error; the lab is reading why."]; // likewise
  }
  const held = heldNow(run);
  if (held) {
    const left = Math.max(0, Math.ceil(held.until - Date.now() / 1000));
    return ["held", `Held at step ${f.int(held.at_step ?? v.step)} while you answer the prediction: the trainer is stopped where it is (nothing trains, nothing is saved), for at most ${left} s more.`];
  }
  const armed = armedKill(run);
  if (armed) {
    const at = nextCheckpoint(run, preset, v.step ?? run.maxStep);
    const where = at !== null ? ` (step ${f.int(at)})` : "";
    return ["kill armed", `Crash test armed: SIGKILL at the next checkpoint write${where}. It trains on until that write begins.`];
  }
  // Restarting until the restarted trainer's first step record: a view that still says
  // restarting after it (views are pushed throttled) is stale.
  if ((v.state === "restarting" || v.stage === "restarting") && run.startPending()) return ended();
  switch (v.state) {
    case "queued": {
      const left = run.queueWaitLeft();
      const wait = left !== null ? `, about ${f.seconds(left)}` : "";
      return ["queued", v.queue_position ? `Waiting for a free slot: number ${v.queue_position} in the queue${wait}.` : "Waiting for a free slot."];
    }
    case "starting":
      if (!run.startPending()) return ["training", "Training."]; // its report is on its way
      return ["starting", usual ? `Starting the trainer: ${usual}.` : "Starting the trainer process."];
    case "restarting":
    case "running":
      if ((v.crashes ?? 0) > (v.segment ?? 0) && run.startPending()) {
        return ["restarting", `Restarted after the crash: ${restartingText(run.newestRestart(v.segment ?? 0), true)}${note}`];
      }
      if (v.segment > 0 && last && (stagePhase(v.stage) !== "train" || (v.step ?? 0) < last.reached)) {
        if (last.fresh) {
          return ["fresh start", `Started over from step 0: no checkpoint was found after the crash, so a new model trains from scratch and the ${f.int(last.reached)} steps trained before it are redone.${note}`];
        }
        if (!f.isNum(last.from)) { // its trainer has not said what it loaded yet
          return ["restarting", `Restarted after the crash: ${restartingText(run.newestRestart(v.segment - 1), true)}${note}`];
        }
        const from = last.from;
        if (from >= last.reached) return ["resuming", `Resumed from the checkpoint at step ${f.int(from)}: nothing was lost.${note}`];
        return ["resuming", `Resumed from the checkpoint at step ${f.int(from)}; recomputing steps ${f.int(from + 1)}–${f.int(last.reached)} lost in the crash.${note}`];
      }
      if (stagePhase(v.stage) === "before") return ["starting", `Preparing: ${stageName(v.stage)}.${note}`];
      if (v.segment > 0 && last?.fresh) return ["training", `Training past the crash, on a model started over from step 0 (segment ${v.segment}).`];
      return ["training", v.segment > 0 ? `Training past the crash (segment ${v.segment}).` : "Training."];
    case "finished":
      if (crashes.some((c) => c.fresh)) return ["done", `Finished ${f.int(v.steps)} steps, on a model started over from step 0 after the crash.`];
      return ["done", `Finished ${f.int(v.steps)} steps.`];
    case "failed":
      return ["failed", v.message || `The trainer exited with status ${v.exit_code}.`];
    case "stopped":
      return ["stopped", v.message || "Stopped."];
    case "diverged":
      return ["diverged", (v.message || `Diverged at step ${f.int(v.step)}.`) + changedText(preset?.overrides)];
    default:
      return [v.state, ""];
  }
}

/** " Settings changed from the lesson: lr = 1, warmup = 0." (a pair's overrides), or "". */
function changedText(overrides) {
  const parts = Object.entries(overrides || {}).map(([k, x]) => `${k} = ${typeof x === "object" ? JSON.stringify(x) : x}`);
  return parts.length ? ` Settings changed from the lesson: ${parts.join(", ")}.` : " It diverged with the lesson's own settings.";
}

function stageName(key) {
  const hit = STAGES.find(([k]) => k === key);
  return hit ? hit[1] : key || "waiting";
}

/** Why the Crash test button is disabled, or null when it may be pressed: from the first
 * step record of the run's newest segment on the stream (the run view is pushed
 * throttled and lags), never after this page's crash test or preemption until a step
 * record of a newer segment came. The server checks again (409), and says so. `starts`:
 * how long starts take on this lab, said while one is pending. */
export function crashBlocker(run, owner, starts = null, preset = null) {
  const v = run.view;
  const said = v.state !== "queued" && (trainerFinished(run) || v.stage === "failed" || v.stage === "diverged");
  if (TERMINAL.has(v.state) || said) {
    const word =
      v.state === "failed" || v.stage === "failed"
        ? "Failed"
        : v.state === "diverged" || v.stage === "diverged"
          ? "Diverged"
          : v.state === "stopped"
            ? "Stopped"
            : "Finished";
    return `${word}: there is no training process left to kill.`;
  }
  if (!owner) return "Only the browser that started this lesson can crash its runs.";
  if (armedKill(run)) return "Crash test armed: the SIGKILL lands when the next checkpoint write begins.";
  if (!run.startPending()) return null;
  const usual = startsNote(starts);
  const wait = usual ? ` (${usual})` : "";
  const restarting = v.state === "restarting" || v.stage === "restarting" || run.signalled !== null
    || run.newestStepSegment() !== null;
  if (v.state === "restarting" || (v.state === "running" && v.stage === "restarting")) {
    const seg = run.newestStepSegment() ?? 0;
    const what = run.endedBy(seg, preset?.crash?.wall_step ?? 0) === "preempt" ? "Preempted" : "Already crashed";
    return `${what}: it is restarting from its checkpoint${wait}.`;
  }
  switch (v.state) {
    case "queued": return "Not started yet: it is waiting in the queue.";
    case "starting": return `Not training yet: the trainer is starting${wait}.`;
    case "running":
      if (restarting) return `Restarting from its checkpoint${wait}: Crash test comes back with its first step.`;
      return `Not training yet (${stageName(v.stage).toLowerCase()}): crash tests hit training runs${wait}.`;
    default: return "Not available now.";
  }
}

function shapeText(run, preset, executor) {
  const rr = run.runRecord;
  const cfg = (rr && rr.config) || (preset && preset.run) || {};
  const parts = [];
  parts.push(rr?.dataset || cfg.data || "builtin");
  if (f.isNum(cfg.n_layer) && f.isNum(cfg.d_model)) parts.push(`${cfg.n_layer}L·${cfg.d_model}d`);
  if (rr && f.isNum(rr.params)) parts.push(`${f.params(rr.params)} params`);
  parts.push(rr?.precision || cfg.precision || "fp32");
  if (rr?.device) parts.push(rr.device_name && rr.device_name !== rr.device ? rr.device_name : rr.device);
  // The node it trains on, on a cluster, or the host it moved to; on a lab of one machine
  // ("local") the card names none: there is no other machine it could be on.
  const host = run.host ? run.host() : null;
  const moved = run.events.some((e) => e.host && typeof e.host.name === "string");
  if (host && (moved || (executor && executor !== "local"))) parts.push(`on ${host.name}`);
  return parts.join(" · ");
}

const CARD_HTML = `
  <header class="card-head">
    <h3><span class="run-name"></span> <span class="card-knob"></span></h3>
  </header>
  <p class="state-line"></p>
  <ul class="ranks" hidden></ul>
  <p class="shape"></p>
  <div class="big">
    <div><span class="k">tokens read</span><span class="v tokens">–</span></div>
    <div><span class="k">train loss, this step</span><span class="v" data-m="loss">–</span></div>
  </div>
  <progress class="step-progress" max="1" value="0"></progress>
  <dl class="metrics">
    <div><dt>best val</dt><dd data-m="val">–</dd></div>
    <div><dt>tokens/s</dt><dd data-m="tps">–</dd></div>
    <div><dt>MFU</dt><dd data-m="mfu">–</dd></div>
    <div><dt>peak mem</dt><dd data-m="mem">–</dd></div>
    <div><dt>lr</dt><dd data-m="lr">–</dd></div>
  </dl>
  <p class="cost"></p>`;

// The run's live controls, in the control bar that stays in view while a lesson runs:
// state, step, the crash window and the buttons that act on the run.
const CONTROL_HTML = `
  <div class="ctl-head">
    <span class="ctl-name"><span class="run-name"></span> <span class="knob-value"></span></span>
    <span class="badge" role="status"></span>
    <span class="ctl-step"><span class="k">step</span> <span class="steps">–</span></span>
  </div>
  <div class="crash-row">
    <button type="button" class="crash">Crash test</button>
    <button type="button" class="preempt">Preempt</button>
    <p class="crash-window"></p>
  </div>
  <p class="crash-why"></p>`;

const c0 = (ctl) => ctl.querySelector(".crash-row");

/** Write `text` only when it changed: a text write costs a layout even when equal. */
function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

export class RunCard {
  /** The card goes into `container`, the run's controls into `controls` (the bar). */
  constructor(container, controls, run, onCrash, onPreempt) {
    this.run = run;
    const L = run.label;
    const card = document.createElement("article");
    card.className = `run-card run-${L}`;
    card.dataset.label = L;
    card.setAttribute("aria-labelledby", `run-${L}-name`);
    card.innerHTML = CARD_HTML;
    const ctl = document.createElement("div");
    ctl.className = `control run-${L}`;
    ctl.dataset.label = L;
    ctl.setAttribute("role", "group");
    ctl.setAttribute("aria-label", `Run ${L}: state, step and Crash test`);
    ctl.innerHTML = CONTROL_HTML;
    const q = (s) => card.querySelector(s);
    const c = (s) => ctl.querySelector(s);
    this.el = card;
    this.control = ctl;
    this.name = q(".run-name");
    this.name.id = `run-${L}-name`;
    this.name.textContent = `Run ${L}`;
    c(".run-name").textContent = L;
    this.knob = c(".knob-value");
    this.cardKnob = q(".card-knob");
    this.badge = c(".badge");
    this.stateLine = q(".state-line");
    this.ranks = q(".ranks");
    this.ranks.setAttribute("aria-label", `Run ${L}'s ranks`);
    this.shape = q(".shape");
    this.tokens = q(".tokens");
    this.steps = c(".steps");
    this.progress = q(".step-progress");
    this.progress.setAttribute("aria-label", `Run ${L} steps done`);
    this.cost = q(".cost");
    this.window = c(".crash-window");
    this.button = c(".crash");
    this.button.setAttribute("aria-label", `Crash test run ${L}: kill it with SIGKILL now`);
    this.why = c(".crash-why");
    this.why.id = `crash-why-${L}`;
    this.button.setAttribute("aria-describedby", this.why.id);
    this.metrics = Object.fromEntries([...card.querySelectorAll("[data-m]")].map((d) => [d.dataset.m, d]));
    this.button.addEventListener("click", () => onCrash(this.run, this));
    this.onCrash = onCrash; // the lesson's offered modes' buttons call it too (crash_offer.js)
    this.preemptButton = c(".preempt");
    this.preemptButton.setAttribute("aria-label", `Preempt run ${L}: SIGTERM now, SIGKILL after its grace`);
    this.preemptButton.setAttribute("aria-describedby", this.why.id);
    this.preemptButton.title = "SIGTERM now and SIGKILL after the run's grace, as spot VMs and SLURM do: a trainer that handles SIGTERM saves first.";
    if (onPreempt) this.preemptButton.addEventListener("click", () => onPreempt(this.run, this));
    else this.preemptButton.hidden = true;
    container.append(card);
    controls.append(ctl);
  }

  /** A message under the button (the server's answer to a refused crash, say). */
  say(text) {
    this.flash = text;
    this.flashUntil = Date.now() + 8000;
    this.why.textContent = text;
    this.why.dataset.kind = "message";
  }

  /** The answer to a Crash test. The server answers with the newest step it had read; the
   * trainer's crash event says where the kill really landed, and replaces it when it comes. */
  killed(res, segment) {
    this.kill = { pid: res.killed_pid, step: res.at_step, segment, done: false, text: "" };
    if (res.first_step) {
      // Pressed while the run was starting or restarting: it lands at the first step.
      this.say(`Crash test armed: SIGKILL when the trainer writes its first step (it is still starting).`);
      return;
    }
    if (res.armed) {
      // A mode that waits for a save: the kill lands at the next checkpoint write.
      this.run.armed = { segment, pid: res.killed_pid, step: res.at_step };
      this.say(`Crash test armed at step ${res.at_step ?? "?"}: SIGKILL for process ${res.killed_pid} at the next checkpoint write.`);
      return;
    }
    this.say(killText(res.killed_pid, res.at_step));
  }

  /** The answer to Preempt: the grace counts down under the buttons until the run ends. */
  preempted(res, segment) {
    this.grace = { pid: res.signalled_pid, step: res.at_step, segment, until: Date.now() + res.grace_s * 1000 };
  }

  update(pair, energy) {
    const run = this.run;
    const v = run.view;
    if (this.grace) {
      // The countdown is over once the trainer ended: its restart event, any record of a
      // newer segment, or a view past it says so (whichever comes first); never after.
      const g = this.grace;
      const left = Math.ceil((g.until - Date.now()) / 1000);
      const stop = run.restartEvent(g.segment);
      const ended = stop || run.maxSegment > g.segment || (v.segment ?? 0) > g.segment
        || !["running", "starting"].includes(v.state) || v.stage === "restarting";
      if (ended) {
        this.grace = null;
        this.say(stop ? stop.text : `Process ${g.pid} ended after the SIGTERM${left > 0 ? `, ${left} s before its grace ran out` : ""}.`);
      } else if (left > 0) {
        this.say(`SIGTERM sent to process ${g.pid} at step ${g.step ?? "?"}: ${left} s of grace before SIGKILL.`);
      } else {
        this.say(`SIGTERM sent to process ${g.pid} at step ${g.step ?? "?"}: its grace is over, SIGKILL sent.`);
      }
    }
    if (this.kill && !this.kill.done) {
      // The crash event says where the kill landed; what the restart did comes from the
      // trainer's own records (resumed, started over, refused), said once they are in.
      const k = this.kill;
      const e = run.events.find((x) => x.code === "crash" && (x.segment ?? 0) === k.segment);
      const next = e ? run.crashes().find((c) => c.segment === k.segment + 1) : null;
      const rejected = run.events.some((x) => x.code === "ckpt_corrupt" && x.segment === k.segment + 1);
      const after = next && (next.refused || next.fresh || f.isNum(next.from)) ? { ...next, rejected } : null;
      const text = killText(k.pid, Number.isInteger(e?.at_step) ? e.at_step : k.step, e, after);
      if (e && text !== k.text) this.say(text);
      k.text = e ? text : k.text;
      k.done = after !== null;
    }
    const preset = pair.view.preset;
    const [state, line] = studentState(run, pair.view.start_times, preset);
    setText(this.badge, state);
    if (this.control.dataset.state !== state) {
      this.badge.className = `badge state-${state.replace(/ /g, "-")}`;
      this.el.dataset.state = state;
      this.control.dataset.state = state;
    }
    setText(this.stateLine, line);
    showRanks(this.ranks, v.ranks);
    const knob = v.knob && v.knob.name ? `${v.knob.name} ${v.knob.value}` : "";
    setText(this.knob, knob);
    setText(this.cardKnob, knob);
    setText(this.shape, shapeText(run, preset, pair.view.executor));
    const last = run.latestStep();
    setText(this.tokens, f.int(last?.tokens));
    const step = f.isNum(v.step) ? v.step : last?.step;
    setText(this.steps, `${f.int(step ?? 0)} / ${f.int(v.steps)}`);
    this.progress.max = v.steps || 1;
    this.progress.value = Math.min(step ?? 0, v.steps || 1);
    const m = this.metrics;
    setText(m.loss, f.loss(last?.loss));
    setText(m.val, f.loss(run.bestVal()));
    const rates = recentRates(run); // this process's own steps only, never restored ones
    setText(m.tps, heldNow(run) ? "held" : f.compact(rates.tokensPerS));
    setText(m.mfu, f.pctOfFraction(rates.mfu));
    m.tps.title = m.mfu.title = rates.steps ? `over the last ${rates.steps} steps this trainer process trained` : "";
    setText(m.mem, f.bytes(run.peakMem()));
    m.mem.title = last?.mem_kind === "rss" ? "process RSS (CPU run)" : "peak CUDA memory allocated";
    setText(m.lr, f.sci(last?.lr));
    const done = TERMINAL.has(v.state);
    const end = done ? run.lastT : Date.now() / 1000;
    const elapsed = run.firstT !== null && end !== null ? end - run.firstT : null;
    const e = energy || {};
    const kwhText = e.hasEnergy ? `${f.kwh(e.kwh)} ≈ ${f.usd(e.powerUsd)} power` : "no energy counter";
    const rent = f.isNum(e.rentUsd) ? ` · ≈ ${f.usd(e.rentUsd)} to rent` : "";
    setText(this.cost, `${f.duration(elapsed)} · ${kwhText}${rent}`);
    this.cost.title = e.hasEnergy ? "this run's share of the machine's energy while this page watched"
      : "no energy counter on this machine (needs NVML on a GPU, or readable RAPL)";
    const win = crashWindow(preset, v.steps, run.label);
    const [winText, winKind] = windowText(win, step, run.crashSteps(), !done);
    setText(this.window, winText || "");
    this.window.hidden = !winText;
    if (winKind) this.window.dataset.kind = winKind;
    const blocker = crashBlocker(run, pair.view.owner !== false, pair.view.start_times, preset);
    this.control.dataset.stepSegment = String(run.newestStepSegment() ?? ""); // trained segment
    this.button.disabled = blocker !== null || this.busy === true;
    this.button.setAttribute("aria-disabled", String(this.button.disabled));
    this.offers ??= offerButtons(this, c0(this.control), preset, pair.crashModes, this.onCrash);
    for (const b of this.offers) b.disabled = this.button.disabled;
    this.preemptButton.disabled = this.button.disabled || Boolean(this.grace);
    this.preemptButton.setAttribute("aria-disabled", String(this.preemptButton.disabled));
    if (this.flash && Date.now() < this.flashUntil) {
      setText(this.why, this.flash);
      return;
    }
    const mode = pair.crashModes?.get(preset?.crash?.mode);
    const cluster = Boolean(pair.view.executor) && pair.view.executor !== "local";
    const why = blocker || (["resuming", "restarting"].includes(state) ? "" : crashHint(mode, cluster));
    setText(this.why, why);
    this.why.dataset.kind = blocker ? "blocked" : "default";
  }
}

/** The newest stage the trainer reported (for a run that failed or was stopped in it). */
function lastStage(run) {
  let best = null;
  for (const [key, rec] of run.stages) {
    if (ORDER[key] !== undefined && key !== "finished" && (!best || (rec.t ?? 0) >= (best.t ?? 0))) best = { key, t: rec.t };
  }
  return best && best.key;
}

/** The stage list of one run: done / running with progress / waiting. */
export class StageList {
  constructor(container, run) {
    this.run = run;
    const box = document.createElement("section");
    box.className = `stages run-${run.label}`;
    box.setAttribute("aria-label", `Run ${run.label} stages`);
    box.innerHTML = `<h3>Run ${run.label}</h3><ol></ol>`;
    this.items = STAGES.map(([key, name]) => {
      const li = document.createElement("li");
      li.dataset.stage = key;
      li.innerHTML = `<span class="stage-name"></span><span class="stage-status"></span><progress max="1" value="0"></progress>`;
      li.querySelector(".stage-name").textContent = name;
      li.querySelector("progress").setAttribute("aria-label", `Run ${run.label}: ${name}`);
      box.querySelector("ol").append(li);
      return li;
    });
    container.append(box);
  }

  /** `wallStep`: the lesson's session wall (a stop there is a preemption). */
  update(wallStep = 0) {
    const run = this.run;
    const v = run.view;
    let current = v.stage;
    const crashed = (v.state === "restarting" || v.stage === "restarting") && run.startPending();
    if (v.state === "queued") current = "queued";
    else if (crashed) current = "train";
    else if (v.state === "starting" || v.stage === "starting") current = "download";
    const done = v.state === "finished";
    if (ORDER[current] === undefined && !done) current = lastStage(run) || "queued"; // failed, stopped
    const cur = ORDER[current] ?? (done ? ORDER.finished : 0);
    this.items.forEach((li, i) => {
      const key = STAGES[i][0];
      let status;
      let progress = 0;
      if (done || i < cur) {
        status = "done";
        progress = 1;
      } else if (i === cur) {
        const rec = run.stages.get(key);
        progress = key === "train" && v.steps ? (v.step ?? 0) / v.steps
          : f.isNum(v.stage_progress) ? v.stage_progress : rec?.progress ?? 0;
        if (key === "finished") {
          status = "done";
          progress = 1;
        } else if (crashed) {
          // What ended the segment: a preemption (SIGTERM) is not a crash. "restarting"
          // until the restart has loaded something: it may yet refuse to start.
          const preempted = run.endedBy(run.newestStepSegment() ?? 0, wallStep) === "preempt";
          status = preempted ? "preempted · restarting" : "crashed · restarting";
        }
        else if (v.state === "failed") status = "failed";
        else if (v.state === "stopped" || v.state === "diverged") status = v.state;
        else status = key === "queued" ? "waiting" : `running ${Math.round(progress * 100)}%`;
      } else {
        status = ["failed", "stopped", "diverged"].includes(v.state) ? "–" : "waiting";
      }
      li.dataset.status = status.split(" ")[0];
      li.querySelector(".stage-status").textContent = status;
      li.querySelector("progress").value = progress;
    });
  }
}
