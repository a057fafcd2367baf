// "Warming up" beside the Start button while the lab's warm trainer process is still
// importing torch (GET /api/health `warm_trainers`, workers/warm.py): a Start meanwhile
// waits for those imports, a few seconds on a small machine; afterwards a start is a fork.

import { api } from "./api.js";

const POLL_MS = 1000;

/** The note to show for a health answer, or null once trainers start warm (or never will). */
export function warmUpNote(health) {
  if (!health || health.warm_trainers !== "warming") return null;
  return "Warming up: the lab is still loading torch, so a start now takes a few seconds longer.";
}

/** Show the note in `el` while the lab warms up; ask again every `pollMs` until it is done. */
export async function followWarmUp(el, pollMs = POLL_MS) {
  for (;;) {
    let note = null;
    try {
      note = warmUpNote(await api.health());
    } catch {
      note = null; // no answer: say nothing rather than something stale
    }
    el.textContent = note || "";
    el.hidden = !note;
    if (!note) return;
    await new Promise((resolve) => setTimeout(resolve, pollMs));
  }
}
