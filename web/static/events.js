// The event log ("What happened"): both runs' events, newest first. What a lesson is about
// stands out (crash, resume, fresh start, refusal, failure, warnings); routine lines
// (checkpoints, evaluations) are muted, a checkpoint's copy to the mirror joins its
// checkpoint's line instead of adding one, and "routine lines" hides them all.

import * as f from "./format.js";

/** Event codes that tell the lesson's story (trainer, supervisor and lab events). */
const KEY_CODES = new Set([
  "crash", "killed", "resumed", "started_over", "fresh_start", "no_checkpoint", "ckpt_corrupt",
  "lost", "failed", "stopped", "finished", "diverged",
]);
const CHECKPOINT = /^Checkpoint at step (\d+)\b/;
const EVAL = /^Step \d+: val /;
const MIRROR_SECONDS = /\bin ([\d.]+ ?s)\b/;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

/** "key" | "routine" | "info" for one event record. */
export function eventKind(e) {
  if (KEY_CODES.has(e.code) || e.level === "warn" || e.level === "error") return "key";
  const text = e.text || "";
  if (e.code === "mirror" || CHECKPOINT.test(text) || EVAL.test(text)) return "routine";
  return "info";
}

/** Both runs' events as display rows, newest first: [label, event, kind, note], where a
 * checkpoint's mirror copy is folded into the note of that checkpoint's row. */
export function eventRows(pair) {
  const rows = [];
  for (const r of pair.ordered()) {
    const ckpt = new Map(); // "segment:step" -> row of "Checkpoint at step N"
    const mirrors = [];
    for (const e of r.events) {
      const m = CHECKPOINT.exec(e.text || "");
      const row = [r.label, e, eventKind(e), ""];
      if (e.code === "mirror" && Number.isInteger(e.step)) {
        mirrors.push(row);
        continue;
      }
      if (m) ckpt.set(`${e.segment ?? 0}:${m[1]}`, row);
      rows.push(row);
    }
    for (const row of mirrors) {
      const e = row[1];
      const target = ckpt.get(`${e.segment ?? 0}:${e.step}`);
      if (!target) {
        rows.push(row);
        continue;
      }
      const secs = MIRROR_SECONDS.exec(e.text || "");
      target[3] = `copied to the mirror${secs ? ` in ${secs[1]}` : ""}, in the background`;
    }
  }
  rows.sort((a, b) => (b[1].t ?? 0) - (a[1].t ?? 0) || (b[1].id ?? 0) - (a[1].id ?? 0));
  return rows;
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
