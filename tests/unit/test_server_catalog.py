"""The lab's lesson catalog (server/lessons/catalog.py): the order in which it lists lessons (the
student's list and the instructor's table both come from Catalog.visible: by lesson
number, numeric parts as numbers), a duplicate told apart from its original, and the
ids a preset cannot take."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crashdrill.server.errors import BadInput
from crashdrill.server.lessons.catalog import Catalog, parse_text
from crashdrill.trainer.presets import BUILTIN_DIR, PresetError, number_key


def write_lesson(directory: Path, lesson_id: str, number: str) -> None:
    text = (BUILTIN_DIR / "quick.toml").read_text(encoding="utf-8")
    text = re.sub(r'(?m)^id = ".*"$', f'id = "{lesson_id}"', text)
    text = re.sub(r'(?m)^number = ".*"$', f'number = "{number}"', text)
    (directory / f"{lesson_id}.toml").write_text(text, encoding="utf-8")


def test_lesson_numbers_sort_by_their_numeric_parts() -> None:
    numbers = ["1.10", "1.7", "1.9", "2.1", "1.13", "10.0"]
    assert sorted(numbers, key=number_key) == ["1.7", "1.9", "1.10", "1.13", "2.1", "10.0"]


def test_the_catalog_lists_lesson_1_10_after_1_9_not_before_1_2(tmp_path: Path) -> None:
    for lesson_id, number in [("ten", "9.10"), ("nine", "9.9"), ("two", "9.2")]:
        write_lesson(tmp_path, lesson_id, number)
    shown = [x.preset.number for x in Catalog(tmp_path).visible(instructor=True)]
    assert shown == sorted(shown, key=number_key), shown
    assert shown.index("9.2") < shown.index("9.9") < shown.index("9.10")
    assert shown.index("1.9") < shown.index("1.10")


def test_a_duplicate_s_title_names_its_new_id(tmp_path: Path) -> None:
    catalog = Catalog(tmp_path)
    original = catalog.get("quick", instructor=True).preset
    first = catalog.duplicate("quick", None).preset
    second = catalog.duplicate("quick", None).preset
    assert first.title == f"{original.title} (quick-copy)"
    assert second.title == f"{original.title} (quick-copy2)"
    titles = [x.preset.title for x in catalog.visible(instructor=True)]
    assert len(titles) == len(set(titles)), titles


def test_a_route_s_own_word_cannot_be_a_preset_s_id(tmp_path: Path) -> None:
    text = (BUILTIN_DIR / "quick.toml").read_text(encoding="utf-8")
    text = re.sub(r'(?m)^id = ".*"$', 'id = "validate"', text)
    with pytest.raises(PresetError, match=r"id = 'validate': reserved \(POST /api/instructor"):
        parse_text(text)
    with pytest.raises(BadInput, match=r"new_id = 'validate': reserved"):
        Catalog(tmp_path).duplicate("quick", "validate")


def test_a_duplicate_gets_a_fresh_number_that_sorts_right_after_its_original(
    tmp_path: Path,
) -> None:
    catalog = Catalog(tmp_path)
    first = catalog.duplicate("quick", None).preset
    second = catalog.duplicate("quick", None).preset
    again = catalog.duplicate(first.id, None).preset
    assert (first.number, second.number, again.number) == ("0.1.1", "0.1.2", "0.1.1.1")
    numbers = [x.preset.number for x in catalog.visible(instructor=True)]
    for copy in ("0.1.1", "0.1.2", "0.1.1.1"):
        assert numbers.count(copy) == 1, numbers  # no two lessons 0.1 for students
    assert numbers.count("0.1") == 1
    assert numbers.index("0.1") + 1 == numbers.index("0.1.1")
