"""`file:` corpora only from the corpora directory (trainer/corpus_files.py), checked by
the server's catalog and again by the trainer when it opens the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crashdrill.server.errors import BadInput
from crashdrill.server.lessons.catalog import Catalog, corpus_problems
from crashdrill.trainer.corpus_files import CorpusPathError, corpus_file, open_corpus
from crashdrill.trainer.data import DataError, load_text
from crashdrill.trainer.presets import get_preset, parse_preset_text


@pytest.fixture
def corpora(tmp_path: Path) -> Path:
    root = tmp_path / "corpora"
    (root / "sub").mkdir(parents=True)
    (root / "notes.txt").write_text("hello corpus\n", "utf-8")
    (root / "sub" / "more.txt").write_text("more\n", "utf-8")
    (tmp_path / "secret.txt").write_text("the server's file\n", "utf-8")
    os.symlink(tmp_path / "secret.txt", root / "out.txt")
    os.symlink(root / "notes.txt", root / "in.txt")
    return root


def test_a_corpus_inside_the_directory_is_read_by_a_relative_or_an_absolute_path(corpora):
    assert corpus_file("file:notes.txt", corpora) == corpora.resolve() / "notes.txt"
    assert corpus_file(f"file:{corpora}/sub/more.txt", corpora).name == "more.txt"
    assert open_corpus("file:in.txt", corpora) == b"hello corpus\n"  # a symlink inside, to inside


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("file:/proc/self/environ", "outside the corpora directory"),
        ("file:/dev/zero", "outside the corpora directory"),
        ("file:../secret.txt", "outside the corpora directory"),
        ("file:out.txt", "outside the corpora directory"),
        ("file:sub", "not a regular file"),
        ("file:missing.txt", "no such file"),
    ],
)
def test_a_corpus_outside_the_directory_or_not_a_file_is_refused(corpora, source, why):
    with pytest.raises(CorpusPathError, match=why) as e:
        corpus_file(source, corpora)
    assert source in str(e.value) and "CRASHDRILL_CORPORA_DIR" in str(e.value)


def test_the_trainer_checks_again_when_it_opens_the_file(corpora, monkeypatch):
    monkeypatch.setenv("CRASHDRILL_CORPORA_DIR", str(corpora))
    assert load_text("file:notes.txt") == "hello corpus\n"
    for source in ("file:/proc/self/environ", "file:out.txt", "file:/dev/zero"):
        with pytest.raises(DataError, match="outside the corpora directory"):
            load_text(source)


def test_without_a_corpora_directory_a_headless_run_reads_the_file_it_is_given(
    corpora, monkeypatch
):
    monkeypatch.delenv("CRASHDRILL_CORPORA_DIR", raising=False)
    assert load_text(f"file:{corpora.parent / 'secret.txt'}") == "the server's file\n"


def preset_text(data: str) -> str:
    text = Path(get_preset("quick").source).read_text("utf-8")
    return text.replace("[run]", f'[run]\ndata = "{data}"', 1)


def test_the_catalog_refuses_a_preset_whose_corpus_is_outside_the_directory(corpora, tmp_path):
    catalog = Catalog(tmp_path / "presets", corpora)
    assert catalog.checked(preset_text("file:notes.txt")).id == "quick"
    with pytest.raises(BadInput, match=r"data = 'file:/proc/self/environ': outside"):
        catalog.checked(preset_text("file:/proc/self/environ"))
    problems = corpus_problems(parse_preset_text(preset_text("file:/dev/zero")), corpora)
    assert problems and "/dev/zero" in problems[0]
