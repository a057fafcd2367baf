// The page's state of one pair: each run's view from GET /api/pairs/{pair} plus every
// record it has seen (history from /api/runs/{run}/records, then live from the stream).
// Records are idempotent by id (and by segment:step:kind for the kinds that the record
// contract, GET /api/record-kinds, marks keyed_by_step), so a refetch that overlaps the
// stream adds nothing twice.

import { ACTIVE } from "./run_states.js";

/** The names of the kinds stored once per (segment, step), from GET /api/record-kinds. */
export function stepKeyedKinds(contract) {
  return new Set((contract?.kinds || []).filter((k) => k.keyed_by_step).map((k) => k.name));
}

/** The event codes of the contract (GET /api/record-kinds `events`: weight, levels,
 * fields), by code. */
export function eventCodes(contract) {
  return new Map((contract?.events || []).map((e) => [e.code, e]));
}


/** A supervisor's event that ends a segment and starts the next one (a crash test, a
 * preemption, a graceful stop, a lost host, an unasked kill): the contract gives every
 * one `resume_from`, and its code a `restart` kind (docs/run-contract.md, Event codes). */
export function isRestartEvent(e) {
  return Object.hasOwn(e, "resume_from");
}

export class RunModel {
  /** `codes`: the contract's event codes (eventCodes): a restart event's code's `restart`
   * says whether it was a preemption (SIGTERM: a chance to save) or a crash. */
  constructor(view, stepKeyed, codes = new Map()) {
    this.stepKeyed = stepKeyed; // Set of kind names (stepKeyedKinds)
    this.codes = codes;
    this.id = view.id;
    this.label = view.label;
    this.view = view; // the server's run view: state, stage, step, steps, latest, …
    this.lastId = 0; // newest record id seen (for ?after=)
    this.keys = new Set();
    this.steps = new Map(); // segment -> Map(step -> step record)
    this.val = new Map(); // step -> val record (newest segment wins)
    this.probe = null; // newest probe record
    this.sample = null; // newest sample record
    this.ckpts = [];
    this.resumes = []; // resume records, by segment
    this.events = []; // event records
    this.stages = new Map(); // stage -> {progress, t}
    this.runRecord = null; // newest `run` record: params, config, dataset, device…
    this.firstT = null;
    this.lastT = null;
    this.maxStep = 0;
    this.maxSegment = 0; // the newest segment any record of the run names
    // The segment a crash test or preemption from this page hit: its restart has not
    // trained until a step record of a newer segment arrives.
    this.signalled = null;
    this.signalledKind = null; // "crash" | "preempt": what this page sent
    // A crash test armed to land inside the next checkpoint write (a crash mode that
    // waits_for_save): {segment, pid, step} until the trainer of that segment ends.
    this.armed = null;
    this.waitUntil = null; // while queued: when the server expects it to start (unix s)
    this.version = 0; // bumps on every change, for cheap redraw checks
    this._noteWait(view);
  }

  setView(view) {
    this.view = { ...this.view, ...view };
    this._noteWait(view);
    this.version += 1;
  }

  _noteWait(view) {
    if (!Object.hasOwn(view, "queue_wait_s")) return;
    const wait = view.queue_wait_s;
    this.waitUntil = typeof wait === "number" && Number.isFinite(wait) ? Date.now() / 1000 + wait : null;
  }

  /** Seconds left of the server's estimate of the queue wait; null when there is none. */
  queueWaitLeft() {
    if (this.waitUntil === null) return null;
    const left = this.waitUntil - Date.now() / 1000;
    return left > 0 ? left : null;
  }

  /** The newest segment that has a step record, or null before the first one. */
  newestStepSegment() {
    let newest = null;
    for (const [seg, rows] of this.steps) if (rows.size && (newest === null || seg > newest)) newest = seg;
    return newest;
  }

  /** The trainer of the run's newest segment has not written a step record yet: the run
   * is starting or restarting (or waits in the queue). Crash test waits for that record;
   * a view pushed before it (the server's are throttled) never counts for it. */
  startPending() {
    const v = this.view;
    if (!ACTIVE.has(v.state)) return v.state === "queued";
    const seg = this.newestStepSegment();
    if (seg === null || seg < this.maxSegment) return true;
    if (this.signalled !== null && seg <= this.signalled) return true;
    for (const e of this.events) if (isRestartEvent(e) && seg <= (e.segment ?? 0)) return true;
    // A view built before a step record this page has (its newest step is of an older
    // segment) says "restarting" of a restart that has trained since.
    const viewStep = v.latest?.step?.segment;
    if (Number.isInteger(viewStep) && viewStep < seg) return false;
    return (v.state === "restarting" || v.stage === "restarting") && seg <= (v.segment ?? 0);
  }

  /** The supervisor's event that ended `segment` (a crash test, a preemption, a graceful
   * stop, a lost host…), or undefined while that segment's trainer has not ended. */
  restartEvent(segment) {
    return this.events.find((e) => isRestartEvent(e) && (e.segment ?? 0) === segment);
  }

