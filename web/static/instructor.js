// The instructor's presets page: log in with the token, then create, edit (checked by the
// server as you type), duplicate, lock and publish lesson presets.

import { request } from "./api.js";
import { $, el, status } from "./dom.js";

const enc = encodeURIComponent;
const VALIDATE_DELAY_MS = 400; // a check once typing pauses, not one per keystroke

const NEW_PRESET = `# A new lesson: two runs that differ in the knob alone.
id = "new-lesson"
number = "9.1"
chapter = "Checkpointing"
title = "New lesson"
question = "What does a crash cost?"
whats_happening = "Two tiny GPTs learn the built-in corpus; they differ only in how often they checkpoint."
what_to_watch = "Press Crash test on both runs and compare the work each one loses."
published = false

[run]
n_layer = 2
d_model = 64
n_head = 4
ctx = 64
batch = 8
steps = 300
warmup = 20
threads = 1

[knob]
name = "ckpt_every"
a = 50
b = 150

# Asked before the first crash test, shown beside what was measured afterwards.
# measure: lost_steps (a number) | resume (identical, different, fresh, refused) | bit_identical (yes, no)
[predict]
question = "How many steps will each run lose to your crash test?"
measure = "lost_steps"
runs = ["A", "B"]
answer_after_outcome = true   # false: students may open the answer before the outcome
`;

const state = {
  presets: [],
  lockable: [],
  lockGroups: [], // [{section, names}]: the config's sections, the knob first
  alwaysLocked: [],
  current: null, // the preset open in the editor (null: a new one, not saved yet)
  validated: false,
  timer: null,
  seq: 0,
};

// ---- logging in ---------------------------------------------------------------------

async function checkLogin() {
  const me = await request("GET", "/api/instructor/me");
  if (!me.enabled) {
    document.body.dataset.auth = "off";
    $("#login-error").textContent = "Instructor mode is off on this server: start it with python3 quickstart.py lab --instructor (or with CRASHDRILL_INSTRUCTOR_TOKEN set).";
    $("#login-form").hidden = true;
    return false;
  }
  document.body.dataset.auth = me.instructor ? "in" : "out";
  return me.instructor;
}

/** The token of a login link (/instructor#token=…, printed by `quickstart.py lab
 * --instructor`), taken out of the address bar at once; null without one. A fragment never
 * reaches the server, so the token is in no request line and no log. */
function tokenFromLink() {
  const token = new URLSearchParams(location.hash.slice(1)).get("token");
  if (token !== null) history.replaceState(null, "", location.pathname + location.search);
  return token;
}

async function login(ev) {
  ev?.preventDefault();
  $("#login-error").textContent = "";
  try {
    await request("POST", "/api/instructor/login", { token: $("#token").value });
  } catch (e) {
    $("#login-error").textContent = e.message;
    return;
  }
  $("#token").value = "";
  // The list first, then the page that shows it: its buttons appear with their rows.
  try {
    await loadPresets();
  } finally {
    document.body.dataset.auth = "in";
  }
}

// ---- the list -----------------------------------------------------------------------

async function loadPresets() {
  const data = await request("GET", "/api/instructor/presets");
  state.presets = data.presets;
  state.lockable = data.lockable;
  state.lockGroups = data.lock_groups || [{ section: "settings", names: data.lockable }];
  state.alwaysLocked = data.always_locked;
  const rows = state.presets.map((p) => {
    const tr = el("tr");
    tr.dataset.preset = p.id;
    tr.append(el("td", {}, `${p.number} · ${p.title}`), el("td", { className: "mono" }, p.id));
    tr.append(el("td", {}, p.origin === "builtin" ? "built-in" : "yours"));
    tr.append(el("td", { className: p.published ? "published" : "unpublished" }, p.published ? "published" : "hidden"));
    const actions = el("td", { className: "row-actions" });
    const open = el("button", { type: "button", className: "open" }, p.editable ? "Edit" : "View");
    open.addEventListener("click", () => openPreset(p.id));
    const dup = el("button", { type: "button", className: "dup" }, "Duplicate");
    dup.addEventListener("click", () => duplicate(p.id));
    actions.append(open, dup);
    tr.append(actions);
    return tr;
  });
  // A list that arrives (or grows) while the editor is open pushes the editor down: keep
  // it where the instructor is typing (New preset can be pressed before the list loads).
  const editing = document.activeElement === $("#preset-text");
  $("#preset-rows").replaceChildren(...rows);
  if (editing) revealEditor();
}

