"""The drill's report as JUnit XML (`--junit FILE`), so that a CI system shows each resume
as a test case named by the trial it tested, from the evidence: `resume 2 (a kill inside
a checkpoint write: killed inside a checkpoint write)` passes when it is bit-identical and
fails with its verdict, its findings and their evidence otherwise (a resume started again
from a copy of the state after a damaging kill is its own case). A trial kind the drill
could not exercise is a skipped case, `trial inside-write (not exercised)`, its message
saying why. Findings about the whole run (the reference failed, too few digits, the final
state) are one more case, `the whole run`; a drill with no resume at all has that case.

    crashdrill verify --junit drill.xml -- python train.py
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from crashdrill.drill.plan import TRIAL_KINDS
from crashdrill.drill.report import trials, unexercised
from crashdrill.drill.verify import DrillResult

SUITE = "crashdrill verify"


def _title(result: DrillResult) -> str:
    what = result.target.describe()
    if result.mode == "preset":
        return f"preset {what.get('preset')} run {what.get('run')}"
    command = what.get("command")
    return " ".join(map(str, command)) if isinstance(command, list) else "a command"


def to_xml(result: DrillResult) -> ET.Element:
    an, segs = result.analysis, result.evidence.crashed
    suite = ET.Element("testsuite", name=SUITE)
    classname = f"{SUITE}.seed {result.seed}"
    props = ET.SubElement(suite, "properties")  # first, as JUnit readers expect
    kinds = ",".join(f"{g['kind']}={'pass' if g['passed'] else 'fail'}" for g in trials(result))
    for key, value in (("target", _title(result)), ("seed", str(result.seed)), ("trials", kinds)):
        ET.SubElement(props, "property", name=key, value=value)
    cases = 0
    failures = 0

    def case(
        name: str, failure: str | None, message: str, seconds: float | None, skipped: bool = False
    ) -> None:
        nonlocal cases, failures
        el = ET.SubElement(suite, "testcase", classname=classname, name=name)
        if seconds is not None:
            el.set("time", f"{max(seconds, 0.0):.3f}")
        cases += 1
        if skipped:
            ET.SubElement(el, "skipped", message=message)
        elif failure is not None:
            failures += 1
            fail = ET.SubElement(el, "failure", message=message)
            fail.text = failure

    for r in an.resumes:
        where = "inside a checkpoint write" if r.kill_in_write else f"at step {r.killed_at_step}"
        name = f"resume {r.index} ({TRIAL_KINDS.get(r.trial, r.trial)}: killed {where})"
        if r.replay_of is not None:
            at = segs[r.replay_of].copy_step
            name = (
                f"resume {r.index} (started again from the copy of the dir at step {at} of "
                f"resume {r.replay_of}, before the torn write)"
                if at is not None
                else f"resume {r.index} (started again from the copy before resume {r.replay_of})"
            )
        elif r.kill is None:
            name = f"resume {r.index} (a restart after a crash)"
        texts = [
            "\n".join([f.text, *(f"evidence: {e}" for e in f.evidence)])
            for f in an.findings
            if f.resume == r.index and f.fails
        ]
        ok = (r.bit_identical or bool(r.within_tolerance)) and not texts
        seg = segs[r.index] if r.index < len(segs) else None
        seconds = seg.ended - seg.started if seg is not None and seg.ended else None
        case(name, None if ok else "\n".join([r.verdict, *texts]), r.verdict, seconds)
    for gap in unexercised(result):  # a trial the drill could not run: skipped, with why
        case(f"trial {gap['kind']} (not exercised)", None, gap["reason"], None, skipped=True)
    general = [f for f in an.findings if f.resume is None]
    failing = [f for f in general if f.fails]
    if failing or not an.resumes:
        text = "\n".join(f"[{f.code}] {f.text}" for f in general) or "no resume to compare"
        bad = failing or an.verdict != "pass"
        case("the whole run", text if bad else None, an.verdict, result.wall_s)
    suite.set("tests", str(cases))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(len(suite.findall("testcase/skipped"))))
    suite.set("time", f"{result.wall_s:.3f}")
    return suite


def write_junit(result: DrillResult, path: str | Path) -> None:
    root = ET.Element("testsuites")
    root.append(to_xml(result))
    ET.indent(root)
    Path(path).write_bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n")
