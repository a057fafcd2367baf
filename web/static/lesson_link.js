// A lesson's shareable link (/lesson/ID?steps=600&knob.a=50) with its Copy button, and the
// settings a student may change before starting. Locked settings are shown disabled; the
// server refuses them anyway (403), so this page only saves a round trip.

const $ = (sel) => document.querySelector(sel);
const enc = encodeURIComponent;

/** The preset id of a /lesson/ID path, else null. */
export function lessonFromPath(pathname) {
  const m = /^\/lesson\/([^/]+)\/?$/.exec(pathname);
  return m ? decodeURIComponent(m[1]) : null;
}

/** The shareable URL of a lesson with (unlocked) settings as query parameters. */
export function shareUrl(origin, id, overrides = {}) {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(overrides)) {
    if (name === "knob" && value && typeof value === "object") {
      for (const side of ["a", "b"]) if (side in value) q.set(`knob.${side}`, String(value[side]));
    } else q.set(name, String(value));
  }
  const query = q.toString();
  return `${origin}/lesson/${enc(id)}${query ? `?${query}` : ""}`;
}

/** A typed value as the server reads a query parameter: JSON numbers/booleans, else text. */
export function parseValue(text) {
  const t = text.trim();
  try {
    const v = JSON.parse(t);
    if (v !== null && typeof v !== "object") return v;
  } catch {
    // not JSON: text
  }
  return t;
}

function el(tag, props = {}, text) {
  const e = Object.assign(document.createElement(tag), props);
  if (text !== undefined) e.textContent = text;
  return e;
}

const SVG = "http://www.w3.org/2000/svg";

/** A padlock drawn inline (a font may lack the 🔒 glyph and show an empty box). */
export function lockIcon() {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 16 16");
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("focusable", "false");
  svg.classList.add("lock-icon");
  const body = document.createElementNS(SVG, "rect");
  for (const [k, v] of Object.entries({ x: 2.5, y: 7, width: 11, height: 8, rx: 1.5, fill: "currentColor" })) body.setAttribute(k, v);
  const shackle = document.createElementNS(SVG, "path");
  for (const [k, v] of Object.entries({ d: "M5 7V5a3 3 0 0 1 6 0v2", fill: "none", stroke: "currentColor", "stroke-width": 1.8 })) shackle.setAttribute(k, v);
  svg.append(shackle, body);
  return svg;
}

/** The settings form inside the start form (#lesson-settings). */
export class LessonSettings {
  constructor(fieldset) {
    this.root = fieldset;
    this.inputs = []; // [name, side|null, input, initial]
    this.preset = null;
    this.onchange = () => {};
  }

  show(preset, open = false) {
    this.preset = preset;
    this.base = preset.overrides || {}; // a link's settings, already applied to `preset`
    this.inputs = [];
    const list = this.root.querySelector(".settings-list");
    list.replaceChildren();
    const adjustable = new Set(preset.student_adjustable || []);
    const locked = new Set(preset.locked || []);
    const knob = preset.knob || {};
    const rows = [];
    // The knob first: its two values, editable only when "knob" is unlocked.
    rows.push(this.row("knob", knob.name ? `${knob.name} (the knob)` : "knob", [["a", knob.a], ["b", knob.b]], !adjustable.has("knob")));
    const names = [...adjustable].filter((n) => n !== "knob" && n !== knob.name).sort();
    for (const name of names) rows.push(this.row(name, name, [[null, preset.run?.[name]]], false));
    list.append(...rows);
    const lockedOthers = [...locked].filter((n) => n !== "knob").sort();
    if (lockedOthers.length) {
      list.append(el("p", { className: "locked-list muted" }, `Locked by the instructor: ${lockedOthers.join(", ")}.`));
    }
    this.root.hidden = false;
    this.root.open = open;
  }

  row(name, label, fields, locked) {
    const div = el("div", { className: `setting${locked ? " locked" : ""}` });
    div.dataset.setting = name;
    const id = `set-${name}`;
    div.append(el("label", { htmlFor: `${id}-${fields[0][0] || "v"}` }, label));
    for (const [side, value] of fields) {
      const input = el("input", {
        id: `${id}-${side || "v"}`,
        name: side ? `${name}.${side}` : name,
        value: value === undefined || value === null ? "" : String(value),
        placeholder: value === undefined ? "default" : "",
        disabled: locked,
        size: 8,
      });
      input.setAttribute("aria-label", side ? `${label}, run ${side.toUpperCase()}` : label);
      input.addEventListener("input", () => this.onchange());
      if (side) div.append(el("span", { className: "side" }, side.toUpperCase()));
      div.append(input);
      this.inputs.push([name, side, input, input.value]);
    }
    if (locked) {
      const lock = el("span", { className: "lock", title: "locked by the instructor" });
      lock.append(lockIcon(), "locked");
      div.append(lock);
    }
    return div;
  }

  /** The link's settings and what the student changed: {"steps": 600, "knob": {"a": 50}}. */
  overrides() {
    const out = JSON.parse(JSON.stringify(this.base || {}));
    for (const [name, side, input, initial] of this.inputs) {
      if (input.disabled || input.value.trim() === initial.trim() || input.value.trim() === "") continue;
      const value = parseValue(input.value);
      if (side) (out[name] ||= {})[side] = value;
      else out[name] = value;
    }
    return out;
  }

  hide() {
    this.root.hidden = true;
  }
}

/** The "Link to this lesson" line with its Copy button (#share). */
export class ShareLink {
  constructor() {
    this.root = $("#share");
    this.input = $("#lesson-link");
    this.note = $("#copy-status");
    $("#copy-link").addEventListener("click", () => this.copy());
  }

  show(id, overrides = {}) {
    this.input.value = shareUrl(location.origin, id, overrides);
    this.root.hidden = false;
    this.note.textContent = "";
  }

  async copy() {
    this.input.select();
    try {
      await navigator.clipboard.writeText(this.input.value);
      this.note.textContent = "Copied.";
    } catch {
      // No clipboard permission (an insecure origin, a strict browser): the text is selected.
      const ok = document.execCommand && document.execCommand("copy");
      this.note.textContent = ok ? "Copied." : "Selected: press Ctrl+C to copy.";
    }
  }
}
