// The event log ("What happened"): both runs' events, newest first. What a lesson is about
// stands out (codes the contract weighs "key", and every warning or error); routine lines
// (checkpoints, evaluations) are muted, a checkpoint's copy to the mirror joins its
// checkpoint's line instead of adding one, and "routine lines" hides them all. Everything
// is read from an event's code and fields, never from its sentence.

import * as f from "./format.js";

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

/** "key" | "routine" | "info" for one event record: its code's weight in the contract; a
 * warning or an error stands out whatever its code. An event with no code (a record from
 * before the codes) is a plain line. */
export function eventKind(e, codes) {
  if (e.level === "warn" || e.level === "error") return "key";
  return codes.get(e.code)?.weight || "info";
}

/** A blind launcher's lost rank (rank_lost_waiting) as a countdown: the seconds until the
 * survivors' collective times out (its `deadline`, Unix seconds, against `now`), or how long
 * they waited once the run's collective_timed_out event of that segment is in. */
export function waitNote(e, events, now) {
  const over = events.find((x) => x.code === "collective_timed_out" && (x.segment ?? 0) === (e.segment ?? 0));
  if (over) return f.isNum(over.waited_s) ? `the collective timed out after ${over.waited_s.toFixed(1)} s` : "the collective timed out";
  if (!f.isNum(e.deadline)) return "";
  const left = Math.ceil(e.deadline - now);
  return left > 0 ? `the survivors' collective times out in ${left} s` : "the survivors' collective is timing out now";
}

/** What changes while a countdown runs (the page redraws the log when it does). */
export function countdownKey(pair, now = Date.now() / 1000) {
  return eventRows(pair, now)
    .filter(([, e]) => e.code === "rank_lost_waiting")
    .map(([, , , note]) => note)
    .join("|");
}

/** Both runs' events as display rows, newest first: [label, event, kind, note], where a
 * checkpoint's mirror copy is folded into the note of that checkpoint's row (matched by
 * segment and `step`, the fields both events carry) and a blind launcher's lost rank
 * counts down to its survivors' collective timeout (`waitNote`, at `now`). */
export function eventRows(pair, now = Date.now() / 1000) {
  const codes = pair.eventCodes || new Map();
  const rows = [];
  for (const r of pair.ordered()) {
    const ckpt = new Map(); // "segment:step" -> row of the checkpoint event
    const mirrors = [];
    for (const e of r.events) {
      const row = [r.label, e, eventKind(e, codes), ""];
      if (e.code === "rank_lost_waiting") row[3] = waitNote(e, r.events, now);
      if (e.code === "mirror" && Number.isInteger(e.step)) {
        mirrors.push(row);
        continue;
      }
      if (e.code === "checkpoint" && Number.isInteger(e.step)) ckpt.set(`${e.segment ?? 0}:${e.step}`, row);
      rows.push(row);
    }
    for (const row of mirrors) {
      const e = row[1];
      const target = ckpt.get(`${e.segment ?? 0}:${e.step}`);
      if (!target) {
        rows.push(row);
        continue;
      }
      const secs = f.isNum(e.seconds) ? ` in ${mirrorSeconds(e.seconds)}` : "";
      target[3] = `copied to the mirror${secs}, in the background`;
    }
  }
  rows.sort((a, b) => (b[1].t ?? 0) - (a[1].t ?? 0) || (b[1].id ?? 0) - (a[1].id ?? 0));
  return rows;
}

/** An upload's seconds as its event's sentence says them: 0.02s, 1.4s. */
function mirrorSeconds(s) {
  return s >= 0.95 ? `${s.toFixed(1)}s` : `${s.toFixed(2)}s`;
}

/** Draw the log into #events; returns the number of events it holds (a cheap change check). */
export function renderEvents(pair) {
  const list = document.querySelector("#events");
  const rows = eventRows(pair);
  list.replaceChildren();
  let n = 0;
  for (const [label, e, kind, note] of rows) {
    n += 1 + (note ? 1 : 0);
    const li = el("li", `event level-${e.level || "info"} run-${label} event-${kind}`);
    if (e.code) li.dataset.code = e.code;
    const time = el("time", "", f.clock(e.t));
    if (f.isNum(e.t)) time.dateTime = new Date(e.t * 1000).toISOString();
    li.append(time, el("span", "event-run", label));
    if (e.level === "warn" || e.level === "error") li.append(el("span", "event-level", e.level === "error" ? "error" : "warning"));
    const text = el("span", "event-text", e.text || "");
    if (note) text.append(el("span", "event-note", ` · ${note}`));
    li.append(text);
    list.append(li);
  }
  if (!rows.length) list.append(el("li", "muted", "Nothing yet."));
  return n;
}