// ---- the editor ---------------------------------------------------------------------

function showEditor(preset, text) {
  state.current = preset;
  const editable = !preset || preset.editable;
  $("#editor").hidden = false;
  $("#editor-h").textContent = preset ? `Preset ${preset.id}` : "New preset";
  $("#editor-note").textContent = !preset ? "Write the lesson as TOML; it is checked as you type. Save creates it, unpublished."
    : editable ? "Your preset: edit, save, lock settings, publish."
      : "A built-in preset is read-only: duplicate it to change it.";
  const area = $("#preset-text");
  area.value = text;
  area.readOnly = !editable;
  $("#save").hidden = !editable;
  $("#publish").hidden = !preset || !editable;
  $("#publish").textContent = preset?.published ? "Unpublish" : "Publish";
  $("#duplicate").hidden = !preset;
  const link = $("#open-lesson");
  link.hidden = !preset;
  if (preset) link.href = `/lesson/${enc(preset.id)}`;
  renderLocks(preset, editable);
  validateSoon(0);
}

function renderLocks(preset, editable) {
  $("#locks").hidden = !preset;
  if (!preset) return;
  const locked = new Set(preset.locked);
  const always = new Set(state.alwaysLocked);
  // One group per config section, each with "lock all" (ticks or clears the group's boxes
  // that may change; the server's always-locked ones stay ticked).
  const boxes = state.lockGroups.map((group) => {
    const box = el("fieldset", { className: "lock-group" });
    box.dataset.section = group.section;
    const all = el("input", { type: "checkbox", className: "lock-all", disabled: !editable });
    const legend = el("legend");
    const allLabel = el("label", { className: "lock-all-label" });
    allLabel.append(all, document.createTextNode(` ${group.section}: lock all`));
    legend.append(allLabel);
    box.append(legend);
    const items = group.names.map((name) => {
      const label = el("label", { className: "lock-box" });
      const input = el("input", { type: "checkbox", name, checked: locked.has(name) || always.has(name), disabled: !editable || always.has(name) });
      input.dataset.setting = name;
      label.append(input, document.createTextNode(` ${name}`));
      if (name === "knob") label.classList.add("lock-knob");
      return label;
    });
    const inputs = items.map((l) => l.querySelector("input"));
    const sync = () => {
      all.checked = inputs.every((i) => i.checked);
      all.indeterminate = !all.checked && inputs.some((i) => i.checked);
    };
    all.addEventListener("change", () => {
      for (const i of inputs) if (!i.disabled) i.checked = all.checked;
      sync();
    });
    for (const i of inputs) i.addEventListener("change", sync);
    box.append(...items);
    sync();
    return box;
  });
  $("#lock-boxes").replaceChildren(...boxes);
  $("#save-locks").hidden = !editable;
}

/** The editor sits below the list: bring it into view and put the cursor in the text,
 * so that New preset, Edit and Duplicate visibly open it. */
function revealEditor() {
  $("#editor").scrollIntoView({ block: "start", behavior: "instant" });
  $("#preset-text").focus({ preventScroll: true });
}

async function openPreset(id) {
  try {
    const p = await request("GET", `/api/instructor/presets/${enc(id)}`);
    showEditor(p, p.text);
    revealEditor();
    status("");
  } catch (e) {
    status(`Could not open ${id}: ${e.message}`, "error");
  }
}

function validateSoon(delay = VALIDATE_DELAY_MS) {
  clearTimeout(state.timer);
  state.seq++; // an answer still in flight is about text that has changed since
  state.validated = false;
  $("#save").disabled = true;
  state.timer = setTimeout(validate, delay);
}