  /** The newest restart event of segment `from` or later: the restart under way when
   * `from` is the newest segment that trained (a view may already name the next one). */
  newestRestart(from) {
    let best;
    for (const e of this.events) {
      if (isRestartEvent(e) && (e.segment ?? 0) >= from && (!best || (e.segment ?? 0) > (best.segment ?? 0))) best = e;
    }
    return best;
  }

  /** "preempt" or "crash" for a restart event, by its code's `restart` in the contract. */
  restartKind(e) {
    return this.codes.get(e.code)?.restart === "preempt" ? "preempt" : "crash";
  }

  /** "preempt" (SIGTERM: a preemption, a session wall, a graceful stop) or "crash"
   * (SIGKILL: a crash test, a lost host, an unasked kill) for what ended the run's newest
   * segment that trained (`segment`, or later); before its event comes, what this page
   * asked for (`signalledKind`), else the lesson's wall when the run is past it, else
   * "crash". */
  endedBy(segment, wallStep = 0) {
    const e = this.newestRestart(segment);
    if (e) return this.restartKind(e);
    if (this.signalled !== null && this.signalledKind) return this.signalledKind;
    if (wallStep > 0 && this.maxStep >= wallStep && (segment ?? 0) === 0) return "preempt";
    return "crash";
  }

  /** The record id to refetch after when a stream message skipped records (`d`: a
   * `records` message): its `gap` (the server dropped some for us), or its `after` (the
   * run's record before its first one) past the newest id this page has — a hole however
   * it came. null when nothing was skipped. Taken before the message's records are added. */
  missedBefore(d) {
    if (d.gap) return this.lastId;
    if (Number.isInteger(d.after) && d.after > this.lastId) return this.lastId;
    return null;
  }

  /** Add records (objects with id when they came from the server); returns how many were new. */
  add(records) {
    let added = 0;
    for (const r of records) {
      if (!r || typeof r.kind !== "string") continue;
      const seg = Number.isInteger(r.segment) ? r.segment : 0;
      const key = this.stepKeyed.has(r.kind) && Number.isInteger(r.step)
        ? `${seg}:${r.step}:${r.kind}`
        : Number.isInteger(r.id) ? `#${r.id}` : `${r.kind}@${r.t}:${r.text ?? r.stage ?? ""}`;
      if (Number.isInteger(r.id) && r.id > this.lastId) this.lastId = r.id;
      if (this.keys.has(key)) continue;
      this.keys.add(key);
      added += 1;
      this._apply(r, seg);
    }
    if (added) this.version += 1;
    return added;
  }

  _apply(r, seg) {
    if (Number.isInteger(r.segment) && r.segment > this.maxSegment) this.maxSegment = r.segment;
    if (typeof r.t === "number") {
      if (this.firstT === null || r.t < this.firstT) this.firstT = r.t;
      if (this.lastT === null || r.t > this.lastT) this.lastT = r.t;
    }
    switch (r.kind) {
      case "step": {
        if (!this.steps.has(seg)) this.steps.set(seg, new Map());
        this.steps.get(seg).set(r.step, r);
        if (r.step > this.maxStep) this.maxStep = r.step;
        break;
      }
      case "val": {
        const old = this.val.get(r.step);
        if (!old || (old.segment ?? 0) <= seg) this.val.set(r.step, r);
        break;
      }
      case "probe":
        if (!this.probe || newer(r, this.probe)) this.probe = r;
        break;
      case "sample":
        if (!this.sample || newer(r, this.sample)) this.sample = r;
        break;
      case "ckpt":
        this.ckpts.push(r);
        break;
      case "resume":
        this.resumes.push(r);
        this.resumes.sort((a, b) => (a.segment ?? 0) - (b.segment ?? 0));
        break;
      case "event":
        this.events.push(r);
        break;
      case "stage":
        if (typeof r.stage === "string") {
          const old = this.stages.get(r.stage);
          if (!old || (r.t ?? 0) >= (old.t ?? 0)) this.stages.set(r.stage, r);
        }
        break;
      case "run":
        if (!this.runRecord || (r.t ?? 0) >= (this.runRecord.t ?? 0)) this.runRecord = r;
        break;
      default:
        break;
    }
  }

  segments() {
    return [...this.steps.keys()].sort((a, b) => a - b);
  }

  /** The step records of the run's newest trace: for each step the newest segment's row. */
  latestStep() {
    let best = null;
    for (const rows of this.steps.values()) {
      for (const r of rows.values()) {
        if (!best || r.step > best.step || (r.step === best.step && r.segment > best.segment)) {
          best = r;
        }
      }
    }
    return best;
  }

  /** For every step, the row of the earliest segment that has it (the original trace). */
  originalByStep() {
    const out = new Map();
    for (const seg of this.segments()) {
      for (const [step, r] of this.steps.get(seg)) if (!out.has(step)) out.set(step, r);
    }
    return out;
  }

  /** Where the run trains: the host of its newest move (a lost host, crash mode "host"),
   * else the server's view (this machine, or a Ray node); null when unknown. */
  host() {
    for (let i = this.events.length - 1; i >= 0; i -= 1) {
      const h = this.events[i].host;
      if (h && typeof h.name === "string") return h;
    }
    return this.view.host || null;
  }

