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


def test_the_groups_and_phases_agree() -> None:
    assert set(BEFORE_TRAINING).isdisjoint(TRAINER_STAGES[4:])  # train and after
    assert [phase(s) for s in (Stage.WARMUP, Stage.TRAIN, Stage.DIVERGED)] == [
        "before",
        "train",
        "after",
    ]
    assert LISTED[0][0] == Stage.QUEUED and LISTED[-1][0] == Stage.FINISHED
    assert "diverged" in contract_json()["kinds"][0]["fields"][0]["meaning"]
