// The window in which a lesson wants its Crash test, and what the control bar says about
// it, naming its steps: "crash window, steps 100–600: opens in 14 steps",
// "crash window, steps 100–600: crash now", "crash test at step 150:
// inside the lesson's window, steps 100–600 ✓", "missed … — run it again or lengthen it".
//
// The window is the preset's `[crash] window` (trainer/crash_window.py), served with the
// preset as `crash.window`: {A: [from, to], B: [from, to]}, steps inclusive, `to` null for
// the run's end. A lesson without one has no window (any moment of training will do) and
// shows none. The "what to watch" text is for people: nothing here reads it.

import * as f from "./format.js";

/** {from, to, open} (steps, inclusive) of the lesson's crash window for run `label`, or
 * null when the preset has none. A window open to the run's end lasts until `steps`. */
export function crashWindow(preset, steps, label) {
  const win = preset?.crash?.window?.[label];
  if (!Array.isArray(win) || !f.isNum(win[0])) return null;
  if (f.isNum(win[1])) return { from: win[0], to: win[1], open: false };
  return { from: win[0], to: f.isNum(steps) ? steps : Infinity, open: true };
}

/** "steps 100–600" (or "from step 100" while the run's end is unknown). */
export function windowSteps(win) {
  return Number.isFinite(win.to) ? `steps ${f.int(win.from)}–${f.int(win.to)}` : `from step ${f.int(win.from)}`;
}

/** [text, kind] for the control bar: kind is "wait" | "now" | "hit" | "missed" | "early",
 * or null without a window. `step` is where the run is, `crashSteps` the steps its crash
 * tests landed at, `live` whether it still trains (a finished run can no longer be hit). */
export function windowText(win, step, crashSteps, live) {
  if (!win) return [null, null];
  const { from, to } = win;
  const steps = windowSteps(win);
  const hit = crashSteps.find((s) => s >= from && s <= to);
  if (hit !== undefined) return [`crash test at step ${f.int(hit)}: inside the lesson's window, ${steps} ✓`, "hit"];
  const at = f.isNum(step) ? step : 0;
  if (!live || at > to) return [`missed the lesson's crash window, ${steps} — run it again or lengthen it (steps)`, "missed"];
  const early = crashSteps.filter((s) => s < from);
  const again = early.length ? `crashed at step ${f.int(early[early.length - 1])}, before the window; ` : "";
  if (at >= from) return [`${again}crash window, ${steps}: crash now`, "now"];
  const left = from - at;
  return [`${again}crash window, ${steps}: opens in ${f.int(left)} step${left === 1 ? "" : "s"}`, early.length ? "early" : "wait"];
}
