"""A lesson's crash window: the steps in which it wants its Crash test, `[crash] window` in
its preset. The page reads it from the preset (never from the "what to watch" text) and
says where each run stands against it, naming the steps: "crash window, steps 100–600:
opens in 14 steps", "crash test at step 150: inside the lesson's window, steps
100–600 ✓".

    window = [250, 500]                             # both runs: steps 250 to 500
    window = [100, "end"]                           # both runs: step 100 to the run's end
    window = { A = [120, "end"], B = [250, "end"] } # each run its own

    parse_window([100, "end"], problems)   # {"A": (100, None), "B": (100, None)}
    window_problems(window, {"A": 600, "B": 600})   # [] or why a window misses the run
    window_toml(window)                    # [100, "end"]: what dump_preset writes back

A window holds its first and last step, both inclusive; None as the last is "end", the
run's last step, whatever steps the run trains. A lesson without one has no window: any
moment of training will do, and the page shows none.

Imports nothing but the standard library.
"""

from __future__ import annotations

from typing import Any

LABELS = ("A", "B")
END = "end"
Window = dict[str, tuple[int, int | None]]  # run label -> (first step, last step or None)
ALLOWED = (
    '[FROM, TO] steps (TO a step after FROM, or "end": the run\'s last step), or a table of'
    " them by run: { A = [FROM, TO], B = [FROM, TO] }"
)


def _is_step(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _pair(value: Any, where: str, problems: list[str]) -> tuple[int, int | None] | None:
    if not isinstance(value, list | tuple) or len(value) != 2:
        problems.append(f"{where} = {value!r}: {ALLOWED}")
        return None
    first, last = value
    if not _is_step(first):
        problems.append(f"{where} = {value!r}: its first step {first!r} must be a step ≥ 0")
        return None
    if last == END:
        return (first, None)
    if not _is_step(last) or last <= first:
        problems.append(
            f'{where} = {value!r}: its last step {last!r} must be a step after {first} or "{END}"'
        )
        return None
    return (first, last)


def parse_window(value: Any, problems: list[str]) -> Window:
    """`[crash] window` as {label: (first, last or None)}; {} for none. Each problem
    (naming the field, the value and what is allowed) goes to `problems`."""
    if value is None:
        return {}
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(LABELS))
        if unknown:
            problems.append(
                f"[crash] window: unknown run {', '.join(map(repr, unknown))}; allowed: A, B"
            )
        missing = [label for label in LABELS if label not in value]
        if missing:
            problems.append(
                f"[crash] window: no window for run {', '.join(missing)}; give both A and B,"
                " or one [FROM, TO] for both"
            )
        out: Window = {}
        for label in LABELS:
            if label in value and (
                pair := _pair(value[label], f"[crash] window.{label}", problems)
            ):
                out[label] = pair
        return out if len(out) == len(LABELS) else {}
    pair = _pair(value, "[crash] window", problems)
    return {label: pair for label in LABELS} if pair else {}


def window_problems(window: Window, steps: dict[str, int]) -> list[str]:
    """A window that starts at or past a run's last step (`steps`: each run's) can never be
    hit; one that ends past it is cut there by the run's end, and is refused as well."""
    out = []
    for label, (first, last) in window.items():
        n = steps.get(label)
        if n is None:
            continue
        if first >= n:
            out.append(
                f"[crash] window: run {label}'s window starts at step {first}, but the run"
                f" trains {n} steps: it must start before step {n}"
            )
        elif last is not None and last > n:
            out.append(
                f"[crash] window: run {label}'s window ends at step {last}, past the run's"
                f' {n} steps: end it at step {n} at most, or "{END}"'
            )
    return out


def window_toml(window: Window) -> Any:
    """The TOML value of `window`: one [FROM, TO] when both runs share it, else a table."""

    def one(pair: tuple[int, int | None]) -> list[Any]:
        return [pair[0], END if pair[1] is None else pair[1]]

    if len({window[label] for label in LABELS}) == 1:
        return one(window[LABELS[0]])
    return {label: one(window[label]) for label in LABELS}
