from __future__ import annotations

from pathlib import Path

import pytest

from crashdrill.trainer.config import (
    FINGERPRINTED,
    SECTIONS,
    ConfigError,
    OptimConfig,
    TrainConfig,
    parse_override,
    section_fields,
)
from crashdrill.trainer.presets import BUILTIN_DIR, LABELS, list_presets


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
        ("launcher", "torchrun", "one of 'watch', 'blind'"),
        ("collective_timeout_s", 0, "seconds in [1, 3600]"),
        ("collective_timeout_s", 7200, "seconds in [1, 3600]"),
        ("collective_timeout_s", "15", "a finite number"),
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


# The config fingerprints of the built-in presets (every label, CPU and CUDA), computed
# before the config was split into sections: a run's resume check compares against the
# fingerprint stored in its checkpoints, so these values must never move.
BUILTIN_FINGERPRINTS = {
    "quick": ("39cfec3e7d02b615", "39cfec3e7d02b615"),
    "lesson-1.7": ("05f05110121d57e2", "5b5338ce0cabf1d3"),
    "lesson-1.7-fast": ("5bc03fc032da5d36", "5bc03fc032da5d36"),
    "lesson-1.8": ("5bc03fc032da5d36", "5bc03fc032da5d36"),
    "lesson-1.9": ("5bc03fc032da5d36", "5bc03fc032da5d36"),
    "lesson-1.10": ("5bc03fc032da5d36", "5bc03fc032da5d36"),
    "lesson-1.11": ("5bc03fc032da5d36", "5bc03fc032da5d36"),
    "lesson-1.12": ("5bc03fc032da5d36", "5bc03fc032da5d36"),
    "lesson-1.13": ("4798159f26f8005a", "4798159f26f8005a"),
    "lesson-1.14": ("5bc03fc032da5d36", "5bc03fc032da5d36"),
    "lesson-1.15": ("488177ef62c014e7", "488177ef62c014e7"),
    "lesson-1.16": ("39cfec3e7d02b615", "39cfec3e7d02b615"),
    "lesson-1.17": ("39cfec3e7d02b615", "39cfec3e7d02b615"),
    "lesson-1.18": ("ba87a152bd3e9465", "ba87a152bd3e9465"),
}


def test_the_built_in_presets_keep_the_fingerprints_their_checkpoints_hold() -> None:
    builtin = {p.id: p for p in list_presets() if Path(p.source).parent == BUILTIN_DIR}
    assert set(builtin) == set(BUILTIN_FINGERPRINTS), "a new built-in preset: pin it here"
    for name, (cpu, cuda) in BUILTIN_FINGERPRINTS.items():
        for label in LABELS:
            assert builtin[name].config_for(label).fingerprint() == cpu, (name, label)
            assert builtin[name].config_for(label, cuda=True).fingerprint() == cuda, (name, label)
    assert TrainConfig().fingerprint() == "481465715eaa0c82"


def test_every_setting_is_in_exactly_one_section_in_the_order_of_the_config() -> None:
    names = [name for section in SECTIONS for name in section_fields(section)]
    assert len(names) == len(set(names)), "two sections declare the same setting"
    assert names == list(TrainConfig().to_dict())


def test_the_fingerprint_covers_the_fingerprinted_sections_and_nothing_else() -> None:
    base = TrainConfig()
    changed = {"ctx": 32, "lr": 1e-3, "seed": 7, "precision": "bf16", "tokenizer": "gpt2"}
    unchanged = {"device": "cpu", "keep": 3, "stop_after": "1h", "log_every": 5, "mirror": "off"}
    for name, value in changed.items():
        assert name in FINGERPRINTED
        assert base.with_overrides({name: value}).fingerprint() != base.fingerprint(), name
    for name, value in unchanged.items():
        assert name not in FINGERPRINTED
        assert base.with_overrides({name: value}).fingerprint() == base.fingerprint(), name
    assert {s.name for s in SECTIONS if s.fingerprinted} == {"model", "optim", "numerics", "data"}


def test_a_section_on_its_own_validates_its_fields_naming_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        OptimConfig(warmup=500, steps=100)
    assert err.value.field == "warmup" and "[0, steps=100]" in str(err.value)
    with pytest.raises(ConfigError, match="grad_clip = 'x' is not allowed: a finite number"):
        OptimConfig(grad_clip="x")  # type: ignore[arg-type]


def test_the_launcher_and_the_collective_timeout_leave_the_fingerprint_alone() -> None:
    base = TrainConfig(ranks=2)
    blind = base.with_overrides({"launcher": "blind", "collective_timeout_s": 15.0})
    assert blind.launcher == "blind" and blind.collective_timeout_s == 15.0
    assert blind.fingerprint() == base.fingerprint()
    assert base.section("runtime").launcher == "watch"  # type: ignore[attr-defined]


def test_a_config_gives_each_section_as_its_own_validated_object() -> None:
    cfg = TrainConfig(lr=1e-3, ckpt_every=7)
    assert cfg.section("optim") == OptimConfig(lr=1e-3)
    assert cfg.section("checkpoint").ckpt_every == 7  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="section = 'optimizer' is not allowed: one of model"):
        cfg.section("optimizer")
