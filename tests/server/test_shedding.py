"""Shedding over HTTP: a request that would wait past its budget is answered at once with
Retry-After; id_slot is checked; a strict budget is reported as a limit."""

import httpx

from tests.helpers import generation
from tests.server.conftest import make_server

BODY = {"input_prefix": "def total(rows):\n", "prompt": "    return ", "input_suffix": "\n", "n_predict": 32,
        "t_max_predict_ms": 250, "samplers": ["top_k", "top_p", "infill"]}


def test_a_request_that_would_wait_past_its_budget_gets_retry_after(models, repo):
    with make_server(models, repo) as live:
        engine = live.engine
        engine.scheduler.stop()  # nothing is stepped: what is queued stays queued
        queued = [generation(engine, f"x_{i} = {i}\n", "", max_tokens=32, document=f"q{i}")
                  for i in range(engine.scheduler.MAX_DECODING + 2)]
        for g in queued:
            engine.scheduler.submit(g)
        for _ in range(40):
            engine.scheduler.load.waited(1500.0)
        r = httpx.post(f"{live.url}/infill", json=BODY, timeout=10)
        assert r.status_code == 200 and r.json()["content"] == "" and r.json()["stop_type"] == "limit"
        assert r.json()["speculation"]["stop_reason"] == "busy"
        assert int(r.headers["Retry-After"]) == 2  # the latest requests waited about 1.5 s
        streamed = httpx.post(f"{live.url}/infill", json=dict(BODY, stream=True), timeout=10)
        assert "Retry-After" in streamed.headers and '"stop": true' in streamed.text
        unbounded = dict(BODY)
        del unbounded["t_max_predict_ms"]
        for g in queued:
            g.request_cancel()
        engine.start()
        r = httpx.post(f"{live.url}/infill", json=unbounded, timeout=30)
        assert r.status_code == 200 and "Retry-After" not in r.headers


def test_id_slot_is_checked_and_a_strict_budget_reports_a_limit(live):
    bad = httpx.post(f"{live.url}/infill", json=dict(BODY, id_slot=-3), timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "id_slot"
    # 1 ms: the budget runs out after the first pass, before the tiny model's end of text, however fast the CPU.
    r = httpx.post(f"{live.url}/infill", json=dict(BODY, id_slot=0, n_predict=400, t_max_predict_ms=1,
                                                    input_prefix="a = 1\n", prompt="", input_suffix=""), timeout=30)
    body = r.json()
    assert r.status_code == 200 and body["stop_type"] == "limit"
    assert body["speculation"]["stop_reason"] == "time" and body["timings"]["predicted_n"] < 400
