"""The run dir's one complete-lines reader (trainer/run_files.py), and that every process
names the run dir's files from it."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from crashdrill.trainer import run_files
from crashdrill.trainer.run_files import (
    CompleteLines,
    read_complete_lines,
    read_records,
    read_tail,
    tail_records,
    torn_tail,
)

ROOT = Path(__file__).resolve().parents[2]


def test_a_last_line_without_its_newline_is_not_read_and_the_offset_stops_before_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n{"c":')  # a writer killed mid-line
    part = read_complete_lines(path)
    assert part.data == b'{"a":1}\n{"b":2}\n'
    assert (part.start, part.end, part.read, part.size) == (0, 16, 21, 21)
    assert part.more  # the torn line is there, not yet complete
    assert list(part.lines()) == [(0, b'{"a":1}'), (8, b'{"b":2}')]
    assert read_records(path) == ([{"a": 1}, {"b": 2}], 16)


def test_a_read_resumes_from_its_offset_and_reads_nothing_twice(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"a":1}\n')
    records, offset = read_records(path)
    assert (records, offset) == ([{"a": 1}], 8)
    assert read_records(path, offset) == ([], 8)
    with open(path, "ab") as f:
        f.write(b'{"b":2}\n')
    assert read_records(path, offset) == ([{"b": 2}], 16)


def test_a_line_split_across_two_reads_is_read_whole_by_the_second(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"a":1}\n{"step":')
    first = read_complete_lines(path)
    assert first.end == 8
    with open(path, "ab") as f:
        f.write(b'2,"loss":3.5}\n')
    second = read_complete_lines(path, first.end)
    assert list(second.lines()) == [(8, b'{"step":2,"loss":3.5}')]
    assert read_records(path, first.end) == ([{"step": 2, "loss": 3.5}], 30)


def test_a_limited_read_ends_at_a_line_and_the_next_read_goes_on_from_there(
    tmp_path: Path,
) -> None:
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n')
    part = read_complete_lines(path, 0, limit=10)
    assert (part.data, part.read, part.end, part.more) == (b'{"a":1}\n', 10, 8, True)
    rest = read_complete_lines(path, part.end, limit=10)
    assert (rest.data, rest.more) == (b'{"b":2}\n', False)


def test_lines_that_are_not_json_objects_or_not_utf8_are_skipped_and_read_past(
    tmp_path: Path,
) -> None:
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"a":1}\n{"v":1,"ki\n\xff\xfe garbage\n[1,2]\n\n{"b":2}\n')
    records, offset = read_records(path)
    assert records == [{"a": 1}, {"b": 2}]
    assert offset == path.stat().st_size  # the bad lines are behind the offset, for good


def test_a_file_that_is_not_there_yet_has_no_lines(tmp_path: Path) -> None:
    missing = tmp_path / "records.jsonl"
    assert read_complete_lines(missing, 40) == CompleteLines(b"", 40)
    assert read_complete_lines(missing, 40).size == -1
    assert read_records(missing, 40) == ([], 40)
    assert tail_records(missing) == []


def test_a_read_of_something_that_is_no_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        read_complete_lines(tmp_path)


def test_a_tail_leaves_out_the_line_its_window_cuts_and_the_torn_last_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n{"c":3}\n{"d":')
    assert tail_records(path, max_bytes=1000) == [{"a": 1}, {"b": 2}, {"c": 3}]
    # The last 20 bytes begin inside {"b":2}: that line is cut and does not count.
    window = read_tail(path, max_bytes=20)
    assert list(window.lines()) == [(16, b'{"c":3}')]
    assert tail_records(path, max_bytes=20) == [{"c": 3}]
    assert tail_records(path, max_bytes=4) == []  # no complete line in the window


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_no_module_but_run_files_spells_a_run_dir_file_name() -> None:
    """A file name in the run dir is a contract between processes: written once, in
    trainer/run_files.py, and imported by the trainer, the workers, the server, the
    drill and the benchmarks (a docstring may mention one; a string that *is* one may
    not). Tests keep spelling them: they check the contract from outside."""
    names = {
        v for k, v in vars(run_files).items() if k.isupper() and isinstance(v, str) and "." in v
    }
    assert {"records.jsonl", "run.json", "mirror.jsonl", "stderr.log"} <= names
    home = ROOT / "trainer" / "run_files.py"
    spelled = {}
    for folder in ("trainer", "workers", "server", "drill", "crashdrill", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == home:
                continue
            found = _string_constants(path) & names
            if found:
                spelled[str(path.relative_to(ROOT))] = sorted(found)
    assert spelled == {}


@pytest.mark.parametrize(
    ("content", "before_next"),
    [(b"", b""), (b'{"a":1}\n', b""), (b'{"a":1}\n{"b', b"\n"), (b"x", b"\n"), (b"\n", b"")],
)
def test_torn_tail_is_a_newline_exactly_when_the_file_ends_inside_a_line(
    tmp_path: Path, content: bytes, before_next: bytes
) -> None:
    path = tmp_path / "records.jsonl"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    try:
        assert torn_tail(fd) == before_next
    finally:
        os.close(fd)


def test_no_module_but_run_files_looks_for_a_torn_last_line() -> None:
    """Ending a torn line is one function (`torn_tail`), which every writer that appends
    to a run's JSONL files calls: no module reads a file's last byte by itself."""
    home = ROOT / "trainer" / "run_files.py"
    by_hand = re.compile(r"pread\([^)]*size - 1|seek\(size - 1\)|seek\(-1, ")
    found = [
        str(path.relative_to(ROOT))
        for folder in ("trainer", "workers", "server", "drill", "crashdrill")
        for path in (ROOT / folder).rglob("*.py")
        if path != home and by_hand.search(path.read_text(encoding="utf-8"))
    ]
    assert found == []
