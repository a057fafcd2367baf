// The DOM pieces the instructor pages share: a query, an element builder and the status line.

export const $ = (sel) => document.querySelector(sel);

/** The page's #status line: `kind` is "info", "warn" or "error" (lab.css colours it). */
export function status(text, kind = "info") {
  const s = $("#status");
  s.textContent = text;
  s.dataset.kind = kind;
}

/** A new element with `props` set on it (className, type, href, …) and optional text. */
export function el(tag, props = {}, text) {
  const e = Object.assign(document.createElement(tag), props);
  if (text !== undefined) e.textContent = text;
  return e;
}