  /** One entry per restart: segment, from_step, the step the run had reached before,
   * whether it was a fresh start from step 0 rather than a resume, whether it refused
   * to start (no checkpoint, and it required one), and `kind`: "crash" (a crash test) or
   * "preempt" (a preemption, a session wall or a graceful stop: SIGTERM, not SIGKILL). */
  crashes() {
    if (this._crashes?.version === this.version) return this._crashes.value;
    const out = [];
    // A crash event of segment s means a restart as segment s + 1, even one that never
    // trained (it refused to start without a checkpoint); it also says where the kill landed.
    const crashEvents = new Map(this.events.filter(isRestartEvent).map((e) => [(e.segment ?? 0) + 1, e]));
    const segs = new Set([...this.segments(), ...this.resumes.map((r) => r.segment), ...crashEvents.keys()]);
    const ordered = [...segs].filter((s) => s > 0).sort((a, b) => a - b);
    for (const seg of ordered) {
      let reached = 0;
      for (const [s, rows] of this.steps) {
        if (s < seg) for (const step of rows.keys()) if (step > reached) reached = step;
      }
      const killedAt = crashEvents.get(seg)?.at_step;
      if (Number.isInteger(killedAt) && killedAt > reached) reached = killedAt;
      const rec = this.resumes.find((r) => r.segment === seg);
      let from = rec && Number.isInteger(rec.from_step) ? rec.from_step : null;
      if (from === null && this.steps.has(seg)) from = Math.min(...this.steps.get(seg).keys()) - 1;
      // A restart that found no checkpoint and trained from scratch: its resume record has
      // no checkpoint path (or no step), and the lab adds a started_over event.
      const fresh = Boolean(rec && (rec.from_step === null || rec.path === null))
        || this.events.some((e) => e.code === "started_over" && e.segment === seg);
      const refused = this.events.some((e) => e.code === "no_checkpoint" && e.segment === seg);
      const kind = crashEvents.has(seg) ? this.restartKind(crashEvents.get(seg)) : "crash";
      out.push({ segment: seg, reached, from, fresh, refused, kind, t: rec ? rec.t : crashEvents.get(seg)?.t ?? null });
    }
    this._crashes = { version: this.version, value: out };
    return out;
  }

  /** The steps this run's crash tests landed at (the last step recorded before each). */
  crashSteps() {
    return this.crashes().map((c) => c.reached);
  }

  bestVal() {
    let best = null;
    for (const r of this.val.values()) if (best === null || r.val_loss < best) best = r.val_loss;
    return best;
  }

  peakMem() {
    let peak = null;
    for (const rows of this.steps.values()) {
      for (const r of rows.values()) if (typeof r.mem_bytes === "number" && (peak === null || r.mem_bytes > peak)) peak = r.mem_bytes;
    }
    return peak;
  }
}

function newer(a, b) {
  const sa = a.step ?? 0;
  const sb = b.step ?? 0;
  return sa > sb || (sa === sb && (a.segment ?? 0) >= (b.segment ?? 0));
}

/** The whole pair: preset text, knob and the two runs in label order. `contract` is the
 * answer of GET /api/record-kinds. */
export class PairModel {
  constructor(view, contract) {
    this.id = view.pair;
    this.view = view;
    this.stepKeyed = stepKeyedKinds(contract);
    this.eventCodes = eventCodes(contract);
    // The crash modes by name (GET /api/record-kinds `crash_modes`): what the lesson's does.
    this.crashModes = new Map((contract?.crash_modes || []).map((m) => [m.name, m]));
    this.runs = new Map(view.runs.map((r) => [r.id, new RunModel(r, this.stepKeyed, this.eventCodes)]));
    this.checks = new Map(); // run id -> resume checks
    this.machine = null; // newest telemetry sample
    this.telemetry = []; // [t, power_now_w, energy_kwh_total] for the sparkline
  }

  ordered() {
    return [...this.runs.values()].sort((a, b) => a.label.localeCompare(b.label));
  }

  byLabel(label) {
    return this.ordered().find((r) => r.label === label) || null;
  }

  setView(view) {
    // A prediction, once made, is never unmade: a view fetched before it was saved (and
    // answered after) must not reopen the question.
    const prediction = view.prediction ?? this.view.prediction ?? null;
    this.view = { ...this.view, ...view, prediction };
    for (const rv of view.runs || []) {
      const run = this.runs.get(rv.id);
      if (run) run.setView(rv);
      else this.runs.set(rv.id, new RunModel(rv, this.stepKeyed, this.eventCodes));
    }
  }

  addTelemetry(sample) {
    if (!sample || typeof sample.t !== "number") return;
    if (this.machine && sample.t <= this.machine.t) return;
    this.machine = sample;
    this.telemetry.push([sample.t, sample.power_now_w ?? null, sample.energy_kwh_total ?? null,
      sample.gpu_util_pct ?? sample.cpu_pct ?? null]);
    const cutoff = sample.t - 300;
    while (this.telemetry.length && this.telemetry[0][0] < cutoff) this.telemetry.shift();
  }
}
