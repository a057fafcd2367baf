"""A run's stages have one home (trainer/stages.py): the page's stage list
(web/static/cards.js STAGES) is the one served by GET /api/record-kinds, and every stage the
trainer and the lab write is a Stage."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from crashdrill.trainer.record_contract import contract_json
from crashdrill.trainer.stages import BEFORE_TRAINING, LISTED, TRAINER_STAGES, Stage, phase

ROOT = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="needs node to run the page's module")
def test_the_page_s_stage_list_is_the_served_one() -> None:
    assert NODE is not None
    module = json.dumps((ROOT / "web" / "static" / "cards.js").as_uri())
    code = f"import({module}).then((m) => console.log(JSON.stringify(m.STAGES)))"
    # cards.js imports the page's other modules, all plain ES modules: node loads them.
    out = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    served = [(s["name"], s["words"]) for s in contract_json()["stages"] if s["listed"]]
    assert [tuple(x) for x in json.loads(out.stdout)] == served


def test_every_stage_written_in_python_is_a_stage() -> None:
    written = re.compile(r'stage=("[a-z_]+")|stage\("([a-z_]+)"')
    names = {s.value for s in Stage}
    found = []
    for folder in ("trainer", "workers", "server", "drill"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for m in written.finditer(path.read_text(encoding="utf-8")):
                name = (m.group(1) or m.group(2)).strip('"')
                if name not in names:
                    found.append(f"{path.relative_to(ROOT)}: {name}")
    assert found == [], f"add these to trainer/stages.py: {found}"


# `stage` as a name, a key (`row["stage"]`, `"stage":`) or a call's result, then a literal:
# `stage == "x"`, `!=`, `stage="x"`, `"stage": "x"`, `fields["stage"] = "x"`; or a group,
# `stage in ("x", ...)`; or a call `stage("x")`.
_STAGE = r"""\bstage\b["'\])]*\s*"""
_ONE = re.compile(_STAGE + r"""(?:==|!=|=|:)\s*["'](\w+)["']|\bstage\(\s*["'](\w+)["']""")
_GROUP = re.compile(_STAGE + r"(?:not\s+)?in\s*[(\[{]([^)\]}]*)")
_QUOTED = re.compile(r"""["'](\w+)["']""")


def spelled_stages(text: str) -> list[str]:
    """Each stage the text spells as a string where code names a stage."""
    found = [m.group(1) or m.group(2) for m in _ONE.finditer(text)]
    for m in _GROUP.finditer(text):
        found += _QUOTED.findall(m.group(1))
    return [s for s in found if s in {x.value for x in Stage}]


def test_no_module_spells_a_stage_as_a_string() -> None:
    home = ROOT / "trainer" / "stages.py"
    found = [
        f"{path.relative_to(ROOT)}: {name!r}"
        for folder in ("trainer", "workers", "server", "drill", "crashdrill")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != home
        for name in spelled_stages(path.read_text(encoding="utf-8"))
    ]
    assert found == [], f"name these as trainer/stages.py's Stage: {found}"


@pytest.mark.parametrize(
    "line",
    [
        'if stage == "finished" and not stop:',
        'if row["stage"] != "failed":',
        'records.append({"kind": "stage", "stage": "failed", "progress": 1})',
        'fields["stage"] = "restarting"',
        'rec.write("stage", stage="failed", progress=1.0)',
        'if value["stage"] in ("finished", "failed", DIVERGED):',
        'return row["stage"] in (*BEFORE_TRAINING, "train")',
        'stage("download", 0.0)',
    ],
)
def test_each_spelling_of_a_stage_is_caught(line: str) -> None:
    assert spelled_stages(line) != []


def test_named_stages_and_the_record_kind_are_not_caught() -> None:
    text = (
        'rec.write("stage", stage=Stage.FAILED, progress=1.0)\n'
        'if kind == "stage" and value["stage"] in AFTER_TRAINING:\n'
        'state = "train"  # not a stage\n'
    )
    assert spelled_stages(text) == []


def test_the_groups_and_phases_agree() -> None:
    assert set(BEFORE_TRAINING).isdisjoint(TRAINER_STAGES[4:])  # train and after
    assert [phase(s) for s in (Stage.WARMUP, Stage.TRAIN, Stage.DIVERGED)] == [
        "before",
        "train",
        "after",
    ]
    assert LISTED[0][0] == Stage.QUEUED and LISTED[-1][0] == Stage.FINISHED
    assert "diverged" in contract_json()["kinds"][0]["fields"][0]["meaning"]
