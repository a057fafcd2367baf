// What the owner of an open pair can do besides crashing it (issue #23): pick another
// lesson (its start view opens; this pair trains on) and stop both runs for good, which
// frees the browser's quota (POST /api/pairs/{pair}/stop).

import { api } from "./api.js";
import { pickerText } from "./lesson.js";

const $ = (sel) => document.querySelector(sel);
let presets = null; // the lessons a student may start, in course order

/** The lesson picker of the pair view, `current` selected. */
export async function showLessonPicker(current) {
  const select = $("#switch-lesson");
  try {
    presets ||= await api.presets();
  } catch {
    return; // no picker: the page works without it
  }
  select.replaceChildren(...presets.map((p) => new Option(pickerText(p), p.id)));
  if (current && !presets.some((p) => p.id === current)) select.prepend(new Option(current, current));
  select.value = current || "";
  $("#switch-form").hidden = false;
  select.onchange = () => {
    if (select.value && select.value !== current) location.href = `/?new=1&preset=${encodeURIComponent(select.value)}`;
  };
}

/** Stop both runs of `pair`; `status(text, kind)` says how it went. */
export async function stopPair(pair, status) {
  if (!pair) return;
  const button = $("#stop-pair");
  button.disabled = true;
  status("Stopping both runs…");
  try {
    await api.stopPair(pair.id);
    status("Stopped: both runs end now, and you may start another lesson.");
  } catch (e) {
    status(`Could not stop the runs: ${e.message}`, "error");
  } finally {
    button.disabled = false;
  }
}
