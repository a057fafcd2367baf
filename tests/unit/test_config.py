from __future__ import annotations

import pytest

from crashdrill.trainer.config import ConfigError, TrainConfig, parse_override


@pytest.mark.parametrize(
    ("field", "value", "allowed_fragment"),
    [
        ("ctx", 0, "≥ 1"),
        ("ckpt_every", 0, "≥ 1"),
        ("n_head", 3, "divisor of d_model"),
        ("data", "s3://bucket", "'builtin'"),
        ("precision", "fp8", "'fp32'"),
        ("keep", 1, "≥ 2"),
        ("dropout", 1.5, "[0, 1)"),
        ("warmup", 10_000, "[0, steps"),
    ],
)
def test_nonsense_config_names_field_value_and_allowed(field, value, allowed_fragment):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**{field: value})
    assert err.value.field == field
    assert repr(value) in str(err.value)
    assert allowed_fragment in str(err.value)


def test_unknown_setting_is_rejected_by_from_dict():
    with pytest.raises(ConfigError, match="colour"):
        TrainConfig.from_dict({"colour": "blue"})


def test_fingerprint_ignores_cadence_but_not_trajectory():
    base = TrainConfig()
    assert base.fingerprint() == base.with_overrides({"ckpt_every": 7}).fingerprint()
    assert base.fingerprint() == base.with_overrides({"ckpt_mode": "async"}).fingerprint()
    assert base.fingerprint() != base.with_overrides({"seed": 2}).fingerprint()
    assert base.fingerprint() != base.with_overrides({"threads": 2}).fingerprint()


def test_parse_override_follows_field_types():
    assert parse_override("steps=12") == ("steps", 12)
    assert parse_override("lr=0.5") == ("lr", 0.5)
    assert parse_override("data=file:x.txt") == ("data", "file:x.txt")
    with pytest.raises(ConfigError, match="steps"):
        parse_override("steps=many")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("steps")