async function validate() {
  const seq = ++state.seq;
  const out = $("#validation");
  let result;
  try {
    result = await request("POST", "/api/instructor/presets/validate", { text: $("#preset-text").value });
  } catch (e) {
    if (seq !== state.seq) return;
    $("#save").disabled = true;
    out.dataset.state = "error";
    out.textContent = e.status === 422 ? e.message : `Could not check it: ${e.message}`;
    return;
  }
  if (seq !== state.seq) return; // an older answer after a newer keystroke
  if (result.ok === false) {
    // The problems come in a 200 answer: no failed request in the console per keystroke.
    $("#save").disabled = true;
    out.dataset.state = "error";
    out.textContent = result.detail;
    return;
  }
  out.dataset.state = "ok";
  out.textContent = `✓ Valid: ${result.id} · ${result.knob_text} · `
    + (result.predict ? `asks first: “${result.predict}”` : "asks no prediction (add a [predict] table)");
  state.validated = true;
  $("#save").disabled = false;
}

async function save() {
  const text = $("#preset-text").value;
  try {
    const p = state.current
      ? await request("PUT", `/api/instructor/presets/${enc(state.current.id)}`, { text })
      : await request("POST", "/api/instructor/presets", { text });
    status(`Saved ${p.id}${p.published ? "" : " (not published yet)"}.`);
    showEditor(p, p.text);
    await loadPresets();
  } catch (e) {
    $("#validation").dataset.state = "error";
    $("#validation").textContent = e.message;
    status(`Not saved: ${e.message}`, "error");
  }
}

async function duplicate(id) {
  try {
    const p = await request("POST", `/api/instructor/presets/${enc(id)}/duplicate`, {});
    status(`Duplicated ${id} as ${p.id} (not published).`);
    await loadPresets();
    showEditor(p, p.text);
    revealEditor();
  } catch (e) {
    status(`Could not duplicate ${id}: ${e.message}`, "error");
  }
}

async function togglePublish() {
  const p = state.current;
  if (!p) return;
  try {
    const q = await request("PUT", `/api/instructor/presets/${enc(p.id)}/published`, { published: !p.published });
    status(q.published ? `Published ${q.id}: students see it at /lesson/${q.id}.` : `${q.id} is hidden from students.`);
    showEditor(q, q.text);
    await loadPresets();
  } catch (e) {
    status(`Could not change ${p.id}: ${e.message}`, "error");
  }
}

async function saveLocks() {
  const p = state.current;
  if (!p) return;
  const always = new Set(state.alwaysLocked);
  const locked = [...document.querySelectorAll("#lock-boxes input[data-setting]:checked")]
    .map((b) => b.dataset.setting).filter((n) => !always.has(n));
  try {
    const q = await request("PUT", `/api/instructor/presets/${enc(p.id)}/locked`, { locked });
    status(`Locked for students in ${q.id}: ${q.locked.join(", ") || "nothing"}.`);
    showEditor(q, q.text);
    await loadPresets();
  } catch (e) {
    status(`Could not save the locks: ${e.message}`, "error");
  }
}

async function boot() {
  $("#login-form").addEventListener("submit", login);
  $("#logout").addEventListener("click", async () => {
    await request("POST", "/api/instructor/logout");
    location.reload();
  });
  $("#new-preset").addEventListener("click", () => {
    showEditor(null, NEW_PRESET);
    revealEditor();
  });
  $("#preset-text").addEventListener("input", () => validateSoon());
  $("#save").addEventListener("click", save);
  $("#duplicate").addEventListener("click", () => state.current && duplicate(state.current.id));
  $("#publish").addEventListener("click", togglePublish);
  $("#save-locks").addEventListener("click", saveLocks);
  const linked = tokenFromLink();
  try {
    if (await checkLogin()) await loadPresets();
    else if (linked && document.body.dataset.auth === "out") {
      $("#token").value = linked;
      await login();
    }
  } catch (e) {
    status(`Could not reach the server: ${e.message}`, "error");
  }
  document.body.dataset.loaded = "true";
}

boot();
