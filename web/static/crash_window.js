// The window in which a lesson wants its Crash test, and what the control bar says about
// it: "crash after step 250: now" while the run is inside it, "missed — run it again or
// lengthen it" once the run is past it without a crash.
//
// The window is read from the lesson's own "What to watch" text, which every built-in
// lesson writes as "… between step 250 and step 500 …" or "… after step 150 …"; a lesson
// that names no step has no window (any moment of training will do) and shows none.

import * as f from "./format.js";

const STEP = String.raw`step\s+(\d[\d,]*)`;
const BETWEEN = new RegExp(String.raw`between\s+${STEP}\s+and\s+(?:step\s+)?(\d[\d,]*)`, "i");
const AFTER = new RegExp(String.raw`after\s+${STEP}`, "i");

const num = (s) => Number.parseInt(s.replace(/,/g, ""), 10);

/** {from, to, open} (steps, inclusive) of the lesson's crash window for run `label`, or
 * null when its text names none. "… A after step 120 and B after step 250" gives each run
 * its own; "after step N" lasts until the run's end, `steps` (open). */
export function crashWindow(whatToWatch, steps, label = "") {
  let text = whatToWatch || "";
  const own = label && new RegExp(String.raw`\b${label}\s+((?:after|between)\s+step\s+[^.;]*)`).exec(text);
  if (own) text = own[1];
  const between = BETWEEN.exec(text);
  if (between) return { from: num(between[1]), to: num(between[2]) };
  const after = AFTER.exec(text);
  if (after) return { from: num(after[1]), to: f.isNum(steps) ? steps : Infinity, open: true };
  return null;
}

/** [text, kind] for the control bar: kind is "wait" | "now" | "hit" | "missed" | "early",
 * or null without a window. `step` is where the run is, `crashSteps` the steps its crash
 * tests landed at, `live` whether it still trains (a finished run can no longer be hit). */
export function windowText(win, step, crashSteps, live) {
  if (!win) return [null, null];
  const { from, to } = win;
  const until = win.open ? "" : ` (until step ${f.int(to)})`;
  const hit = crashSteps.find((s) => s >= from && s <= to);
  if (hit !== undefined) return [`crash test at step ${f.int(hit)}: inside the lesson's window ✓`, "hit"];
  const at = f.isNum(step) ? step : 0;
  if (!live || at > to) return ["missed the crash window — run it again or lengthen it (steps)", "missed"];
  const early = crashSteps.filter((s) => s < from);
  const again = early.length ? `crashed at step ${f.int(early[early.length - 1])}, before the window; ` : "";
  if (at >= from) return [`${again}crash after step ${f.int(from)}: now${until}`, "now"];
  return [`${again}crash after step ${f.int(from)}: in ${f.int(from - at)} steps${until}`, early.length ? "early" : "wait"];
}
