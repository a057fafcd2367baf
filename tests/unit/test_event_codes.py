"""Event codes have one home (trainer/event_codes.py): every code the source writes or the
page reads is registered, each is well formed, and docs/run-contract.md lists the
registry as it is. (Making an event from it: test_event_record.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crashdrill.trainer.event_codes import (
    CODES,
    EVENT_CODES,
    LEVELS,
    RESTART_KINDS,
    WEIGHTS,
    WRITERS,
    event_code,
)

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "run-contract.md"
PACKAGES = ("trainer", "workers", "server", "drill", "crashdrill")


def test_every_code_is_well_formed() -> None:
    assert len(set(CODES)) == len(CODES), "a code is registered twice"
    for e in EVENT_CODES:
        assert re.fullmatch(r"[a-z_]+", e.code), e.code
        assert e.writer in WRITERS and e.weight in WEIGHTS, e.code
        assert e.levels and set(e.levels) <= set(LEVELS), e.code
        names = [f.name for f in e.fields]
        assert len(set(names)) == len(names) and set(e.optional) <= set(names), e.code
        assert not {"kind", "segment", "level", "code", "text", "v", "t"} & set(names), e.code


def test_restart_codes_are_the_supervisor_s_and_carry_where_the_run_resumes() -> None:
    restarts = [e for e in EVENT_CODES if e.restart]
    assert {e.restart for e in restarts} == set(RESTART_KINDS)
    for e in restarts:
        assert e.writer == "supervisor", e.code
        assert "resume_from" in {f.name for f in e.fields} and "resume_from" not in e.optional


def _source_codes() -> dict[str, set[str]]:
    """The event codes the Python source writes or compares, by file: the first argument
    of every `event(` / `build_event(` / `rec.event(` call, every `*_CODE = "…"` constant,
    every `code="…"` / `code == "…"` and the supervisor's restart codes."""
    found: dict[str, set[str]] = {}
    patterns = (
        r'(?:build_event|\brec\.event|\bevent)\(\s*"([a-z_]+)"',
        r"\b[A-Z_]*CODE[A-Z_, ]* = ([^#\n]+)",
        r'\bwarn\(\s*f?"[^"]*",\s*"([a-z_]+)"',
        r'\b_log\(run, "([a-z_]+)"',
        r'\bcode="([a-z_]+)"',
        r'"code"\)? == "([a-z_]+)"',
        r'\("code"\) in \(([^)]*)\)',
        r"\bcode in \(([^)]*)\)",
        r'"crash" if moved else "([a-z_]+)"',
        r'"(preempt)" if preempt is not None else "(graceful_stop)"',
    )
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            codes: set[str] = set()
            for pattern in patterns:
                for m in re.finditer(pattern, text):
                    for group in m.groups():
                        quoted = re.findall(r'"([a-z_]+)"', group)
                        codes.update(quoted or re.findall(r"^[a-z_]+$", group))
            if codes:
                found[str(path.relative_to(ROOT))] = codes
    return found


def test_every_event_code_the_source_writes_or_reads_is_registered() -> None:
    found = _source_codes()
    assert "workers/supervisor.py" in found and "trainer/loop.py" in found  # the walk works
    for path, codes in found.items():
        unknown = codes - set(CODES)
        assert not unknown, f"{path} uses event codes not in trainer/event_codes.py: {unknown}"
    unwritten = set(CODES) - set().union(*found.values())
    assert not unwritten, f"registered codes nobody writes (delete them): {unwritten}"


def test_no_event_is_built_by_hand_outside_the_registry() -> None:
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if path.name in ("event_codes.py", "records.py"):  # the builder, the checked writer
                continue
            text = path.read_text()
            assert '"kind": "event", "segment"' not in text, path
            assert 'write("event"' not in text, f"{path}: RecordWriter.event checks the fields"


def test_the_page_compares_only_registered_codes_and_lists_no_key_codes() -> None:
    for js in (ROOT / "web" / "static").glob("*.js"):
        text = js.read_text()
        compared = set(re.findall(r'\.code === "([a-z_]+)"', text))
        listed = {
            c
            for s in re.findall(r"_CODES = new Set\(\[([^\]]*)\]", text)
            for c in re.findall(r'"([a-z_]+)"', s)
        }
        assert compared | listed <= set(CODES), f"{js.name}: {(compared | listed) - set(CODES)}"
        assert "KEY_CODES" not in text, f"{js.name}: the contract's `weight` says what is key"
        reads_text = r"\.(exec|test)\([^)]*\.text\b|\.text\b[^;\n]*\.match\(|/\^(Checkpoint|Step) "
        assert not re.search(reads_text, text), f"{js.name} reads an event's sentence"


def doc_table() -> str:
    """The event-codes table of docs/run-contract.md, as the registry says it."""
    lines = [
        "| code | written by | level | weight | restart | fields | meaning |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in EVENT_CODES:
        fields = ", ".join(
            f"`{f.name}` {f.type}{' (optional)' if f.name in e.optional else ''}" for f in e.fields
        )
        levels = " or ".join(e.levels)
        lines.append(
            f"| `{e.code}` | {e.writer} | {levels} | {e.weight} | {e.restart or '—'}"
            f" | {fields or '—'} | {e.meaning} |"
        )
    return "\n".join(lines) + "\n"


def test_the_doc_lists_every_event_code_as_the_registry_says() -> None:
    table = doc_table()
    assert table in DOC.read_text(), f"docs/run-contract.md's event codes should read:\n{table}"


def test_event_code_names_the_known_codes() -> None:
    assert event_code("crash").weight == "key"
    with pytest.raises(KeyError, match="known: training_started"):
        event_code("nope")
