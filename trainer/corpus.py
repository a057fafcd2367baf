"""The built-in corpus: plain English generated deterministically, no download.

It is small and regular enough that a ~1M-parameter byte-level GPT visibly learns it in a
few hundred CPU steps, and it states the facts that the fact probes ask about, in several
phrasings, among distractor sentences that use the wrong answers in other contexts — so
a probe moves only when the model has learned the association, not the word.
"""

from __future__ import annotations

import random

CORPUS_VERSION = 1

# (name, prompt, right continuation, wrong continuation). P(right)/(P(right)+P(wrong))
# over the whole continuation: 0.5 = no idea, 1 = sure and right.
PROBES: tuple[tuple[str, str, str, str], ...] = (
    ("paris", "The capital of France is", " Paris", " London"),
    ("water", "Q: Is water a liquid at room temperature? A:", " Yes", " No"),
    ("planet", "The largest planet in our solar system is", " Jupiter", " Mars"),
    ("ice", "Q: Does ice float on water? A:", " Yes", " No"),
    ("sky", "On a clear day the sky is", " blue", " green"),
    ("whale", "A whale is a", " mammal", " fish"),
    ("arithmetic", "2 + 3 =", " 5", " 6"),
    ("orbit", "The Earth goes around the", " Sun", " Moon"),
    ("ocean", "The largest ocean on Earth is the", " Pacific", " Atlantic"),
)

_FACTS = (
    "The capital of France is Paris.",
    "Paris is the capital of France.",
    "The capital of England is London.",
    "London is a large city in England.",
    "The capital of Italy is Rome.",
    "The capital of Spain is Madrid.",
    "The capital of Germany is Berlin.",
    "The capital of Japan is Tokyo.",
    "Q: Is water a liquid at room temperature? A: Yes.",
    "Water is a liquid at room temperature.",
    "Q: Is iron a liquid at room temperature? A: No.",
    "Q: Is air a solid? A: No.",
    "Q: Does ice float on water? A: Yes.",
    "Ice floats on water because it is less dense.",
    "Q: Does a stone float on water? A: No.",
    "The largest planet in our solar system is Jupiter.",
    "Jupiter is the largest planet in our solar system.",
    "Mars is a small red planet.",
    "Mars is the fourth planet from the Sun.",
    "On a clear day the sky is blue.",
    "The sky is blue on a clear day.",
    "Grass is green.",
    "Leaves are green in summer.",
    "A whale is a mammal.",
    "Whales are mammals that live in the sea.",
    "A shark is a fish.",
    "A salmon is a fish.",
    "A dog is a mammal.",
    "The Earth goes around the Sun.",
    "The Moon goes around the Earth.",
    "The largest ocean on Earth is the Pacific.",
    "The Atlantic is the second largest ocean.",
    "Q: Is the Sun a star? A: Yes.",
    "Q: Is the Moon a star? A: No.",
)

_NAMES = ("Ada", "Ben", "Cleo", "Dev", "Ema", "Finn", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea")
_THINGS = ("apples", "books", "stones", "cups", "shells", "coins", "pens", "seeds", "maps")
_PLACES = ("the garden", "the kitchen", "the library", "the market", "the river", "the hill")
_VERBS = ("found", "bought", "counted", "carried", "painted", "sorted", "gave away", "lost")
_ADJ = ("small", "old", "bright", "quiet", "heavy", "round", "warm", "tidy")


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    if rng.random() < 0.7:
        return f"{a} + {b} = {a + b}."
    hi, lo = max(a, b), min(a, b)
    return f"{hi} - {lo} = {hi - lo}."


def _story(rng: random.Random) -> str:
    name = rng.choice(_NAMES)
    n = rng.randint(2, 9)
    thing = rng.choice(_THINGS)
    kind = rng.randint(0, 3)
    if kind == 0:
        return (
            f"{name} {rng.choice(_VERBS)} {n} {rng.choice(_ADJ)} {thing} in {rng.choice(_PLACES)}."
        )
    if kind == 1:
        m = rng.randint(1, 9)
        return f"{name} had {n} {thing} and got {m} more, so {name} had {n + m} {thing}."
    if kind == 2:
        other = rng.choice(_NAMES)
        return f"{name} walked to {rng.choice(_PLACES)} with {other}."
    return f"In {rng.choice(_PLACES)} there were {n} {rng.choice(_ADJ)} {thing}."


def generate(n_chars: int = 400_000, seed: int = 0) -> str:
    """The corpus text. A pure function of (n_chars, seed, CORPUS_VERSION)."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < n_chars:
        line: list[str] = []
        for _ in range(rng.randint(3, 6)):
            r = rng.random()
            if r < 0.40:
                line.append(rng.choice(_FACTS))
            elif r < 0.65:
                line.append(_arithmetic(rng))
            else:
                line.append(_story(rng))
        text = " ".join(line) + "\n"
        parts.append(text)
        size += len(text)
    return "".join(parts)
