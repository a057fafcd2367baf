// The resume check's fields, compactly: every deterministic field a run records (loss,
// lr, grad norm, tokens, val loss and its train mean, each probe, the sample), each
// compared by its exact value. The server sends them as `fields` and `differing` in each
// check (docs/run-contract.md, "The resume check, field by field").

import * as f from "./format.js";

const LOSS = "step.loss";
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
  return name;
}

/** |Δ| as the check reports it: a number, ∞ when it was not finite, nothing for a text. */
export function deltaText(field) {
  if (field.infinite_delta) return "∞";
  return f.isNum(field.max_abs_delta) ? f.sci(field.max_abs_delta) : "";
}

/** "loss and 9 other metrics: bit-identical", or the fields that differ, each with the
 * first step it differs at; null before anything was compared. */
export function fieldsLine(check) {
  const compared = (check.fields || []).filter((x) => x.points > 0);
  if (!compared.length) return null;
  const others = compared.filter((x) => x.field !== LOSS).length;
  const plural = others === 1 ? "" : "s";
  const head = compared.length > others ? `loss and ${others} other metric${plural}` : `${others} metric${plural}`;
  const bad = compared.filter((x) => x.equal === false);
  if (!bad.length) return `${head}: bit-identical`;
  const named = bad.map((x) => {
    const d = deltaText(x);
    return `${fieldWords(x.field)} (from step ${f.int(x.first_divergent_step)}${d ? `, |Δ| up to ${d}` : ""})`;
  });
  return `${head}: ${bad.length} differ — ${named.join(", ")}`;
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
