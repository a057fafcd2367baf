"""Schemathesis against the running server's OpenAPI schema: no input makes a 5xx, and
every answer matches the schema it declares."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.config import SchemathesisConfig
from schemathesis.config._checks import NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES
from schemathesis.core.result import Ok
from schemathesis.generation import GenerationMode
from schemathesis.schemas import BaseSchema

from crashdrill.server.settings import Settings
from tests.support.lab import STAND_IN, free_port, serving

REJECTED = [*NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES, "413"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaseSchema]:
    saved = os.environ.get("CRASHDRILL_STANDIN_STEPS")
    os.environ["CRASHDRILL_STANDIN_STEPS"] = "5000"  # the real runs train all along
    lab = Settings(
        data_dir=Path(tmp_path_factory.mktemp("lab")),
        port=free_port(),
        trainer_command=STAND_IN,
        stop_runs_on_exit=True,
        telemetry_interval_s=0.5,
        stream_heartbeat_s=0.2,
        instructor_token="schemathesis-instructor",
        max_wrong_tokens=0,  # random login bodies would lock the teacher's header out
    )
    with serving(lab) as url:
        # 413 (a body over max_body_bytes) rejects too: a string over a route's maxLength
        # is often over the body limit as well, which the middleware answers first.
        config = SchemathesisConfig.from_dict(
            {"checks": {"negative_data_rejection": {"expected-statuses": REJECTED}}}
        )
        yield schemathesis.openapi.from_url(f"{url}/openapi.json", config=config)
    if saved is None:
        del os.environ["CRASHDRILL_STANDIN_STEPS"]
    else:
        os.environ["CRASHDRILL_STANDIN_STEPS"] = saved


def test_no_input_makes_a_server_error(api_schema: BaseSchema) -> None:
    # Each operation through Hypothesis directly: schemathesis' own pytest plugin does
    # not run under pytest 9 yet. Valid and invalid inputs, with random ids and with the
    # ids of a real pair (its runs get crashed and stopped at random).
    base_url = api_schema.get_base_url().rstrip("/")
    created = httpx.post(f"{base_url}/api/pairs", json={"preset": "quick"}).json()
    real = {"pair": created["pair"], "run": created["runs"][0]["id"], "preset": "quick"}
    # The teacher may crash and stop the real runs.
    teacher = {"Authorization": "Bearer schemathesis-instructor"}
    failures = []
    calls: list[int] = []
    for result in api_schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        names = {p.name for p in operation.path_parameters}
        variants: list[dict[str, str] | None] = [None]
        if names and operation.path != "/api/stream":
            variants.append({n: real[n] for n in names})
        for mode in GenerationMode:
            for path_parameters in variants:
                strategy = operation.as_strategy(
                    mode,
                    path_parameters=path_parameters,
                    headers=teacher if path_parameters else None,
                )

                @given(case=strategy)
                @settings(
                    max_examples=25,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                def check(case: schemathesis.Case) -> None:
                    calls.append(case.call_and_validate(timeout=10).status_code)

                try:
                    check()
                except Unsatisfiable:  # nothing to make invalid (only free-text ids)
                    continue
                except Exception as e:
                    failures.append(f"{operation.label} {mode.value} {path_parameters}: {e}")
    assert not failures, "\n\n".join(failures)
    assert len(calls) > 200 and not [c for c in calls if c >= 500]
    print(f"{len(calls)} calls; statuses: {sorted(set(calls))}")
