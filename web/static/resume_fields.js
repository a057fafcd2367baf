// The resume check's fields, compactly: every deterministic field a run records (loss,
// lr, grad norm, tokens, val loss and its train mean, each probe, the sample), each
// compared by its exact value. The server sends them as `fields` and `differing` in each
// check (docs/run-contract.md, "The resume check, field by field").

import * as f from "./format.js";

const LOSS = "step.loss";
const RANK_LOSS = "step.rank_loss_bits."; // a run of several ranks: each rank's own loss
const WORDS = {
  "step.loss": "loss",
  "step.lr": "learning rate",
  "step.grad_norm": "grad norm",
  "step.tokens": "tokens seen",
  "val.val_loss": "val loss",
  "val.train_loss": "train loss of the eval",
  "sample.prompt": "sample prompt",
  "sample.text": "sample text",
};

/** A field's name for people: "val.train_loss" -> "train loss of the eval",
 * "probe.probes.paris" -> "probe paris". */
export function fieldWords(name) {
  if (WORDS[name]) return WORDS[name];
  if (name.startsWith("probe.probes.")) return `probe ${name.slice("probe.probes.".length)}`;
  if (name.startsWith(RANK_LOSS)) return `rank ${name.slice(RANK_LOSS.length)}'s loss`;
  return name;
}

/** |Δ| as the check reports it: a number, ∞ when it was not finite, nothing for a text. */
export function deltaText(field) {
  if (field.infinite_delta) return "∞";
  return f.isNum(field.max_abs_delta) ? f.sci(field.max_abs_delta) : "";
}

/** The compared fields (those with at least one pair of points), split into those that
 * differ and those that match. */
export function fieldSplit(check) {
  const compared = (check.fields || []).filter((x) => x.points > 0);
  return { compared, bad: compared.filter((x) => x.equal === false), same: compared.filter((x) => x.equal !== false) };
}

function wordList(fields) {
  const words = fields.map((x) => fieldWords(x.field));
  return words.length <= 1 ? words.join("") : `${words.slice(0, -1).join(", ")} and ${words[words.length - 1]}`;
}

/** In a run of several ranks, which rank left the original first: " Rank 1 of the 2 ranks
 * differed first, at step 101." ("" for one rank, or when every rank matched). */
export function rankWords(check) {
  const r = check.first_divergent_rank;
  if (!r) return "";
  return ` Rank ${f.int(r.rank)} of the ${f.int(r.ranks)} ranks differed first, at step ${f.int(r.step)}.`;
}

/** "loss and 9 other metrics: bit-identical", or the fields that differ, each with the
 * first step it differs at; null before anything was compared. A run that started over
 * is compared with the original at the same steps: said so, never "bit-identical". */
export function fieldsLine(check) {
  const { compared, bad } = fieldSplit(check);
  if (!compared.length) return null;
  const others = compared.filter((x) => x.field !== LOSS).length;
  const plural = others === 1 ? "" : "s";
  const head = compared.length > others ? `loss and ${others} other metric${plural}` : `${others} metric${plural}`;
  if (check.outcome === "fresh") {
    const [lo, hi] = check.steps || [null, null];
    return `${head} of the new run's steps ${f.int(lo)}–${f.int(hi)}, compared with the original's at the same steps: `
      + `${bad.length ? `${bad.length} differ` : "the same"} — a new model trained again from step 0, not a resume; the original work was lost`;
  }
  if (!bad.length) return `${head}: bit-identical${check.complete === false ? " so far" : ""}`;
  const named = bad.map((x) => {
    const d = deltaText(x);
    return `${fieldWords(x.field)} (from step ${f.int(x.first_divergent_step)}${d ? `, |Δ| up to ${d}` : ""})`;
  });
  return `${head}: ${bad.length} differ — ${named.join(", ")}`;
}

/** The fields line as an expandable element: the line is the summary, and opening it
 * lists every compared metric by name with what was measured (same, or where it differs). */
export function fieldsDetails(check) {
  const line = fieldsLine(check);
  if (line === null) return null;
  const box = document.createElement("details");
  box.className = "check-fields";
  const summary = document.createElement("summary");
  summary.textContent = line;
  const list = document.createElement("ul");
  list.className = "check-field-list";
  for (const x of fieldSplit(check).compared) {
    const li = document.createElement("li");
    li.dataset.field = x.field;
    li.dataset.equal = String(x.equal !== false);
    const d = deltaText(x);
    li.textContent = x.equal === false
      ? `${fieldWords(x.field)}: differs from step ${f.int(x.first_divergent_step)}${d ? `, |Δ| up to ${d}` : ""} (${f.int(x.points)} points)`
      : `${fieldWords(x.field)}: the same at all ${f.int(x.points)} points`;
    list.append(li);
  }
  box.append(summary, list);
  return box;
}

/** What the measurements say, for a verdict: "loss and grad norm differ; learning rate and
 * tokens seen match." (from the check's fields, never from what a lesson expects). */
export function measuredWords(check) {
  const { bad, same } = fieldSplit(check);
  if (!bad.length) return "";
  const differ = `${wordList(bad)} ${bad.length === 1 ? "differs" : "differ"}`;
  return same.length ? `${differ}; ${wordList(same)} ${same.length === 1 ? "matches" : "match"}.` : `${differ}.`;
}

/** The verdict when the losses are bit-identical but other recorded fields are not; null
 * otherwise. */
export function otherFieldsVerdict(check) {
  const names = check.differing || [];
  if (!names.length || names.includes(LOSS)) return null;
  return `Not bit-identical: the recomputed losses match, but ${names.map(fieldWords).join(", ")} `
    + `${names.length === 1 ? "does" : "do"} not. What the run reports depends on state the checkpoint `
    + "did not hold or the resume did not restore (a generator the probes or samples draw from, a window "
    + "of recent losses), so the resumed run is not the same run.";
}
