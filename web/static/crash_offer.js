// The Crash test choices of a lesson whose preset offers more than its own crash mode
// (`[crash] offer`; lesson 1.16 offers "rank": kill one rank of the group instead of the
// whole group): one more button per offered mode beside Crash test, named from the mode's
// fields (crash_words.js offerWords), enabled exactly when Crash test is. Pressing one sends
// the crash test with that `crash_mode` (POST /api/runs/{run}/crash); the server checks
// that the lesson offers it.

import { offerWords } from "./crash_words.js";

/** The offer buttons of `card` for `preset`, made once into `row` (before Preempt);
 * `modes`: the registry by name (GET /api/record-kinds); `onCrash(run, card, mode)`. */
export function offerButtons(card, row, preset, modes, onCrash) {
  const names = (preset?.crash?.offer || []).filter((n) => modes?.has(n));
  return names.map((name) => {
    const [label, what] = offerWords(modes.get(name));
    const button = document.createElement("button");
    button.type = "button";
    button.className = "crash-offer";
    button.dataset.mode = name;
    button.textContent = label;
    button.title = what;
    button.setAttribute("aria-label", `${label}, run ${card.run.label}: ${what}`);
    button.addEventListener("click", () => onCrash(card.run, card, name));
    row.querySelector(".preempt").before(button);
    return button;
  });
}
