"""Property-based fuzzing of the HTTP API with schemathesis, against the OpenAPI schema the app serves.

Every operation gets generated bodies and parameters, valid and not. Whatever arrives, the
server answers: no 5xx, no hang (each call has a timeout), and every 4xx is JSON with a message.
`python bench/fuzz_api.py` runs the same at length against a server of the embedded models.
"""

import os

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

EXAMPLES = int(os.environ.get("SPECDEC_FUZZ_EXAMPLES", "12"))  # per operation and mode


def check(case, seen: list) -> None:
    response = case.call(timeout=30)
    seen.append(response.status_code)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])
    if 400 <= response.status_code < 500:
        body = response.json()
        message = body.get("error", body.get("detail")) if isinstance(body, dict) else None
        if isinstance(message, dict):
            message = message.get("message")
        assert message, (case.method, case.path, response.text[:300])


def test_no_input_breaks_the_server(live):
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    operations, seen = [result.ok() for result in schema.get_all_operations()], []
    assert {op.path for op in operations} >= {"/infill", "/v1/completions", "/v1/index/files"}
    for operation, mode in [(op, mode) for op in operations for mode in GenerationMode]:  # valid and invalid input
        @given(operation.as_strategy(mode))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def fuzz(case):
            check(case, seen)

        try:
            fuzz()
        except Unsatisfiable:  # nothing to make invalid (an operation that takes no input)
            assert mode is GenerationMode.NEGATIVE, operation.path
    assert len(seen) >= EXAMPLES * len(operations) and any(400 <= code < 500 for code in seen)
    assert httpx.get(f"{live.url}/health", timeout=5).status_code == 200  # and it still answers
