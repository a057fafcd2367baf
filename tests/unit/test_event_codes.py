"""Event codes have one home (trainer/event_codes.py): `event()` refuses what the registry
does not say, every code the source writes or the page reads is registered, and
docs/run-contract.md lists the registry as it is."""

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
    event,
    event_code,
)

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "run-contract.md"
PACKAGES = ("trainer", "workers", "server", "drill", "crashdrill")


def test_an_event_gets_its_code_s_default_level_and_carries_its_fields() -> None:
    e = event("mirror_failed", "Could not copy.", segment=2, step=50)
    assert e == {
        "kind": "event",
        "segment": 2,
        "level": "warn",
        "code": "mirror_failed",
        "text": "Could not copy.",
        "step": 50,
    }
    assert "segment" not in event("fresh_start", "Started over.")


def test_an_unknown_code_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"unknown event code 'checkpointed'; known: .*checkpoint"):
        event("checkpointed", "Checkpoint at step 5.")


def test_a_missing_field_is_refused_naming_it_and_its_type() -> None:
    with pytest.raises(ValueError, match=r"event 'resumed': missing field 'missing' \(list\[str\]"):
        event("resumed", "Resumed at step 5.", step=5)


def test_a_field_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ValueError, match="field 'step' is '5', not a int"):
        event("mirror_failed", "Could not copy.", step="5")
    with pytest.raises(ValueError, match="field 'step' is True, not a int"):
        event("mirror_failed", "Could not copy.", step=True)
    with pytest.raises(ValueError, match=r"field 'parts' is \[1\], not a list\[str\]"):
        event(
            "checkpoint", "Ckpt.", step=1, bytes=1, seconds=0, persist_seconds=0, mode="sync",
            parts=[1],
        )  # fmt: skip


def test_a_field_the_code_does_not_have_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown field.* seconds; allowed: step"):
        event("mirror_failed", "Could not copy.", step=5, seconds=1.0)


def test_a_level_the_code_is_not_written_at_is_refused() -> None:
    with pytest.raises(ValueError, match="level 'info' not one of warn"):
        event("fresh_start", "Started over.", level="info")


def test_optional_fields_may_be_absent_and_nullable_ones_null() -> None:
    base = {"at_step": 7, "resume_from": None, "lost_steps": 7, "crash_mode": "kill"}
    assert "save_step" not in event("crash", "Crash test.", **base)
    assert event("crash", "Crash test.", save_step=5, **base)["save_step"] == 5
    assert event("finished", "Finished.", steps=4, best_val=None)["best_val"] is None
    assert event("finished", "Finished.", steps=4, best_val=float("nan"))  # JSON: null


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


def test_the_record_writer_refuses_an_event_outside_the_registry(tmp_path: Path) -> None:
    from crashdrill.trainer.records import RecordWriter, read_records

    rec = RecordWriter(tmp_path, segment=0)
    with pytest.raises(KeyError, match="unknown event code 'saved'"):
        rec.write("event", text="Checkpoint at step 5.", level="info", code="saved")
    with pytest.raises(ValueError, match="missing field 'steps'"):
        rec.event("finished", "Finished.", best_val=None)
    rec.event("finished", "Finished 4 steps.", steps=4, best_val=2.5)
    rec.close()
    (written,), _ = read_records(tmp_path / "records.jsonl")
    assert (written["code"], written["steps"], written["segment"]) == ("finished", 4, 0)
