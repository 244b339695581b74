"""Property-based fuzzing of the whole API from its own /openapi.json: no input, valid or not,
may get a 5xx, on either database, and the job store stays consistent afterwards.

Schemathesis generates schema-valid (positive) and schema-violating (negative) requests for
every operation, in-process through the ASGI app. Derandomized, so a failure reproduces; the
example budget keeps both databases to a few minutes on two cores.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from broker.api.app import create_app
from broker.config import parse_config
from broker.orchestration.replay import check_all
from broker.store import Database
from tests.harness.paths import EXAMPLE_CONFIG

pytestmark = pytest.mark.slow  # over two seconds each: out of the fast tier (README)

ADMIN_TOKEN = "fuzz-admin-secret"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# Examples per operation and generation mode; POST /v1/jobs, where the bugs were, gets more.
EXAMPLES = 30
SUBMIT_EXAMPLES = 250


@pytest.fixture
def api_schema(db: Database) -> Iterator[Any]:
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["auth"] = {
        "mode": "token",
        "tokens": [{"name": "fuzz", "role": "admin",
                    "token_sha256": hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()}],
    }
    app = create_app(parse_config(data), db)
    yield schemathesis.openapi.from_asgi("/openapi.json", app)


def _known_names(body: Any) -> Any:
    """Half the generated submissions name a real team, priority and flavor (and a plain
    entrypoint), so they get past the configuration checks into the group commit and the
    database."""
    if isinstance(body, dict):
        # fields whose valid values depend on the configuration (allow-lists, reserved keys)
        # or on each other (a batch launcher needs a script) are set to plain valid values;
        # the other half of the submissions fuzzes them freely
        body = {**body, "team": "vision", "priority": "normal", "flavors": ["h100-80g"],
                "entrypoint": {"image": "registry.local/train:1.0", "command": ["true"]},
                "mounts": [], "labels": {}, "annotations": {}}
        body.pop("scheduling", None)
    return body


def _fuzz(op: Any, mode: GenerationMode, statuses: Counter[tuple[str, int]]) -> None:
    submit = op.label == "POST /v1/jobs"

    @settings(
        max_examples=SUBMIT_EXAMPLES if submit else EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy(generation_mode=mode), known=st.booleans())
    def run(case: Any, known: bool) -> None:
        if submit and known and mode is GenerationMode.POSITIVE:
            case.body = _known_names(case.body)
        response = case.call(headers=AUTH)
        statuses[(op.label, response.status_code)] += 1
        case.validate_response(response, checks=[not_a_server_error])

    run()


def test_no_input_gets_a_server_error(api_schema: Any, db: Database) -> None:
    statuses: Counter[tuple[str, int]] = Counter()
    operations = [r.ok() for r in api_schema.get_all_operations()]
    assert any(op.label == "POST /v1/jobs" for op in operations)
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(op, mode, statuses)
            except Unsatisfiable:
                # nothing to make invalid: an operation without parameters or body
                assert mode is GenerationMode.NEGATIVE, op.label
    submitted = statuses[("POST /v1/jobs", 201)] + statuses[("POST /v1/jobs", 200)]
    assert submitted > 0, f"no generated submission was stored: {sorted(statuses.items())}"
    with db.read() as s:
        assert list(check_all(s)) == []
