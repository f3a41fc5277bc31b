"""The request bodies editor clients send, answered with the fields they read."""

import json

import httpx
import openai

VIM_BODY = {
    "input_prefix": "import os\n\ndef main():\n", "input_suffix": "\n    return 0\n",
    "input_extra": [{"text": "def helper(x):\n    return x\n", "time": [0, 0], "filename": "utils.py"}],
    "prompt": "    files = ", "n_predict": 16, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.90,
    "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1000,
    "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                        "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                        "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"],
}
VSCODE_BODY = {"input_prefix": "class A:\n    def f(self):\n", "input_suffix": "\n", "input_extra": [],
               "prompt": "        return self.", "n_predict": 12, "top_k": 40, "top_p": 0.99, "stream": False,
               "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 8,
               "t_max_prompt_ms": 500, "t_max_predict_ms": 2500}


def test_llama_vim_body(live):
    r = httpx.post(f"{live.url}/infill", json=VIM_BODY, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {f for f in VIM_BODY["response_fields"]}
    assert isinstance(body["content"], str) and "\n" not in body["content"]  # text follows the cursor: one line
    assert body["timings/predicted_n"] >= 1 and body["timings/prompt_n"] >= 1
    assert isinstance(body["tokens_cached"], int) and body["truncated"] is False


def test_llama_vscode_body_and_prompt_cache(live):
    first = httpx.post(f"{live.url}/infill", json=VSCODE_BODY, timeout=60).json()
    assert {"content", "tokens_cached", "truncated", "timings", "speculation", "stop_type"} <= set(first)
    assert {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
            "predicted_per_second"} <= set(first["timings"])
    again = dict(VSCODE_BODY, prompt=VSCODE_BODY["prompt"] + "x")  # one more keystroke
    second = httpx.post(f"{live.url}/infill", json=again, timeout=60).json()
    assert second["tokens_cached"] > 0
    assert second["timings"]["prompt_n"] <= 8


def test_warmup_request_generates_nothing(live):
    body = {"input_extra": [{"filename": "a.py", "text": "x = 1\n"}], "n_predict": 0, "samplers": [],
            "t_max_predict_ms": 1, "response_fields": [""]}
    r = httpx.post(f"{live.url}/infill", json=body, timeout=60)
    assert r.status_code == 200 and r.json() == {}


def test_infill_stream(live):
    with httpx.stream("POST", f"{live.url}/infill", json=dict(VSCODE_BODY, stream=True), timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["stop"] is True and "timings" in events[-1]
    assert all(e["stop"] is False for e in events[:-1])


def test_openai_client_completions(live):
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused")
    done = client.completions.create(model="specdec-default", prompt="def add(a, b):\n    return ",
                                     suffix="\n\nprint(add(1, 2))\n", max_tokens=8, temperature=0)
    assert done.choices[0].finish_reason in ("stop", "length") and isinstance(done.choices[0].text, str)
    assert done.usage.completion_tokens >= 1
    chunks = list(client.completions.create(model="specdec-default", prompt="def add(a, b):\n    return ",
                                            suffix="\n\nprint(add(1, 2))\n", max_tokens=8, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == done.choices[0].text
    assert chunks[-1].choices[0].finish_reason is not None
    assert [m.id for m in client.models.list().data] == ["specdec-default"]


def test_sse_has_no_comment_lines_and_ends_with_done(live):
    with httpx.stream("POST", f"{live.url}/v1/completions", json={"prompt": "x = ", "max_tokens": 4, "stream": True},
                      timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)


def test_health_and_metrics(live):
    health = httpx.get(f"{live.url}/health").json()
    assert health["status"] == "ok" and health["index"]["state"] == "ready"
    import torch

    assert health["runtime"]["threads"] == torch.get_num_threads()  # the server runs in this process
    assert health["runtime"]["weights"] == "float32" and health["runtime"]["packed_kernel"] is None
    text = httpx.get(f"{live.url}/metrics").text
    assert 'specdec_requests_total{endpoint="/infill",status="200"}' in text
    for name in ("specdec_request_latency_ms_bucket", "specdec_tau", "specdec_accepted_tokens_total",
                 "specdec_cached_prompt_tokens_total", "specdec_queue_depth", "specdec_expert_tokens_total"):
        assert name in text


def test_infill_stopping_word_names_the_string_that_matched(live):
    body = dict(VSCODE_BODY, input_prefix="def main():\n", prompt="    ", input_suffix="", n_predict=12,
                cache_prompt=False, path="pkg/stopword.py")
    free = httpx.post(f"{live.url}/infill", json=body, timeout=60).json()
    assert len(free["content"]) >= 4, free["content"]
    word = free["content"][2:4]
    stopped = httpx.post(f"{live.url}/infill", json=dict(body, stop=["\u0000never", word]), timeout=60).json()
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == word
    assert stopped["content"] == free["content"][: free["content"].find(word)]


def test_infill_retrieves_repository_context_unless_asked_not_to(live):
    body = dict(VSCODE_BODY, input_prefix="from pkg.store import Store\n\ns = Store()\n", prompt="value = s.get(",
                input_suffix="\n", input_extra=[], path="pkg/use.py", cache_prompt=False)
    on = httpx.post(f"{live.url}/infill", json=body, timeout=60).json()["speculation"]
    off = httpx.post(f"{live.url}/infill", json=dict(body, context="none"), timeout=60).json()["speculation"]
    assert on["context_chunks"] >= 1 and on["context_tokens"] > 0
    assert off["context_chunks"] == 0 and off["context_tokens"] == 0
    bad = httpx.post(f"{live.url}/infill", json=dict(body, context="everything"), timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "context"


def test_a_request_may_choose_its_fim_order_among_the_familys(live):
    body = dict(VSCODE_BODY, cache_prompt=False)
    for mode in ("psm", "spm", None):
        r = httpx.post(f"{live.url}/infill", json=dict(body, fim_mode=mode), timeout=60)
        assert r.status_code == 200, r.text
    lacking = httpx.post(f"{live.url}/infill", json=dict(body, fim_mode="suffix_first"), timeout=60)
    assert lacking.status_code == 400 and "qwen format has spm, psm" in lacking.json()["error"]["message"]
    unknown = httpx.post(f"{live.url}/v1/completions", json={"prompt": "x = ", "fim_mode": "middle"}, timeout=60)
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "fim_mode"
    for route, streamed in (("/infill", dict(body, stream=True)), ("/v1/completions", {"prompt": "x = ", "stream": True})):
        # refused before the stream starts (schemathesis found the stream broken off instead)
        refused = httpx.post(f"{live.url}{route}", json=dict(streamed, fim_mode="suffix_first"), timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "fim_mode", route
