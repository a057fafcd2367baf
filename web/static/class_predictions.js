// The class view's "Predictions against outcomes": per lesson, what the class predicted
// before its first crash test and what was measured (GET /api/instructor/class/predictions).
// A choice: a row per choice, how many predicted it and how many runs did it (small bars).
// A number: a row per prediction, each run's guess beside its measured steps.

import { el } from "./dom.js";
import { answerText, resultText } from "./predict.js";

function bar(n, max, cls) {
  const td = el("td", { className: `bar ${cls}` });
  const span = el("span");
  span.style.width = `${max ? Math.round((60 * n) / max) : 0}px`;
  span.setAttribute("aria-hidden", "true");
  td.append(span, String(n));
  return td;
}

function choiceTable(lesson) {
  const q = lesson.predict;
  const table = el("table", { className: "class-table predictions-table" });
  const head = el("tr");
  for (const h of ["run", "answer", "predicted", "happened"]) head.append(el("th", { scope: "col" }, h));
  table.append(el("thead"));
  table.tHead.append(head);
  const body = el("tbody");
  for (const run of q.runs) {
    const predicted = new Map();
    const happened = new Map();
    for (const p of lesson.predictions) {
      const a = p.answers?.[run];
      const o = p.outcome?.[run];
      if (a != null) predicted.set(a, (predicted.get(a) || 0) + 1);
      if (o != null) happened.set(o, (happened.get(o) || 0) + 1);
    }
    const max = Math.max(1, ...predicted.values(), ...happened.values());
    for (const c of q.choices) {
      const tr = el("tr", { className: `run-${run}` });
      tr.dataset.run = run;
      tr.dataset.choice = c.value;
      tr.append(el("th", { scope: "row" }, `Run ${run}`), el("td", {}, c.text),
        bar(predicted.get(c.value) || 0, max, "predicted"), bar(happened.get(c.value) || 0, max, "outcome"));
      body.append(tr);
    }
  }
  table.append(body);
  return table;
}

function numberTable(lesson) {
  const q = lesson.predict;
  const table = el("table", { className: "class-table predictions-table" });
  const head = el("tr");
  head.append(el("th", { scope: "col" }, "prediction"));
  for (const run of q.runs) head.append(el("th", { scope: "col" }, `Run ${run}: predicted → measured`));
  table.append(el("thead"));
  table.tHead.append(head);
  const body = el("tbody");
  lesson.predictions.forEach((p, i) => {
    const tr = el("tr");
    tr.dataset.pair = p.pair;
    tr.append(el("th", { scope: "row" }, `#${i + 1}`));
    for (const run of q.runs) {
      // The server's reading, as the student's page shows it: measured and judged by the
      // lesson's one rule, waiting, or no outcome (the runs ended without a crash test).
      const r = p.results?.[run] || { status: p.outcome?.[run] == null ? "waiting" : "measured", outcome: p.outcome?.[run], right: null };
      const [measured] = resultText(q, r, null);
      const then = r.status === "measured" ? measured : r.status === "none" ? "no crash test" : "not yet";
      const td = el("td", { className: `run-${run}` },
        `${answerText(q, p.answers?.[run])} → ${then}${r.right === true ? " ✓" : r.right === false ? " ✗" : ""}`);
      td.dataset.run = run;
      td.dataset.status = r.status;
      tr.append(td);
    }
    body.append(tr);
  });
  table.append(body);
  return table;
}

/** Render the lessons' predictions into `root` (a section with a .predictions-list). */
export function renderClassPredictions(root, lessons) {
  const list = root.querySelector(".predictions-list");
  if (!lessons.length) {
    list.replaceChildren(el("p", { className: "muted" }, "No predictions yet: students answer before their first crash test."));
    return;
  }
  list.replaceChildren(...lessons.map((lesson) => {
    const box = el("div", { className: "lesson-predictions" });
    box.dataset.preset = lesson.preset_id;
    const n = lesson.predictions.length;
    box.append(el("h3", {}, `${lesson.number} · ${lesson.title}`),
      el("p", { className: "explain" }, `“${lesson.predict.question}” · ${n} prediction${n === 1 ? "" : "s"}`
        + (lesson.skipped ? `, ${lesson.skipped} skipped` : "")));
    box.append(lesson.predict.kind === "choice" ? choiceTable(lesson) : numberTable(lesson));
    if (lesson.predict.rule) box.append(el("p", { className: "predict-rule muted" }, `How it is judged: ${lesson.predict.rule}.`));
    return box;
  }));
}
