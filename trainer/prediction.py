"""A lesson's prediction: the one short question a student answers before the first crash
test (predict, then observe, then read the answer). One home for what a preset's
`[predict]` table may say and what an answer may be; the lab stores the answers and
measures the outcomes (server/lessons/predictions.py), the page renders from `to_dict()`.

    [predict]
    question = "How many steps will each run lose to your crash test?"
    measure = "lost_steps"        # what is measured, one of MEASURES
    runs = ["A", "B"]             # whose outcome the student predicts (default both)
    answer_after_outcome = true   # the lesson's answer opens only once the outcome is in

When it is asked (`ask_when`, from the lesson's crash): a lesson whose crash comes by
itself (a session wall, `[crash] wall_step`) asks before Start, since nobody presses
anything before it lands; every other lesson shows the question from Start and asks for
it at the first Crash test. The lab holds both runs while the student answers (from the
first answer typed, or the Crash test): each trainer is stopped where it is, between two
instructions of a step, never inside a checkpoint write (server/run_control.py,
workers/hold.py).

One rule decides whether an answer was right (`answer_right`, said in words by
`RULE_TEXT`): a choice must be the one that happened; a number of steps counts within
10 % of the measured one or NUMBER_SLACK steps, whichever is larger (a step record can
be on its way to the page when the run is held, so what the student read may be a
step or two behind what the kill cost). The page and the class view show the verdict
the server computed with it, and the rule beside it.

Measures (each decides the kind of answer and how its outcome is read):
  lost_steps     a number: the steps the run's first crash cost (trained, then lost)
  resume         a choice: what the run's first restart did (RESUME_CHOICES)
  bit_identical  a choice: "yes" when the run's first restart resumed a checkpoint and
                 recomputed the lost steps bit for bit, else "no"
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crashdrill.trainer.resume_outcome import ResumeOutcome

LABELS = ("A", "B")
MEASURES = ("lost_steps", "resume", "bit_identical")
# code -> what the student reads; the codes are what is stored and measured: resume
# outcomes (trainer/resume_outcome.py), the ones a first restart in the lab ends with.
RESUME_CHOICES = {
    ResumeOutcome.IDENTICAL.value: "resumes, bit-identical",
    ResumeOutcome.DIFFERENT.value: "resumes, but not bit-identical",
    ResumeOutcome.FRESH.value: "starts over from step 0",
    ResumeOutcome.REFUSED.value: "refuses to start (an error)",
}
YES_NO = {"yes": "yes", "no": "no"}
CHOICES: dict[str, dict[str, str]] = {"resume": RESUME_CHOICES, "bit_identical": YES_NO}
KEYS = ("question", "measure", "runs", "answer_after_outcome")
MAX_QUESTION = 300
MAX_ANSWER = 10_000_000  # steps: a bound far above any lesson's
NUMBER_SHARE = 0.10  # a number counts as right within this share of the measured one …
NUMBER_SLACK = 2  # … or within this many steps, whichever is larger
RULE_TEXT = {
    "number": (
        f"a number counts as right within {round(NUMBER_SHARE * 100)} % of the measured one"
        f" or {NUMBER_SLACK} steps, whichever is larger"
    ),
    "choice": "a choice counts as right when it is what happened",
}
ASK_BEFORE_START = "start"  # the crash comes by itself: asked before the runs start
ASK_AT_CRASH = "crash"  # asked when Crash test is first pressed, the runs held meanwhile


def ask_when(wall_step: int) -> str:
    """When a lesson asks its question: before Start when its crash comes by itself (a
    session wall at `wall_step`), else at the first Crash test."""
    return ASK_BEFORE_START if wall_step else ASK_AT_CRASH


def number_tolerance(measured: int) -> int:
    """How far a number of steps may be from the measured one and still count as right."""
    return max(NUMBER_SLACK, round(NUMBER_SHARE * measured))


@dataclass(frozen=True)
class Prediction:
    question: str
    measure: str
    runs: tuple[str, ...] = LABELS
    answer_after_outcome: bool = True

    @property
    def kind(self) -> str:
        return "choice" if self.measure in CHOICES else "number"

    def choices(self) -> dict[str, str]:
        return dict(CHOICES.get(self.measure, {}))

    def answer_right(self, answer: Any, outcome: Any) -> bool | None:
        """Whether `answer` got `outcome` right by the one rule (RULE_TEXT); None while
        either is missing."""
        if answer is None or outcome is None:
            return None
        if self.kind == "choice":
            return bool(answer == outcome)
        return bool(abs(int(answer) - int(outcome)) <= number_tolerance(int(outcome)))

    def to_dict(self) -> dict[str, Any]:
        """What a page (and the preset file) needs: the question, the answer's kind and,
        for a choice, its codes and words, and the rule that says when an answer is right."""
        return {
            "rule": RULE_TEXT[self.kind],
            "question": self.question,
            "measure": self.measure,
            "runs": list(self.runs),
            "answer_after_outcome": self.answer_after_outcome,
            "kind": self.kind,
            "choices": [{"value": k, "text": v} for k, v in self.choices().items()],
        }

    def file_table(self) -> dict[str, Any]:
        """The `[predict]` table as a preset file writes it."""
        table: dict[str, Any] = {"question": self.question, "measure": self.measure}
        if self.runs != LABELS:
            table["runs"] = list(self.runs)
        if not self.answer_after_outcome:
            table["answer_after_outcome"] = False
        return table

    def answer_problems(self, answers: Any, max_steps: int | None = None) -> list[str]:
        """Why `answers` ({"A": 40, "B": 150}, one per predicted run) is not an answer to
        this question: each problem names the run, the value and what is allowed."""
        if not isinstance(answers, Mapping):
            want = ", ".join(f'"{r}"' for r in self.runs)
            return [f"answers = {answers!r}: an object with one answer for each of {want}"]
        problems = [
            f"answers: run {k!r} is not asked about; answer for {', '.join(self.runs)}"
            for k in sorted(set(answers) - set(self.runs), key=str)
        ]
        for run in self.runs:
            if run not in answers:
                problems.append(f"answers: run {run} has no answer; {self.allowed(max_steps)}")
                continue
            value = answers[run]
            if self.kind == "choice":
                if value not in self.choices():
                    problems.append(f"answers.{run} = {value!r}: {self.allowed(max_steps)}")
            else:
                top = MAX_ANSWER if max_steps is None else max_steps
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
                    problems.append(f"answers.{run} = {value!r}: {self.allowed(max_steps)}")
        return problems

    def allowed(self, max_steps: int | None = None) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(f'"{c}"' for c in self.choices())
        top = MAX_ANSWER if max_steps is None else max_steps
        return f"a whole number of steps from 0 to {top}"


def parse_prediction(value: Any, problems: list[str]) -> Prediction | None:
    """The `[predict]` table of a preset (None when absent); appends a sentence per problem,
    naming the key, the value and what is allowed."""
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.append(f"[predict] must be a table (question, measure, runs), not {value!r}")
        return None
    problems.extend(
        f"[predict] unknown key {k!r}; allowed: {', '.join(KEYS)}"
        for k in sorted(set(value) - set(KEYS))
    )
    question = value.get("question", "")
    if not isinstance(question, str) or not question.strip():
        problems.append(f"[predict] question = {question!r}: a short question (text) is required")
        question = ""
    elif len(question) > MAX_QUESTION:
        problems.append(f"[predict] question: {len(question)} characters; at most {MAX_QUESTION}")
    measure = value.get("measure")
    if measure not in MEASURES:
        problems.append(
            f"[predict] measure = {measure!r} is not allowed: one of "
            + ", ".join(repr(m) for m in MEASURES)
        )
        measure = MEASURES[0]
    runs = value.get("runs", list(LABELS))
    if (
        not isinstance(runs, list)
        or not runs
        or any(r not in LABELS for r in runs)
        or len(set(runs)) != len(runs)
    ):
        problems.append(f'[predict] runs = {runs!r}: ["A"], ["B"] or ["A", "B"]')
        runs = list(LABELS)
    after = value.get("answer_after_outcome", True)
    if not isinstance(after, bool):
        problems.append(f"[predict] answer_after_outcome = {after!r}: true or false")
        after = True
    ordered = tuple(r for r in LABELS if r in runs)
    return Prediction(question.strip(), str(measure), ordered, after)
