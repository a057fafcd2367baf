"""Making an event record: the one way, checked against its code in the registry
(trainer/event_codes.py). An unknown code is a KeyError naming the known ones; a level
the code is not written at, or a missing, unknown or wrong-typed field, is a ValueError
naming what is allowed. `RecordWriter.write` runs `check_record` on every event it writes.

    from crashdrill.trainer.event_record import event
    event("checkpoint", "Checkpoint at step 50: …", step=50, bytes=1024, seconds=0.01,
          persist_seconds=0.01, mode="sync", parts=["weights"])
    # {"kind": "event", "level": "info", "code": "checkpoint", "text": "…", "step": 50, …}

Imports nothing but the standard library (and the registry).
"""

from __future__ import annotations

from typing import Any

from crashdrill.trainer.event_codes import BASE_FIELDS, EventCode, event_code

_NOT_ITS_OWN = frozenset((*BASE_FIELDS, "v", "t"))  # an event's fields that are not its code's


def type_ok(value: Any, type_: str) -> bool:
    """Whether `value` (as it stands before JSON) is of the contract type `type_`
    ("int", "float or null", "list[str]", "object", …). A float that is not finite passes
    as a float: JSON writes it as null."""
    return any(_one_type_ok(value, t) for t in type_.split(" or "))


def _one_type_ok(value: Any, t: str) -> bool:
    if t.startswith("list[") and t.endswith("]"):
        return isinstance(value, list | tuple) and all(_one_type_ok(v, t[5:-1]) for v in value)
    number = isinstance(value, int) and not isinstance(value, bool)
    return {
        "null": value is None,
        "int": number,
        "float": number or isinstance(value, float),
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "object": isinstance(value, dict),
    }.get(t, False)


def check_event(code: str, level: str, fields: dict[str, Any]) -> EventCode:
    """The registered code, after checking `level` and `fields` against it; ValueError
    (KeyError for an unknown code) says what is wrong and what is allowed."""
    spec = event_code(code)
    if level not in spec.levels:
        raise ValueError(f"event {code!r}: level {level!r} not one of {', '.join(spec.levels)}")
    names = {f.name for f in spec.fields}
    unknown = sorted(set(fields) - names)
    if unknown:
        allowed = ", ".join(sorted(names)) or "none"
        raise ValueError(
            f"event {code!r}: unknown field(s) {', '.join(unknown)}; allowed: {allowed}"
        )
    for f in spec.fields:
        if f.name not in fields:
            if f.name in spec.optional:
                continue
            raise ValueError(f"event {code!r}: missing field {f.name!r} ({f.type}: {f.meaning})")
        if not type_ok(fields[f.name], f.type):
            raise ValueError(
                f"event {code!r}: field {f.name!r} is {fields[f.name]!r}, not a {f.type}"
            )
    return spec


def check_record(rec: dict[str, Any]) -> EventCode:
    """`check_event` for a whole event record (its common fields aside)."""
    if not isinstance(rec.get("code"), str) or not isinstance(rec.get("text"), str):
        raise ValueError(f"an event needs a code and a text (str): {rec!r}")
    fields = {k: v for k, v in rec.items() if k not in _NOT_ITS_OWN}
    return check_event(rec["code"], rec.get("level", ""), fields)


def event(
    code: str, text: str, *, level: str | None = None, segment: int | None = None, **fields: Any
) -> dict[str, Any]:
    """The event record of `code` (checked: see `check_event`); `level` defaults to the
    code's first; `segment` is left out when None (the RecordWriter adds its own)."""
    spec = event_code(code)
    level = level or spec.levels[0]
    check_event(code, level, fields)
    rec: dict[str, Any] = {"kind": "event"}
    if segment is not None:
        rec["segment"] = segment
    rec.update(level=level, code=code, text=text, **fields)
    return rec
